"""A/B of the agent loop (bench_loop.py's bm25 variant) in ONE process: the working tree's
engramdb against another tree's, round by round alternating, on copies of one built file.

Run (from the repository root; build the file first with bench_loop.py ``--workdir DIR``):

    git archive BASE | tar -x -C /tmp/base     # the other tree (its C extension: copy or build it)
    python tools/bench/ab_loop.py --base /tmp/base --file DIR/loop-10000.engram --kind mid --rounds 300

The other tree's ``engramdb`` package is copied into a temporary directory and imported as
``engramdb_base`` (its imports are relative), so both run in one interpreter: same Python,
same numpy, same machine state, alternating A and B every round (the first of the two
alternates too). Each system gets its own copy of the file and its own scratch file. Round
``i``: add memory ``i`` (own commit), query ``i`` (*after commit*), query ``i`` again
(*warm*), add memory ``i`` to the scratch file, query ``i`` once more (*control*: the CPU as
cold as after a commit, nothing this handle caches changed). Prints CPU p50 per system and
the ratios; asserts every round that both systems return the same hits, bit for bit.
Across processes (bench_loop.py run per tree) the absolute times of two trees differed by
up to 2x for the same work at load ~5 (every phase, the controls included), so compare
ratios there; here the absolute times compare too. Never runs inside pytest.
"""
from __future__ import annotations

import argparse
import importlib
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


def _query(db: Any, text: str) -> Any:
    idx = db.indexes
    with db._store.read() as txn:
        return idx.bm25.search(txn, idx.tokenizer(text), 10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the other tree (a directory holding engramdb/)")
    ap.add_argument("--file", required=True, help="a file bench_loop.py built (copied, never changed)")
    ap.add_argument("--kind", default="mid", choices=["mid", "common", "one"])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="engram-ab-")
    try:
        shutil.copytree(os.path.join(args.base, "engramdb"), os.path.join(tmp, "engramdb_base"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        sys.path.insert(0, tmp)
        mods = {"base": importlib.import_module("engramdb_base"), "this": engramdb}
        dbs = {}
        for name, mod in mods.items():
            paths = [os.path.join(tmp, f"{name}-{role}.engram") for role in ("main", "scratch")]
            for path in paths:
                shutil.copy(args.file, path)
            dbs[name] = tuple(mod.open(path, passphrase=PASS) for path in paths)
        qs = queries(args.rounds, args.seed, args.kind)
        adds = corpus(args.rounds, 5555)
        for db, _ in dbs.values():
            for text in qs:
                _query(db, text)
        res: dict[str, dict[str, list[float]]] = {n: {"after": [], "warm": [], "control": []} for n in dbs}
        clock = time.process_time
        order = list(dbs)
        for i in range(args.rounds):
            hits = []
            for name in order if i % 2 == 0 else order[::-1]:
                db, scratch = dbs[name]
                rec = res[name]
                memory = {"id": f"ab{i}", "content": adds[i], "created_at": 0.0, "last_accessed": 0.0}
                db.add(memory, now=0.0)
                t0 = clock()
                after = _query(db, qs[i])
                t1 = clock()
                warm = _query(db, qs[i])
                t2 = clock()
                scratch.add(memory, now=0.0)
                t3 = clock()
                _query(db, qs[i])
                t4 = clock()
                assert after == warm
                rec["after"].append(t1 - t0)
                rec["warm"].append(t2 - t1)
                rec["control"].append(t4 - t3)
                hits.append(after)
            assert hits[0] == hits[1], f"round {i}: the two trees rank differently"
        print(f"{os.path.basename(args.file)} {args.kind}, {args.rounds} rounds, CPU p50, load {os.getloadavg()[0]:.2f}")
        for name, rec in res.items():
            m = {k: statistics.median(v) * 1e3 for k, v in rec.items()}
            print(f"  {name:4s} after {m['after']:.3f}  warm {m['warm']:.3f}  control {m['control']:.3f} ms   "
                  f"after/warm {m['after'] / m['warm']:.2f}x  after/control {m['after'] / m['control']:.2f}x  "
                  f"control/warm {m['control'] / m['warm']:.2f}x")
        for db, scratch in dbs.values():
            db.close()
            scratch.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
