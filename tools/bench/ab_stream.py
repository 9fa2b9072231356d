"""A/B of a streamed vector search (a space over cache_mb) in ONE process, alternating.

Run (from the repository root):

    python tools/bench/ab_stream.py --n 20000 --dims 384 --reps 40

Builds an ``n``-row space (random vectors, seeded) in a temporary encrypted file, opens it
with ``cache_mb=0.01`` (so every search streams the blocks) and times ``VectorIndex.scores``
(CPU, ``time.process_time``) with three scorings of the blocks, round by round alternating:
``new`` (the working tree: blocks gathered into a buffer of ``STREAM_ROWS`` rows, one
``row_dots`` per buffer), ``perblock`` (one ``row_dots`` per block, as 92c7b5d..session 11)
and ``blas`` (``block @ q``, before 92c7b5d: faster, but its bits depend on the shape).
Asserts that ``new`` and ``perblock`` give the same bytes. Prints the median milliseconds.
Never runs inside pytest.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import engramdb  # noqa: E402
from engramdb.index import vectors as V  # noqa: E402


def _per_block(blas: bool) -> Any:
    def scores(self: Any, txn: Any, name: str, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        prefix = self._prefix(name)
        d = V._decode_dir(txn.get("vectors", prefix + V._DIR))
        docnos = np.empty(d.count, np.uint64)
        out = np.empty(d.count, np.float32)
        pos = 0
        for docs, mat in self._blocks(txn, name, prefix, d, 0):
            end = pos + docs.size
            docnos[pos:end] = docs
            out[pos:end] = mat @ q if blas else V.row_dots(mat, q)
            pos = end
        return docnos, out
    return scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--dims", type=int, default=384)
    ap.add_argument("--reps", type=int, default=40)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="engram-ab-stream-")
    try:
        path = os.path.join(tmp, "s.engram")
        rng = np.random.default_rng(1)
        db = engramdb.open(path, create=True, passphrase="bench")
        db.add_space("s", dims=args.dims, model="m")
        for s0 in range(0, args.n, 5000):
            db.add_many([{"content": f"v{i}", "embeddings": {"s": rng.standard_normal(args.dims).astype(np.float32)}}
                         for i in range(s0, min(args.n, s0 + 5000))])
        db.close()
        db = engramdb.open(path, passphrase="bench", cache_mb=0.01)
        vi = db.indexes.vectors
        q = V.unit_rows(rng.standard_normal((1, args.dims)).astype(np.float32))[0][0]
        variants = {"new": V.VectorIndex._stream_scores, "perblock": _per_block(False), "blas": _per_block(True)}
        times: dict[str, list[float]] = {k: [] for k in variants}
        ref = None
        try:
            for r in range(args.reps):
                for k, f in (list(variants.items()) if r % 2 == 0 else list(reversed(variants.items()))):
                    V.VectorIndex._stream_scores = f  # type: ignore[method-assign]
                    with db._store.read() as txn:
                        t = time.process_time()
                        got = vi.scores(txn, "s", q)
                        times[k].append(time.process_time() - t)
                    if k != "blas":
                        ref = got[1].tobytes() if ref is None else ref
                        assert got[1].tobytes() == ref, k
        finally:
            V.VectorIndex._stream_scores = variants["new"]  # type: ignore[method-assign]
            db.close()
        med = {k: statistics.median(v) * 1000 for k, v in times.items()}
        print(f"n={args.n} dims={args.dims} reps={args.reps} load={os.getloadavg()[0]:.1f} "
              + " ".join(f"{k}={v:.2f}ms" for k, v in med.items())
              + f" new/perblock={med['new'] / med['perblock']:.3f} new/blas={med['new'] / med['blas']:.3f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
