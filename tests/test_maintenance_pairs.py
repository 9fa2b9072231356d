"""The maintenance pass's similarity search: pivot pruning finds exactly the pairs that
every product finds (engramdb/maintenance/run.py, spec/maintenance.md "Exactness")."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engramdb.maintenance import run


def _space(n: int, dims: int, centres: int, seed: int) -> run._Space:
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((centres, dims)).astype(np.float32)
    spread = rng.choice([0.02, 0.3, 2.0], size=n).astype(np.float32)
    emb = c[rng.integers(0, centres, n)] + rng.standard_normal((n, dims)).astype(np.float32) * spread[:, None]
    emb[rng.integers(0, n, 3)] = 0  # zero vectors never match
    return run._Space(np.arange(n, dtype=np.uint64) * 3, emb)


def _pairs(result):
    return sorted(zip(result[0].tolist(), result[1].tolist()))


@pytest.mark.parametrize(("threshold", "strict"), [(0.92, True), (0.78, False), (0.5, False)])
def test_pivot_pruning_finds_the_same_pairs_as_every_product(threshold, strict):
    space = _space(5000, 24, 60, seed=1)
    n = len(space.docnos)
    everything = np.ones(n, bool)
    rows = np.arange(n)
    want = _pairs(run._block_pairs(space, rows, everything, threshold, strict, triangle=True))
    got = _pairs(run._pairs(space, rows, everything, threshold, strict, triangle=True))
    assert len(want) > 1000 and got == want
    some, cols = rows[::5], rows % 3 != 0
    want = _pairs(run._block_pairs(space, some, cols, threshold, strict, triangle=False))
    assert _pairs(run._pivot_pairs(space, some, cols, threshold, strict, triangle=False)) == want
    assert all(r < c for r, c in _pairs(run._pivot_pairs(space, rows, everything, threshold, strict, triangle=True)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 300), dims=st.integers(2, 12), centres=st.integers(1, 20), seed=st.integers(0, 10**6),
       threshold=st.sampled_from([0.3, 0.78, 0.92, 0.99]), strict=st.booleans(), triangle=st.booleans())
def test_pivot_pruning_is_exact_on_random_spaces(monkeypatch, n, dims, centres, seed, threshold, strict, triangle):
    monkeypatch.setattr(run, "ROWS_PER_PIVOT", 4)  # the same values for every example
    monkeypatch.setattr(run, "PIVOT_CHUNK", 3)
    space = _space(n, dims, centres, seed)
    rng = np.random.default_rng(seed + 1)
    cols = np.ones(n, bool) if triangle else rng.random(n) < 0.7
    rows = np.arange(n) if triangle else np.nonzero(rng.random(n) < 0.5)[0]
    want = _pairs(run._block_pairs(space, rows, cols, threshold, strict, triangle=triangle))
    assert _pairs(run._pivot_pairs(space, rows, cols, threshold, strict, triangle=triangle)) == want
