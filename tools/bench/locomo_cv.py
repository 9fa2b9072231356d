"""Leave-one-conversation-out cross-validation of recall's free parameters on the LoCoMo dev half.

Run (from the repository root):

    python tools/bench/locomo_cv.py                      # the default grid (module doc below)
    python tools/bench/locomo_cv.py --grid speaker=0,0.25,0.5 --grid source=0,0.5,1 --json cv.json

The held-out half of LoCoMo is not available here, so this is its proxy: every free
parameter in the grid is chosen on 4 of the 5 dev conversations and scored on the 5th; the
five held-out scores, pooled over their questions (the harness's macro-average over
questions), are the CV figures. They are printed next to the in-sample figures (the
current defaults scored on all 5, and the grid point that is best on all 5), overall and
per category.

The grid is a Cartesian product over named parameters (``--grid name=v1,v2,...``,
repeatable); each name is a module setting (:data:`PARAMS`). Every point is scored once per
conversation (one store per conversation, built by tools/bench/locomo_adapter.py, reused
across points: the settings are read at query time), so a grid of ``n`` points costs about
``n`` dev runs. A fold picks the point with the best training objective (``--objective``:
``sum`` = R@10 + R@1, default; ``r10``; ``r1``), ties going to the point listed first (the
grid lists each parameter's values in the order given, the default first when it is
listed; deterministic).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import engramdb.recall as recall_mod  # noqa: E402
import engramdb.recall_features as features_mod  # noqa: E402

# name -> (module, attribute): the settings a grid may vary
PARAMS: dict[str, tuple[Any, str]] = {
    "speaker": (features_mod, "SPEAKER_WEIGHT"),
    "source": (features_mod, "SOURCE_WEIGHT"),
    "time": (features_mod, "TIME_WEIGHT"),
    "hop": (recall_mod, "HOP_WEIGHT"),
}
DEFAULT_GRID: dict[str, list[float]] = {
    "speaker": [0.25, 0.0, 0.1, 0.5, 1.0],
    "source": [0.5, 0.0, 0.25, 1.0],
    "time": [0.25, 0.0, 0.1, 0.5],
}
CATEGORIES = (1, 2, 3, 4)
CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
KS = (1, 10)


@dataclass(frozen=True)
class Score:
    """One question's result at one grid point."""

    conv: str
    category: int
    r1: float
    r10: float


Point = tuple[tuple[str, float], ...]  # ((name, value), ...) in grid order


def grid_points(grid: Mapping[str, Sequence[float]]) -> list[Point]:
    """Every point of the Cartesian product, in the order the values are listed."""
    names = list(grid)
    return [tuple(zip(names, values)) for values in itertools.product(*(grid[n] for n in names))]


@contextmanager
def settings(point: Point) -> Iterator[None]:
    """The module settings of ``point`` while the block runs (restored after)."""
    saved = [(PARAMS[name], getattr(*PARAMS[name])) for name, _ in point]
    try:
        for name, value in point:
            module, attr = PARAMS[name]
            setattr(module, attr, value)
        yield
    finally:
        for (module, attr), value in saved:
            setattr(module, attr, value)


def mean(scores: Sequence[Score], metric: str) -> float:
    return sum(getattr(s, metric) for s in scores) / len(scores) if scores else 0.0


def objective(scores: Sequence[Score], kind: str) -> float:
    if kind == "r10":
        return mean(scores, "r10")
    if kind == "r1":
        return mean(scores, "r1")
    return mean(scores, "r10") + mean(scores, "r1")


def cross_validate(results: Mapping[Point, Sequence[Score]], kind: str = "sum") -> tuple[list[Score], dict[str, Point]]:
    """Leave one conversation out: for each conversation, the point with the best
    ``objective`` on the others (the first listed on ties), scored on it. Returns the
    held-out scores of every fold (pooled) and the point each fold chose."""
    points = list(results)
    convs = sorted({s.conv for scores in results.values() for s in scores})
    held: list[Score] = []
    chosen: dict[str, Point] = {}
    for conv in convs:
        best, best_value = points[0], float("-inf")
        for point in points:
            value = objective([s for s in results[point] if s.conv != conv], kind)
            if value > best_value:  # strictly: ties keep the earlier point
                best, best_value = point, value
        chosen[conv] = best
        held += [s for s in results[best] if s.conv == conv]
    return held, chosen


def best_in_sample(results: Mapping[Point, Sequence[Score]], kind: str = "sum") -> Point:
    points = list(results)
    values = [objective(results[p], kind) for p in points]
    return points[values.index(max(values))]


def summary(scores: Sequence[Score]) -> dict[str, tuple[float, float, int]]:
    """Per category name and ``overall``: (R@1, R@10, questions)."""
    out = {}
    for cat in CATEGORIES:
        sub = [s for s in scores if s.category == cat]
        out[CATEGORY_NAMES[cat]] = (mean(sub, "r1"), mean(sub, "r10"), len(sub))
    out["overall"] = (mean(scores, "r1"), mean(scores, "r10"), len(scores))
    return out


def evaluate_grid(grid: Mapping[str, Sequence[float]], *, data: str | None = None,
                  build: Callable[[list[dict]], Callable[[str, int], list[str]]] | None = None,
                  progress: bool = True) -> dict[Point, list[Score]]:
    """Every grid point scored on every question of the dev file (categories 1-4)."""
    from locomo_adapter import load_harness, make_retriever

    harness = load_harness()
    convs = harness.load_conversations(data or harness.DEFAULT_DATA)
    build = build or make_retriever
    searches = []
    for conv in convs:  # one store per conversation, reused by every point
        valid = {t["dia_id"] for t in conv["turns"]}
        questions = []
        for qa in conv["qa"]:
            cat = int(qa["category"])
            gold, _ = harness.normalize_evidence(qa.get("evidence", []), valid)
            if cat in CATEGORIES and gold:
                questions.append((qa["question"], cat, set(gold)))
        searches.append((conv["sample_id"], build(conv["turns"]), questions))
    results: dict[Point, list[Score]] = {}
    points = grid_points(grid)
    for i, point in enumerate(points):
        scores = []
        with settings(point):
            for conv_id, search, questions in searches:
                for question, cat, gold in questions:
                    ranked = harness.flatten(search(question, max(KS)), max(KS), "turns")
                    scores.append(Score(conv_id, cat, len(gold & set(ranked[:1])) / len(gold),
                                        len(gold & set(ranked[:10])) / len(gold)))
        results[point] = scores
        if progress:
            print(f"[{i + 1}/{len(points)}] {_label(point)}: R@1 {mean(scores, 'r1'):.3f} "
                  f"R@10 {mean(scores, 'r10'):.3f}", file=sys.stderr)
    return results


def _label(point: Point) -> str:
    return " ".join(f"{n}={v:g}" for n, v in point) or "(defaults)"


def current_point(names: Sequence[str]) -> Point:
    return tuple((n, float(getattr(*PARAMS[n]))) for n in names)


def report(results: Mapping[Point, Sequence[Score]], kind: str = "sum") -> dict[str, Any]:
    """The CV figures next to the in-sample ones (the defaults and the best point on all 5)."""
    names = [n for n, _ in next(iter(results))]
    default = current_point(names)
    held, chosen = cross_validate(results, kind)
    best = best_in_sample(results, kind)
    rows = {"cv (leave one conversation out)": summary(held),
            f"in-sample, best on all 5 ({_label(best)})": summary(results[best])}
    if default in results:
        rows[f"in-sample, defaults ({_label(default)})"] = summary(results[default])
    return {"rows": rows, "chosen": {c: _label(p) for c, p in chosen.items()}, "objective": kind,
            "points": len(results)}


def markdown(rep: Mapping[str, Any]) -> str:
    cats = [CATEGORY_NAMES[c] for c in CATEGORIES]
    lines = ["| figures | " + " | ".join(cats) + " | **overall R@1** | **overall R@10** |",
             "|---|" + "---:|" * (len(cats) + 2)]
    for name, row in rep["rows"].items():
        cells = [f"{row[c][0]:.3f} / {row[c][1]:.3f}" for c in cats]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {row['overall'][0]:.3f} | {row['overall'][1]:.3f} |")
    lines.append("")
    lines.append(f"Per category R@1 / R@10; objective {rep['objective']}, {rep['points']} grid points. "
                 "Chosen per held-out conversation: "
                 + "; ".join(f"{c}: {p}" for c, p in rep["chosen"].items()))
    return "\n".join(lines)


def parse_grid(specs: Sequence[str]) -> dict[str, list[float]]:
    grid: dict[str, list[float]] = {}
    for spec in specs:
        name, _, values = spec.partition("=")
        if name not in PARAMS or not values:
            raise SystemExit(f"--grid takes name=v1,v2,... with a name from {sorted(PARAMS)}, not {spec!r}")
        grid[name] = [float(v) for v in values.split(",")]
    return grid


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", action="append", default=[], help="name=v1,v2,... (repeatable); names: "
                    + ", ".join(sorted(PARAMS)))
    ap.add_argument("--objective", default="sum", choices=["sum", "r10", "r1"])
    ap.add_argument("--data", default=None, help="the dev file (default: the harness's)")
    ap.add_argument("--json", help="write the report (and every point's figures per category) here")
    args = ap.parse_args(argv)
    grid = parse_grid(args.grid) if args.grid else DEFAULT_GRID
    results = evaluate_grid(grid, data=args.data)
    rep = report(results, args.objective)
    print(markdown(rep))
    if args.json:
        rep["grid"] = {_label(p): summary(s) for p, s in results.items()}
        with open(args.json, "w") as f:
            json.dump(rep, f, indent=1)


if __name__ == "__main__":
    main()
