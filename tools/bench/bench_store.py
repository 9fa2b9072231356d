"""Storage-engine throughput: encrypted vs plaintext vs raw LMDB, and open-to-first-read.

    python tools/bench/bench_store.py --n 100000 --runs 3

On N nodes of ~60 words each, in one run:

* ``add_many`` through the public API (batches of ``--batch``; includes the BM25 index
  hook, which costs the same in both modes) and ``get`` of every id in random order
  (one read transaction per call), encrypted vs plaintext;
* the engine layer alone: encode + seal + put of the same records through
  ``Store.write`` / ``Txn.put`` and ``Txn.get`` + decode, encrypted vs plaintext;
* raw LMDB puts and gets of the same encoded record bytes (same durable flags, same
  batches), the floor any engine on LMDB pays;
* open-to-first-read of the encrypted file with the default KDF (t=3, m=64 MiB, p=4),
  beside argon2id alone.

Every figure is the median of ``--runs`` runs, each on a fresh file. Goals (issue 2):
encrypted >= 0.5x plaintext; open-to-first-read <= argon2id + 0.2 s.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time

import lmdb

import engramdb.engram as engram
from engramdb import codec, crypto
from engramdb.records import Node


def make_nodes(n: int, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    # a Zipf-like vocabulary of pseudo-words, so the text looks like text to the index and to zstd
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 10)))
             for _ in range(5000)]
    weights = [1 / (rank + 1) for rank in range(len(vocab))]
    nodes = []
    for i in range(n):
        words = rng.choices(vocab, weights, k=rng.randint(50, 70))
        nodes.append({"id": f"n{i:07d}", "content": " ".join(words), "tags": [rng.choice("abc")],
                      "created_at": 1.7e9 + i, "last_accessed": 1.7e9 + i})
    return nodes


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def open_db(path: str, encrypted: bool) -> engram.Engram:
    if encrypted:
        return engram.open(path, passphrase="bench", kdf=crypto.KDFParams.for_tests())
    return engram.open(path, encrypted=False)


def api_run(work: str, nodes: list[dict], batch: int, encrypted: bool, order: list[str]) -> tuple[float, float]:
    path = os.path.join(work, f"api-{encrypted}.engram")
    db = open_db(path, encrypted)
    t_add = timed(lambda: [db.add_many(nodes[i:i + batch]) for i in range(0, len(nodes), batch)])
    t_get = timed(lambda: [db.get(i) for i in order])
    db.close()
    _remove(path)
    return len(nodes) / t_add, len(order) / t_get


def engine_run(work: str, records: list[bytes], batch: int, encrypted: bool) -> tuple[float, float]:
    """encode is done by the caller once; this is seal + put, and get + open, at the Txn level."""
    path = os.path.join(work, f"engine-{encrypted}.engram")
    db = open_db(path, encrypted)
    store = db._store
    keys = [codec.u64(i + 1) for i in range(len(records))]

    def put_all() -> None:
        for start in range(0, len(records), batch):
            def fn(txn, start=start):
                for k, v in zip(keys[start:start + batch], records[start:start + batch]):
                    txn.put("nodes", k, v)
            store.write(fn)

    def get_all() -> None:
        with store.read() as txn:
            for k in keys:
                codec.decode_node(txn.get("nodes", k))

    t_put = timed(put_all)
    t_get = timed(get_all)
    db.close()
    _remove(path)
    return len(records) / t_put, len(records) / t_get


def raw_run(work: str, records: list[bytes], batch: int) -> tuple[float, float]:
    path = os.path.join(work, "raw.lmdb")
    env = lmdb.open(path, subdir=False, map_size=4 << 30, max_dbs=4, sync=True, metasync=True, writemap=False,
                    meminit=True, mode=0o600)
    db = env.open_db(b"t1")
    keys = [codec.u64(i + 1) for i in range(len(records))]

    def put_all() -> None:
        for start in range(0, len(records), batch):
            with env.begin(write=True, db=db) as txn:
                for k, v in zip(keys[start:start + batch], records[start:start + batch]):
                    txn.put(k, v)

    def get_all() -> None:
        with env.begin(db=db) as txn:
            for k in keys:
                codec.decode_node(txn.get(k))

    t_put = timed(put_all)
    t_get = timed(get_all)
    env.close()
    _remove(path)
    return len(records) / t_put, len(records) / t_get


def open_first_read(work: str, runs: int) -> tuple[float, float, float]:
    """(argon2id alone, open + first get with the default KDF, the same with a trivial KDF)."""
    medians = []
    for kdf in (crypto.KDFParams.default(), crypto.KDFParams.for_tests()):
        path = os.path.join(work, "kdf.engram")
        with engram.open(path, passphrase="bench", kdf=kdf) as db:
            db.add_many([f"memory {i}" for i in range(1000)], now=1.0)
            first = db.ids()[0]

        def open_and_read(path: str = path, first: str = first) -> None:
            with engram.open(path, passphrase="bench") as db:
                db.get(first)

        medians.append(statistics.median(timed(open_and_read) for _ in range(max(runs, 5))))
        _remove(path)
    kdf = statistics.median(timed(lambda: crypto.derive_kek("bench", os.urandom(16), crypto.KDFParams.default()))
                            for _ in range(max(runs, 5)))
    return kdf, medians[0], medians[1]


def _remove(path: str) -> None:
    for suffix in ("", "-lock", "-maint"):
        if os.path.exists(path + suffix):
            os.unlink(path + suffix)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="nodes (default 100000)")
    ap.add_argument("--batch", type=int, default=1000, help="nodes per add_many / transaction")
    ap.add_argument("--runs", type=int, default=3, help="runs per figure; the median is printed")
    ap.add_argument("--skip-api", action="store_true", help="skip the public-API runs (the slowest part)")
    args = ap.parse_args()
    os.environ.setdefault("ENGRAM_TEST_WEAK_KDF", "1")  # cheap KDF for the throughput files only

    nodes = make_nodes(args.n)
    records = [codec.encode_node(Node(**item)) for item in nodes]
    order = [item["id"] for item in nodes]
    random.Random(1).shuffle(order)
    mb = sum(len(r) for r in records) / 1e6
    work = tempfile.mkdtemp(prefix="bench-store-")
    try:
        results: dict[str, list[tuple[float, float]]] = {}
        for _ in range(args.runs):
            if not args.skip_api:
                results.setdefault("API add_many / get, encrypted", []).append(
                    api_run(work, nodes, args.batch, True, order))
                results.setdefault("API add_many / get, plaintext", []).append(
                    api_run(work, nodes, args.batch, False, order))
            results.setdefault("engine seal+put / get+open, encrypted", []).append(
                engine_run(work, records, args.batch, True))
            results.setdefault("engine seal+put / get+open, plaintext", []).append(
                engine_run(work, records, args.batch, False))
            results.setdefault("raw LMDB put / get (same bytes)", []).append(raw_run(work, records, args.batch))
        t_kdf, t_open, t_open_cheap = open_first_read(work, args.runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"{args.n} nodes, {mb:.1f} MB of encoded records ({mb * 1e6 / args.n:.0f} B/node), "
          f"batches of {args.batch}, median of {args.runs}")
    print(f"{'':42} {'write nodes/s':>14} {'read nodes/s':>14}")
    medians = {}
    for name, runs in results.items():
        w = statistics.median(r[0] for r in runs)
        r = statistics.median(r[1] for r in runs)
        medians[name] = (w, r)
        print(f"{name:42} {w:14,.0f} {r:14,.0f}")
    for layer in ("API add_many / get", "engine seal+put / get+open"):
        enc, plain = medians.get(f"{layer}, encrypted"), medians.get(f"{layer}, plaintext")
        if enc and plain:
            print(f"{layer}: encrypted/plaintext = {enc[0] / plain[0]:.2f}x write, {enc[1] / plain[1]:.2f}x read "
                  f"(goal >= 0.5x)")
    print(f"argon2id default (t=3, m=64 MiB, p=4): {t_kdf:.3f} s; open-to-first-read: {t_open:.3f} s "
          f"(difference {t_open - t_kdf:+.3f} s); open-to-first-read with a trivial KDF (the overhead "
          f"beyond argon2id): {t_open_cheap * 1000:.1f} ms (goal < 200 ms)")


if __name__ == "__main__":
    main()
