"""Write benchmark: engramdb (encrypted) side by side with SQLite FTS5 and encrypted SQLite
FTS5 (SQLite3 Multiple Ciphers via apsw-sqlite3mc), on the same texts (issue 15, writes).

Run (from the repository root; 1M documents only under the shared lock):

    python tools/bench/bench_writes.py --sizes 10000 100000 --runs 3 \\
        --out tools/bench/results/$(date +%F)-$(hostname)-writes.txt
    flock /work/coord/big.lock python tools/bench/bench_writes.py --sizes 1000000 --runs 1 \\
        --texts texts-1M.txt --extra extra-3000.txt --workdir DIR --systems engramdb,fts5,fts5mc

``--texts``/``--extra`` read the documents from files (one a line) instead of generating
them; ``--workdir`` keeps each system's ingested file (``engram-1M.engram``,
``fts5-1M.sqlite``, ``fts5mc-1M.sqlite``, with ``NAME.done`` when finished) and reuses the
finished ones on the next run, whose ingest is then not measured again.

Per size N, for every system:

* **bulk ingest**: N documents in one transaction, in a child process per system, its
  docs/s and its extra memory (peak resident set during the ingest minus the resident set
  just before it; the peak is reset through /proc/self/clear_refs where the kernel allows),
  split into heap (anonymous) and memory-mapped file pages by sampling every 20 ms;
  ``--child engramdb-import TEXTS FILE N`` measures the same for ``Engram.import_many``
  (one commit per ``INGEST_CHUNK``) instead of one ``add_many``;
* **add 1,000 to an existing file**: a copy of the N-document file (flushed to the disk
  before anything is timed, for every system), 1,000 new documents in one transaction
  (open not timed);
* **delete 10 %**: a copy of the N-document file, N/10 random documents deleted in one
  transaction; then the file size before and after compaction (engramdb:
  ``merge_indexes(force=True)`` then ``compact()``; SQLite: FTS5 ``optimize`` then
  ``VACUUM``), against the N-document file as ingested.

``--runs`` repeats the add and delete measures (fresh copies each time, the systems taking
turns) and reports medians and ratios (peer seconds / engramdb seconds: above 1 means
engramdb is faster). The corpus is bench_search.py's (seeded, ~60 words per document).
Figures go into tools/bench/README.md by hand; this script never runs inside pytest.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from bench_search import _Tee  # noqa: E402 (after the path set-up)
from engramdb.store import page_owners, pages_written  # noqa: E402 (after the path set-up)

PASSPHRASE = "bench passphrase"
SYSTEMS = ("engramdb", "fts5", "fts5mc")
FILE_PREFIX = {"engramdb": "engram", "fts5": "fts5", "fts5mc": "fts5mc"}  # --workdir file names
LABELS = {"engramdb": "engramdb (encrypted)", "fts5": "SQLite FTS5 (plaintext)", "fts5mc": "SQLite3MC FTS5 (encrypted)"}


def _mc_available() -> bool:
    try:
        import apsw  # noqa: F401
    except ImportError:
        return False
    return True


# --- the systems ----------------------------------------------------------------------


def _sql_connect(system: str, path: str) -> Any:
    if system == "fts5":
        c = sqlite3.connect(path, isolation_level=None)
        c.execute("PRAGMA journal_mode=WAL")
        return c
    import apsw

    c = apsw.Connection(path)
    c.pragma("cipher", "chacha20")
    c.pragma("key", PASSPHRASE)
    c.pragma("journal_mode", "wal")
    return c


def _sql_write(c: Any, sql: str, rows: Any) -> None:
    c.execute("BEGIN")
    try:
        c.executemany(sql, rows)
    except BaseException:
        c.execute("ROLLBACK")
        raise
    c.execute("COMMIT")


def _sql_close(c: Any) -> None:
    if isinstance(c, sqlite3.Connection):
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    else:
        c.pragma("wal_checkpoint", "TRUNCATE")
    c.close()


def _engram_open(path: str) -> Any:
    import engramdb

    return engramdb.open(path, passphrase=PASSPHRASE)


def _item(i: int, text: str) -> dict[str, Any]:
    return {"id": f"d{i}", "content": text, "created_at": 0.0, "last_accessed": 0.0}


def _files(system: str, path: str) -> list[str]:
    if system == "engramdb":
        return [path] + [path + s for s in ("-lock", "-maint") if os.path.exists(path + s)]
    return [p for p in (path, path + "-wal", path + "-shm") if os.path.exists(p)]


def _size(system: str, path: str) -> int:
    return os.path.getsize(path) + (os.path.getsize(path + "-wal") if os.path.exists(path + "-wal") else 0)


def _copy(system: str, src: str, dst: str) -> None:
    """Copy a system's files and flush the copies to the disk, so the measured operation
    starts from a file at rest (an existing file): otherwise the first fsync inside it (LMDB's
    commit; SQLite's WAL commit syncs only the WAL) also writes back the whole fresh copy."""
    for f in _files(system, src):
        if not f.endswith(("-lock", "-maint")):
            shutil.copyfile(f, dst + f[len(src):])
            fd = os.open(dst + f[len(src):], os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


# --- ingest (child process: its own peak memory) ------------------------------------


def _status() -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile of this process in bytes."""
    vals = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS:", "VmHWM:", "RssAnon:", "RssFile:")):
                key, value = line.split(":")
                vals[key] = int(value.split()[0]) * 1024
    return vals


def _reset_peak() -> bool:
    """Reset this process's peak RSS (Linux 4.0+); False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _rss() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in bytes."""
    vals = _status()
    return vals["VmRSS"], vals["VmHWM"]


class _Sampler(threading.Thread):
    """The peak anonymous (heap) and file-backed resident memory, sampled every 20 ms: an
    LMDB file's pages read through its memory map count as resident file pages (page
    cache, shared and reclaimable), SQLite's as neither."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.anon = self.file = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.02):
            vals = _status()
            self.anon, self.file = max(self.anon, vals["RssAnon"]), max(self.file, vals["RssFile"])


def child_ingest(system: str, texts_path: str, path: str, n: str) -> None:
    with open(texts_path, encoding="utf-8") as fh:
        texts = fh.read().split("\n")[:int(n)]
    if system.startswith("engramdb"):
        db = _engram_open(path)
        items = [_item(i, t) for i, t in enumerate(texts)]
    else:
        c = _sql_connect(system, path)
        c.execute("CREATE VIRTUAL TABLE docs USING fts5(body)")
        items = [(i + 1, t) for i, t in enumerate(texts)]
    reset = _reset_peak()  # so the peak measures the ingest alone
    before = _rss()[0]
    base = _status()
    sampler = _Sampler()
    sampler.start()
    t = time.perf_counter()
    cpu = time.process_time()
    if system == "engramdb":
        db.add_many(items)
    elif system == "engramdb-import":
        db.import_many(items)
    else:
        _sql_write(c, "INSERT INTO docs(rowid, body) VALUES (?, ?)", items)
    seconds, cpu = time.perf_counter() - t, time.process_time() - cpu
    peak = _rss()[1]
    sampler.stop.set()
    sampler.join()
    anon, file = sampler.anon - base["RssAnon"], sampler.file - base["RssFile"]
    if system.startswith("engramdb"):
        db.close()
    else:
        _sql_close(c)
    print(json.dumps({"seconds": seconds, "cpu": cpu, "before": before, "peak": peak, "reset": reset,
                      "anon": anon, "file": file}))


def ingest(system: str, texts_path: str, path: str, n: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", system, texts_path, path, str(n)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- operations on a copy ----------------------------------------------------------------


def add_docs(system: str, path: str, texts: list[str], first: int) -> tuple[float, float]:
    """Add ``texts`` (ids from ``first``) in one transaction; (wall s, CPU s), open and close excluded."""
    if system == "engramdb":
        db = _engram_open(path)
        items = [_item(first + i, t) for i, t in enumerate(texts)]
        t, cpu = time.perf_counter(), time.process_time()
        db.add_many(items)
        out = time.perf_counter() - t, time.process_time() - cpu
        db.close()
        return out
    c = _sql_connect(system, path)
    rows = [(first + i + 1, t) for i, t in enumerate(texts)]
    t, cpu = time.perf_counter(), time.process_time()
    _sql_write(c, "INSERT INTO docs(rowid, body) VALUES (?, ?)", rows)
    out = time.perf_counter() - t, time.process_time() - cpu
    _sql_close(c)
    return out


def _delete(system: str, path: str, victims: list[int], each: bool = False) -> tuple[float, float]:
    """Delete ``victims`` in one transaction; (wall s, CPU s) of the delete, open and close excluded."""
    if system == "engramdb":
        db = _engram_open(path)
        t, cpu = time.perf_counter(), time.process_time()
        if each:  # one Transaction.delete per memory, one transaction
            with db.transaction() as tx:
                for i in victims:
                    tx.delete(f"d{i}")
        else:
            db.delete_many([f"d{i}" for i in victims])
        out = time.perf_counter() - t, time.process_time() - cpu
        db.close()
        return out
    c = _sql_connect(system, path)
    t, cpu = time.perf_counter(), time.process_time()
    _sql_write(c, "DELETE FROM docs WHERE rowid = ?", [(i + 1,) for i in victims])
    out = time.perf_counter() - t, time.process_time() - cpu
    _sql_close(c)
    return out


def delete_10pct(system: str, path: str, victims: list[int], each: bool = False) -> dict[str, float]:
    seconds, cpu = _delete(system, path, victims, each)
    after = _size(system, path)
    if each:
        return {"seconds": seconds}
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--compact-child", system, path],
                         check=True, capture_output=True, text=True)
    return {"seconds": seconds, "cpu": cpu, "after": after, "compacted": _size(system, path),
            **json.loads(out.stdout.strip().splitlines()[-1])}


def child_compact(system: str, path: str) -> None:
    """Compact ``path`` after a delete (engramdb: ``compact()``, which merges what the tiering
    policy asks and purges the deleted documents from the index first; SQLite: FTS5
    ``optimize`` then ``VACUUM``), in its own process so its peak memory is its own: the
    peak resident set during the compaction minus the resident set before it (open not
    counted), and its heap part sampled every 20 ms."""
    if system == "engramdb":
        db = _engram_open(path)
    else:
        c = _sql_connect(system, path)
    reset = _reset_peak()
    before = _rss()[0]
    base = _status()
    sampler = _Sampler()
    sampler.start()
    t, c0 = time.perf_counter(), time.process_time()
    if system == "engramdb":
        db.compact()
    else:
        c.execute("INSERT INTO docs(docs) VALUES ('optimize')")
        c.execute("VACUUM")
    compact_s, compact_cpu = time.perf_counter() - t, time.process_time() - c0
    peak = _rss()[1]
    sampler.stop.set()
    sampler.join()
    if system == "engramdb":
        db.close()
    else:
        _sql_close(c)
    print(json.dumps({"compact_s": compact_s, "compact_cpu": compact_cpu, "compact_mem": peak - before,
                      "compact_anon": sampler.anon - base["RssAnon"], "compact_reset": reset}))


def refill(system: str, path: str, victims: list[int], texts: list[str], first: int) -> dict[str, float]:
    """Free-page reuse: delete ``victims`` (one transaction), commit one small change (LMDB
    reuses a commit's freed pages once no snapshot needs them), then add as many documents
    as were deleted (``texts``, new ids from ``first``) in one transaction: the file sizes."""
    _delete(system, path, victims)
    after = _size(system, path)
    add_docs(system, path, texts[:1], first)
    add_docs(system, path, texts, first + 1)
    return {"after": after, "refilled": _size(system, path)}


# --- the report ----------------------------------------------------------------------


def _ratio(peer: float | None, ours: float) -> str:
    return "-" if peer is None or not ours else f"{peer / ours:.2f}x"


def run_size(n: int, args: argparse.Namespace, tmp: str, systems: list[str]) -> None:
    from bench_search import corpus

    print(f"\n## N = {n:,}  (load average {os.getloadavg()[0]:.1f} at start)", flush=True)
    if args.texts:  # one document per line: the first N, and the adds from --extra
        with open(args.texts, encoding="utf-8") as fh:
            base = fh.read().split("\n")[:n]
        with open(args.extra, encoding="utf-8") as fh:
            extra = fh.read().split("\n")
        if len(base) < n or len(extra) < 1000 * args.runs:
            raise SystemExit(f"--texts holds fewer than {n:,} lines or --extra fewer than {1000 * args.runs:,}")
    else:
        texts = corpus(n + 1000 * args.runs, args.seed)
        base, extra = texts[:n], texts[n:]
    texts_path = args.texts or os.path.join(tmp, f"texts{n}.txt")
    if not args.texts:
        with open(texts_path, "w", encoding="utf-8") as fh:
            fh.write("\n".join(base))
    label = f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k" if n % 1000 == 0 else str(n)
    where = args.workdir or tmp
    files = {s: os.path.join(where, f"{FILE_PREFIX[s]}-{label}." + ("engram" if s == "engramdb" else "sqlite"))
             for s in systems}
    ing: dict[str, dict[str, Any]] = {}
    for s in systems:
        if args.workdir and os.path.exists(files[s] + ".done"):  # built by an earlier run: reused
            ing[s] = {"reused": True}
        else:
            if os.path.exists(files[s]):
                raise SystemExit(f"{files[s]} exists without {files[s]}.done: being built, or an unfinished "
                                 "build (remove it)")
            ing[s] = ingest(s, texts_path, files[s], n)
            if args.workdir:
                open(files[s] + ".done", "w").close()
        ing[s]["size"] = _size(s, files[s])
    print("\nbulk ingest (one transaction, child process per system)")
    print(f"  {'system':<30} {'docs/s':>10} {'CPU s':>8} {'extra memory':>14} {'(heap':>9} {'mapped file)':>13}"
          f" {'file':>10}")
    for s in systems:
        r = ing[s]
        if r.get("reused"):
            print(f"  {LABELS[s]:<30} {'file reused from ' + files[s] + ' (ingest not measured)':>59}"
                  f" {r['size'] / 2**20:>7,.1f} MB")
            continue
        print(f"  {LABELS[s]:<30} {n / r['seconds']:>10,.0f} {r['cpu']:>8.1f} "
              f"{(r['peak'] - r['before']) / 2**20:>11,.0f} MB {r['anon'] / 2**20:>6,.0f} MB {r['file'] / 2**20:>10,.0f} MB"
              f" {r['size'] / 2**20:>7,.1f} MB"
              + ("" if r["reset"] else "  (peak not reset: includes the set-up)"))
    rates = {s: n / ing[s]["seconds"] for s in systems if "seconds" in ing[s]}
    if "engramdb" in rates:
        print("  engramdb / peer docs/s: " + ", ".join(f"{s} {rates['engramdb'] / rates[s]:.2f}x"
                                                       for s in rates if s != "engramdb"))

    rng = random.Random(args.seed)
    victims = rng.sample(range(n), n // 10)
    adds: dict[str, list[tuple[float, float]]] = {s: [] for s in systems}
    pages: list[dict[str, int]] = []
    dels: dict[str, list[dict[str, float]]] = {s: [] for s in systems}
    each: list[float] = []
    for r in range(args.runs):
        for s in systems:
            work = os.path.join(tmp, os.path.basename(files[s]) + f".add{r}")
            _copy(s, files[s], work)
            count = s == "engramdb" and n <= args.pages_max
            before = page_owners(work) if count else {}
            adds[s].append(add_docs(s, work, extra[1000 * r:1000 * (r + 1)], n + 1000 * r))
            if count:  # not timed: the pages the commit wrote (page numbers not in use before it)
                pages.append(pages_written(before, page_owners(work)))
            for f in _files(s, work):
                os.remove(f)
        for s in systems:
            work = os.path.join(tmp, os.path.basename(files[s]) + f".del{r}")
            _copy(s, files[s], work)
            dels[s].append(delete_10pct(s, work, victims))
            for f in _files(s, work):
                os.remove(f)
        if n <= args.each_max and "engramdb" in systems:
            work = os.path.join(tmp, os.path.basename(files["engramdb"]) + f".each{r}")
            _copy("engramdb", files["engramdb"], work)
            each.append(delete_10pct("engramdb", work, victims, each=True)["seconds"])
            for f in _files("engramdb", work):
                os.remove(f)
    med_add = {s: statistics.median(w for w, _ in adds[s]) for s in systems}
    med_cpu = {s: statistics.median(c for _, c in adds[s]) for s in systems}
    print(f"\nadd 1,000 documents to the {n:,}-document file (one transaction; medians of {args.runs})")
    for s in systems:
        print(f"  {LABELS[s]:<30} {med_add[s] * 1e3:>9.1f} ms wall {med_cpu[s] * 1e3:>8.1f} ms CPU  (runs, wall: "
              f"{', '.join(f'{w * 1e3:.1f}' for w, _ in adds[s])})"
              + ("" if s == "engramdb" or "engramdb" not in systems
                 else f"   ratio {_ratio(med_add[s], med_add['engramdb'])} wall, "
                      f"{_ratio(med_cpu[s], med_cpu['engramdb'])} CPU"))
    if pages:
        per = {t: statistics.median(w.get(t, 0) for w in pages) for t in {t for w in pages for t in w}}
        print(f"  engramdb pages written by the commit (4 KiB; median): {sum(per.values()):,.0f}: "
              + ", ".join(f"{t} {c:,.0f}" for t, c in sorted(per.items(), key=lambda kv: -kv[1])))
    print(f"\ndelete 10 % ({n // 10:,} random documents, one transaction: engramdb's delete_many, SQLite's "
          f"DELETE per rowid; medians of {args.runs})")
    print(f"  {'system':<30} {'delete':>10} {'(CPU)':>9} {'file before':>12} {'after delete':>13} {'compacted':>10}"
          f" {'compaction':>11} {'(CPU)':>8} {'(extra memory':>14} {'heap)':>8}")
    med = {s: {k: statistics.median(d[k] for d in dels[s]) for k in dels[s][0]} for s in systems}
    for s in systems:
        m, size = med[s], ing[s]["size"]
        print(f"  {LABELS[s]:<30} {m['seconds']:>8.2f} s {m['cpu']:>7.2f} s {size / 2**20:>9.1f} MB "
              f"{m['after'] / 2**20:>7.1f} MB ({m['after'] / size:.2f}x) {m['compacted'] / 2**20:>7.1f} MB "
              f"{m['compact_s']:>9.1f} s {m['compact_cpu']:>6.1f} s {m['compact_mem'] / 2**20:>10,.0f} MB"
              f" {m['compact_anon'] / 2**20:>5,.0f} MB"
              + ("" if s == "engramdb" or "engramdb" not in systems else
                 f"   ratio {_ratio(m['seconds'], med['engramdb']['seconds'])} wall, "
                 f"{_ratio(m['cpu'], med['engramdb']['cpu'])} CPU"))
    if each:
        print(f"  engramdb, one tx.delete per memory in one transaction: {statistics.median(each):.2f} s")
    if args.refill:
        print(f"\nfree-page reuse: delete the same {n // 10:,}, commit one document, then add {n // 10:,} documents "
              "(the deleted texts, new ids) in one transaction")
        for s in systems:
            work = os.path.join(tmp, os.path.basename(files[s]) + ".refill")
            _copy(s, files[s], work)
            got = refill(s, work, victims, [base[i] for i in victims], n + 1000 * args.runs)
            for f in _files(s, work):
                os.remove(f)
            size = ing[s]["size"]
            print(f"  {LABELS[s]:<30} file {size / 2**20:>8.1f} MB -> after the delete {got['after'] / 2**20:>8.1f} MB "
                  f"({got['after'] / size:.2f}x) -> after adding them back {got['refilled'] / 2**20:>8.1f} MB "
                  f"({got['refilled'] / size:.2f}x)", flush=True)


def main() -> None:
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        child_ingest(*sys.argv[2:])
        return
    if len(sys.argv) == 4 and sys.argv[1] == "--compact-child":
        child_compact(*sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--pages-max", type=int, default=100_000,
                    help="count the pages engramdb's add of 1,000 writes up to this N (walks the file)")
    ap.add_argument("--each-max", type=int, default=100_000,
                    help="also time one tx.delete per memory up to this N")
    ap.add_argument("--out", help="also write the report to this file")
    ap.add_argument("--texts", help="the documents, one a line (the first N are ingested); default: generated")
    ap.add_argument("--extra", help="with --texts: the documents to add, one a line (1,000 per run)")
    ap.add_argument("--workdir", help="keep the ingested files here (engram-1M.engram, fts5-1M.sqlite, ...; "
                                      "NAME.done when finished) and reuse those already there")
    ap.add_argument("--refill", action="store_true",
                    help="also measure free-page reuse: after the delete, add back as many documents")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset of " + ",".join(SYSTEMS))
    args = ap.parse_args()
    if bool(args.texts) != bool(args.extra):
        ap.error("--texts and --extra go together")
    if args.out:
        sys.stdout = _Tee(sys.stdout, open(args.out, "w", encoding="utf-8"))  # noqa: SIM115 (closed at exit)
    import numpy as np

    print(f"machine: {platform.platform()}, {os.cpu_count()} cpus, python {platform.python_version()}, "
          f"numpy {np.__version__}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    wanted = args.systems.split(",")
    if not set(wanted) <= set(SYSTEMS):
        ap.error(f"--systems: choose from {','.join(SYSTEMS)}")
    systems = [s for s in SYSTEMS if s in wanted and (s != "fts5mc" or _mc_available())]
    if "fts5mc" in wanted and "fts5mc" not in systems:
        print("SQLite3MC: skipped (pip install apsw-sqlite3mc)")
    tmp = tempfile.mkdtemp(prefix="engram-bench-writes-")
    try:
        for n in args.sizes:
            run_size(n, args, tmp, systems)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
