"""The after-commit catch-up's C calls against the Python path (spec/bm25.md, "Caches"):

* ``term_values``: a query's idfs and term parts in one call (``_Term.of`` after a commit)
  have the bits of ``_idf`` and ``_part`` of each part alone, whatever the mix of terms
  with a base, a delta or both, weights and lengths.

Skip without the extension unless ENGRAMDB_REQUIRE_NATIVE=1, as tests/test_native.py does."""
from __future__ import annotations

import os
from typing import Any

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
