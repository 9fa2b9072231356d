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


def _count_opens(monkeypatch):
    """Count Sealer.open calls per table (the records a write decrypts)."""
    from engramdb import crypto

    counts: dict[bytes, int] = {}
    real = crypto.Sealer.open

    def counting(self, table, key, envelope):
        counts[table] = counts.get(table, 0) + 1
        return real(self, table, key, envelope)

    monkeypatch.setattr(crypto.Sealer, "open", counting)
    return counts


def test_delete_many_without_vectors_opens_no_record(tmp_path, monkeypatch):
    """With no embedding space, the indexes need nothing of a deleted record: delete_many
    decrypts each id once (its docno) and no node record (regression: it decrypted and
    decoded every record, validating every field, ~40 % of a bulk delete)."""
    db = _open(tmp_path / "a.engram")
    try:
        _fill(db, 200)
        counts = _count_opens(monkeypatch)
        assert db.delete_many([f"m{i}" for i in range(0, 200, 2)]) == 100
        assert counts.get(b"nodes", 0) == 0
        assert counts.get(b"ids", 0) == 100
        assert len(db) == 100 and [str(p) for p in db.verify()] == []
    finally:
        db.close()


def test_delete_many_reads_only_the_records_of_a_space(tmp_path, monkeypatch):
    """A space that is not auto: each deleted record is opened once for the names of its
    spaces (not its vectors), and the deleted memories' vectors are gone."""
    import numpy as np

    db = _open(tmp_path / "a.engram")
    try:
        db.add_space("s", dims=4, model="test", normalize=False)
        rng = np.random.default_rng(3)
        vecs = rng.standard_normal((60, 4)).astype(np.float32)
        db.add_many([{"id": f"m{i}", "content": f"text {i}", **({"embeddings": {"s": vecs[i]}} if i % 2 else {})}
                     for i in range(60)], now=1.7e9)
        counts = _count_opens(monkeypatch)
        victims = list(range(0, 60, 3))
        assert db.delete_many([f"m{i}" for i in victims]) == 20
        assert counts.get(b"nodes", 0) == 20
        assert counts.get(b"vectors", 0) <= 2  # the blocks rewritten, no vector read per memory
        with db._store.read() as txn:
            hits = db.indexes.vectors.search(txn, "s", vecs[3], 60)
        kept = [i for i in range(1, 60, 2) if i not in victims]
        assert len(hits) == len(kept)
        assert {f"m{i}" for i in kept} == {db.get(f"m{i}").id for i in kept}  # still there, with their vectors
        assert all(db.get(f"m{i}").embeddings for i in kept)
        assert [str(p) for p in db.verify()] == []
    finally:
        db.close()
