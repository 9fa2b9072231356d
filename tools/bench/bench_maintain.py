"""Benchmark the maintenance pass, side by side with Trace Lite's algorithm as written.

Run from the repository root::

    PYTHONPATH=$PWD python tools/bench/bench_maintain.py [--n 100000] [--dims 384] [--sample 2000]

What it measures (figures go to tools/bench/README.md):

1. A full first pass (``Engram.maintain``) over ``--n`` memories with ``--dims``-dimension
   embeddings in a user space, on an encrypted file: wall time, the longest time one write
   batch held the write lock (the gap between two batch commits), what it did.
2. Trace Lite's algorithm run the way it is written (decay, then dedupe comparing every
   pair in Python, as ``consolidator.ts`` does) on a ``--sample`` of the same memories, and
   engramdb's pass on a file of the same sample; the pairwise time at ``--n`` is
   extrapolated quadratically from the sample (the full run would take hours).
3. An incremental pass after adding 1,000 memories to the big file.
4. ``forget`` of 1 % of the memories, including its compaction.
5. File size before and after archive compaction of a store whose memories are half
   archived (separate store of text memories, compacted before and after).

The memories are synthetic: 400 embedding centres with tight, loose and scattered
members (so there are near-duplicates and clusters), ages 0-900 days, every tier.
"""
from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import engramdb
from engramdb.maintenance.lifecycle import MaintenanceConfig, Memory, consolidate

NOW = 1_780_000_000.0
DAY = 86400.0
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima",
         "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor", "whiskey",
         "xray", "yankee", "zulu"]
PASSPHRASE = "bench passphrase"


def make_memories(n: int, dims: int, seed: int = 0) -> tuple[list[dict], np.ndarray]:
    rng = np.random.default_rng(seed)
    r = random.Random(seed)
    centres = rng.standard_normal((400, dims)).astype(np.float32)
    which = rng.integers(0, 400, n)
    spread = rng.choice([0.05, 0.35, 2.0], size=n, p=[0.1, 0.5, 0.4]).astype(np.float32)
    emb = centres[which] + rng.standard_normal((n, dims)).astype(np.float32) * spread[:, None]
    rows = []
    for i in range(n):
        text = " ".join(r.choice(WORDS) for _ in range(r.randrange(8, 40)))
        created = NOW - r.randrange(0, 900) * DAY - r.random() * DAY
        rows.append({"id": f"m{i:06d}", "content": text, "created_at": created,
                     "last_accessed": created + r.random() * (NOW - created),
                     "tier": r.choice(["hot", "hot", "warm", "cold"]), "importance": round(r.random(), 2),
                     "access_count": r.randrange(0, 12), "tags": [r.choice(["work", "home", "idea"])]})
    return rows, emb


# --- Trace Lite as written (consolidator.ts, transcribed loop for loop) -------------------

def tl_cosine(a, b):
    if len(a) != len(b) or not a:
        return 0.0
    dot = na = nb = 0.0
    for i in range(len(a)):
        dot += a[i] * b[i]
        na += a[i] * a[i]
        nb += b[i] * b[i]
    denom = math.sqrt(na) * math.sqrt(nb)
    return 0.0 if denom == 0 else dot / denom


def tl_consolidate(memories, now_ms):
    """decay + deduplicate + archive of consolidator.ts (no summarizer), pairwise in Python."""
    out = []
    for m in memories:
        age = (now_ms - m["createdMs"]) / 86_400_000
        eff = (age - min(m["accessCount"] * 0.5, 5)) / (1 + m["importance"] * 2)
        t = m["tier"]
        t = ("warm" if t == "hot" and eff > 7 else "cold" if t == "warm" and eff > 30
             else "archive" if t == "cold" and eff > 365 else t)
        out.append({**m, "tier": t})
    remove = set()
    for i in range(len(out)):
        if i in remove:
            continue
        for j in range(i + 1, len(out)):
            if j in remove:
                continue
            if tl_cosine(out[i]["embedding"], out[j]["embedding"]) > 0.92:
                si = out[i]["importance"] + out[i]["accessCount"] * 0.1
                sj = out[j]["importance"] + out[j]["accessCount"] * 0.1
                if si >= sj:
                    remove.add(j)
                else:
                    remove.add(i)
                    break
    kept = [m for k, m in enumerate(out) if k not in remove]
    return kept, len(remove)


def open_db(path, **kw):
    return engramdb.open(path, passphrase=PASSPHRASE, **kw)


def build(path, rows, emb, space="e", chunk=10_000):
    db = open_db(path)
    db.add_space(space, dims=emb.shape[1], model="bench", auto=False)
    t = time.perf_counter()
    for start in range(0, len(rows), chunk):
        part = [{**row, "embeddings": {space: emb[start + k]}} for k, row in enumerate(rows[start:start + chunk])]
        db.add_many(part)
    return db, time.perf_counter() - t


def timed_pass(db, config, now):
    """(report, wall seconds, longest gap between two batch commits, CPU seconds)."""
    gaps, last = [], [None]

    def progress(stage, done, total):
        t = time.perf_counter()
        if stage == "write" and last[0] is not None:
            gaps.append(t - last[0])
        if stage == "write":
            last[0] = t
    t, c = time.perf_counter(), time.process_time()
    report = db.maintain(config, now=now, progress=progress)
    return report, time.perf_counter() - t, max(gaps) if gaps else 0.0, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--dims", type=int, default=384)
    ap.add_argument("--sample", type=int, default=2000)
    ap.add_argument("--archive-n", type=int, default=20_000)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench_maintain_")
    config = MaintenanceConfig(space="e")
    try:
        rows, emb = make_memories(args.n + 1000, args.dims)
        extra_rows, extra_emb = rows[args.n:], emb[args.n:]
        rows, emb = rows[:args.n], emb[:args.n]

        # 2. Trace Lite as written vs engramdb on a sample
        sample = rows[:args.sample]
        tl_in = [{"id": r["id"], "createdMs": round(r["created_at"] * 1000), "accessCount": r["access_count"],
                  "importance": r["importance"], "tier": r["tier"], "embedding": emb[k].astype(float).tolist()}
                 for k, r in enumerate(sample)]
        t, c = time.perf_counter(), time.process_time()
        tl_kept, tl_removed = tl_consolidate(tl_in, round(NOW * 1000))
        tl_time, tl_cpu = time.perf_counter() - t, time.process_time() - c
        pure = [Memory(id=r["id"], content=r["content"], embedding=tuple(emb[k].tolist()), tags=tuple(r["tags"]),
                       importance=r["importance"], tier=r["tier"], created_at=r["created_at"],
                       last_accessed=r["last_accessed"], access_count=r["access_count"]) for k, r in enumerate(sample)]
        t = time.perf_counter()
        out, _rep = consolidate(pure, MaintenanceConfig.trace_lite(archive_truncate_length=0), now=NOW)
        pure_time = time.perf_counter() - t
        same = [m.id for m in out] == [m["id"] for m in tl_kept]
        sdb, _ = build(os.path.join(tmp, "sample.engram"), sample, emb[:args.sample])
        srep, s_time, _, s_cpu = timed_pass(sdb, config.replace(decay_steps=1, merge_duplicates=False, keep_pinned=False),
                                     NOW)
        sdb.close()
        print(f"sample of {args.sample}: Trace Lite as written (pairwise, Python) {tl_time:.2f} s wall "
              f"({tl_cpu:.2f} s CPU), {tl_removed} duplicates; engramdb pure consolidate {pure_time:.3f} s "
              f"(same kept ids: {same}); engramdb file pass {s_time:.3f} s wall ({s_cpu:.3f} s CPU, "
              f"{srep.deduplicated} duplicates)", flush=True)
        est, est_cpu = tl_time * (args.n / args.sample) ** 2, tl_cpu * (args.n / args.sample) ** 2
        print(f"Trace Lite pairwise at {args.n}: ~{est:.0f} s wall, ~{est_cpu:.0f} s CPU estimated "
              f"(quadratic from the sample)", flush=True)

        # 1. full first pass on the big file
        path = os.path.join(tmp, "big.engram")
        db, ingest = build(path, rows, emb)
        print(f"built {args.n} memories x {args.dims} dims in {ingest:.1f} s; file {os.path.getsize(path) / 1e6:.1f} MB",
              flush=True)
        report, full_time, lock, full_cpu = timed_pass(db, config, NOW)
        print(f"full first pass: {full_time:.1f} s wall, {full_cpu:.1f} s CPU (x{est_cpu / full_cpu:.0f} vs the "
              f"pairwise CPU estimate); longest batch "
              f"{lock * 1000:.0f} ms; decayed {report.decayed}, deduplicated {report.deduplicated}, archived "
              f"{report.archived}, compared {report.compared}, batches {report.batches}", flush=True)

        # 3. incremental after adding 1,000
        db.add_many([{**row, "embeddings": {"e": extra_emb[k]}} for k, row in enumerate(extra_rows)])
        report, inc_time, lock2, inc_cpu = timed_pass(db, config, NOW + 60)
        print(f"incremental pass after adding 1,000: {inc_time:.2f} s wall, {inc_cpu:.2f} s CPU; longest batch "
              f"{lock2 * 1000:.0f} ms; compared {report.compared}, deduplicated {report.deduplicated}, "
              f"full={report.full}", flush=True)
        again, again_time, _, _ = timed_pass(db, config, NOW + 60)
        print(f"pass right after: {again_time:.2f} s, changed={again.changed}")

        # 4. forget 1 % including compaction
        ids = [n.id for n in db.scan()]
        victims = random.Random(1).sample(ids, len(ids) // 100)
        size_before = os.path.getsize(path)
        t = time.perf_counter()
        receipt = db.forget(ids=victims)
        forget_time = time.perf_counter() - t
        print(f"forget of {len(victims)} ({len(receipt.ids)} removed) incl. compaction: {forget_time:.1f} s; "
              f"file {size_before / 1e6:.1f} -> {os.path.getsize(path) / 1e6:.1f} MB")
        db.close()

        # 5. archive compaction of a half-archived store
        apath = os.path.join(tmp, "arch.engram")
        adb = open_db(apath)
        r = random.Random(5)
        adb.add_many([{"id": f"a{i}", "content": " ".join(r.choice(WORDS) for _ in range(r.randrange(150, 300))),
                       "created_at": NOW} for i in range(args.archive_n)])
        adb.compact()
        before = os.path.getsize(apath)
        t = time.perf_counter()
        ids = [f"a{i}" for i in range(0, args.archive_n, 2)]
        for start in range(0, len(ids), 500):
            with adb.transaction() as tx:
                for id_ in ids[start:start + 500]:
                    tx.archive(id_)
        adb.compact()
        after = os.path.getsize(apath)
        print(f"archive compaction, {args.archive_n} text memories, half archived: {before / 1e6:.1f} -> "
              f"{after / 1e6:.1f} MB ({100 * (1 - after / before):.0f} % smaller), {time.perf_counter() - t:.1f} s")
        adb.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
