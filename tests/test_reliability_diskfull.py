"""Full disk: with RLIMIT_FSIZE capping the file, a write fails with StorageFullError, the
failed transaction is invisible, the file stays valid, and writing works again once space returns."""
from __future__ import annotations

import os
import random
import resource
import signal

import pytest
from conftest import PASSPHRASE, TEST_KDF

import engramdb.engram as engram
from engramdb.errors import StorageFullError

KiB = 1024


def capped_writer(emit, path: str, limit: int, seed: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so write() fails with EFBIG instead of killing us
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    rnd = random.Random(seed)
    db = engram.open(path, passphrase=PASSPHRASE)
    n = len(db)
    try:
        while True:
            with db.transaction() as tx:
                for i in range(rnd.randint(1, 8)):
                    tx.add(id=f"b{n}-{i}", metadata={"blob": rnd.randbytes(rnd.randint(100, 3000))}, now=1.0)
                tx.add(id=f"n{n}", content=f"batch {n}", now=1.0)
            emit(f"ACK {n}")
            n += 1
    except StorageFullError as exc:
        emit(f"FULL {exc.hint != ''}")
    try:  # with the limit still in force, a small write either works or fails just as cleanly
        db.add("small", id="small-after-full")
        emit("SMALL ok")
    except StorageFullError:
        emit("SMALL full")
    db.close()


@pytest.mark.parametrize("extra", [64 * KiB, 256 * KiB, 1024 * KiB, 3000 * KiB])
def test_storage_full_is_clean_and_recoverable(fork_server, tmp_path, extra):
    path = tmp_path / "full.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("seed", id="seed")
    limit = os.path.getsize(path) + extra
    lines, code, signum = fork_server.call("capped_writer", str(path), limit, extra)
    assert (code, signum) == (0, 0), lines[-3:]  # no foreign exception, no SIGXFSZ
    acked = [int(line.split()[1]) for line in lines if line.startswith("ACK ")]
    assert "FULL True" in lines, lines[-3:]
    assert acked, "the limit should allow some commits first"
    assert os.path.getsize(path) <= limit
    with engram.open(path, passphrase=PASSPHRASE) as db:  # a new process without the limit
        assert db.verify() == []
        committed = {int(i[1:]) for i in db.ids() if i.startswith("n")}
        assert set(acked) <= committed <= set(acked) | {acked[-1] + 1}  # at most the failed one is absent
        assert committed == set(acked)  # the failed transaction is invisible
        assert all(i.startswith(("n", "b", "seed", "small")) for i in db.ids())
        db.add_many([{"id": f"later{i}", "metadata": {"blob": os.urandom(3000)}} for i in range(200)])
        assert len(db) >= 200 + len(acked)
        assert db.verify() == []


def capped_compact(emit, path: str, limit: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    db = engram.open(path, passphrase=PASSPHRASE)
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        db.compact()
        emit("COMPACTED")
    except StorageFullError:
        emit("FULL")
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # space returns
    db.add("still writable", id="after")  # the original handle and file are untouched
    db.close()


def test_compact_without_space_leaves_the_original(fork_server, tmp_path):
    path = tmp_path / "c.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add_many([{"metadata": {"blob": os.urandom(2000)}} for _ in range(300)])
    size = os.path.getsize(path)
    lines, code, signum = fork_server.call("capped_compact", str(path), size // 2)
    assert (code, signum) == (0, 0) and lines == ["FULL"], lines
    assert not os.path.exists(str(path) + ".compact-tmp")
    with engram.open(path, passphrase=PASSPHRASE) as db:
        assert len(db) == 301 and db.verify() == []
