"""Encrypted dumps (AAAK-ENC): round trips, wrong passphrase, tampering and truncation."""
from __future__ import annotations

import io
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engramdb.aaak import (
    ENCRYPTED_MAGIC,
    decrypt_dump,
    encrypt_dump,
    is_encrypted_dump,
    open_encrypted_writer,
    read_dump,
    write_dump,
)
from engramdb.crypto import KDFParams
from engramdb.errors import (
    DecryptionError,
    ForeignFileError,
    FormatVersionError,
    WeakKDFError,
    WrongPassphraseError,
)
from engramdb.records import Node

KDF = KDFParams.for_tests()  # accepted because conftest sets ENGRAM_TEST_WEAK_KDF=1
CHUNK = 64 * 1024
HEADER = 74


def seal(plain: str | bytes, passphrase: str = "pw") -> bytes:
    out = io.BytesIO()
    encrypt_dump(plain, out, passphrase, kdf=KDF)
    return out.getvalue()


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 3 * CHUNK + 7]), st.text(max_size=50))
def test_round_trip_at_chunk_boundaries(size, tail):
    plain = "a" * size + tail
    data = seal(plain)
    assert data.startswith(ENCRYPTED_MAGIC) and is_encrypted_dump(data)
    assert decrypt_dump(io.BytesIO(data), "pw").read() == plain
    # ciphertext = header + plaintext + one tag per chunk (at least one chunk)
    n = len(plain.encode("utf-8"))
    chunks = max(1, -(-n // CHUNK))
    assert len(data) == HEADER + n + 16 * chunks


def test_streaming_writer_and_reader_compose_with_the_dump():
    nodes = [Node(f"n{i:03d}", content="é" * 5000) for i in range(40)]  # several chunks
    out = io.BytesIO()
    with open_encrypted_writer(out, "pw", kdf=KDF) as w:
        write_dump(w, settings={}, spaces=[], nodes=nodes)
    items = list(read_dump(decrypt_dump(io.BytesIO(out.getvalue()), "pw")))
    assert items[1:] == nodes
    plain = io.StringIO()
    write_dump(plain, settings={}, spaces=[], nodes=nodes)
    assert decrypt_dump(out.getvalue(), "pw").read() == plain.getvalue()


def test_wrong_passphrase():
    data = seal("secret dump\n", "right")
    with pytest.raises(WrongPassphraseError):
        decrypt_dump(io.BytesIO(data), "wrong")


def test_fresh_salt_and_nonce_every_time():
    assert seal("same") != seal("same")


def test_every_truncation_is_detected():
    data = seal("x" * (2 * CHUNK + 100))
    cuts = list(range(0, HEADER + 2)) + [HEADER + 16, HEADER + CHUNK + 16, HEADER + 2 * (CHUNK + 16),
                                         len(data) - 1, len(data) - 16]
    for cut in cuts:
        with pytest.raises((DecryptionError, ForeignFileError)):
            decrypt_dump(io.BytesIO(data[:cut]), "pw").read()


def test_tampering_is_detected():
    data = seal("y" * (CHUNK + 500))
    for pos in (0, 8, 12, 20, 40, 60, HEADER, HEADER + 100, HEADER + CHUNK + 16 + 3, len(data) - 1):
        bad = bytearray(data)
        bad[pos] ^= 0x01
        with pytest.raises((DecryptionError, ForeignFileError, FormatVersionError, WeakKDFError)):
            decrypt_dump(io.BytesIO(bytes(bad)), "pw").read()
    # chunks cannot be reordered, dropped or appended
    first, second = data[HEADER:HEADER + CHUNK + 16], data[HEADER + CHUNK + 16:]
    for body in (second + first, second, first + first + second, data[HEADER:] + second):
        with pytest.raises(DecryptionError):
            decrypt_dump(io.BytesIO(data[:HEADER] + body), "pw").read()


def test_header_checks():
    with pytest.raises(ForeignFileError):
        decrypt_dump(io.BytesIO(b"FILE:||||v3|dump\n"), "pw")
    data = bytearray(seal("z"))
    data[8] = 9
    with pytest.raises(FormatVersionError):
        decrypt_dump(io.BytesIO(bytes(data)), "pw")
    # a hostile header asking for 64 GiB of argon2 memory is refused before running the KDF
    data = bytearray(seal("z"))
    data[14:18] = struct.pack(">I", 64 * 1024 * 1024)
    with pytest.raises(WeakKDFError):
        decrypt_dump(io.BytesIO(bytes(data)), "pw")


def test_weak_kdf_refused_without_the_test_switch(monkeypatch):
    monkeypatch.delenv("ENGRAM_TEST_WEAK_KDF", raising=False)
    with pytest.raises(WeakKDFError):
        encrypt_dump("x", io.BytesIO(), "pw", kdf=KDF)


def test_reading_an_encrypted_dump_as_plain_says_to_decrypt_it(tmp_path):
    # engramdb.restore(encrypted bytes) said "not UTF-8 text ... look for a hand edit there"
    from engramdb.errors import AAAKParseError

    plain = io.StringIO()
    write_dump(plain, settings={}, spaces=[], nodes=[Node(id="a", content="x")], edges=[], archive=[], procedures=[])
    sealed = seal(plain.getvalue())
    path = tmp_path / "d.aaak"
    path.write_bytes(sealed)
    with open(path, "rb") as buffered, open(path, "rb", buffering=0) as raw:
        for source in (sealed, io.BytesIO(sealed), buffered, raw):
            with pytest.raises(AAAKParseError) as exc:
                list(read_dump(source))
            assert "encrypted dump" in exc.value.message and "decrypt_dump" in exc.value.hint
    with open(path, "rb") as fp:  # the check consumed nothing: decrypting the same stream works
        with pytest.raises(AAAKParseError):
            list(read_dump(fp))
        assert [type(x).__name__ for x in read_dump(decrypt_dump(fp, "pw"))][-1] == "Node"
    with open(path, encoding="utf-8") as text, pytest.raises(AAAKParseError) as exc:
        list(read_dump(text))  # a text stream cannot be peeked at: the decode error says it too
    assert "encrypted dump" in exc.value.hint
