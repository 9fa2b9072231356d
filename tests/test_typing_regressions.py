"""Bugs that `mypy --strict` found (issue 12, typing): each keeps its fix."""
from __future__ import annotations


def test_bm25_ceiling_of_an_empty_index_is_the_float_zero(make_db):
    # SegmentedBM25.ceiling is declared `-> float` and documented "0.0 on an empty index", but summed an
    # empty dict and returned the int 0
    db = make_db()
    with db._store.read() as txn:
        ceiling = db.indexes.bm25.ceiling(txn, ["caroline", "guitar"])
    assert type(ceiling) is float and ceiling == 0.0
