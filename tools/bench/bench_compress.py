"""Benchmark: compress throughput and 10,000-item tunnel linking.

Run from the repository root (about a minute on an idle 2-core machine):

    python tools/bench/bench_compress.py            # 5 runs per workload, median reported
    python tools/bench/bench_compress.py --runs 9 --out tools/bench/results/compress.txt

Workloads:

* the two books in ``../shared/data/gutenberg/`` (the "novel" and the "science" text);
* a ~2.5k-token chat: the first sessions of LoCoMo conversation conv-26 rendered as
  ``[date] Session N`` headers and ``Speaker: text`` lines (skipped if the data is absent);
* ``link_sets`` over 10,000 zettel-like token sets (Zipf-skewed entity and topic
  vocabularies, every 10th set a near-duplicate), the MinHash/LSH path.

Each workload is timed with both compress methods: the default ``zettel-compress`` (the
port of zettel-compress 1.0.0) and ``refined`` (``--method`` picks one).

Throughput is in *estimated* tokens per millisecond: ``estimate_tokens(text)`` divided
by the median wall time of ``compress(text)`` in milliseconds (the measure the
zettel-compress benchmarks use). CPU time is printed too: on a shared machine it is the
steadier figure. The goal (issue 4): >= 141 tok/ms on the novel and >= 192 tok/ms on the
science text; 10,000-item linking well under 0.4 s.
"""
from __future__ import annotations

import argparse
import itertools
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engramdb.compress import compress, estimate_tokens  # noqa: E402
from engramdb.index.tunnels import link_sets  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
BOOKS = {
    "novel (Pride and Prejudice)": DATA / "gutenberg" / "pride_and_prejudice_pg1342.txt",
    "science (On the Origin of Species)": DATA / "gutenberg" / "origin_of_species_pg1228.txt",
}
CHAT_TOKENS = 2500


def locomo_chat(limit: int = CHAT_TOKENS) -> str | None:
    """The first sessions of LoCoMo conv-26 as chat text, cut near ``limit`` tokens."""
    path = DATA / "locomo" / "locomo-dev.json"
    if not path.exists():
        return None
    conv = json.loads(path.read_text(encoding="utf-8"))[0]["conversation"]
    lines: list[str] = []
    for n in itertools.count(1):
        turns = conv.get(f"session_{n}")
        if not turns:
            break
        lines.append(f"\n[{conv.get(f'session_{n}_date_time', '')}] Session {n}")
        for turn in turns:
            lines.append(f"{turn['speaker']}: {turn['text']}")
            if estimate_tokens("\n".join(lines)) >= limit:
                return "\n".join(lines).strip()
    return "\n".join(lines).strip()


def zettel_like_sets(n: int, seed: int = 11) -> list[frozenset[str]]:
    """The same generator as tests/test_tunnels.py."""
    rng = random.Random(seed)
    names = [f"N{i}" for i in range(400)]
    name_cw = list(itertools.accumulate(1 / (i + 1) ** 1.1 for i in range(400)))
    words = [f"w{i}" for i in range(20000)]
    word_cw = list(itertools.accumulate(1 / (i + 10) for i in range(20000)))
    out: list[frozenset[str]] = []
    for k in range(n):
        if k % 10 == 9:
            base = sorted(out[rng.randrange(k)])
            for _ in range(rng.randint(1, 2)):
                base[rng.randrange(len(base))] = rng.choice(words)
            out.append(frozenset(base))
        else:
            out.append(frozenset(rng.choices(names, cum_weights=name_cw, k=rng.randint(2, 5))
                                 + rng.choices(words, cum_weights=word_cw, k=rng.randint(8, 14))))
    return out


def measure(fn, runs: int) -> tuple[float, float, float]:
    """(median wall s, median CPU s, max wall s) over ``runs`` calls after one warm-up."""
    fn()
    walls, cpus = [], []
    for _ in range(runs):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        cpus.append(time.process_time() - c0)
        walls.append(time.perf_counter() - w0)
    return statistics.median(walls), statistics.median(cpus), max(walls)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs per workload (median reported)")
    parser.add_argument("--out", type=Path, help="also append the report to this file")
    parser.add_argument("--method", action="append", choices=("zettel-compress", "refined"),
                        help="compress method(s) to time (default: both)")
    args = parser.parse_args(argv)
    args.method = args.method or ["zettel-compress", "refined"]

    lines = [
        f"bench_compress  python {platform.python_version()}  {platform.machine()}  "
        f"{platform.node()}  runs={args.runs}",
    ]
    workloads = [(name, path.read_text(encoding="utf-8")) for name, path in BOOKS.items() if path.exists()]
    chat = locomo_chat()
    if chat:
        workloads.append((f"chat (LoCoMo conv-26, {estimate_tokens(chat)} tokens)", chat))
    for (name, text), method in itertools.product(workloads, args.method):
        tokens = estimate_tokens(text)
        wall, cpu, worst = measure(lambda text=text, method=method: compress(text, method=method), args.runs)
        result = compress(text, method=method)
        lines.append(
            f"compress {method}  {name}: {tokens} est. tokens, {len(result.zettels)} zettels, "
            f"{len(result.tunnels)} tunnels | median {wall * 1000:.0f} ms wall "
            f"({tokens / (wall * 1000):.0f} tok/ms), {cpu * 1000:.0f} ms CPU "
            f"({tokens / (cpu * 1000):.0f} tok/ms), max {worst * 1000:.0f} ms"
        )
    sets = zettel_like_sets(10_000)
    wall, cpu, worst = measure(lambda: link_sets(sets), args.runs)
    links = link_sets(sets)
    lines.append(
        f"link_sets 10,000 items: {len(links)} links | median {wall * 1000:.0f} ms wall, "
        f"{cpu * 1000:.0f} ms CPU, max {worst * 1000:.0f} ms"
    )
    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a", encoding="utf-8") as fh:
            fh.write(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
