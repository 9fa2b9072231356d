"""SIGKILL during maintain: the file verifies every time, and one more call converges to the
state of an uninterrupted pass (a killed pass is finished by the next call)."""
from __future__ import annotations

import multiprocessing
import os
import random
import shutil
import signal
import time

import pytest
from conftest import NOW
from test_maintenance_file import fill, snapshot, summarize

import engramdb.engram as engram_mod
from engramdb.maintenance.lifecycle import MaintenanceConfig
from engramdb.maintenance.run import PLAN_KEY

if not hasattr(os, "fork"):
    pytest.skip("needs fork()", allow_module_level=True)

CONFIG = MaintenanceConfig(batch_size=2)
DEFAULT_KILLS = 100  # the 100 random points, in the default suite (~35 s idle); soak: 300


def _child(path: str, kill_at: int) -> None:
    calls = 0

    def progress(stage: str, done: int, total: int) -> None:
        nonlocal calls
        calls += 1
        if calls == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    with engram_mod.open(path, encrypted=False) as db:
        db.maintain(CONFIG, summarize, now=NOW, progress=progress)
    os._exit(0)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("kill")
    orig = d / "orig.engram"
    with engram_mod.open(orig, encrypted=False) as db:
        fill(db, 70, seed=11)
    ref = d / "ref.engram"
    shutil.copy(orig, ref)
    calls = []
    with engram_mod.open(ref, encrypted=False) as db:
        db.maintain(CONFIG, summarize, now=NOW, progress=lambda *a: calls.append(a))
        expected = snapshot(db)
    return orig, expected, len(calls)


def _kill_once(base, path, rng: random.Random) -> None:
    orig, expected, ncalls = base
    shutil.copy(orig, path)
    for sidecar in ("-lock", "-maint"):
        if os.path.exists(str(path) + sidecar):
            os.remove(str(path) + sidecar)
    ctx = multiprocessing.get_context("fork")
    if rng.random() < 0.6:  # at a progress call: between commits, at a chosen step
        proc = ctx.Process(target=_child, args=(str(path), rng.randrange(1, ncalls + 2)))
        proc.start()
    else:  # at a random instant: anywhere, including inside a commit
        proc = ctx.Process(target=_child, args=(str(path), 0))
        proc.start()
        time.sleep(rng.uniform(0.0, 0.4))
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    with engram_mod.open(path, encrypted=False) as db:
        assert db.verify() == []
        db.maintain(CONFIG, summarize, now=NOW)
        assert db.verify() == []
        with db._store.read() as txn:
            assert txn.get("meta", PLAN_KEY) is None
        assert snapshot(db) == expected


def _run(base, tmp_path, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    for k in range(kills):
        _kill_once(base, tmp_path / f"k{k}.engram", rng)


def test_sigkill_during_maintain(base, tmp_path):
    _run(base, tmp_path, DEFAULT_KILLS, seed=1)


@pytest.mark.soak
def test_sigkill_during_maintain_300(base, tmp_path):
    _run(base, tmp_path, 300, seed=2)
