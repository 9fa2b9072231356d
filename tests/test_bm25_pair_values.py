"""The BM25 term parts (engramdb/index/bm25.py's ``_parts``) through the C extension's
``pair_values`` and through numpy give the same bits, for any mix of groups, lengths,
idf and weights; and they equal ``_part`` of each group alone (what a query's terms get,
whichever path, memoised or not). Skip without the extension unless
``ENGRAMDB_REQUIRE_NATIVE=1``, as tests/test_native.py does."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engramdb import _accel
from engramdb.index import bm25

NATIVE = _accel.load({})
if NATIVE is None and os.environ.get("ENGRAMDB_REQUIRE_NATIVE") == "1":
    raise RuntimeError("ENGRAMDB_REQUIRE_NATIVE=1 but engramdb._native is not built")
needs_native = pytest.mark.skipif(NATIVE is None, reason="engramdb._native is not built")

_FLOAT = st.floats(1e-6, 1e6, allow_nan=False, allow_infinity=False)
_GROUP = st.tuples(st.integers(0, 40), st.integers(0, 2 ** 32 - 1), _FLOAT,
                   st.one_of(st.just(1.0), st.just(2.0), _FLOAT))


def _groups(spec: list[tuple[int, int, float, float]]) -> list[tuple[np.ndarray, np.ndarray, float, float]]:
    out = []
    for n, seed, idf, w in spec:
        rng = np.random.default_rng(seed)
        tf = rng.integers(1, 50, n).astype(np.float64)
        dl = rng.integers(1, 5000, n).astype(np.float64)
        if seed % 3 == 0:  # wide values too (lengths of long documents, huge tfs)
            tf *= rng.integers(1, 10 ** 6, n)
            dl *= rng.integers(1, 10 ** 6, n)
        out.append((tf, dl, idf, w))
    return out


def _paths(groups: list[tuple[np.ndarray, np.ndarray, float, float]], avgdl: float
           ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    saved = _accel.NATIVE
    try:
        _accel.NATIVE = NATIVE
        native = bm25._parts(groups, avgdl)
        _accel.NATIVE = None
        pure = bm25._parts(groups, avgdl)
    finally:
        _accel.NATIVE = saved
    return native, pure


@needs_native
@settings(max_examples=300, deadline=None)
@given(spec=st.lists(_GROUP, min_size=1, max_size=8), avgdl=st.floats(0.5, 1e5, allow_nan=False))
def test_pair_values_equal_numpys_parts_bit_for_bit(spec, avgdl) -> None:
    groups = _groups(spec)
    native, pure = _paths(groups, avgdl)
    assert len(native) == len(pure) == len(groups)
    for got, expect, (tf, dl, idf, w) in zip(native, pure, groups):
        assert got.dtype == expect.dtype == np.float64
        assert got.tobytes() == expect.tobytes()
        assert got.tobytes() == bm25._part(tf, dl, idf, avgdl, w).tobytes()  # each group alone: the same


@needs_native
def test_pair_values_refuses_bad_input() -> None:
    one = np.ones(2)
    bad = [
        ((np.empty(2), [(one, one[:1], 1.0, 1.0)]), ValueError, "one length"),
        ((np.empty(1), [(one, one, 1.0, 1.0)]), ValueError, "fitting in out"),
        ((np.empty(3), [(one, one, 1.0, 1.0)]), ValueError, "longer than the groups"),
        # the shared checks name the function called (they once all said "accumulate:")
        ((np.empty(2), [(one.astype(np.float32), one, 1.0, 1.0)]), TypeError, "^pair_values: tf has an unsupported dtype"),
        ((np.empty((1, 2)), [(one, one, 1.0, 1.0)]), TypeError, "^pair_values: out must be a 1-d array"),
        ((np.empty(2), [(one, one.astype(np.float16), 1.0, 1.0)]), TypeError, "^pair_values: dl has an unsupported dtype"),
        ((np.empty(2), [(one, [1.0, 2.0], 1.0, 1.0)]), TypeError, "^pair_values: dl must be a C-contiguous array"),
        ((bytes(16), [(one, one, 1.0, 1.0)]), TypeError, "^pair_values: out must be a C-contiguous writable array"),
        ((np.empty(2), [(one, one, "x", 1.0)]), TypeError, "must be real number"),
        ((np.empty(2), [(one, one, 1.0)]), TypeError, "a group is"),
        ((np.empty(2), 7), TypeError, "sequence"),
        ((np.empty(4)[::2], [(one, one, 1.0, 1.0)]), TypeError, "writable"),
        ((np.empty(2, np.int64), [(one, one, 1.0, 1.0)]), TypeError, "float64"),
        ((np.empty(2), [(np.ones(4)[::2], one, 1.0, 1.0)]), TypeError, "tf must be"),
    ]
    for (out, groups), error, message in bad:
        with pytest.raises(error, match=message):
            NATIVE.pair_values(out, groups, 10.0, bm25.K1, bm25.B)


@settings(max_examples=300, deadline=None)
@given(n_docs=st.integers(1, 10**8), data=st.data())
def test_idfs_of_a_query_are_the_scalar_idfs(n_docs: int, data: st.DataObject) -> None:
    """The idfs of a query's terms in one numpy call (_Term.of after a commit) are the same
    bits as each term's own (_idf, which idf_mass and ceiling use), wherever a term sits in
    the batch: scores and ceilings must not depend on the path."""
    dfs = data.draw(st.lists(st.integers(0, n_docs), min_size=0, max_size=12))
    bm25._idf.cache_clear()
    want = [bm25._idf(n_docs, df) for df in dfs]
    got = bm25._idfs(n_docs, dfs)
    assert [np.float64(v).tobytes() for v in got] == [np.float64(v).tobytes() for v in want]
    assert all(isinstance(v, float) for v in got)
