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


@pytest.mark.parametrize("strict", [True, False])
def test_equal_copies_are_decided_together_at_the_threshold_whatever_the_block(monkeypatch, strict):
    """A float32 product (BLAS) moves by an ulp with the block's shape: with 50 copies of one
    vector, some score an ulp apart from the others, and a one-row block otherwise than a
    whole matrix. A threshold equal to their score must still
    take all copies or none, whichever block they sit in: products near a threshold are
    decided on the exact cosine (SIM_BAND; with it 0 this test splits the copies here)."""
    from engramdb.index.vectors import row_dots

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 8)).astype(np.float32)
    for n in (1, 7, 50, 300):
        for block_rows in (64, 2048):
            monkeypatch.setattr(run, "BLOCK_ROWS", block_rows)
            space = run._Space(np.arange(n + 1, dtype=np.uint64), np.vstack([a[None], np.tile(b, (n, 1))]))
            threshold = float(row_dots(space.unit[1:], space.unit[0])[0])  # recall's score of the pair
            cols = np.ones(n + 1, bool)
            got = _pairs(run._block_pairs(space, np.array([0]), cols, threshold, strict, triangle=False))
            assert got in ([], [(0, c) for c in range(1, n + 1)]), (n, block_rows)
            both = _pairs(run._block_pairs(space, np.arange(n + 1), cols, threshold, strict, triangle=True))
            assert [p for p in both if p[0] == 0] == got, (n, block_rows)
