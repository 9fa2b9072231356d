"""The synthetic paraphrase checks of tests/test_recall_fusion.py over fusion_grid.py's points.

    python tools/bench/fusion_paraphrase.py [--points 15,67]

For every grid point (tools/bench/fusion_grid.py), recall on the paraphrased queries of
tests/test_recall_fusion.py (300 memories, 100 queries whose words are mostly replaced by
synonyms) with the random space, the built-in hashed space, the strong concept model and
the same concept model crowded into 32 dimensions (``noisy``), as counts of R@1 / R@10 out
of 100, and whether each meets the test's check (fused >= the better of BM25 alone and the
space alone, minus 2 queries). The points that pass all four are the admissible ones of
the rule in spec/recall.md section 5.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, HERE)
os.environ.setdefault("ENGRAM_TEST_WEAK_KDF", "1")

import test_recall_fusion as t  # noqa: E402
from fusion_grid import grid_points  # noqa: E402
import engramdb.engram as engram_mod  # noqa: E402
from engramdb import FusionWeights  # noqa: E402
from engramdb.crypto import KDFParams  # noqa: E402

CHECKED = ("random", "hashed", "strong", "noisy")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", default="", help="only these grid indexes (comma-separated)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="engram-paraphrase-")

    def make(name: str) -> engram_mod.Engram:
        return engram_mod.open(os.path.join(work, name), passphrase="pw", kdf=KDFParams.for_tests())

    docs, _ = t.corpus()
    queries = t.paraphrased_queries()
    alone = make("bm25.engram")
    alone.add_many([{"id": f"d{i}", "content": x, "created_at": 1.0, "last_accessed": 1.0} for i, x in enumerate(docs)])
    stores = {space: t._space_store(make, space) for space in CHECKED}
    bm25 = t.hit_counts(alone, queries)
    singles = {space: t.hit_counts(db, queries, FusionWeights(**t.MODEL_ONLY)) for space, db in stores.items()}
    print("bm25", bm25, "alone", singles, flush=True)
    points = grid_points()
    chosen = [int(i) for i in args.points.split(",") if i] or list(range(len(points)))
    for i in chosen:
        fused = {space: t.hit_counts(db, queries, points[i]) for space, db in stores.items()}
        ok = all(fused[s][m] >= max(bm25[m], singles[s][m]) - t.MARGIN_QUERIES for s in CHECKED for m in (0, 1))
        w = points[i]
        print(i, f"vector={w.vector} standout_floor={w.standout_floor} lift_floor={w.lift_floor} "
                 f"lexical_yield={w.lexical_yield} score_mix={w.score_mix}", fused,
              "admissible" if ok else "-", flush=True)


if __name__ == "__main__":
    main()
