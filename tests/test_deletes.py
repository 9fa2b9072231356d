"""Bulk deletes (Engram.delete_many / Transaction.delete_many): the same file state as
one delete per memory, all or nothing, and the work they do counted (never timed)."""
from __future__ import annotations

import pytest

import engramdb.engram as engram_mod
from engramdb.crypto import KDFParams
from engramdb.errors import NotFoundError

TEXTS = ["the lake at sunrise", "a new job in new york", "painting the lake", "moving to sweden",
         "a wedding in may 2023", "career change to counseling", "the support group meets weekly"]


def _open(path):
    return engram_mod.open(path, passphrase="pw", kdf=KDFParams.for_tests())


def _fill(db, n=60):
    db.add_many([{"id": f"m{i}", "content": TEXTS[i % len(TEXTS)] + f" item{i}"} for i in range(n)], now=1.7e9)
    db.link("m1", "m2", now=1.7e9)
    db.link("m3", "m1", now=1.7e9)


def _state(db):
    with db._store.read() as txn:
        bm25 = [db.indexes.bm25.search(txn, db.indexes.tokenizer(q), 20) for q in TEXTS]
    return sorted(db.ids()), bm25, [(e.src, e.dst) for i in db.ids() for e in db.edges(i)]


def test_delete_many_equals_one_delete_each(tmp_path):
    a, b = _open(tmp_path / "a.engram"), _open(tmp_path / "b.engram")
    try:
        for db in (a, b):
            _fill(db)
        victims = ["m1", "m7", "m8", "m30", "m59"]
        for id_ in victims:
            a.delete(id_)
        assert b.delete_many(victims + ["m7"]) == 5  # a repeated id counts once
        assert _state(a) == _state(b)
        assert [str(p) for p in b.verify()] == []
        assert len(b) == 55
    finally:
        a.close()
        b.close()


def test_delete_many_is_all_or_nothing(tmp_path):
    db = _open(tmp_path / "a.engram")
    try:
        _fill(db, 20)
        before = _state(db)
        with pytest.raises(NotFoundError):
            db.delete_many(["m1", "nope", "m2"])
        assert _state(db) == before
        assert db.delete_many(["m1", "nope"], missing_ok=True) == 1
        assert "m1" not in db and len(db) == 19
        assert db.delete_many([]) == 0
        with db.transaction() as tx:  # inside a transaction, with other writes
            tx.add("fresh memory about the lake", id="n1")
            assert tx.delete_many(["m2", "m3", "n1"]) == 3
        assert "n1" not in db and len(db) == 17
        assert [str(p) for p in db.verify()] == []
    finally:
        db.close()


def test_delete_many_counts_of_work(tmp_path):
    """One bulk delete writes one tombstone run per segment touched and each change-log
    entry once; one delete per transaction writes one run each."""
    db = _open(tmp_path / "a.engram")
    try:
        _fill(db, 200)
        bm = db.indexes.bm25
        db.delete_many([f"m{i}" for i in range(0, 200, 10)])
        assert (bm.runs_written, bm.tombstones_written) == (1, 20)
        for i in range(5, 200, 40):
            db.delete(f"m{i}")
        assert bm.runs_written == 6
        assert bm.tombstones_written <= 20 + 5 * 2  # the small runs merge among themselves only
    finally:
        db.close()
