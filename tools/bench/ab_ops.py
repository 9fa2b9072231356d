"""A/B of small per-call costs in ONE process: the working tree's engramdb against another
tree's, alternating every round, CPU time (as ab_loop.py, whose set-up this shares).

    git archive BASE | tar -x -C /tmp/base     # the other tree (copy its built C extension too)
    python tools/bench/ab_ops.py --base /tmp/base --rounds 200

Per round and system: ``add`` is one ``db.add`` (its own commit); ``tx`` is one
``db.transaction()`` block of 50 ``tx.add`` + 50 ``tx.get`` + 50 ``tx.update`` (the
per-operation path inside one transaction, where a per-call check weighs most); ``open``
is ``engramdb.open`` + ``close`` of a store of 1,000 memories (the per-open path). All
stores are plaintext: without sealing, a per-call cost weighs more.
Prints CPU p50 per system and the new/old ratio. Never runs inside pytest.
"""
from __future__ import annotations

import argparse
import importlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import engramdb  # noqa: E402


def _tx_block(db: Any, i: int) -> None:
    with db.transaction() as tx:
        ids = [tx.add(f"memory {i} {j} about the thread check", id=f"x{i}-{j}", now=0.0) for j in range(50)]
        for id in ids:
            tx.get(id)
        for id in ids:
            tx.update(id, importance=0.7)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the other tree (a directory holding engramdb/)")
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="engram-abops-")
    try:
        shutil.copytree(os.path.join(args.base, "engramdb"), os.path.join(tmp, "engramdb_base"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        sys.path.insert(0, tmp)
        mods = {"base": importlib.import_module("engramdb_base"), "this": engramdb}
        dbs: dict[str, Any] = {}
        opened: dict[str, str] = {}
        for name, mod in mods.items():
            dbs[name] = mod.open(os.path.join(tmp, f"{name}.engram"), encrypted=False)
            path = opened[name] = os.path.join(tmp, f"{name}-open.engram")
            with mod.open(path, encrypted=False) as db:
                db.add_many([f"memory {j} for the open test" for j in range(1000)], now=0.0)
        res: dict[str, dict[str, list[float]]] = {n: {"add": [], "tx": [], "open": []} for n in mods}
        clock = time.process_time
        order = list(mods)
        for i in range(args.rounds):
            for name in order if i % 2 == 0 else order[::-1]:
                db, rec = dbs[name], res[name]
                t0 = clock()
                db.add(f"memory {i} added alone", id=f"a{i}", now=0.0)
                t1 = clock()
                _tx_block(db, i)
                t2 = clock()
                mods[name].open(opened[name]).close()
                t3 = clock()
                rec["add"].append(t1 - t0)
                rec["tx"].append(t2 - t1)
                rec["open"].append(t3 - t2)
        print(f"{args.rounds} rounds, CPU p50 ms, load {os.getloadavg()[0]:.2f}")
        med = {n: {k: statistics.median(v) * 1e3 for k, v in rec.items()} for n, rec in res.items()}
        for kind in ("add", "tx", "open"):
            print(f"  {kind:4s} base {med['base'][kind]:.3f}  this {med['this'][kind]:.3f}  "
                  f"this/base {med['this'][kind] / med['base'][kind]:.3f}")
        for db in dbs.values():
            db.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
