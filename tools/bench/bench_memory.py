"""Where a query process's memory goes (issue 15, "Bounded memory"): a fresh process opens
an existing file and runs BM25 queries; this prints its memory at each stage, split the way
Linux counts it.

Run (from the repository root; a 1M-document file only under the shared lock):

    python tools/bench/bench_memory.py FILE [--queries 200] [--cache-mb MB] [--api recall]
    flock /work/coord/big.lock python tools/bench/bench_memory.py /work/coord/big/engram-1M.engram

The file must use bench passphrase "bench passphrase" (tools/bench/bench_writes.py and
bench_loop.py build such files). Stages: the bare interpreter, ``import numpy``, ``import
engramdb`` (cryptography, lmdb, argon2, ...), ``open`` (argon2id runs here), then the
queries (bench_search.py's ``mid`` and ``common`` sets, ``--queries`` of each). Per stage:

* ``rss``: VmRSS, what ``top`` shows;
* ``anon``: RssAnon, the process's own memory (heap, numpy arrays, caches): what the
  issue's 200 MB goal counts (README, "Memory");
* ``map``: the resident pages of the memory-mapped LMDB data file (page cache: shared
  with every process mapping the file, clean, reclaimable by the kernel at any time);
* ``code``: the other file-backed pages (the interpreter's and libraries' code).

Then the postings cache's bytes by kind (term postings, segment tables, term sets), the
node cache's, the per-thread accumulator, and with ``--transient`` the largest transient
allocation of one query (tracemalloc: numpy registers its buffers with it) over a second
pass of the queries with the cache cleared.
Figures go into tools/bench/README.md by hand; this script never runs inside pytest.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PASS = "bench passphrase"
MB = 2**20


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS:", "VmHWM:", "RssAnon:", "RssFile:", "RssShmem:")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) * 1024
    return out


def _mapped(path: str | None) -> int:
    """Resident bytes of ``path``'s mappings in this process (/proc/self/smaps)."""
    if path is None:
        return 0
    path = os.path.realpath(path)
    total, inside = 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):  # a mapping's header line
                inside = line.rstrip("\n").endswith(" " + path)
            elif inside and head == "Rss:":
                total += int(line.split()[1]) * 1024
    return total


def stage(name: str, path: str | None = None) -> dict[str, float]:
    s = _status()
    mapped = _mapped(path)
    row = {"stage": name, "rss": s["VmRSS"] / MB, "anon": s["RssAnon"] / MB, "map": mapped / MB,
           "code": (s["RssFile"] - mapped) / MB, "hwm": s["VmHWM"] / MB}
    print(f"  {name:<34} rss {row['rss']:7.1f}  anon {row['anon']:7.1f}  map {row['map']:7.1f}  "
          f"code {row['code']:6.1f}  (peak rss {row['hwm']:7.1f}) MB", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--queries", type=int, default=200, help="queries of each set (mid, common)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--cache-mb", type=float, default=None)
    ap.add_argument("--api", choices=("bm25", "recall"), default="bm25",
                    help="bm25: tokenize + BM25 top-10 in a read transaction; recall: db.recall(q, top_k=10, "
                         "hops=False) (the public call, decodes the hits' nodes)")
    ap.add_argument("--transient", action="store_true",
                    help="also run the queries again under tracemalloc (slow) for the largest transient allocation")
    ap.add_argument("--trim", action="store_true",
                    help="after the queries, glibc's malloc_trim(0): the heap that was free but kept")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    # the query texts come from a child process: the vocabulary behind them is not ours to count
    code = (f"import json, sys; sys.path.insert(0, {HERE!r}); from bench_search import queries; "
            f"print(json.dumps([q for k in ('mid', 'common') for q in queries({args.queries}, {args.seed}, k)]))")
    qs: list[str] = json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                              text=True).stdout)
    rows = [stage("interpreter")]
    import numpy as np  # noqa: F401

    rows.append(stage("+ import numpy"))
    sys.path.insert(0, ROOT)
    sys.path.insert(0, HERE)
    import engramdb

    rows.append(stage("+ import engramdb"))
    kw = {} if args.cache_mb is None else {"cache_mb": args.cache_mb}
    db = engramdb.open(args.file, passphrase=PASS, readonly=True, **kw)
    rows.append(stage("+ open (argon2id)", args.file))
    idx = db.indexes

    def run(q: str) -> object:
        if args.api == "recall":
            return db.recall(q, top_k=10, hops=False)
        with db._store.read() as txn:
            return idx.bm25.search(txn, idx.tokenizer(q), 10)

    import time

    wall, cpu = time.perf_counter(), time.process_time()
    for i, q in enumerate(qs):
        run(q)
        if i + 1 in (10, len(qs) // 2):
            rows.append(stage(f"+ {i + 1} queries", args.file))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    rows.append(stage(f"+ {len(qs)} queries", args.file))
    print(f"  the {len(qs)} queries (first pass, caches filling): {cpu:.2f} s CPU, {wall:.2f} s wall "
          "(CPU is steadier under load; /proc reads for the stages included)")
    wall, cpu = time.perf_counter(), time.process_time()
    for q in qs:
        run(q)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    rows.append(stage(f"+ the {len(qs)} queries again", args.file))
    print(f"  the {len(qs)} queries again (evictions force re-reads): {cpu:.2f} s CPU, {wall:.2f} s wall")
    if args.trim:  # how much of the heap is freed memory glibc kept (fragmentation), not live data
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
        rows.append(stage("+ malloc_trim(0)", args.file))
    cache = idx.bm25.cache
    kinds: dict[str, int] = {}
    for key, (_, nbytes) in list(cache._data.items()):
        kinds[key[0]] = kinds.get(key[0], 0) + nbytes
    acc = getattr(idx.bm25._local, "acc", None)
    node_cache = getattr(idx, "_node_cache", None)
    print(f"  postings cache {cache.nbytes / MB:.1f} of {cache.max_bytes / MB:.0f} MB "
          f"(terms {kinds.get('t', 0) / MB:.1f}, segment tables {kinds.get('s', 0) / MB:.1f}, "
          f"term sets {kinds.get('v', 0) / MB:.1f}; {len(cache)} entries, {cache.evictions} evictions); "
          f"accumulator {0 if acc is None else acc.nbytes / MB:.1f} MB; node cache "
          f"{0 if node_cache is None else node_cache.nbytes / MB:.1f} MB", flush=True)
    worst = 0
    if args.transient:
        import tracemalloc

        cache.clear()  # every query reads its terms again, as the first pass's did
        tracemalloc.start()
        for q in qs:
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            run(q)
            worst = max(worst, tracemalloc.get_traced_memory()[1] - base)
        tracemalloc.stop()
        print(f"  largest transient allocation of one query (tracemalloc, a second pass with the cache "
              f"cleared): {worst / MB:.1f} MB")
    db.close()
    rows.append(stage("after close", args.file))
    print(f"  load average {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": rows, "cache": kinds, "transient_max": worst}, fh)


if __name__ == "__main__":
    main()
