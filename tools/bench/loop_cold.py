"""Where the agent loop's after-commit BM25 query loses against a warm one: the cold CPU,
cold data, or the catch-up. ab_loop.py's workload (add memory ``i`` in its own commit, then
query ``i``) on three copies of a file bench_loop.py built (A is written and queried; B is
the scratch file written for the controls; C is never written), CPU p50 per phase:

``after``
    add ``i`` to A, query ``i`` on A (what the issue-15 goal measures);
``warm``
    the same query again;
``control``
    add ``i`` to B, query ``i`` on A again: the code as cold as after a commit, nothing
    cached changed, the query's data just touched;
``cold_nocatchup``
    add to B, query ``i`` on C, whose state has not changed since its entries were last
    brought up to date (in the warm-up pass, long before): cold code AND cold data, no
    catch-up (the floor of any after-commit query that had no catch-up work at all);
``after_codewarm``
    add to A, query other words on B (B has had commits since: its catch-up and query code
    run, on B's data), then the next query on A: an after-commit query with its code warm
    and its data cold (its entries are hundreds of commits old).

    python tools/bench/loop_cold.py --file DIR/loop-10000.engram --kind mid --rounds 300

Runs the working tree's engramdb (PYTHONPATH). Never runs inside pytest.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import engramdb  # noqa: E402
from bench_search import corpus, queries  # noqa: E402

PASS = "bench passphrase"
CLOCK = time.process_time
PHASES = ("after", "warm", "control", "cold_nocatchup", "after_codewarm")


def _query(db: Any, text: str) -> Any:
    idx = db.indexes
    with db._store.read() as txn:
        return idx.bm25.search(txn, idx.tokenizer(text), 10)


def _timed(db: Any, text: str) -> float:
    t = CLOCK()
    _query(db, text)
    return CLOCK() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", required=True, help="a file bench_loop.py built (copied, never changed)")
    ap.add_argument("--kind", default="mid", choices=["mid", "common", "one"])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="engram-cold-")
    try:
        paths = [os.path.join(tmp, f"{role}.engram") for role in ("a", "b", "c")]
        for path in paths:
            shutil.copy(args.file, path)
        a, b, c = (engramdb.open(path, passphrase=PASS) for path in paths)
        n = args.rounds
        qs = queries(n, args.seed, args.kind)
        other = queries(n, args.seed + 92, args.kind)
        adds = corpus(3 * n, 5555)
        for text in qs:
            _query(a, text)
            _query(c, text)
        for text in other:
            _query(b, text)
        spent: dict[str, list[float]] = {ph: [] for ph in PHASES}

        def memory(j: int) -> dict[str, Any]:
            return {"id": f"cold{j}", "content": adds[j], "created_at": 0.0, "last_accessed": 0.0}

        for i in range(n):
            a.add(memory(3 * i), now=0.0)
            spent["after"].append(_timed(a, qs[i]))
            spent["warm"].append(_timed(a, qs[i]))
            b.add(memory(3 * i), now=0.0)
            spent["control"].append(_timed(a, qs[i]))
            b.add(memory(3 * i + 1), now=0.0)
            spent["cold_nocatchup"].append(_timed(c, qs[i]))
            a.add(memory(3 * i + 2), now=0.0)
            _query(b, other[i])
            spent["after_codewarm"].append(_timed(a, qs[(i + 1) % n]))
        warm = statistics.median(spent["warm"])
        print(f"{os.path.basename(args.file)} {args.kind}, {n} rounds, CPU p50, load {os.getloadavg()[0]:.2f}")
        for ph in PHASES:
            p50 = statistics.median(spent[ph])
            print(f"  {ph:16s} {p50 * 1e3:.3f} ms  {p50 / warm:5.2f}x warm")
        for db in (a, b, c):
            db.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
