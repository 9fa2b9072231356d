"""Files an unlucky user meets: a directory or disk that refuses a new file, a full disk
on every write path. Each failure must be an EngramError whose hint says what to do, and
must leave nothing behind (no partial file, no litter beside the store)."""
from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest
from conftest import PASSPHRASE, TEST_KDF

import engramdb.engram as engram
import engramdb.store as store_mod
from engramdb.errors import ReadOnlyError, StorageFullError, StoreError, ValidationError


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM, errno.EROFS])
def test_a_new_store_in_a_directory_that_refuses_it_is_a_read_only_error(tmp_path, monkeypatch, code):
    """Creating a store in a directory the user may not write to (or on a read-only mount)
    raised a raw PermissionError / OSError from os.open."""
    def refuse(path: str) -> int:
        raise OSError(code, os.strerror(code), path)

    monkeypatch.setattr(store_mod, "create_private", refuse)
    path = tmp_path / "new.engram"
    with pytest.raises(ReadOnlyError) as err:
        engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF)
    assert "cannot create" in err.value.message and "directory you may write to" in err.value.hint
    assert os.listdir(tmp_path) == []  # nothing left beside the refused file


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_new_store_on_a_full_disk_is_storage_full(tmp_path, monkeypatch, code):
    def full(path: str) -> int:
        raise OSError(code, os.strerror(code), path)

    monkeypatch.setattr(store_mod, "create_private", full)
    with pytest.raises(StorageFullError):
        engram.open(tmp_path / "new.engram", passphrase=PASSPHRASE, kdf=TEST_KDF)
    assert os.listdir(tmp_path) == []


def test_a_store_with_two_names_is_not_opened_for_writing(tmp_path):
    """A hard link gives a store a second name, and every lock lives beside a name (LMDB's
    writer mutex and reader table in NAME-lock, the writer lock in NAME-maint): two processes
    writing through the two names committed at once and corrupted the file (lost records,
    an id map pointing at other records). A writable open of a file with two names is
    refused; a read-only one is allowed."""
    first, second = tmp_path / "a.engram", tmp_path / "b.engram"
    with engram.open(first, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("kept", id="kept")
    os.link(first, second)
    for name in (first, second):
        with pytest.raises(StoreError, match="hard links") as err:
            engram.open(name, passphrase=PASSPHRASE)
        assert "samefile" in err.value.hint
        with engram.open(name, passphrase=PASSPHRASE, readonly=True) as db:
            assert db.get("kept").content == "kept"
    os.unlink(second)
    with engram.open(first, passphrase=PASSPHRASE) as db:  # one name again: writable
        db.add("more", id="more")
        assert db.verify() == []


def test_a_name_added_while_open_stops_the_next_commit(tmp_path):
    path = tmp_path / "a.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("kept", id="kept")
        os.link(path, tmp_path / "b.engram")
        with pytest.raises(StoreError, match="rolled back"):
            db.add("lost", id="lost")
        os.unlink(tmp_path / "b.engram")
        assert "lost" not in db.ids()
        db.add("written", id="written")
        assert db.verify() == []


_OPEN = """
import sys
import engramdb.engram as e
from engramdb.errors import EngramError
try:
    e.open(sys.argv[1], passphrase="p", readonly=sys.argv[2] == "ro", create=False)
except EngramError as exc:
    print(type(exc).__name__)
"""


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_path_that_is_not_a_regular_file_is_refused_as_foreign(tmp_path, kind):
    """A FIFO at the store's path hung open() for ever (reading it waits for a writer, and
    the open's timeout does not cover it); a directory was a StoreError pointing at verify."""
    path = tmp_path / "x.engram"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    for mode in ("rw", "ro"):
        try:  # in a child: a hang must fail this test, not stall the suite
            out = subprocess.run([sys.executable, "-c", _OPEN, str(path), mode], capture_output=True, text=True,
                                 env=env, timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"open() of a {kind} hung")
        assert out.stdout.strip() == "ForeignFileError", out.stderr[-500:]


def _nested(db, operation) -> None:
    with db.transaction() as tx:
        tx.add(id="outer", content="outer words")
        operation()


@pytest.mark.parametrize("name", ["compact", "maintain", "forget"])
def test_operations_that_commit_by_themselves_are_refused_inside_a_transaction(tmp_path, name):
    """Inside `with db.transaction()`: compact() waited for that very transaction (for ever
    with timeout=None, else a BusyError blaming "another writer"); maintain() joined it and
    left the BM25 index inconsistent (a document live in two segments, wrong statistics:
    verify failed); forget() said the memories were removed, then the block rolled back."""
    db = engram.open(tmp_path / "n.engram", passphrase=PASSPHRASE, kdf=TEST_KDF, timeout=1)
    try:
        db.add("alpha beta", id="a")
        db.add("alpha gamma", id="b")
        operation = {"compact": db.compact, "maintain": lambda: db.maintain(now=2e9),
                     "forget": lambda: db.forget(ids=["b"])}[name]
        with pytest.raises(ValidationError, match="inside a transaction") as err:
            _nested(db, operation)
        assert "after the `with db.transaction()` block" in err.value.hint
        assert sorted(db.ids()) == ["a", "b"] and db.verify() == []
        operation()  # outside a transaction it runs
        assert db.verify() == []
    finally:
        db.close()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EFBIG, errno.EDQUOT])
def test_a_dump_or_export_on_a_full_disk_is_storage_full_and_keeps_the_old_file(tmp_path, code):
    """`engramdb dump -o OUT` / `export -o OUT` on a full disk said "No space left on device"
    with the hint "check the path and its permissions" (a raw OSError from the writer)."""
    out = tmp_path / "out.aaak"
    out.write_text("the previous dump\n")
    with pytest.raises(StorageFullError) as err, store_mod.atomic_file(str(out), "w") as fh:
        fh.write("part of a dump")
        raise OSError(code, os.strerror(code))
    assert "free disk space" in err.value.hint and str(out) in err.value.hint
    assert out.read_text() == "the previous dump\n"
    assert sorted(os.listdir(tmp_path)) == ["out.aaak"]  # no partial file left


def capped_create(emit, path: str, limit: int) -> None:
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so write() fails with EFBIG instead of killing us
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    try:
        with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
            db.add("hello", id="h")
        emit("created")
    except StorageFullError:
        emit("full")


@pytest.mark.parametrize("limit", [0, 4096, 32768])
def test_a_store_that_could_not_be_created_on_a_full_disk_is_created_by_the_next_open(fork_server, tmp_path, limit):
    """With no space for a new store, open() raised a raw OSError (writing NAME-maint) or a
    StorageFullError, and left an empty data file behind: every later open refused it as
    "empty ... restore it from a dump or backup"."""
    path = tmp_path / "new.engram"
    lines, code, signum = fork_server.call("capped_create", str(path), limit)
    assert (code, signum, lines) == (0, 0, ["full"])
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:  # space is back
        db.add("hello", id="h")
        assert db.verify() == []
