"""An open that cannot create the file it was asked to create leaves no file behind.

``engramdb.open(new_path)`` without a passphrase, or with an empty or non-string one,
raised its error after LMDB had created the data file and its sidecars: an empty store
nobody made, which `engramdb init` then refused ("exists already")."""
from __future__ import annotations

import pytest
from conftest import TEST_KDF

import engramdb.engram as engram
from engramdb.errors import ModeMismatchError, ValidationError


@pytest.mark.parametrize("keys, error", [
    ({}, ModeMismatchError),
    ({"passphrase": ""}, ValidationError),
    ({"passphrase": b""}, ValidationError),
    ({"passphrase": 123}, ValidationError),
], ids=["no-passphrase", "empty", "empty-bytes", "not-a-string"])
def test_a_refused_new_file_leaves_nothing_behind(tmp_path, keys, error):
    with pytest.raises(error):
        engram.open(tmp_path / "new.engram", kdf=TEST_KDF, **keys)
    assert list(tmp_path.iterdir()) == []


def test_an_existing_encrypted_file_opened_without_a_passphrase_says_it_is_encrypted(tmp_path):
    path = tmp_path / "s.engram"
    engram.open(path, passphrase="pw", kdf=TEST_KDF).close()
    with pytest.raises(ModeMismatchError, match="is encrypted"):
        engram.open(path)
