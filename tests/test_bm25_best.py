"""A long run's best documents (bm25._Run.best, spec/bm25.md "Caches"): found from its
frontier (the pairs few postings dominate) without scanning the run, they are exactly
``top_k(docnos, values[codes], k)``: the same docnos, values, order and dtypes, ties to the
lower docno, also when values tie exactly or do not grow with tf (then it falls back)."""
from __future__ import annotations

import itertools
import os
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engramdb import _accel
from engramdb.index import bm25
from engramdb.index.bm25 import _frontier, _Pairs, _part, _Run, top_k

# the C extension's frontier_best against the numpy path (skip without the extension unless
# ENGRAMDB_REQUIRE_NATIVE=1, as tests/test_native.py does)
NATIVE = _accel.load({})
if NATIVE is None and os.environ.get("ENGRAMDB_REQUIRE_NATIVE") == "1":
    raise RuntimeError("ENGRAMDB_REQUIRE_NATIVE=1 but engramdb._native is not built")
needs_native = pytest.mark.skipif(NATIVE is None, reason="engramdb._native is not built")


def _run(docnos: np.ndarray, tfs: np.ndarray, dls: np.ndarray) -> tuple[_Pairs, _Run]:
    pairs, codes = _Pairs.empty().extend(tfs, dls)
    return pairs, _Run((1,), docnos, codes, pairs)


def _same(got: tuple[np.ndarray, np.ndarray], want: tuple[np.ndarray, np.ndarray]) -> None:
    assert got[0].dtype == want[0].dtype and got[1].dtype == want[1].dtype
    assert got[0].tolist() == want[0].tolist()
    assert got[1].tobytes() == want[1].tobytes()  # bit for bit


@st.composite
def runs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(docnos increasing, tf, dl) of a run longer than bm25._GROUPED_MIN: one pair, a few,
    or many."""
    n = draw(st.integers(bm25._GROUPED_MIN + 1, 3000))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    shape = draw(st.sampled_from(["one", "few", "many"]))
    max_tf, dl_span = {"one": (1, 1), "few": (3, 3), "many": (12, 60)}[shape]
    tfs = rng.integers(1, max_tf + 1, size=n).astype(np.uint32)
    dls = rng.integers(20, 20 + dl_span, size=n).astype(np.uint32)
    gaps = rng.integers(1, draw(st.sampled_from([2, 5, 1000])), size=n)
    docnos = np.cumsum(gaps).astype(np.int64) + draw(st.sampled_from([0, 2**32 - 3 * 10**6]))
    return docnos, tfs, dls


@st.composite
def pair_values(draw: st.DrawFn, pairs: _Pairs) -> np.ndarray:
    """Values of the pairs (and maybe of pairs added to the table since the run was built):
    BM25 parts, parts rounded to a few values (exact ties across pairs), or arbitrary
    values from a small set (not growing with tf: the frontier cannot tell)."""
    kind = draw(st.sampled_from(["bm25", "rounded", "arbitrary"]))
    extra = draw(st.integers(0, 3))
    tf = np.concatenate([pairs.tf, np.arange(1, extra + 1, dtype=np.float64)])
    dl = np.concatenate([pairs.dl, np.full(extra, 30.0)])
    avgdl = draw(st.floats(5.0, 200.0))
    idf = draw(st.floats(0.01, 12.0))
    w = draw(st.sampled_from([1.0, 2.0, 0.5]))
    values = _part(tf, dl, idf, avgdl, w)
    if kind == "rounded":
        values = np.round(values, draw(st.integers(0, 2)))
        values[values <= 0] = 0.25
    elif kind == "arbitrary":
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        values = rng.choice(np.array([0.5, 1.0, 1.5, 2.0]), size=tf.size)
    return values


@settings(max_examples=300, deadline=None)
@given(data=st.data(), run=runs())
def test_best_is_top_k(data: st.DataObject, run: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    """Differential: best() against top_k over the whole run, the frontier built at various
    depths and kept whatever its share (so small runs exercise it too)."""
    docnos, tfs, dls = run
    depth = data.draw(st.sampled_from([1, 4, 64, 256]))
    with mock.patch.object(bm25, "_FRONTIER_DEPTH", depth), mock.patch.object(bm25, "_FRONTIER_MAX_SHARE", 1.0):
        pairs, r = _run(docnos, tfs, dls)
    assert r.front is not None
    values = data.draw(pair_values(pairs))
    for k in data.draw(st.lists(st.integers(0, docnos.size + 5), min_size=1, max_size=4)) + [1, 10, 64]:
        want = top_k(r.docnos, values[r.codes], k)
        _same(r.best(k, values), want)
        got = r._frontier_best(k, values)  # the frontier's answer, when it gives one, is exact
        if got is not None:
            _same(got, want)
        if k > 0:
            _same(r._pairs_best(k, values), want)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), run=runs())
def test_best_default_build(data: st.DataObject, run: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    """The same with the frontier as built by default (dropped when it would hold too much)."""
    docnos, tfs, dls = run
    pairs, r = _run(docnos, tfs, dls)
    values = data.draw(pair_values(pairs))
    for k in (1, 10, 64, data.draw(st.integers(0, docnos.size + 5))):
        _same(r.best(k, values), top_k(r.docnos, values[r.codes], k))


def test_frontier_answers_without_scanning() -> None:
    """With BM25 parts (growing with tf, falling with dl) and k within the frontier's depth,
    the frontier answers under any avgdl and idf: the run's codes are never scanned."""
    rng = np.random.default_rng(3)
    n = 40_000
    docnos = np.cumsum(rng.integers(1, 4, size=n)).astype(np.int64)
    tfs = np.minimum(rng.zipf(2.0, size=n), 30).astype(np.uint32)
    dls = rng.integers(40, 81, size=n).astype(np.uint32)
    pairs, r = _run(docnos, tfs, dls)
    assert r.front is not None and r.front_docnos is not None
    assert r.front_docnos.size < n // 10  # the frontier is a small part of the run
    assert r.nbytes >= r.docnos.nbytes + r.codes.nbytes + r.front_docnos.nbytes  # counted
    with mock.patch.object(_Run, "_pairs_best", side_effect=AssertionError("scanned the run")):
        for avgdl in (20.0, 60.0, 61.37, 500.0):
            for idf in (0.3, 2.5):
                values = _part(pairs.tf, pairs.dl, idf, avgdl, 1.0)
                for k in (1, 10, 64, 80, bm25._FRONTIER_DEPTH):
                    _same(r.best(k, values), top_k(r.docnos, values[r.codes], k))


def test_frontier_tie_with_excluded_pair_falls_back() -> None:
    """A pair off the frontier worth as much as the k-th best (here forced: values that do
    not follow tf) makes the frontier decline, and the scan gives the exact answer."""
    n = 2000
    docnos = np.arange(n, dtype=np.int64) * 3
    tfs = np.where(np.arange(n) < 1700, 1, 5).astype(np.uint32)  # 300 postings of (5, 40) dominate
    dls = np.full(n, 40, dtype=np.uint32)
    pairs, r = _run(docnos, tfs, dls)
    assert r.front is not None and r.rest is not None and r.rest.size == 1  # (1, 40) is off the frontier
    values = np.ones(pairs.tf.size)  # every posting ties: the lowest docnos, all from the excluded pair
    assert r._frontier_best(10, values) is None
    _same(r.best(10, values), top_k(r.docnos, values[r.codes], 10))
    assert r.best(10, values)[0].tolist() == list(range(0, 30, 3))


def test_renamed_shares_the_frontier() -> None:
    rng = np.random.default_rng(5)
    n = 5000
    pairs, r = _run(np.arange(n, dtype=np.int64), rng.integers(1, 6, size=n).astype(np.uint32),
                    rng.integers(30, 90, size=n).astype(np.uint32))
    other = r.renamed((1, 2))
    assert other.segs == (1, 2) and r.segs == (1,)
    assert other.front_docnos is r.front_docnos and other.nbytes == r.nbytes
    values = _part(pairs.tf, pairs.dl, 1.5, 55.0, 1.0)
    _same(other.best(20, values), r.best(20, values))


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_pairs=st.integers(0, 80), limit=st.integers(1, 300))
def test_frontier_matches_brute_force(seed: int, n_pairs: int, limit: int) -> None:
    """_frontier against counting, per pair, the postings of every other pair that dominates it."""
    rng = np.random.default_rng(seed)
    keys = rng.choice(20 * 20, size=n_pairs, replace=False)
    tf = (keys // 20 + 1).astype(np.float64)
    dl = (keys % 20 + 10).astype(np.float64)
    counts = rng.integers(1, 40, size=n_pairs).astype(np.int64)
    want = [sum(int(counts[q]) for q in range(n_pairs) if q != p and tf[q] >= tf[p] and dl[q] <= dl[p]) < limit
            for p in range(n_pairs)]
    assert _frontier(tf, dl, counts, limit).tolist() == want


@pytest.mark.parametrize("k", [0, -1])
def test_best_of_nothing(k: int) -> None:
    rng = np.random.default_rng(9)
    n = 1000
    pairs, r = _run(np.arange(n, dtype=np.int64), rng.integers(1, 4, size=n).astype(np.uint32),
                    rng.integers(30, 40, size=n).astype(np.uint32))
    values = _part(pairs.tf, pairs.dl, 1.0, 35.0, 1.0)
    _same(r.best(k, values), top_k(r.docnos, values[r.codes], k))


def _native_frontier_best(r: _Run, k: int, values: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    saved = _accel.NATIVE
    try:
        _accel.NATIVE = NATIVE
        return r._frontier_best(k, values)
    finally:
        _accel.NATIVE = saved


@needs_native
@settings(max_examples=300, deadline=None)
@given(data=st.data(), run=runs())
def test_native_frontier_best_equals_numpys(data: st.DataObject, run: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    """Differential: the C extension's frontier_best declines exactly when the numpy path
    does, and otherwise gives the same arrays (dtypes, docnos, value bits)."""
    docnos, tfs, dls = run
    depth = data.draw(st.sampled_from([1, 4, 64, 256]))
    with mock.patch.object(bm25, "_FRONTIER_DEPTH", depth), mock.patch.object(bm25, "_FRONTIER_MAX_SHARE", 1.0):
        pairs, r = _run(docnos, tfs, dls)
    values = data.draw(pair_values(pairs))
    for k in data.draw(st.lists(st.integers(1, docnos.size + 5), min_size=1, max_size=4)) + [1, 10, 64]:
        native = _native_frontier_best(r, k, values)
        pure = r._frontier_best_numpy(k, values) if r.front_total >= k else None
        assert (native is None) == (pure is None), k
        if native is not None and pure is not None:
            _same(native, pure)
            _same(native, top_k(r.docnos, values[r.codes], k))


@needs_native
def test_native_frontier_best_refuses_bad_arguments() -> None:
    assert NATIVE is not None
    rng = np.random.default_rng(2)
    n = 3000
    pairs, r = _run(np.arange(n, dtype=np.int64), rng.integers(1, 6, size=n).astype(np.uint32),
                    rng.integers(30, 90, size=n).astype(np.uint32))
    assert r.front is not None and r.front_docnos is not None
    values = _part(pairs.tf, pairs.dl, 1.5, 55.0, 1.0)
    args = [values, r.front, r.front_sizes, r.front_starts, r.front_docnos, r.rest]

    def call(*a: object, k: int = 5, out_docnos: object = None, out_values: object = None) -> int:
        od = np.empty(k, dtype=r.front_docnos.dtype) if out_docnos is None else out_docnos
        ov = np.empty(k) if out_values is None else out_values
        return NATIVE.frontier_best(*a, k, od, ov)

    assert call(*args) == 5
    with pytest.raises(TypeError, match="values"):
        call(values.astype(np.float32), *args[1:])
    with pytest.raises(TypeError, match="front must be int64"):
        call(values, r.front.astype(np.int32), *args[2:])
    with pytest.raises(TypeError, match="one dtype"):
        call(*args, out_docnos=np.empty(5, dtype=np.int32))
    with pytest.raises(ValueError, match="outputs hold k"):
        call(*args, out_values=np.empty(4))
    with pytest.raises(ValueError, match="k must be positive"):
        call(*args, k=0)
    with pytest.raises(ValueError, match="beyond the values"):
        call(values[:1], *args[1:])
    with pytest.raises(ValueError, match="beyond the values or the docnos"):
        call(values, args[1], args[2] + n, *args[3:])


@st.composite
def posting_runs(draw: st.DrawFn) -> tuple[list[tuple[np.ndarray, np.ndarray | None, np.ndarray]], int]:
    """(docnos, codes or None, values) runs over disjoint docnos of mixed dtypes, values
    tie-heavy or not, and a k (0, within, beyond the postings)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n_runs = draw(st.integers(0, 4))
    used = rng.permutation(50_000)[:draw(st.integers(0, 2500))]
    bounds = np.sort(rng.integers(0, used.size + 1, size=max(n_runs - 1, 0)))
    out: list[tuple[np.ndarray, np.ndarray | None, np.ndarray]] = []
    for part in np.split(used, bounds) if n_runs else []:
        docnos = np.sort(part).astype(draw(st.sampled_from([np.int64, np.uint32, np.uint64, np.int32])))
        n_values = draw(st.integers(1, 12))
        if draw(st.booleans()):
            values = rng.choice(np.array([0.25, 0.5, 1.0, 1.0 + 2**-52, 2.0]), size=n_values)  # exact ties
        else:
            values = rng.random(n_values) + 0.01
        if draw(st.booleans()):
            codes = rng.integers(0, n_values, size=docnos.size).astype(draw(st.sampled_from([np.uint8, np.uint16, np.uint32, np.int64])))
            out.append((docnos, codes, values))
        else:
            out.append((docnos, None, values[rng.integers(0, n_values, size=docnos.size)]))
    k = draw(st.sampled_from([0, 1, 10, 64, 256, 5000]))
    return out, k


@needs_native
@settings(max_examples=300, deadline=None)
@given(case=posting_runs())
def test_native_best_runs_equals_top_k(case: tuple[list[tuple[np.ndarray, np.ndarray | None, np.ndarray]], int]) -> None:
    """Differential: the C extension's best_runs gives top_k over all the runs' postings
    together: the same docnos, order and value bits (ties to the lower docno), as int64."""
    assert NATIVE is not None
    runs, k = case
    docnos = np.concatenate([r[0].astype(np.int64) for r in runs] + [np.zeros(0, np.int64)])
    values = np.concatenate([r[2] if r[1] is None else r[2][r[1]] for r in runs] + [np.zeros(0)])
    want = top_k(docnos, values, k)
    n = min(k, docnos.size)
    got = (np.empty(n, dtype=np.int64), np.empty(n))
    assert NATIVE.best_runs(runs, k, *got) == n
    _same(got, want)


def _term(base_docnos: np.ndarray, tfs: np.ndarray, dls: np.ndarray, delta_docnos: np.ndarray,
          avgdl: float) -> bm25._Term:
    pairs, codes = _Pairs.empty().extend(tfs, dls)
    base = _Run((1,), base_docnos, codes, pairs)
    rng = np.random.default_rng(int(delta_docnos.size))
    dtf = rng.integers(1, 4, size=delta_docnos.size).astype(np.float64)
    ddl = rng.integers(20, 40, size=delta_docnos.size).astype(np.float64)
    delta = bm25._Delta(((2,), (0,)), delta_docnos, dtf, ddl, (int(delta_docnos.size),))
    postings = bm25._TermPostings(1, (1, 2), {}, pairs, base, delta)
    memo = (_part(pairs.tf, pairs.dl, 1.3, avgdl, 1.0), _part(dtf, ddl, 1.3, avgdl, 1.0), {})
    return bm25._Term(postings, 1.0, memo)


@needs_native
@pytest.mark.parametrize("shape", ["short", "frontier", "no frontier", "no frontier, ranked pairs", "delta only",
                                   "base only"])
def test_term_best_native_equals_numpy(shape: str) -> None:
    """_Term.best through the C path (frontier, whole-run scan, or ranked pairs beyond
    _SCAN_MAX, then one best_runs over base and delta) against the numpy path: the same
    docnos, order and value bits, at several depths, ties included (few pairs)."""
    rng = np.random.default_rng(11)
    n = {"short": 200, "delta only": 0}.get(shape, 6000)
    base_docnos = np.sort(rng.choice(10**6, size=n, replace=False)).astype(np.int64)
    tfs = rng.integers(1, 4, size=n).astype(np.uint32)
    dls = rng.integers(20, 26, size=n).astype(np.uint32)
    delta_docnos = np.arange(10**6, 10**6 + (0 if shape == "base only" else 500), dtype=np.int64)
    share = 0.0 if shape.startswith("no frontier") else 1.0
    scan_max = 100 if shape == "no frontier, ranked pairs" else bm25._SCAN_MAX
    with mock.patch.object(bm25, "_FRONTIER_MAX_SHARE", share), mock.patch.object(bm25, "_SCAN_MAX", scan_max):
        for k in (1, 10, 64, 300, 7000):
            for avgdl in (21.0, 23.5, 40.0):
                native, pure = _term(base_docnos, tfs, dls, delta_docnos, avgdl), _term(base_docnos, tfs, dls,
                                                                                        delta_docnos, avgdl)
                assert (native.postings.base.front is None) == (shape.startswith("no frontier") or n <= 320)
                got = _best_with(NATIVE, native, k)
                want = _best_with(None, pure, k)
                assert got[0].tolist() == want[0].tolist(), (k, avgdl)
                assert got[1].tobytes() == want[1].tobytes()


def _best_with(native: Any, term: bm25._Term, k: int) -> tuple[np.ndarray, np.ndarray]:
    saved = _accel.NATIVE
    try:
        _accel.NATIVE = native
        return term.best(k)
    finally:
        _accel.NATIVE = saved


@needs_native
def test_native_best_runs_refuses_bad_arguments() -> None:
    assert NATIVE is not None
    docnos = np.arange(10, dtype=np.int64)
    values = np.linspace(1.0, 2.0, 10)
    od, ov = np.empty(5, dtype=np.int64), np.empty(5)
    assert NATIVE.best_runs([(docnos, None, values)], 5, od, ov) == 5
    assert od.tolist() == [9, 8, 7, 6, 5]
    assert NATIVE.best_runs([], 5, od, ov) == 0
    with pytest.raises(TypeError, match="a run is a"):
        NATIVE.best_runs([(docnos, values)], 5, od, ov)
    with pytest.raises(TypeError, match="int64 and out_values float64"):
        NATIVE.best_runs([(docnos, None, values)], 5, od.astype(np.uint32), ov)
    with pytest.raises(TypeError, match="values"):
        NATIVE.best_runs([(docnos, None, values.astype(np.float32))], 5, od, ov)
    with pytest.raises(TypeError, match="values must be float64"):
        NATIVE.best_runs([(docnos, None, docnos)], 5, od, ov)
    with pytest.raises(TypeError, match="integer arrays"):
        NATIVE.best_runs([(values, None, values)], 5, od, ov)
    with pytest.raises(ValueError, match="one value per docno"):
        NATIVE.best_runs([(docnos, None, values[:3])], 5, od, ov)
    with pytest.raises(ValueError, match="one code per docno"):
        NATIVE.best_runs([(docnos, np.zeros(3, np.uint8), values)], 5, od, ov)
    with pytest.raises(ValueError, match="beyond the values"):
        NATIVE.best_runs([(docnos, np.full(10, 10, np.uint8), values)], 5, od, ov)
    with pytest.raises(ValueError, match="beyond the values"):
        NATIVE.best_runs([(docnos, np.full(10, -1, np.int64), values)], 5, od, ov)
    with pytest.raises(ValueError, match="hold min"):
        NATIVE.best_runs([(docnos, None, values)], 6, od, ov)
    with pytest.raises(ValueError, match="negative"):
        NATIVE.best_runs([(docnos, None, values)], -1, od, ov)
    with pytest.raises(TypeError, match="C-contiguous"):
        NATIVE.best_runs([(docnos[::2], None, values[::2])], 5, od, ov)


@needs_native
@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_parts=st.integers(0, 6), overlap=st.booleans())
def test_native_concat_postings_equals_numpy(seed: int, n_parts: int, overlap: bool) -> None:
    """A delta's blocks joined by the C extension's concat_postings: numpy's concatenates,
    bit for bit, and "increasing" exactly when each block starts above the previous one's
    end (else _delta sorts: an update re-added an older docno, a merge interleaved)."""
    assert NATIVE is not None
    rng = np.random.default_rng(seed)
    parts = []
    at = 0
    for _ in range(n_parts):
        n = int(rng.integers(1, 40))
        start = int(rng.integers(0, at + 1)) if overlap else at + int(rng.integers(0, 3))
        docnos = start + np.cumsum(rng.integers(1, 4, size=n)).astype(np.int64)
        at = int(docnos[-1])
        parts.append((docnos, rng.random(n) * 5, rng.integers(1, 90, size=n).astype(np.float64)))
    n = sum(p[0].size for p in parts)
    out = (np.empty(n, dtype=np.int64), np.empty(n), np.empty(n))
    increasing = NATIVE.concat_postings(parts, *out)
    assert increasing == all(int(a[0][-1]) < int(b[0][0]) for a, b in itertools.pairwise(parts))
    for i in range(3):
        want = np.concatenate([p[i] for p in parts] + [out[i][:0]])
        assert out[i].tobytes() == want.tobytes()


@needs_native
def test_native_concat_postings_refuses_bad_arguments() -> None:
    assert NATIVE is not None
    d, f = np.arange(4, dtype=np.int64), np.ones(4)
    out = (np.empty(8, dtype=np.int64), np.empty(8), np.empty(8))
    assert NATIVE.concat_postings([(d, f, f), (d + 4, f, f)], *out) is True
    assert NATIVE.concat_postings([(d, f, f), (d, f, f)], *out) is False
    with pytest.raises(ValueError, match="hold the parts' postings exactly"):
        NATIVE.concat_postings([(d, f, f)], *out)
    with pytest.raises(TypeError, match="a part is a"):
        NATIVE.concat_postings([(d, f)], *out)
    with pytest.raises(TypeError, match="docnos must be int64"):
        NATIVE.concat_postings([(d.astype(np.uint32), f, f), (d, f, f)], *out)
    with pytest.raises(TypeError, match="tf and dl float64"):
        NATIVE.concat_postings([(d, d, f), (d, f, f)], *out)
    with pytest.raises(ValueError, match="of one length"):
        NATIVE.concat_postings([(d, f[:3], f), (d, f, f)], *out)
    with pytest.raises(TypeError, match="out_docnos must be int64"):
        NATIVE.concat_postings([(d, f, f), (d, f, f)], out[1], out[1], out[2])
    with pytest.raises(ValueError, match="outputs must be of one length"):
        NATIVE.concat_postings([(d, f, f), (d, f, f)], out[0], out[1][:4], out[2])
    with pytest.raises(TypeError, match="C-contiguous"):
        NATIVE.concat_postings([(d[::2], f[::2], f[::2])], out[0][:2], out[1][:2], out[2][:2])
