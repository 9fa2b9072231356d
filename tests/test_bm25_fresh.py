"""The after-commit catch-up's two C calls against the Python path (spec/bm25.md, "Caches"):

* ``term_values``: a query's idfs and term parts in one call (``_Term.of`` after a commit)
  have the bits of ``_idf`` and ``_part`` of each part alone, whatever the mix of terms
  with a base, a delta or both, weights and lengths;
* ``fresh_delta``: a delta grown by segments this handle wrote (``SegmentedBM25._delta``'s
  append of :class:`_Fresh` blocks) is the same arrays, dtypes, per-segment sizes and
  order flag as the Python loop over ``_Fresh.block`` and ``concat_postings``' numpy twin;
* in a handle's own add-then-query loop the fast path is taken, and the deltas it makes
  equal those a fresh handle reads from the file.

Skip without the extension unless ENGRAMDB_REQUIRE_NATIVE=1, as tests/test_native.py does."""
from __future__ import annotations

import itertools
import os
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engramdb import _accel
from engramdb.index import bm25
from engramdb.index.bm25 import SegmentedBM25, _Fresh, _Seg

NATIVE = _accel.load({})
if NATIVE is None and os.environ.get("ENGRAMDB_REQUIRE_NATIVE") == "1":
    raise RuntimeError("ENGRAMDB_REQUIRE_NATIVE=1 but engramdb._native is not built")
needs_native = pytest.mark.skipif(NATIVE is None, reason="engramdb._native is not built")


def _loop() -> Any:
    assert NATIVE is not None
    bm25._LOG1P_LOOP.clear()
    loop = bm25._log1p_loop(NATIVE)
    assert loop is not None  # numpy >= 1.24 (pyproject) has the API, and its loop gives _idf's bits
    return loop


def _columns(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    tf = rng.integers(1, 50, n).astype(np.float64)
    dl = rng.integers(1, 5000, n).astype(np.float64)
    if seed % 3 == 0:  # wide values too
        tf *= rng.integers(1, 10 ** 6, n)
        dl *= rng.integers(1, 10 ** 6, n)
    return tf, dl


_TERM = st.tuples(st.integers(1, 10 ** 6), st.one_of(st.just(1.0), st.just(3.0), st.floats(1e-3, 1e3)),
                  st.one_of(st.none(), st.integers(0, 300)), st.one_of(st.none(), st.integers(0, 40)),
                  st.integers(0, 2 ** 32 - 1))


@needs_native
@settings(max_examples=300, deadline=None)
@given(terms=st.lists(_TERM, min_size=0, max_size=8), n_docs=st.integers(1, 10 ** 7),
       avgdl=st.floats(0.5, 1e5, allow_nan=False))
def test_term_values_are_each_terms_idf_and_parts(terms: list[Any], n_docs: int, avgdl: float) -> None:
    assert NATIVE is not None
    specs = []
    for df, w, nbase, ndelta, seed in terms:
        base = _columns(nbase, seed) if nbase is not None else (None, np.zeros(0))
        delta = _columns(ndelta, seed + 1) if ndelta is not None else (None, np.zeros(0))
        specs.append((df, w, base[0], base[1], delta[0], delta[1]))
    got = NATIVE.term_values(_loop(), n_docs, avgdl, bm25.K1, bm25.B, specs, np.empty)
    assert len(got) == len(specs)
    bm25._idf.cache_clear()
    for (df, w, btf, bdl, dtf, ddl), parts in zip(specs, got):
        idf = bm25._idf(n_docs, df)
        for tf, dl, part in ((btf, bdl, parts[0]), (dtf, ddl, parts[1])):
            if tf is None:
                assert part is None
                continue
            assert part.dtype == np.float64
            assert part.tobytes() == bm25._part(tf, dl, idf, avgdl, w).tobytes()


@needs_native
def test_term_values_refuses_bad_input() -> None:
    assert NATIVE is not None
    loop = _loop()
    one = np.ones(2)
    bad = [
        ((object(), 10, [(1, 1.0, one, one, None, one)], np.empty), ValueError, "PyCapsule"),
        ((loop, 10, 7, np.empty), TypeError, "sequence"),
        ((loop, 10, [(1, 1.0, one, one)], np.empty), TypeError, "a spec is"),
        ((loop, 10, [("x", 1.0, one, one, None, one)], np.empty), TypeError, "must be real number"),
        ((loop, 10, [(1, 1.0, one, one[:1], None, one)], np.empty), ValueError, "one length"),
        ((loop, 10, [(1, 1.0, one.astype(np.float32), one, None, one)], np.empty), TypeError,
         "^term_values: tf has an unsupported dtype"),
        ((loop, 10, [(1, 1.0, np.ones(4)[::2], one, None, one)], np.empty), TypeError, "tf must be"),
        ((loop, 10, [(1, 1.0, one, one, None, one)], lambda n: np.empty(n, np.int64)), TypeError, "float64"),
        ((loop, 10, [(1, 1.0, one, one, None, one)], lambda n: np.empty(n + 1)), TypeError, "float64"),
    ]
    for (capsule, n_docs, specs, empty), error, message in bad:
        with pytest.raises(error, match=message):
            NATIVE.term_values(capsule, n_docs, 10.0, bm25.K1, bm25.B, specs, empty)


def _fresh(blinds: list[bytes], rows: dict[bytes, list[tuple[int, int]]], first: int) -> _Fresh:
    """A _Fresh segment as a commit keeps it: per blind (in ``blinds`` order) its postings
    (docno offset from ``first``, tf), docnos increasing within a blind."""
    docnos: list[int] = []
    tfs: list[int] = []
    bounds = [0]
    for b in blinds:
        for d, tf in rows.get(b, []):
            docnos.append(first + d)
            tfs.append(tf)
        bounds.append(len(docnos))
    seg_docnos = np.unique(np.array(docnos, dtype=np.int64)) if docnos else np.zeros(0, np.int64)
    lens = (seg_docnos % 97 + 1).astype(np.int64)
    return _Fresh(blinds, np.array(docnos, dtype=np.int64), np.array(tfs, dtype=np.int64),
                  np.array(bounds, dtype=np.int64), _Seg(seg_docnos, lens))


def _python_delta(blind: bytes, old: tuple[np.ndarray, np.ndarray, np.ndarray], fresh: list[_Fresh]
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, ...], bool]:
    """SegmentedBM25._delta's loop on the numpy path for the same inputs."""
    parts = [old] if old[0].size else []
    sizes = []
    for f in fresh:
        block = f.block(blind)
        sizes.append(0 if block is None else int(block[0].size))
        if block is not None and block[0].size:
            parts.append(block)
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0), np.zeros(0), tuple(sizes), True
    if len(parts) == 1:
        return (*parts[0], tuple(sizes), True)
    cols = [np.concatenate([p[i] for p in parts]) for i in range(3)]
    increasing = all(int(a[0][-1]) < int(b[0][0]) for a, b in itertools.pairwise(parts))
    return cols[0], cols[1], cols[2], tuple(sizes), increasing


BLINDS = [bytes([i]) * 16 for i in range(5)]
_POSTINGS = st.lists(st.tuples(st.integers(0, 30), st.integers(1, 9)), max_size=6, unique_by=lambda p: p[0])


@needs_native
@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_fresh_delta_is_the_python_loops_delta(data: st.DataObject) -> None:
    assert NATIVE is not None
    blind = data.draw(st.sampled_from(BLINDS))
    nold = data.draw(st.integers(0, 5))
    old = (np.arange(10, 10 + 3 * nold, 3, dtype=np.int64), np.arange(nold, dtype=np.float64) + 1,
           np.arange(nold, dtype=np.float64) + 7)
    fresh = []
    first = data.draw(st.integers(0, 40))  # may start below the old delta's docnos: not increasing then
    for _ in range(data.draw(st.integers(0, 5))):
        blinds = data.draw(st.lists(st.sampled_from(BLINDS), unique=True, max_size=5))
        rows = {b: sorted(data.draw(_POSTINGS)) for b in blinds}
        fresh.append(_fresh(blinds, rows, first))
        first += data.draw(st.integers(0, 40))
    got = NATIVE.fresh_delta(blind, *old, fresh, np.empty, np.int64)
    want = _python_delta(blind, old, fresh)
    assert got[3] == want[3]
    assert got[4] is want[4]
    for g, w, dtype in zip(got[:3], want[:3], (np.int64, np.float64, np.float64)):
        assert g.dtype == w.dtype == dtype
        assert g.tobytes() == w.tobytes()


@needs_native
def test_fresh_delta_refuses_bad_input() -> None:
    assert NATIVE is not None
    b = BLINDS[0]
    old = (np.zeros(0, np.int64), np.zeros(0), np.zeros(0))
    good = _fresh([b], {b: [(1, 2), (3, 1)]}, 5)
    two = [good, _fresh([b], {b: [(1, 2)]}, 50)]

    class Odd:
        def __init__(self, rows: Any, docnos: Any = good.docnos, tf: Any = good.tf, dl: Any = good.dl) -> None:
            self.rows, self.docnos, self.tf, self.dl = rows, docnos, tf, dl

    bad = [
        ((b, *old, 7, np.empty, np.int64), TypeError, "sequence"),
        ((b, *old, [good] * 64, np.empty, np.int64), ValueError, "at most 63"),
        ((b, *old, [object()], np.empty, np.int64), AttributeError, "rows"),
        ((b, *old, [Odd([])], np.empty, np.int64), TypeError, "rows must be a dict"),
        ((b, *old, [Odd({b: 3})], np.empty, np.int64), TypeError, "a row is"),
        ((b, *old, [Odd({b: (2, 1)})], np.empty, np.int64), ValueError, "0 <= start <= end"),
        ((b, *old, [Odd({b: (0, 9)})], np.empty, np.int64), ValueError, "past the columns"),
        ((b, *old, [Odd({b: (0, 9)}), good], np.empty, np.int64), ValueError, "past its columns"),
        ((b, *old, [Odd({b: (0, 2)}, good.docnos.astype(np.int32)), good], np.empty, np.int64), TypeError,
         "docnos must be int64"),
        ((b, *old, two, np.empty, np.float64), TypeError, "must give n int64"),
        ((b, np.ones(1, np.int64), np.ones(1), [1.0], two, np.empty, np.int64), TypeError, "C-contiguous"),
    ]
    for args, error, message in bad:
        with pytest.raises(error, match=message):
            NATIVE.fresh_delta(*args)


@pytest.mark.skipif(NATIVE is None, reason="engramdb._native is not built")
@pytest.mark.parametrize("seed", [3, 4])
def test_own_commits_grow_deltas_in_one_c_call_as_a_fresh_handle_reads_them(store, monkeypatch: pytest.MonkeyPatch,
                                                                          seed: int) -> None:
    """The agent loop: a handle commits one document at a time (adds; updates, which re-add
    an older docno in a new segment; deletes, often of a recent document, so a segment that
    came since a term's entry may have tombstones) and queries after some commits. Its
    deltas grow through fresh_delta (counted), and every cached delta it holds is the one a
    fresh handle builds from the file for that state (docnos, tf, dl, key, sizes); its
    answers equal the fresh handle's on the pure path."""
    monkeypatch.setattr(bm25, "SMALL_SEGMENT_DOCS", 6)
    monkeypatch.setattr(bm25, "AUTO_MERGE_MAX_DOCS", 6 * bm25.MERGE_FACTOR)
    calls = []
    real = NATIVE

    def counted(*args: Any) -> Any:
        calls.append(1)
        return real.fresh_delta(*args)  # type: ignore[union-attr]

    monkeypatch.setattr(_accel, "NATIVE", real._replace(fresh_delta=counted))  # type: ignore[union-attr]
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(12)]
    store.write(lambda txn: SegmentedBM25(store.blind, store.last_txnid).apply(
        txn, [(d, [str(w) for w in rng.choice(words, 8)]) for d in range(1, 40)], []))
    idx = SegmentedBM25(store.blind, store.last_txnid)
    with store.read() as txn:
        for w in words:
            idx.search(txn, [w], 5)
    live = list(range(1, 40))
    nxt = 40
    for step in range(120):
        doc = [str(w) for w in rng.choice(words, int(rng.integers(1, 6)))]
        op = float(rng.random())
        if op < 0.7:
            added, removed = [(nxt, doc)], []
            live.append(nxt)
            nxt += 1
        elif op < 0.85:
            victim = live[-int(rng.integers(1, min(len(live), 8) + 1))]
            added, removed = [(victim, doc)], [victim]  # an update: the docno again, in a new segment
        else:
            victim = live.pop(len(live) - int(rng.integers(1, min(len(live), 8) + 1)))
            added, removed = [], [victim]  # often in a segment that came since an entry
        store.write(lambda txn, a=added, r=removed: idx.apply(txn, a, r))
        if rng.random() < 0.4:
            continue  # no query after every commit: entries fall several commits behind
        query = [str(w) for w in rng.choice(words, 2)]
        with store.read() as txn:
            got = idx.search(txn, query, 10)
            fresh = SegmentedBM25(store.blind, store.last_txnid)
            saved = _accel.NATIVE
            try:
                _accel.NATIVE = None
                want = fresh.search(txn, query, 10)
            finally:
                _accel.NATIVE = saved
            assert got == want, step
            for w in set(query):
                mine = idx.cache.get(("t", idx.blind(w))).delta
                theirs = fresh.cache.get(("t", fresh.blind(w))).delta
                assert mine.key == theirs.key and mine.sizes == theirs.sizes, (step, w)
                for a, b in ((mine.docnos, theirs.docnos), (mine.tf, theirs.tf), (mine.dl, theirs.dl)):
                    assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), (step, w)
    assert len(calls) > 20
