"""Consistency checks of a whole file (:meth:`Engram.verify <engramdb.engram.Engram.verify>`):
the header copies, the sealed state, every value's authentication, the records and their id
map, each table against the state's count and digest, the archive and the indexes; and the
rebuild of what derives from the records (``verify --fix``).
"""
from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING
from collections.abc import Callable, Iterator, Mapping

import numpy as np

from . import codec, crypto
from .errors import CorruptFileError, DecryptionError, EngramError
from .records import Node
from .store import HEADER_KEYS, TABLES, Txn

if TYPE_CHECKING:  # annotations only: the facade hands its indexes in
    from .index import Indexes

__all__ = ["Problem", "check_contents", "digest_problems", "rebuild_derived"]


@dataclass(frozen=True)
class Problem:
    """One finding of :meth:`Engram.verify`."""

    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"



def _digest_mismatch(table: str, found: tuple[int, int], sealed: list[int]) -> str | None:
    """What differs between a table's entries and the sealed state's count and digest, or None."""
    (count, digest), (want_count, want_digest) = found, sealed
    if count != want_count:
        return (f"table {table}: {count} entries, but the sealed state counts {want_count}; entries were "
                "removed or added outside engramdb")
    if digest != want_digest:
        return (f"table {table}: {count} entries as the sealed state counts, but their digest differs; an "
                "entry was replaced, e.g. rolled back to an older value")
    return None


def _table_digests(txn: Txn, table: str, sealer: crypto.Sealer,
                   on_entry: Callable[[bytes, bytes], None] | None = None) -> tuple[int, int]:
    """(count, additive digest) of a table's entries, streamed; ``on_entry(key, envelope)`` sees each."""
    count, digest, tname = 0, 0, table.encode()
    for key, envelope in txn.raw_items(table):
        if on_entry is not None:
            on_entry(key, envelope)
        count += 1
        digest = (digest + sealer.state_term(tname, key, envelope)) % 2**256
    return count, digest


def digest_problems(txn: Txn) -> list[str]:
    """Every table's entries against the sealed state's count and digest (open(verify=True))."""
    state, sealer = txn.state, txn.store.sealer
    found = (_digest_mismatch(t, _table_digests(txn, t, sealer), state.digests.get(t, [0, 0]))
             for t in TABLES if t != "meta")
    return [p for p in found if p]


class _Records(Mapping[int, Node]):
    """Every docno of the file (increasing), but only the archived stubs' records (what the
    archive check reads), so verify does not keep every decoded record."""

    def __init__(self, docnos: np.ndarray, archived: dict[int, Node]) -> None:
        self._docnos, self._archived = docnos, archived

    def __contains__(self, docno: object) -> bool:
        if not isinstance(docno, int) or not 0 <= docno < 2**64 or not self._docnos.size:
            return False
        pos = min(int(np.searchsorted(self._docnos, np.uint64(docno))), self._docnos.size - 1)
        return int(self._docnos[pos]) == docno

    def __getitem__(self, docno: int) -> Node:
        return self._archived[docno]

    def __iter__(self) -> Iterator[int]:
        return iter(self._archived)

    def __len__(self) -> int:
        return len(self._archived)


_CHUNK = 4096  # id entries checked at once


def _check_id_entries(problems: list[Problem], entries: list[tuple[bytes, int]], docnos: np.ndarray,
                      keys: np.ndarray, mapped: np.ndarray) -> None:
    """Each id entry (blind key, docno) must name a record whose id has that blind key;
    marks the records named in ``mapped``, then empties ``entries``."""
    if not entries:
        return
    want = np.fromiter((docno for _, docno in entries), np.uint64, len(entries))
    pos = np.minimum(np.searchsorted(docnos, want), max(docnos.size - 1, 0))
    found = docnos[pos] == want if docnos.size else np.zeros(want.size, bool)
    mapped[pos[found]] = True
    for i, (key, _) in enumerate(entries):
        if not found[i] or len(key) != keys.shape[1] or keys[pos[i]].tobytes() != key:
            problems.append(Problem("ids", f"id entry {key.hex()} points at a missing or different record"))
    entries.clear()


def check_contents(txn: Txn, indexes: Indexes, id_key: Callable[[str], bytes]) -> list[Problem]:
    """Everything below the structure (``id_key``: a node id's blind key). It streams: per
    record only its docno and blind id key are kept, in flat arrays (8 bytes + the key's
    length each), and the id map is checked against them in chunks."""
    sealer = txn.store.sealer
    problems: list[Problem] = []
    header_bytes = [txn.get_header(k) for k in HEADER_KEYS]
    if header_bytes[0] is None or hashlib.sha256(header_bytes[0]).digest() != header_bytes[2]:
        problems.append(Problem("header", "the primary header does not match its checksum"))
    if header_bytes[0] != header_bytes[1]:
        problems.append(Problem("header", "the header backup differs from the primary"))
    try:
        state = txn.state
    except EngramError as exc:
        return problems + [Problem("state", f"the state record does not open: {exc.message}")]
    binding = txn.binding_problem()
    if binding:
        problems.append(Problem("state", binding))
    for key, envelope in txn.raw_items("meta"):
        if key not in HEADER_KEYS:
            try:
                sealer.open(b"meta", key, envelope)
            except DecryptionError:
                problems.append(Problem("decrypt", f"meta/{key.hex()} does not authenticate"))
    from .maintenance.archive import info as archive_info, problems as archive_problems

    docnos = array("Q")  # the records' docnos, increasing (the table's key order) ...
    id_keys = bytearray()  # ... and the blind key of each one's id, one after another
    key_len = len(id_key("x"))  # every blind key has this length
    archived: dict[int, Node] = {}  # only archived stubs are kept decoded (for the archive check)
    archive_rows: list[tuple[bytes, bytes]] = []

    for table in TABLES:
        if table == "meta":
            continue
        tname = table.encode()

        def check(key: bytes, envelope: bytes, table: str = table, tname: bytes = tname) -> None:
            try:
                plain = sealer.open(tname, key, envelope)
            except DecryptionError:
                problems.append(Problem("decrypt", f"{table}/{key.hex()} does not authenticate"))
                return
            if table == "archive":
                archive_rows.append((key, plain))
            if table == "nodes":
                try:
                    docno, node = codec.from_u64(key), codec.decode_node(plain)
                except EngramError as exc:
                    problems.append(Problem("record", f"node {key.hex()}: {exc.message}"))
                    return
                docnos.append(docno)
                id_keys.extend(id_key(node.id))
                if archive_info(node) is not None:
                    archived[docno] = node
                if docno >= state.next_docno:
                    problems.append(Problem("state", f"record {docno} ({node.id[:60]!r}) is beyond the allocated "
                                                     "docnos"))

        mismatch = _digest_mismatch(table, _table_digests(txn, table, sealer, check),
                                    state.digests.get(table, [0, 0]))
        if mismatch:
            problems.append(Problem("digest", mismatch))
    record_docnos = np.frombuffer(docnos, np.uint64)
    record_keys = np.frombuffer(id_keys, np.uint8).reshape(-1, key_len)
    mapped = np.zeros(record_docnos.size, bool)
    entries: list[tuple[bytes, int]] = []
    for key, envelope in txn.raw_items("ids"):
        try:
            entries.append((key, codec.from_u64(sealer.open(b"ids", key, envelope))))
        except DecryptionError:
            continue  # reported above
        except CorruptFileError:
            problems.append(Problem("ids", f"id entry {key.hex()} is malformed"))
            continue
        if len(entries) >= _CHUNK:
            _check_id_entries(problems, entries, record_docnos, record_keys, mapped)
    _check_id_entries(problems, entries, record_docnos, record_keys, mapped)
    for docno in record_docnos[~mapped].tolist():
        problems.append(Problem("ids", f"record {docno} has no id entry"))
    problems += [Problem("archive", p) for p in archive_problems(_Records(record_docnos, archived), archive_rows)]
    try:
        problems += [Problem("index", p) for p in indexes.verify(txn)]  # index hook
    except EngramError as exc:  # e.g. a record that does not decrypt (reported above): verify reports, never raises
        problems.append(Problem("index", f"the indexes cannot be checked: {exc.message}"))
    return problems


def rebuild_derived(txn: Txn, indexes: Indexes, id_key: Callable[[str], bytes]) -> None:
    """Rebuild the id map from the records and re-derive the digests (verify --fix)."""
    for key in list(txn.keys("ids")):
        txn.delete("ids", key)
    for key, value in list(txn.items("nodes")):
        try:
            node = codec.decode_node(value)
        except EngramError:
            continue
        txn.put("ids", id_key(node.id), key)
    indexes.rebuild(txn)  # index hook
    state = txn.state
    sealer = txn.store.sealer
    for table in TABLES:
        if table != "meta":
            state.digests[table] = list(_table_digests(txn, table, sealer))
    if state.next_docno <= max((codec.from_u64(k) for k in txn.keys("nodes")), default=0):
        state.next_docno = max(codec.from_u64(k) for k in txn.keys("nodes")) + 1
