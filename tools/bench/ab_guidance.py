"""A/B of ``ProceduralGraph.guidance_for`` on an unchanged file in ONE process: the working tree's
engramdb against another tree's, alternating call by call, each on its own copy of one file.

Run (from the repository root):

    git archive BASE | tar -x -C /tmp/base     # the other tree (its C extension: copy or build it)
    python tools/bench/ab_guidance.py --base /tmp/base --trajectories 1000 --calls 200

The file is written once by this tree (``--trajectories`` recorded trajectories over 50 tasks,
three tool paths, every third a failure) and copied for the other tree, imported as
``engramdb_base`` (as ab_loop.py does). Each system keeps one graph object; the calls ask for
guidance on the 50 tasks in turn, the two systems taking turns call by call. Prints the CPU time
(``time.process_time``) per call, median and mean, per system; asserts that both return the same
text for every call. Never runs inside pytest.
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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import engramdb  # noqa: E402
from engramdb.agent import ProceduralGraph  # noqa: E402
from engramdb.crypto import KDFParams  # noqa: E402

PASS = "bench passphrase"
TOOLS = [["grep", "edit_file", "pytest"], ["read_file", "write_file", "run_tests"], ["grep", "edit_file"]]
WORDS = ["login", "parser", "deploy", "cache", "schema", "upload", "billing", "search", "export", "report"]


def _task(i: int) -> str:
    return f"fix the {WORDS[i % 10]} {WORDS[(i // 10) % 5 + 5]} bug"


def _transcript(i: int) -> list[dict[str, object]]:
    calls = [{"id": f"c{k}", "type": "function", "function": {"name": name, "arguments": "{}"}}
             for k, name in enumerate(TOOLS[i % len(TOOLS)])]
    return [{"role": "user", "content": _task(i % 50)}, {"role": "assistant", "content": "", "tool_calls": calls}]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the other tree (a directory holding engramdb/)")
    ap.add_argument("--trajectories", type=int, default=1000)
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    os.environ["ENGRAM_TEST_WEAK_KDF"] = "1"  # the file's KDF is not what is measured
    tmp = tempfile.mkdtemp(prefix="engram-abguid-")
    try:
        shutil.copytree(os.path.join(args.base, "engramdb"), os.path.join(tmp, "engramdb_base"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        sys.path.insert(0, tmp)
        made = os.path.join(tmp, "this.engram")
        with engramdb.open(made, passphrase=PASS, kdf=KDFParams.for_tests()) as db:
            graph = ProceduralGraph(db)
            for i in range(args.trajectories):
                graph.record_trajectory(_transcript(i), "failure" if i % 3 == 0 else "success", now=1_000_000.0 + i)
        shutil.copyfile(made, os.path.join(tmp, "base.engram"))
        mods = {"base": importlib.import_module("engramdb_base"), "this": engramdb}
        dbs = {name: mod.open(os.path.join(tmp, f"{name}.engram"), passphrase=PASS) for name, mod in mods.items()}
        graphs = {name: importlib.import_module(mod.__name__ + ".agent").ProceduralGraph(dbs[name])
                  for name, mod in mods.items()}
        cpu: dict[str, list[float]] = {name: [] for name in mods}
        clock = time.process_time
        for i in range(args.calls):
            order = list(mods) if i % 2 == 0 else list(reversed(mods))
            out = {}
            for name in order:
                t0 = clock()
                out[name] = graphs[name].guidance_for(_task(i % 50))
                cpu[name].append(clock() - t0)
            assert out["base"] == out["this"], f"call {i}: the two trees gave different guidance"
        print(f"{args.calls} guidance_for calls on an unchanged file of {args.trajectories} trajectories "
              f"({len(dbs['this'].procedure_rows())} rows), CPU ms per call, load {os.getloadavg()[0]:.2f}")
        for name in mods:
            ms = [t * 1000 for t in cpu[name]]
            print(f"{name:5} median {statistics.median(ms):.3f}  mean {statistics.fmean(ms):.3f}  "
                  f"first {ms[0]:.3f}")
        for db in dbs.values():
            db.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
