"""Dump and restore throughput of an encrypted store with embeddings, beside JSON Lines.

    python tools/bench/bench_dump.py --n 100000 --dims 384 --runs 3

Builds an encrypted store of N nodes (~60 words each, one embedding each), then times,
in one run: ``Engram.dump`` (AAAK v3) and ``engramdb.restore``, side by side with the
reference a user would otherwise write: a JSON Lines export of the same nodes
(``json.dumps`` of each node) and its import into a fresh store through ``add_many``.
Prints medians (nodes/s, MB/s) and the dump's size relative to the store file.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import tempfile
import time

import engramdb
from engramdb import KDFParams

WORDS = ("memory alice bob berlin moved job career tea coffee meeting release outage decided token "
         "rust indexer vault planning quarterly wedding lisbon sister robotics company cadence weekly "
         "authentication mobile repository secret thursday monday march june learning rewrite").split()


def make_nodes(n: int, dims: int, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    nodes = []
    for i in range(n):
        vec = [rng.uniform(-1, 1) for _ in range(dims)]
        nodes.append({"id": f"n{i:07d}", "content": " ".join(rng.choice(WORDS) for _ in range(60)),
                      "tags": [rng.choice(("a", "b", "c"))], "created_at": 1.7e9 + i, "embeddings": {"e": vec}})
    return nodes


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--dims", type=int, default=384)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("ENGRAM_TEST_WEAK_KDF", "1")  # the KDF is not what is measured here
    kdf = KDFParams.for_tests()
    work = tempfile.mkdtemp(prefix="bench-dump-")
    src = os.path.join(work, "src.engram")
    db = engramdb.open(src, passphrase="bench", kdf=kdf)
    db.add_space("e", dims=args.dims, model="bench-random", normalize=False)
    nodes = make_nodes(args.n, args.dims)
    t_build = timed(lambda: [db.add_many(nodes[i:i + 5000]) for i in range(0, len(nodes), 5000)])
    store_size = os.stat(src).st_size

    dump_times, restore_times, jsonl_out, jsonl_in = [], [], [], []
    text = ""
    jsonl = ""
    for run in range(args.runs):
        buf = io.StringIO()
        dump_times.append(timed(lambda buf=buf: db.dump(buf)))
        text = buf.getvalue()
        target = os.path.join(work, f"restored-{run}.engram")
        restore_times.append(timed(
            lambda text=text, target=target: engramdb.restore(io.StringIO(text), target, passphrase="bench", kdf=kdf)))

        def export_jsonl() -> None:
            nonlocal jsonl
            jsonl = "\n".join(json.dumps(node.to_dict(), sort_keys=True) for node in db.scan()) + "\n"

        jsonl_out.append(timed(export_jsonl))

        def import_jsonl(run: int = run) -> None:
            items = [json.loads(line) for line in jsonl.splitlines()]
            with engramdb.open(os.path.join(work, f"jsonl-{run}.engram"), passphrase="bench", kdf=kdf) as other:
                other.add_space("e", dims=args.dims, model="bench-random", normalize=False)
                for i in range(0, len(items), 1000):
                    other.add_many(items[i:i + 1000])

        jsonl_in.append(timed(import_jsonl))
    db.close()

    mb = len(text.encode()) / 1e6
    jmb = len(jsonl.encode()) / 1e6
    med = statistics.median
    print(f"nodes={args.n} dims={args.dims} runs={args.runs}  build {args.n / t_build:,.0f} nodes/s")
    print(f"store file {store_size / 1e6:.1f} MB; AAAK dump {mb:.1f} MB ({mb * 1e6 / store_size:.2f}x the store); "
          f"JSONL {jmb:.1f} MB")
    print(f"{'operation':<22}{'median s':>10}{'nodes/s':>12}{'MB/s':>10}")
    for name, times, size in (("AAAK dump", dump_times, mb), ("AAAK restore", restore_times, mb),
                              ("JSONL export", jsonl_out, jmb), ("JSONL import", jsonl_in, jmb)):
        t = med(times)
        print(f"{name:<22}{t:>10.2f}{args.n / t:>12,.0f}{size / t:>10.1f}")
    print(f"ratio dump/JSONL export: {med(jsonl_out) / med(dump_times):.2f}x; "
          f"restore/JSONL import: {med(jsonl_in) / med(restore_times):.2f}x (>1 means AAAK is faster)")


if __name__ == "__main__":
    main()
