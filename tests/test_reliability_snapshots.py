"""Snapshot isolation under load (reliability test plan T5.2): one writer process moves a
token between memories (two updates in one transaction) and replaces a memory by another
(a delete and an add in one transaction), as fast as it can; readers in this process (two
threads, long-lived handles with their caches) and in another process take snapshots
meanwhile. No snapshot may show the token in two memories or in none, or a memory count
other than N; recall (which reads the index and the records) must find exactly one holder."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

from conftest import PASSPHRASE, TEST_KDF

import engramdb.engram as engram

N = 40

_WRITER = """
import random, sys
import engramdb.engram as e
db = e.open(sys.argv[1], passphrase=sys.argv[2])
rnd = random.Random(5)
holder, spare = "m0", int(sys.argv[4])
print("READY", flush=True)
for _ in range(int(sys.argv[3])):
    new = rnd.choice([i for i in db.ids() if i != holder and i.startswith("m")])
    with db.transaction() as tx:
        tx.update(holder, content="empty slot", tags=["slot"])
        tx.update(new, content="token here", tags=["holder"])
        victim = rnd.choice([i for i in db.ids() if i not in (holder, new)])
        tx.delete(victim)
        tx.add(id=f"m{spare}", content="empty slot", tags=["slot"], now=1.0)
    holder, spare = new, spare + 1
print("DONE", flush=True)
"""


def _env() -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return {**os.environ, "ENGRAM_TEST_WEAK_KDF": "1",
            "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}


def _check_snapshot(db) -> None:
    nodes = list(db.scan())  # N memories: one snapshot (scan reads batches of 512)
    holders = [n.id for n in nodes if n.tags == ("holder",)]
    assert len(nodes) == N and len(holders) == 1, (len(nodes), holders)
    assert all((n.content == "token here") == (n.id in holders) for n in nodes)
    hits = db.recall("token", top_k=5, hops=False)
    assert [h.node.content for h in hits] == ["token here"], [(h.id, h.node.content) for h in hits]


_READER = """
import sys
import engramdb.engram as e
sys.path.insert(0, sys.argv[3])
from test_reliability_snapshots import _check_snapshot
db = e.open(sys.argv[1], passphrase=sys.argv[2], readonly=True)
count = 0
while sys.stdin.readline().strip() == "go":
    _check_snapshot(db)
    count += 1
    print(count, flush=True)
"""


def test_readers_never_see_a_half_done_transaction(tmp_path):
    path = tmp_path / "s.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add_many([{"id": f"m{i}", "content": "token here" if i == 0 else "empty slot",
                      "tags": ["holder" if i == 0 else "slot"]} for i in range(N)], now=1.0)
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), PASSPHRASE, "300", str(N)],
                              stdout=subprocess.PIPE, text=True, env=_env())
    reader = subprocess.Popen([sys.executable, "-c", _READER, str(path), PASSPHRASE, os.path.dirname(__file__)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_env())
    errors: list[BaseException] = []
    done = threading.Event()
    counts = [0, 0]

    def local_reader(slot: int) -> None:
        with engram.open(path, passphrase=PASSPHRASE, readonly=True) as db:
            while not done.is_set():
                try:
                    _check_snapshot(db)
                except BaseException as exc:  # reported by the test thread
                    errors.append(exc)
                    return
                counts[slot] += 1

    threads = [threading.Thread(target=local_reader, args=(i,)) for i in range(2)]
    try:
        assert writer.stdout.readline().strip() == "READY"
        for thread in threads:
            thread.start()
        remote = 0
        while writer.poll() is None and not errors:
            reader.stdin.write("go\n")
            reader.stdin.flush()
            line = reader.stdout.readline().strip()
            assert line, reader.stderr.read()[-1500:]
            remote = int(line)
        assert writer.wait(timeout=300) == 0 and writer.stdout.read().strip() == "DONE"
    finally:
        done.set()
        for thread in threads:
            thread.join(timeout=60)
        if writer.poll() is None:
            writer.kill()
        reader.stdin.close()
        reader.wait(timeout=60)
        for stream in (writer.stdout, reader.stdout, reader.stderr):
            stream.close()
    if errors:
        raise errors[0]
    print(f"snapshots: {counts} in this process, {remote} in another, over 300 commits")
    assert min(counts) > 0 and remote > 0
    with engram.open(path, passphrase=PASSPHRASE) as db:
        _check_snapshot(db)
        assert db.verify() == []
