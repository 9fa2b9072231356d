"""A/B of ``_check_matrix`` (a normalised space) in ONE process, CPU time, alternating:
``new`` is this tree's ``unit_rows``; ``old`` the one of 0e8fe3a (boolean passes for the
float64 branch on every call); ``7c370ba`` the normalisation before it (no float64 branch).
``_check_matrix`` runs twice per space per recall (query vector and scores).

Run (from the repository root): ``PYTHONPATH=. python tools/bench/ab_unit_rows.py``
Prints the per-call CPU time (min and median over the rounds) for a 1x384 query and a
1000x384 matrix. Never runs inside pytest.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
import timeit
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from engramdb.index import vectors as V


def old_unit_rows(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with np.errstate(over="ignore", under="ignore"):
        norms = np.linalg.norm(arr, axis=1, keepdims=True)
    odd = np.flatnonzero(~(norms[:, 0] >= 1e-15) | ~np.isfinite(norms[:, 0]))
    if not odd.size:
        return (arr / norms).astype(np.float32), np.zeros(arr.shape[0], dtype=bool)
    raise AssertionError("only in-range matrices are benchmarked")


def c7_unit_rows(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    return (arr / norms).astype(np.float32), norms[:, 0] == 0


def main() -> None:
    fns: dict[str, Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]] = {
        "old": old_unit_rows, "new": V.unit_rows, "7c370ba": c7_unit_rows}
    new = V.unit_rows
    sp = V.EmbeddingSpace(name="s", model="m", dims=384, normalize=True, auto=False)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 384)).astype(np.float32)
    b = rng.standard_normal((1000, 384)).astype(np.float32)
    try:
        for name, arr, n in (("1x384", q, 20000), ("1000x384", b, 200)):
            res: dict[str, list[float]] = {label: [] for label in fns}
            for r in range(16):
                order = list(fns) if r % 2 == 0 else list(reversed(fns))
                for label in order:
                    V.unit_rows = fns[label]  # _check_matrix looks the name up at each call
                    t = timeit.timeit(lambda a=arr: V._check_matrix(sp, a), number=n, timer=time.process_time) / n
                    res[label].append(t * 1e6)
            print(name + ": " + " | ".join(f"{label} min {min(v):.2f} med {statistics.median(v):.2f} us"
                                           for label, v in res.items()))
    finally:
        V.unit_rows = new


if __name__ == "__main__":
    main()
