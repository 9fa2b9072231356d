"""Whole-store dump and restore through AAAK v3 (spec/aaak.md).

``dump`` streams a store from one read snapshot in canonical order; ``restore`` writes a
new file beside the destination in bounded batches, checks the dump's trailer and the new
file's invariants, and only then renames it into place. A failed or interrupted restore
leaves the destination untouched and cleans its temporary file on the next run.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from typing import Any, BinaryIO, Callable, Iterator, TextIO

from . import aaak, codec
from .engram import Engram, Transaction, open as open_engram
from .errors import (
    AAAKParseError, AlreadyOpenError, CorruptFileError, DecryptionError, DuplicateIdError, EngramError, NotFoundError,
    ValidationError,
)
from .records import Edge, Node

__all__ = ["dump", "restore", "import_records", "SOURCE_META_PREFIX"]

# Source texts (what recall_context cuts passages from) travel as @meta lines.
SOURCE_META_PREFIX = "source:"
RESTORE_BATCH = 1000
TEMP_SUFFIX = ".restore-tmp"


class _Salvage:
    """Reads that either raise on a damaged value or, when salvaging, report it and go on."""

    def __init__(self, on_damaged: Callable[[str], None] | None) -> None:
        self.on_damaged = on_damaged

    def attempt(self, what: str, fn: Callable[[], Any]) -> Any:
        if self.on_damaged is None:
            return fn()
        try:
            return fn()
        except (DecryptionError, CorruptFileError) as exc:
            self.on_damaged(f"{what}: {exc.message}")
            return None


def _procedure_key(data: Any) -> bytes:
    return hashlib.sha256(codec.pack(data)).digest()[:16]


def _scan(engram: Engram, txn: Any, salvage: _Salvage) -> tuple[list[int], dict[int, str], list[Edge], dict[str, str]]:
    """One pass over the records: docnos in id order, their ids, every edge, and the source texts."""
    order: list[tuple[str, int]] = []
    names: set[str] = set()
    graph = engram.indexes.graph
    for key in list(txn.keys("nodes")):
        docno = codec.from_u64(key)
        node = salvage.attempt(f"memory #{docno}", lambda: codec.decode_node(txn.get("nodes", key)))
        if node is not None:
            order.append((node.id, docno))
            if node.source:
                names.add(node.source)
    ids = {docno: id_ for id_, docno in order}
    edges: list[Edge] = []
    for docno in ids:
        out = salvage.attempt(f"edges of memory #{docno}", lambda: graph.outgoing(txn, docno)) or ()
        edges.extend(edge for dst, edge, _ in out if dst in ids)
    sources = {}
    for name in sorted(names):
        blind = engram._store.blind(b"source", name.encode("utf-8", "surrogatepass"))
        raw = salvage.attempt(f"source text {name!r}", lambda: txn.get("sources", blind))
        if raw is not None:
            sources[SOURCE_META_PREFIX + name] = raw.decode("utf-8", "surrogatepass")
    order.sort()
    return [docno for _, docno in order], ids, edges, sources


def _archive_rows(txn: Any, ids: dict[int, str], salvage: _Salvage) -> list[tuple[str, str]]:
    rows = []
    for key in list(txn.keys("archive")):
        docno = codec.from_u64(key)
        original = salvage.attempt(f"archived original of memory #{docno}",
                                   lambda: codec.unpack_archive(txn.get("archive", key)))
        if original is not None and docno in ids:
            rows.append((ids[docno], original))
    return sorted(rows)


def _procedures(txn: Any, salvage: _Salvage) -> list[Any]:
    rows = []
    for key in list(txn.keys("procedures")):
        row = salvage.attempt("a procedure row", lambda: codec.unpack(txn.get("procedures", key), any_keys=True))
        if row is not None:
            rows.append(row)
    return rows


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
    archive rows of the memory it belongs to, instead of failing the dump. The dump stays
    valid and restores into a clean store holding every intact memory.

    Raises:
        DecryptionError, CorruptFileError: a damaged value, unless ``on_damaged`` is given.
    """
    indexes = engram.indexes
    salvage = _Salvage(on_damaged)
    with engram._store.read() as txn:
        spaces = [{"name": name, "model": s.model, "dims": s.dims, "dtype": s.dtype, "normalized": s.normalize,
                   "auto": s.auto} for name, s in sorted(indexes.vectors.spaces(txn).items())]
        docnos, ids, edges, sources = _scan(engram, txn, salvage)
        nodes = _counting((codec.decode_node(txn.get("nodes", codec.u64(docno))) for docno in docnos), progress)
        return aaak.write_dump(fp, settings={"tokenizer": indexes.tokenizer.settings()}, spaces=spaces,
                               nodes=nodes, edges=edges, meta=sources, archive=_archive_rows(txn, ids, salvage),
                               procedures=_procedures(txn, salvage))


def _remove_store_files(path: str) -> None:
    for suffix in ("", "-lock", "-maint"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path + suffix)


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace_exclusively(tmp: str, path: str) -> None:
    """Rename ``tmp`` over ``path`` while no process has ``path`` open (its maint lock held alone)."""
    fd = os.open(path + "-maint", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise AlreadyOpenError(f"{path} is open in another process; restore cannot replace it",
                                   hint="close the other processes, then run restore again") from None
        os.replace(tmp, path)
        os.pwrite(fd, b"clean", 0)
        _fsync_path(os.path.dirname(path) or ".")
    finally:
        os.close(fd)


def _looks_like_a_path(data: str | bytes) -> bool:
    """True for a one-line value that does not begin like a dump ("FILE:"): a path given
    where the dump's text belongs. Truncated dumps (every prefix) still reach the parser."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return bool(text) and "\n" not in text and not "FILE:".startswith(text[:5])


def restore(fp: TextIO | BinaryIO | str | bytes, path: str | os.PathLike, *, force: bool = False,
            allow_edited: bool = False, progress: Callable[[int], None] | None = None,
            **open_options: Any) -> int:
    """Rebuild a store at ``path`` from an AAAK v3 dump; returns the number of memories.

    The new file is written beside ``path`` (``path + ".restore-tmp"``) in batches of
    1,000 memories, its postings rebuilt, the dump's trailer (count and SHA-256) checked
    and the new file verified; only then is it renamed over ``path``. Anything that fails
    leaves ``path`` as it was.

    Args:
        fp: the dump (a text or binary stream, or str/bytes). Decrypt an encrypted dump
            first with :func:`engramdb.aaak.decrypt_dump`.
        path: where the store goes.
        force: replace an existing file at ``path``.
        allow_edited: accept a dump whose SHA-256 no longer matches (a deliberate hand
            edit); the grammar and the record count are still enforced.
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
    _remove_store_files(tmp)  # an earlier interrupted restore's leftovers
    items = aaak.read_dump(fp, allow_edited=allow_edited)
    try:
        header = next(items)
    except StopIteration:
        raise AAAKParseError("the dump is empty") from None
    tokenizer = header.settings.get("tokenizer")
    try:
        db = open_engram(tmp, create=True, tokenizer=tokenizer, **open_options)
        try:
            count = _load(db, header, items, progress)
            problems = db.verify()
            if problems:
                raise EngramError(f"the restored store does not verify: {problems[0]}",
                                  hint="report this as a bug, with the dump if you can share it")
        finally:
            db.close()
        _fsync_path(tmp)
        if os.path.exists(path):
            _replace_exclusively(tmp, path)
        else:
            os.replace(tmp, path)
            _fsync_path(os.path.dirname(path) or ".")
    finally:
        _remove_store_files(tmp)
    return count


def _load(db: Engram, header: aaak.DumpHeader, items: Iterator[Any], progress: Callable[[int], None] | None) -> int:
    for space in header.spaces:
        db.add_space(space["name"], dims=space["dims"], model=space["model"],
                     normalize=space.get("normalized", True), auto=space.get("auto"))
    sources = {k[len(SOURCE_META_PREFIX):]: v for k, v in header.meta.items() if k.startswith(SOURCE_META_PREFIX)}
    if sources:
        def put_sources(txn: Any) -> None:
            for name, text in sorted(sources.items()):
                txn.put("sources", db._store.blind(b"source", name.encode("utf-8", "surrogatepass")),
                        text.encode("utf-8", "surrogatepass"))

        db._store.write(put_sources)
    count = 0
    batch: list[Node] = []
    edges: list[Edge] = []
    archive: list[aaak.ArchiveRow] = []
    procedures: list[Any] = []
    for item in items:  # the trailer is checked when this loop ends
        if isinstance(item, Node):
            batch.append(item)
            if len(batch) >= RESTORE_BATCH:
                count += len(db.add_many(batch))
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
        count += len(db.add_many(batch))
    if progress:
        progress(count)

    def put_rows(txn: Any, rows: list[Any]) -> None:
        tx = Transaction(db, txn)
        for row in rows:
            if not isinstance(row, aaak.ArchiveRow):
                txn.put("procedures", _procedure_key(row), codec.pack(row))
                continue
            try:
                tx.set_archived(row.id, row.content)
            except NotFoundError:
                raise AAAKParseError(f"an archive row names a memory that is not there: {row.id!r}") from None

    rows = [*archive, *procedures]
    for start in range(0, len(rows), RESTORE_BATCH):
        db._store.write(lambda txn, chunk=rows[start:start + RESTORE_BATCH]: put_rows(txn, chunk))
    for start in range(0, len(edges), RESTORE_BATCH):
        chunk = edges[start:start + RESTORE_BATCH]

        def put_edges(txn: Any, chunk: list[Edge] = chunk) -> None:
            _put_edges(db, txn, chunk)

        db._store.write(put_edges)
    return count


def import_records(engram: Engram, items: Iterator[Node | Edge], *, batch: int = RESTORE_BATCH,
                   progress: Callable[[int], None] | None = None) -> tuple[int, int]:
    """Store imported nodes (in batches of ``batch``) and then their edges; returns (nodes, edges).

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
    known = set(engram.spaces())
    nodes: list[Node] = []
    edges: list[Edge] = []
    count = 0

    def flush() -> None:
        nonlocal count, nodes
        for node in nodes:
            for name, vec in sorted(node.embeddings.items()):
                if name not in known:
                    engram.add_space(name, dims=len(vec), model="imported", normalize=False)
                    known.add(name)
        count += len(engram.add_many(nodes))
        nodes = []
        if progress:
            progress(count)

    for item in records:
        if isinstance(item, Node):
            nodes.append(item)
            if len(nodes) >= batch:
                flush()
        else:
            edges.append(item)
    if nodes:
        flush()
    for start in range(0, len(edges), batch):
        chunk = edges[start:start + batch]

        def put_edges(txn: Any, chunk: list[Edge] = chunk) -> None:
            _put_edges(engram, txn, chunk)

        engram._store.write(put_edges)
    return count, len(edges)


def _check_import_ids(engram: Engram, records: list[Node | Edge]) -> None:
    """Refuse an import before its first write when it would stop halfway (batches commit
    one by one, so a clash found in a later batch used to leave the earlier ones behind)."""
    hint = "nothing was imported; import under new ids with --id-prefix PREFIX (id_prefix=)"
    new: set[str] = set()
    with engram._store.read() as txn:
        def stored(id_: str) -> bool:
            return txn.get("ids", engram._id_key(id_)) is not None

        for item in records:
            if isinstance(item, Node):
                if item.id in new or stored(item.id):
                    raise DuplicateIdError(f"a memory with id {item.id!r} exists", hint=hint)
                new.add(item.id)
        for item in records:
            if isinstance(item, Edge):
                for end in (item.src, item.dst):
                    if end not in new and not stored(end):
                        raise AAAKParseError(f"an edge names a memory that is not there: {end!r}",
                                             hint="nothing was imported; check the source file")


def _put_edges(engram: Engram, txn: Any, edges: list[Edge]) -> None:
    tx = Transaction(engram, txn)
    for edge in edges:
        src, dst = tx._docno(edge.src), tx._docno(edge.dst)
        if src is None or dst is None:
            raise AAAKParseError(f"an edge names a memory that is not there: {edge.src if src is None else edge.dst!r}")
        engram.indexes.graph.put(txn, src, dst, edge, derived=edge.kind == "tunnel")
