"""Forget, archive compaction and stats on a file of N memories (issue 9, part B).

    python tools/bench/bench_forget.py --n 100000 --runs 1

On N memories of ~60 words each (encrypted, the built-in hashed TF-IDF space of 256 dims):

* ``forget`` of 1 % of the memories by id, spread over the file: selection, removal,
  the forced index merge and the compaction, end to end, with the file size before and
  after;
* ``forget`` by query (a text matching about 1 % of the memories) as a dry run: the
  selection alone (one exact matrix product per space);
* ``archive`` of half the memories (batches of 1,000 per transaction), then ``compact``:
  the compacted file size before and after, for N short memories (60 words, ~430
  characters) and for N/10 long ones (600 words, ~4,300 characters), without and with
  ``truncate=True``;
* ``stats()`` on the result.

Every figure is the median of ``--runs`` runs, each on a fresh file. The machine is
shared: figures are noisy.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import engramdb
from engramdb.crypto import KDFParams

WORDS = ("alpha beta gamma delta river mountain garden office meeting budget launch design review "
         "customer contract invoice travel flight hotel dinner family school doctor music book film "
         "project deadline release server database backup network security password laptop phone").split()


def _items(n: int, rng: random.Random, words_each: int = 60) -> list[dict]:
    out = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(words_each)]
        if i % 100 == 0:
            words[:12] = ["walrus", "iceberg"] * 6
        out.append({"id": f"m{i:07d}", "content": " ".join(words), "created_at": 1.0 + i, "last_accessed": 1.0 + i})
    return out


def _build(path: str, items: list[dict]) -> engramdb.Engram:
    db = engramdb.open(path, passphrase="bench", kdf=KDFParams(t=2, m_kib=19456, p=1))
    db.add_space("h", dims=256)
    for start in range(0, len(items), 10_000):
        db.add_many(items[start:start + 10_000])
    return db


def run_once(n: int, tmp: str) -> dict[str, float]:
    rng = random.Random(1)
    items = _items(n, rng)
    res: dict[str, float] = {}
    db = _build(os.path.join(tmp, "f.engram"), items)
    try:
        t = time.perf_counter()
        plan = db.forget(query="walrus iceberg", threshold=0.5, dry_run=True)
        res["forget_query_dry_run_s"] = time.perf_counter() - t
        res["forget_query_matches"] = len(plan.ids)
        db.compact()
        doomed = [items[i]["id"] for i in range(0, n, 100)]
        t = time.perf_counter()
        receipt = db.forget(ids=doomed)
        res["forget_1pct_s"] = time.perf_counter() - t
        res["forget_size_before"] = receipt.size_before
        res["forget_size_after"] = receipt.size_after
        t = time.perf_counter()
        db.stats()
        res["stats_s"] = time.perf_counter() - t
    finally:
        db.close()
    for label, count, words_each in (("short", n, 60), ("long", max(1, n // 10), 600)):
        for truncate in (False, True):
            name = f"{label}{'_truncate' if truncate else ''}"
            found = _archive_half(os.path.join(tmp, f"a-{name}.engram"), _items(count, rng, words_each), truncate)
            res.update({f"{name}_{k}": v for k, v in found.items()})
    return res


def _archive_half(path: str, items: list[dict], truncate: bool) -> dict[str, float]:
    """Half the memories archived (batches of 1,000 per transaction), then compacted."""
    res: dict[str, float] = {}
    db = _build(path, items)
    try:
        db.compact()
        res["compacted_size"] = os.path.getsize(db.path)
        ids = [it["id"] for it in items[::2]]
        t = time.perf_counter()
        for start in range(0, len(ids), 1000):
            with db.transaction() as tx:
                for id_ in ids[start:start + 1000]:
                    tx.archive(id_, truncate=truncate)
        res["archive_half_s"] = time.perf_counter() - t
        t = time.perf_counter()
        db.compact()
        res["compact_after_archive_s"] = time.perf_counter() - t
        res["archived_compacted_size"] = os.path.getsize(db.path)
    finally:
        db.close()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    runs = []
    for _ in range(args.runs):
        tmp = tempfile.mkdtemp(prefix="bench-forget-")
        try:
            runs.append(run_once(args.n, tmp))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"n={args.n} runs={args.runs} (median)")
    for key in runs[0]:
        value = statistics.median(r[key] for r in runs)
        print(f"{key:<40}{value:,.3f}" if isinstance(value, float) and value < 1000 else f"{key:<40}{value:,.0f}")


if __name__ == "__main__":
    main()
