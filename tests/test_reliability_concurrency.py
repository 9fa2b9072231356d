"""Lost updates: read-modify-write through ``with db.transaction()`` from 4 processes x 2
threads loses nothing; a negative control that reads and writes in separate transactions
does lose updates, which proves the test can see them."""
from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import PASSPHRASE, TEST_KDF

import engramdb.engram as engram

WORKER = r"""
import os, sys, threading
os.environ["ENGRAM_TEST_WEAK_KDF"] = "1"
import engramdb.engram as engram
path, passphrase, wid, threads, n, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
db = engram.open(path, passphrase=passphrase)  # opened by this process itself
errors = []

def loop(tid):
    try:
        for i in range(n):
            if mode == "atomic":
                with db.transaction() as tx:
                    node = tx.get("counter")
                    tx.update("counter", access_count=node.access_count + 1)
                    tx.add(id=f"op-{wid}-{tid}-{i}", now=1.0)  # a unique trace of every operation
            else:  # the negative control: read, then write in another transaction
                value = db.get("counter").access_count
                db.update("counter", access_count=value + 1)
    except BaseException as exc:
        errors.append(repr(exc))

workers = [threading.Thread(target=loop, args=(t,)) for t in range(threads)]
for w in workers:
    w.start()
for w in workers:
    w.join()
db.close()
print("ERR" if errors else "OK", errors[:1])
"""


def run(path, processes: int, threads: int, n: int, mode: str) -> int:
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add(id="counter", access_count=0, now=1.0)
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(path), PASSPHRASE, str(w), str(threads), str(n),
                               mode], stdout=subprocess.PIPE, text=True) for w in range(processes)]
    # Every transaction commits with fsync and adds a BM25 segment; allow ~50 ms each on a busy 2-core box.
    timeout = max(120, processes * threads * n // 20)
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    assert all(out.startswith("OK") for out in outputs), outputs
    with engram.open(path, passphrase=PASSPHRASE) as db:
        assert db.verify() == []
        value = db.get("counter").access_count
        if mode == "atomic":
            traces = {i for i in db.ids() if i.startswith("op-")}
            assert traces == {f"op-{w}-{t}-{i}" for w in range(processes) for t in range(threads) for i in range(n)}
    return value


def test_no_lost_updates(tmp_path):
    assert run(tmp_path / "c.engram", 4, 2, 60, "atomic") == 4 * 2 * 60


def test_negative_control_split_read_and_write_loses_updates(tmp_path):
    assert run(tmp_path / "c.engram", 4, 2, 60, "split") < 4 * 2 * 60


@pytest.mark.soak
def test_no_lost_updates_soak(tmp_path):
    assert run(tmp_path / "c.engram", 8, 4, 500, "atomic") == 8 * 4 * 500
