"""The cost of the structural check on open (issue 16, finding 1).

    python tools/bench/bench_open.py --sizes 1000 10000 100000 --runs 5

For stores of N memories (~60 words each, built with ``add_many``), the median of
``--runs`` timings of:

* ``open`` + first ``get`` after a clean close: the fingerprint matches, no check runs
  (the test KDF, so the figure is the engine's, not argon2id's);
* the same after ``os.utime`` on the data file: the fingerprint differs, so the open runs
  LMDB's offline structural check (``lmdb.verify``) before mapping the file;
* ``structural_problems`` alone (the check by itself);
* ``open(verify=True)``: the check, plus every table against the sealed digests.

The difference between the first two is what running the check on every open would cost.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time

os.environ.setdefault("ENGRAM_TEST_WEAK_KDF", "1")  # the engine's cost, not the KDF's

import engramdb.engram as engram
from engramdb.crypto import KDFParams
from engramdb.store import structural_problems

PW = "bench"


def build(path: str, n: int) -> None:
    rng = random.Random(7)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 10)))
             for _ in range(5000)]
    with engram.open(path, passphrase=PW, kdf=KDFParams.for_tests()) as db:
        for start in range(0, n, 10_000):
            db.add_many([{"id": f"m{i}", "content": " ".join(rng.choices(vocab, k=60))}
                         for i in range(start, min(n, start + 10_000))], now=1.0)


def timed(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench-open-")
    try:
        print("| memories | file MiB | open + get, clean | open + get, check | check alone | open(verify=True) |")
        print("|---:|---:|---:|---:|---:|---:|")
        for n in args.sizes:
            path = os.path.join(work, f"s{n}.engram")
            build(path, n)

            def open_get(touch: bool, verify: bool = False, path: str = path) -> None:
                if touch:
                    os.utime(path)
                with engram.open(path, passphrase=PW, verify=verify) as db:
                    db.get("m0")

            open_get(False)  # leave a clean record behind
            clean = timed(lambda: open_get(False), args.runs)
            checked = timed(lambda: open_get(True), args.runs)
            alone = timed(lambda path=path: structural_problems(path), args.runs)
            verified = timed(lambda: open_get(False, verify=True), max(1, args.runs // 2))
            size = os.path.getsize(path) / 2**20
            print(f"| {n:,} | {size:.1f} | {clean * 1000:.1f} ms | {checked * 1000:.1f} ms | "
                  f"{alone * 1000:.1f} ms | {verified * 1000:.1f} ms |", flush=True)
            for suffix in ("", "-lock", "-maint"):
                os.unlink(path + suffix)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
