"""A read-write open while another process holds a long write transaction (a maintenance
pass, an import): the tables of an existing file open without engramdb's writer lock, so
the open, and reads through the handle, do not wait for that writer; the first write waits
for it as every write does (within the handle's timeout)."""
from __future__ import annotations

import os
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


@pytest.fixture
def deferred(tmp_path):
    """A handle opened while another holder had engramdb's writer lock (its environment is
    read-only until its first write), with that lock released again."""
    import fcntl
    import os
    path = tmp_path / "deferred.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add(id="first", content="kept", now=1.0)
    fd = os.open(str(path) + "-maint", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the writer lock, as a writing process holds it
        db = engram.open(path, passphrase=PASSPHRASE, timeout=10)
    finally:
        os.close(fd)
    assert db._store._env.deferred
    try:
        yield db
    finally:
        db.close()


def _wait_until_the_reopen_waits(env) -> None:
    """Until the deferred environment's first write waits for the reads open now."""
    import time
    end = time.monotonic() + 60
    while not getattr(env, "upgrading", False) and time.monotonic() < end:
        time.sleep(0.01)
    assert env.upgrading, "the write's reopen never waited for the open read"


def test_a_write_inside_the_same_thread_s_read_of_a_deferred_handle_fails_at_once(deferred):
    """The reopen waits for every read of the process to end: a thread writing inside its own
    read waited for itself until the timeout (for ever with timeout=None), then blamed "other
    threads". It is refused at once, and the write works once the read has ended."""
    db = deferred
    store = db._store
    store.timeout = None  # the old code: waits for ever (the test's own timeout below catches that)
    import threading
    outcome: list[BaseException | None] = []

    def nested() -> None:
        try:
            with store.read():
                db.add(id="second", content="written inside a read", now=2.0)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    t = threading.Thread(target=nested, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "the write waited for its own read"
    assert isinstance(outcome[0], BusyError) and "this thread has a read of the file open" in str(outcome[0])
    assert "after the read" in outcome[0].hint
    assert store._env.deferred and store._env.thread_reads == {}
    db.add(id="second", content="written after the read", now=2.0)  # the reopen happens
    assert not store._env.deferred and db.get("second").content == "written after the read"


def test_new_reads_wait_for_a_pending_reopen_of_a_deferred_handle(deferred):
    """The first write's reopen waits for the reads open at that moment; reads that begin later
    wait for the reopen instead of holding it off (a steady stream of overlapping reads of other
    threads made that write time out)."""
    import threading
    db = deferred
    store = db._store
    env = store._env
    seen: list[bool] = []
    errors: list[BaseException] = []

    def write() -> None:
        try:
            db.add(id="second", content="written by another thread", now=2.0)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def read() -> None:
        try:
            with store.read():
                seen.append(env.deferred)  # False: the reopen came first
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    with store.read():  # open before the write: the reopen waits for it
        writer = threading.Thread(target=write)
        writer.start()
        _wait_until_the_reopen_waits(env)
        with store.read():  # this thread's own read still begins: the reopen waits for it anyway
            pass
        reader = threading.Thread(target=read)
        reader.start()
        reader.join(2)  # time for a read that does not wait to happen (it must not)
    writer.join(60)
    reader.join(60)
    assert not writer.is_alive() and not reader.is_alive() and errors == []
    assert seen == [False] and not env.deferred and env.thread_reads == {}


def test_a_read_that_an_open_read_waits_for_is_not_held_off_for_ever_by_a_reopen(deferred):
    """A thread holding a read can wait for another thread's read (an embedder or a callback
    handing work to a pool). New reads wait for a pending reopen, and the reopen waits for the
    open read: with timeout=None the waiting read never began and the three threads hung for
    ever (rev12, after 5aaac1d). A new read waits for a reopen only a bounded while."""
    import threading
    db = deferred
    store = db._store
    env = store._env
    store.timeout = None
    got = threading.Event()
    out: list[str] = []

    def writer() -> None:
        db.add(id="second", content="written meanwhile", now=2.0)

    def worker() -> None:  # the read the holder of the open read waits for
        out.append(db.get("first").content)
        got.set()

    with store.read():
        w = threading.Thread(target=writer, daemon=True)
        w.start()
        _wait_until_the_reopen_waits(env)
        threading.Thread(target=worker, daemon=True).start()
        assert got.wait(120), "the read the open read waits for never began"
    w.join(60)
    assert not w.is_alive() and out == ["kept"]
    assert not env.deferred and db.get("second").content == "written meanwhile"


def test_last_txnid_and_env_info_during_a_deferred_reopen(deferred, monkeypatch):
    """The reopen closes the environment for a moment: last_txnid()/env_info() of another
    thread then raised a raw lmdb.Error; they wait for the reopen instead."""
    import threading

    from engramdb.store import _Env
    db = deferred
    store = db._store
    real_open = _Env._open
    got: list[object] = []
    threads: list[threading.Thread] = []

    def query() -> None:
        try:
            got.append((store.last_txnid(), store.env_info()["last_txnid"]))
        except BaseException as exc:
            got.append(exc)

    def reopen(path, **kwargs):
        if not kwargs["readonly"]:  # the reopen, with the read-only environment closed
            t = threading.Thread(target=query)
            t.start()
            t.join(2)  # time for a call that does not wait to meet the closed environment (it must not)
            threads.append(t)
        return real_open(path, **kwargs)

    monkeypatch.setattr(_Env, "_open", staticmethod(reopen))
    db.add(id="second", content="written by the reopened environment", now=2.0)
    for t in threads:
        t.join(60)
    assert len(threads) == 1 and len(got) == 1
    assert isinstance(got[0], tuple) and got[0][0] == got[0][1] and isinstance(got[0][0], int), got


def _turnstile_holder(fd: int) -> bool:
    """Whether another open file description holds the writer lock's turnstile (F_OFD_GETLK)."""
    import fcntl
    import struct
    probe = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0)
    return struct.unpack("hhqqi4x", fcntl.fcntl(fd, fcntl.F_OFD_GETLK, probe))[0] != fcntl.F_UNLCK


def test_a_waiting_writer_goes_before_the_holder_s_next_write(tmp_path):
    """flock is not fair: a process committing in a tight loop took the writer lock back at once
    after each commit, and a maintenance pass of another process waiting for it failed with
    BusyError. A writer now waits in the lock's turnstile: the holder's next write passes the
    turnstile only once the waiter has the writer lock, so it commits after the waiter."""
    import fcntl
    import threading

    from engramdb.store import _enter_turnstile
    path = tmp_path / "fair.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add(id="first", content="kept", now=1.0)
    other = os.open(str(path) + "-maint", os.O_RDWR)  # another writer's -maint, as a looping process has it
    db = engram.open(path, passphrase=PASSPHRASE, timeout=60)
    try:
        errors: list[BaseException] = []

        def write() -> None:
            try:
                db.add(id="waiter", content="the waiting write", now=2.0)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        fcntl.flock(other, fcntl.LOCK_EX)  # the other writer commits
        waiter = threading.Thread(target=write)
        waiter.start()
        for _ in range(6000):  # the waiter takes the turnstile, then waits for the writer lock
            if _turnstile_holder(other) or not waiter.is_alive():
                break
            threading.Event().wait(0.01)
        assert _turnstile_holder(other), "the waiting writer does not hold the turnstile"
        fcntl.flock(other, fcntl.LOCK_UN)  # its commit is done; its next one:
        assert _enter_turnstile(other, None, "")  # waits until the waiter has the writer lock
        fcntl.flock(other, fcntl.LOCK_EX)  # and until the waiter's commit is done
        try:
            assert db.get("waiter").content == "the waiting write"  # it went first
        finally:
            fcntl.flock(other, fcntl.LOCK_UN)
        waiter.join(60)
        assert not waiter.is_alive() and errors == []
    finally:
        db.close()
        os.close(other)
