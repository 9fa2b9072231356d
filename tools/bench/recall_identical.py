"""Check that ``recall()`` ranks exactly as before a change: same ids, same scores, same
relevance (and, for a sample, the same ``explain`` parts), bit for bit.

Run (from the repository root):

    python tools/bench/recall_identical.py --record /tmp/recall-before.json   # on the old code
    python tools/bench/recall_identical.py --check-identical /tmp/recall-before.json   # on the new

It builds, in a temporary directory, stores that exercise every part of the ranking:

* ``locomo``: one store per LoCoMo dev conversation, as tools/bench/locomo_adapter.py builds it
  (speakers, sessions as sources, dates, ``related`` edges between neighbouring turns), every
  question with evidence of categories 1-4 (760), ``top_k`` 10 and 50; the first two
  conversations also with a seeded random embedding space (fusion of two rankings). Skipped,
  with a message, when ../shared is absent.
* ``synth``: 10,000 generated documents (tools/bench/bench_search.py's corpus) with random
  tiers, dates, sources, speakers, time words, ~1.3 tunnel edges per memory, some
  ``supersedes`` and ``contradicts`` edges; mid and common queries plus questions naming
  speakers and asking "when"; ``top_k`` 10 and 50, some with filters, ``hops=False``,
  ``min_relevance`` or ``explain=True``; then an agent loop of one-memory commits each
  followed by recalls (the caches carried across commits).
* ``synth-vec``: 2,000 of those documents with a random embedding space.

Every query's hits are written as ``[id, repr(score), repr(relevance)]`` (and the parts
with ``explain``). ``--check-identical`` exits 1 and prints the first differences when any
query's answer differs. This script never runs inside pytest (it builds a 10k store).
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import engramdb  # noqa: E402
from bench_search import corpus, queries  # noqa: E402
from embed_cache import random_vectors  # noqa: E402

LOCOMO = os.path.join(ROOT, "..", "shared", "data", "locomo", "locomo-dev.json")
SPEAKERS = ["alice", "bob", "carol", "dmitri", "eve"]
TIERS = ["hot", "warm", "cold", "archive"]


def _hits(hits: list[Any], explain: bool) -> list[Any]:
    out = []
    for h in hits:
        row: list[Any] = [h.id, repr(h.score), repr(h.relevance)]
        if explain:
            row.append({k: repr(v) for k, v in (h.parts or {}).items()})
        out.append(row)
    return out


def _ask(db: Any, tag: str, q: str, **kw: Any) -> tuple[str, list[Any]]:
    key = tag + " | " + q + " | " + json.dumps(kw, sort_keys=True)
    return key, _hits(db.recall(q, **kw), bool(kw.get("explain")))


def locomo_runs(tmp: str) -> Iterator[tuple[str, list[Any]]]:
    if not os.path.isfile(LOCOMO):
        print(f"locomo: skipped ({LOCOMO} absent)", file=sys.stderr)
        return
    import locomo_adapter as adapter

    harness = adapter.load_harness()
    convs = harness.load_conversations(LOCOMO)
    for ci, conv in enumerate(convs):
        questions = [qa["question"] for qa in conv["qa"] if int(qa["category"]) in (1, 2, 3, 4) and qa.get("evidence")]
        spaces: list[str | bool] = [False] + (["random"] if ci < 2 else [])
        for space in spaces:
            db = adapter.build_store(conv["turns"], space=space)
            tag = f"locomo/{conv['sample_id']}/{space or 'none'}"
            for qi, q in enumerate(questions):
                for k in (10, 50):
                    yield _ask(db, tag, q, top_k=k)
                if qi % 10 == 0:
                    yield _ask(db, tag, q, top_k=10, explain=True)
                if qi % 15 == 0:
                    yield _ask(db, tag, q, top_k=10, hops=False)
                    yield _ask(db, tag, q, top_k=10, min_relevance=0.3)
            db.close()


def _synth_items(texts: list[str], seed: int, vec: bool) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    vecs = random_vectors(texts) if vec else None
    items = []
    for i, text in enumerate(texts):
        words = text.split()
        speaker = SPEAKERS[int(rng.integers(len(SPEAKERS)))] if rng.random() < 0.6 else None
        if rng.random() < 0.15:
            words.insert(int(rng.integers(len(words) + 1)), str(rng.choice(["yesterday", "last week", "in May",
                                                                          "2021", "two years ago"])))
        if speaker and rng.random() < 0.3:
            words.insert(0, speaker)
        item: dict[str, Any] = {
            "id": f"s{i}", "content": " ".join(words), "tier": TIERS[int(rng.integers(4))],
            "created_at": float(i), "last_accessed": float(i)}
        if rng.random() < 0.3:
            item["resolved_date"] = f"{int(rng.integers(2019, 2025))}-{int(rng.integers(1, 13)):02d}-" \
                                    f"{int(rng.integers(1, 29)):02d}"
        if rng.random() < 0.5:
            item["source"] = f"src-{i // 40}"
        if speaker:
            item["metadata"] = {"speaker": speaker}
        if rng.random() < 0.2:
            item["tags"] = [f"tag{int(rng.integers(5))}"]
        if vecs is not None:
            item["embeddings"] = {"rand": tuple(float(x) for x in vecs[i])}
        items.append(item)
    return items


def _synth_edges(db: Any, n: int, seed: int) -> None:
    from engramdb.records import Edge

    rng = np.random.default_rng(seed + 1)
    graph = db.indexes.graph
    with db._store.read() as txn:
        from engramdb.index import iter_nodes

        ids = {docno: node.id for docno, node in iter_nodes(txn)}
    docnos = sorted(ids)
    m = int(1.3 * len(docnos))
    a, b = rng.integers(0, len(docnos), size=m), rng.integers(0, len(docnos), size=m)
    weights = rng.uniform(0.3, 1.0, size=m)
    kinds = rng.choice(["tunnel", "related", "supersedes", "contradicts"], size=m, p=[0.85, 0.1, 0.03, 0.02])

    def link(txn: Any) -> None:
        for i, j, w, kind in zip(a.tolist(), b.tolist(), weights.tolist(), kinds.tolist()):
            if i != j:
                src, dst = docnos[min(i, j)], docnos[max(i, j)]
                graph.put(txn, src, dst, Edge(src=ids[src], dst=ids[dst], kind=kind, weight=w, label=""),
                          derived=kind == "tunnel")

    db._store.write(link)


def _synth_questions(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed + 5)
    base = queries(n, seed, "common")
    out = []
    for i, q in enumerate(base):
        who = SPEAKERS[i % len(SPEAKERS)]
        out.append(str(rng.choice([f"when did {who} {q}", f"what did {who} say about {q}",
                                   f"how long {q}", f"{q} in 2021", f"{q} last May"])))
    return out


def synth_runs(tmp: str, n: int, vec: bool, n_queries: int) -> Iterator[tuple[str, list[Any]]]:
    seed = 7
    texts = corpus(n, seed)
    db = engramdb.open(os.path.join(tmp, f"synth-{n}-{vec}.engram"), key=b"k" * 32)
    if vec:
        db.add_space("rand", dims=64, model="bench/random-vectors", embedder=random_vectors)
    items = _synth_items(texts, seed, vec)
    db.add_many(items, now=0.0)
    _synth_edges(db, n, seed)
    tag = f"synth/{n}/{'vec' if vec else 'novec'}"
    qs = (queries(n_queries, seed, "mid") + queries(n_queries, seed, "common")
          + _synth_questions(n_queries // 2, seed))
    for qi, q in enumerate(qs):
        for k in (10, 50):
            yield _ask(db, tag, q, top_k=k)
        if qi % 7 == 0:
            yield _ask(db, tag, q, top_k=10, explain=True)
        if qi % 11 == 0:
            yield _ask(db, tag, q, top_k=10, hops=False)
            yield _ask(db, tag, q, top_k=10, tiers=["hot", "warm"])
            yield _ask(db, tag, q, top_k=10, source="src-3")
            yield _ask(db, tag, q, top_k=10, min_relevance=0.2)
            yield _ask(db, tag, q, top_k=10, expand_query=False)
    # the agent loop: one memory per commit, then recall (caches carried across commits)
    adds = corpus(40, seed + 99)
    for i, (text, q) in enumerate(zip(adds, itertools.cycle(qs))):
        fields: dict[str, Any] = {"id": f"loop{i}", "content": text, "created_at": 1e6 + i, "last_accessed": 0.0}
        if vec:
            fields["embeddings"] = {"rand": tuple(float(x) for x in random_vectors([text])[0])}
        db.add(fields, now=0.0)
        if i % 5 == 0:
            db.link(f"loop{i}", f"s{i * 37 % n}", "related", weight=0.7, now=0.0)
        yield _ask(db, tag + "/loop", q, top_k=10)
        yield _ask(db, tag + "/loop", text.split()[0] + " " + text.split()[3], top_k=10)
    db.close()


def run(n_synth: int, n_queries: int, locomo: bool) -> dict[str, list[Any]]:
    tmp = tempfile.mkdtemp(prefix="recall-identical-")
    out: dict[str, list[Any]] = {}
    try:
        gens = [synth_runs(tmp, n_synth, False, n_queries), synth_runs(tmp, 2000, True, n_queries // 2)]
        if locomo:
            gens.append(locomo_runs(tmp))
        for gen in gens:
            t0 = time.process_time()
            count = 0
            for key, hits in gen:
                if key in out and out[key] != hits:
                    raise SystemExit(f"the same query answered differently twice in one run: {key}")
                out[key] = hits
                count += 1
            print(f"  {count} recalls, {time.process_time() - t0:.1f} s CPU", file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def digest(answers: dict[str, list[Any]]) -> str:
    return hashlib.sha256(json.dumps(answers, sort_keys=True).encode()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--record", metavar="FILE", help="write the answers to FILE (JSON)")
    group.add_argument("--check-identical", metavar="FILE", help="compare with the answers recorded in FILE")
    ap.add_argument("--docs", type=int, default=10_000, help="documents of the synthetic store")
    ap.add_argument("--queries", type=int, default=150, help="mid and common queries each (synthetic store)")
    ap.add_argument("--no-locomo", action="store_true")
    args = ap.parse_args()
    answers = run(args.docs, args.queries, not args.no_locomo)
    print(f"{len(answers)} answers, digest {digest(answers)}")
    if args.record:
        with open(args.record, "w") as fh:
            json.dump(answers, fh, sort_keys=True)
        return
    with open(args.check_identical) as fh:
        expected = json.load(fh)
    missing = sorted(set(expected) - set(answers))
    extra = sorted(set(answers) - set(expected))
    differ = sorted(k for k in set(expected) & set(answers) if expected[k] != answers[k])
    for k in differ[:5]:
        print(f"DIFFERS: {k}\n  expected {expected[k][:5]}\n  got      {answers[k][:5]}")
    if missing or extra:
        print(f"{len(missing)} recorded queries not asked, {len(extra)} asked that were not recorded")
    if differ or missing or extra:
        print(f"NOT IDENTICAL: {len(differ)} of {len(expected)} answers differ")
        raise SystemExit(1)
    print(f"identical: all {len(expected)} answers")


if __name__ == "__main__":
    main()
