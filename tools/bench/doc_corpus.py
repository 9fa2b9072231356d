"""A document-corpus retrieval benchmark with graded relevance: nDCG@10 of recall.

    python tools/bench/doc_corpus.py --spaces hashed,minilm

The corpus is *On the Origin of Species* (Project Gutenberg #1228, public domain in the
USA), read at run time from ../shared/data/gutenberg (the shared data is never copied into
the repository) and cut into passages: the paragraphs between the Gutenberg START and END
lines, consecutive paragraphs joined until a passage has at least ``MIN_WORDS`` words.
Passage ``n`` is the n-th such passage; the book's SHA-256 is checked so the ids mean the
same text.

The queries and their graded labels (tools/bench/data/origin_qrels.json) were written for
this project: 2 = the passage answers the question, 1 = it bears on it (same subject, part
of the answer), every unlabelled passage 0. Labels were judged by reading the pooled top 5
passages of BM25, the hashed space and all-MiniLM-L6-v2 (model alone and fused) per query
(``--pool 5`` prints that pool).

Systems: ``bm25`` (no space), and per ``--spaces`` entry ``<space>-model`` (the space alone,
locomo_adapter.MODEL_ONLY) and ``<space>-fused`` (recall's default fusion). Each memory is
one passage; recall runs with its defaults (hops have no edges to spread over here).
For each space, fused is compared with the better of its parts (higher mean nDCG@10) by a
seeded paired bootstrap over the queries (tools/bench/paired.py): the mean per-query
difference and its 95 % interval.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import engramdb  # noqa: E402
from embed_cache import add_space, embedder_for  # noqa: E402
from locomo_adapter import MODEL_ONLY  # noqa: E402
from paired import best_single, paired_bootstrap  # noqa: E402

BOOK = os.path.join(ROOT, "..", "shared", "data", "gutenberg", "origin_of_species_pg1228.txt")
QRELS = os.path.join(HERE, "data", "origin_qrels.json")
MIN_WORDS = 120
K = 10


def load_qrels(path: str = QRELS, book: str = BOOK) -> dict:
    """The queries and labels, after checking that ``book`` is the labelled edition (SHA-256)."""
    with open(path, encoding="utf-8") as f:
        spec = json.load(f)
    with open(book, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != spec["book_sha256"]:
        raise SystemExit(f"{book}: SHA-256 {digest} is not the labelled edition's {spec['book_sha256']}")
    return spec


def passages(path: str = BOOK) -> list[str]:
    """The book's passages (module doc), whitespace inside a passage collapsed to single spaces."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start = text.index("\n", text.index("*** START OF")) + 1
    end = text.index("*** END OF")
    out: list[str] = []
    current: list[str] = []
    for para in re.split(r"\n\s*\n", text[start:end]):
        words = para.split()
        if not words:
            continue
        current += words
        if len(current) >= MIN_WORDS:
            out.append(" ".join(current))
            current = []
    if current:
        out.append(" ".join(current))
    return out


def ndcg(ranked: list[int], grades: dict[int, int], k: int = K) -> float:
    """nDCG@k with gains ``2 ** grade - 1`` and discount ``log2(rank + 1)``."""
    dcg = sum((2 ** grades.get(d, 0) - 1) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
    ideal = sorted(grades.values(), reverse=True)[:k]
    idcg = sum((2 ** g - 1) / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def build(texts: list[str], tmp: str, space: str = "") -> engramdb.Engram:
    db = engramdb.open(os.path.join(tmp, f"corpus-{space or 'bm25'}.engram"), key=os.urandom(32))
    extra = add_space(db, embedder_for(space), texts) if space else [{} for _ in texts]
    db.add_many([{**extra[i], "id": f"p{i}", "content": t, "created_at": 1.0, "last_accessed": 1.0}
                 for i, t in enumerate(texts)])
    return db


def run(db: engramdb.Engram, queries: list[dict], fusion: engramdb.FusionWeights | None) -> list[list[int]]:
    return [[int(h.id[1:]) for h in db.recall(q["query"], top_k=K, fusion=fusion)] for q in queries]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spaces", default="hashed")
    ap.add_argument("--pool", type=int, default=0, metavar="DEPTH",
                    help="print each query's pooled top DEPTH passages of every system (for labelling)")
    ap.add_argument("--json", help="write per-query figures here")
    args = ap.parse_args()
    spec = load_qrels()
    texts = passages()
    queries = spec["queries"]
    runs: dict[str, list[list[int]]] = {}
    with tempfile.TemporaryDirectory(prefix="engram-docs-") as tmp:
        runs["bm25"] = run(build(texts, tmp), queries, None)
        for space in [s for s in args.spaces.split(",") if s]:
            emb = embedder_for(space).embedder
            if emb is not None:
                emb([q["query"] for q in queries])
            db = build(texts, tmp, space)
            runs[f"{space}-model"] = run(db, queries, MODEL_ONLY)
            runs[f"{space}-fused"] = run(db, queries, None)
    if args.pool:
        for qi, q in enumerate(queries):
            pool = sorted({d for r in runs.values() for d in r[qi][:args.pool]})
            print(f"\n=== Q{qi} {q['query']}  labelled: {q['grades']}")
            for d in pool:
                print(f"--- p{d}: {texts[d]}")
        return
    print(f"{len(texts)} passages, {len(queries)} queries, load {os.getloadavg()[0]:.1f}")
    out = {}
    for name, ranked in runs.items():
        per_query = [ndcg(r, {int(p): g for p, g in q["grades"].items()}) for r, q in zip(ranked, queries)]
        out[name] = {"ndcg@10": round(sum(per_query) / len(per_query), 4), "per_query": [round(x, 4) for x in per_query]}
        print(f"| {name} | {out[name]['ndcg@10']:.3f} |")
    for space in [s for s in args.spaces.split(",") if s]:
        parts = {"bm25": out["bm25"]["per_query"], "model": out[f"{space}-model"]["per_query"]}
        best = best_single(*parts.values())
        name = next(n for n, v in parts.items() if v is best)
        diff = paired_bootstrap(out[f"{space}-fused"]["per_query"], best)
        out[f"{space}-fused"]["vs_best_single"] = {"best": name, "mean": round(diff.mean, 4),
                                                   "ci95": [round(diff.low, 4), round(diff.high, 4)]}
        print(f"{space}-fused - {name} (the better part), paired bootstrap over queries: {diff}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
