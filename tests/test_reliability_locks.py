"""LMDB's locks on the lock file live as long as the handle (reliability rule 4). LMDB holds
two POSIX (fcntl) locks on NAME-lock: a shared one on byte 0 (other openers see the file
is in use, so none of them resets the reader table and writer mutex), and one on the byte
at its pid (another process's reader_check() sees this process alive and keeps its reader
slots). POSIX locks belong to the process and are all dropped when it closes *any*
descriptor of the file (SQLite's "How To Corrupt", 2.2): code that opened and closed
NAME-lock while a handle is open would silently drop both, and the next opener could
reset the lock file under it, or free the pages it reads. Nothing but LMDB may open
NAME-lock after the handle is set up; this checks, through /proc/locks, that every
operation of a handle leaves LMDB's locks in place."""
from __future__ import annotations

import io
import os

import pytest
from conftest import PASSPHRASE, TEST_KDF

import engramdb.engram as engram
from engramdb.errors import AlreadyOpenError, EngramError


def _lmdb_locks(lock_file: str) -> set[tuple[str, str]]:
    """The POSIX locks this process holds on ``lock_file``: (READ or WRITE, start byte)."""
    st = os.stat(lock_file)
    suffix = f":{st.st_ino}"
    held = set()
    with open("/proc/locks") as fh:  # "1: POSIX  ADVISORY  WRITE 18020 fe:00:2670649 18020 18020"
        for line in fh:
            fields = line.split()
            if fields[1:3] == ["POSIX", "ADVISORY"] and fields[4] == str(os.getpid()) and fields[5].endswith(suffix):
                held.add((fields[3], fields[6]))
    return held


def test_lmdbs_locks_on_the_lock_file_are_held_while_the_handle_is_open(tmp_path):
    path = str(tmp_path / "s.engram")
    lock = path + "-lock"
    db = engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF)
    try:
        db.add("a memory about locks", id="a")
        expected = {("READ", "0"), ("WRITE", str(os.getpid()))}
        assert _lmdb_locks(lock) == expected  # what LMDB takes (the test would see their loss)

        steps = {
            "second handle": lambda: engram.open(path, passphrase=PASSPHRASE).close(),
            "read-only open refused": lambda: engram.open(path, passphrase=PASSPHRASE, readonly=True),
            "wrong passphrase": lambda: engram.open(path, passphrase="not the passphrase"),
            "writes": lambda: (db.add_many(["one", "two", "three"]), db.update("a", importance=0.9),
                               db.delete_many(db.ids()[1:2])),
            "reads": lambda: (db.recall("locks"), db.stats(), db.info(), list(db.scan())),
            "verify": lambda: db.verify(),
            "dump": lambda: db.dump(io.StringIO()),
            "export_key": lambda: db.export_key(tmp_path / "key.json"),
            "maintain": lambda: db.maintain(),
            "rekey": lambda: db.rekey("a new passphrase", kdf=TEST_KDF),
            "add_recovery_key": lambda: db.add_recovery_key(),
        }
        for name, step in steps.items():
            try:
                step()
            except (AlreadyOpenError, EngramError) as exc:
                assert name in ("read-only open refused", "wrong passphrase"), (name, exc)
            assert _lmdb_locks(lock) == expected, name
        db.compact()  # replaces the file and opens it again: the locks are on the file now there
        assert _lmdb_locks(lock) == expected
        db.add("after compaction")
        assert _lmdb_locks(lock) == expected
    finally:
        db.close()
    assert _lmdb_locks(lock) == set()  # the close released them: the check sees a change


@pytest.mark.parametrize("readonly", [False, True])
def test_a_reader_holds_them_too(tmp_path, readonly):
    path = str(tmp_path / "s.engram")
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("x")
    with engram.open(path, passphrase=PASSPHRASE, readonly=readonly) as db:
        db.get(db.ids()[0])
        db.verify()
        assert _lmdb_locks(path + "-lock") == {("READ", "0"), ("WRITE", str(os.getpid()))}
