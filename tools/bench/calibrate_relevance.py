"""Calibrate ``Hit.relevance`` on the LoCoMo dev conversations (spec/recall.md, "Relevance").

Run (from the repository root):

    python tools/bench/calibrate_relevance.py [--data ../shared/data/locomo/locomo-dev.json]
        [--space] [--raw] [--top-k 10]

Each conversation becomes a store (tools/bench/locomo_adapter.py: one memory per turn,
consecutive turns linked). For every answerable question (categories 1-4) the top-k hits
are labelled "evidence" when LoCoMo lists the turn as evidence for the question. The
script prints:

* per relevance bin: hits, evidence hits and the evidence rate (the probability that a
  hit is evidence), which must rise with relevance;
* the top hit's relevance for the real questions and for off-topic queries (work and
  engineering tasks that no conversation is about), as percentiles and as the share at or
  above candidate floors.

``--raw`` bins the raw match features (``match:<retriever>`` of ``explain=True``) instead,
which is what the calibration maps were fitted on. ``--space`` adds the built-in hashed
embedding space, so the vector retriever takes part. Deterministic (no timing).
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import locomo_adapter  # noqa: E402

DEFAULT_DATA = os.path.join(ROOT, "..", "shared", "data", "locomo", "locomo-dev.json")
HARNESS = os.path.join(ROOT, "..", "shared", "tools", "locomo_eval.py")
OFF_TOPIC = [
    "How do I rotate the TLS certificate on the nginx ingress controller?",
    "Refactor the database migration script to use alembic",
    "What is the time complexity of heapsort?",
    "Configure the CI pipeline to run mypy in strict mode",
    "Why does the Kubernetes pod restart with OOMKilled?",
    "Write a SQL query that joins orders and invoices by customer id",
    "How do I bump the protobuf schema version without breaking clients?",
    "Fix the flaky integration test in the payment service",
    "What is the default port of PostgreSQL?",
    "Explain the difference between TCP and UDP",
    "Set up a Python virtual environment with pinned dependencies",
    "How many replicas does the Kafka topic need for durability?",
    "Summarize the quarterly revenue forecast spreadsheet",
    "Compile the Rust crate with link-time optimisation",
    "What does HTTP status code 418 mean?",
    "Tune the garbage collector of the JVM for low latency",
    "Deploy the terraform module to the staging account",
    "How do I undo the last git commit but keep the changes?",
    "Which regex matches an IPv6 address?",
    "Benchmark the Redis cache eviction policy",
    "Translate the API error messages into German",
    "What is the derivative of x squared times sine x?",
    "Draft the invoice for the consulting contract",
    "Calibrate the torque sensor on the robot arm",
    "How do I convert a UTF-16 file to UTF-8 on the command line?",
    "Lint the TypeScript monorepo with eslint",
    "Add an index on the users table email column",
    "What are the GDPR retention rules for server logs?",
    "Rebase the feature branch onto main and resolve conflicts",
    "Estimate the cloud bill for 40 GPU hours",
]
BINS = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0001]
FLOORS = (0.1, 0.2, 0.3, 0.4)


def _harness():
    return locomo_adapter.load_harness(HARNESS)


def _bin(x: float) -> int:
    for i in range(len(BINS) - 1):
        if BINS[i] <= x < BINS[i + 1]:
            return i
    return len(BINS) - 2


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--space", action="store_true", help="add the built-in hashed embedding space")
    ap.add_argument("--raw", action="store_true", help="bin the raw match features instead of relevance")
    args = ap.parse_args(argv)
    harness = _harness()
    convs = harness.load_conversations(args.data)
    # per key (relevance, or a raw feature name): bin -> [hits, evidence]
    tables: dict[str, list[list[int]]] = {}
    top_real: list[float] = []
    top_real_evidence = 0
    top_off: list[float] = []
    questions = 0
    for conv in convs:
        db = locomo_adapter.build_store(conv["turns"], space=args.space)
        valid = {t["dia_id"] for t in conv["turns"]}
        for qa in conv["qa"]:
            if qa.get("category") not in (1, 2, 3, 4):
                continue
            gold, _ = harness.normalize_evidence(qa.get("evidence", []), valid)
            if not gold:
                continue
            questions += 1
            hits = db.recall(qa["question"], top_k=args.top_k, explain=True)
            if hits:
                top_real.append(hits[0].relevance)
                top_real_evidence += hits[0].id in gold
            else:
                top_real.append(0.0)
            for hit in hits:
                assert hit.parts is not None
                feats = {k: v for k, v in hit.parts.items() if k.startswith(("match:", "coverage:"))} if args.raw \
                    else {"relevance": hit.relevance}
                for key, x in feats.items():
                    row = tables.setdefault(key, [[0, 0] for _ in BINS[:-1]])[_bin(x)]
                    row[0] += 1
                    row[1] += hit.id in gold
        for q in OFF_TOPIC:
            hits = db.recall(q, top_k=1)
            top_off.append(hits[0].relevance if hits else 0.0)
        db.close()
    print(f"{len(convs)} conversations, {questions} answerable questions (categories 1-4), top-{args.top_k} hits"
          f"{', with the hashed vector space' if args.space else ''}\n")
    for key in sorted(tables):
        print(f"| {key} | hits | evidence | P(evidence) |\n|---|---:|---:|---:|")
        for i, (n, ev) in enumerate(tables[key]):
            if n:
                hi = min(BINS[i + 1], 1.0)
                print(f"| [{BINS[i]:.1f}, {hi:.1f}{']' if hi == 1.0 else ')'} | {n} | {ev} | {ev / n:.3f} |")
        print()
    print(f"top hit is evidence: {top_real_evidence}/{questions} = {top_real_evidence / max(1, questions):.3f}\n")
    print("| top hit's relevance | p10 | p25 | p50 | p75 | p90 | " + " | ".join(f">= {f}" for f in FLOORS) + " |")
    print("|---|---:|---:|---:|---:|---:|" + "---:|" * len(FLOORS))
    for name, vals in ((f"real questions (n={len(top_real)})", top_real),
                       (f"off-topic queries (n={len(top_off)})", top_off)):
        cells = [f"{_pct(vals, q):.3f}" for q in (0.1, 0.25, 0.5, 0.75, 0.9)]
        cells += [f"{sum(v >= f for v in vals) / len(vals):.3f}" for f in FLOORS]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
