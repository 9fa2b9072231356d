"""import-key onto a file whose header is not damaged, and what a damaged header tells the user."""
from __future__ import annotations

import hashlib

import lmdb
import msgpack
import pytest
from click.testing import CliRunner
from conftest import PASSPHRASE, TEST_KDF, opens

import engramdb.engram as engram
from engramdb.cli import cli
from engramdb.errors import CorruptFileError, EngramError, ModeMismatchError, ValidationError


@pytest.fixture
def run():
    def invoke(*args):
        env = {"ENGRAM_PASSPHRASE": PASSPHRASE, "ENGRAM_TEST_WEAK_KDF": "1"}
        return CliRunner().invoke(cli, [str(a) for a in args], env=env, catch_exceptions=False)

    return invoke


@pytest.fixture
def exported(tmp_path):
    """A file, its key file exported, then the passphrase changed and a recovery key added."""
    path, keyfile = tmp_path / "k.engram", tmp_path / "k.key"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("kept", id="kept")
        db.export_key(keyfile)
        db.rekey("the new passphrase", kdf=TEST_KDF)
        recovery = db.add_recovery_key()
    return path, keyfile, recovery


def test_import_key_onto_a_healthy_file_with_other_keys_is_refused(exported):
    """It replaced the header all the same: the current passphrase and the recovery key
    stopped working, and the old passphrase came back, with "restored the header"."""
    path, keyfile, recovery = exported
    with pytest.raises(ValidationError, match="intact") as info:
        engram.import_key(path, keyfile, passphrase=PASSPHRASE)
    assert "force" in info.value.hint
    assert opens(path, passphrase="the new passphrase") and opens(path, key=recovery)
    assert not opens(path, passphrase=PASSPHRASE)


def test_import_key_with_force_puts_the_exported_header_back(exported):
    path, keyfile, recovery = exported
    engram.import_key(path, keyfile, passphrase=PASSPHRASE, force=True)
    assert opens(path, passphrase=PASSPHRASE)
    assert not opens(path, passphrase="the new passphrase") and not opens(path, key=recovery)


def test_import_key_of_the_file_s_own_current_header_is_a_no_op(tmp_path):
    path, keyfile = tmp_path / "k.engram", tmp_path / "k.key"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.export_key(keyfile)
    engram.import_key(path, keyfile, passphrase=PASSPHRASE)
    assert opens(path, passphrase=PASSPHRASE)


def test_cli_import_key_refuses_a_healthy_file_and_takes_force(run, exported):
    path, keyfile, _ = exported
    result = run("import-key", path, keyfile)
    assert result.exit_code == 1 and "intact" in result.output and "--force" in result.output
    assert run("import-key", path, keyfile, "--force").exit_code == 0
    assert opens(path, passphrase=PASSPHRASE)


def test_import_key_onto_a_plaintext_file_says_it_is_plaintext(tmp_path):
    """It said "this key file belongs to another store"."""
    plain, enc = tmp_path / "p.engram", tmp_path / "e.engram"
    engram.open(plain, encrypted=False).close()
    with engram.open(enc, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.export_key(tmp_path / "e.key")
    with pytest.raises(ModeMismatchError, match="plaintext"):
        engram.import_key(plain, tmp_path / "e.key", passphrase=PASSPHRASE, force=True)


def _edit_header(path, edit):
    env = lmdb.open(str(path), subdir=False, max_dbs=32)
    meta = env.open_db(b"t0", create=False)
    with env.begin(write=True) as txn:
        header = msgpack.unpackb(txn.get(b"header", db=meta), raw=False)
        edit(header)
        data = msgpack.packb(header, use_bin_type=True)
        for key in (b"header", b"header.bak"):
            txn.put(key, data, db=meta)
        txn.put(b"header.sha256", hashlib.sha256(data).digest(), db=meta)
        if header.get("gone"):
            for key in (b"header", b"header.bak", b"header.sha256"):
                txn.delete(key, db=meta)
    env.close()


@pytest.mark.parametrize("edit", [
    lambda h: h.update(slots="x"),
    lambda h: h.update(version="x"),
    lambda h: h["slots"][0].pop("nonce"),
    lambda h: h["slots"][0].update(salt=b"s"),
    lambda h: h.update(gone=True),
], ids=["slots", "version", "slot-field", "salt", "missing"])
def test_a_damaged_header_hints_at_import_key_not_at_verify(run, tmp_path, edit):
    """Each said "run `engramdb verify FILE`", which fails the same way (it opens the file
    first); a file whose header was lost said "not an engramdb file ... use `engramdb import`".
    Each now names import-key, and import-key repairs it."""
    path = tmp_path / "d.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("kept", id="kept")
        db.export_key(tmp_path / "d.key")
    _edit_header(path, edit)
    with pytest.raises(CorruptFileError) as info:
        engram.open(path, passphrase=PASSPHRASE, repair=True)
    assert "import-key" in info.value.hint and "verify" not in info.value.hint
    result = run("verify", path)
    assert result.exit_code == 1 and "import-key" in result.output
    engram.import_key(path, tmp_path / "d.key", passphrase=PASSPHRASE)
    with engram.open(path, passphrase=PASSPHRASE, repair=True) as db:
        assert db.get("kept").content == "kept"


def test_a_header_below_the_kdf_floor_says_how_to_open_it(tmp_path, monkeypatch):
    """Its hint was how to choose parameters for a new file ("use at least t=2 ...")."""
    path = tmp_path / "weak.engram"
    engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF).close()
    monkeypatch.delenv("ENGRAM_TEST_WEAK_KDF")
    with pytest.raises(EngramError) as info:
        engram.open(path, passphrase=PASSPHRASE)
    assert "rekey" in info.value.hint


def test_a_truncated_key_file_is_named_as_such(run, tmp_path):
    """It said "a record does not decode: ValueError" with the hint to run verify on the store."""
    path, keyfile = tmp_path / "k.engram", tmp_path / "k.key"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.export_key(keyfile)
    keyfile.write_bytes(keyfile.read_bytes()[:40])
    with pytest.raises(CorruptFileError, match=r"k\.key is truncated") as info:
        engram.import_key(path, keyfile, passphrase=PASSPHRASE)
    assert "export" in info.value.hint
    result = run("import-key", path, keyfile)
    assert result.exit_code == 1 and "k.key is truncated" in result.output and "verify" not in result.output


def test_key_file_mistakes_say_what_is_wrong(run, tmp_path):
    """A header backup passed as --key-file, and a recovery key cut short, both said only
    "holds neither a 32-byte raw key nor a recovery key"."""
    path, backup = tmp_path / "k.engram", tmp_path / "k.key"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.export_key(backup)
        recovery = db.add_recovery_key()
    result = run("info", path, "--key-file", backup)
    assert result.exit_code == 1 and "key header backup" in result.output and "import-key" in result.output
    short = tmp_path / "short.txt"
    short.write_text(recovery[:30] + "\n")
    result = run("info", path, "--key-file", short)
    assert result.exit_code == 1 and "incomplete" in result.output
    whole = tmp_path / "whole.txt"
    whole.write_text(recovery + "\n")
    assert run("info", path, "--key-file", whole).exit_code == 0


def test_export_key_of_a_plaintext_file_is_refused(run, tmp_path):
    """It wrote a key file that import-key refuses in every way (no passphrase slot, and
    `--plaintext` is a usage error): a header backup that could never be used."""
    path = tmp_path / "p.engram"
    engram.open(path, encrypted=False).close()
    with engram.open(path, encrypted=False) as db, pytest.raises(ModeMismatchError, match="plaintext"):
        db.export_key(tmp_path / "p.key")
    result = run("export-key", path, tmp_path / "p.key", "--plaintext")
    assert result.exit_code == 1 and "engramdb dump" in result.output
    assert not (tmp_path / "p.key").exists()


def test_a_key_file_with_the_recovery_key_s_groups_only_stillopens(run, tmp_path):
    """Regression (678225f..257586e's read_key_file): a key file holding the recovery key
    without its ERK1- prefix (or without its dashes), which open(key=) takes and --key-file
    took before, was refused as holding "neither a 32-byte raw key nor a recovery key"."""
    path = tmp_path / "k.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        recovery = db.add_recovery_key()
    groups = recovery.removeprefix("ERK1-")
    for name, text in (("groups", groups), ("bare", groups.replace("-", "")), ("lower", groups.lower())):
        keyfile = tmp_path / f"{name}.txt"
        keyfile.write_text(text + "\n")
        assert engram.read_key_file(keyfile) == text
        assert opens(path, key=engram.read_key_file(keyfile))
        assert run("info", path, "--key-file", keyfile).exit_code == 0, name
    junk = tmp_path / "junk.txt"
    junk.write_text("not a key at all\n")
    with pytest.raises(ValidationError, match="holds neither"):
        engram.read_key_file(junk)


def test_a_key_file_of_a_newer_engramdb_says_to_upgrade(tmp_path):
    """A newer key-file version said "not an engramdb key file"; a key file holding a newer
    format's header was put into the file, which then no longer opened."""
    from engramdb.errors import FormatVersionError
    from engramdb.header import KEYFILE_MAGIC

    path, keyfile = tmp_path / "k.engram", tmp_path / "k.key"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("kept", id="kept")
        db.export_key(keyfile)
    data = keyfile.read_bytes()
    newer = tmp_path / "newer.key"
    newer.write_bytes(KEYFILE_MAGIC[:-1] + bytes([KEYFILE_MAGIC[-1] + 1]) + data[len(KEYFILE_MAGIC):])
    with pytest.raises(FormatVersionError, match="newer"):
        engram.import_key(path, newer, passphrase=PASSPHRASE)
    header = msgpack.unpackb(data[len(KEYFILE_MAGIC):], raw=False)
    header["version"] = [2, 0]
    future = tmp_path / "future.key"
    future.write_bytes(KEYFILE_MAGIC + msgpack.packb(header, use_bin_type=True))
    with pytest.raises(FormatVersionError, match="format 2"):
        engram.import_key(path, future, passphrase=PASSPHRASE)
    with engram.open(path, passphrase=PASSPHRASE) as db:
        assert db.get("kept").content == "kept"
