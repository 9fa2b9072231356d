"""One long BM25 posting run's best documents (bm25._Run.best, spec/bm25.md "Caches"): the
frontier path (what a query uses) against ranking the pairs over the whole run (the scan
every long run used before session 7, still the fallback), CPU per call, p50 of 200 calls
alternating the two, hot and after touching 64 MB between calls (as a commit leaves the
CPU caches). Synthetic runs in memory (tf Zipf-like, lengths 40-80), no file. Run from the
repository root: ``python tools/bench/bench_run_best.py`` (``ENGRAMDB_PURE_PYTHON=1``: the
numpy path instead of the C extension's ``frontier_best``). Never runs inside pytest.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from engramdb import _accel
from engramdb.index.bm25 import _Pairs, _part, _Run


def main() -> None:
    rng = np.random.default_rng(1)
    junk = np.ones(8 << 20)
    clock = time.process_time
    print(f"C extension: {_accel.NATIVE is not None}, load {os.getloadavg()[0]:.2f}")
    for n in (10_000, 100_000, 1_000_000):
        docnos = np.cumsum(rng.integers(1, 3, size=n)).astype(np.int64)
        tfs = np.minimum(rng.zipf(2.0, size=n), 30).astype(np.uint32)
        dls = rng.integers(40, 81, size=n).astype(np.uint32)
        pairs, codes = _Pairs.empty().extend(tfs, dls)
        run = _Run((1,), docnos, codes, pairs)
        assert run.front_docnos is not None
        out = {}
        for cold in (False, True):
            t: dict[str, list[float]] = {"frontier": [], "scan": []}
            for i in range(200):
                values = _part(pairs.tf, pairs.dl, 2.0, 60.0 + i * 1e-3, 1.0)  # a new state each call
                calls = (("frontier", run.best), ("scan", run._pairs_best))
                for name, fn in calls if i % 2 else calls[::-1]:
                    if cold:
                        junk += 1.0
                    t0 = clock()
                    fn(64, values)
                    t[name].append(clock() - t0)
            out[cold] = {k: float(np.median(v)) * 1e6 for k, v in t.items()}
        print(f"run of {n:>9,} postings ({run.front_docnos.size} on the frontier, {len(pairs.index)} pairs): best(64) "
              f"hot {out[False]['frontier']:.0f} us vs scan {out[False]['scan']:.0f} us; "
              f"cold {out[True]['frontier']:.0f} us vs scan {out[True]['scan']:.0f} us")


if __name__ == "__main__":
    main()
