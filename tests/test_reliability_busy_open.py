"""A read-write open while another process holds a long write transaction (a maintenance
pass, an import): the tables of an existing file open without engramdb's writer lock, so
the open, and reads through the handle, do not wait for that writer; the first write waits
for it as every write does (within the handle's timeout)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from conftest import PASSPHRASE, TEST_KDF

import engramdb.engram as engram
from engramdb.errors import BusyError

HOLDER = textwrap.dedent(r"""
    import os, sys
    os.environ["ENGRAM_TEST_WEAK_KDF"] = "1"
    import engramdb.engram as engram
    db = engram.open(sys.argv[1], passphrase=sys.argv[2])
    with db.transaction() as tx:
        tx.add(id="held", content="written by the long transaction", now=1.0)
        print("holding", flush=True)
        sys.stdin.readline()  # until the test says so
    db.close()
    print("done", flush=True)
""")


@pytest.fixture
def holder(tmp_path):
    path = tmp_path / "busy.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add(id="first", content="the deploy runs on fridays", now=1.0)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), PASSPHRASE],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline() == "holding\n"
        yield path, proc
    finally:
        if proc.poll() is None:
            proc.stdin.write("\n")
            proc.stdin.flush()
        proc.wait(timeout=60)


def test_a_read_write_open_does_not_wait_for_another_process_s_long_write(holder):
    path, proc = holder
    db = engram.open(path, passphrase=PASSPHRASE, timeout=0)  # the old code: BusyError at once
    try:
        assert [h.id for h in db.recall("deploy fridays")] == ["first"]
        assert db.get("held", None) is None  # not committed yet
        with pytest.raises(BusyError, match="another writer"):
            db.add(id="second", content="a write waits for the writer", now=2.0)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "done\n"
        db.add(id="second", content="written once the other writer is done", now=2.0)
        assert {n.id for n in db.scan()} == {"first", "held", "second"}
        assert db.verify() == []
    finally:
        db.close()
    with engram.open(path, passphrase=PASSPHRASE) as again:
        assert {n.id for n in again.scan()} == {"first", "held", "second"}
        assert again.verify() == []


def test_a_second_handle_and_a_write_in_another_thread_after_such_an_open(holder):
    path, proc = holder
    import threading
    db = engram.open(path, passphrase=PASSPHRASE, timeout=0)
    other = engram.open(path, passphrase=PASSPHRASE, timeout=60)  # shares the environment
    try:
        assert other.get("first") is not None
        errors: list[BaseException] = []

        def write() -> None:
            try:
                other.add(id="from-thread", content="waits for the other process", now=3.0)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        t = threading.Thread(target=write)
        t.start()
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        t.join(60)
        assert not t.is_alive() and errors == []
        assert db.get("from-thread") is not None and db.get("held") is not None
    finally:
        other.close()
        db.close()


def test_a_file_without_a_newer_table_still_gets_it_and_waits_for_the_writer(tmp_path):
    """A file lacking one of the tables (made by engramdb stopped half-way through its first
    open): creating it needs a write transaction, so that open still waits for another
    process's writer, then adds the table."""
    import fcntl
    import os

    import lmdb

    from engramdb.store import _DB_NAMES, Store
    path = tmp_path / "old.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add(id="first", content="kept", now=1.0)
    env = lmdb.open(str(path), subdir=False, max_dbs=32)
    with env.begin(write=True) as txn:
        txn.drop(env.open_db(_DB_NAMES["sources"], txn=txn), delete=True)
    env.close()
    fd = os.open(str(path) + "-maint", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # engramdb's writer lock, as a writing process holds it
        with pytest.raises(BusyError, match="another writer"):
            Store.open(path, timeout=0)
    finally:
        os.close(fd)
    store = Store.open(path, timeout=0)  # the table is created now
    store.close()
    env = lmdb.open(str(path), subdir=False, max_dbs=32, readonly=True)
    with env.begin() as txn:
        assert txn.get(_DB_NAMES["sources"]) is not None
    env.close()
