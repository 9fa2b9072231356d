"""tools/bench/locomo_cv.py: leave-one-conversation-out selection never sees the held-out
conversation, breaks ties by grid order, and restores the settings it changes."""
from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "bench"))

import locomo_cv as cv  # noqa: E402

import engramdb.recall_features as features_mod  # noqa: E402

A: cv.Point = (("speaker", 0.0),)
B: cv.Point = (("speaker", 1.0),)


def _scores(values: dict[str, float], category: int = 4) -> list[cv.Score]:
    return [cv.Score(conv, category, v, v) for conv, v in sorted(values.items())]


def test_each_fold_chooses_on_the_other_conversations_only():
    # B wins on c1..c3 by a little, loses c4 by a lot: the point chosen for c4 must be B
    # (chosen without c4), although A is better on all four together.
    results = {A: _scores({"c1": 0.5, "c2": 0.5, "c3": 0.5, "c4": 1.0}),
               B: _scores({"c1": 0.6, "c2": 0.6, "c3": 0.6, "c4": 0.0})}
    held, chosen = cv.cross_validate(results)
    assert chosen["c4"] == B
    assert cv.best_in_sample(results) == A
    # for c1 the others are c2, c3, c4: A (2.0) beats B (1.2)
    assert chosen["c1"] == A
    by_conv = {s.conv: s.r10 for s in held}
    assert by_conv == {"c1": 0.5, "c2": 0.5, "c3": 0.5, "c4": 0.0}
    assert cv.summary(held)["overall"] == pytest.approx((0.375, 0.375, 4))


def test_ties_go_to_the_point_listed_first():
    same = _scores({"c1": 0.5, "c2": 0.5})
    _held, chosen = cv.cross_validate({B: same, A: same})
    assert set(chosen.values()) == {B}
    _held, chosen = cv.cross_validate({A: same, B: same})
    assert set(chosen.values()) == {A}


def test_objective_and_categories():
    scores = [cv.Score("c", 1, 0.0, 1.0), cv.Score("c", 4, 1.0, 1.0)]
    assert cv.objective(scores, "r10") == 1.0
    assert cv.objective(scores, "r1") == 0.5
    assert cv.objective(scores, "sum") == 1.5
    rows = cv.summary(scores)
    assert rows["multi-hop"] == (0.0, 1.0, 1)
    assert rows["single-hop"] == (1.0, 1.0, 1)
    assert rows["temporal"] == (0.0, 0.0, 0)


def test_grid_points_and_settings_are_restored():
    points = cv.grid_points({"speaker": [0.25, 0.0], "time": [0.5]})
    assert points == [(("speaker", 0.25), ("time", 0.5)), (("speaker", 0.0), ("time", 0.5))]
    before = features_mod.SPEAKER_WEIGHT
    with pytest.raises(RuntimeError), cv.settings((("speaker", before + 1.0),)):
        assert before + 1.0 == features_mod.SPEAKER_WEIGHT
        raise RuntimeError
    assert before == features_mod.SPEAKER_WEIGHT
    with pytest.raises(SystemExit):
        cv.parse_grid(["nosuch=1"])
    assert cv.parse_grid(["time=0,0.5"]) == {"time": [0.0, 0.5]}
