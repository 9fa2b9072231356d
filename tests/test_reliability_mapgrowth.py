"""Map growth: a file opened with a 1 MiB map accepts 64 MiB of writes, and a map grown by
another process is adopted; MapFullError and MapResizedError never reach the caller."""
from __future__ import annotations

import os
import random
import threading
import time

import pytest
from conftest import PASSPHRASE, TEST_KDF

import engramdb.engram as engram
import engramdb.store as store_mod
from engramdb.errors import BusyError

MiB = 1024 * 1024
BLOB = 4000  # random bytes per record: incompressible, and no text for the indexes to chew on


def blobs(rnd: random.Random, start: int, count: int) -> list[dict]:
    return [{"id": f"n{i}", "metadata": {"blob": rnd.randbytes(BLOB)}} for i in range(start, start + count)]


def test_one_mib_map_accepts_64_mib(tmp_path):
    path = tmp_path / "grow.engram"
    rnd = random.Random(1)
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF, map_size=MiB) as db:
        first = blobs(rnd, 0, 12_000)  # 48 MiB through add_many
        for i in range(0, len(first), 1500):
            db.add_many(first[i:i + 1500], now=1.0)
        second = blobs(rnd, 12_000, 4_100)  # 16 MiB in one transaction() block
        with db.transaction() as tx:
            for item in second:
                tx.add(item, now=1.0)
        info = db._store.env_info()
        assert info["map_size"] > 64 * MiB and info["file_size"] > 64 * MiB
    with engram.open(path, passphrase=PASSPHRASE, readonly=True) as db:
        assert len(db) == 16_100
        for item in (first + second)[::211] + second[-2:]:
            assert db.get(item["id"]).metadata == item["metadata"]
        assert db.verify() == []


def test_growth_inside_one_large_transaction_block(tmp_path):
    """The whole block exceeds the map several times over: every growth replays the writes."""
    path = tmp_path / "block.engram"
    rnd = random.Random(2)
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF, map_size=MiB) as db:
        db.add("before", id="before")
        items = blobs(rnd, 0, 2000)
        with db.transaction() as tx:
            for item in items:
                tx.add(item, now=1.0)
            tx.update("before", content="updated in the same block")
            tx.delete(items[0]["id"])
        assert len(db) == 2000
        assert db.get("before").content == "updated in the same block"
        assert items[0]["id"] not in db
        assert db.get(items[-1]["id"]).metadata == items[-1]["metadata"]


def grow_writer(emit, path: str) -> None:
    db = engram.open(path, passphrase=PASSPHRASE)
    rnd = random.Random(3)
    for start in range(0, 4000, 500):  # 16 MiB: far past the other process's 1 MiB map
        db.add_many(blobs(rnd, start, 500), now=1.0)
    emit(f"map {db._store.env_info()['map_size']}")
    db.close()


def test_map_grown_by_another_process_is_adopted(fork_server, tmp_path):
    path = tmp_path / "shared.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF, map_size=MiB) as db:
        db.add("first", id="first")
        assert db.get("first").content == "first"
        lines, code, signum = fork_server.call("grow_writer", str(path))
        assert (code, signum) == (0, 0), lines
        other_map = int(lines[-1].split()[1])
        assert other_map > db._store.env_info()["map_size"]
        start = time.monotonic()
        assert len(db) == 4001  # a read after the other process's growth (MapResizedError inside)
        assert time.monotonic() - start < 5  # regression: the reader waited 30 s for its own slot
        assert db.get("n3999").metadata["blob"]
        db.add("after", id="after")  # and a write
        assert db._store.env_info()["map_size"] >= other_map
        assert len(db) == 4002
        assert db.verify() == []


@pytest.mark.soak
def test_one_mib_map_accepts_512_mib(tmp_path):
    path = tmp_path / "big.engram"
    rnd = random.Random(4)
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF, map_size=MiB) as db:
        for start in range(0, 131_072, 2048):  # 64 batches of 2048: exactly 131,072 memories
            db.add_many(blobs(rnd, start, 2048), now=1.0)
        assert len(db) == 131_072
        assert db.verify() == []
    assert os.path.getsize(path) > 512 * MiB


def test_a_write_that_must_grow_inside_its_own_threads_read_fails_at_once(tmp_path, monkeypatch):
    # the growth waited 30 s for this very read, then remapped under it (py-lmdb ends every
    # open transaction of the environment when the map changes)
    monkeypatch.setattr(store_mod, "_RESIZE_WAITS_FOR_READS", 60.0, raising=False)
    with engram.open(tmp_path / "own.engram", passphrase=PASSPHRASE, kdf=TEST_KDF, map_size=MiB) as db:
        db.add("first", id="first")
        store = db._store
        size = store.env_info()["map_size"]
        with store.read() as txn:
            with pytest.raises(BusyError, match="this thread has a read of the file open"), store.transaction(reserve=8 * MiB):
                pass
            assert txn.count("nodes") == 1  # the read goes on
        with store.transaction(reserve=8 * MiB):  # after the read: it grows
            pass
        assert store.env_info()["map_size"] > size
        assert db.get("first").content == "first"


def test_growth_never_remaps_under_another_threads_read(tmp_path, monkeypatch):
    # after 30 s the growth remapped anyway: the other thread's read (a long dump) failed midway
    monkeypatch.setattr(store_mod, "_RESIZE_WAITS_FOR_READS", 0.2, raising=False)
    with engram.open(tmp_path / "other.engram", passphrase=PASSPHRASE, kdf=TEST_KDF, map_size=MiB) as db:
        db.add("first", id="first")
        store = db._store
        reading, done = threading.Event(), threading.Event()
        counted: list[object] = []

        def reader() -> None:
            try:
                with store.read() as txn:
                    reading.set()
                    done.wait(60)
                    counted.append(txn.count("nodes"))
            except Exception as exc:  # reported to the test below
                counted.append(exc)

        thread = threading.Thread(target=reader)
        thread.start()
        try:
            assert reading.wait(10)
            with pytest.raises(BusyError, match="other threads' reads of it stayed open"), store.transaction(reserve=8 * MiB):
                pass
        finally:
            done.set()
            thread.join()
        assert counted == [1]
        db.add("second", id="second")  # the read has ended: writes grow the map again as needed
        with store.transaction(reserve=8 * MiB):
            pass
        assert len(db) == 2
