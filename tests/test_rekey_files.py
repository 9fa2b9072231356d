"""rekey and compact where the compacting copy cannot be written: the store's directory is
read-only. compact said "cannot create the compacting copy ...: Permission denied" with the
hint "check that the file is on a local disk and readable; run `engramdb verify FILE`",
neither of which helps; it now says to make the directory writable.

Permissions do not stop root: as root, each case runs in a forked child that drops to
``nobody`` (as tests/test_reliability_readonly.py does)."""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
from conftest import NOBODY, PASSPHRASE, TEST_KDF, unprivileged

import engramdb.engram as engram
from engramdb.errors import ReadOnlyError



@pytest.fixture
def store_in_a_read_only_dir() -> Iterator[str]:
    where = tempfile.mkdtemp(prefix="engramdb-rekey-")
    os.chmod(where, 0o755)
    inner = os.path.join(where, "d")
    os.mkdir(inner)
    path = os.path.join(inner, "s.engram")
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("kept", id="kept")
        db.rekey(PASSPHRASE, kdf=TEST_KDF)  # imports what the child will need
    if os.geteuid() == 0:
        for name in (inner, *(os.path.join(inner, f) for f in os.listdir(inner))):
            os.chown(name, NOBODY, NOBODY)
    os.chmod(inner, 0o555)
    yield path
    os.chmod(inner, 0o755)
    shutil.rmtree(where)


def _compact_says_to_make_the_directory_writable(path: str) -> int:
    """0 when compact fails with a ReadOnlyError whose hint says to make the directory
    writable; 1 with another error or hint; 2 when it succeeds."""
    with engram.open(path, passphrase=PASSPHRASE) as db:
        db.rekey("new passphrase", kdf=TEST_KDF)  # the key change itself needs no new file
        try:
            db.compact()
            return 2
        except ReadOnlyError as exc:
            return 0 if "directory" in exc.hint and "writable" in exc.hint and "verify" not in exc.hint else 1
        except Exception:
            return 1


def test_compact_in_a_read_only_directory_says_to_make_it_writable(store_in_a_read_only_dir):
    path = store_in_a_read_only_dir
    assert unprivileged(lambda: _compact_says_to_make_the_directory_writable(path)) == 0
    inner = os.path.dirname(path)
    assert sorted(os.listdir(inner)) == ["s.engram", "s.engram-lock", "s.engram-maint"]
    if os.geteuid() == 0:  # root refuses a -maint file of another user
        for name in os.listdir(inner):
            os.chown(os.path.join(inner, name), 0, 0)
    with engram.open(path, passphrase="new passphrase", readonly=True) as db:
        assert db.get("kept").content == "kept"
