"""A term's delta joins its small segments' blocks (bm25 ``_delta``; with the C extension in
one ``concat_postings`` call): when the blocks interleave (an update re-added an older docno
in a newer segment) the joined docnos are sorted, on both paths, and the answers equal a
fresh handle's."""
from __future__ import annotations

import numpy as np
import pytest

from engramdb import _accel
from engramdb.index.bm25 import SegmentedBM25

NATIVE = _accel.load({})


@pytest.mark.parametrize("native", [True, False])
def test_an_interleaved_delta_is_sorted(store, monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    if native and NATIVE is None:
        pytest.skip("engramdb._native is not built")
    monkeypatch.setattr(_accel, "NATIVE", NATIVE if native else None)
    idx = SegmentedBM25(store.blind, store.last_txnid)
    store.write(lambda txn: idx.apply(txn, [(n, ["a", "b"]) for n in range(1, 6)], []))
    store.write(lambda txn: idx.apply(txn, [(n, ["a"]) for n in range(6, 9)], []))
    with store.read() as txn:
        idx.search(txn, ["a", "b"], 5)  # cached: the delta of two small segments
    # doc 2 updated: tombstoned in the first segment, re-added (same docno) in a third
    store.write(lambda txn: idx.apply(txn, [(2, ["a", "a", "b", "b", "b"])], [2]))
    for query in (["a"], ["a", "b"], ["b"], {"a": 1.0, "b": 3.0}):
        with store.read() as txn:
            got = idx.search(txn, query, 8)
            assert got == SegmentedBM25(store.blind, store.last_txnid).search(txn, query, 8)
    assert got[0][0] == 2  # the updated document now leads
    entry = idx.cache.get(("t", idx.blind("a")))
    assert len(entry.delta.key[0]) == 3  # three small segments hold "a"
    assert entry.delta.docnos.tolist() == list(range(1, 9))  # sorted, doc 2 from the newest block
    assert np.all(np.diff(entry.delta.docnos) > 0)
