"""The file header and its key slots: what a .engram file says about itself before any key is
known (format and version, cipher, store id; plaintext files, their index key), the data
key wrapped once per passphrase or raw key, the recovery-key text form, and the exported key
file (spec/file-format.md, "meta" and "Reading the header"; spec/encryption.md).

The header sits in the ``meta`` table under :data:`~engramdb.store.HEADER_KEYS` (a primary
copy, a backup and their SHA-256), unsealed. The facade opens and creates files with these.
"""
from __future__ import annotations

import base64
import builtins
import hashlib
import os
from typing import Any
from collections.abc import Mapping

from . import codec, crypto
from .errors import CorruptFileError, ForeignFileError, FormatVersionError, ModeMismatchError, ValidationError, \
    WeakKDFError, WrongPassphraseError
from .store import HEADER_KEYS, Txn

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "KEYFILE_MAGIC", "format_recovery_key", "make_slot", "new_header",
           "pack_key_file", "parse_raw_key", "read_header", "read_key_file", "sealer_for", "unlock",
           "unpack_key_file", "write_header"]

FORMAT_NAME = "engramdb"
FORMAT_VERSION = (1, 0)  # (major, minor): a newer major is refused; a newer minor opens
RECOVERY_PREFIX = "ERK1-"
KEYFILE_MAGIC = b"ENGRAMDB-KEY\x00\x01"
# the header fields every slot's wrap is bound to (besides the slot's own): a slot made for
# one header unwraps under another only when these are equal
SLOT_BOUND_FIELDS = ("format", "version", "cipher", "store_id")
# What to do about a damaged header. Not "run `engramdb verify`": verify opens the file
# first, and fails the same way.
DAMAGED_HEADER_HINT = ("put the header back with `engramdb import-key FILE KEYFILE` (engramdb.import_key) from the key "
                       "file `engramdb export-key` wrote; without one, restore from a dump or backup")


def _slot_aad(header: Mapping[str, Any], slot: Mapping[str, Any]) -> bytes:
    """The wrap's associated data: everything that must not change without the key noticing."""
    return codec.pack([crypto.FORMAT_TAG, header["format"], list(header["version"]), header["cipher"],
                       header["store_id"], slot["kind"], slot.get("label", ""), slot.get("kdf"), slot["salt"]])


def make_slot(header: Mapping[str, Any], dek: bytes, *, passphrase: str | bytes | None = None,
               raw_key: bytes | None = None, kdf: crypto.KDFParams | None = None, label: str = "") -> dict[str, Any]:
    salt = os.urandom(16)
    slot: dict[str, Any]
    if passphrase is not None:
        params = kdf or crypto.KDFParams.default()
        slot = {"kind": "passphrase", "label": label, "kdf": params.to_dict(), "salt": salt}
        kek = crypto.derive_kek(passphrase, salt, params)
    else:
        if raw_key is None:
            raise ValidationError("a key slot needs a passphrase or a raw key")
        slot = {"kind": "key", "label": label, "kdf": None, "salt": salt}
        kek = crypto.kek_from_raw_key(raw_key, salt)
    slot["nonce"], slot["wrapped"] = crypto.wrap_key(kek, dek, _slot_aad(header, slot))
    return slot


def _slot_kdf(slot: Mapping[str, Any], *, floor: bool = True) -> crypto.KDFParams:
    """A passphrase slot's argon2id parameters, checked before they cost anything
    (``floor=False``: all but the floor).

    Raises:
        WeakKDFError: malformed, above the cap, or below the floor (a file made with the
            test-only parameters), each with what to do about it.
    """
    try:
        params = crypto.KDFParams.from_dict(slot["kdf"])
        params.check(floor=False)
    except WeakKDFError as exc:
        raise WeakKDFError(f"the passphrase slot in the header: {exc.message}",
                           hint="the header may be hostile or damaged: " + DAMAGED_HEADER_HINT) from None
    if floor:
        try:
            params.check()
        except WeakKDFError as exc:  # a file made with ENGRAM_TEST_WEAK_KDF=1
            raise WeakKDFError(f"the passphrase slot in the header: {exc.message}",
                               hint=f"the file was made with test-only parameters: open it with "
                                    f"{crypto.WEAK_KDF_ENV}=1 set and `engramdb rekey` it (db.rekey) with the "
                                    "default ones; if its header is damaged, " + DAMAGED_HEADER_HINT) from None
    return params


def unlock(header: Mapping[str, Any], *, passphrase: str | bytes | None, raw_key: bytes | None) -> bytes:
    kind = "passphrase" if passphrase is not None else "key"
    if not isinstance(header.get("slots"), list):
        raise CorruptFileError("the header's key slots are malformed", hint=DAMAGED_HEADER_HINT)
    slots = [s for s in header["slots"] if isinstance(s, dict) and s.get("kind") == kind]
    if not slots:
        raise WrongPassphraseError(f"this file has no {kind} slot",
                                   hint="open it with the passphrase" if kind == "key" else None)
    if kind == "passphrase" and len(slots) > 1:
        # engramdb writes one passphrase slot (rekey replaces it); each would cost a full KDF run,
        # so a header listing thousands of them could make open() run for hours
        raise CorruptFileError(f"the header lists {len(slots)} passphrase slots; engramdb writes one",
                               hint=DAMAGED_HEADER_HINT)
    for slot in slots:
        salt = slot.get("salt")
        if not isinstance(salt, bytes) or not 8 <= len(salt) <= 1024:  # argon2 needs >= 8 bytes
            raise CorruptFileError("a key slot in the header has a malformed salt", hint=DAMAGED_HEADER_HINT)
        try:
            if passphrase is not None:
                kek = crypto.derive_kek(passphrase, slot["salt"], _slot_kdf(slot))
            elif raw_key is not None:
                kek = crypto.kek_from_raw_key(raw_key, slot["salt"])
            else:
                raise ValidationError("give a passphrase or a raw key")
            dek = crypto.unwrap_key(kek, slot["nonce"], slot["wrapped"], _slot_aad(header, slot))
        except (KeyError, TypeError):
            raise CorruptFileError("a key slot in the header is malformed", hint=DAMAGED_HEADER_HINT) from None
        if dek is not None:
            return dek
    raise WrongPassphraseError("the passphrase does not unlock this file" if kind == "passphrase"
                               else "the key does not unlock this file")


def usable(header: Mapping[str, Any]) -> bool:
    """Whether every key slot of ``header`` has the shape engramdb writes (without trying a
    key). A header whose checksum matches can still be malformed: edited, checksum and all."""
    slots = header.get("slots")
    if not isinstance(slots, list) or not slots:
        return False
    for slot in slots:
        if not (isinstance(slot, dict) and slot.get("kind") in ("passphrase", "key")
                and isinstance(slot.get("salt"), bytes) and 8 <= len(slot["salt"]) <= 1024
                and isinstance(slot.get("nonce"), bytes) and len(slot["nonce"]) == crypto.NONCE_BYTES
                and isinstance(slot.get("wrapped"), bytes)):
            return False
        if slot["kind"] == "passphrase":
            try:
                _slot_kdf(slot, floor=False)  # the floor is no damage: ENGRAM_TEST_WEAK_KDF=1 opens it
            except WeakKDFError:
                return False
    return True


def parse_raw_key(key: bytes | str) -> bytes:
    """Accept 32 raw bytes or a recovery key string ``ERK1-XXXX-...``."""
    if isinstance(key, (bytes, bytearray)):
        return bytes(key)
    if isinstance(key, str):
        text = "".join(key.split()).upper()  # groups may be typed with spaces instead of dashes
        if text.startswith(RECOVERY_PREFIX.rstrip("-")):  # "ERK1 ..." typed with a space: "1" is not base32
            text = text[len(RECOVERY_PREFIX) - 1:]
        text = text.replace("-", "")
        hint = "copy it exactly as add_recovery_key() printed it (ERK1- and 13 groups of 4 characters)"
        try:
            raw = base64.b32decode(text + "=" * (-len(text) % 8))
        except ValueError:
            raise ValidationError("the recovery key is not valid base32", hint=hint) from None
        if len(raw) != 32:  # a group left out or one too many: say so, not "a raw key must be 32 bytes"
            raise ValidationError(f"the recovery key has {len(text)} characters after ERK1-, not 52: it is "
                                  "incomplete or has extra characters", hint=hint)
        return raw
    raise ValidationError("key must be 32 bytes or a recovery-key string")


def read_key_file(path: str | os.PathLike[str]) -> bytes | str:
    """The key in a --key-file: exactly 32 raw bytes, or a recovery key (``ERK1-...``) as text.

    Raises:
        ValidationError: the file cannot be read or holds neither.
    """
    try:
        with builtins.open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise ValidationError(f"cannot read {path}: {exc.strerror}",
                              hint="check the path and its permissions") from None
    if len(data) == 32:
        return data
    if data.startswith(KEYFILE_MAGIC):
        raise ValidationError(f"{path} is a key header backup (written by `engramdb export-key`); it holds no key",
                              hint="pass the recovery key (ERK1-..., as `engramdb recovery-key` printed it) or the "
                                   "32 raw key bytes; a header backup goes to `engramdb import-key FILE KEYFILE`")
    try:
        text = data.decode("utf-8-sig").strip()  # a key saved by an editor that writes a byte-order mark
    except UnicodeDecodeError:
        text = ""
    if text.upper().startswith(RECOVERY_PREFIX[:4]):  # a recovery key: say what is wrong with it
        try:
            parse_raw_key(text)
        except ValidationError as exc:
            raise ValidationError(f"{path}: {exc.message}", hint=exc.hint) from None
        return text
    try:  # the recovery key's groups without ERK1- (as open(key=) takes them)
        if text and len(parse_raw_key(text)) == 32:
            return text
    except ValidationError:
        pass
    raise ValidationError(f"{path} holds neither a 32-byte raw key nor a recovery key",
                          hint="put the recovery key there exactly as `engramdb recovery-key` printed it "
                               "(ERK1-...), or the 32 raw key bytes")


def format_recovery_key(raw: bytes) -> str:
    text = base64.b32encode(raw).decode().rstrip("=")
    return RECOVERY_PREFIX + "-".join(text[i:i + 4] for i in range(0, len(text), 4))


def read_header(txn: Txn, path: str) -> tuple[dict[str, Any], bytes, bool]:
    """(header, its bytes, needs_repair). Prefers the primary copy; falls back to the backup."""
    primary, backup, digest = (txn.get_header(k) for k in HEADER_KEYS)
    if primary is None and backup is None:
        # the opener found engramdb's tables holding data (else it initialises the file): lost, not foreign
        raise CorruptFileError(f"the header of {path} is missing", hint=DAMAGED_HEADER_HINT)
    chosen = None
    for candidate in (primary, backup):
        if candidate is not None and digest is not None and hashlib.sha256(candidate).digest() == digest:
            chosen = candidate
            break
    if chosen is None:
        raise CorruptFileError(f"the header of {path} is damaged (its checksum does not match)",
                               hint=DAMAGED_HEADER_HINT)
    try:
        header = codec.unpack(chosen)
    except CorruptFileError:
        raise CorruptFileError(f"the header of {path} does not decode", hint=DAMAGED_HEADER_HINT) from None
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise ForeignFileError(f"{path} is not an engramdb file")
    version = header.get("version")
    if not (isinstance(version, list) and len(version) == 2 and all(isinstance(v, int) for v in version)):
        raise CorruptFileError(f"the header of {path} has a malformed version", hint=DAMAGED_HEADER_HINT)
    if version[0] > FORMAT_VERSION[0]:
        raise FormatVersionError(f"{path} uses format {version[0]}.{version[1]}; this engramdb reads "
                                 f"{FORMAT_VERSION[0]}.x")
    return header, chosen, chosen != primary or backup != primary


def write_header(txn: Txn, header: Mapping[str, Any]) -> None:
    data = codec.pack(dict(header))
    txn.put_header(b"header", data)
    txn.put_header(b"header.bak", data)
    txn.put_header(b"header.sha256", hashlib.sha256(data).digest())


def new_header(*, encrypted: bool, passphrase: str | bytes | None, raw_key: bytes | None,
               kdf: crypto.KDFParams | None) -> tuple[dict[str, Any], crypto.Sealer]:
    """A new file's header and the sealer of its records: a fresh data key wrapped in one
    slot (encrypted), or a fresh index key in the header (plaintext).

    Raises:
        ModeMismatchError: an encrypted file without a passphrase or key, or a plaintext
            one with either.
    """
    from . import __version__

    header: dict[str, Any] = {
        "format": FORMAT_NAME, "version": list(FORMAT_VERSION), "created_by": __version__,
        "encrypted": bool(encrypted), "cipher": crypto.CIPHER_ID, "kdf": crypto.KDF_ID,
        "store_id": os.urandom(16), "slots": [],
    }
    if encrypted:
        if passphrase is None and raw_key is None:
            raise ModeMismatchError("a new encrypted file needs a passphrase or key",
                                    hint="pass passphrase=..., or encrypted=False for a plaintext file")
        dek = os.urandom(32)
        header["slots"].append(make_slot(header, dek, passphrase=passphrase, raw_key=raw_key, kdf=kdf))
        return header, crypto.Sealer(dek)
    if passphrase is not None or raw_key is not None:
        raise ModeMismatchError("encrypted=False takes no passphrase or key")
    header["blind_key"] = os.urandom(32)
    return header, crypto.Sealer(None, plain_blind_key=header["blind_key"])


def sealer_for(header: Mapping[str, Any], path: str, *, passphrase: str | bytes | None,
               raw_key: bytes | None) -> crypto.Sealer:
    """The sealer of a stored file's records: its data key unwrapped with ``passphrase`` or
    ``raw_key`` (encrypted), or its index key (plaintext).

    Raises:
        ModeMismatchError: no passphrase or key for an encrypted file, or one for a
            plaintext file.
        WrongPassphraseError: it does not unlock the file.
        CorruptFileError: the header is malformed or names an unknown cipher.
    """
    if header.get("encrypted"):
        if passphrase is None and raw_key is None:
            raise ModeMismatchError(f"{path} is encrypted; a passphrase or key is needed")
        sealer = crypto.Sealer(unlock(header, passphrase=passphrase, raw_key=raw_key))
    else:
        if passphrase is not None or raw_key is not None:
            raise ModeMismatchError(f"{path} is a plaintext file; it takes no passphrase or key",
                                    hint="open it without a passphrase (encrypted=False)")
        blind_key = header.get("blind_key")
        if not isinstance(blind_key, bytes) or len(blind_key) != 32:
            raise CorruptFileError("the plaintext header lacks its index key")
        sealer = crypto.Sealer(None, plain_blind_key=blind_key)
    if header.get("cipher") != crypto.CIPHER_ID:
        raise CorruptFileError(f"unknown cipher {header.get('cipher')!r}", hint=DAMAGED_HEADER_HINT)
    return sealer


# --- the exported key file (export_key / import_key) ---------------------------------------

def pack_key_file(header: Mapping[str, Any]) -> bytes:
    """The bytes of a key file holding ``header`` (salt, KDF parameters, wrapped keys)."""
    return KEYFILE_MAGIC + codec.pack(dict(header))


def unpack_key_file(data: bytes, keyfile: str | os.PathLike[str]) -> dict[str, Any]:
    """The header a key file holds.

    Raises:
        ForeignFileError: ``data`` is not an engramdb key file.
    """
    keyfile_hint = "pass the file written by export_key() / `engramdb export-key`; the store's path comes first"
    family = KEYFILE_MAGIC[:-1]  # the magic's last byte is the key file's version
    if data.startswith(family) and len(data) > len(family) and data[len(family)] > KEYFILE_MAGIC[-1]:
        raise FormatVersionError(f"{keyfile} is a key file of a newer engramdb (key file version "
                                 f"{data[len(family)]}; this engramdb reads {KEYFILE_MAGIC[-1]})")
    if not data.startswith(KEYFILE_MAGIC):
        raise ForeignFileError(f"{keyfile} is not an engramdb key file", hint=keyfile_hint)
    try:
        header = codec.unpack(data[len(KEYFILE_MAGIC):])
    except CorruptFileError:
        raise CorruptFileError(f"{keyfile} is truncated or damaged (it does not decode)",
                               hint="use another copy of the key file, or export it again from the store with "
                                    "`engramdb export-key` while the store's header is intact") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise ForeignFileError(f"{keyfile} is not an engramdb key file", hint=keyfile_hint)
    version = header.get("version")
    if isinstance(version, list) and version and isinstance(version[0], int) and version[0] > FORMAT_VERSION[0]:
        # put into the file, it would leave a header this engramdb cannot read
        raise FormatVersionError(f"{keyfile} holds the header of a format {version[0]}.x file; this engramdb reads "
                                 f"{FORMAT_VERSION[0]}.x")
    return header
