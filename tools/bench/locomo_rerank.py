"""Re-ranking experiments over recall's top 100 on the LoCoMo dev half, cross-validated.

Run (from the repository root):

    python tools/bench/locomo_rerank.py

The directions of issue 13 that were measured and not kept (spec/recall.md, section 7):
each re-ranks recall's top 100 (``explain=True``; the adapter's store, the defaults) for
every dev question, over a small grid of its own parameters, and is cross-validated as
tools/bench/locomo_cv.py does (chosen on 4 conversations, scored on the 5th):

* ``diversity`` -- the n-th memory of a session in the ranking is multiplied by ``d**n``
  (greedy, over the top 60);
* ``session-bm25`` -- each session indexed as one BM25 document (the harness's Lucene BM25,
  Snowball-stemmed), a memory's score multiplied by ``1 + w * s / s_max`` of its session;
* ``when-neighbour`` -- for a question about time, a turn within ``win`` turns of one of
  the top 30 (same session) that mentions no time gets ``alpha`` times that turn's score
  when it mentions a time itself.

Prints one markdown row per variant: before, the in-sample best, CV; R@1 / R@10 per category.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

import locomo_cv as cv  # noqa: E402
from locomo_adapter import build_store, load_harness  # noqa: E402

from engramdb.recall_features import asks_time, mentions_time  # noqa: E402

Question = dict[str, Any]
Ranker = Callable[[Question], list[str]]


def collect(harness: Any, top_k: int = 100) -> tuple[list[Question], dict[str, list[dict]]]:
    """Recall's top ``top_k`` (id, score, source) for every dev question of categories 1-4."""
    convs = harness.load_conversations(harness.DEFAULT_DATA)
    out: list[Question] = []
    for conv in convs:
        db = build_store(conv["turns"])
        valid = {t["dia_id"] for t in conv["turns"]}
        for qa in conv["qa"]:
            gold, _ = harness.normalize_evidence(qa.get("evidence", []), valid)
            if int(qa["category"]) in cv.CATEGORIES and gold:
                hits = db.recall(qa["question"], top_k=top_k)
                out.append({"conv": conv["sample_id"], "cat": int(qa["category"]), "q": qa["question"],
                            "gold": gold, "hits": [(h.id, h.score, h.node.source or "") for h in hits]})
        db.close()
    return out, {c["sample_id"]: c["turns"] for c in convs}


def as_is(q: Question) -> list[str]:
    return [h[0] for h in q["hits"]]


def diversity(d: float) -> Ranker:
    def rank(q: Question) -> list[str]:
        pool = list(q["hits"][:60])
        seen: dict[str, int] = {}
        chosen: list[str] = []
        while pool and len(chosen) < 10:
            best = max(range(len(pool)), key=lambda i: (pool[i][1] * d ** seen.get(pool[i][2], 0), -i))
            hit = pool.pop(best)
            chosen.append(hit[0])
            seen[hit[2]] = seen.get(hit[2], 0) + 1
        return chosen
    return rank


def session_bm25(harness: Any, turns: dict[str, list[dict]], w: float) -> Ranker:
    import Stemmer

    stem = Stemmer.Stemmer("english").stemWord

    def tok(text: str) -> list[str]:
        return [stem(t) for t in harness.simple_tokenize(text)]

    index = {}
    for conv, ts in turns.items():
        names = sorted({f"session-{t['session']}" for t in ts})
        docs = [tok(" ".join(t["doc"] for t in ts if f"session-{t['session']}" == n)) for n in names]
        index[conv] = (names, harness.PyBM25(docs))

    def rank(q: Question) -> list[str]:
        names, bm = index[q["conv"]]
        scores = bm.scores(tok(q["q"]))
        top = max(scores.values(), default=0.0) or 1.0
        by_session = {names[i]: v / top for i, v in scores.items()}
        order = sorted((-s * (1 + w * by_session.get(src, 0.0)), i, d) for i, (d, s, src) in enumerate(q["hits"]))
        return [d for _, _, d in order]
    return rank


def when_neighbour(turns: dict[str, list[dict]], alpha: float, win: int) -> Ranker:
    at = {c: {t["dia_id"]: i for i, t in enumerate(ts)} for c, ts in turns.items()}

    def rank(q: Question) -> list[str]:
        if not asks_time(q["q"]):
            return as_is(q)
        ts = turns[q["conv"]]
        score = {d: s for d, s, _ in q["hits"]}
        for d, s, _ in q["hits"][:30]:
            i = at[q["conv"]][d]
            if mentions_time(ts[i]["doc"]):
                continue
            for j in range(max(0, i - win), min(len(ts), i + win + 1)):
                u = ts[j]
                if j != i and u["session"] == ts[i]["session"] and mentions_time(u["doc"]):
                    score[u["dia_id"]] = max(score.get(u["dia_id"], 0.0), s * alpha)
        return [d for d, _ in sorted(score.items(), key=lambda x: (-x[1], x[0]))]
    return rank


def run(name: str, variants: Sequence[tuple[str, Ranker]], questions: Sequence[Question]) -> None:
    def recall_at(ranked: list[str], gold: list[str], k: int) -> float:
        return len(set(gold) & set(ranked[:k])) / len(gold)

    results: dict[cv.Point, list[cv.Score]] = {}
    for label, ranker in variants:
        point: cv.Point = ((label, 0.0),)
        results[point] = [cv.Score(q["conv"], q["cat"], recall_at(r, q["gold"], 1), recall_at(r, q["gold"], 10))
                          for q in questions for r in [ranker(q)]]
    held, chosen = cv.cross_validate(results)
    best = cv.best_in_sample(results)

    def row(label: str, scores: Sequence[cv.Score]) -> str:
        sm = cv.summary(scores)
        cells = " | ".join(f"{sm[c][0]:.3f} / {sm[c][1]:.3f}" for c in ("multi-hop", "temporal", "open-domain",
                                                                        "single-hop"))
        return f"| {name}: {label} | {cells} | {sm['overall'][0]:.3f} | {sm['overall'][1]:.3f} |"

    print(row("before", results[next(iter(results))]))
    print(row(f"in-sample best ({best[0][0]})", results[best]))
    print(row("CV", held) + "  chosen: " + ", ".join(f"{c} {p[0][0]}" for c, p in chosen.items()))


def main() -> None:
    harness = load_harness()
    questions, turns = collect(harness)
    print("| variant | multi-hop | temporal | open-domain | single-hop | R@1 | R@10 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    run("diversity", [("off", as_is)] + [(f"d={d}", diversity(d)) for d in (0.95, 0.9, 0.8, 0.7)], questions)
    run("session-bm25", [("off", as_is)] + [(f"w={w}", session_bm25(harness, turns, w))
                                            for w in (0.1, 0.25, 0.5, 1.0)], questions)
    run("when-neighbour", [("off", as_is)] + [(f"alpha={a},win={w}", when_neighbour(turns, a, w))
                                              for a in (0.9, 1.0) for w in (2, 4)], questions)


if __name__ == "__main__":
    main()
