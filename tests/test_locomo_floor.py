"""The LoCoMo dev-half evidence recall as a floor: a change that lowers it fails.

Runs the shared harness (../shared/tools/locomo_eval.py) over the whole dev file with the
adapter tools/bench/locomo_adapter.py (one memory per turn, neighbouring turns linked),
turn budget, categories 1-4 (760 questions). Measured when the floor was first set
(2026-12-01): R@10 0.659, R@1 0.333 (about 20 s here); with the speaker feature (the
adapter stores each turn's speaker in metadata): R@10 0.701, R@1 0.406; with the source
(the session) and time features too: R@10 0.723, R@1 0.429; with the hop's weight 0.9
(cross-validated, spec/recall.md section 7): R@10 0.738, R@1 0.429. The floors sit a little under
those, so only a real loss fails; raise them when recall improves (issue 13 aims at
R@10 0.72 and R@1 0.32 on this file).
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "locomo" / "locomo-dev.json"
HARNESS = ROOT.parent / "shared" / "tools" / "locomo_eval.py"
ADAPTER = ROOT / "tools" / "bench" / "locomo_adapter.py"
R10_FLOOR = 0.73
R1_FLOOR = 0.42


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_locomo_dev_recall_floor():
    if not DATA.is_file():
        pytest.skip(f"LoCoMo dev data absent: {DATA}")
    if not HARNESS.is_file():
        pytest.skip(f"LoCoMo harness absent: {HARNESS}")
    harness = _load("_locomo_eval_harness", HARNESS)
    adapter = _load("_locomo_adapter", ADAPTER)
    convs = harness.load_conversations(os.fspath(DATA))
    result = harness.evaluate(convs, adapter.make_retriever, ks=(1, 10))
    overall = result["overall"]
    assert overall["n"] == 760  # the dev file's questions with evidence, categories 1-4
    assert overall["recall@10"] >= R10_FLOOR, overall
    assert overall["recall@1"] >= R1_FLOOR, overall
