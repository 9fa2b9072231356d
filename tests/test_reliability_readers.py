"""Reader slots (reliability rule 21, test plan T3.3). LMDB's lock file has a fixed number
of reader slots, set by the first opener; a process killed inside a read transaction keeps
its slot until someone clears it, and only a first opener resets the table. So while one
process keeps the file open, killed readers pile up until no process can open the file."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest
from conftest import PASSPHRASE, TEST_KDF

import engramdb.engram as engram
import engramdb.store as store_mod
from engramdb.errors import BusyError

SLOTS = 4

_READER = """
import sys, time
import engramdb.engram as e
db = e.open(sys.argv[1], passphrase=sys.argv[2], readonly=True)
with db._store.read():
    print("holding", flush=True)
    time.sleep(600)
"""

_OPENER = """
import sys
import engramdb.engram as e
with e.open(sys.argv[1], passphrase=sys.argv[2], readonly=sys.argv[3] == "ro") as db:
    print(db.get("kept").content)
"""


def _env() -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return {**os.environ, "ENGRAM_TEST_WEAK_KDF": "1",
            "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}


@pytest.fixture
def few_slots(tmp_path, monkeypatch):
    """A file whose lock table has SLOTS reader slots, kept open by this process."""
    monkeypatch.setattr(store_mod, "MAX_READERS", SLOTS)
    db = engram.open(tmp_path / "r.engram", passphrase=PASSPHRASE, kdf=TEST_KDF)
    db.add("kept", id="kept")
    yield db
    db.close()


def test_slots_of_killed_readers_are_freed_for_the_next_process(few_slots):
    """A read-only open failed with MDB_READERS_FULL (a StoreError pointing at verify) once
    a table's worth of readers had been killed while another process had the file open."""
    path = few_slots.path
    readers = []
    try:
        for _ in range(SLOTS + 1):  # readers until the table is full (a reader cannot begin)
            proc = subprocess.Popen([sys.executable, "-c", _READER, path, PASSPHRASE], stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, text=True, env=_env())
            readers.append(proc)
            if proc.stdout.readline().strip() != "holding":
                break
        else:
            pytest.fail(f"{SLOTS + 1} readers held a read transaction each in a table of {SLOTS} slots")
    finally:
        for proc in readers:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            proc.stdout.close()
    for mode in ("ro", "rw"):
        out = subprocess.run([sys.executable, "-c", _OPENER, path, PASSPHRASE, mode], capture_output=True,
                             text=True, env=_env(), timeout=120)
        assert (out.returncode, out.stdout.strip()) == (0, "kept"), out.stderr[-600:]
    assert few_slots.get("kept").content == "kept"


def test_every_slot_in_use_is_a_busy_error_that_says_so(few_slots):
    """With every slot held by a live reader, a read said "the map keeps being resized by
    another process" after three attempts."""
    hold, held = threading.Event(), threading.Semaphore(0)

    def reader() -> None:
        with few_slots._store.read():
            held.release()
            hold.wait(60)

    threads = [threading.Thread(target=reader) for _ in range(SLOTS)]
    for thread in threads:
        thread.start()
    try:
        for _ in threads:
            assert held.acquire(timeout=60)
        with pytest.raises(BusyError, match="reader slot") as err:
            few_slots.get("kept")
        assert "reading the file at once" in err.value.hint
    finally:
        hold.set()
        for thread in threads:
            thread.join()
    assert few_slots.get("kept").content == "kept"  # the slots are back
