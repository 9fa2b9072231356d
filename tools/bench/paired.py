"""Paired bootstrap over queries: is system A better or worse than system B, within noise?

``paired_bootstrap(a, b)`` resamples the queries (with replacement, seeded) and returns
the mean per-query difference ``a - b`` and its 95 % percentile interval. Both systems are
scored on the same queries, so the per-query differences carry the comparison and the
queries' own difficulty cancels. An interval that contains 0 is "within noise".
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

RESAMPLES = 10_000
SEED = 13


@dataclass(frozen=True)
class Paired:
    """The mean per-query difference and its 95 % bootstrap interval."""

    mean: float
    low: float
    high: float
    better: int  # queries where a > b
    worse: int  # queries where a < b

    def __str__(self) -> str:
        return f"{self.mean:+.3f} [{self.low:+.3f}, {self.high:+.3f}] ({self.better} better, {self.worse} worse)"


def paired_bootstrap(a: Sequence[float], b: Sequence[float], resamples: int = RESAMPLES,
                     seed: int = SEED) -> Paired:
    """Mean of ``a - b`` over the queries and its 95 % percentile interval (module doc)."""
    diff = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if diff.size == 0:
        raise ValueError("no queries to compare")
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, diff.size, size=(resamples, diff.size))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return Paired(float(diff.mean()), float(low), float(high), int((diff > 0).sum()), int((diff < 0).sum()))


def best_single(*systems: Sequence[float]) -> Sequence[float]:
    """The system with the highest mean (the first of equals): "the best single signal"."""
    return max(systems, key=lambda s: float(np.mean(s)))
