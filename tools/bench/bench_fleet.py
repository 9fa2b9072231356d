"""The fleet against a plain Python loop: `maintain` and `dump` over many small files.

Builds FILES stores of MEMORIES memories each (raw keys in NAME.engram.key beside them, as a
service would keep them: no argon2 run per open), then, on fresh copies each time, runs

- a plain loop in this process (open, job, close, file after file),
- the fleet on a local Dask cluster with 1 worker process and with 2,

and reports files per second, the speed-up over the loop, and the scheduler's overhead per
task (a task that does nothing, submitted FILES times). Cluster start-up is reported apart
from the job's time.

    python tools/bench/bench_fleet.py --files 1000 --memories 1000

Needs `pip install '.[fleet]'`. Figures go to tools/bench/README.md.
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import engramdb  # noqa: E402
from engramdb import fleet  # noqa: E402

NOW = 1_780_000_000.0
DAY = 86_400.0
WORDS = ("garden tomato railway timetable violin lesson tax return roof repair meeting budget travel "
         "passport doctor appointment birthday present recipe soup bicycle tyre library book").split()


def build(folder: str, files: int, memories: int) -> list[str]:
    rng = random.Random(7)
    paths = []
    for i in range(files):
        path = os.path.join(folder, f"tenant{i:05d}.engram")
        key = rng.randbytes(32)
        with open(path + ".key", "wb") as fh:
            fh.write(key)
        items = []
        for j in range(memories):
            text = " ".join(rng.choice(WORDS) for _ in range(12))
            items.append({"id": f"m{j}", "content": text, "created_at": NOW - rng.uniform(0, 600) * DAY,
                          "importance": rng.random(), "access_count": rng.randrange(5)})
        with engramdb.open(path, key=key) as db:
            db.add_many(items, now=NOW - 600 * DAY)
        paths.append(path)
    return paths


def fresh_copy(paths: list[str], folder: str) -> list[str]:
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    out = []
    for path in paths:
        target = os.path.join(folder, os.path.basename(path))
        shutil.copyfile(path, target)
        shutil.copyfile(path + ".key", target + ".key")
        out.append(target)
    return out


def loop(paths: list[str], job: str, out: str) -> float:
    start = time.perf_counter()
    for path in paths:
        row = fleet.run_one(path, job, fleet.KeyFileBeside(), {"now": NOW, "out": out})
        assert row["status"] == "ok", row
    return time.perf_counter() - start


def noop(i: int) -> int:
    return i


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--memories", type=int, default=1000)
    args = parser.parse_args()
    import distributed

    root = tempfile.mkdtemp(prefix="bench-fleet-")
    try:
        originals = os.path.join(root, "originals")
        os.makedirs(originals)
        start = time.perf_counter()
        paths = build(originals, args.files, args.memories)
        print(f"built {args.files} files x {args.memories} memories in {time.perf_counter() - start:.1f} s "
              f"({sum(os.path.getsize(p) for p in paths) / 2**20:.1f} MiB)")
        results: dict[tuple[str, str], float] = {}
        for job in ("maintain", "dump"):
            out = os.path.join(root, "dumps")
            os.makedirs(out, exist_ok=True)
            work = fresh_copy(paths, os.path.join(root, "work"))
            results[(job, "loop")] = loop(work, job, out)
            for workers in (1, 2):
                work = fresh_copy(paths, os.path.join(root, "work"))
                t0 = time.perf_counter()
                cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                                   dashboard_address=None)
                client = distributed.Client(cluster)
                startup = time.perf_counter() - t0
                report = fleet.run(work, job, client=client, key_source=fleet.KeyFileBeside(), now=NOW, out=out,
                                   progress=False)
                assert report.ok, report.table()
                results[(job, f"{workers}w")] = report.seconds
                if job == "maintain" and workers == 2:
                    t0 = time.perf_counter()
                    client.gather(client.map(noop, range(args.files), pure=False))
                    overhead = (time.perf_counter() - t0) / args.files
                    per_task = statistics.median(f.seconds for f in report.files)
                    print(f"scheduler overhead: {overhead * 1e3:.2f} ms per task (a task that does nothing, "
                          f"{args.files} of them, 2 workers); median maintain task body {per_task * 1e3:.1f} ms")
                client.close()
                cluster.close()
                print(f"  ({job}, {workers} worker(s): cluster start {startup:.1f} s, not counted)")
        print(f"\n{'job':<9} {'runner':<10} {'seconds':>8} {'files/s':>8} {'vs loop':>8}")
        for (job, runner), seconds in results.items():
            base = results[(job, "loop")]
            print(f"{job:<9} {runner:<10} {seconds:8.1f} {args.files / seconds:8.1f} {base / seconds:7.2f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
