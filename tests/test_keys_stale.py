"""Key changes through a handle opened before another handle (or process) changed the keys.

A handle keeps the header it read at open. rekey() and add_recovery_key() wrote a whole
header built from that copy, so each undid what the other had committed meanwhile: a
recovery key added by a stale handle brought the old passphrase back (the new one no
longer opened the file), and a stale rekey dropped a recovery key just handed to the user.
"""
from __future__ import annotations

import pytest
from conftest import PASSPHRASE, TEST_KDF, opens

import engramdb.engram as engram
from engramdb.errors import WrongPassphraseError


@pytest.fixture
def path(tmp_path):
    path = tmp_path / "k.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("kept", id="kept")
    return path


def _second_handle(path):
    """A handle of the same file as another process would have it: its own header copy.

    One process shares one handle per path, so a second open here would share the first's
    state; a fresh Engram over the same store reproduces a process that opened it earlier.
    """
    db = engram.open(path, passphrase=PASSPHRASE)
    return db, engram.Engram(db._store, dict(db._header))


def test_a_recovery_key_added_through_a_stale_handle_keeps_the_new_passphrase(path):
    db, stale = _second_handle(path)
    db.rekey("the new passphrase", kdf=TEST_KDF)
    recovery = stale.add_recovery_key()
    db.close()
    assert opens(path, passphrase="the new passphrase")
    assert not opens(path, passphrase=PASSPHRASE)
    assert opens(path, key=recovery)


def test_a_rekey_through_a_stale_handle_keeps_a_recovery_key_added_meanwhile(path):
    db, stale = _second_handle(path)
    recovery = db.add_recovery_key()
    stale.rekey("the new passphrase", kdf=TEST_KDF)
    db.close()
    assert opens(path, key=recovery)
    assert opens(path, passphrase="the new passphrase")


def test_a_rekey_through_a_handle_older_than_another_rekey_is_refused(path):
    """Two passphrase changes at once: the later one would silently undo the first (whose
    user was told it worked); it is refused, and the file keeps the first one."""
    db, stale = _second_handle(path)
    db.rekey("first", kdf=TEST_KDF)
    with pytest.raises(WrongPassphraseError, match="changed") as info:
        stale.rekey("second", kdf=TEST_KDF)
    assert "open the file again" in info.value.hint
    stale.add_recovery_key()  # reads the file's new header, but the handle still knows only the old passphrase
    with pytest.raises(WrongPassphraseError, match="changed"):
        stale.rekey("second", kdf=TEST_KDF)
    db.close()
    assert opens(path, passphrase="first")
    assert not opens(path, passphrase="second")


def test_a_handle_rekeys_twice_and_export_key_and_info_show_the_file_s_current_slots(path, tmp_path):
    db, stale = _second_handle(path)
    db.rekey("first", kdf=TEST_KDF)
    db.rekey("second", kdf=TEST_KDF)  # its own change is no conflict
    db.add_recovery_key()
    assert [s["label"] or s["kind"] for s in stale.info()["key_slots"]] == ["passphrase", "recovery"]
    stale.export_key(tmp_path / "k.key")  # the file's header, not the one the handle opened with
    db.close()
    engram.import_key(path, tmp_path / "k.key", passphrase="second")
    assert opens(path, passphrase="second")
