"""A query's idfs through the C extension's ``idf_values``, which calls numpy's own float64
log1p loop (numpy.ufunc._resolve_dtypes_and_context / _get_strided_loop) instead of the
ufunc: the same bits as ``_idf`` (numpy's ufunc on a scalar: what idf_mass and ceiling use)
and as the pure path, for one term and for many; a loop that would give other bits is not
used. Skip without the extension unless ENGRAMDB_REQUIRE_NATIVE=1, as tests/test_native.py
does."""
from __future__ import annotations

import math
import os
from types import SimpleNamespace
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


def _bits(values: list[float]) -> list[bytes]:
    return [np.float64(v).tobytes() for v in values]


@pytest.fixture()
def loop() -> Any:
    assert NATIVE is not None
    bm25._LOG1P_LOOP.clear()
    got = bm25._log1p_loop(NATIVE)
    assert got is not None  # numpy >= 1.24 (pyproject) has the API, and its loop gives _idf's bits
    return got


@needs_native
@settings(max_examples=300, deadline=None)
@given(n_docs=st.integers(1, 10**9), data=st.data())
def test_idf_values_are_the_scalar_idfs(n_docs: int, data: st.DataObject) -> None:
    """Each idf, alone or among others, has the bits of numpy's ufunc on the scalar."""
    assert NATIVE is not None
    bm25._LOG1P_LOOP.clear()
    loop = bm25._log1p_loop(NATIVE)
    dfs = data.draw(st.lists(st.integers(0, n_docs), min_size=0, max_size=20))
    bm25._idf.cache_clear()
    want = [bm25._idf(n_docs, df) for df in dfs]
    got = NATIVE.idf_values(loop, n_docs, dfs)
    assert _bits(got) == _bits(want)
    assert all(type(v) is float for v in got)


@needs_native
def test_idfs_on_both_paths_and_where_libm_differs(loop: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The C path, the pure path and _idf agree, on inputs where C's (libm's) log1p gives other
    bits than numpy's on machines whose numpy has its own log1p (so the C path cannot have
    used libm's)."""
    rng = np.random.default_rng(5)
    n_docs = 10**6
    dfs = rng.integers(0, n_docs, size=400).tolist()
    want = [bm25._idf(n_docs, df) for df in dfs]
    monkeypatch.setattr(_accel, "NATIVE", NATIVE)
    native = bm25._idfs(n_docs, dfs)
    monkeypatch.setattr(_accel, "NATIVE", None)
    pure = bm25._idfs(n_docs, dfs)
    assert _bits(native) == _bits(pure) == _bits(want)
    libm = [math.log1p((n_docs - float(df) + 0.5) / (float(df) + 0.5)) for df in dfs]
    if _bits(libm) != _bits(want):  # numpy's own log1p here: the C path did not take libm's
        assert _bits(native) != _bits(libm)


@needs_native
def test_a_loop_giving_other_bits_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """The once-per-process check: a loop (or a numpy) whose idfs differ from _idf's is not
    used, and _idfs then calls numpy's ufunc (the same bits as _idf)."""
    assert NATIVE is not None
    off = SimpleNamespace(idf_values=lambda loop, n, dfs: [math.nextafter(v, 0.0)
                                                           for v in NATIVE.idf_values(loop, n, dfs)])
    bm25._LOG1P_LOOP.clear()
    assert bm25._log1p_loop(off) is None  # type: ignore[arg-type]
    assert bm25._LOG1P_LOOP == [None]
    monkeypatch.setattr(_accel, "NATIVE", off)
    assert _bits(bm25._idfs(1000, [1, 5, 999])) == _bits([bm25._idf(1000, df) for df in (1, 5, 999)])
    bm25._LOG1P_LOOP.clear()


@needs_native
def test_idf_values_refuses_bad_arguments(loop: Any) -> None:
    assert NATIVE is not None
    with pytest.raises(ValueError, match="PyCapsule"):
        NATIVE.idf_values(object(), 10, [1])
    f8 = np.dtype(np.float64)
    unfilled = np.log1p._resolve_dtypes_and_context((f8, None))[1]  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="no GIL-free strided loop"):
        NATIVE.idf_values(unfilled, 10, [1])
    with pytest.raises(TypeError, match="dfs must be a sequence"):
        NATIVE.idf_values(loop, 10, 5)
    with pytest.raises(TypeError):
        NATIVE.idf_values(loop, 10, ["x"])
    assert NATIVE.idf_values(loop, 10, []) == []
