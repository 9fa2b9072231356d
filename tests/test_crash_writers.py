"""Concurrent writers killed (reliability test plan T1.6): three processes write to one
store at once, and one of them, drawn at random, is SIGKILLed at a random moment (possibly
while it holds engramdb's writer lock and LMDB's writer mutex, mid-commit), then started
again. The survivors must never deadlock (each must keep committing after every kill), no
acknowledged commit may be lost, no transaction may be partial, and the file must verify.

Writer ``w`` commits transactions ``w:1, w:2, ...``: each adds 1..6 members and a manifest
listing them, and updates the writer's counter record, all in one transaction; it prints
``ACK seq`` only after the commit returned.
"""
from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time

import pytest
from conftest import PASSPHRASE, TEST_KDF

import engramdb.engram as engram

WRITERS = 3

_WRITER = """
import random, sys
import engramdb.engram as e
path, passphrase, name, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rnd = random.Random(seed)
db = e.open(path, passphrase=passphrase, timeout=None)
print("READY", flush=True)
while True:
    with db.transaction() as tx:
        counter = tx.find("counter-" + name)
        seq = (counter.access_count if counter else 0) + 1
        members = [f"{name}:{seq}:{i}" for i in range(rnd.randint(1, 6))]
        for member in members:
            tx.add(id=member, content="x" * rnd.randint(0, 300), tags=[name], now=1.0)
        tx.add(id=f"{name}:{seq}", metadata={"members": members}, now=1.0)
        if counter is None:
            tx.add(id="counter-" + name, access_count=seq, now=1.0)
        else:
            tx.update("counter-" + name, access_count=seq)
    print(f"ACK {seq}", flush=True)
"""


def _env() -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return {**os.environ, "ENGRAM_TEST_WEAK_KDF": "1", "OPENBLAS_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}


class Writer:
    def __init__(self, path: str, name: str, seed: int) -> None:
        self.name, self.acked = name, 0
        self.proc = subprocess.Popen([sys.executable, "-c", _WRITER, path, PASSPHRASE, name, str(seed)],
                                     stdout=subprocess.PIPE, env=_env())
        assert self._line(60) == "READY"

    def _line(self, timeout: float) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"writer {self.name} made no progress in {timeout} s: a deadlock"
        return self.proc.stdout.readline().decode().strip()

    def wait_ack(self, timeout: float = 60) -> None:
        """Read until this writer acknowledges one more commit (progress after a kill)."""
        while True:
            line = self._line(timeout)
            assert line.startswith("ACK "), (self.name, line)
            self.acked = int(line.split()[1])
            return

    def drain(self) -> None:
        while select.select([self.proc.stdout], [], [], 0)[0]:
            line = self.proc.stdout.readline().decode().strip()
            if not line:
                return
            self.acked = int(line.split()[1])

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.drain()
        self.proc.stdout.close()


def _check(path: str, acked: dict[str, int]) -> dict[str, int]:
    with engram.open(path, passphrase=PASSPHRASE) as db:
        assert db.verify() == []
        nodes = {node.id: node for node in db.scan()}
        found = {}
        for name, floor in acked.items():
            counter = nodes.get("counter-" + name)
            seq = counter.access_count if counter else 0
            assert floor <= seq <= floor + 1, f"writer {name}: acknowledged {floor}, file has {seq}"
            manifests = sorted(int(i.split(":")[1]) for i in nodes if i.startswith(name + ":") and i.count(":") == 1)
            assert manifests == list(range(1, seq + 1)), f"writer {name}: manifests {manifests[-3:]} for {seq}"
            for n in manifests:
                assert all(m in nodes for m in nodes[f"{name}:{n}"].metadata["members"]), f"partial {name}:{n}"
            found[name] = seq
        members = sum(len(nodes[f"{w}:{n}"].metadata["members"]) + 1 for w, s in found.items() for n in range(1, s + 1))
        assert len(nodes) == members + sum(1 for s in found.values() if s)
    return found


def run(path: str, kills: int, seed: int) -> dict[str, int]:
    rnd = random.Random(seed)
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("first", id="first")
        db.delete("first")
    names = [f"w{i}" for i in range(WRITERS)]
    writers = {name: Writer(path, name, seed * 1000 + i) for i, name in enumerate(names)}
    try:
        for k in range(kills):
            victim = rnd.choice(names)
            for writer in writers.values():  # everyone is committing
                writer.wait_ack()
            time.sleep(rnd.random() * 0.03)
            writers[victim].kill()
            acked = writers[victim].acked
            for name, writer in writers.items():  # the survivors go on: no deadlock
                if name != victim:
                    writer.wait_ack()
            writers[victim] = Writer(path, victim, seed * 1000 + WRITERS + k)
            writers[victim].acked = acked
    finally:
        acked = {}
        for name, writer in writers.items():
            if writer.proc.poll() is None:
                writer.kill()
            acked[name] = writer.acked
    return _check(path, acked)


def test_killing_one_of_three_writers(tmp_path):
    seed = int(os.environ.get("ENGRAM_TEST_SEED", "20261201"))
    found = run(str(tmp_path / "writers.engram"), 10, seed)
    print(f"seed {seed}: 10 kills, commits per writer {found}")
    assert all(seq >= 10 for seq in found.values())


@pytest.mark.soak
def test_killing_one_of_three_writers_soak(tmp_path):
    run(str(tmp_path / "writers.engram"), 500, int(os.environ.get("ENGRAM_TEST_SEED", "7")))
