"""Vector storage benchmark: engramdb (encrypted, through the public API) beside sqlite-vec.

Run (from the repository root):

    python tools/bench/bench_vectors.py --n 100000 --dims 384 --runs 3
    flock /work/coord/big.lock python tools/bench/bench_vectors.py --first-search 1000000 --dims 384

The first form adds ``n`` random unit vectors (seeded), one memory each, with
``Engram.add_many`` in batches of ``--batch`` (one write transaction each), and the same
vectors into a sqlite-vec ``vec0`` table (plaintext; apsw loads the extension) in the same
batches, one transaction each, then compares add time (wall and CPU) and file size, run
after run, and prints medians and ratios. ``--text`` gives each memory a text: ``none`` (a
bare vector), ``short`` (a unique word ``"v<i>"``), ``sentence`` (one short sentence,
8-15 words) or ``doc`` (bench_search.py's ~60-word documents). engramdb stores the text in
the node record and indexes it for BM25; the sqlite-vec side stores the same text in the
same file, by ``--peer``: ``aux`` (an auxiliary column ``+content text`` of the ``vec0``
table: stored, not searchable) or ``fts`` (that column plus an FTS5 table over the text,
what a user who also wants keyword search writes). The second form builds an ``n``-vector
file once, then opens it in a fresh process and times the first exact search (which loads
the matrix) and the process's peak resident memory, beside the matrix's own size.

Optional peer: ``pip install apsw-sqlite3mc sqlite-vec`` (skipped with a note when
missing). Figures go into tools/bench/README.md by hand; never run inside pytest.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import engramdb  # noqa: E402

PASS = "bench passphrase"


def vectors(n: int, dims: int, seed: int, start: int = 0) -> np.ndarray:
    rng = np.random.default_rng([seed, start])
    mat = rng.standard_normal((n, dims)).astype(np.float32)
    mat /= np.linalg.norm(mat, axis=1, keepdims=True)
    return mat


def texts(kind: str, n: int, seed: int) -> list[str]:
    """The memories' texts for ``--text``: the same on both sides."""
    if kind == "none":
        return [""] * n
    if kind == "short":
        return [f"v{i}" for i in range(n)]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_search

    if kind == "doc":
        return list(bench_search.corpus(n, seed))
    vocab, p = bench_search.vocabulary(seed)  # "sentence": 8-15 Zipf-drawn words
    rng = np.random.default_rng([seed, 1])
    lengths = rng.integers(8, 16, size=n)
    words = rng.choice(len(vocab), size=int(lengths.sum()), p=p)
    out, pos = [], 0
    for ln in lengths:
        out.append(" ".join(vocab[w] for w in words[pos:pos + ln]).capitalize() + ".")
        pos += ln
    return out


TEXTS = ("none", "short", "sentence", "doc")


def add_engramdb(path: str, n: int, dims: int, batch: int, seed: int, text: list[str] | None = None,
                 peer: str = "") -> tuple[float, float]:
    """(wall s, CPU s) of adding n vectors through the API (the KDF at creation excluded)."""
    content = text or [""] * n
    with engramdb.open(path, passphrase=PASS) as db:
        db.add_space("s", dims=dims, model="bench-random", normalize=False)
        w0, c0 = time.perf_counter(), time.process_time()
        for start in range(0, n, batch):
            mat = vectors(min(batch, n - start), dims, seed, start)
            db.add_many([{"id": f"v{start + i}", "content": content[start + i], "embeddings": {"s": row}}
                         for i, row in enumerate(mat)], now=1.0)
        return time.perf_counter() - w0, time.process_time() - c0


def add_sqlite_vec(path: str, n: int, dims: int, batch: int, seed: int, text: list[str] | None = None,
                   peer: str = "aux") -> tuple[float, float]:
    """The same vectors (and texts) into sqlite-vec, in the same batches, one transaction each."""
    import apsw
    import sqlite_vec

    con = apsw.Connection(path)
    con.enable_load_extension(True)
    con.load_extension(sqlite_vec.loadable_path())
    aux = ", +content text" if text else ""
    con.execute(f"CREATE VIRTUAL TABLE v USING vec0(embedding float[{dims}]{aux})")
    if text and peer == "fts":
        con.execute("CREATE VIRTUAL TABLE t USING fts5(content, content='', contentless_delete=1)")
    w0, c0 = time.perf_counter(), time.process_time()
    for start in range(0, n, batch):
        mat = vectors(min(batch, n - start), dims, seed, start)
        with con:
            if text:
                con.executemany("INSERT INTO v(rowid, embedding, content) VALUES (?, ?, ?)",
                                ((start + i + 1, row.tobytes(), text[start + i]) for i, row in enumerate(mat)))
                if peer == "fts":
                    con.executemany("INSERT INTO t(rowid, content) VALUES (?, ?)",
                                    ((start + i + 1, text[start + i]) for i in range(len(mat))))
            else:
                con.executemany("INSERT INTO v(rowid, embedding) VALUES (?, ?)",
                                ((start + i + 1, row.tobytes()) for i, row in enumerate(mat)))
    out = time.perf_counter() - w0, time.process_time() - c0
    con.close()
    return out


def table_pages(path: str) -> str:
    """Where an engramdb file's bytes are: pages per table (LMDB's own counts) and the free
    pages (copy-on-write: what the last commits freed), read with lmdb directly."""
    import lmdb

    from engramdb.store import TABLES

    env = lmdb.open(path, subdir=False, readonly=True, lock=False, max_dbs=32)
    out, used = [], 0
    with env.begin() as txn:
        for i, name in enumerate(TABLES):
            st = txn.stat(env.open_db(b"t%d" % i, txn=txn, create=False))
            pages = st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]
            used += pages
            if st["entries"]:
                out.append(f"{name} {pages * 4096 / 1e6:.1f}")
        total = env.info()["last_pgno"] + 1
    env.close()
    return f"MB per table: {', '.join(out)}; free and LMDB's own {(total - used) * 4096 / 1e6:.1f}"


def size(path: str) -> int:
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


def add_runs(args: argparse.Namespace) -> None:
    rows: dict[str, list[tuple[float, float, int]]] = {"engramdb": [], "sqlite-vec": []}
    text = texts(args.text, args.n, args.seed) if args.text != "none" else None
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        for run in range(args.runs):
            for name, fn, ext in (("engramdb", add_engramdb, "engram"), ("sqlite-vec", add_sqlite_vec, "sqlite")):
                path = os.path.join(tmp, f"{run}.{ext}")
                try:
                    wall, cpu = fn(path, args.n, args.dims, args.batch, args.seed, text, args.peer)
                except ImportError as exc:
                    print(f"  {name}: skipped ({exc}; pip install apsw-sqlite3mc sqlite-vec)")
                    continue
                rows[name].append((wall, cpu, size(path)))
                print(f"  run {run} {name:10s} add {wall:7.2f} s wall {cpu:7.2f} s CPU  file {size(path) / 1e6:8.1f} MB",
                      flush=True)
                if name == "engramdb" and run == 0:
                    print(f"    {table_pages(path)}", flush=True)
                os.remove(path)
    med = {name: tuple(statistics.median(r[i] for r in got) for i in range(3)) for name, got in rows.items() if got}
    words = sum(len(t.split()) for t in text) / args.n if text else 0.0
    peer = f"sqlite-vec vec0 with the text in {'an auxiliary column' if args.peer == 'aux' else 'an auxiliary column and FTS5'}"
    print(f"\n{args.n} x {args.dims} float32, text {args.text} ({words:.1f} words/memory; {peer if text else 'sqlite-vec vec0'}), "
          f"batches of {args.batch} (one transaction each), medians of {args.runs} runs "
          f"(matrix {args.n * args.dims * 4 / 1e6:.1f} MB), load {os.getloadavg()[0]:.2f}")
    for name, (wall, cpu, nbytes) in med.items():
        print(f"  {name:10s} add {wall:7.2f} s wall {cpu:7.2f} s CPU  {args.n / wall:9.0f} vectors/s  "
              f"file {nbytes / 1e6:8.1f} MB")
    if len(med) == 2:
        e, s = med["engramdb"], med["sqlite-vec"]
        print(f"  engramdb / sqlite-vec: add {e[0] / s[0]:.2f}x wall, {e[1] / s[1]:.2f}x CPU; file {e[2] / s[2]:.2f}x")


def _status() -> dict[str, int]:
    """RssAnon (private memory) and RssFile (pages of mapped files, the LMDB map included:
    shared with the page cache, dropped by the kernel under pressure) of this process, bytes."""
    out = {}
    with open("/proc/self/status") as fp:
        for line in fp:
            if line.startswith(("RssAnon:", "RssFile:")):
                name, value = line.split(":")
                out[name] = int(value.split()[0]) * 1024
    return out


def first_search_child(path: str, dims: int, seed: int) -> None:
    """In a fresh process: open, the first search (loads the matrix), a second; print JSON."""
    import threading

    peak_anon = [0]
    done = threading.Event()

    def sample() -> None:  # the peak of private memory (ru_maxrss also counts the map's file pages)
        while not done.wait(0.005):
            peak_anon[0] = max(peak_anon[0], _status()["RssAnon"])

    threading.Thread(target=sample, daemon=True).start()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    q = vectors(1, dims, seed + 1)[0]
    t0 = time.perf_counter()
    with engramdb.open(path, passphrase=PASS, readonly=True) as db:
        t_open = time.perf_counter() - t0
        with db._store.read() as txn:
            rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            before = _status()
            w0, c0 = time.perf_counter(), time.process_time()
            hits = db.indexes.vectors.search(txn, "s", q, 10)
            first, first_cpu = time.perf_counter() - w0, time.process_time() - c0
            w1 = time.perf_counter()
            db.indexes.vectors.search(txn, "s", q, 10)
            second = time.perf_counter() - w1
            after = _status()
    done.set()
    print(json.dumps({"open": t_open, "first": first, "first_cpu": first_cpu, "second": second, "hits": len(hits),
                      "rss_start": rss0, "rss_before_search": rss1,
                      "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "anon_before": before["RssAnon"], "file_before": before["RssFile"],
                      "anon_after": after["RssAnon"], "file_after": after["RssFile"],
                      "anon_peak": max(peak_anon[0], after["RssAnon"])}))


def first_search(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        path = args.keep or os.path.join(tmp, "big.engram")
        if os.path.exists(path):
            wall = cpu = 0.0  # a file kept from an earlier run (--keep)
        else:
            wall, cpu = add_engramdb(path, args.first_search, args.dims, args.batch, args.seed)
        print(f"built {args.first_search} x {args.dims}: add {wall:.1f} s wall, {cpu:.1f} s CPU, "
              f"file {size(path) / 1e6:.1f} MB", flush=True)
        matrix = args.first_search * args.dims * 4
        runs = []
        for _ in range(args.runs):
            out = subprocess.run([sys.executable, __file__, "--child", path, "--dims", str(args.dims),
                                  "--seed", str(args.seed)], capture_output=True, text=True, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            r = runs[-1]
            print(f"  first search {r['first']:.2f} s wall ({r['first_cpu']:.2f} s CPU), then {r['second'] * 1e3:.1f} ms;"
                  f" peak RSS {r['rss_peak'] / 2**20:.0f} MiB (before the search {r['rss_before_search'] / 2**20:.0f}"
                  f" MiB); private memory (RssAnon) {r['anon_before'] / 2**20:.0f} MiB before, peak"
                  f" {r['anon_peak'] / 2**20:.0f} MiB, after {r['anon_after'] / 2**20:.0f} MiB; mapped file pages"
                  f" {r['file_before'] / 2**20:.0f} -> {r['file_after'] / 2**20:.0f} MiB; matrix {matrix / 2**20:.0f} MiB",
                  flush=True)
        first = statistics.median(r["first"] for r in runs)
        first_cpu = statistics.median(r["first_cpu"] for r in runs)
        peak = statistics.median(r["rss_peak"] for r in runs)
        anon = statistics.median(r["anon_peak"] for r in runs)
        print(f"\nfirst search at {args.first_search} x {args.dims}, median of {len(runs)}: {first:.2f} s wall, "
              f"{first_cpu:.2f} s CPU; peak RSS {peak / 2**20:.0f} MiB = {peak / matrix:.2f}x the matrix "
              f"({matrix / 2**20:.0f} MiB), peak private memory {anon / 2**20:.0f} MiB = {anon / matrix:.2f}x; "
              f"load {os.getloadavg()[0]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--dims", type=int, default=384)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--text", choices=TEXTS, default="none", help="each memory's text (both sides)")
    ap.add_argument("--peer", choices=("aux", "fts"), default="aux",
                    help="how sqlite-vec stores the text: an auxiliary vec0 column, or that and an FTS5 index")
    ap.add_argument("--tmp", default=None, help="directory for the temporary files")
    ap.add_argument("--first-search", type=int, default=0, metavar="N",
                    help="build an N-vector file, then time the first search in fresh processes")
    ap.add_argument("--keep", default=None, metavar="PATH",
                    help="with --first-search: build the file at PATH and keep it (reused when it exists)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        first_search_child(args.child, args.dims, args.seed)
    elif args.first_search:
        first_search(args)
    else:
        add_runs(args)


if __name__ == "__main__":
    main()
