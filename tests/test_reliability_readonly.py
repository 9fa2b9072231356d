"""Read-only copies (reliability T9.3): a backup of a store, copied into a directory this
user may not write (or onto a read-only medium), must open read-only without creating a
lock file. LMDB opens its lock file read-write even for a reader (readers register in it),
so such an open failed with "the file or its directory is read-only ... commands that only
read it still work", which was what the user was doing.

Permissions do not stop root: as root, each case runs in a forked child that drops to
``nobody`` (everything it needs is imported first: the interpreter may not be readable by
``nobody``)."""
from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator

import pytest
from conftest import NOBODY, PASSPHRASE, TEST_KDF, unprivileged

import engramdb.engram as engram
from engramdb.errors import ReadOnlyError



@pytest.fixture
def place() -> Iterator[str]:
    """A directory ``nobody`` can reach (pytest's tmp_path is under a 0700 directory of root)."""
    where = tempfile.mkdtemp(prefix="engramdb-ro-")
    os.chmod(where, 0o755)
    yield where
    for root, dirs, _ in os.walk(where):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
    shutil.rmtree(where)


def _backup(place: str) -> str:
    """A store and its backup copy (the data file alone, as `cp` of a closed store gives)
    in ``place/backup``, owned by the user the child runs as."""
    src = os.path.join(place, "live.engram")
    with engram.open(src, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("kept in the backup", id="kept")
        db.add("the other end", id="other")
        db.link("kept", "other")
        assert db.verify() == [] and db.recall("backup")  # imports what the child will need
    with engram.open(src, passphrase=PASSPHRASE, readonly=True) as db:
        db.get("kept")
    backup = os.path.join(place, "backup")
    os.mkdir(backup)
    shutil.copy(src, backup)
    if os.geteuid() == 0:
        for path in (place, backup, os.path.join(backup, "live.engram")):
            os.chown(path, NOBODY, NOBODY)
    return os.path.join(backup, "live.engram")


def _reads(path: str) -> int:
    with engram.open(path, passphrase=PASSPHRASE, readonly=True) as db:
        ok = db.get("kept").content == "kept in the backup" and db.verify() == [] and len(db.edges("kept")) == 1
    return 0 if ok else 1


def test_a_read_only_copy_in_a_directory_this_user_cannot_write_opens_read_only(place):
    path = _backup(place)
    os.chmod(os.path.dirname(path), 0o555)
    os.chmod(path, 0o400)
    assert unprivileged(lambda: _reads(path)) == 0
    assert os.listdir(os.path.dirname(path)) == ["live.engram"]  # no lock file, no -maint
    # a writable open is refused, saying what to do
    assert unprivileged(lambda: engram.open(path, passphrase=PASSPHRASE) and 0) == 90  # a StoreError


def test_a_0400_file_in_a_writable_directory_opens_read_only_and_refuses_writes(place):
    path = _backup(place)
    os.chmod(path, 0o400)

    def write() -> int:
        try:
            engram.open(path, passphrase=PASSPHRASE)
        except ReadOnlyError as exc:
            return 0 if "chmod" in exc.hint else 2
        return 1

    assert unprivileged(lambda: _reads(path)) == 0
    assert unprivileged(write) == 0
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o400


def test_a_copy_whose_lock_file_cannot_be_written_is_refused_while_another_process_has_it_open(place):
    """Without the lock file a reader is invisible to writers, which may then overwrite the
    pages it reads: lockless only when nobody else has the file open (engramdb's openers
    hold a shared flock on the data file)."""
    path = _backup(place)
    os.chmod(os.path.dirname(path), 0o555)
    other = os.open(path, os.O_RDONLY)  # another opener's shared lock (flock is per open file)
    try:
        fcntl.flock(other, fcntl.LOCK_SH)

        def read() -> int:
            try:
                engram.open(path, passphrase=PASSPHRASE, readonly=True)
            except ReadOnlyError as exc:
                return 0 if "another process" in exc.message and "-lock" in exc.message else 2
            return 1

        assert unprivileged(read) == 0
    finally:
        os.close(other)
    assert unprivileged(lambda: _reads(path)) == 0  # alone again: it opens


def _change_under_a_lockless_reader(place: str, change: Callable[[str], None]) -> int:
    """The exit code of a lockless reader that reads, waits for ``change(path)`` by the owner,
    then reads again: 0 the second read returned the record, 10 it raised ReadOnlyError saying the
    file changed on disk and to open it again (1-3: something else)."""
    path = _backup(place)
    os.chmod(os.path.dirname(path), 0o555)
    opened_r, opened_w = os.pipe()
    written_r, written_w = os.pipe()

    def read_across_a_change() -> int:
        db = engram.open(path, passphrase=PASSPHRASE, readonly=True)
        if not db._store._env.lockless or db.get("kept").content != "kept in the backup":
            return 1
        os.write(opened_w, b"1")
        os.read(written_r, 1)
        try:
            found = db.get("kept").content
        except ReadOnlyError as exc:
            told = "changed on disk" in exc.message and "open the file again" in exc.hint and "lock" in exc.hint
            return 10 if told else 2
        return 0 if found == "kept in the backup" else 3

    pid = os.fork()
    if pid == 0:  # the reader, as _unprivileged runs it
        os._exit(unprivileged(read_across_a_change))
    try:
        assert os.read(opened_r, 1) == b"1"
        os.chmod(os.path.dirname(path), 0o755)  # the owner (root, or this user) changes it meanwhile
        change(path)
    finally:
        os.write(written_w, b"1")
        _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status), status
    return os.WEXITSTATUS(status)


def _write(path: str) -> None:
    with engram.open(path, passphrase=PASSPHRASE) as db:
        db.add("written after the reader opened", id="later")


def test_a_lockless_reader_refuses_what_it_reads_once_a_writer_came_after_it(place):
    """A writer that opens the file after a lockless reader cannot see it (no slot in -lock) and
    reuses the pages its snapshot reads: every record read differently inside one snapshot
    (3,000 of 3,000 in a probe). The reader now refuses what it read once the file was written
    since its open, saying why, instead of returning it."""
    assert _change_under_a_lockless_reader(place, _write) == 10


def test_a_lockless_reader_refuses_after_a_touch_saying_only_what_it_knows(place):
    """A new modification time looks like a write (nothing tells them apart from outside): refused,
    but the message says the file changed on disk and to open it again, not that another process
    wrote it (rev10: it said "was written by another process")."""
    assert _change_under_a_lockless_reader(place, lambda path: os.utime(path, ns=(1, 2))) == 10


@pytest.mark.parametrize("change", ["chmod", "hard link", "chown"])
def test_a_lockless_reader_goes_on_after_a_change_that_writes_nothing(place, change):
    """A chmod, a new hard link or a change of owner moves the file's ctime, not its data: the
    reader refused every later read with "was written by another process" (rev10)."""
    def do(path: str) -> None:
        if change == "chmod":
            os.chmod(path, 0o444)
        elif change == "hard link":
            os.link(path, path + ".second-name")
        else:
            st = os.stat(path)
            os.chown(path, st.st_uid, st.st_gid)  # same owner: the ctime moves all the same
    assert _change_under_a_lockless_reader(place, do) == 0


def test_a_0400_file_is_refused_a_writable_open_while_another_process_writes_too(place):
    # While another process held the writer lock, a read-write open opened the environment
    # read-only (to be reopened at the first write): a file this user may not write opened,
    # and only its first write was refused.
    path = _backup(place)
    os.chmod(path, 0o400)
    assert unprivileged(lambda: _reads(path)) == 0  # creates the -maint beside it
    held = os.open(path + "-maint", os.O_RDWR)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)  # another process's write transaction

        def write() -> int:
            try:
                engram.open(path, passphrase=PASSPHRASE, timeout=0)
            except ReadOnlyError as exc:
                return 0 if "chmod" in exc.hint else 2
            return 1

        assert unprivileged(write) == 0
    finally:
        os.close(held)
