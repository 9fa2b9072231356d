"""Thread rules (reliability rule 18, T5.3): LMDB binds a write transaction to the thread
that began it. A `Transaction` handed to another thread worked while its owner waited,
writing into the owner's transaction from a thread that holds neither LMDB's writer mutex
nor engramdb's per-thread join. Any use from another thread is refused before it touches
the file or the counters; the owner's transaction is unharmed and commits."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from conftest import PASSPHRASE, TEST_KDF

import engramdb.engram as engram
from engramdb.errors import StoreError, ValidationError, WrongThreadError


def _in_thread(fn: Callable[[], Any]) -> BaseException | None:
    """Run ``fn`` in a new thread, wait for it, and return what it raised (None if nothing)."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            raised.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    return raised[0] if raised else None


OPERATIONS: dict[str, Callable[[engram.Transaction], Any]] = {
    "add": lambda tx: tx.add("written by the other thread", id="other"),
    "update": lambda tx: tx.update("a", content="changed by the other thread"),
    "delete": lambda tx: tx.delete("a"),
    "link": lambda tx: tx.link("a", "b"),
    "get": lambda tx: tx.get("a"),
    "put_procedure_row": lambda tx: tx.put_procedure_row({"kind": "edge", "src": "x", "dst": "y"}),
    # the store transaction underneath: its counters change without touching LMDB
    "allocate_docno": lambda tx: tx._txn.allocate_docno(),
    "after_commit": lambda tx: tx._txn.after_commit(lambda snapshot: None),
    "raw put": lambda tx: tx._txn.put("sources", b"k" * 16, b"v"),
}


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_a_write_transaction_used_from_another_thread_is_refused_and_writes_nothing(tmp_path, name):
    path = tmp_path / "t.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("first", id="a")
        db.add("second", id="b")
        with db.transaction() as tx:
            tx.add("the owner's own write", id="own")
            next_docno = tx._txn.state.next_docno
            raised = _in_thread(lambda: OPERATIONS[name](tx))
            assert isinstance(raised, WrongThreadError), raised
            assert "thread that opened it" in raised.message and "wrote nothing" in raised.message
            assert "db.transaction()" in raised.hint
            assert tx._txn.state.next_docno == next_docno  # no document number taken
            tx.update("b", content="the owner's update")  # the owner's transaction goes on
        assert db.get("own").content == "the owner's own write"
        assert db.get("b").content == "the owner's update"
        assert db.get("a").content == "first" and "other" not in db
        assert db.edges("a") == [] and db.procedure_rows() == []
        assert db.verify() == []
    with engram.open(path, passphrase=PASSPHRASE) as db:  # what the file holds
        assert sorted(db.ids()) == ["a", "b", "own"]
        assert db.get("a").content == "first" and db.get("b").content == "the owner's update"
        assert db.add("next") and db.verify() == []


def test_the_store_level_transaction_is_bound_to_its_thread_too(tmp_path):
    with engram.open(tmp_path / "t.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        store = db._store
        with store.transaction() as txn:
            raised = _in_thread(lambda: txn.get("meta", b"state"))
            assert isinstance(raised, WrongThreadError)
            txn.put("sources", b"s" * 16, b"owner")
        with store.read() as txn:
            assert txn.get("sources", b"s" * 16) == b"owner"


def test_a_transaction_that_ended_says_so_in_any_thread(tmp_path):
    with engram.open(tmp_path / "t.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        with db.transaction() as tx:
            tx.add("inside", id="a")
        raised = _in_thread(lambda: tx.add("after", id="b"))
        assert isinstance(raised, StoreError) and "has ended" in raised.message
        assert "b" not in db


def test_each_thread_with_its_own_transaction_still_works(tmp_path):
    """The supported way: each thread opens its own db.transaction(); they take turns."""
    threads, per_thread = 4, 25
    with engram.open(tmp_path / "t.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        barrier = threading.Barrier(threads)

        def writer(n: int) -> None:
            barrier.wait()
            for i in range(per_thread):
                with db.transaction() as tx:
                    tx.add(f"thread {n} memory {i}", id=f"t{n}-{i}")
                    if i:
                        tx.link(f"t{n}-{i}", f"t{n}-{i - 1}")
                db.update(f"t{n}-{i}", importance=0.9)  # a write of the handle, in this thread

        failures: list[BaseException | None] = []
        workers = [threading.Thread(target=lambda n=n: failures.append(_catch(writer, n))) for n in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert failures == [None] * threads
        assert len(db) == threads * per_thread
        assert all(node.importance == 0.9 for node in db.scan())
        assert db.verify() == []


def _catch(fn: Callable[[int], None], n: int) -> BaseException | None:
    try:
        fn(n)
    except BaseException as exc:
        return exc
    return None


def test_reads_of_other_threads_see_the_committed_state_meanwhile(tmp_path):
    """Reads are not refused in other threads: each takes its own snapshot, which does not
    show the open transaction's writes until it commits."""
    with engram.open(tmp_path / "t.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("committed", id="a")
        seen: list[Any] = []
        with db.transaction() as tx:
            tx.add("pending", id="b")
            assert _in_thread(lambda: seen.extend([db.get("a").content, "b" in db, len(db)])) is None
        assert seen == ["committed", False, 1]
        assert "b" in db


@pytest.mark.parametrize("operation", ["add", "transaction", "compact"])
def test_a_nested_write_through_another_handle_of_the_file_is_refused_not_a_deadlock(tmp_path, operation):
    """Handles of one path share LMDB's environment and its writer lock. A write through a
    second handle inside the first one's `with db.transaction()` on the same thread waited
    for that very transaction: for ever with timeout=None, else until the timeout, then a
    BusyError blaming "another writer" (T5.3: rejected before it deadlocks). With timeout=0
    the old code fails at once, with the wrong error."""
    path = tmp_path / "t.engram"
    first = engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF, timeout=0)
    second = engram.open(path, passphrase=PASSPHRASE, timeout=0)
    try:
        with first.transaction() as tx:
            tx.add("outer", id="outer")
            with pytest.raises(ValidationError) as err:
                if operation == "add":
                    second.add("inner", id="inner")
                elif operation == "compact":
                    second.compact()
                else:
                    with second.transaction() as inner:
                        inner.add("inner", id="inner")
            assert "through another handle" in err.value.message and "transaction" in err.value.hint
            tx.add("after", id="after")
        assert sorted(second.ids()) == ["after", "outer"]
        second.add("inner", id="inner")  # after the block it writes as usual
        assert "inner" in first and first.verify() == []
    finally:
        second.close()
        first.close()
