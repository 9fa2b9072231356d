"""Failure injection at the k-th write (reliability test plan T3.4, SQLite's "fail at I/O
k" loops). Every write of a transaction goes through sealing a value or deleting one; an
exception raised at the k-th such call, for every k until the operation completes, must
leave the handle and the file exactly as before the operation (one transaction) or, for
operations of several transactions, in a state that running them again completes to the
same result as an uninterrupted run. The same handle must see the same as a fresh one
(no cache keeps what a rolled-back transaction wrote), the file must verify, and no read
transaction may be left open. Run twice: fail once, and fail at every call from k on."""
from __future__ import annotations

import shutil
from collections.abc import Callable

import pytest
from conftest import PASSPHRASE, TEST_KDF

import engramdb.engram as engram
from engramdb.maintenance import MaintenanceConfig
from engramdb.store import Txn

DAY = 86400.0
T0 = 1_700_000_000.0


class Injected(Exception):
    pass


def _base(path) -> None:
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add_space("v", dims=4)
        words = ["alpha", "beta", "gamma", "delta", "omega"]
        db.add_many([{"id": f"n{i}", "content": f"{words[i % 5]} {words[(i * 3) % 5]} note {i}",
                      "tags": [f"t{i % 3}"], "embeddings": {"v": [1.0, float(i % 7), 0.5, float(i % 3)]},
                      "created_at": T0 + i * DAY} for i in range(40)], now=T0)
        for i in range(0, 30, 3):
            db.link(f"n{i}", f"n{i + 1}")


def _logical(db) -> tuple:
    """What a user can see: every memory, edges, archived originals, and a few recalls."""
    nodes = tuple(sorted((n.id, n.content, n.tags, n.tier, repr(sorted(n.metadata.items())), n.pinned)
                         for n in db.scan()))
    edges = tuple(sorted((e.src, e.dst, e.kind) for n in nodes for e in db.edges(n[0])))
    archived = tuple(sorted((n[0], db.archived(n[0])) for n in nodes))
    recalls = tuple(tuple(h.id for h in db.recall(q, top_k=5, hops=False)) for q in ("alpha", "beta note", "omega 7"))
    return nodes, edges, archived, recalls


def _tx(db) -> None:
    with db.transaction() as tx:
        tx.add(id="new1", content="alpha fresh words", tags=["t9"], now=T0)
        tx.update("n2", content="beta rewritten text")
        tx.delete("n5")
        tx.link("new1", "n7")


def _forget_rest(db) -> None:
    """Finish an interrupted forget: its removal commits first, then it compacts."""
    left = [i for i in ("n1", "n3", "n9") if db.get(i, None) is not None]
    if left:
        db.forget(ids=left)
    else:
        db.compact()


AGAIN = "again"  # an operation of several transactions that running again finishes

# name: (operation, how to finish it after a failure: None for one transaction, all or nothing)
OPERATIONS: dict[str, tuple[Callable[[engram.Engram], object], Callable[[engram.Engram], object] | str | None]] = {
    "add_many": (lambda db: db.add_many([{"id": f"b{i}", "content": f"gamma batch {i}"} for i in range(30)],
                                        now=T0), None),
    "transaction": (_tx, None),
    "archive": (lambda db: db.archive("n4"), None),
    "delete_many": (lambda db: db.delete_many(["n10", "n11", "n12"]), None),
    "forget": (lambda db: db.forget(ids=["n1", "n3", "n9"]), _forget_rest),
    "maintain": (lambda db: db.maintain(MaintenanceConfig(), now=T0 + 400 * DAY), AGAIN),
    "import_many": (lambda db: db.import_many([{"id": f"i{i}", "content": f"delta import {i}"} for i in range(25)],
                                              chunk=10, now=T0), AGAIN),
}


@pytest.fixture(scope="module")
def base_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("inject") / "base.engram"
    _base(path)
    return path


def _copy(base_file, tmp_path, name="w.engram"):
    target = tmp_path / name
    shutil.copyfile(base_file, target)
    return target


@pytest.mark.parametrize("persistent", [False, True], ids=["once", "from-k"])
@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_a_failure_at_any_write_leaves_all_or_nothing(base_file, tmp_path, monkeypatch, name, persistent):
    op, finish = OPERATIONS[name]
    with engram.open(_copy(base_file, tmp_path, "before.engram"), passphrase=PASSPHRASE) as db:
        before = _logical(db)
        op(db)
        after = _logical(db)
    assert after != before, "the operation must change something"
    calls = {"n": 0, "at": 0}
    originals = {m: getattr(Txn, m) for m in ("_seal", "_seal_many", "_delete_envelope")}

    def counted(method: str):
        original = originals[method]

        def wrapper(self, *args, **kwargs):
            calls["n"] += 1
            if calls["at"] and (calls["n"] == calls["at"] or (persistent and calls["n"] > calls["at"])):
                raise Injected(f"injected at write {calls['n']}")
            return original(self, *args, **kwargs)
        return wrapper

    for method in originals:
        monkeypatch.setattr(Txn, method, counted(method))
    k = 0
    while True:
        k += 1
        path = _copy(base_file, tmp_path)
        with engram.open(path, passphrase=PASSPHRASE) as db:
            _logical(db)  # warm the caches, as a long-lived handle has them
            calls.update(n=0, at=k)
            try:
                op(db)
                failed = False
            except Injected:
                failed = True
            calls["at"] = 0
            seen = _logical(db)
            if not failed:
                assert seen == after
            elif finish is None:
                assert seen == before, f"k={k}: a rolled-back transaction left a trace"
            else:
                (op if finish == AGAIN else finish)(db)
                seen = _logical(db)
                assert seen == after, f"k={k}: finishing the interrupted operation did not converge"
            assert db.verify() == [], f"k={k}"
            assert "no active readers" in db._store._env.env.readers()
        with engram.open(path, passphrase=PASSPHRASE) as fresh:
            assert _logical(fresh) == seen, f"k={k}: the handle's caches differ from the file"
        if not failed:
            break
    assert k > 1, "the operation should write at least once"
