"""The floor of the agent loop's control/warm ratio: how much slower a FIXED piece of work
runs right after a commit (to another file: nothing the queried handle caches changed) than
when repeated at once. Per round and piece: commit one memory to a scratch file (or, with
``--disturb``, sleep 2 ms / sum 4 MB of memory / run some Python instead), time the piece
(*cold*), time it again (*warm*); CPU p50 of each. Pieces, from nothing to a whole query:

``nothing``
    two clock reads;
``tiny C``
    one ``_native.top_terms`` call over two 2-posting runs (a few hundred instructions);
``read txn``
    open and close a read transaction;
``read+tokenize+_directory``
    what every query does before any term is looked up;
``top_terms (real args)``
    the query's adds and top-k selection alone (its terms prepared before the commit);
``full query``
    ab_loop.py's control query.

A query can be no closer to warm than its fixed parts are: when even the tiny C call or
opening a transaction runs N times slower after a commit, no restructuring of the query's
own work gets a query's after/warm below about N.

    python tools/bench/loop_floor.py --file DIR/loop-10000.engram --kind mid --rounds 150

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
from collections.abc import Callable
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import engramdb  # noqa: E402
from bench_search import corpus, queries  # noqa: E402
from engramdb import _accel  # noqa: E402
from engramdb.index import bm25  # noqa: E402

PASS = "bench passphrase"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", required=True, help="a file bench_loop.py built (copied, never changed)")
    ap.add_argument("--kind", default="mid", choices=["mid", "common", "one"])
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--disturb", default="commit", choices=["commit", "sleep", "mem", "py"])
    args = ap.parse_args()
    native = _accel.NATIVE
    if native is None:
        sys.exit("the C extension is not built (or ENGRAMDB_PURE_PYTHON is set)")
    tmp = tempfile.mkdtemp(prefix="engram-floor-")
    try:
        paths = [os.path.join(tmp, f"{role}.engram") for role in ("main", "scratch")]
        for path in paths:
            shutil.copy(args.file, path)
        db, scratch = (engramdb.open(path, passphrase=PASS) for path in paths)
        idx = db.indexes
        b = idx.bm25
        qs = queries(args.rounds, 7, args.kind)
        adds = corpus(args.rounds * 8, 5555)

        def full(text: str, _: Any) -> Any:
            with db._store.read() as txn:
                return b.search(txn, idx.tokenizer(text), 10)

        for text in qs:
            full(text, None)

        def prepared(text: str) -> tuple[Any, ...] | None:
            with db._store.read() as txn:
                parts = b._weighted(txn, idx.tokenizer(text))
            if len(parts) < 2:
                return None
            sizes = [p.size for p in parts]
            longest = max(range(len(parts)), key=sizes.__getitem__)
            lookup = sizes[longest] > bm25.LOOKUP_RATIO * (sum(sizes) - sizes[longest])
            best = parts[longest].best(10)[0] if lookup else None
            acc = b._accumulator(max(p.max_docno for p in parts) + 1)
            return (acc, [p.runs for p in parts], longest if lookup else -1, best, 10, np.empty, np.uint64)

        tiny_acc = np.zeros(16)
        tiny = [[(np.array([1, 2], np.int64), None, np.array([0.5, 0.25]))],
                [(np.array([2, 3], np.int64), None, np.array([0.5, 0.125]))]]

        def read_txn(text: str, _: Any) -> None:
            with db._store.read():
                pass

        def read_tokenize_directory(text: str, _: Any) -> None:
            with db._store.read() as txn:
                idx.tokenizer(text)
                b._directory(txn)

        pieces: dict[str, Callable[[str, Any], Any]] = {
            "nothing": lambda text, a: None,
            "tiny C (top_terms 2x2)": lambda text, a: native.top_terms(tiny_acc, tiny, -1, None, 10, np.empty,
                                                                       np.uint64),
            "read txn": read_txn,
            "read+tokenize+_directory": read_tokenize_directory,
            "top_terms (real args)": lambda text, a: None if a is None else native.top_terms(*a),
            "full query": full,
        }
        junk = np.ones(4 << 20, np.uint8)
        count = 0

        def disturb() -> None:
            nonlocal count
            if args.disturb == "commit":
                memory = {"id": f"f{count}", "content": adds[count % len(adds)], "created_at": 0.0,
                          "last_accessed": 0.0}
                scratch.add(memory, now=0.0)
            elif args.disturb == "sleep":
                time.sleep(0.002)
            elif args.disturb == "mem":
                junk.sum()
            else:
                sum(len(str(x)) for x in range(3000))
            count += 1

        res: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in pieces}
        clock = time.process_time
        for text in qs:
            a = prepared(text)
            for name, fn in pieces.items():
                disturb()
                t0 = clock()
                fn(text, a)
                t1 = clock()
                fn(text, a)
                t2 = clock()
                res[name][0].append(t1 - t0)
                res[name][1].append(t2 - t1)
        print(f"{os.path.basename(args.file)} {args.kind}, {args.rounds} rounds, after: {args.disturb}, CPU p50, "
              f"load {os.getloadavg()[0]:.2f}")
        for name, (cold, warm) in res.items():
            c, w = statistics.median(cold) * 1e6, statistics.median(warm) * 1e6
            print(f"  {name:28s} cold {c:7.1f}  warm {w:7.1f} µs   cold/warm {c / max(w, 1e-9):5.2f}x")
        db.close()
        scratch.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
