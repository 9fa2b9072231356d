"""The engramdb exception hierarchy.

Every error raised by engramdb is an :class:`EngramError`. Each carries a ``hint``
that tells the user what to do next; ``str(err)`` includes it. Errors from the
libraries below (lmdb, cryptography, msgpack) never reach the caller: they are
wrapped here with ``raise ... from exc``.
"""
from __future__ import annotations

__all__ = [
    "EngramError",
    "StoreError",
    "StorageFullError",
    "AlreadyOpenError",
    "BusyError",
    "FileMissingError",
    "WriteConflictError",
    "ForkError",
    "WrongThreadError",
    "UnsafeFilesystemError",
    "ReadOnlyError",
    "ClosedError",
    "NotFoundError",
    "DuplicateIdError",
    "ValidationError",
    "CorruptFileError",
    "FormatVersionError",
    "ForeignFileError",
    "ModeMismatchError",
    "ConfigMismatchError",
    "DecryptionError",
    "WrongPassphraseError",
    "WeakKDFError",
    "AAAKParseError",
    "DumpIntegrityError",
    "IndexMismatchError",
    "EmbeddingError",
    "ImportFormatError",
]


class EngramError(Exception):
    """Root of every engramdb error.

    Attributes:
        message: what went wrong.
        hint: what to do about it (may be empty).
    """

    default_hint = ""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = self.default_hint if hint is None else hint
        super().__init__(message)

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message} (hint: {self.hint})"
        return self.message


class StoreError(EngramError):
    """The storage layer (LMDB) failed in a way not covered by a subclass."""

    default_hint = "check that the file is on a local disk and readable; run `engramdb verify FILE`"


class StorageFullError(StoreError):
    """The disk (or a file-size limit) is full; the transaction was rolled back."""

    default_hint = "free disk space or raise the file-size limit, then retry; no committed data was lost"


class AlreadyOpenError(StoreError):
    """The file is already open in this process with incompatible options."""

    default_hint = "reuse the Engram handle you already have, or close it before opening the file again"


class BusyError(StoreError):
    """Another process (or thread) held the file longer than the timeout allowed: a write
    transaction, a compaction or a restore. Nothing was written."""

    default_hint = ("another process is writing to or compacting the file; retry later, or open it with a longer "
                    "timeout (open(..., timeout=SECONDS), `engramdb --timeout SECONDS`; None waits as long as it takes)")


class FileMissingError(StoreError, FileNotFoundError):
    """The .engram file does not exist (and creating it was not asked for)."""

    default_hint = "check the path, or create the file with `engramdb init FILE`"

    def __str__(self) -> str:
        return EngramError.__str__(self)


class WriteConflictError(StoreError):
    """Another writer committed while this transaction had to be replayed; nothing was written."""

    default_hint = "run the transaction again"


class ForkError(StoreError):
    """A handle opened in a parent process was used in a forked child."""

    default_hint = "open the file again in the child process (or use the 'spawn' start method)"


class WrongThreadError(StoreError):
    """A write transaction was used from a thread other than the one that opened it (LMDB
    binds a write transaction to its thread). The call wrote nothing; the transaction stays
    usable in its own thread."""

    default_hint = ("write in the thread that opened the transaction, or open one in this thread: "
                    "`with db.transaction() as tx:` there (each thread its own), or call db.add()/db.update()")


class UnsafeFilesystemError(StoreError):
    """The file is on a network or FUSE filesystem where LMDB's locks and shared memory map
    do not hold (NFS, SMB/CIFS, 9p, sshfs, ...): two processes could corrupt it."""

    default_hint = ("keep the store on a local disk (copy it there while no process writes to it); if no other "
                    "process or machine uses the file at the same time, open(..., allow_unsafe_fs=True) "
                    "(fleet.run(..., allow_unsafe_fs=True)) or the environment variable ENGRAM_ALLOW_UNSAFE_FS=1 "
                    "opens it anyway")


class ReadOnlyError(StoreError):
    """A write was attempted on a read-only handle."""

    default_hint = "open the file with readonly=False to write"


class ClosedError(StoreError):
    """The handle was closed."""

    default_hint = "open the file again with engramdb.open()"


class NotFoundError(EngramError, KeyError):
    """No memory with that id exists."""

    default_hint = "list ids with `engramdb list FILE`"

    def __str__(self) -> str:  # KeyError quotes its argument; keep the readable form
        return EngramError.__str__(self)


class DuplicateIdError(EngramError):
    """A memory with that id already exists."""

    default_hint = "pick another id, or change the existing memory with db.update(id, ...)"


class ValidationError(EngramError, ValueError):
    """A record or argument does not satisfy the data model."""

    default_hint = "check the value against the docstring of the function or method you called (help() shows it)"


class CorruptFileError(EngramError):
    """The file is damaged, truncated or has been tampered with."""

    default_hint = "run `engramdb verify FILE`; restore from a dump or backup if it reports problems"


class FormatVersionError(CorruptFileError):
    """The file was written by a newer, incompatible engramdb format version."""

    default_hint = "upgrade engramdb (pip install -U engramdb) to open this file"


class ForeignFileError(CorruptFileError):
    """The file is not an engramdb file."""

    default_hint = "check the path; to bring in data from another tool, use `engramdb import`"


class ModeMismatchError(EngramError):
    """An encrypted file was opened without a key, or a plaintext file with one."""

    default_hint = "pass the passphrase (or key) for an encrypted file; pass encrypted=False for a plaintext one"


class ConfigMismatchError(EngramError):
    """A setting fixed at creation (tokenizer, embedding space) differs from the one asked for."""

    default_hint = "open the file with the settings it was created with, or dump and restore into a new file"


class DecryptionError(EngramError):
    """A sealed value failed authentication: wrong key, tampering or a moved record."""

    default_hint = ("the file was damaged or tampered with (`engramdb verify FILE` lists what): restore it from a "
                    "backup, or salvage the rest with `engramdb dump --skip-damaged FILE -o S.aaak` and restore that "
                    "into a new file")


class WrongPassphraseError(DecryptionError):
    """The passphrase or key does not unlock this file."""

    default_hint = "check the passphrase (ENGRAM_PASSPHRASE or --passphrase-file); use the recovery key if you have one"


class WeakKDFError(EngramError):
    """KDF parameters are below the safety floor or above the resource cap."""

    default_hint = "use at least t=2, m=19456 KiB, p=1 (the OWASP minimum); the default is t=3, m=64 MiB, p=4"


class AAAKParseError(EngramError):
    """An AAAK text is malformed. ``line`` and ``column`` are 1-based (0 when unknown)."""

    default_hint = ("check the dump at the reported line and column (what `dump` writes always parses, "
                    "so look for a hand edit there)")

    def __init__(self, message: str, *, line: int = 0, column: int = 0, hint: str | None = None) -> None:
        self.line = line
        self.column = column
        where = f"line {line}, column {column}: " if line else ""
        super().__init__(where + message, hint=hint)


class DumpIntegrityError(AAAKParseError):
    """A dump's trailer (record count or SHA-256) does not match: truncated or edited."""

    default_hint = "the dump was truncated or edited; use the original, or pass --allow-edited for a deliberate edit"


class IndexMismatchError(EngramError):
    """A derived index (postings, vectors, edges) disagrees with the records."""

    default_hint = ("rebuild the indexes from the records: db.verify(fix=True), or `engramdb verify --fix FILE` "
                    "on the command line")


class EmbeddingError(ValidationError):
    """An embedding has the wrong dimensions, an unknown space, or non-finite values."""

    default_hint = "check the embedding space's dims with `engramdb info FILE`"


class ImportFormatError(EngramError):
    """A file given to `engramdb import` is not in a format it can read."""

    default_hint = "supported sources: AAAK v1/v2 text, JSONL memories, Terronex .engram 1.x/2.x"



def shown(value: object, limit: int = 60) -> str:
    """``repr(value)`` for a message, cut to about ``limit`` characters: an id of 10 KB must
    not be repeated whole in an error (issue 12, bug 14)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f" ({len(value)} characters)" if isinstance(value, (str, bytes)) else ""
    return f"{text[:limit - 3]}...{size}"
