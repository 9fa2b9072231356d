"""A/B of ``ProceduralGraph.record_trajectory`` in ONE process: the working tree's engramdb
against another tree's, alternating call by call, each on its own new encrypted file.

Run (from the repository root):

    git archive BASE | tar -x -C /tmp/base     # the other tree (its C extension: copy or build it)
    python tools/bench/ab_procedures.py --base /tmp/base --calls 1000

The other tree's package is imported as ``engramdb_base`` (as ab_loop.py does). Each call records
one trajectory of three tools (every third a failure) with an injected time; the two systems
take turns call by call. Prints the CPU time (``time.process_time``) of each system's calls in
blocks of 100, the total, and the rows each file ends with; asserts that both files hold the
same rows. Never runs inside pytest.
"""
from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import engramdb  # noqa: E402
from engramdb.crypto import KDFParams  # noqa: E402

PASS = "bench passphrase"
TOOLS = [["grep", "edit_file", "pytest"], ["read_file", "write_file", "run_tests"], ["grep", "edit_file"]]


def _transcript(i: int) -> list[dict[str, object]]:
    tools = TOOLS[i % len(TOOLS)]
    calls = [{"id": f"c{k}", "type": "function", "function": {"name": name, "arguments": "{}"}}
             for k, name in enumerate(tools)]
    return [{"role": "user", "content": f"fix bug {i % 50}"}, {"role": "assistant", "content": "", "tool_calls": calls}]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the other tree (a directory holding engramdb/)")
    ap.add_argument("--calls", type=int, default=1000)
    args = ap.parse_args()
    os.environ["ENGRAM_TEST_WEAK_KDF"] = "1"  # the files' KDF is not what is measured
    tmp = tempfile.mkdtemp(prefix="engram-abproc-")
    try:
        shutil.copytree(os.path.join(args.base, "engramdb"), os.path.join(tmp, "engramdb_base"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        sys.path.insert(0, tmp)
        mods = {"base": importlib.import_module("engramdb_base"), "this": engramdb}
        dbs = {name: mod.open(os.path.join(tmp, f"{name}.engram"), passphrase=PASS, kdf=KDFParams.for_tests())
               for name, mod in mods.items()}
        graphs = {name: importlib.import_module(mod.__name__ + ".agent").ProceduralGraph(dbs[name])
                  for name, mod in mods.items()}
        cpu: dict[str, list[float]] = {name: [0.0] * ((args.calls + 99) // 100) for name in mods}
        clock = time.process_time
        for i in range(args.calls):
            conv = _transcript(i)
            outcome = "failure" if i % 3 == 0 else "success"
            order = list(mods) if i % 2 == 0 else list(reversed(mods))
            for name in order:
                t0 = clock()
                graphs[name].record_trajectory(conv, outcome, now=1_000_000.0 + i)
                cpu[name][i // 100] += clock() - t0
        rows = {name: db.procedure_rows() for name, db in dbs.items()}
        assert rows["base"] == rows["this"], "the two trees recorded different rows"
        print(f"{args.calls} record_trajectory calls, CPU s per block of 100, load {os.getloadavg()[0]:.2f}, "
              f"{len(rows['this'])} rows at the end")
        for name in mods:
            blocks = " ".join(f"{t:.3f}" for t in cpu[name])
            print(f"{name:5} total {sum(cpu[name]):.3f} s, last block {cpu[name][-1] * 10:.2f} ms/call; {blocks}")
        for db in dbs.values():
            db.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
