"""Whole-store dump and restore through AAAK v3 (spec/aaak.md).

``dump`` streams a store from one read snapshot in canonical order; ``restore`` writes a
new file beside the destination in bounded batches, checks the dump's trailer and the new
file's invariants, and only then renames it into place. A failed or interrupted restore
leaves the destination untouched and cleans its temporary file on the next run.
"""
from __future__ import annotations

import contextlib
import fcntl
import io
import os
from functools import partial
from typing import Any, BinaryIO, NamedTuple, TextIO, TypeVar
from collections.abc import Callable, Iterable, Iterator, Mapping

from . import aaak, bulk, codec
from .engram import Engram, Transaction, open as open_engram
from .importers import EntityTable
from .index.vectors import EmbeddingSpace
from .errors import (
    AAAKParseError, AlreadyOpenError, CorruptFileError, DecryptionError, DuplicateIdError, EngramError, NotFoundError,
    ValidationError, shown,
)
from .records import ARCHIVE_KEY, CompressResult, Edge, EntityIndex, Node, Tunnel, Zettel
from .store import STORE_SIDECARS, Txn, remove_if_abandoned, replace_store

__all__ = ["dump", "dump_v2", "convert_dump_v2", "zettel_view", "restore", "import_records", "import_resumable",
           "ResumedImport", "entity_table", "SOURCE_META_PREFIX", "ENTITIES_META"]

# Source texts (what recall_context cuts passages from) travel as @meta lines.
SOURCE_META_PREFIX = "source:"
# The store's entity table (code -> name, from imported AAAK `E:` lines) travels as one @meta line.
ENTITIES_META = "entities"
ENTITIES_KEY = b"zettel.entities"
RESTORE_BATCH = 1000
TEMP_SUFFIX = ".restore-tmp"

_T = TypeVar("_T")


class _Salvage:
    """Reads that either raise on a damaged value or, when salvaging, report it and go on."""

    def __init__(self, on_damaged: Callable[[str], None] | None) -> None:
        self.on_damaged = on_damaged

    def attempt(self, what: str, fn: Callable[..., _T], *args: Any) -> _T | None:
        """``fn(*args)``; under salvage, a damaged record is reported and skipped (None)."""
        if self.on_damaged is None:
            return fn(*args)
        try:
            return fn(*args)
        except (DecryptionError, CorruptFileError) as exc:
            self.on_damaged(f"{what}: {exc.message}")
            return None


def _scan(engram: Engram, txn: Txn, salvage: _Salvage) -> tuple[list[int], dict[int, str], list[Edge], dict[str, Any]]:
    """One pass over the records: docnos in id order, their ids, every edge, and the source texts."""
    order: list[tuple[str, int]] = []
    names: set[str] = set()
    graph = engram.indexes.graph
    for key in list(txn.keys("nodes")):
        docno = codec.from_u64(key)
        node = salvage.attempt(f"memory #{docno}", lambda k: codec.decode_node(txn.get_present("nodes", k), vectors=False), key)
        if node is not None:
            order.append((node.id, docno))
            if node.source:
                names.add(node.source)
    ids = {docno: id_ for id_, docno in order}
    edges: list[Edge] = []
    for docno in ids:
        out = salvage.attempt(f"edges of memory #{docno}", graph.outgoing, txn, docno) or ()
        edges.extend(edge for dst, edge, _ in out if dst in ids)
    sources: dict[str, Any] = {}  # the dump's @meta: source texts, and the entity table
    for name in sorted(names):
        blind = engram._store.blind(b"source", name.encode("utf-8", "surrogatepass"))
        raw = salvage.attempt(f"source text {name!r}", txn.get, "sources", blind)
        if raw is not None:
            sources[SOURCE_META_PREFIX + name] = raw.decode("utf-8", "surrogatepass")
    order.sort()
    return [docno for _, docno in order], ids, edges, sources


def _archive_rows(txn: Txn, ids: dict[int, str], salvage: _Salvage) -> list[tuple[str, str]]:
    from .maintenance.archive import GROUP_BIT, unpack_group

    rows = []
    for key in list(txn.keys("archive")):
        number = codec.from_u64(key)
        if number & GROUP_BIT:  # originals packed together by compact
            group = salvage.attempt(f"group of archived originals #{number & ~GROUP_BIT}",
                                    lambda k: unpack_group(txn.get_present("archive", k)), key)
            rows += [(ids[d], text) for d, text in group or () if d in ids]
            continue
        original = salvage.attempt(f"archived original of memory #{number}",
                                   lambda k: codec.unpack_archive(txn.get_present("archive", k)), key)
        if original is not None and number in ids:
            rows.append((ids[number], original))
    return sorted(rows)


def _procedures(txn: Txn, salvage: _Salvage) -> list[Any]:
    rows = []
    for key in list(txn.keys("procedures")):
        row = salvage.attempt("a procedure row", lambda k: codec.unpack(txn.get_present("procedures", k), any_keys=True), key)
        if row is not None:
            rows.append(row)
    return rows


def _read_node(engram: Engram, txn: Txn, docno: int, salvage: _Salvage) -> Node:
    """The memory ``docno`` with its vectors, which the scan that listed it found in this
    same transaction. Under salvage, a vector that cannot be read is reported and left
    out, and the memory kept (its record was read whole by the scan)."""
    data = txn.get("nodes", codec.u64(docno))
    if data is None:
        raise CorruptFileError(f"memory #{docno} is listed but not stored")
    if salvage.on_damaged is None:
        return engram.indexes.read_node(txn, docno, data)

    def fetch(names: list[str]) -> dict[str, Any]:
        vectors: dict[str, Any] = {}
        for name in names:
            vectors.update(salvage.attempt(f"the {name!r} vector of memory #{docno}",
                                           engram.indexes.vectors.fetch, txn, docno, [name]) or {})
        return vectors

    return codec.decode_node(data, fetch=fetch)


def _counting(nodes: Iterator[Node], progress: Callable[[int], None] | None, every: int = 1000) -> Iterator[Node]:
    count = 0
    for node in nodes:
        yield node
        count += 1
        if progress and count % every == 0:
            progress(count)
    if progress:
        progress(count)


def dump(engram: Engram, fp: TextIO | BinaryIO, *, progress: Callable[[int], None] | None = None,
         on_damaged: Callable[[str], None] | None = None) -> int:
    """Write the whole store to ``fp`` as canonical AAAK v3; returns the record count.

    Everything comes from one read snapshot, so the dump is consistent even while other
    processes write. The same logical content always gives the same bytes. ``progress``
    is called with the number of memories written so far.

    Salvage: with ``on_damaged`` given, a value that fails authentication or does not
    decode is reported to it (one line each) and left out, together with the edges and
    archive rows of the memory it belongs to, instead of failing the dump (a damaged
    vector leaves out only that vector; a damaged archived original leaves its memory as
    a truncated stub, its preview kept). The dump stays valid and restores into a clean
    store holding every intact memory.

    Raises:
        DecryptionError, CorruptFileError: a damaged value, unless ``on_damaged`` is given.
    """
    indexes = engram.indexes
    salvage = _Salvage(on_damaged)
    with engram._store.read() as txn:
        spaces = [{"name": name, "model": s.model, "dims": s.dims, "dtype": s.dtype, "normalized": s.normalize,
                   "auto": s.auto} for name, s in sorted(indexes.vectors.spaces(txn).items())]
        docnos, ids, edges, sources = _scan(engram, txn, salvage)
        table = salvage.attempt("the entity table", lambda: read_entities(txn))
        if table:
            sources[ENTITIES_META] = table
        salvage.attempt("the vector blocks", indexes.vectors.preload, txn)  # nodes are read in id order
        archive = _archive_rows(txn, ids, salvage)
        nodes: Iterator[Node] = (_read_node(engram, txn, docno, salvage) for docno in docnos)
        if salvage.on_damaged is not None:
            nodes = _without_lost_originals(nodes, {id_ for id_, _ in archive})
        return aaak.write_dump(fp, settings={"tokenizer": indexes.tokenizer.settings()}, spaces=spaces,
                               nodes=_counting(nodes, progress), edges=edges, meta=sources, archive=archive,
                               procedures=_procedures(txn, salvage))


def _without_lost_originals(nodes: Iterator[Node], kept: set[str]) -> Iterator[Node]:
    """Under salvage, an archived stub whose original was damaged (left out) becomes a stub
    of a truncated memory (its preview is what is left), as ``archive(truncate=True)``
    makes: a stub that claimed its original, without one, failed the restore's verify, so
    the salvage dump did not restore at all."""
    for node in nodes:
        entry = node.metadata.get(ARCHIVE_KEY)
        if isinstance(entry, Mapping) and entry.get("truncated") is False and node.id not in kept:
            node = node.replace(metadata={**node.metadata, ARCHIVE_KEY: {**entry, "truncated": True}})
        yield node


# --- the entity table (imported AAAK `E:` lines) --------------------------------------


def read_entities(txn: Txn) -> dict[str, str]:
    """The entity table stored in the file (code -> name), read in ``txn``.

    Raises:
        CorruptFileError: the stored table is malformed.
    """
    raw = txn.get("meta", ENTITIES_KEY)
    if raw is None:
        return {}
    table = codec.unpack(raw)
    if not isinstance(table, dict) or any(not isinstance(k, str) or not isinstance(v, str) for k, v in table.items()):
        raise CorruptFileError("the stored entity table is malformed",
                               hint="dump the file with --skip-damaged and restore the dump")
    return table


def entity_table(engram: Engram) -> dict[str, str]:
    """The store's entity table: entity code -> name, as imported from AAAK ``E:`` lines.

    Raises:
        CorruptFileError, DecryptionError: the file is damaged.
    """
    with engram._store.read() as txn:
        return read_entities(txn)


def _merge_entities(txn: Txn, incoming: dict[str, str]) -> None:
    """Add ``incoming`` codes to the stored table. A code already stored for another name
    keeps its name; the newcomer's name is then stored under the code with the smallest
    free number appended (``AL1`` -> ``AL11``), unless the name already has a code."""
    table = read_entities(txn)
    names = set(table.values())
    for code in sorted(incoming):
        name = incoming[code]
        if table.get(code) == name:
            continue
        if code not in table:
            table[code] = name
        elif name not in names:
            n = 1
            while f"{code}{n}" in table:
                n += 1
            table[f"{code}{n}"] = name
        names.add(name)
    txn.put("meta", ENTITIES_KEY, codec.pack(dict(sorted(table.items()))))


def _remove_store_files(path: str) -> None:
    for suffix in ("", *STORE_SIDECARS):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path + suffix)


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _looks_like_a_path(data: str | bytes) -> bool:
    """True for a one-line value that does not begin like a dump ("FILE:"): a path given
    where the dump's text belongs. Truncated dumps (every prefix) still reach the parser."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return bool(text) and "\n" not in text and not "FILE:".startswith(text[:5])


def restore(fp: TextIO | BinaryIO | str | bytes, path: str | os.PathLike[str], *, force: bool = False,
            allow_edited: bool = False, progress: Callable[[int], None] | None = None,
            **open_options: Any) -> int:
    """Rebuild a store at ``path`` from an AAAK v3 dump; returns the number of memories.

    The new file is written beside ``path`` (``path + ".restore-tmp"``) in batches of
    1,000 memories, its postings rebuilt, the dump's trailer (count and SHA-256) checked,
    the new file verified and compacted (no free pages, index segments merged); only then
    is it renamed over ``path``. Anything that fails
    leaves ``path`` as it was.

    Memories are added in id order (the dump's), not the order they were first added, and
    recall breaks equal scores by insertion order: memories with exactly equal scores can
    rank in another order than in the original store (spec/aaak.md section 4.2).

    Args:
        fp: the dump (a text or binary stream, or str/bytes). Decrypt an encrypted dump
            first with :func:`engramdb.aaak.decrypt_dump`.
        path: where the store goes.
        force: replace an existing file at ``path``.
        allow_edited: accept a hand-edited dump (see :func:`engramdb.aaak.read_dump`: a
            trailer whose SHA-256 or count no longer matches, a missing final LF; each with
            a ``UserWarning``); the grammar is still enforced.
        progress: called with the number of memories written after each batch.
        open_options: for the new file: ``passphrase``, ``key``, ``encrypted``, ``kdf``.

    Raises:
        ValidationError: ``path`` exists and ``force`` is false.
        AAAKParseError, DumpIntegrityError: the dump is malformed, truncated or edited.
        AlreadyOpenError: another process has ``path`` open.
    """
    if isinstance(fp, (str, bytes)) and _looks_like_a_path(fp):
        raise ValidationError("restore() takes the dump's text or an open file, not a path",
                              hint="open the dump first: restore(open(path, 'rb'), ...)")
    path = os.path.realpath(os.fspath(path))
    if os.path.exists(path) and not force:
        raise ValidationError(f"{path} exists; restore does not overwrite it",
                              hint="pass force=True (--force) to replace it, or choose a new path")
    tmp = path + TEMP_SUFFIX
    remove_if_abandoned(tmp, STORE_SIDECARS)  # an interrupted restore's leftovers; never one in progress
    items = aaak.read_dump(fp, allow_edited=allow_edited)
    try:
        header = next(items)
    except StopIteration:
        raise AAAKParseError("the dump is empty") from None
    if not isinstance(header, aaak.DumpHeader):  # read_dump yields the header first
        raise AAAKParseError("the dump does not start with its header")
    tokenizer = header.settings.get("tokenizer")
    busy = AlreadyOpenError(f"another restore to {path} is in progress ({tmp} is in use)",
                            hint="wait for it to finish, or choose another path")
    if os.path.lexists(tmp):  # still there after removing it if abandoned: in use
        raise busy
    ours = True
    guard: int | None = None
    try:
        db = open_engram(tmp, create=True, tokenizer=tokenizer, **open_options)
        if not db._store.created:  # another restore created it this instant
            ours = False
            db.close()
            raise busy
        try:
            count = _load(db, header, items, progress)
            problems = db.verify()
            if problems:
                raise EngramError(f"the restored store does not verify: {problems[0]}",
                                  hint="report this as a bug, with the dump if you can share it")
            # batched loading leaves free pages and many index segments: a restored store
            # was 2.3x the size of its compacted self (11.5 MB vs 5.0 MB, issue 12 bug 5)
            db.compact()
            # Our shared lock on the new file, held until its rename: the next opener of `path`
            # removes a .restore-tmp only when nobody holds one. Until here the open handle's
            # own lock on the file does that (compact replaces the file, so it could not be
            # taken earlier: compact needs the file to itself, and would leave it on the old one).
            guard = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
            fcntl.flock(guard, fcntl.LOCK_SH)
        finally:
            db.close()
        _fsync_path(tmp)
        replace_store(tmp, path)
    finally:
        if ours:  # after a failure the new file, after the rename its sidecars
            _remove_store_files(tmp)
        if guard is not None:
            os.close(guard)
    return count


def _load(db: Engram, header: aaak.DumpHeader, items: Iterator[Any], progress: Callable[[int], None] | None) -> int:
    for space in header.spaces:
        db.add_space(space["name"], dims=space["dims"], model=space["model"],
                     normalize=space.get("normalized", True), auto=space.get("auto"))
    sources = {k[len(SOURCE_META_PREFIX):]: v for k, v in header.meta.items() if k.startswith(SOURCE_META_PREFIX)}
    table = header.meta.get(ENTITIES_META)
    if table is not None and (not isinstance(table, dict) or any(
            not isinstance(k, str) or not isinstance(v, str) for k, v in table.items())):
        raise AAAKParseError("the dump's entity table (@meta entities) must map codes to names")
    if sources or table:
        def put_sources(txn: Txn) -> None:
            for name, text in sorted(sources.items()):
                txn.put("sources", db._store.blind(b"source", name.encode("utf-8", "surrogatepass")),
                        text.encode("utf-8", "surrogatepass"))
            if table:
                txn.put("meta", ENTITIES_KEY, codec.pack(dict(sorted(table.items()))))

        db._store.write(put_sources)
    # a dump's vectors are the stored ones: a normalising space keeps them bit for bit
    db.indexes.vectors.stored_rows = True
    count = 0
    batch: list[Node] = []
    edges: list[Edge] = []
    archive: list[aaak.ArchiveRow] = []
    procedures: list[Any] = []
    for item in items:  # the trailer is checked when this loop ends
        if isinstance(item, Node):
            batch.append(item)
            if len(batch) >= RESTORE_BATCH:
                count += len(_add_stored(db, batch))
                batch = []
                if progress:
                    progress(count)
        elif isinstance(item, Edge):
            edges.append(item)
        elif isinstance(item, aaak.ArchiveRow):
            archive.append(item)
        else:
            procedures.append(item.data)
    if batch:
        count += len(_add_stored(db, batch))
    db.indexes.vectors.stored_rows = False
    if progress:
        progress(count)

    def put_rows(txn: Txn, rows: list[Any]) -> None:
        tx = Transaction(db, txn)
        for row in rows:
            if not isinstance(row, aaak.ArchiveRow):
                tx.put_procedure_row(row)
                continue
            try:
                tx.set_archived(row.id, row.content)
            except NotFoundError:
                raise AAAKParseError(f"an archive row names a memory that is not there: {row.id!r}") from None

    rows = [*archive, *procedures]
    for start in range(0, len(rows), RESTORE_BATCH):
        db._store.write(partial(put_rows, rows=rows[start:start + RESTORE_BATCH]))
    for start in range(0, len(edges), RESTORE_BATCH):
        chunk = edges[start:start + RESTORE_BATCH]

        def put_edges(txn: Txn, chunk: list[Edge] = chunk) -> None:
            _put_edges(db, txn, chunk)

        db._store.write(put_edges)
    return count


def _add_stored(db: Engram, nodes: list[Node]) -> list[str]:
    """``db.add_many(nodes)`` of a dump's records, written as they were stored: archived
    stubs keep their archive entries (their rows follow), which the write API refuses."""
    return bulk.add_many(db._store, db._batched, nodes, None, as_stored=True)


def import_records(engram: Engram, items: Iterable[Node | Edge | EntityTable], *, batch: int = RESTORE_BATCH,
                   progress: Callable[[int], None] | None = None) -> tuple[int, int]:
    """Store imported nodes and then their edges in one transaction (all or nothing; a BM25
    segment per ``batch`` nodes); returns (nodes, edges).

    An :class:`~engramdb.importers.EntityTable` (an AAAK ``E:`` index) is merged into the
    store's entity table first (see :func:`entity_table`).

    Embedding spaces that do not exist yet are created from the first vector seen
    (model ``"imported"``, not normalised). Every id is checked before anything is
    written: an id that exists (or repeats in the source), or an edge to a memory that is
    in neither, refuses the whole import, so importing twice changes nothing.

    Raises:
        DuplicateIdError: an imported id exists in the store or repeats in the source.
        AAAKParseError: an edge names a memory that is neither imported nor stored.
    """
    records = list(items)
    _check_import_ids(engram, records)
    nodes = [item for item in records if isinstance(item, Node)]
    edges = [item for item in records if isinstance(item, Edge)]
    tables = [item for item in records if isinstance(item, EntityTable)]
    spaces = _new_spaces(engram, nodes)

    def before(txn: Txn) -> None:
        for table in tables:
            _merge_entities(txn, table.code_to_name)
        _add_spaces(engram, txn, spaces)

    # One transaction: a failure after the first write (a vector that does not fit the
    # space an earlier memory created, a full disk) used to leave that space, the entity
    # table and the batches before it behind, and the corrected import was then refused.
    # A segment per batch, as a commit per batch made.
    ids = bulk.add_many(engram._store, engram._batched, nodes, None, chunk=batch, before=before,
                        after=partial(_put_edges, engram, edges=edges), progress=progress)
    return len(ids), len(edges)


class ResumedImport(NamedTuple):
    """What :func:`import_resumable` did."""

    added: int
    """Memories added."""
    stored: int
    """Memories skipped because their id is stored already (by an earlier run, say)."""
    repeated: int
    """Memories skipped because their id came earlier in the source (its first copy is kept)."""
    edges: int
    """Edges written."""
    missing: list[Edge]
    """Edges not written because an end is neither in the source nor stored."""


def import_resumable(engram: Engram, items: Iterable[Node | Edge | EntityTable], *, chunk: int | None = None,
                     progress: Callable[[int, int], None] | None = None) -> ResumedImport:
    """Store imported items streamed, as :meth:`Engram.import_many` stores memories: a
    ``chunk`` of them (default :data:`~engramdb.bulk.INGEST_CHUNK`) per transaction,
    those whose id is stored already or came earlier in ``items`` skipped (the first copy
    is kept, counted apart from ids stored already).

    Unlike :func:`import_records`, this is **not atomic** and refuses nothing for an id
    that exists or repeats: an interruption leaves whole chunks behind, and running the
    same import again completes it without adding anything twice (give every memory an
    id: one without gets a new one each run). ``items`` is read as it is stored, so what
    is held at once is one chunk of memories and the blind keys of the ids read so far
    (to tell a repeat from an id stored already: ~83 MB a million). Edges are written in
    batches of :data:`RESTORE_BATCH` as they come, those stored already skipped; an edge
    needs both of its ends, so one with an end not stored yet (a memory later in
    ``items``, or in the chunk not yet written) is held until the last memory is stored,
    then written. An edge
    naming a memory that is neither in ``items`` nor stored is not written and is
    returned in ``missing``, so the other edges are stored and a re-run is not blocked.
    An entity table is merged as it comes (merging the same one again changes nothing);
    an embedding space that does not exist yet is created from the first vector seen, as
    :func:`import_records` does.

    Args:
        chunk: memories per transaction.
        progress: called after each chunk's commit with the running ``(added, skipped)``
            (skipped: stored already or repeated).

    Raises:
        ValidationError: ``chunk`` is not a positive integer, or a memory is invalid (the
            chunks before it are committed).
    """
    size = bulk.chunk_size(chunk)
    nodes: list[Node] = []
    edges: list[Edge] = []  # read, not written yet
    waiting: list[Edge] = []  # an end was not stored when their batch was written
    seen: set[bytes] = set()  # the blind keys of the ids read, which is what the store compares
    added = stored = repeated = written = 0

    def flush() -> None:
        nonlocal added, stored, repeated
        first = []
        for node, key in zip(nodes, engram._id_keys([node.id for node in nodes])):
            if key not in seen:
                seen.add(key)
                first.append(node)
        repeated += len(nodes) - len(first)
        nodes.clear()
        if first:
            count = _put_chunk(engram, first)
            added, stored = added + count, stored + len(first) - count
        if progress is not None:
            progress(added, stored + repeated)

    for item in items:
        if isinstance(item, Node):
            nodes.append(item)
            if len(nodes) >= size:
                flush()
        elif isinstance(item, Edge):
            edges.append(item)
            if len(edges) >= RESTORE_BATCH:
                written += _put_stored_ends(engram, edges, waiting)
        elif isinstance(item, EntityTable):
            engram._store.write(partial(_merge_entities, incoming=item.code_to_name))
    if nodes:
        flush()
    count, missing = _put_new_edges(engram, waiting + edges)
    return ResumedImport(added, stored, repeated, written + count, missing)


def _put_stored_ends(engram: Engram, edges: list[Edge], waiting: list[Edge]) -> int:
    """Write those of ``edges`` whose ends are both stored and that are not stored yet,
    move the others to ``waiting`` (for after the last memory), and empty ``edges``;
    returns how many were written. An edge held to the end costs ~280 bytes (measured:
    ~263 MiB a million), so the edges of a source that lists its memories first are
    written a batch at a time, not held."""
    count, lacking = _put_new_edges(engram, edges)
    waiting += lacking
    edges.clear()
    return count


def _put_chunk(engram: Engram, nodes: list[Node]) -> int:
    """Store those of ``nodes`` whose id is not stored yet, as :meth:`Engram.import_many`
    stores a chunk, and the embedding spaces their vectors need, in one transaction (a
    space committed apart stayed behind when the chunk failed, and refused the corrected
    source); returns how many were stored."""
    before = partial(_add_spaces, engram, spaces=_new_spaces(engram, nodes))
    return bulk.put_chunk(engram._store, engram._batched, nodes, None, before=before)


def _new_spaces(engram: Engram, nodes: list[Node]) -> list[EmbeddingSpace]:
    """The embedding spaces ``nodes``'s vectors need that do not exist yet (model
    ``"imported"``, not normalised), from the first vector of each: created in the
    transaction that stores the nodes."""
    known = set(engram.spaces())
    spaces = []
    for node in nodes:
        for name, vec in sorted(node.embeddings.items()):
            if name not in known:
                spaces.append(EmbeddingSpace(name=name, model="imported", dims=len(vec), normalize=False, auto=False))
                known.add(name)
    return spaces


def _add_spaces(engram: Engram, txn: Txn, spaces: list[EmbeddingSpace]) -> None:
    for space in spaces:
        engram.indexes.add_space(txn, space)


def _put_new_edges(engram: Engram, edges: list[Edge]) -> tuple[int, list[Edge]]:
    """Write those of ``edges`` that are not stored yet (same ends and kind) and whose ends
    are both stored; returns how many were written, and the edges with an end missing."""
    written = 0
    missing: list[Edge] = []
    for start in range(0, len(edges), RESTORE_BATCH):
        def put_batch(txn: Txn, batch: list[Edge] = edges[start:start + RESTORE_BATCH]) -> tuple[int, list[Edge]]:
            tx = Transaction(engram, txn)
            new, lacking = [], []
            for edge in batch:
                src, dst = tx._docno(edge.src), tx._docno(edge.dst)
                if src is None or dst is None:
                    lacking.append(edge)
                elif engram.indexes.graph.get(txn, src, dst, edge.kind) is None:
                    new.append(edge)
            _put_edges(engram, txn, new)
            return len(new), lacking

        count, lacking = engram._store.write(put_batch)
        written += count
        missing += lacking
    return written, missing


def _check_import_ids(engram: Engram, records: list[Node | Edge | EntityTable]) -> None:
    """Refuse an import before its first write when it would stop halfway (batches commit
    one by one, so a clash found in a later batch used to leave the earlier ones behind)."""
    hint = "nothing was imported; import under new ids with --id-prefix PREFIX (id_prefix=)"
    new: set[str] = set()
    with engram._store.read() as txn:
        def stored(id_: str) -> bool:
            return txn.get("ids", engram._id_key(id_)) is not None

        for item in records:
            if isinstance(item, Node):
                if item.id in new:
                    raise DuplicateIdError(f"the source holds the id {shown(item.id)} more than once",
                                           hint="nothing was imported; give each memory its own id, or keep "
                                                "the first copy with `engramdb import --resume`")
                if stored(item.id):
                    raise DuplicateIdError(f"a memory with id {shown(item.id)} exists", hint=hint)
                new.add(item.id)
        for item in records:
            if isinstance(item, Edge):
                for end in (item.src, item.dst):
                    if end not in new and not stored(end):
                        raise AAAKParseError(f"an edge names a memory that is not there: {end!r}",
                                             hint="nothing was imported; check the source file")


def _put_edges(engram: Engram, txn: Txn, edges: list[Edge]) -> None:
    tx = Transaction(engram, txn)
    for edge in edges:
        src, dst = tx._docno(edge.src), tx._docno(edge.dst)
        if src is None or dst is None:
            raise AAAKParseError(f"an edge names a memory that is not there: {edge.src if src is None else edge.dst!r}")
        engram.indexes.graph.put(txn, src, dst, edge, derived=edge.kind == "tunnel")


# --- the zettel view as AAAK v2 (spec/aaak.md section 6.1) ---------------------------


def zettel_view(nodes: Iterator[Node] | list[Node], edges: Iterator[Edge] | list[Edge],
                entities: dict[str, str] | None = None) -> tuple[CompressResult, bool]:
    """What AAAK v2 can show of a store: one zettel per memory, its tunnels, its entity table.

    Memories keep their ids when every id is decimal digits (ordered by number), else they
    are numbered ``001``, ``002``, ... in id order and tunnels follow the new ids. The
    entity index is ``entities`` plus codes for names it lacks. The header date and title
    are those of the imported AAAK document when every memory carries the same ones.

    Returns:
        The result and whether ids were renumbered.
    """
    from .compress.entities import assign_codes
    from .compress.pipeline import zettel_id

    nodes = sorted(nodes, key=lambda n: n.id)
    renumber = not all(n.id.isascii() and n.id.isdigit() for n in nodes)
    if renumber:
        new_ids = {n.id: zettel_id(i) for i, n in enumerate(nodes, start=1)}
    else:
        nodes.sort(key=lambda n: (int(n.id), n.id))
        new_ids = {n.id: n.id for n in nodes}
    position = {n.id: i for i, n in enumerate(nodes)}
    zettels = [Zettel(id=new_ids[n.id], entities=list(n.entities), topics=list(n.topics),
                      quote=n.quote or n.content[:200], weight=n.weight, emotions=list(n.emotions),
                      flags=list(n.flags), source_start=n.source_start, source_end=n.source_end,
                      resolved_date=n.resolved_date) for n in nodes]
    tunnels = sorted((e for e in edges if e.kind == "tunnel" and e.src in position and e.dst in position),
                     key=lambda e: (position[e.src], position[e.dst], e.label))
    table = dict(entities or {})
    index = EntityIndex({name: code for code, name in sorted(table.items())}, table)
    assign_codes(index, (name for z in zettels for name in z.entities))
    docs = {tuple(sorted(n.metadata.get("aaak", {}).items())) if isinstance(n.metadata.get("aaak"), dict) else ()
            for n in nodes}
    meta: dict[str, Any] = {"input_length": 0, "chunk_count": len(zettels)}
    if len(docs) == 1:
        meta.update((k, v) for k, v in next(iter(docs)) if k in ("date", "title") and isinstance(v, str))
    result = CompressResult(zettels=zettels, tunnels=[Tunnel(new_ids[e.src], new_ids[e.dst], e.label) for e in tunnels],
                            entity_index=index, meta=meta)
    return result, renumber


def dump_v2(engram: Engram, fp: TextIO | BinaryIO) -> bool:
    """Write the store's zettel view (memories, tunnels, entity table) as AAAK v2, the
    format zettel-compress reads; returns whether memory ids were renumbered.

    v2 carries much less than a dump (spec/aaak.md section 6.1): it is for zettel-compress
    users, not a backup.

    Raises:
        DecryptionError, CorruptFileError: a damaged value.
    """
    with engram._store.read() as txn:
        docnos, _, edges, _ = _scan(engram, txn, _Salvage(None))
        engram.indexes.vectors.preload(txn)
        nodes = [_read_node(engram, txn, docno, _Salvage(None)) for docno in docnos]
        table = read_entities(txn)
    result, renumbered = zettel_view(nodes, edges, table)
    _write_text(fp, aaak.encode(result, version=2))
    return renumbered


def convert_dump_v2(dump_fp: TextIO | BinaryIO | str | bytes, out: TextIO | BinaryIO, *,
                    allow_edited: bool = False) -> bool:
    """Convert an AAAK v3 store dump into the AAAK v2 zettel view :func:`dump_v2` writes
    for the same store; returns whether ids were renumbered. The dump is fully checked
    (grammar, count, SHA-256) before anything is written.

    Raises:
        AAAKParseError, DumpIntegrityError: the dump is malformed, truncated or edited.
    """
    nodes: list[Node] = []
    edges: list[Edge] = []
    table: dict[str, str] = {}
    for item in aaak.read_dump(dump_fp, allow_edited=allow_edited):
        if isinstance(item, aaak.DumpHeader):
            value = item.meta.get(ENTITIES_META) or {}
            if not isinstance(value, dict):
                raise AAAKParseError("the dump's entity table (@meta entities) must map codes to names")
            table = value
        elif isinstance(item, Node):
            nodes.append(item)
        elif isinstance(item, Edge):
            edges.append(item)
    result, renumbered = zettel_view(nodes, edges, table)
    _write_text(out, aaak.encode(result, version=2))
    return renumbered


def _write_text(fp: Any, text: str) -> None:
    binary = isinstance(fp, (io.RawIOBase, io.BufferedIOBase)) or "b" in (getattr(fp, "mode", "") or "")
    if not binary:
        try:
            fp.write(text)
            return
        except TypeError:  # a binary stream that does not say so (a wrapped stdout)
            pass
    fp.write(text.encode("utf-8"))
