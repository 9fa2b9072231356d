"""tools/bench/paired.py: the seeded paired bootstrap the recall benchmarks report "within noise" with."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

PATH = Path(__file__).resolve().parent.parent / "tools" / "bench" / "paired.py"


def _paired():
    spec = importlib.util.spec_from_file_location("bench_paired", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_paired", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_equal_systems_differ_by_nothing():
    paired = _paired()
    a = [0.1, 0.5, 0.9, 0.3]
    out = paired.paired_bootstrap(a, a)
    assert (out.mean, out.low, out.high, out.better, out.worse) == (0.0, 0.0, 0.0, 0, 0)


def test_interval_is_seeded_and_brackets_the_mean():
    paired = _paired()
    rng = np.random.default_rng(5)
    a, b = rng.random(200), rng.random(200)
    first, again = paired.paired_bootstrap(a, b), paired.paired_bootstrap(a, b)
    assert first == again  # the same seed, the same interval
    assert first.low < first.mean < first.high
    assert first.mean == pytest.approx(float((a - b).mean()))
    assert first.better + first.worse == 200
    # the query-level pairing: a constant shift is certain, whatever the queries' spread
    shifted = paired.paired_bootstrap(b + 0.01, b)
    assert shifted.low == pytest.approx(0.01) and shifted.high == pytest.approx(0.01)
    assert str(shifted) == "+0.010 [+0.010, +0.010] (200 better, 0 worse)"


def test_a_real_loss_is_outside_noise_and_pure_noise_is_inside():
    paired = _paired()
    rng = np.random.default_rng(6)
    base = rng.random(760)
    worse = paired.paired_bootstrap(base - 0.05 + rng.normal(0, 0.05, 760), base)
    assert worse.high < 0
    noise = paired.paired_bootstrap(base + rng.normal(0, 0.05, 760) - 0.0001, base)
    assert noise.low < 0 < noise.high


def test_best_single_is_the_higher_mean_first_of_equals():
    paired = _paired()
    a, b = [0.2, 0.4], [0.3, 0.3]
    assert paired.best_single(a, b) is a
    assert paired.best_single([0.1], [0.5]) == [0.5]
    with pytest.raises(ValueError):
        paired.paired_bootstrap([], [])
