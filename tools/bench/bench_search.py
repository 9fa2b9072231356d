"""Search benchmark: engramdb (encrypted) side by side with bm25s, SQLite FTS5, encrypted
SQLite FTS5 (SQLite3 Multiple Ciphers via apsw-sqlite3mc) and sqlite-vec, on the same texts.

Run (from the repository root; one run, a few minutes at 100k documents):

    python tools/bench/bench_search.py --docs 100000 --queries 200 \
        --out tools/bench/results/$(date +%F)-$(hostname)-search.txt

Optional peers: ``pip install apsw-sqlite3mc sqlite-vec`` (skipped with a note when
missing). The corpus is generated, seeded: ~60-token documents drawn with Zipf-like
frequencies from the vocabulary of the two Gutenberg texts in ../shared/data (falling back
to a synthetic vocabulary). Queries are 3-5 distinct mid-frequency words.

Prints medians (and p90) per system, ratios, and the machine. Figures go into
tools/bench/README.md by hand; this script never runs inside pytest.
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import Counter

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import engramdb.engram as engram_mod
from engramdb import _accel
from engramdb.index.vectors import EmbeddingSpace, VectorIndex
from engramdb.crypto import Sealer
from engramdb.store import Store

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.join(HERE, "..", "..", "..", "shared", "data", "gutenberg")


def vocabulary(seed: int) -> tuple[list[str], np.ndarray]:
    words: Counter = Counter()
    for name in ("pride_and_prejudice_pg1342.txt", "origin_of_species_pg1228.txt"):
        path = os.path.join(SHARED, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as fh:
                words.update(re.findall(r"[a-z]{2,}", fh.read().lower()))
    if len(words) < 1000:
        rng = np.random.default_rng(seed)
        words = Counter({"w" + "".join(rng.choice(list("abcdefghij"), 6)): 1 for _ in range(30_000)})
    vocab = sorted(words, key=lambda w: (-words[w], w))
    ranks = np.arange(1, len(vocab) + 1, dtype=np.float64)
    p = 1.0 / ranks ** 1.07
    return vocab, p / p.sum()


def corpus(n: int, seed: int) -> list[str]:
    vocab, p = vocabulary(seed)
    rng = np.random.default_rng(seed)
    lengths = rng.integers(40, 81, size=n)
    ids = rng.choice(len(vocab), size=int(lengths.sum()), p=p)
    out, pos = [], 0
    for ln in lengths:
        out.append(" ".join(vocab[i] for i in ids[pos:pos + ln]))
        pos += ln
    return out


def queries(n: int, seed: int, kind: str = "mid") -> list[str]:
    """``mid``: 3-5 words uniform over frequency ranks 200-6000 (short posting lists);
    ``common``: 3-5 words drawn by corpus frequency from rank 30 on (long posting lists,
    closer to natural questions); ``one``: one word drawn as ``common``'s (a single-term
    query: a term's best documents, spec/bm25.md)."""
    vocab, p = vocabulary(seed)
    rng = np.random.default_rng(seed + {"mid": 1, "common": 2, "one": 3}[kind])
    if kind == "mid":
        mid = vocab[200:6000]
        return [" ".join(rng.choice(mid, size=int(rng.integers(3, 6)), replace=False)) for _ in range(n)]
    tail, tp = vocab[30:], p[30:] / p[30:].sum()
    if kind == "one":
        return [str(w) for w in rng.choice(tail, size=n, p=tp)]
    return [" ".join(rng.choice(tail, size=int(rng.integers(3, 6)), replace=False, p=tp)) for _ in range(n)]


def timed(fn, items) -> list[float]:
    out = []
    for item in items:
        t = time.perf_counter()
        fn(item)
        out.append(time.perf_counter() - t)
    return out


def interleaved(systems: dict, n: int) -> dict[str, list[float]]:
    """Time ``systems[name] = (fn, items)`` round-robin, item by item, so that noise from
    other processes on a shared machine hits every system alike."""
    out: dict[str, list[float]] = {name: [] for name in systems}
    for i in range(n):
        for name, (fn, items) in systems.items():
            if i < len(items):
                t = time.perf_counter()
                fn(items[i])
                out[name].append(time.perf_counter() - t)
    return out


def blocked(systems: dict, rounds: int = 3) -> dict[str, list[float]]:
    """Time ``systems[name] = (fn, items)`` each over all its items back to back, systems
    taking turns for ``rounds`` rounds: each system runs with its own working set in the
    CPU caches, as in a process that serves queries one after another."""
    out: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(rounds):
        for name, (fn, items) in systems.items():
            out[name].extend(timed(fn, items))
    return out


def summary(name: str, times: list[float]) -> dict:
    med = statistics.median(times)
    p90 = sorted(times)[int(0.9 * (len(times) - 1))]
    print(f"  {name:<34} median {med * 1e3:9.3f} ms   p90 {p90 * 1e3:9.3f} ms   {1 / med:10.1f} /s", flush=True)
    return {"median": med, "p90": p90}


class _Tee:
    def __init__(self, *streams) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--dims", type=int, default=384)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--ingest-rounds", type=int, default=3)
    ap.add_argument("--ingest-only", action="store_true", help="stop after the bulk-ingest comparison")
    ap.add_argument("--out", help="also write the report to this file (e.g. tools/bench/results/DATE-HOST-search.txt)")
    args = ap.parse_args()
    if args.out:
        sys.stdout = _Tee(sys.stdout, open(args.out, "w", encoding="utf-8"))  # noqa: SIM115 (closed at exit)
    tmp = tempfile.mkdtemp(prefix="engram-bench-")
    try:
        run(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(args, tmp: str) -> None:
    print(f"machine: {platform.platform()}, {os.cpu_count()} cpus, python {platform.python_version()}, "
          f"numpy {np.__version__}")
    texts = corpus(args.docs, args.seed)
    print(f"corpus: {len(texts)} docs, {sum(len(t.split()) for t in texts) / len(texts):.1f} words/doc; "
          f"{args.queries} queries of 3-5 words per query set\n")
    results: dict[str, dict] = {}

    # --- ingest ------------------------------------------------------------------------------
    print(f"bulk ingest (one transaction per system; {args.ingest_rounds} rounds, systems taking turns, fresh files)")
    path = os.path.join(tmp, "bench.engram")
    t0 = time.perf_counter()
    db = engram_mod.open(path, passphrase="bench passphrase")  # default argon2id (t=3, m=64 MiB, p=4)
    kdf_s = time.perf_counter() - t0

    cpu: dict[str, list[float]] = {"engramdb": [], "fts5": [], "fts5mc": []}  # process CPU seconds per round

    def ingest_engramdb(rnd: int) -> float:
        target = db if rnd == 0 else engram_mod.open(os.path.join(tmp, f"r{rnd}.engram"), passphrase="bench passphrase")
        t, c = time.perf_counter(), time.process_time()
        target.add_many([{"id": f"d{i}", "content": text, "created_at": 0.0, "last_accessed": 0.0}
                         for i, text in enumerate(texts)])
        seconds = time.perf_counter() - t
        cpu["engramdb"].append(time.process_time() - c)
        if rnd:  # the first round's file serves the queries below
            target.close()
        return seconds

    def ingest_sql(connect, rnd: int, name: str):
        c = connect(rnd)
        c.execute("CREATE VIRTUAL TABLE docs USING fts5(body)")
        t, cp = time.perf_counter(), time.process_time()
        with c:
            c.executemany("INSERT INTO docs(rowid, body) VALUES (?, ?)", ((i + 1, text) for i, text in enumerate(texts)))
        seconds = time.perf_counter() - t
        cpu[name].append(time.process_time() - cp)
        return seconds, c

    def fts_connect(rnd: int):
        c = sqlite3.connect(os.path.join(tmp, f"fts{rnd}.sqlite"))
        c.execute("PRAGMA journal_mode=WAL")
        return c

    mc_connect = None
    try:
        import apsw

        def mc_connect(rnd: int):
            c = apsw.Connection(os.path.join(tmp, f"fts-mc{rnd}.sqlite"))
            c.pragma("cipher", "chacha20")
            c.pragma("key", "bench passphrase")
            return c
    except ImportError:
        pass
    times: dict[str, list[float]] = {"engramdb": [], "fts5": [], "fts5mc": []}
    con = mc = None
    for rnd in range(args.ingest_rounds):
        times["engramdb"].append(ingest_engramdb(rnd))
        seconds, con = ingest_sql(fts_connect, rnd, "fts5")
        times["fts5"].append(seconds)
        if mc_connect is not None:
            seconds, mc = ingest_sql(mc_connect, rnd, "fts5mc")
            times["fts5mc"].append(seconds)
    rates = {name: sorted(len(texts) / s for s in ts) for name, ts in times.items() if ts}
    for name, label in (("engramdb", "engramdb (encrypted, postings)"), ("fts5", "sqlite3 FTS5 (plaintext)"),
                        ("fts5mc", "SQLite3MC FTS5 (encrypted)")):
        if name in rates:
            print(f"  {label:<34} median {statistics.median(rates[name]):8.0f} docs/s  "
                  f"(rounds: {', '.join(f'{r:.0f}' for r in rates[name])}); "
                  f"CPU median {statistics.median(cpu[name]):.2f} s = {statistics.median(cpu[name]) / len(texts) * 1e6:.1f} us/doc")
    if mc_connect is None:
        print("  SQLite3MC FTS5: skipped (pip install apsw-sqlite3mc)")
    ours_rate = statistics.median(rates["engramdb"])
    print(f"  ratio of medians engramdb / FTS5 insert: {ours_rate / statistics.median(rates['fts5']):.2f}x"
          + (f"; engramdb / SQLite3MC: {ours_rate / statistics.median(rates['fts5mc']):.2f}x" if "fts5mc" in rates else ""))
    ours_cpu = statistics.median(cpu["engramdb"])
    print(f"  ratio of CPU medians (peer / engramdb; above 1: engramdb uses less): FTS5 "
          f"{statistics.median(cpu['fts5']) / ours_cpu:.2f}x"
          + (f", SQLite3MC {statistics.median(cpu['fts5mc']) / ours_cpu:.2f}x" if cpu["fts5mc"] else ""))
    print(f"  engramdb C extension: {'yes' if _accel.NATIVE is not None else 'no (pure Python)'}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.ingest_only:
        return

    # --- BM25 queries ------------------------------------------------------------------------
    idx = db.indexes
    tok = idx.tokenizer
    store = db._store

    def ours(terms):
        with store.read() as txn:
            return idx.bm25.search(txn, terms, 10)

    import bm25s

    doc_terms = [tok(t) for t in texts]
    retriever = bm25s.BM25(k1=1.2, b=0.75, method="lucene", backend="numpy")  # numpy scoring backend
    retriever.index(doc_terms, show_progress=False)
    vocab = retriever.vocab_dict

    def theirs(terms):
        known = [t for t in terms if t in vocab]
        scores = retriever.get_scores(known)
        top = np.argpartition(-scores, 10)[:10]
        return top[np.lexsort((top, -scores[top]))]

    def theirs_retrieve(terms):  # the library's own top-k API, as a user calls it
        known = [t for t in terms if t in vocab]
        return retriever.retrieve([known], k=10, show_progress=False, n_threads=0) if known else None

    def fts_or(q, c=con):
        return c.execute("SELECT rowid FROM docs WHERE docs MATCH ? ORDER BY bm25(docs) LIMIT 10",
                         (" OR ".join(q.split()),)).fetchall()

    def mc_or(q):
        return list(mc.execute("SELECT rowid FROM docs WHERE docs MATCH ? ORDER BY bm25(docs) LIMIT 10",
                               (" OR ".join(q.split()),)))

    labels = {"engramdb": "engramdb BM25 (encrypted)", "recall": "engramdb recall() full pipeline",
              "recall_filter": "engramdb recall(tiers=['hot'])",
              "bm25s": "bm25s get_scores + argpartition", "bm25s_retrieve": "bm25s retrieve(k=10)",
              "fts5": "sqlite3 FTS5 OR-query",
              "fts5mc": "SQLite3MC FTS5 OR-query (encrypted)"}
    for kind in ("mid", "common"):
        qs = queries(args.queries, args.seed, kind)
        q_terms = [tok(q) for q in qs]
        what = {"mid": "3-5 words uniform over frequency ranks 200-6000: short posting lists",
                "common": "3-5 words drawn by corpus frequency from rank 30 on: long posting lists"}[kind]
        print(f"\nBM25 top-10, warm cache, {kind} queries ({what})")
        for terms, q in zip(q_terms, qs):  # warm cache: every query's postings decoded once
            ours(terms)
            db.recall(q, top_k=10)
            db.recall(q, top_k=10, tiers=["hot"])
        systems = {"engramdb": (ours, q_terms), "recall": (lambda q: db.recall(q, top_k=10), qs),
                   "recall_filter": (lambda q: db.recall(q, top_k=10, tiers=["hot"]), qs),
                   "bm25s": (theirs, q_terms), "bm25s_retrieve": (theirs_retrieve, q_terms), "fts5": (fts_or, qs)}
        if mc is not None:
            systems["fts5mc"] = (mc_or, qs)
        print("  interleaved (query i of every system, then query i+1: caches shared with the peers)")
        for name, times in interleaved(systems, len(qs)).items():
            results[f"{kind}:{name}"] = summary(labels[name], times)
        print("  back to back (each system runs all its queries in turn, 3 rounds: its own warm caches)")
        for name, times in blocked(systems).items():
            results[f"{kind}:{name}:blocked"] = summary(labels[name], times)
        same = 0
        with store.read() as txn:
            for terms in q_terms:
                mine = [d - 1 for d, _ in idx.bm25.search(txn, terms, 10)]  # docno = position + 1
                known = [t for t in terms if t in vocab]
                full = np.asarray(retriever.get_scores(known), dtype=np.float64)
                top = np.lexsort((np.arange(len(full)), -full))[:10]
                same += mine == [int(i) for i in top if full[i] > 0]
        print(f"  same top-10 as bm25s (bm25s scores in float32; ties by docno): {same}/{len(q_terms)} queries")
        for mode, suffix in (("interleaved", ""), ("back to back", ":blocked")):
            m = results[f"{kind}:engramdb{suffix}"]["median"]
            print(f"  {mode}: engramdb is {results[f'{kind}:bm25s{suffix}']['median'] / m:.1f}x bm25s get_scores, "
                  + f"{results[f'{kind}:bm25s_retrieve{suffix}']['median'] / m:.1f}x bm25s retrieve, "
                  + f"{results[f'{kind}:fts5{suffix}']['median'] / m:.1f}x FTS5"
                  + (f", {results[f'{kind}:fts5mc{suffix}']['median'] / m:.1f}x SQLite3MC FTS5" if mc is not None else ""))

    # --- cold open ------------------------------------------------------------------------------
    db.close()
    t0 = time.perf_counter()
    db = engram_mod.open(path, passphrase="bench passphrase")
    t_open = time.perf_counter() - t0
    t1 = time.perf_counter()
    db.recall(queries(1, args.seed + 99, "common")[0], top_k=10)
    t_first = time.perf_counter() - t1
    print(f"\ncold open + first query: open {t_open:.3f} s (argon2id ~{kdf_s:.3f} s at creation), "
          f"first recall {t_first:.3f} s; size {os.path.getsize(path) / 1e6:.1f} MB")
    db.close()

    # --- vectors -----------------------------------------------------------------------------------
    print(f"\nexact vector top-10, {args.docs} x {args.dims} float32")
    rng = np.random.default_rng(args.seed)
    mat = rng.standard_normal((args.docs, args.dims)).astype(np.float32)
    mat /= np.linalg.norm(mat, axis=1, keepdims=True)
    qv = rng.standard_normal((args.queries, args.dims)).astype(np.float32)
    vstore = Store.open(os.path.join(tmp, "vec.engram"))
    vstore.sealer = Sealer(os.urandom(32))
    vi = VectorIndex(vstore.blind, vstore.last_txnid)
    vstore.write(lambda txn: vi.add_space(txn, EmbeddingSpace("s", "bench-random", args.dims, normalize=False)))

    class Row:  # the index reads only .embeddings; a Node would copy 384 floats into a tuple
        __slots__ = ("embeddings",)

        def __init__(self, vec):
            self.embeddings = {"s": vec}

    t0 = time.perf_counter()
    for start in range(0, args.docs, 20_000):
        rows = [(i + 1, Row(mat[i])) for i in range(start, min(args.docs, start + 20_000))]
        vstore.write(lambda txn, rows=rows: vi.apply(txn, rows, [""] * len(rows), []))
    print(f"  engramdb vector ingest               {args.docs / (time.perf_counter() - t0):10.0f} vectors/s")
    with vstore.read() as txn:
        vi.search(txn, "s", qv[0], 10)  # load the matrix

    def ours_vec(q):
        with vstore.read() as txn:
            return vi.search(txn, "s", q, 10)

    def bare(q):
        s = mat @ q
        top = np.argpartition(-s, 10)[:10]
        return top[np.argsort(-s[top])]

    times = interleaved({"vec": (ours_vec, qv), "numpy": (bare, qv)}, len(qv))
    results["vec"] = summary("engramdb exact (encrypted)", times["vec"])
    results["numpy"] = summary("bare numpy matvec + argpartition", times["numpy"])
    print(f"  engramdb / bare numpy: {results['vec']['median'] / results['numpy']['median']:.2f}x")
    try:
        import apsw
        import sqlite_vec

        # python's sqlite3 here is built without extension loading; apsw loads sqlite-vec
        vcon = apsw.Connection(os.path.join(tmp, "vec.sqlite"))
        vcon.enable_load_extension(True)
        vcon.load_extension(sqlite_vec.loadable_path())
        vcon.execute(f"CREATE VIRTUAL TABLE v USING vec0(embedding float[{args.dims}])")
        with vcon:
            vcon.executemany("INSERT INTO v(rowid, embedding) VALUES (?, ?)",
                             ((i + 1, mat[i].tobytes()) for i in range(args.docs)))

        def vec_q(q):
            return list(vcon.execute("SELECT rowid FROM v WHERE embedding MATCH ? AND k = 10 ORDER BY distance",
                                     (q.tobytes(),)))

        results["sqlite-vec"] = summary("sqlite-vec exact (vec0, plaintext)", timed(vec_q, qv[:50]))
        print(f"  sqlite-vec / engramdb: {results['sqlite-vec']['median'] / results['vec']['median']:.1f}x")
    except (ImportError, AttributeError) as exc:
        print(f"  sqlite-vec: skipped ({exc}; pip install apsw-sqlite3mc sqlite-vec)")
    vstore.close()


if __name__ == "__main__":
    main()
