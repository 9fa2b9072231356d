"""Where the agent loop's BM25 query after a commit spends its time: ab_loop.py's workload
(add memory ``i`` in its own commit, query ``i`` *after* the commit, again *warm*, a commit
to another file, then the query once more: the *control*) on a copy of a file bench_loop.py
built, with CPU timers (``time.process_time``) wrapped around the read path's functions.

    python tools/bench/loop_phases.py --file DIR/loop-10000.engram --kind mid --rounds 300

Prints, per phase, the mean CPU per query (inclusive: a function's callees are in its figure
too) after the commit, warm and in the control, and the calls per after-commit query. The
wrappers add about a microsecond per call, so compare phases with each other and with the
control, not with ab_loop.py's figures. Runs the working tree's engramdb (PYTHONPATH).
Never runs inside pytest.
"""
from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import engramdb  # noqa: E402
from bench_search import corpus, queries  # noqa: E402
from engramdb import cache as cache_mod  # noqa: E402
from engramdb.index import bm25  # noqa: E402

PASS = "bench passphrase"
CLOCK = time.process_time
SPENT: dict[str, float] = collections.defaultdict(float)
CALLS: collections.Counter[str] = collections.Counter()


def _timed(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = CLOCK()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[label] += CLOCK() - t
            CALLS[label] += 1
    return wrapper


def _wrap(owner: type, name: str, label: str) -> None:
    raw = owner.__dict__.get(name)
    if raw is None:
        return  # not in this tree
    if isinstance(raw, staticmethod):
        setattr(owner, name, staticmethod(_timed(label, raw.__func__)))
    else:
        setattr(owner, name, _timed(label, raw))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", required=True, help="a file bench_loop.py built (copied, never changed)")
    ap.add_argument("--kind", default="mid", choices=["mid", "common", "one"])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    seg = bm25.SegmentedBM25
    for name in ("top", "_directory", "_term_postings", "_view", "_holders", "_delta", "_moved", "_update",
                 "_build", "_small_block", "blind"):
        _wrap(seg, name, name)
    for owner, name in ((bm25._Term, "of"), (bm25._Term, "best"), (bm25._TermPostings, "relabelled"),
                        (bm25._Run, "best"), (bm25._Run, "_pairs_best")):
        _wrap(owner, name, f"{owner.__name__.lstrip('_')}.{name}")
    bm25._parts = _timed("_parts", bm25._parts)
    bm25.top_k = _timed("top_k", bm25.top_k)
    _wrap(cache_mod.LRUCache, "put", "cache.put")
    tmp = tempfile.mkdtemp(prefix="engram-phases-")
    try:
        paths = [os.path.join(tmp, f"{role}.engram") for role in ("main", "scratch")]
        for path in paths:
            shutil.copy(args.file, path)
        db, scratch = (engramdb.open(path, passphrase=PASS) for path in paths)
        idx = db.indexes

        def query(text: str) -> Any:
            with db._store.read() as txn:
                return idx.bm25.search(txn, idx.tokenizer(text), 10)

        qs = queries(args.rounds, args.seed, args.kind)
        adds = corpus(args.rounds, 5555)
        for text in qs:
            query(text)
        phases = ("after", "warm", "control")
        spent = {ph: collections.defaultdict(float) for ph in phases}
        calls = {ph: collections.Counter() for ph in phases}
        total: dict[str, list[float]] = {ph: [] for ph in phases}
        for i in range(args.rounds):
            memory = {"id": f"ph{i}", "content": adds[i], "created_at": 0.0, "last_accessed": 0.0}
            db.add(memory, now=0.0)
            for ph in phases:
                if ph == "control":
                    scratch.add(memory, now=0.0)
                SPENT.clear()
                CALLS.clear()
                t = CLOCK()
                query(qs[i])
                total[ph].append(CLOCK() - t)
                for key, value in SPENT.items():
                    spent[ph][key] += value
                calls[ph].update(CALLS)
        n = args.rounds
        print(f"{os.path.basename(args.file)} {args.kind}, {n} rounds, CPU, load {os.getloadavg()[0]:.2f}")
        for ph in phases:
            print(f"  {ph}: p50 {statistics.median(total[ph]) * 1e6:.0f} µs, mean {statistics.mean(total[ph]) * 1e6:.0f} µs")
        print(f"  {'phase (inclusive), mean µs per query':38s} {'after':>8s} {'warm':>8s} {'control':>8s}  calls/after")
        for key in sorted(spent["after"], key=lambda k: -spent["after"][k]):
            print(f"  {key:38s} " + " ".join(f"{spent[ph][key] / n * 1e6:8.1f}" for ph in phases)
                  + f"  {calls['after'][key] / n:.2f}")
        b = idx.bm25
        print(f"  work: deltas built {b.deltas_built}, moved {b.deltas_moved}, blocks decoded {b.blocks_decoded}, "
              f"runs built {b.runs_built} (the first queries before the loop included)")
        db.close()
        scratch.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
