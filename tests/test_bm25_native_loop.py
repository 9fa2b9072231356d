"""The agent loop's read path with the C extension (a term's best in ``best_runs``, deltas
joined by ``concat_postings``, pair values, frontier) against the pure-Python path: a
long-lived handle querying after every commit, with the extension, answers exactly as a
fresh handle on the numpy path in the same snapshot (docnos, order, score bits), over a
random history of one-document commits, updates that re-add a docno, deletes and merges, on
top of a large segment whose common terms have long runs (frontiers). Skip without the
extension unless ENGRAMDB_REQUIRE_NATIVE=1, as tests/test_native.py does."""
from __future__ import annotations

import os

import numpy as np
import pytest

from engramdb import _accel
from engramdb.index import bm25
from engramdb.index.bm25 import SegmentedBM25

NATIVE = _accel.load({})
if NATIVE is None and os.environ.get("ENGRAMDB_REQUIRE_NATIVE") == "1":
    raise RuntimeError("ENGRAMDB_REQUIRE_NATIVE=1 but engramdb._native is not built")


def _search(native: object, handle: SegmentedBM25, txn: object, query: object, k: int) -> list[tuple[int, float]]:
    saved = _accel.NATIVE
    try:
        _accel.NATIVE = native  # type: ignore[assignment]
        return handle.search(txn, query, k)  # type: ignore[arg-type]
    finally:
        _accel.NATIVE = saved


@pytest.mark.skipif(NATIVE is None, reason="engramdb._native is not built")
@pytest.mark.parametrize(("seed", "lookup_ratio"), [(1, bm25.LOOKUP_RATIO), (2, bm25.LOOKUP_RATIO), (3, 0.0)])
def test_loop_with_the_extension_answers_as_the_pure_path(store, monkeypatch: pytest.MonkeyPatch, seed: int,
                                                          lookup_ratio: float) -> None:
    # lookup_ratio 0.0: every multi-term query looks its longest list up (top_terms' lookup path)
    monkeypatch.setattr(bm25, "LOOKUP_RATIO", lookup_ratio)
    monkeypatch.setattr(bm25, "SMALL_SEGMENT_DOCS", 6)
    monkeypatch.setattr(bm25, "AUTO_MERGE_MAX_DOCS", 6 * bm25.MERGE_FACTOR)
    monkeypatch.setattr(bm25, "_FRONTIER_DEPTH", 24)  # frontiers in runs of this size (k 1, 10 from them)
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(40)]
    weights = 1.0 / np.arange(1, len(words) + 1)
    weights /= weights.sum()

    def doc() -> list[str]:
        # lengths 2-60: many (tf, length) pairs, so the common words' runs keep a frontier
        return [str(w) for w in rng.choice(words, size=int(rng.integers(2, 61)), p=weights)]

    n0 = 1500
    store.write(lambda txn: SegmentedBM25(store.blind, store.last_txnid).apply(
        txn, [(d, doc()) for d in range(1, n0 + 1)], []))
    idx = SegmentedBM25(store.blind, store.last_txnid)
    queries: list[object] = [["w0"], ["w1"], ["w7"], ["w0", "w1"], ["w2", "w9", "w30"], {"w0": 2.0, "w5": 0.5},
                             ["w3", "w3", "w11"]]
    live = set(range(1, n0 + 1))
    nxt = n0 + 1
    for step in range(60):
        op = float(rng.random())
        if op < 0.7:
            added, removed = [(nxt, doc())], []
            live.add(nxt)
            nxt += 1
        elif op < 0.85:
            victim = int(rng.choice(sorted(live)))
            added, removed = [(victim, doc())], [victim]  # an update: the docno again, in a new segment
        else:
            victim = int(rng.choice(sorted(live)))
            added, removed = [], [victim]
            live.discard(victim)
        store.write(lambda txn, a=added, r=removed: idx.apply(txn, a, r))
        with store.read() as txn:
            for query in (queries[step % len(queries)], queries[(3 * step + 1) % len(queries)]):
                for k in (1, 10, 64, 300):
                    got = _search(NATIVE, idx, txn, query, k)
                    want = _search(None, SegmentedBM25(store.blind, store.last_txnid), txn, query, k)
                    assert got == want, (step, query, k)
    assert idx.deltas_built > 0
    fronts = [e.base.front is not None for key, (e, _) in idx.cache._data.items() if key[0] == "t"]
    assert any(fronts)  # long runs ranked from their frontiers


@pytest.mark.skipif(NATIVE is None, reason="engramdb._native is not built")
def test_reader_with_the_extension_answers_as_the_pure_path_while_another_process_writes(store, tmp_path) -> None:
    # the long-lived reader catches up from the file alone (no state of its own writes):
    # query_top's memos and values against a fresh handle on the numpy path, every step
    from test_bm25_cache import _Writer

    rng = np.random.default_rng(11)
    words = [f"w{i}" for i in range(40)]
    weights = 1.0 / np.arange(1, len(words) + 1)
    weights /= weights.sum()

    def doc() -> list[str]:
        return [str(w) for w in rng.choice(words, size=int(rng.integers(2, 41)), p=weights)]

    writer = _Writer(tmp_path / "raw.engram")
    try:
        n0 = bm25.SMALL_SEGMENT_DOCS + 100  # a large segment: base runs with pair codes
        writer.send(op="apply", add=[[d, doc()] for d in range(1, n0 + 1)], remove=[])
        reader = SegmentedBM25(store.blind, store.last_txnid)
        queries: list[object] = [["w0", "w1"], ["w2", "w9", "w30"], {"w0": 2.0, "w5": 0.5}, ["w3", "w3", "w11"]]
        live, nxt = set(range(1, n0 + 1)), n0 + 1
        for step in range(30):
            op = float(rng.random())
            if op < 0.6:
                writer.send(op="apply", add=[[nxt, doc()]], remove=[])
                live.add(nxt)
                nxt += 1
            elif op < 0.75:
                victim = int(rng.choice(sorted(live)))
                writer.send(op="apply", add=[[victim, doc()]], remove=[victim])
            elif op < 0.9:
                victim = int(rng.choice(sorted(live)))
                writer.send(op="apply", add=[], remove=[victim])
                live.discard(victim)
            else:
                writer.send(op="merge", steps=3, force=True)
            with store.read() as txn:
                for query in (queries[step % len(queries)], queries[(step + 1) % len(queries)]):
                    for k in (1, 10, 300):
                        got = _search(NATIVE, reader, txn, query, k)
                        want = _search(None, SegmentedBM25(store.blind, store.last_txnid), txn, query, k)
                        assert got == want, (step, query, k)
        assert any(e.base.docnos.size and e.delta.docnos.size for key, (e, _) in reader.cache._data.items()
                   if key[0] == "t")
    finally:
        writer.close()
