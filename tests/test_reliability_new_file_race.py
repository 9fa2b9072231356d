"""Two processes opening one new file at once (two agents or MCP servers started together):
both found it fresh, and both wrote a new header. The second header replaced the first, so
the first process's records were under a key (a plaintext file's index key) that no header
held any more: its memories were unreachable and verify reported damage; an encrypted file
failed the second open with 'tampered'. The initialisation now checks, inside its write
transaction, that the file is still fresh, and otherwise opens the other process's header."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from conftest import PASSPHRASE, TEST_KDF

import engramdb.engram as engram
from engramdb.errors import WrongPassphraseError

OTHER = textwrap.dedent(r"""
    import os, sys
    os.environ["ENGRAM_TEST_WEAK_KDF"] = "1"
    import engramdb.engram as engram
    kw = {"encrypted": False} if sys.argv[2] == "" else {"passphrase": sys.argv[2]}
    with engram.open(sys.argv[1], **kw) as db:
        db.add(id="theirs", content="written by the process that initialised the file first", now=1.0)
""")


def _other_process_initialises_first(monkeypatch, passphrase: str) -> None:
    """This process finds the file fresh; before it writes its header, another process
    initialises the file and writes a memory."""
    original = engram.Engram._initialize.__func__  # type: ignore[attr-defined]

    def late(cls, store, **kw):
        subprocess.run([sys.executable, "-c", OTHER, store.path, passphrase], check=True, timeout=120)
        return original(cls, store, **kw)

    monkeypatch.setattr(engram.Engram, "_initialize", classmethod(late))


def test_a_plaintext_file_initialised_by_another_process_meanwhile_keeps_its_records(tmp_path, monkeypatch):
    path = tmp_path / "new.engram"
    _other_process_initialises_first(monkeypatch, "")
    with engram.open(path, encrypted=False) as db:
        db.add(id="mine", content="written by the process that lost the race", now=2.0)
    monkeypatch.undo()
    with engram.open(path, encrypted=False) as db:
        assert db.get("theirs").content.startswith("written by the process that initialised")  # old: NotFoundError
        assert db.get("mine").content.startswith("written by the process that lost")
        assert db.verify() == []


def test_an_encrypted_file_initialised_by_another_process_meanwhile_opens_with_its_key(tmp_path, monkeypatch):
    path = tmp_path / "new.engram"
    _other_process_initialises_first(monkeypatch, PASSPHRASE)
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:  # old: DecryptionError ('tampered')
        db.add(id="mine", content="written by the process that lost the race", now=2.0)
    monkeypatch.undo()
    with engram.open(path, passphrase=PASSPHRASE) as db:
        assert sorted(db.ids()) == ["mine", "theirs"]
        assert db.verify() == []


def test_another_passphrase_than_the_winner_s_is_refused_as_such(tmp_path, monkeypatch):
    path = tmp_path / "new.engram"
    _other_process_initialises_first(monkeypatch, PASSPHRASE)
    with pytest.raises(WrongPassphraseError):
        engram.open(path, passphrase=PASSPHRASE + " but another", kdf=TEST_KDF)
