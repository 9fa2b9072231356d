"""The format features a file was written with (spec/file-format.md, "Format features").

A sealed msgpack list of names in ``meta``. An engramdb that finds a name it does not know
there opens the file read-only only: its writes would not follow that feature. The facade
records a feature when it first writes the file that way (:func:`add`) and checks the list
at every open (:func:`check`).
"""
from __future__ import annotations

from . import codec
from .errors import CorruptFileError, FormatVersionError
from .store import Txn

FEATURES_KEY = b"features"
PROCEDURE_KEYS = "procedure-keys-blind"  # procedure rows keyed by their blind index (8aa8c3e)
KNOWN_FEATURES = frozenset({PROCEDURE_KEYS})


def held(txn: Txn) -> set[str]:
    """The feature names the file holds (none for a file written before the list existed).

    Raises:
        CorruptFileError: the list is not a list of names.
    """
    raw = txn.get("meta", FEATURES_KEY)
    if raw is None:
        return set()
    names = codec.unpack(raw)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise CorruptFileError("the file's list of format features is malformed",
                               hint="restore the file from a dump or backup")
    return set(names)


def add(txn: Txn, names: set[str]) -> None:
    """Record ``names`` among the file's features (in this write transaction)."""
    have = held(txn)
    if not names <= have:
        txn.put("meta", FEATURES_KEY, codec.pack(sorted(have | names)))


def check(txn: Txn, path: str, readonly: bool) -> None:
    """Refuse a writable open of a file written with a format feature this version does not know.

    Raises:
        FormatVersionError: such a feature, and ``readonly`` is false.
    """
    unknown = sorted(held(txn) - KNOWN_FEATURES)
    if unknown and not readonly:
        raise FormatVersionError(
            f"{path} was written by a newer engramdb with format features this one does not know "
            f"({', '.join(unknown)}); it can read the file but must not write it",
            hint="upgrade engramdb (pip install -U engramdb) to write it; reading it works (open(..., "
                 "readonly=True), and the command line's commands that only read)")
