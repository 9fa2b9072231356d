"""Files an unlucky user meets: a directory or disk that refuses a new file, a full disk
on every write path. Each failure must be an EngramError whose hint says what to do, and
must leave nothing behind (no partial file, no litter beside the store)."""
from __future__ import annotations

import errno
import os

import pytest
from conftest import PASSPHRASE, TEST_KDF

import engramdb.engram as engram
import engramdb.store as store_mod
from engramdb.errors import ReadOnlyError, StorageFullError, StoreError


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
