"""The agent loop: add one memory in its own commit, then query. engramdb (encrypted) side
by side with SQLite FTS5 and SQLite3 Multiple Ciphers FTS5 (apsw-sqlite3mc, encrypted), on
the same texts, interleaved round by round.

Run (from the repository root; 1M documents only under the shared lock):

    python tools/bench/bench_loop.py --sizes 10000,100000 --rounds 200
    flock /work/coord/big.lock python tools/bench/bench_loop.py --sizes 1000000 --rounds 200 --rss

Per size: build the three files with the same generated corpus (tools/bench/bench_search.py's
``corpus``, seeded), warm every system on the query set once, then for each round ``i`` and
each system in turn: add memory ``i`` (its own commit), run query ``i`` (*after commit*),
run query ``i`` again (*warm*: nothing committed in between). engramdb then runs three
controls, each followed by query ``i`` once more, in which its own file does not change:
*control* adds memory ``i`` to a scratch file (a commit of the same kind, with its fsync
wait); *sleep* sleeps as long as the round's own add took (wall time); *spin* runs unrelated
Python work touching 8 MB for that long, without sleeping. Nothing the handle caches changes
in any of them, so what they cost a query over *warm* is the CPU's state (caches, branch
predictors) after other work, not engramdb's; after-commit / control is engramdb's own
after-commit work. Also counts the posting blocks and node records engramdb read back from
the file in its after-commit queries. Prints p50 / p99 per system and variant, the ratios,
and engramdb against the peers.
``--rss`` also opens the file in a fresh process, runs every query of both sets and prints
its resident memory (VmRSS / VmHWM from /proc).

Variants (``--variants``) are what "query" means for engramdb; the peers run their FTS5
OR-query in every variant. A variant is a :class:`Variant` in :data:`VARIANTS`: its name, a
``query(db, text)`` function, and an optional ``prepare(db, texts)`` run once on the built
file (e.g. to add edges). ``bm25`` is the tokenized BM25 top-10 through a read transaction;
``recall`` is ``db.recall(text, top_k=10)`` (expansion, BM25, the hop, fusion, boosts) on
the same file given ~1.3 tunnel edges per memory (random pairs: the generated texts have no
entities or topics; the memories the loop adds get none, as in an agent that links tunnels
in maintenance).

``--workdir DIR`` keeps the built files there and reuses them on the next run (same size
and seed; every run adds ``rounds`` memories). Figures go into tools/bench/README.md by
hand; this script never runs inside pytest.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import engramdb  # noqa: E402
from bench_search import corpus, queries  # noqa: E402

PASS = "bench passphrase"


# --- what "query" means for engramdb -------------------------------------------------------------


def _bm25(db: Any, text: str) -> Any:
    idx = db.indexes
    with db._store.read() as txn:
        return idx.bm25.search(txn, idx.tokenizer(text), 10)


@dataclass
class Variant:
    name: str
    query: Callable[[Any, str], Any]
    prepare: Callable[[Any, list[str]], None] | None = None
    label: str = ""


def _recall(db: Any, text: str) -> Any:
    return db.recall(text, top_k=10)


TUNNELS_PER_MEMORY = 1.3  # what link_tunnels gives memories with 2-3 entities and 1-2 topics


def _tunnels(db: Any, texts: list[str]) -> None:
    """Give the file tunnel edges, once: the generated texts have no entities or topics to
    link, so each edge joins two memories drawn at random (seeded), weighted 0.3-1.0 like
    a tunnel's Jaccard score, ``TUNNELS_PER_MEMORY`` per memory, in one transaction."""
    from engramdb.index import iter_nodes
    from engramdb.records import Edge

    with db._store.read() as txn:
        if txn.count("edges"):
            return
        ids = {docno: node.id for docno, node in iter_nodes(txn)}
    docnos = sorted(ids)
    rng = np.random.default_rng(11)
    m = int(TUNNELS_PER_MEMORY * len(docnos))
    a, b = rng.integers(0, len(docnos), size=m), rng.integers(0, len(docnos), size=m)
    weights = rng.uniform(0.3, 1.0, size=m)
    graph = db.indexes.graph

    def link(txn: Any) -> None:
        for i, j, w in zip(a.tolist(), b.tolist(), weights.tolist()):
            if i != j:
                src, dst = docnos[min(i, j)], docnos[max(i, j)]
                graph.put(txn, src, dst, Edge(src=ids[src], dst=ids[dst], kind="tunnel", weight=w,
                                              label="shared entities/topics"), derived=True)

    db._store.write(link)


VARIANTS: dict[str, Variant] = {
    "bm25": Variant("bm25", _bm25, None, "engramdb BM25 top-10 (tokenize + search)"),
    "recall": Variant("recall", _recall, _tunnels, "engramdb recall() top-10, hop over tunnels"),
}


# --- the systems -----------------------------------------------------------------------------------


class Engram:
    label = "engramdb (encrypted)"

    def __init__(self, path: str, texts: list[str] | None, query: Callable[[Any, str], Any],
                 cache_mb: float | None) -> None:
        kw = {} if cache_mb is None else {"cache_mb": cache_mb}
        self.db = engramdb.open(path, passphrase=PASS, **kw)
        if texts is not None:
            for start in range(0, len(texts), 100_000):
                self.db.add_many([{"id": f"d{i}", "content": texts[i], "created_at": 0.0, "last_accessed": 0.0}
                                  for i in range(start, min(len(texts), start + 100_000))], now=0.0)
        self._query = query
        # the control: a commit of the same kind to another file, which changes nothing this
        # handle caches but leaves the CPU's caches as cold as a commit to this file does
        self._scratch_dir = tempfile.mkdtemp(prefix="engram-loop-scratch-")
        self.scratch = engramdb.open(os.path.join(self._scratch_dir, "scratch.engram"), passphrase=PASS)

    def add(self, key: str, text: str) -> None:
        self.db.add({"id": key, "content": text, "created_at": 0.0, "last_accessed": 0.0}, now=0.0)

    def add_elsewhere(self, key: str, text: str) -> None:
        self.scratch.add({"id": key, "content": text, "created_at": 0.0, "last_accessed": 0.0}, now=0.0)

    def query(self, text: str) -> Any:
        return self._query(self.db, text)

    def close(self) -> None:
        self.db.close()
        self.scratch.close()
        shutil.rmtree(self._scratch_dir, ignore_errors=True)


class _Fts:
    def _setup(self, c: Any, texts: list[str] | None) -> None:
        if texts is not None:
            c.execute("CREATE VIRTUAL TABLE docs USING fts5(body)")
            c.execute("BEGIN")
            c.executemany("INSERT INTO docs(body) VALUES (?)", ((t,) for t in texts))
            c.execute("COMMIT")

    def add(self, key: str, text: str) -> None:  # autocommit: one transaction per statement
        self.c.execute("INSERT INTO docs(body) VALUES (?)", (text,))

    def query(self, text: str) -> Any:
        return list(self.c.execute("SELECT rowid FROM docs WHERE docs MATCH ? ORDER BY bm25(docs) LIMIT 10",
                                   (" OR ".join(text.split()),)))

    def close(self) -> None:
        self.c.close()


class Fts5(_Fts):
    label = "SQLite FTS5 (plaintext, WAL)"

    def __init__(self, path: str, texts: list[str] | None) -> None:
        self.c = sqlite3.connect(path, isolation_level=None)
        self.c.execute("PRAGMA journal_mode=WAL")
        self._setup(self.c, texts)


class Fts5MC(_Fts):
    label = "SQLite3MC FTS5 (encrypted, WAL)"

    def __init__(self, path: str, texts: list[str] | None) -> None:
        import apsw

        self.c = apsw.Connection(path)
        self.c.pragma("cipher", "chacha20")
        self.c.pragma("key", PASS)
        self.c.pragma("journal_mode", "wal")
        self._setup(self.c, texts)


def _peer_mc() -> str | None:
    try:
        import apsw  # noqa: F401
    except ImportError:
        return "skipped (pip install apsw-sqlite3mc)"
    return None


# --- measuring -------------------------------------------------------------------------------------


def pct(times: list[float], q: float) -> float:
    s = sorted(times)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def line(label: str, times: list[float]) -> str:
    return f"  {label:<46} p50 {statistics.median(times) * 1e3:8.3f} ms   p99 {pct(times, 0.99) * 1e3:8.3f} ms"


def build(workdir: str, n: int, seed: int, variant_query: Callable[[Any, str], Any],
          cache_mb: float | None, peers: bool = True) -> tuple[dict[str, Any], float]:
    """The systems over the same ``n`` documents (reused from ``workdir`` when built before)."""
    stamp = os.path.join(workdir, f"built-{n}-{seed}.json")
    paths = {"engramdb": os.path.join(workdir, f"loop-{n}.engram"),
             "fts5": os.path.join(workdir, f"loop-{n}.sqlite"),
             "fts5mc": os.path.join(workdir, f"loop-{n}-mc.sqlite")}
    fresh = not os.path.exists(stamp)
    texts = corpus(n, seed) if fresh else None
    t0 = time.perf_counter()
    systems: dict[str, Any] = {"engramdb": Engram(paths["engramdb"], texts, variant_query, cache_mb)}
    if peers or fresh:  # a fresh build makes every file, so that a later run with the peers can reuse them
        systems["fts5"] = Fts5(paths["fts5"], texts)
        if _peer_mc() is None:
            systems["fts5mc"] = Fts5MC(paths["fts5mc"], texts)
    seconds = time.perf_counter() - t0
    if not peers:
        for name in [name for name in systems if name != "engramdb"]:
            systems.pop(name).close()
    if fresh:
        with open(stamp, "w") as fh:
            json.dump({"n": n, "seed": seed, "build_s": seconds}, fh)
    return systems, seconds if fresh else 0.0


_JUNK = bytearray(8 << 20)


def _spin(seconds: float) -> None:
    """Unrelated work for ``seconds`` of wall time, never sleeping: writes every 64th byte of 8 MB."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        _JUNK[::64] = bytes(len(_JUNK) // 64)


CONTROLS = ("control", "sleep", "spin")


def loop(systems: dict[str, Any], adds: list[str], qs: list[str], tag: str,
         clock: Callable[[], float] = time.perf_counter) -> dict[str, dict[str, list[float]]]:
    """Round ``i``, each system in turn: add ``adds[i]`` (own commit), query ``qs[i]`` (after
    commit), query ``qs[i]`` again (warm); engramdb then runs the controls (module docstring),
    each followed by ``qs[i]`` once more: a commit to a scratch file, a sleep and unrelated
    work as long as its own add took. Nothing changes in its file meanwhile."""
    out: dict[str, dict[str, list[float]]] = {name: {"add": [], "after": [], "warm": [], **{c: [] for c in CONTROLS}}
                                              for name in systems}
    for i, (text, q) in enumerate(zip(adds, qs)):
        for name, sys_ in systems.items():
            w0 = time.perf_counter()
            t0 = clock()
            sys_.add(f"{tag}{i}", text)
            t1 = clock()
            wall = time.perf_counter() - w0
            sys_.query(q)
            t2 = clock()
            sys_.query(q)
            t3 = clock()
            rec = out[name]
            rec["add"].append(t1 - t0)
            rec["after"].append(t2 - t1)
            rec["warm"].append(t3 - t2)
            if hasattr(sys_, "add_elsewhere"):
                for control in CONTROLS:
                    if control == "control":
                        sys_.add_elsewhere(f"{tag}{i}", text)
                    elif control == "sleep":
                        time.sleep(wall)
                    else:
                        _spin(wall)
                    t4 = clock()
                    sys_.query(q)
                    rec[control].append(clock() - t4)
    return out


def read_back(db: Any) -> tuple[int, int]:
    """(posting blocks, node records) this handle has read from the file and decoded so far."""
    return int(db.indexes.bm25.blocks_decoded), int(db.indexes.node_cache.decoded)


def rss_child(path: str, n_queries: int, seed: int, cache_mb: float | None) -> None:
    """Open ``path`` in this (fresh) process, run both query sets, print resident memory."""
    def status() -> dict[str, float]:
        out = {}
        with open("/proc/self/status") as fh:
            for row in fh:
                if row.startswith(("VmRSS:", "VmHWM:")):
                    out[row.split(":")[0]] = int(row.split()[1]) / 1024
        return out

    base = status()
    kw = {} if cache_mb is None else {"cache_mb": cache_mb}
    db = engramdb.open(path, passphrase=PASS, **kw)
    opened = status()
    for kind in ("mid", "common"):
        for q in queries(n_queries, seed, kind):
            _bm25(db, q)
    done = status()
    cache = getattr(db.indexes.bm25, "cache_nbytes", lambda: None)()
    print(json.dumps({"before_open": base, "after_open": opened, "after_queries": done,
                      "postings_cache_mb": None if cache is None else cache / 2**20}))
    db.close()


def run_size(args: argparse.Namespace, n: int, workdir: str) -> None:
    print(f"\n=== {n} documents ===  (load average {os.getloadavg()[0]:.2f})", flush=True)
    for vname in args.variants.split(","):
        variant = VARIANTS[vname]
        systems, built = build(workdir, n, args.seed, variant.query, args.cache_mb, not args.no_peers)
        if built:
            print(f"  built the files in {built:.1f} s")
        try:
            if variant.prepare is not None:
                variant.prepare(systems["engramdb"].db, [])
            if "fts5mc" not in systems and not args.no_peers:
                print(f"  SQLite3MC: {_peer_mc()}")
            adds = corpus(args.rounds, args.seed + 1000 + n % 997)
            for kind in args.kinds.split(","):
                qs = queries(args.rounds, args.seed, kind)
                for sys_ in systems.values():  # warm: every query once
                    for q in qs:
                        sys_.query(q)
                before = read_back(systems["engramdb"].db)
                res = loop(systems, adds, qs, f"loop-{vname}-{kind}-{time.time_ns()}-",
                           time.process_time if args.cpu else time.perf_counter)
                blocks, nodes = (a - b for a, b in zip(read_back(systems["engramdb"].db), before))
                print(f"\n  [{vname}] {kind} queries, {args.rounds} rounds{', CPU time' if args.cpu else ''} "
                      f"(load average {os.getloadavg()[0]:.2f})", flush=True)
                for name, rec in res.items():
                    label = variant.label if name == "engramdb" else systems[name].label
                    print(line(f"{label}: add 1 (own commit)", rec["add"]))
                    print(line(f"{label}: query after commit", rec["after"]))
                    print(line(f"{label}: warm query", rec["warm"]))
                    if rec["control"]:
                        print(line(f"{label}: control (commit elsewhere)", rec["control"]))
                        print(line(f"{label}: control (sleep as long)", rec["sleep"]))
                        print(line(f"{label}: control (other work as long)", rec["spin"]))
                ours = res["engramdb"]
                m = {k: statistics.median(v) for k, v in ours.items()}
                print(f"  engramdb query after commit / warm: {m['after'] / m['warm']:.2f}x; "
                      f"after commit / control: {m['after'] / m['control']:.2f}x; control / warm: "
                      f"{m['control'] / m['warm']:.2f}x; sleep / warm: {m['sleep'] / m['warm']:.2f}x; "
                      f"other work / warm: {m['spin'] / m['warm']:.2f}x")
                print(f"  engramdb read back from the file during the loop (all its queries): {blocks} posting "
                      f"blocks, {nodes} node records")
                for peer in ("fts5", "fts5mc"):
                    if peer in res:
                        p = {k: statistics.median(v) for k, v in res[peer].items() if v}
                        print(f"  {systems[peer].label} / engramdb (p50): add {p['add'] / m['add']:.2f}x, "
                              f"query after commit {p['after'] / m['after']:.2f}x, "
                              f"add + query {(p['add'] + p['after']) / (m['add'] + m['after']):.2f}x")
        finally:
            for sys_ in systems.values():
                sys_.close()
    if args.rss:
        cmd = [sys.executable, os.path.abspath(__file__), "--rss-child", os.path.join(workdir, f"loop-{n}.engram"),
               "--rounds", str(args.rounds), "--seed", str(args.seed)]
        if args.cache_mb is not None:
            cmd += ["--cache-mb", str(args.cache_mb)]
        out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        print(f"\n  query process memory ({2 * args.rounds} BM25 queries, fresh process): "
              f"VmRSS {out['after_queries']['VmRSS']:.0f} MB, peak VmHWM {out['after_queries']['VmHWM']:.0f} MB "
              f"(after import {out['before_open']['VmRSS']:.0f} MB, after open {out['after_open']['VmRSS']:.0f} MB; "
              f"postings cache {out['postings_cache_mb']} MB)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--variants", default="bm25", help=f"comma-separated, of {sorted(VARIANTS)}")
    ap.add_argument("--cache-mb", type=float, default=None, help="engramdb.open(cache_mb=) (default: the default)")
    ap.add_argument("--cpu", action="store_true",
                    help="time with this process's CPU time instead of wall time (steadier on a loaded machine; "
                         "leaves out waiting for the disk)")
    ap.add_argument("--kinds", default="mid,common", help="query sets to run (of mid, common)")
    ap.add_argument("--no-peers", action="store_true",
                    help="engramdb alone (the peers' files are still built on a fresh --workdir)")
    ap.add_argument("--rss", action="store_true", help="also measure a fresh query process's memory")
    ap.add_argument("--workdir", help="keep the built files here and reuse them")
    ap.add_argument("--rss-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_child:
        rss_child(args.rss_child, args.rounds, args.seed, args.cache_mb)
        return
    print(f"machine: {platform.platform()}, {os.cpu_count()} cpus, python {platform.python_version()}, "
          f"numpy {np.__version__}, sqlite {sqlite3.sqlite_version}")
    workdir = args.workdir or tempfile.mkdtemp(prefix="engram-loop-")
    os.makedirs(workdir, exist_ok=True)
    try:
        for n in (int(s) for s in args.sizes.split(",")):
            run_size(args, n, workdir)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
