"""A wrong key, a damaged or tampered header, tampered or moved envelopes, and foreign files:
each raises its specific error, and none ever yields wrong data."""
from __future__ import annotations

import copy
import hashlib
import os
import sqlite3

import lmdb
import msgpack
import pytest
from conftest import PASSPHRASE, TEST_KDF
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engramdb.engram as engram
from engramdb import codec
from engramdb.errors import (
    CorruptFileError, DecryptionError, EngramError, FileMissingError, ForeignFileError, FormatVersionError,
    ModeMismatchError, WeakKDFError, WrongPassphraseError,
)


@pytest.fixture
def closed_file(tmp_path):
    """A closed encrypted file with three memories; returns (path, {id: Node})."""
    path = tmp_path / "t.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        ids = [db.add(f"memory {i}", id=f"id{i}", now=1.0) for i in range(3)]
        nodes = {i: db.get(i) for i in ids}
    return path, nodes


def raw(path):
    """The file's LMDB environment, bypassing engramdb (the file must be closed in engramdb)."""
    return lmdb.open(str(path), subdir=False, max_dbs=32)


def raw_table(env, table: int):
    return env.open_db(b"t%d" % table, create=False)


def read_header(path) -> dict:
    env = raw(path)
    meta = raw_table(env, 0)
    with env.begin() as txn:
        data = txn.get(b"header", db=meta)
    env.close()
    return msgpack.unpackb(data, raw=False)


def write_header(path, header, *, recompute_sha=True, keys=(b"header", b"header.bak")):
    data = msgpack.packb(header, use_bin_type=True)
    env = raw(path)
    meta = raw_table(env, 0)
    with env.begin(write=True) as txn:
        for key in keys:
            txn.put(key, data, db=meta)
        if recompute_sha:
            txn.put(b"header.sha256", hashlib.sha256(data).digest(), db=meta)
    env.close()


def reopen(path, **kwargs):
    """Open past the commit-id binding: these tests change the file with raw LMDB commits,
    which a normal open refuses (test_every_open_refuses_a_commit_made_outside_engramdb);
    here they exercise what the later checks and the reads do with the damage."""
    kwargs.setdefault("passphrase", PASSPHRASE)
    kwargs.setdefault("repair", True)
    return engram.open(path, **kwargs)


def assert_intact(path, nodes):
    """The data is back; the only finding left is that the test itself committed with raw LMDB."""
    with reopen(path) as db:
        assert {i: db.get(i) for i in nodes} == nodes
        assert [p for p in db.verify() if "changed outside engramdb" not in p.detail] == []


# --- keys and the header -----------------------------------------------------------------

def test_wrong_passphrase(closed_file):
    path, nodes = closed_file
    for wrong in ("wrong", PASSPHRASE + " ", PASSPHRASE.upper()):
        with pytest.raises(WrongPassphraseError):
            reopen(path, passphrase=wrong)
    with pytest.raises(WrongPassphraseError):
        reopen(path, passphrase=None, key=os.urandom(32))  # no key slot at all
    assert_intact(path, nodes)


def test_mode_mismatch(tmp_path, closed_file):
    path, _ = closed_file
    with pytest.raises(ModeMismatchError):
        reopen(path, passphrase=None)
    plain = tmp_path / "plain.engram"
    engram.open(plain, encrypted=False).close()
    with pytest.raises(ModeMismatchError):
        reopen(plain)
    with engram.open(plain, encrypted=False) as db:
        assert not db.encrypted


def test_corrupt_header_and_backup_is_corrupt_not_wrong_passphrase(closed_file):
    path, _ = closed_file
    header = read_header(path)
    header["store_id"] = b"\x00" * 16
    write_header(path, header, recompute_sha=False)
    with pytest.raises(CorruptFileError) as info:
        reopen(path)
    assert not isinstance(info.value, DecryptionError)


def test_flipped_header_bytes_is_corrupt(closed_file):
    path, _ = closed_file
    env = raw(path)
    db = raw_table(env, 0)
    with env.begin(write=True) as txn:
        for key in (b"header", b"header.bak"):
            data = bytearray(txn.get(key, db=db))
            data[len(data) // 2] ^= 0x10
            txn.put(key, bytes(data), db=db)
    env.close()
    with pytest.raises(CorruptFileError):
        reopen(path)


def test_damaged_primary_header_falls_back_to_backup_and_is_repaired(closed_file):
    path, nodes = closed_file
    header = read_header(path)
    header["store_id"] = b"\x01" * 16
    write_header(path, header, recompute_sha=False, keys=(b"header",))
    with reopen(path) as db:
        assert {i: db.get(i) for i in nodes} == nodes
    assert read_header(path)["store_id"] != b"\x01" * 16  # the primary was rewritten from the backup
    assert_intact(path, nodes)


def _slot(header):
    return header["slots"][0]


# Each mutation changes one authenticated header field; the sha256 is recomputed, so only
# the key wrap's associated data can catch it.
HEADER_TAMPERS = {
    "kdf t": lambda h: _slot(h)["kdf"].update(t=2),
    "kdf m": lambda h: _slot(h)["kdf"].update(m=16),
    "kdf p": lambda h: _slot(h)["kdf"].update(p=2, m=16),
    "salt": lambda h: _slot(h).update(salt=bytes(16)),
    "salt length": lambda h: _slot(h).update(salt=_slot(h)["salt"] + b"\x00"),
    "wrap nonce": lambda h: _slot(h).update(nonce=bytes(12)),
    "wrap ct": lambda h: _slot(h).update(wrapped=bytes(len(_slot(h)["wrapped"]))),
    "wrap ct truncated": lambda h: _slot(h).update(wrapped=_slot(h)["wrapped"][:-1]),
    "minor version": lambda h: h.update(version=[1, 1]),
    "store id": lambda h: h.update(store_id=os.urandom(16)),
    "cipher": lambda h: h.update(cipher="AES-128-GCM"),
    "slot label": lambda h: _slot(h).update(label="recovery"),
}


@pytest.mark.parametrize("field", sorted(HEADER_TAMPERS))
def test_tampered_header_field_never_opens(closed_file, field):
    path, nodes = closed_file
    original = read_header(path)
    header = copy.deepcopy(original)
    HEADER_TAMPERS[field](header)
    assert header != original
    write_header(path, header)
    with pytest.raises(WrongPassphraseError):
        reopen(path)
    write_header(path, original)
    assert_intact(path, nodes)


def test_tampered_header_field_without_new_sha_falls_back_to_backup(closed_file):
    path, nodes = closed_file
    for field in sorted(HEADER_TAMPERS):
        header = read_header(path)
        HEADER_TAMPERS[field](header)
        write_header(path, header, recompute_sha=False, keys=(b"header",))
        assert_intact(path, nodes)  # opened from header.bak, then repaired


@pytest.mark.parametrize("mutate, error", [
    (lambda h: h.update(version=[2, 0]), FormatVersionError),
    (lambda h: h.update(version="1.0"), CorruptFileError),
    (lambda h: h.update(format="other"), ForeignFileError),
    (lambda h: _slot(h).update(kdf={"alg": "argon2id", "v": 19, "t": 3, "m": 2**32, "p": 4}), WeakKDFError),
    (lambda h: _slot(h).update(kdf={"alg": "argon2id", "v": 19, "t": 10**9, "m": 8, "p": 1}), WeakKDFError),
    (lambda h: _slot(h).update(kdf="argon2id"), WeakKDFError),
    (lambda h: _slot(h).update(kind="key"), WrongPassphraseError),
    (lambda h: h.update(slots=[]), WrongPassphraseError),
    (lambda h: _slot(h).pop("salt"), CorruptFileError),
    (lambda h: _slot(h).update(salt=12345), CorruptFileError),
])
def test_hostile_header_refused_with_a_specific_error(closed_file, mutate, error):
    path, _ = closed_file
    header = read_header(path)
    mutate(header)
    write_header(path, header)
    with pytest.raises(error):
        reopen(path)


def test_plaintext_flag_flipped_in_header(closed_file):
    path, _ = closed_file
    header = read_header(path)
    header["encrypted"] = False
    write_header(path, header)
    with pytest.raises(EngramError):
        reopen(path, passphrase=None)
    with pytest.raises(ModeMismatchError):
        reopen(path)


def test_header_replaced_by_another_store_header(tmp_path, closed_file):
    """A header (with the same passphrase) from another store unwraps another DEK: the state
    record does not open under it, so the open fails instead of reading garbage."""
    path, _ = closed_file
    other = tmp_path / "other.engram"
    engram.open(other, passphrase=PASSPHRASE, kdf=TEST_KDF).close()
    write_header(path, read_header(other))
    with pytest.raises(DecryptionError):
        reopen(path)


def test_export_and_import_key_restore_a_destroyed_header(tmp_path, closed_file):
    path, nodes = closed_file
    with reopen(path) as db:
        db.export_key(tmp_path / "t.key")
    assert os.stat(tmp_path / "t.key").st_mode & 0o777 == 0o600
    write_header(path, {"junk": True}, recompute_sha=False)
    with pytest.raises(CorruptFileError):
        reopen(path)
    with pytest.raises(WrongPassphraseError):
        engram.import_key(path, tmp_path / "t.key", passphrase="wrong")
    engram.import_key(path, tmp_path / "t.key", passphrase=PASSPHRASE)
    assert_intact(path, nodes)


def test_import_key_of_another_store_is_refused(tmp_path, closed_file):
    path, nodes = closed_file
    other = tmp_path / "other.engram"
    with engram.open(other, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.export_key(tmp_path / "other.key")
    with pytest.raises(DecryptionError):
        engram.import_key(path, tmp_path / "other.key", passphrase=PASSPHRASE)
    (tmp_path / "junk.key").write_bytes(b"not a key file")
    with pytest.raises(ForeignFileError):
        engram.import_key(path, tmp_path / "junk.key", passphrase=PASSPHRASE)
    assert_intact(path, nodes)


# --- envelopes ---------------------------------------------------------------------------

def _node_envelopes(path) -> dict[bytes, bytes]:
    env = raw(path)
    nodes_db = raw_table(env, 1)
    with env.begin() as txn:
        items = dict(txn.cursor(db=nodes_db))
    env.close()
    return items


def _put_raw(path, table: int, key: bytes, value: bytes | None):
    env = raw(path)
    db = raw_table(env, table)
    with env.begin(write=True) as txn:
        if value is None:
            txn.delete(key, db=db)
        else:
            txn.put(key, value, db=db)
    env.close()


def test_envelope_byte_flips_raise_decryption_error(closed_file):
    path, nodes = closed_file
    key, envelope = sorted(_node_envelopes(path).items())[0]
    with reopen(path) as db:
        victim = next(n for n in nodes if _docno(db, n) == codec.from_u64(key))
    for pos in range(0, len(envelope), 3):
        damaged = bytearray(envelope)
        damaged[pos] ^= 0x01
        _put_raw(path, 1, key, bytes(damaged))
        with reopen(path) as db:
            with pytest.raises(DecryptionError):
                db.get(victim)
            assert any(p.kind == "decrypt" for p in db.verify())
    _put_raw(path, 1, key, envelope)
    assert_intact(path, nodes)


def _docno(db, id_):
    with db._store.read() as txn:
        return codec.from_u64(txn.get("ids", db._id_key(id_)))


def test_ciphertext_moved_to_another_key(closed_file):
    path, nodes = closed_file
    (k1, e1), (k2, e2) = sorted(_node_envelopes(path).items())[:2]
    _put_raw(path, 1, k1, e2)
    _put_raw(path, 1, k2, e1)
    with reopen(path) as db:
        for i in nodes:
            if _docno(db, i) in (codec.from_u64(k1), codec.from_u64(k2)):
                with pytest.raises(DecryptionError):
                    db.get(i)
            else:
                assert db.get(i) == nodes[i]
        assert db.verify()  # the decryption failures are reported
    _put_raw(path, 1, k1, e1)
    _put_raw(path, 1, k2, e2)
    assert_intact(path, nodes)


def test_ciphertext_moved_to_another_table(closed_file):
    path, nodes = closed_file
    key, envelope = sorted(_node_envelopes(path).items())[0]
    # The same key bytes in another table (edges, t6): it must not open there either.
    _put_raw(path, 6, key, envelope)
    with reopen(path) as db:
        with db._store.read() as txn, pytest.raises(DecryptionError):
            txn.get("edges", key)
        assert "decrypt" in {p.kind for p in db.verify()}
    _put_raw(path, 6, key, None)
    # An id-map envelope (t2) moved into the nodes table under a node's key.
    env = raw(path)
    ids_db = raw_table(env, 2)
    with env.begin() as txn:
        _id_key, id_env = next(iter(txn.cursor(db=ids_db)))
    env.close()
    _put_raw(path, 1, key, id_env)
    with reopen(path) as db, pytest.raises(DecryptionError):
        list(db.scan())
    _put_raw(path, 1, key, envelope)
    assert_intact(path, nodes)


def test_verify_detects_a_deleted_record(closed_file):
    path, _nodes = closed_file
    key = sorted(_node_envelopes(path))[0]
    _put_raw(path, 1, key, None)
    with reopen(path) as db:
        kinds = {p.kind for p in db.verify()}
    assert "digest" in kinds and "ids" in kinds


def test_verify_detects_a_rolled_back_record(closed_file):
    path, _nodes = closed_file
    before = _node_envelopes(path)
    with reopen(path) as db:
        db.update("id0", content="changed")
    after = _node_envelopes(path)
    (key,) = [k for k in before if before[k] != after[k]]
    _put_raw(path, 1, key, before[key])  # the older envelope authenticates: only the digest sees it
    with reopen(path) as db:
        assert db.get("id0").content == "memory 0"
        problems = db.verify()
    assert "digest" in {p.kind for p in problems}
    assert "decrypt" not in {p.kind for p in problems}


# --- foreign, truncated and empty files ----------------------------------------------------

def test_random_file(tmp_path):
    path = tmp_path / "random.engram"
    path.write_bytes(os.urandom(64 * 1024))
    with pytest.raises(ForeignFileError):
        reopen(path)


def test_sqlite_file(tmp_path):
    path = tmp_path / "sqlite.engram"
    con = sqlite3.connect(path)
    con.execute("create table t (x)")
    con.execute("insert into t values (1)")
    con.commit()
    con.close()
    with pytest.raises(ForeignFileError, match="SQLite"):
        reopen(path)


def test_terronex_engram_file(tmp_path):
    path = tmp_path / "terronex.engram"
    path.write_bytes(b"ENGRAM\x01\x00" + os.urandom(10_000))
    with pytest.raises(ForeignFileError) as info:
        reopen(path)
    assert "import" in info.value.hint


def test_foreign_lmdb_file(tmp_path):
    path = tmp_path / "lmdb.engram"
    env = lmdb.open(str(path), subdir=False)
    with env.begin(write=True) as txn:
        txn.put(b"somebody", b"else's data")
    env.close()
    with pytest.raises(ForeignFileError):
        reopen(path)
    env = lmdb.open(str(path), subdir=False)
    with env.begin() as txn:
        assert list(txn.cursor()) == [(b"somebody", b"else's data")]  # nothing was added to it
    env.close()


@pytest.mark.parametrize("size, error", [(0, CorruptFileError), (100, ForeignFileError),
                                         (4095, ForeignFileError)])
def test_short_files(tmp_path, closed_file, size, error):
    path, _ = closed_file
    with open(path, "r+b") as fh:
        fh.truncate(size)
    with pytest.raises(error):
        reopen(path)


def test_truncated_file(closed_file):
    path, _ = closed_file
    size = os.path.getsize(path)
    with open(path, "r+b") as fh:
        fh.truncate(size - 4096)
    with pytest.raises(CorruptFileError, match="truncated"):
        reopen(path)


def test_missing_file(tmp_path):
    with pytest.raises(FileMissingError):
        reopen(tmp_path / "nope.engram", create=False)
    with pytest.raises(FileMissingError):
        reopen(tmp_path / "nope.engram", readonly=True)
    assert not (tmp_path / "nope.engram").exists()


_values = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.text(max_size=20),
                    st.binary(max_size=40), st.lists(st.integers(0, 3), max_size=3),
                    st.dictionaries(st.text(max_size=5), st.integers(-5, 5), max_size=3))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hostile_header_values_raise_only_engram_errors(tmp_path_factory, data):
    """Any value in any header field (the attacker recomputes the checksum): the open
    fails with an EngramError or succeeds with the right data; never a library exception."""
    path = tmp_path_factory.mktemp("hostile") / "h.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("payload", id="p")
    header = read_header(path)
    target = data.draw(st.sampled_from(["header", "slot"]))
    where = header if target == "header" else header["slots"][0]
    key = data.draw(st.sampled_from(sorted(where)))
    if data.draw(st.booleans()):
        where.pop(key)
    else:
        where[key] = data.draw(_values)
    write_header(path, header)
    try:
        db = reopen(path)
    except EngramError:
        return
    with db:
        assert db.get("p").content == "payload"


@settings(max_examples=40, deadline=None)
@given(st.one_of(st.binary(max_size=200), _values))
def test_arbitrary_header_bytes_raise_only_engram_errors(tmp_path_factory, junk):
    path = tmp_path_factory.mktemp("junk") / "j.engram"
    engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF).close()
    data = junk if isinstance(junk, bytes) else msgpack.packb(junk, use_bin_type=True)
    env = raw(path)
    meta = raw_table(env, 0)
    with env.begin(write=True) as txn:
        for key in (b"header", b"header.bak"):
            txn.put(key, data, db=meta)
        txn.put(b"header.sha256", hashlib.sha256(data).digest(), db=meta)
    env.close()
    with pytest.raises(EngramError):
        reopen(path)


def test_key_file_errors_are_engram_errors(tmp_path, closed_file):
    path, _ = closed_file
    with pytest.raises(FileMissingError):
        engram.import_key(path, tmp_path / "missing.key", passphrase=PASSPHRASE)
    with reopen(path) as db:
        with pytest.raises(EngramError):
            db.export_key(tmp_path / "no-such-dir" / "k.key")
        existing = tmp_path / "k.key"
        existing.write_bytes(b"old")
        os.chmod(existing, 0o644)
        db.export_key(existing)  # an existing, world-readable file is narrowed to 0600
    assert os.stat(existing).st_mode & 0o777 == 0o600


def test_verify_reports_a_commit_made_outside_engramdb(closed_file):
    path, _nodes = closed_file
    with reopen(path) as db:
        assert db.verify() == []
    _put_raw(path, 6, b"stray", b"value")
    _put_raw(path, 6, b"stray", None)  # no net change, but two foreign commits
    with reopen(path) as db:
        assert [p.kind for p in db.verify()] == ["state"]
        db.add("an engramdb commit re-binds the state", id="new")
        assert db.verify() == []


def test_verified_open_refuses_a_snapshot_that_is_not_the_last_engramdb_commit(closed_file):
    path, nodes = closed_file
    _put_raw(path, 6, b"stray", b"value")  # commits engramdb did not make
    _put_raw(path, 6, b"stray", None)
    with pytest.raises(CorruptFileError, match="outside engramdb"):
        reopen(path, verify=True, repair=False)
    with reopen(path) as db:  # the repair open still reads, and verify(fix=True) re-binds
        assert db.get("id0") == nodes["id0"]
        assert [p.kind for p in db.verify(fix=True)] == ["state"]
    with reopen(path, verify=True, repair=False) as db:
        assert db.verify() == []


def test_every_open_refuses_a_commit_made_outside_engramdb(closed_file):
    """Issue 16, finding 2: the state is bound to LMDB's commit id on every open, not only
    with verify=True, so a file committed to with raw LMDB is not silently used."""
    path, _nodes = closed_file
    _put_raw(path, 6, b"stray", b"value")
    for kwargs in ({}, {"readonly": True}, {"verify": True}):
        with pytest.raises(CorruptFileError, match="outside engramdb"):
            reopen(path, repair=False, **kwargs)
