"""Sealing, key wrapping and the KDF guard rails (crypto.py), without a file."""
from __future__ import annotations

import os

import pytest
from conftest import nodes
from hypothesis import given, settings
from hypothesis import strategies as st

from engramdb import codec, crypto
from engramdb.crypto import KDFParams, Sealer
from engramdb.errors import DecryptionError, ValidationError, WeakKDFError

DEK = bytes(range(32))
SEALER = Sealer(DEK)
tables = st.sampled_from([b"meta", b"nodes", b"ids", b"postings", b"vectors"])
keys = st.binary(min_size=1, max_size=64)


@settings(max_examples=100, deadline=None)
@given(tables, keys, st.binary(max_size=70_000), st.integers(0, 2**32 - 1))
def test_seal_open_round_trip(table, key, plaintext, epoch):
    envelope = SEALER.seal(table, key, plaintext, epoch)
    assert len(envelope) == len(plaintext) + crypto.ENVELOPE_OVERHEAD
    assert SEALER.open(table, key, envelope) == plaintext
    assert Sealer(DEK).open(table, key, envelope) == plaintext  # a fresh sealer derives the same keys


@settings(max_examples=50, deadline=None)
@given(nodes())
def test_node_round_trip_through_codec_and_crypto(node):
    envelope = SEALER.seal(b"nodes", codec.u64(7), codec.encode_node(node), 0)
    # a record with vectors names its spaces; the vectors come from the vector blocks (spec/vectors.md)
    fetch = lambda names: {n: node.embeddings[n] for n in names}  # noqa: E731
    assert codec.decode_node(SEALER.open(b"nodes", codec.u64(7), envelope), fetch=fetch) == node


def test_plaintext_sealer_round_trip_and_version_check():
    plain = Sealer(None, plain_blind_key=b"k" * 32)
    envelope = plain.seal(b"nodes", b"k", b"value", 0)
    assert envelope == b"\x00value"
    assert plain.open(b"nodes", b"k", envelope) == b"value"
    with pytest.raises(DecryptionError):
        plain.open(b"nodes", b"k", b"\x01value")
    with pytest.raises(ValidationError):
        Sealer(None)


def test_every_envelope_byte_flip_is_detected():
    envelope = SEALER.seal(b"nodes", b"key", b"some secret plaintext", 3)
    for pos in range(len(envelope)):
        for bit in (0, 7):
            damaged = bytearray(envelope)
            damaged[pos] ^= 1 << bit
            with pytest.raises(DecryptionError):
                SEALER.open(b"nodes", b"key", bytes(damaged))


def test_truncated_and_extended_envelopes_are_detected():
    envelope = SEALER.seal(b"nodes", b"key", b"plaintext", 0)
    for n in range(len(envelope)):
        with pytest.raises(DecryptionError):
            SEALER.open(b"nodes", b"key", envelope[:n])
    with pytest.raises(DecryptionError):
        SEALER.open(b"nodes", b"key", envelope + b"\x00")


def test_envelope_is_bound_to_table_key_and_store():
    envelope = SEALER.seal(b"nodes", b"key1", b"plaintext", 0)
    for table, key in ((b"nodes", b"key2"), (b"ids", b"key1"), (b"node", b"skey1"), (b"nodes", b"key1\x00")):
        with pytest.raises(DecryptionError):
            SEALER.open(table, key, envelope)
    with pytest.raises(DecryptionError):
        Sealer(os.urandom(32)).open(b"nodes", b"key1", envelope)


def test_epochs_use_different_keys():
    envelope = bytearray(SEALER.seal(b"nodes", b"k", b"plaintext", 1))
    envelope[1:5] = (2).to_bytes(4, "big")  # claim another epoch: another key, and the AAD changes
    with pytest.raises(DecryptionError):
        SEALER.open(b"nodes", b"k", bytes(envelope))


def test_fresh_nonce_every_seal():
    envelopes = {SEALER.seal(b"nodes", b"k", b"same", 0) for _ in range(1000)}
    nonces = {e[5:17] for e in envelopes}
    assert len(nonces) == 1000


def test_blind_index_is_stable_keyed_and_purpose_separated():
    assert SEALER.blind(b"id", b"alice") == Sealer(DEK).blind(b"id", b"alice")
    assert len(SEALER.blind(b"id", b"alice")) == 16
    assert SEALER.blind(b"id", b"alice") != SEALER.blind(b"tag", b"alice")
    assert SEALER.blind(b"id", b"alice") != Sealer(os.urandom(32)).blind(b"id", b"alice")
    assert b"alice" not in SEALER.blind(b"id", b"alice")


def test_wrap_unwrap_and_wrong_kek_or_aad():
    kek = os.urandom(32)
    nonce, wrapped = crypto.wrap_key(kek, DEK, b"aad")
    assert crypto.unwrap_key(kek, nonce, wrapped, b"aad") == DEK
    assert crypto.unwrap_key(os.urandom(32), nonce, wrapped, b"aad") is None
    assert crypto.unwrap_key(kek, nonce, wrapped, b"aaD") is None
    assert crypto.unwrap_key(kek, nonce[:-1], wrapped, b"aad") is None  # malformed, not a ValueError
    assert crypto.unwrap_key(kek, nonce, "text", b"aad") is None


def test_passphrase_normalization():
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    assert crypto.normalize_passphrase(composed) == crypto.normalize_passphrase(decomposed)
    salt = b"s" * 16
    assert crypto.derive_kek(composed, salt, KDFParams.for_tests()) == \
        crypto.derive_kek(decomposed, salt, KDFParams.for_tests())
    for bad in ("", b"", None, 5):
        with pytest.raises(ValidationError):
            crypto.normalize_passphrase(bad)


def test_raw_key_must_be_32_bytes():
    assert len(crypto.kek_from_raw_key(os.urandom(32), b"salt")) == 32
    for bad in (b"short", os.urandom(33), "x" * 32):
        with pytest.raises(ValidationError):
            crypto.kek_from_raw_key(bad, b"salt")


# --- KDF floor and cap ---------------------------------------------------------------

def test_below_floor_refused_without_the_test_switch(monkeypatch):
    monkeypatch.delenv(crypto.WEAK_KDF_ENV, raising=False)
    for params in (KDFParams.for_tests(), KDFParams(t=1, m_kib=64 * 1024, p=4), KDFParams(t=3, m_kib=1024, p=1)):
        with pytest.raises(WeakKDFError):
            params.check()
        with pytest.raises(WeakKDFError):
            crypto.derive_kek("pw", b"s" * 16, params)
    KDFParams(t=2, m_kib=19 * 1024, p=1).check()  # exactly the floor is fine
    monkeypatch.setenv(crypto.WEAK_KDF_ENV, "yes")  # only the exact value "1" switches it on
    with pytest.raises(WeakKDFError):
        KDFParams.for_tests().check()


@pytest.mark.parametrize("params", [
    KDFParams(t=10**6, m_kib=64 * 1024, p=4),
    KDFParams(t=3, m_kib=2**32, p=4),
    KDFParams(t=3, m_kib=64 * 1024, p=255),
    KDFParams(t=0, m_kib=64 * 1024, p=4),
    KDFParams(t=3, m_kib=-1, p=4),
    KDFParams(t=True, m_kib=64 * 1024, p=4),
    KDFParams(t="3", m_kib=64 * 1024, p=4),
    KDFParams(t=3, m_kib=8, p=4),  # m < 8p: argon2 itself would refuse
])
def test_hostile_parameters_refused_before_argon2_runs(params, monkeypatch):
    import argon2.low_level

    runs = []
    monkeypatch.setattr(argon2.low_level, "hash_secret_raw", lambda *a, **k: runs.append(k) or bytes(32))
    with pytest.raises(WeakKDFError):
        crypto.derive_kek("pw", b"s" * 16, params)
    assert runs == []


@pytest.mark.parametrize("data", [None, [], {"alg": "scrypt", "v": 19}, {"alg": "argon2id", "v": 16},
                                  {"alg": "argon2id", "v": 19, "t": None, "m": 8, "p": 1}])
def test_kdf_from_dict_refuses_unknown(data):
    with pytest.raises(WeakKDFError):
        KDFParams.from_dict(data).check()


def test_kdf_dict_round_trip():
    params = KDFParams(t=4, m_kib=32 * 1024, p=2)
    assert KDFParams.from_dict(params.to_dict()) == params


def test_default_profile_cost(monkeypatch):
    params = KDFParams.default()
    assert (params.t, params.m_kib, params.p) == (3, 64 * 1024, 4)
    import argon2.low_level

    runs = []
    real = argon2.low_level.hash_secret_raw
    monkeypatch.setattr(argon2.low_level, "hash_secret_raw", lambda *a, **k: runs.append(k) or real(*a, **k))
    assert len(crypto.derive_kek("pw", os.urandom(16), params)) == 32
    # the cost argon2 is asked to pay is the profile's, in full (its time is a benchmark figure)
    assert [(r["time_cost"], r["memory_cost"], r["parallelism"]) for r in runs] == [(3, 64 * 1024, 4)]


def test_a_mistyped_recovery_key_is_named_as_such():
    """A recovery key missing a group (or with one too many) was "a raw key must be exactly 32
    bytes" with the hint "generate one with os.urandom(32)"; one typed with spaces between its
    groups was refused as not base32."""
    from engramdb.header import format_recovery_key, parse_raw_key

    raw = bytes(range(32))
    key = format_recovery_key(raw)
    assert parse_raw_key(key.replace("-", " ")) == raw == parse_raw_key(" " + key.lower() + "\n")
    for bad in (key[:-5], key + "-AAAA"):
        with pytest.raises(ValidationError, match="recovery key") as info:
            parse_raw_key(bad)
        assert "os.urandom" not in info.value.hint and "add_recovery_key" in info.value.hint
