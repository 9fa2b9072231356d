"""Keys and sealing: argon2id KDF, key slots that wrap the data key, AES-256-GCM envelopes, blind index.

The key hierarchy (spec/encryption.md)::

    passphrase --argon2id(salt, t, m, p)--> KEK --AES-GCM wrap--> DEK (32 random bytes)
    raw key / recovery key --HKDF(salt)--> KEK --AES-GCM wrap--> the same DEK
    DEK --HKDF(info="engramdb/v1/seal/<epoch>")--> sealing key of that epoch
    DEK --HKDF(info="engramdb/v1/blind")--> blind-index key
    DEK --HKDF(info="engramdb/v1/state")--> state-digest key

Every failure to open a sealed value raises :class:`DecryptionError`; nothing here
returns data that did not authenticate.
"""
from __future__ import annotations

import hashlib
import os
import struct
import unicodedata
from dataclasses import dataclass
from typing import Any, cast
from collections.abc import Iterable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from . import _accel
from .errors import DecryptionError, ValidationError, WeakKDFError

FORMAT_TAG = b"engramdb/1"
CIPHER_ID = "AES-256-GCM"
KDF_ID = "argon2id"
ENVELOPE_VERSION = 1
PLAIN_VERSION = 0
NONCE_BYTES = 12
TAG_BYTES = 16
# version(1) | epoch(4, big-endian) | nonce(12)
_ENV_HEADER = struct.Struct(">BI")
ENVELOPE_OVERHEAD = _ENV_HEADER.size + NONCE_BYTES + TAG_BYTES
# Random 96-bit nonces: after 2**28 seals one key has a collision chance below 2**-41
# (NIST SP 800-38D allows 2**32). Then a new epoch key takes over; nothing is re-encrypted.
EPOCH_LIMIT = 2**28
WEAK_KDF_ENV = "ENGRAM_TEST_WEAK_KDF"


@dataclass(frozen=True)
class KDFParams:
    """argon2id cost parameters. ``m_kib`` is memory in KiB.

    The default is RFC 9106's second recommendation (t=3, m=64 MiB, p=4). Parameters
    below the OWASP floor (t=2, m=19 MiB, p=1) are refused unless the test-only
    environment variable ``ENGRAM_TEST_WEAK_KDF=1`` is set; parameters above the cap are
    always refused, so a hostile header cannot exhaust memory or time.
    """

    t: int = 3
    m_kib: int = 64 * 1024
    p: int = 4

    FLOOR = (2, 19 * 1024, 1)
    # A header needs no key to edit (its checksum is a plain SHA-256), so the cap bounds what
    # a hostile file or dump can make one open cost: m <= 1 GiB, t <= 10, p <= 16, and
    # t * m <= 2 GiB-passes (about 6 s and 1 GiB on a 2020s laptop core; spec/encryption.md).
    CAP = (10, 1024 * 1024, 16)
    CAP_WORK_KIB = 2 * 1024 * 1024

    @classmethod
    def default(cls) -> KDFParams:
        return cls()

    @classmethod
    def for_tests(cls) -> KDFParams:
        """The cheapest profile: only accepted with ENGRAM_TEST_WEAK_KDF=1. Never use it for real data."""
        return cls(t=1, m_kib=8, p=1)

    def check(self, *, floor: bool = True) -> None:
        """Refuse weak or resource-exhausting parameters before running the KDF.

        ``floor=False`` checks all but the floor (whether a header's parameters are well formed).

        Raises:
            WeakKDFError: below the floor (without the test switch) or above the cap.
        """
        for name, value in (("t", self.t), ("m_kib", self.m_kib), ("p", self.p)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise WeakKDFError(f"argon2id parameter {name} must be a positive integer, got {value!r}")
        cap_t, cap_m, cap_p = self.CAP
        if self.t > cap_t or self.m_kib > cap_m or self.p > cap_p or self.t * self.m_kib > self.CAP_WORK_KIB:
            raise WeakKDFError(
                f"argon2id parameters t={self.t}, m={self.m_kib} KiB, p={self.p} exceed the cap "
                f"(t<={cap_t}, m<={cap_m} KiB, p<={cap_p}, t*m<={self.CAP_WORK_KIB} KiB)",
                hint="for a new file or passphrase, choose t, m and p within the cap (the default is t=3, "
                     "m=65536, p=4); a file or dump header asking for more may be hostile or corrupt",
            )
        if self.m_kib < 8 * self.p:
            raise WeakKDFError("argon2id needs m_kib >= 8 * p")
        if not floor:
            return
        floor_t, floor_m, floor_p = self.FLOOR
        weak = self.t < floor_t or self.m_kib < floor_m or self.p < floor_p
        if weak and os.environ.get(WEAK_KDF_ENV) != "1":
            raise WeakKDFError(
                f"argon2id parameters t={self.t}, m={self.m_kib} KiB, p={self.p} are below the floor "
                f"(t>={floor_t}, m>={floor_m} KiB, p>={floor_p})"
            )

    def to_dict(self) -> dict[str, Any]:
        return {"alg": KDF_ID, "v": 19, "t": self.t, "m": self.m_kib, "p": self.p}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KDFParams:
        if not isinstance(data, dict) or data.get("alg") != KDF_ID or data.get("v") != 19:
            raise WeakKDFError(f"unsupported KDF {data!r}; this version reads argon2id v19 only")
        # the types are checked by __post_init__, which names a missing or non-integer value
        return cls(t=cast(int, data.get("t")), m_kib=cast(int, data.get("m")), p=cast(int, data.get("p")))


def normalize_passphrase(passphrase: str | bytes) -> bytes:
    """NFC-normalize a str passphrase and encode it as UTF-8 (bytes pass through).

    Raises:
        ValidationError: empty or not str/bytes.
    """
    if isinstance(passphrase, str):
        data = unicodedata.normalize("NFC", passphrase).encode("utf-8")
    elif isinstance(passphrase, (bytes, bytearray)):
        data = bytes(passphrase)
    else:
        raise ValidationError("passphrase must be str or bytes")
    if not data:
        raise ValidationError("the passphrase is empty", hint="choose a non-empty passphrase")
    return data


def derive_kek(passphrase: str | bytes, salt: bytes, params: KDFParams) -> bytes:
    """argon2id(passphrase, salt, params) -> 32-byte key-encryption key.

    Raises:
        WeakKDFError: the parameters are outside the allowed range (checked first).
        ValidationError: the passphrase is empty.
    """
    from argon2.low_level import Type, hash_secret_raw

    params.check()
    return hash_secret_raw(
        secret=normalize_passphrase(passphrase), salt=salt, time_cost=params.t,
        memory_cost=params.m_kib, parallelism=params.p, hash_len=32, type=Type.ID, version=19,
    )


def hkdf(key: bytes, info: bytes, salt: bytes | None = None) -> bytes:
    """HKDF-SHA256 to 32 bytes."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=info).derive(key)


def kek_from_raw_key(raw_key: bytes, salt: bytes) -> bytes:
    """A raw 32-byte key (OS keychain, recovery key) -> KEK. It is already uniform, so HKDF suffices."""
    if not isinstance(raw_key, (bytes, bytearray)) or len(raw_key) != 32:
        raise ValidationError("a raw key must be exactly 32 bytes", hint="generate one with os.urandom(32)")
    return hkdf(bytes(raw_key), b"engramdb/v1/keyslot", salt)


def wrap_key(kek: bytes, dek: bytes, aad: bytes) -> tuple[bytes, bytes]:
    """Wrap the DEK under a KEK; returns (nonce, ciphertext)."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce, AESGCM(kek).encrypt(nonce, dek, aad)


def unwrap_key(kek: bytes, nonce: bytes, wrapped: bytes, aad: bytes) -> bytes | None:
    """The DEK, or None when this KEK (or the authenticated header) does not match."""
    if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES or not isinstance(wrapped, bytes):
        return None
    try:
        dek = AESGCM(kek).decrypt(nonce, wrapped, aad)
    except InvalidTag:
        return None
    return dek if len(dek) == 32 else None


_U16 = struct.Struct(">H")


def _aad_prefix(table: bytes) -> bytes:
    return b"".join((FORMAT_TAG, b"\x00", bytes((len(table),)), table))


def value_aad(table: bytes, key: bytes, header: bytes) -> bytes:
    """AAD of a sealed value: format tag, table and key length-prefixed, then the envelope header."""
    return b"".join((_aad_prefix(table), _U16.pack(len(key)), key, header))


class HmacSha256:
    """HMAC-SHA256 under one fixed key, equal to ``hmac.digest(key, msg, "sha256")``.

    The key's inner and outer pad states are hashed once (RFC 2104); each message then
    costs two SHA-256 state copies instead of a fresh keyed HMAC context: about half the
    time of ``hmac.digest`` on the short messages of blind indexes and state digests.
    """

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes) -> None:
        if len(key) > 64:  # longer keys are hashed first (RFC 2104); ours are 32 bytes
            key = hashlib.sha256(key).digest()
        key = key.ljust(64, b"\x00")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in key))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in key))

    def digest(self, msg: bytes) -> bytes:
        inner = self._inner.copy()
        inner.update(msg)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()

    def digests(self, msgs: Iterable[bytes]) -> list[bytes]:
        """:meth:`digest` of each message (one Python call for a batch)."""
        out = []
        inner_copy, outer_copy = self._inner.copy, self._outer.copy
        for msg in msgs:
            inner = inner_copy()
            inner.update(msg)
            outer = outer_copy()
            outer.update(inner.digest())
            out.append(outer.digest())
        return out


class Sealer:
    """Seals and opens values of one store; holds the DEK-derived subkeys.

    With ``dek=None`` the store is a plaintext file (created with ``encrypted=False``):
    values carry a version byte of 0 and no tag; blind-index keys still come from a
    per-store random key so key layouts are the same in both modes.
    """

    def __init__(self, dek: bytes | None, *, plain_blind_key: bytes | None = None) -> None:
        self.encrypted = dek is not None
        self._dek = dek
        self._ciphers: dict[int, AESGCM] = {}
        self._seal_keys: dict[int, bytes] = {}
        # the C extension's batched calls (engramdb/_accel.py), or None for the pure-Python path
        self._native = _accel.NATIVE
        if dek is not None:
            self._blind_key = hkdf(dek, b"engramdb/v1/blind")
            self.state_key = hkdf(dek, b"engramdb/v1/state")
        else:
            if plain_blind_key is None:
                raise ValidationError("a plaintext store needs its blind key")
            self._blind_key = plain_blind_key
            self.state_key = hashlib.sha256(b"engramdb/v1/state" + plain_blind_key).digest()
        self._blind_hmac = HmacSha256(self._blind_key)
        self._state_hmac = HmacSha256(self.state_key)

    def _derive_seal_key(self, epoch: int) -> bytes:
        assert self._dek is not None
        return hkdf(self._dek, b"engramdb/v1/seal/" + struct.pack(">I", epoch))

    def _seal_key(self, epoch: int) -> bytes:
        """The raw sealing key of an epoch we seal with (for the extension)."""
        key = self._seal_keys.get(epoch)
        if key is None:
            key = self._seal_keys[epoch] = self._derive_seal_key(epoch)
        return key

    def _cipher(self, epoch: int, *, remember: bool = True) -> AESGCM:
        cipher = self._ciphers.get(epoch)
        if cipher is None:
            cipher = AESGCM(self._derive_seal_key(epoch))
            if remember:
                self._ciphers[epoch] = cipher
        return cipher

    def seal(self, table: bytes, key: bytes, plaintext: bytes, epoch: int) -> bytes:
        """An envelope: version | epoch | nonce | AES-GCM(plaintext, aad=table+key+header)."""
        if not self.encrypted:
            return bytes((PLAIN_VERSION,)) + plaintext
        return self._seal_with_nonce(table, key, plaintext, epoch, os.urandom(NONCE_BYTES))

    def seal_many(self, table: bytes, items: list[tuple[bytes, bytes]], epoch: int) -> list[bytes]:
        """:meth:`seal` for many ``(key, plaintext)`` pairs of one table: their envelopes, in order.

        One ``os.urandom`` call draws every nonce (each is still 96 fresh random bits, used once).
        """
        if not self.encrypted:
            version = bytes((PLAIN_VERSION,))
            return [version + plaintext for _, plaintext in items]
        header = _ENV_HEADER.pack(ENVELOPE_VERSION, epoch)
        prefix = _aad_prefix(table)
        nonces = os.urandom(NONCE_BYTES * len(items))
        return self._seal_many_with_nonces(prefix, header, items, epoch, nonces)

    def _seal_many_with_nonces(self, prefix: bytes, header: bytes, items: list[tuple[bytes, bytes]], epoch: int,
                               nonces: bytes) -> list[bytes]:
        # Private seam for the differential test (extension vs pure Python on the same nonces).
        if self._native is not None:
            return self._native.seal_many(self._seal_key(epoch), header, prefix, nonces, items)
        encrypt = self._cipher(epoch).encrypt
        # the AAD's part before the key, per key length (a table's keys mostly share one)
        heads = {n: prefix + _U16.pack(n) for n in {len(key) for key, _ in items}}
        out = []
        for i, (key, plaintext) in enumerate(items):
            nonce = nonces[i * NONCE_BYTES:(i + 1) * NONCE_BYTES]
            out.append(header + nonce + encrypt(nonce, plaintext, heads[len(key)] + key + header))
        return out

    def _seal_with_nonce(self, table: bytes, key: bytes, plaintext: bytes, epoch: int, nonce: bytes) -> bytes:
        # Private seam for test vectors; the public path always draws a fresh random nonce.
        header = _ENV_HEADER.pack(ENVELOPE_VERSION, epoch)
        ct = self._cipher(epoch).encrypt(nonce, plaintext, value_aad(table, key, header))
        return header + nonce + ct

    def open(self, table: bytes, key: bytes, envelope: bytes) -> bytes:
        """The plaintext of an envelope.

        Raises:
            DecryptionError: wrong version, truncated, tampered, or moved to another table/key.
        """
        if not self.encrypted:
            if envelope[:1] != bytes((PLAIN_VERSION,)):
                raise DecryptionError("a value in a plaintext file has an unknown version byte")
            return envelope[1:]
        if len(envelope) < ENVELOPE_OVERHEAD:
            raise DecryptionError("a sealed value is truncated")
        version, epoch = _ENV_HEADER.unpack_from(envelope)
        if version != ENVELOPE_VERSION:
            raise DecryptionError(f"a sealed value has unknown envelope version {version}")
        head = _ENV_HEADER.size
        nonce = envelope[head:head + NONCE_BYTES]
        # The epoch is read before authentication: cache its cipher only once a value opens with
        # it, or damaged values with 2**32 distinct epochs would grow the cache without bound.
        cipher = self._cipher(epoch, remember=False)
        try:
            plaintext = cipher.decrypt(nonce, envelope[head + NONCE_BYTES:], value_aad(table, key, envelope[:head]))
        except InvalidTag:
            raise DecryptionError(
                "a sealed value failed authentication (tampered, truncated, or moved to another record)"
            ) from None
        self._ciphers.setdefault(epoch, cipher)
        return plaintext

    def blind(self, purpose: bytes, value: bytes) -> bytes:
        """HMAC-SHA256(blind key, purpose NUL value)[:16]: a stable, unreadable index key."""
        return self._blind_hmac.digest(purpose + b"\x00" + value)[:16]

    def blind_many(self, purpose: bytes, values: Iterable[bytes]) -> list[bytes]:
        """:meth:`blind` of each value."""
        head = purpose + b"\x00"
        if self._native is not None:
            return self._native.hmac_many(self._blind_key, head, values if isinstance(values, list) else list(values), 16)
        return [mac[:16] for mac in self._blind_hmac.digests([head + value for value in values])]

    def state_term(self, table: bytes, key: bytes, envelope: bytes) -> int:
        """This entry's term of the additive per-table state digest (reliability rule 38)."""
        return int.from_bytes(self._state_hmac.digest(table + b"\x00" + key + hashlib.sha256(envelope).digest()), "big")

    def state_terms(self, table: bytes, pairs: list[tuple[bytes, bytes]]) -> int:
        """The sum of :meth:`state_term` over ``(key, envelope)`` pairs of one table, modulo
        2**256 (the digest's modulus)."""
        sha, prefix = hashlib.sha256, table + b"\x00"
        if self._native is not None:
            return int.from_bytes(self._native.state_sum(self.state_key, prefix, pairs), "big")
        macs = self._state_hmac.digests([prefix + key + sha(envelope).digest() for key, envelope in pairs])
        return sum(int.from_bytes(mac, "big") for mac in macs) % 2**256
