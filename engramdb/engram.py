"""The Engram facade: open a .engram file, unlock it, and read and write memories.

Composes the layers below: the header and key slots (header), record encoding (codec),
transactions (store), bulk ingest (bulk) and the derived indexes. No storage logic of its own.
"""
from __future__ import annotations

import builtins
import contextlib
import operator
import os
from typing import TYPE_CHECKING, Any, BinaryIO, TextIO, TypeVar, overload
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from . import bulk, codec, crypto, format_features
from . import header as hdr
from . import verify as verify_mod
# their home was here: users, error hints and the CLI name them so
from .bulk import INGEST_CHUNK as INGEST_CHUNK  # for reading: set engramdb.bulk.INGEST_CHUNK
from .header import (
    FORMAT_NAME as FORMAT_NAME, FORMAT_VERSION as FORMAT_VERSION, KEYFILE_MAGIC as KEYFILE_MAGIC,
    RECOVERY_PREFIX as RECOVERY_PREFIX, read_key_file as read_key_file,
)
from .verify import Problem as Problem
from .errors import (
    CorruptFileError, DecryptionError, DuplicateIdError, FileMissingError, ForeignFileError,
    ModeMismatchError, NotFoundError, ReadOnlyError, StoreError, ValidationError, WrongPassphraseError, shown,
)
from .records import Edge, Node, check_written, now_ts
from .fusion import FusionWeights, check_fusion
from .store import DEFAULT_TIMEOUT, TABLES, Store, Txn, structural_problems

if TYPE_CHECKING:  # annotations only: recall and the indexes sit above or beside this layer's imports
    from numpy.typing import ArrayLike

    from .filters import Filter, NameSet, TimeBound
    from .index import IndexBatch, Indexed, Indexes
    from .index.vectors import Embedder, EmbeddingSpace
    from .maintenance.run import Progress
    from .maintenance.forget import ForgetReceipt
    from .maintenance.lifecycle import MaintenanceConfig, MaintenanceReport, Summarizer
    from .recall import Context, Hit

__all__ = ["Engram", "open", "Problem", "FORMAT_VERSION"]

_D = TypeVar("_D")

_NODE_FIELDS = set(Node.__dataclass_fields__)
_first = operator.itemgetter(0)
_id_of = operator.attrgetter("id")
# compact() rewrites a table into full pages (Txn.repack) only when that leaves less than this
# fraction of its leaf pages, so a table that would shrink by less than 5 % is not rewritten
# (each rewrite writes the table twice in one transaction). 10 % of random deletes leave the
# node pages ~90 % used: rewritten (at 1M, 0.96x -> 0.89x the fresh file; without it, 2 s
# of CPU and ~0.4 GB of LMDB's dirty pages less)
REPACK_BELOW_FILL = 0.95


# --- the facade ----------------------------------------------------------------------

def open(path: str | os.PathLike[str], *, passphrase: str | bytes | None = None, key: bytes | str | None = None,
         encrypted: bool = True, create: bool = True, readonly: bool = False,
         kdf: crypto.KDFParams | None = None, verify: bool = False, map_size: int | None = None,
         tokenizer: Mapping[str, Any] | None = None, timeout: float | None = DEFAULT_TIMEOUT,
         repair: bool = False, cache_mb: float | None = None, fusion: FusionWeights | None = None,
         allow_unsafe_fs: bool = False) -> Engram:
    """Open (or create) a .engram file.

    Args:
        path: the data file. LMDB keeps its reader table in ``path + "-lock"``.
        passphrase: unlocks (or, for a new file, protects) an encrypted file.
        key: a raw 32-byte key (for example from an OS keychain) or a recovery-key string,
            instead of a passphrase.
        encrypted: False creates a plaintext file; only ever when asked explicitly.
        create: create the file when missing.
        readonly: open without write access (no write lock is ever taken).
        kdf: argon2id parameters for a new file (default t=3, m=64 MiB, p=4).
        verify: run LMDB's structural check before mapping the file, and check every
            table against the sealed state's digests after unlocking it (which finds records
            rolled back in place). The structural check alone also runs whenever the file
            may have changed outside engramdb since its last clean close (spec/file-format.md).
        map_size: initial map size in bytes (it grows by itself).
        tokenizer: tokenizer settings for a new file (see spec/bm25.md); a file keeps its
            tokenizer for life, and opening it with different settings is an error.
        timeout: seconds this handle waits for another process or thread: at open, for a
            compaction or restore of the file to finish; in each write, for the writer
            before it (default 30; None waits as long as it takes). :class:`BusyError` when
            it expires.
        repair: open a file whose sealed state is missing or was not written by the file's
            last commit (otherwise refused), only to run ``verify(fix=True)`` on it.
        cache_mb: the limit, in MiB, of each of this handle's caches of decrypted data
            (None: each cache's default; the postings cache's is 64 MiB, the vector
            matrices' 2048 MiB together, beyond which a space is searched block by block): least
            recently used entries are evicted beyond it (README, "Memory").
        fusion: the :class:`~engramdb.FusionWeights` every recall of this handle fuses its
            retrievers with, unless a call passes its own (default: the documented defaults,
            spec/recall.md "Fusion"). Not stored in the file.
        allow_unsafe_fs: open a file on a network or FUSE filesystem (NFS, SMB/CIFS, 9p,
            virtiofs, sshfs, s3fs, ...), which is otherwise refused, read-only opens too:
            LMDB's locks and the coherence of its memory map do not hold there, so only
            pass True when no other process or machine uses the file at the same time.
            Docker's overlay root and other local filesystems are never refused. The
            environment variable ``ENGRAM_ALLOW_UNSAFE_FS=1`` does the same for every open
            (the command line, the fleet's workers). spec/file-format.md, "Local
            filesystems only".

    Raises:
        ModeMismatchError: a key for a plaintext file, or none for an encrypted one.
        WrongPassphraseError: the passphrase or key does not unlock the file.
        CorruptFileError, ForeignFileError, FormatVersionError: see their hints.
        BusyError: another process kept the file busy past ``timeout``.
        UnsafeFilesystemError: the file is on a network or FUSE filesystem (see ``allow_unsafe_fs``).
    """
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ValidationError(f"path must be a file path (str or os.PathLike[str]), got {path!r}",
                              hint='pass the path of the .engram file, e.g. open("notes.engram", passphrase=...)')
    if passphrase is not None and key is not None:
        raise ValidationError("pass either passphrase or key, not both")
    raw_key = hdr.parse_raw_key(key) if key is not None else None
    if raw_key is not None and len(raw_key) != 32:
        raise ValidationError("a raw key must be exactly 32 bytes", hint="generate one with os.urandom(32)")
    if kdf is not None:
        kdf.check()
    # refused before LMDB creates anything: a failed open must not leave an empty store behind
    if passphrase is not None:
        crypto.normalize_passphrase(passphrase)
    if encrypted and passphrase is None and raw_key is None and create and not readonly \
            and not os.path.lexists(os.fspath(path)):
        raise ModeMismatchError("a new encrypted file needs a passphrase or key",
                                hint="pass passphrase=..., or encrypted=False for a plaintext file")
    cache_mb = _check_cache_mb(cache_mb)
    fusion = check_fusion(fusion)
    parent = os.path.dirname(os.path.abspath(os.fspath(path)))
    if not os.path.isdir(parent):  # said plainly, not as a store error pointing at verify (issue 12, bug 11)
        raise FileMissingError(f"{os.fspath(path)}: the directory {parent} does not exist",
                               hint="check the path; create the directory first for a new store")
    store = Store.open(path, readonly=readonly, create=create, map_size=map_size, verify=verify, timeout=timeout,
                       allow_unsafe_fs=allow_unsafe_fs)
    store.repair = bool(repair)
    try:
        engram = Engram._unlock(store, passphrase=passphrase, raw_key=raw_key, encrypted=encrypted, kdf=kdf)
        if not repair:  # the snapshot must be the last engramdb commit (a removed or older state is not)
            with store.read() as txn:
                problems = [txn.binding_problem()] + (verify_mod.digest_problems(txn) if verify else [])
            problems = [p for p in problems if p]
            if problems:
                raise CorruptFileError(f"{store.path}: {problems[0]}",
                                       hint="run `engramdb verify --fix FILE` (it rebuilds the state from the "
                                            "records), or restore from a dump or backup")
        engram._tokenizer_settings = dict(tokenizer) if tokenizer is not None else None
        engram._cache_mb = cache_mb
        engram.fusion = fusion
        indexes = engram.indexes  # checks the requested tokenizer against the file's
        if not store.readonly:
            from .index import TOKENIZER_KEY

            with store.read() as txn:
                recorded = txn.get("meta", TOKENIZER_KEY) is not None
            if not recorded:  # a new file records its tokenizer at once
                store.write(indexes.ensure_meta)
            with store.read() as txn:
                legacy = not repair and indexes.needs_migration(txn)
            if legacy:  # older index layouts: vectors (spec/vectors.md), postings keys (spec/bm25.md)
                store.write(indexes.migrate)
        return engram
    except BaseException:
        store.close()
        raise


def _repair_header(txn: Txn) -> None:
    """Write the good copy of the header over a damaged one, as the file has it now: the copy
    read before the write may be older than another process's rekey since."""
    header, _, needs_repair = hdr.read_header(txn, txn.store.path)
    if needs_repair:
        hdr.write_header(txn, header)


def _fresh(txn: Txn) -> bool:
    """Whether the file holds nothing of engramdb yet (a new file, to be initialised)."""
    return txn.get_header(b"header") is None and txn.get_header(b"header.bak") is None \
        and txn.count("nodes") == 0 and txn.count("meta") == 0


def _check_cache_mb(cache_mb: Any) -> float | None:
    """``open(cache_mb=)`` checked: None or a finite number >= 0.

    Raises:
        ValidationError: anything else.
    """
    if cache_mb is None:
        return None
    if isinstance(cache_mb, bool) or not isinstance(cache_mb, (int, float)) or not 0 <= cache_mb < float("inf"):
        raise ValidationError(f"cache_mb must be a number of MiB >= 0, not {cache_mb!r}",
                              hint="pass e.g. cache_mb=64, or leave it out for the default")
    return float(cache_mb)


class Engram:
    """An open .engram file. Use as a context manager, or call :meth:`close`.

    Thread-safe for readers; writes are serialized by LMDB's writer lock (one writer
    across all threads and processes). A :meth:`transaction` belongs to the thread that
    opened it. Do not use a handle after ``fork()``: open the
    file again in the child.
    """

    def __init__(self, store: Store, header: dict[str, Any]) -> None:
        self._store = store
        self._header = header
        # the passphrase slot this handle knows the passphrase of (opened with, or set by its
        # own rekey): a rekey is refused when the file's has changed since (see _put_slot)
        self._passphrase_slots = [s for s in header.get("slots", ()) if isinstance(s, dict)
                                  and s.get("kind") == "passphrase"]
        self._tokenizer_settings: dict[str, Any] | None = None
        self._cache_mb: float | None = None
        #: the FusionWeights of this handle's recalls (``open(fusion=)``; a call's ``fusion=`` wins)
        self.fusion: FusionWeights | None = None

    # -- opening -------------------------------------------------------------------------
    @classmethod
    def _unlock(cls, store: Store, *, passphrase: str | bytes | None, raw_key: bytes | None, encrypted: bool,
                kdf: crypto.KDFParams | None) -> Engram:
        with store.read() as txn:
            fresh = _fresh(txn)
            if not fresh:
                header, _, needs_repair = hdr.read_header(txn, store.path)
        if fresh:
            if store.readonly:
                raise ForeignFileError(f"{store.path} has no engramdb header")
            made = cls._initialize(store, passphrase=passphrase, raw_key=raw_key, encrypted=encrypted, kdf=kdf)
            if made is not None:
                return made
            with store.read() as txn:  # another process initialised the file meanwhile: open theirs
                header, _, needs_repair = hdr.read_header(txn, store.path)
        store.sealer = hdr.sealer_for(header, store.path, passphrase=passphrase, raw_key=raw_key)
        engram = cls(store, header)
        with store.read() as txn:
            txn.state  # the sealed state record must open under this key  # noqa: B018
            format_features.check(txn, store.path, store.readonly)
        if needs_repair and not store.readonly:
            store.write(_repair_header)
        return engram

    @classmethod
    def _initialize(cls, store: Store, *, passphrase: str | bytes | None, raw_key: bytes | None, encrypted: bool,
                    kdf: crypto.KDFParams | None) -> Engram | None:
        """A new file's header and state; None when another process initialised the file
        since it was found fresh (two processes opening one new file at once): its header
        written over theirs would leave their records under a key nobody has."""
        header, sealer = hdr.new_header(encrypted=encrypted, passphrase=passphrase, raw_key=raw_key, kdf=kdf)

        def init(txn: Txn) -> bool:
            if not _fresh(txn):
                return False
            hdr.write_header(txn, header)
            txn.state  # creates the sealed state record on commit  # noqa: B018
            return True

        store.sealer = sealer  # the state record is sealed with it
        if not store.write(init):
            return None
        return cls(store, header)

    # -- context management -----------------------------------------------------------
    def __enter__(self) -> Engram:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the handle. Safe to call twice."""
        self._store.close()

    @property
    def path(self) -> str:
        return self._store.path

    @property
    def encrypted(self) -> bool:
        return bool(self._header.get("encrypted"))

    @property
    def readonly(self) -> bool:
        return self._store.readonly

    # -- search (index hook: engramdb/index, engramdb/recall.py) ------------------------
    @property
    def indexes(self) -> Indexes:
        """The derived indexes (BM25, vectors, graph) of this handle, created on first use.

        Raises:
            ConfigMismatchError: the file's tokenizer needs PyStemmer and it is missing.
        """
        idx = self.__dict__.get("_indexes")
        if idx is None:
            from .index import Indexes
            from .index.tokenize import Tokenizer

            wanted = self._tokenizer_settings
            idx = self.__dict__["_indexes"] = Indexes.open(
                self._store, Tokenizer.from_settings(wanted) if wanted is not None else None,
                cache_mb=self._cache_mb)
        return idx

    def recall(self, query: str, *, top_k: int = 5, hops: bool = True, expand_query: bool = True,
               after: TimeBound | None = None, before: TimeBound | None = None, tiers: NameSet | None = None,
               tags: NameSet | None = None, any_tags: NameSet | None = None, flags: NameSet | None = None,
               any_flags: NameSet | None = None, source: str | None = None, min_relevance: float = 0.0,
               explain: bool = False, touch: bool = False, now: float | None = None,
               fusion: FusionWeights | None = None) -> list[Hit]:
        """The memories that best answer ``query``, best first (see :func:`engramdb.recall.recall`).

        BM25 over the encrypted postings, plus vector search in every embedding space that
        can embed the query, fused (weights: :class:`~engramdb.FusionWeights`), boosted by tier and date proximity,
        penalised when superseded, and widened by one tunnel hop. Ties break by insertion
        order. Reads take no write lock unless ``touch=True``. Each hit carries a
        ``relevance`` in [0, 1], comparable across queries; ``min_relevance`` drops hits below it.
        The filters (``after``, ``before``, ``tiers``, ``tags`` (all), ``any_tags``, ``flags``
        (all), ``any_flags``, ``source``) mean the same as in :meth:`scan` (see :mod:`engramdb.filters`).
        ``fusion`` (a :class:`~engramdb.FusionWeights`) overrides the handle's weights
        (``open(fusion=)``) for this call.

        Raises:
            ValidationError: bad arguments.
        """
        from .recall import recall

        return recall(self._store, self.indexes, query, top_k=top_k, hops=hops, expand_query=expand_query,
                      after=after, before=before, tiers=tiers, tags=tags, any_tags=any_tags, flags=flags,
                      any_flags=any_flags, source=source, min_relevance=min_relevance, explain=explain,
                      touch=touch, now=now, fusion=self.fusion if fusion is None else fusion)

    def recall_context(self, query: str, *, top_k: int = 10, max_tokens: int = 2000, source: str | None = None,
                       source_text: str | None = None, **kwargs: Any) -> Context:
        """Small-to-big: the source passages of the best memories, merged, within ``max_tokens``,
        in document order (see :func:`engramdb.recall.recall_context`). ``source`` keeps only
        memories of that source name; ``source_text`` is the text their offsets point into,
        for memories whose source text the file does not hold (zettel-compress's ``source``).

        Raises:
            ValidationError: bad arguments.
        """
        from .recall import recall_context

        if kwargs.get("fusion") is None:
            kwargs["fusion"] = self.fusion
        return recall_context(self._store, self.indexes, query, top_k=top_k, max_tokens=max_tokens,
                              source=source, source_text=source_text, **kwargs)

    def add_space(self, name: str, *, dims: int, model: str = "engramdb/hashed-tfidf-v1", normalize: bool = True,
                  auto: bool | None = None, embedder: Any = None) -> None:
        """Create an embedding space (recorded in the file; its model and dims are enforced).

        With the built-in model (the default, a hashed TF-IDF embedder that needs no
        download), ``auto`` defaults to True: every memory gets a vector from its text.
        ``embedder`` (a callable ``list[str] -> float32 array``) embeds queries in this
        space for this handle; a space of the built-in model takes none.

        Raises:
            EmbeddingError: bad settings.
            ConfigMismatchError: the space exists with another model or dims.
        """
        from .index.vectors import HASHED_MODEL, EmbeddingSpace, check_embedder

        space = EmbeddingSpace(name=name, model=model, dims=dims, normalize=normalize,
                               auto=(model == HASHED_MODEL) if auto is None else auto)
        if embedder is not None:
            check_embedder(name, embedder, model)  # before the space is written: a bad call changes nothing
        self._store.write(lambda txn: self.indexes.add_space(txn, space))
        if embedder is not None:
            self.indexes.vectors.set_embedder(name, embedder, model)

    def set_embedder(self, space: str, embedder: Embedder) -> None:
        """Use ``embedder`` (``list[str] -> float32 array``) for queries in ``space`` on this handle.

        Raises:
            EmbeddingError: ``embedder`` is not callable, or ``space`` uses the built-in model.
        """
        known = self.spaces().get(space)
        self.indexes.vectors.set_embedder(space, embedder, known.model if known is not None else None)

    def spaces(self) -> dict[str, EmbeddingSpace]:
        """The file's embedding spaces by name."""
        with self._store.read() as txn:
            return self.indexes.vectors.spaces(txn)

    def link(self, src: str, dst: str, kind: str = "related", *, weight: float = 1.0, label: str = "",
             valid_from: float | None = None, valid_to: float | None = None, now: float | None = None) -> None:
        """Add (or replace) a typed edge ``src -> dst`` (kinds: engramdb.EDGE_KINDS).

        A ``supersedes`` edge ranks ``dst`` lower in recall; other kinds carry relevance one
        hop in recall.

        Raises:
            NotFoundError: either id is missing.
            ValidationError: bad kind or weight, or ``src == dst``.
        """
        self._store.write(lambda txn: Transaction(self, txn).link(
            src, dst, kind, weight=weight, label=label, valid_from=valid_from, valid_to=valid_to, now=now))

    def unlink(self, src: str, dst: str, kind: str = "related", *, missing_ok: bool = False) -> bool:
        """Remove the edge ``src -> dst`` of ``kind``; returns False when there was none and ``missing_ok``.

        Raises:
            NotFoundError: either id is missing, or (unless ``missing_ok``) the edge is.
            ValidationError: an unknown kind.
        """
        def drop(txn: Txn) -> bool:
            tx = Transaction(self, txn)
            a, b = tx._docno(src), tx._docno(dst)
            if a is None or b is None:
                raise NotFoundError(f"no memory with id {shown(src if a is None else dst)}")
            found = self.indexes.graph.delete(txn, a, b, kind)
            if not found and not missing_ok:
                raise NotFoundError(f"no {kind} edge from {shown(src)} to {shown(dst)}",
                                    hint="list the edges of a memory with db.edges(id)")
            return found

        return self._store.write(drop)

    def edges(self, id: str) -> list[Edge]:
        """The edges leaving memory ``id``, in key order.

        Raises:
            NotFoundError: no such id.
        """
        with self._store.read() as txn:
            docno = Transaction(self, txn)._docno(id)
            if docno is None:
                raise NotFoundError(f"no memory with id {shown(id)}")
            return [edge for _, edge, _ in self.indexes.graph.outgoing(txn, docno)]

    def link_tunnels(self, *, now: float | None = None) -> int:
        """Recompute the tunnel edges (memories sharing entities/topics); returns their number."""
        return self._store.write(lambda txn: self.indexes.link_tunnels(txn, now=now_ts(now)))

    def merge_indexes(self, max_steps: int = 10, *, force: bool = False) -> int:
        """Run up to ``max_steps`` index merge steps in one write; returns how many ran.

        ``force=True`` then merges every segment into one (a full optimise: all postings
        rewritten, streamed in bounded chunks). :meth:`compact` does not need it: it purges
        deleted memories from the segments holding them.
        """
        return self._store.write(lambda txn: self.indexes.merge(txn, max_steps, force=force))

    # -- records ------------------------------------------------------------------------
    def _id_key(self, id: str) -> bytes:
        if not isinstance(id, str) or not id:
            raise ValidationError("an id must be a non-empty string")
        return self._id_keys([id])[0]

    def _id_keys(self, ids: list[str]) -> list[bytes]:
        """The blind keys of already validated ids (node ids)."""
        return self._store.blind_many(b"id", [id.encode("utf-8", "surrogatepass") for id in ids])

    def add(self, item: Node | str | Mapping[str, Any] = "", /, *, now: float | None = None, **fields: Any) -> str:
        """Store one memory and return its id.

        ``item`` is the content text, a mapping of node fields, or a :class:`Node`;
        keyword arguments set further fields (``id``, ``tags``, ``importance``, ...).
        Timestamps default to ``now`` (injectable for determinism).

        Raises:
            DuplicateIdError: a memory with that id exists.
            ValidationError: a field is invalid.
        """
        node = bulk.build(item, fields, now)
        return self._store.write(lambda txn: Transaction(self, txn)._put_new(node))

    def remember(self, text: str, /, *, now: float | None = None, **fields: Any) -> str:
        """Store ``text`` as a memory; the friendly spelling of :meth:`add`."""
        if not isinstance(text, str):
            raise ValidationError("remember() takes the memory's text")
        return self.add(text, now=now, **fields)

    def add_many(self, items: Iterable[Node | str | Mapping[str, Any]], *, now: float | None = None) -> list[str]:
        """Store many memories in one transaction (all or nothing); returns their ids.

        Memories are built, written and indexed :data:`~engramdb.bulk.INGEST_CHUNK` at a
        time (one BM25 segment per chunk), so engramdb's own working set is a chunk's, not
        the batch's. LMDB keeps the pages one transaction writes in memory up to its cap of
        512 MiB (about +700 MB for a million memories), so for millions use
        :meth:`import_many`, which commits each chunk (spec/file-format.md, "Memory of a
        large write transaction").

        Raises:
            DuplicateIdError: an id exists already or repeats in ``items``.
        """
        return bulk.add_many(self._store, self._batched, items, now)

    def import_many(self, items: Iterable[Node | str | Mapping[str, Any]], *, now: float | None = None,
                    chunk: int | None = None, progress: Callable[[int, int], None] | None = None) -> tuple[int, int]:
        """Bulk import: store many memories, committing every ``chunk`` of them (default
        :data:`~engramdb.bulk.INGEST_CHUNK`) in its own transaction; returns ``(added,
        skipped)``.

        Unlike :meth:`add_many`, the import as a whole is **not atomic**: a crash, a full
        disk or an error stops it after its last committed chunk (each chunk is all or
        nothing, and nothing committed is lost). It is **resumable and idempotent by id**: a
        memory whose id is stored already, or came earlier in ``items``, is skipped, not an
        error, so running the same import again completes an interrupted one and adds
        nothing twice. (A memory without an id gets a new one each time: give ids to import
        resumably.) ``items`` is consumed a chunk at a time, so it can be a generator over a
        file larger than memory. What the import holds at once is one chunk's working set
        and LMDB's heap copies of the pages one chunk writes, where one :meth:`add_many`
        of a million memories holds LMDB's cap of 512 MiB (tools/bench/README.md, "Memory").

        Args:
            chunk: memories per transaction (one BM25 segment each).
            progress: called after each commit with the running ``(added, skipped)``.

        Raises:
            ValidationError: ``chunk`` is not a positive integer, or an item is invalid
                (the chunks before it are committed).
        """
        return bulk.import_many(self._store, self._batched, items, now, chunk=chunk, progress=progress)

    @contextlib.contextmanager
    def _batched(self, txn: Txn) -> Iterator[Transaction]:
        """Record operations whose index changes go into one batch, flushed at the end:
        one write transaction makes at most one BM25 segment and one vector block."""
        tx = Transaction(self, txn)
        joined = self.indexes.open_batch(txn)  # a write inside an open transaction joins its batch
        tx._index_batch = batch = joined or self.indexes.batch(txn)  # index hook
        try:
            yield tx
            batch.flush()
        finally:
            if joined is None:
                self.indexes.close_batch(txn)

    def procedure_rows(self) -> list[dict[str, Any]]:
        """The rows of the procedural graph (spec/agent.md); write them with
        ``Transaction.put_procedure_row`` / ``delete_procedure_row`` inside :meth:`transaction`."""
        with self._store.read() as txn:
            return Transaction(self, txn).procedure_rows()

    def procedure_rows_since(self, version: tuple[int, int] | None = None
                             ) -> tuple[tuple[int, int] | None, list[dict[str, Any]] | None]:
        """``(the file's version, the rows of the procedural graph)``, read in one snapshot;
        the rows are None when the file is still at ``version`` (no process committed since),
        so a caller that keeps what it read at a version reads nothing again while the file
        stays there. Inside a write transaction of this thread the version is None (its
        uncommitted rows are at no version): keep nothing read then."""
        with self._store.read() as txn:
            if txn.write:
                return None, Transaction(self, txn).procedure_rows()
            now = (txn.state.seq, txn.snapshot_id)
            return now, None if now == version else Transaction(self, txn).procedure_rows()

    def archived(self, id: str) -> str | None:
        """The archived full text of a memory (kept when a memory is archived), or None."""
        with self._store.read() as txn:
            return Transaction(self, txn).archived(id)

    @overload
    def get(self, id: str, /, *, full: bool = False) -> Node: ...
    @overload
    def get(self, id: str, default: _D, /, *, full: bool = False) -> Node | _D: ...
    def get(self, id: str, default: Any = ..., /, *, full: bool = False) -> Any:
        """The memory with this id.

        An archived memory comes back as its stub: ``node.archived`` is True and its
        ``content`` is a short preview. With ``full=True`` it comes back as it was before it
        was archived (byte for byte the same record), unless it was archived with truncation.

        Raises:
            NotFoundError: no such id (unless ``default`` is given).
        """
        with self._store.read() as txn:
            tx = Transaction(self, txn)
            node = tx.find(id)
            if node is not None and full:
                from .maintenance import archive

                node = archive.full_of(tx, node)
        if node is None:
            if default is not ...:
                return default
            raise NotFoundError(f"no memory with id {shown(id)}")
        return node

    def archive(self, id: str, /, *, truncate: bool = False, now: float | None = None) -> int:
        """Archive a memory: its full text moves to the archive table (zstd-compressed, sealed)
        and the memory keeps a preview (its first 200 characters, then ``...``) as its content,
        with tier ``archive``.
        Returns the number of bytes of text dropped: always 0 unless ``truncate=True``, which
        keeps only the preview (the rest is gone for good). Archiving an archived memory does
        nothing. See spec/maintenance.md, "Archive".

        Raises:
            NotFoundError: no such id.
        """
        return self._store.write(lambda txn: Transaction(self, txn).archive(id, truncate=truncate, now=now))

    def unarchive(self, id: str, /) -> Node:
        """Put an archived memory back as it was (content, tier and metadata, byte for byte)
        and return it. A memory that is not archived is returned unchanged.

        Raises:
            NotFoundError: no such id.
            ValidationError: it was archived with ``truncate=True``; its text is gone.
        """
        return self._store.write(lambda txn: Transaction(self, txn).unarchive(id))

    def pin(self, id: str, /) -> Node:
        """Pin a memory: the maintenance pass never decays it or merges it away. Returns it.

        Raises:
            NotFoundError: no such id.
        """
        return self.update(id, pinned=True)

    def unpin(self, id: str, /) -> Node:
        """Undo :meth:`pin`. Returns the memory.

        Raises:
            NotFoundError: no such id.
        """
        return self.update(id, pinned=False)

    def forget(self, *, ids: Iterable[str] | None = None, query: str | None = None, embedding: ArrayLike | None = None,
               threshold: float = 0.7, dry_run: bool = False, space: str | None = None) -> ForgetReceipt:
        """Remove memories so that nothing of them is left in the file, and return a receipt.

        Chooses the memories by ``ids`` and/or by similarity (at least ``threshold``) of
        their vectors to a ``query`` text or an ``embedding`` (in ``space``, else every
        space that can compare it; with a query text, an archived memory also by its archived
        original, embedded by the space's embedder: either match chooses it; with an
        ``embedding``, by its stub's vector only). Deletes them with their postings, vectors, edges,
        archive rows and the source passages only they used, merges the index segments
        that held them and compacts the file: no page keeps their text or old ciphertext.
        The receipt lists the ids, the entries removed per table and the summaries built
        from them (kept). ``dry_run=True`` only reports. See spec/maintenance.md, "Forget".

        Raises:
            ValidationError: nothing to choose by, a bad threshold, or no space can compare the query.
            NotFoundError: an id is missing (nothing is forgotten).
            AlreadyOpenError: removed, but another handle keeps the file from being compacted.
        """
        from .maintenance.forget import forget

        return forget(self, ids=list(ids) if ids is not None and not isinstance(ids, str) else ids, query=query,
                      embedding=embedding, threshold=threshold, dry_run=dry_run, space=space)

    def maintain(self, config: MaintenanceConfig | None = None, summarizer: Summarizer | None = None, *,
                 now: float | None = None, plan: bool = False, progress: Progress | None = None) -> MaintenanceReport:
        """One maintenance pass: decay, dedupe, clusters with summaries (only with a
        ``summarizer``, a callable from a list of texts to one text), archive. See
        spec/maintenance.md.

        Incremental (compares only what changed since the last pass), in write batches of
        ``config.batch_size`` memories, idempotent, and resumable: a pass killed anywhere is
        finished by the next call, which returns that pass's report. ``plan=True`` writes
        nothing and reports what would change. ``progress(stage, done, total)`` is called
        as the pass goes.

        Raises:
            ValidationError: bad arguments, or another pass is running on this file.
            EmbeddingError: ``config.space`` names no space of the file.
        """
        from .maintenance.run import Target, maintain

        return maintain(Target(self._store, self.indexes, self.transaction), config, summarizer, now=now,
                        plan=plan, progress=progress)

    def update(self, id: str, /, **changes: Any) -> Node:
        """Change fields of a memory (read-modify-write in one transaction); returns the new node.

        Raises:
            NotFoundError: no such id.
            ValidationError: a change is invalid (``id`` cannot change; an archived memory's
                content cannot change until it is unarchived).
        """
        return self._store.write(lambda txn: Transaction(self, txn).update(id, **changes))

    def delete(self, id: str, /, *, missing_ok: bool = False) -> bool:
        """Delete a memory and its index entries. Returns False if it was missing and ``missing_ok``.

        The ciphertext stays in free pages until they are reused; :meth:`compact` removes it.

        Raises:
            NotFoundError: no such id (unless ``missing_ok``).
        """
        return self._store.write(lambda txn: Transaction(self, txn).delete(id, missing_ok=missing_ok))

    def delete_many(self, ids: Iterable[str], /, *, missing_ok: bool = False) -> int:
        """Delete many memories in one transaction (all or nothing); returns how many were deleted.

        The bulk form of :meth:`delete`: ids, records and index entries are removed in
        batches, several times faster per memory than one :meth:`delete` each.

        Raises:
            NotFoundError: an id is missing (unless ``missing_ok``); nothing is deleted.
        """
        ids = list(ids)
        return self._store.write(lambda txn: Transaction(self, txn).delete_many(ids, missing_ok=missing_ok))

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """A block of operations that commits atomically, or not at all on an exception::

            with db.transaction() as tx:
                node = tx.get(counter_id)
                tx.update(counter_id, access_count=node.access_count + 1)

        Reads inside see the transaction's own writes; the writer lock is held for the block.
        The handle's own writes (``db.add``, ``db.update``, ``db.rekey``, ...) called inside
        the block join it. :meth:`compact`, :meth:`maintain` and :meth:`forget` commit by
        themselves and raise :class:`~engramdb.errors.ValidationError` inside it: call them
        after the block.

        The transaction belongs to the thread that opened it: used from another thread it
        raises :class:`~engramdb.errors.WrongThreadError` (and writes nothing). Open one
        ``db.transaction()`` in each thread that writes; they take turns.
        """
        with self._store.transaction() as txn, self._batched(txn) as tx:
            yield tx

    def __len__(self) -> int:
        with self._store.read() as txn:
            return txn.count("nodes")

    def __contains__(self, id: object) -> bool:
        if not isinstance(id, str) or not id:
            return False
        with self._store.read() as txn:
            return txn.get("ids", self._id_key(id)) is not None

    def __iter__(self) -> Iterator[Node]:
        return self.scan()

    def ids(self) -> list[str]:
        """Every id, in insertion order."""
        return [node.id for node in self.scan()]

    def scan(self, *, tiers: NameSet | None = None, tags: NameSet | None = None, any_tags: NameSet | None = None,
             flags: NameSet | None = None, any_flags: NameSet | None = None, source: str | None = None,
             after: TimeBound | None = None, before: TimeBound | None = None, batch: int = 512,
             tier: NameSet | None = None) -> Iterator[Node]:
        """Memories in insertion order, filtered (see :mod:`engramdb.filters`): in one of
        ``tiers``, with all ``tags`` / one of ``any_tags``, all ``flags`` / one of
        ``any_flags``, of ``source``, dated within ``after`` and ``before`` (timestamps,
        dates, datetimes or ISO strings, as in :meth:`recall`): a memory's ``resolved_date``
        when it has one (both ends inclusive, as zettel-compress compares), else its
        ``created_at`` (at or after ``after``, strictly before ``before``).

        One string is a set of one (``tags="people"``). ``tier=`` is the old name of
        ``tiers=`` and still accepted.

        Reads in short snapshots of ``batch`` records so a long scan never pins old pages.

        Raises:
            ValidationError: an unknown tier or flag, a malformed date, or a filter that is
                neither a string nor a list of strings.
        """
        from .filters import Filter

        if tier is not None:
            if tiers is not None:
                raise ValidationError("pass tiers= only (tier= is its old name)")
            tiers = tier
        keep = Filter(tiers=tiers, tags=tags, any_tags=any_tags, flags=flags, any_flags=any_flags, source=source,
                      after=after, before=before)
        return self._scan(keep, batch)

    def _scan(self, keep: Filter, batch: int) -> Iterator[Node]:
        start = b""
        while True:
            with self._store.read() as txn:
                chunk = []
                read_node = self.indexes.read_node
                for key, value in txn.items("nodes", start=start or None):
                    chunk.append((key, read_node(txn, codec.from_u64(key), value)))
                    if len(chunk) >= batch:
                        break
            for _, node in chunk:
                if keep(node):
                    yield node
            if len(chunk) < batch:
                return
            start = codec.u64(codec.from_u64(chunk[-1][0]) + 1)

    # -- keys ----------------------------------------------------------------------------
    def rekey(self, new_passphrase: str | bytes, *, kdf: crypto.KDFParams | None = None) -> None:
        """Change the passphrase: re-wraps the data key in one transaction; no data is re-encrypted.

        The old wrapped key stays in free pages until reused; call :meth:`compact` to drop it.
        Slots another handle or process added meanwhile (a recovery key) are kept.

        Raises:
            ModeMismatchError: the file is plaintext.
            WrongPassphraseError: another handle or process changed the passphrase since
                this handle opened the file (or last rekeyed it); nothing was changed.
        """
        self._require_encrypted()
        slot = hdr.make_slot(self._header, self._dek(), passphrase=new_passphrase, kdf=kdf)  # argon2 outside the lock
        self._put_slot(slot, lambda s: s.get("kind") == "passphrase", rekey=True)

    def add_recovery_key(self) -> str:
        """Add a recovery-key slot and return the key (``ERK1-...``). Store it somewhere safe:
        it opens the file like the passphrase does (``open(path, key=...)``). Replaces an
        earlier recovery key.
        """
        self._require_encrypted()
        raw = os.urandom(32)
        slot = hdr.make_slot(self._header, self._dek(), raw_key=raw, label="recovery")
        self._put_slot(slot, lambda s: s.get("label") == "recovery")
        return hdr.format_recovery_key(raw)

    def _put_slot(self, slot: dict[str, Any], replaces: Callable[[dict[str, Any]], bool], *,
                  rekey: bool = False) -> None:
        """Write ``slot`` into the file's header in place of the slots ``replaces`` picks.

        The header is read again inside the write: another handle or process may have
        changed its other slots since this handle opened the file, and a header built from
        this handle's copy would undo that (a new passphrase or recovery key would stop
        working). A ``rekey`` whose handle is older than the file's passphrase is refused:
        it would silently undo a passphrase change another user was told had worked.

        Raises:
            WrongPassphraseError: ``rekey`` and the file's passphrase changed since this
                handle read the header.
        """
        mine = self._header

        def write(txn: Txn) -> dict[str, Any]:
            current, _, _ = hdr.read_header(txn, self.path)
            if any(current.get(k) != mine.get(k) for k in hdr.SLOT_BOUND_FIELDS):
                raise CorruptFileError(f"the header of {self.path} was replaced since this handle opened it "
                                       "(another store id, format or cipher); nothing was changed",
                                       hint="open the file again, then retry")
            if rekey and [s for s in current["slots"] if replaces(s)] != self._passphrase_slots:
                raise WrongPassphraseError(f"the passphrase of {self.path} was changed by another handle or "
                                           "process since this one opened it; nothing was changed",
                                           hint="open the file again with its current passphrase, then retry")
            header = dict(current)
            header["slots"] = [s for s in current["slots"] if not replaces(s)] + [slot]
            hdr.write_header(txn, header)
            return header

        self._header = self._store.write(write)
        if rekey:
            self._passphrase_slots = [slot]

    def _file_header(self) -> dict[str, Any]:
        """The header as the file has it now (another process may have changed its slots)."""
        with self._store.read() as txn:
            return hdr.read_header(txn, self.path)[0]

    def export_key(self, path: str | os.PathLike[str]) -> None:
        """Write the header (salt, KDF parameters, wrapped data keys; no secrets) to ``path``.

        Keep it apart from the data: if the file's header is ever damaged,
        :func:`import_key` puts it back. It is useless without the passphrase.

        Raises:
            ModeMismatchError: the file is plaintext (import_key could not use its header).
            ValidationError: ``path`` is the store's own data file or one of its sidecars.
            StoreError: ``path`` cannot be written.
        """
        if not self.encrypted:
            raise ModeMismatchError(f"{self.path} is a plaintext file; it has no keys to export",
                                    hint="back a plaintext file up with `engramdb dump FILE -o F.aaak` "
                                         "(db.dump) or a copy of the closed file")
        target = os.path.realpath(os.fspath(path))
        if target in {self._store.path + suffix for suffix in ("", "-lock", "-maint")}:
            # O_TRUNC on the data file itself would destroy the store the key is meant to save
            raise ValidationError(f"{os.fspath(path)} is this store's own file; the key file must go elsewhere",
                                  hint="choose another path, ideally on another disk than the data")
        data = hdr.pack_key_file(self._file_header())
        try:
            fd = os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as fh:
                os.fchmod(fd, 0o600)  # O_CREAT's mode does not apply to an existing file
                fh.write(data)
                fh.flush()
                os.fsync(fd)
        except OSError as exc:
            raise StoreError(f"cannot write the key file {os.fspath(path)}: {exc.strerror}",
                             hint="choose a writable path on another disk than the data") from None

    def _require_encrypted(self) -> None:
        if not self.encrypted:
            raise ModeMismatchError("this file is plaintext; it has no keys to change")
        if self.readonly:
            raise ReadOnlyError("the file is open read-only")

    def _dek(self) -> bytes:
        dek = self._store.sealer._dek  # the facade is the sealer's only other user
        if dek is None:
            raise ModeMismatchError("this file is plaintext; it has no keys")
        return dek

    # -- maintenance ----------------------------------------------------------------------
    def compact(self) -> None:
        """Rewrite the file without free pages (atomic rename). Deleted data leaves the file:
        the index merges its tiering policy asks for run first, then the small BM25
        segments are merged and every segment still holding deleted memories is rewritten
        without them (a step per transaction, streamed: the work is that of the segments
        holding them, the memory one chunk's); record tables whose pages a rewrite would
        shrink below :data:`REPACK_BELOW_FILL` of their number (records that shrank, such as
        archived memories) are rewritten into full pages.

        Raises:
            AlreadyOpenError: another handle or process has the file open.
        """
        if not self.readonly:
            while self.merge_indexes(max_steps=1):  # one step per transaction: freed pages are reused
                pass
            while self._store.write(self.indexes.purge):
                pass
            # archived originals compress together, in groups (spec/file-format.md)
            from .maintenance.archive import pack_groups

            self._store.write(pack_groups)
            # records that shrank in place (archived, truncated) leave part-empty pages, and so
            # do rows inserted one by one; the compacting copy keeps pages as they are: refill
            # first the tables a refill would shrink below REPACK_BELOW_FILL of their pages
            for table in ("meta", "nodes", "archive"):
                self._store.write(operator.methodcaller("repack", table, below=REPACK_BELOW_FILL))
            # an older file's procedure rows under unkeyed hashes, which confirm guessed rows:
            # converted here, so the copy below leaves no such key (not even in a free page)
            with self._store.read() as txn:
                unconverted = txn.get("meta", _PROCEDURE_KEYS_KEY) is None and txn.count("procedures") > 0
            if unconverted:
                self._store.write(lambda txn: Transaction(self, txn)._convert_procedure_keys())
        self._store.compact()
        # The compacted copy restarts LMDB's transaction ids, and the index caches are
        # labelled with them: a later commit could reuse a cached label and serve stale postings.
        self.__dict__.pop("_indexes", None)

    def verify(self, fix: bool = False) -> list[Problem]:
        """Check the whole file: structure, header, every value's authentication, records,
        id map, per-table digests and counts. With ``fix=True``, rebuild what derives from
        the records (id map, indexes, digests) and report what was found before fixing.
        """
        problems = self._verify_structure()
        if problems:  # never read a damaged file through the map: a bad page can kill the process
            return problems
        with self._store.read() as txn:
            problems += verify_mod.check_contents(txn, self.indexes, self._id_key)
        if fix and problems and not self.readonly:
            self._store.write(lambda txn: verify_mod.rebuild_derived(txn, self.indexes, self._id_key))
        return problems

    def _verify_structure(self) -> list[Problem]:
        return [Problem("structure", p) for p in structural_problems(self.path)]

    def info(self) -> dict[str, Any]:
        """A summary for `engramdb info`: format, encryption, counts, sizes."""
        env = self._store.env_info()
        with self._store.read() as txn:
            counts = {t: txn.count(t) for t in TABLES}
            state = txn.state
        header = self._file_header()
        slots = [{"kind": s["kind"], "label": s.get("label", ""), "kdf": s.get("kdf")} for s in header["slots"]]
        return {
            "path": self.path, "format": header["format"], "format_version": ".".join(map(str, header["version"])),
            "created_by": header.get("created_by"), "encrypted": self.encrypted,
            "cipher": header["cipher"] if self.encrypted else None, "key_slots": slots,
            "memories": counts["nodes"], "tables": counts, "commit_seq": state.seq,
            "file_size": env["file_size"], "map_size": env["map_size"],
            "unclean_shutdown": self._store.unclean_shutdown,
        }


    def stats(self) -> dict[str, Any]:
        """What the store holds, from one read snapshot (for `engramdb stats`):

        ``memories``, ``archived``, ``pinned``; memories per ``tiers`` (all four always),
        ``flags``, ``tags`` and ``sources`` (most first; memories without a source are not
        listed); ``tables``: per table its ``entries`` and the ``bytes`` of its pages;
        ``file_size``; ``index``: the BM25 ``segments`` (with live and dead documents) and
        the vector blocks per space; ``last_maintenance``: what the last maintenance pass
        recorded (when, and what it did), or None.

        Raises:
            CorruptFileError: a record does not decode (run `engramdb verify FILE`).
        """
        from .maintenance.stats import stats

        return stats(self)

    # -- compressed memory (engramdb/ingest.py) -----------------------------------------
    def ingest(self, source: str | Iterable[Any], *, source_name: str | None = None, now: float | None = None,
               tags: Iterable[str] = (), importance: float | None = None, **compress_options: Any) -> list[str]:
        """Compress text (or a list of chat messages) into zettels and store them as memories.

        Zettels become nodes (entities, topics, quote, weight, flags, emotions, offsets,
        resolved date), tunnels become ``tunnel`` edges, and the normalized source is kept
        (sealed) for :meth:`recall_context`. Deterministic: the same input gives the same
        ids, and ingesting it again stores nothing new. Options are those of
        :func:`engramdb.compress`.

        Raises:
            ValidationError: bad input or options.
        """
        from .ingest import ingest

        return ingest(self, source, source_name=source_name, now=now, tags=list(tags), importance=importance,
                      **compress_options)

    def inject_context(self, *, source: str | None = None, tags: Iterable[str] | None = None,
                       include_archived: bool = False, **options: Any) -> str:
        """The stored memories that matter most, rendered for a model within a hard token
        budget (options as :func:`engramdb.inject_context`: ``max_zettels``, ``selection``,
        ``guarantee_flags``, ``min_weight``, ``flags``, ``format``, ``max_token_budget``,
        ``count_tokens``). ``source`` and ``tags`` restrict which memories are considered;
        archived memories are left out unless ``include_archived=True``.

        Raises:
            ValidationError: bad options.
        """
        from .compress import inject_context
        from .ingest import stored_result

        return inject_context(stored_result(self, source=source, tags=tags, include_archived=include_archived),
                              **options)

    def wake_up(self, *, top_pct: float = 0.15, source: str | None = None, tags: Iterable[str] | None = None,
                include_archived: bool = False) -> str:
        """A short narrative of the most important stored moments (see :func:`engramdb.wake_up`);
        archived memories are left out unless ``include_archived=True``."""
        from .compress import wake_up
        from .ingest import stored_result

        return wake_up(stored_result(self, source=source, tags=tags, include_archived=include_archived),
                       top_pct=top_pct)

    def dump(self, fp: TextIO | BinaryIO, *, progress: Callable[[int], None] | None = None,
             on_damaged: Callable[[str], None] | None = None) -> int:
        """Write the whole store to ``fp`` as canonical AAAK v3 text (see :func:`engramdb.restore`).

        One read snapshot; the same content always gives the same bytes. Returns the record
        count. ``progress(n)`` is called as memories are written. To salvage a damaged file,
        pass ``on_damaged`` (called with a line per damaged value, which is left out) and
        restore the dump into a new file.

        Raises:
            DecryptionError, CorruptFileError: a damaged value, unless ``on_damaged`` is given.
        """
        from .backup import dump

        return dump(self, fp, progress=progress, on_damaged=on_damaged)

    def dump_v2(self, fp: TextIO | BinaryIO) -> bool:
        """Write the store's zettel view (memories, tunnels, entity table) as AAAK v2, the
        format zettel-compress reads (spec/aaak.md section 6.1 lists what v2 cannot carry).

        Returns:
            True when memory ids were renumbered (v2 ids must be decimal digits).

        Raises:
            DecryptionError, CorruptFileError: a damaged value.
        """
        from .backup import dump_v2

        return dump_v2(self, fp)

    def entity_table(self) -> dict[str, str]:
        """The entity table imported with AAAK files (``E:`` lines): code -> name.

        Raises:
            DecryptionError, CorruptFileError: the file is damaged.
        """
        from .backup import entity_table

        return entity_table(self)


def import_key(path: str | os.PathLike[str], keyfile: str | os.PathLike[str], *, passphrase: str | bytes | None = None,
               key: bytes | str | None = None, allow_unsafe_fs: bool = False, force: bool = False) -> None:
    """Put an exported header back into a file whose header is damaged.

    The key file must unlock with ``passphrase`` (or ``key``) and its data key must open
    the file's sealed state record; otherwise nothing is written. A file whose header is
    intact but holds other key slots than the key file (the passphrase was changed or a
    recovery key added since the export) is left alone unless ``force=True``: the
    exported header would replace its keys, so the current passphrase and recovery key
    would stop opening it. ``allow_unsafe_fs``: as :func:`open`'s.

    Raises:
        ForeignFileError: ``keyfile`` is not an engramdb key file.
        WrongPassphraseError: the passphrase does not unlock the key file.
        DecryptionError: the key file belongs to another store.
        ValidationError: the file's header is intact and differs from the key file's
            (without ``force``).
        ModeMismatchError: the file is a plaintext file (it has no keys).
    """
    try:
        with builtins.open(keyfile, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise FileMissingError(f"cannot read the key file {os.fspath(keyfile)}: {exc.strerror}",
                               hint="pass the file written by export_key() / `engramdb export-key`") from None
    header = hdr.unpack_key_file(data, keyfile)
    dek = hdr.unlock(header, passphrase=passphrase, raw_key=hdr.parse_raw_key(key) if key is not None else None)
    store = Store.open(path, create=False, allow_unsafe_fs=allow_unsafe_fs)
    try:
        with store.read() as txn:
            try:
                current: dict[str, Any] | None = hdr.read_header(txn, store.path)[0]
            except CorruptFileError:  # damaged, missing or unreadable: what import_key is for
                current = None
        if current is not None and current.get("format") == hdr.FORMAT_NAME and not current.get("encrypted"):
            raise ModeMismatchError(f"{store.path} is a plaintext file; it has no key header to import",
                                    hint="import the key file into the encrypted store it was exported from")
        # intact: it reads, is of the same store as the key file, and its slots are well formed
        intact = current is not None and hdr.usable(current) \
            and all(current.get(k) == header.get(k) for k in hdr.SLOT_BOUND_FIELDS)
        if intact and current != header and not force:
            raise ValidationError(f"the header of {store.path} is intact and holds other keys than "
                                  f"{os.fspath(keyfile)} (its passphrase or recovery key changed since the export, "
                                  "or the key file is of another copy); nothing was changed",
                                  hint="open the file with its current passphrase or recovery key; to put the "
                                       "exported header back anyway (its passphrase opens the file again, keys "
                                       "added since stop working), pass --force (import_key(..., force=True))")
        store.sealer = crypto.Sealer(dek)
        with store.read() as txn:
            try:
                txn.state  # noqa: B018
            except DecryptionError:
                raise DecryptionError("this key file belongs to another store", hint="use that store's key file") \
                    from None
        store.write(lambda txn: hdr.write_header(txn, header))
    finally:
        store.close()


class Transaction:
    """Record operations inside one write (or read) transaction; see :meth:`Engram.transaction`."""

    def __init__(self, engram: Engram, txn: Txn) -> None:
        self._engram = engram
        self._txn = txn
        self._index_batch: IndexBatch | None = None  # set by Engram._batched (add_many)

    def _index(self, *, added: Sequence[tuple[int, Node]] = (), removed: Sequence[tuple[int, Indexed]] = ()) -> None:
        if removed:  # maintenance hook: the change log an incremental pass starts from
            from .maintenance.run import log_changes

            log_changes(self._txn, [docno for docno, _ in removed])
        # Index changes go to the batch when one is open (add_many, a transaction this write
        # joins: applied straight in, they would index an old vector the batch then re-adds), else straight in.
        batch = self._index_batch or self._engram.indexes.open_batch(self._txn)
        if batch is None:
            self._engram.indexes.apply(self._txn, list(added), list(removed))
            return
        for docno, node in removed:
            batch.remove(docno, node)
        batch.add_many(added)

    def _docno(self, id: str) -> int | None:
        raw = self._txn.get("ids", self._engram._id_key(id))
        return None if raw is None else codec.from_u64(raw)

    def _load(self, docno: int) -> Node:
        raw = self._txn.get("nodes", codec.u64(docno))
        if raw is None:
            raise _missing_record()
        return self._engram.indexes.read_node(self._txn, docno, raw)

    def link(self, src: str, dst: str, kind: str = "related", *, weight: float = 1.0, label: str = "",
             valid_from: float | None = None, valid_to: float | None = None, now: float | None = None) -> None:
        """As :meth:`Engram.link`, inside this transaction."""
        edge = Edge(src=src, dst=dst, kind=kind, weight=weight, label=label, created_at=now_ts(now),
                    valid_from=valid_from, valid_to=valid_to)
        a, b = self._docno(src), self._docno(dst)
        if a is None or b is None:
            raise NotFoundError(f"no memory with id {shown(src if a is None else dst)}")
        self._engram.indexes.graph.link(self._txn, a, b, edge)

    def find(self, id: str) -> Node | None:
        """The node, or None.

        Raises:
            CorruptFileError: the id map points at a record of another memory.
        """
        docno = self._docno(id)
        if docno is None:
            return None
        node = self._load(docno)
        if node.id != id:
            raise CorruptFileError(f"the id map points {id[:60]!r} at the record of another memory",
                                   hint="run `engramdb verify --fix FILE` to rebuild the id map")
        return node

    def get(self, id: str) -> Node:
        """The node.

        Raises:
            NotFoundError: no such id.
        """
        node = self.find(id)
        if node is None:
            raise NotFoundError(f"no memory with id {shown(id)}")
        return node

    def put_new(self, node: Node) -> str:
        """Store ``node`` (a new id) as it is.

        Raises:
            DuplicateIdError: its id exists.
            ValidationError: it holds what the write API refuses (a blank tag, the reserved
                archive entry: :func:`~engramdb.records.check_written`).
        """
        check_written(node)  # public before session 9 without it: a stub claiming an original
        return self._put_new(node)

    def _put_new(self, node: Node) -> str:
        """:meth:`put_new` unchecked: for nodes engramdb built and checked (or a dump's records)."""
        id_key = self._engram._id_key(node.id)
        if self._txn.get("ids", id_key) is not None:
            raise DuplicateIdError(f"a memory with id {shown(node.id)} exists")
        docno = self._txn.allocate_docno()
        # inserts that never overwrite: a stored record under a new docno means the counters are behind
        self._txn.insert_many("nodes", [(codec.u64(docno), codec.encode_node(node))], append=True)
        self._txn.insert_many("ids", [(id_key, codec.u64(docno))])
        self._index(added=[(docno, node)])  # index hook
        return node.id

    def _put_unstored(self, nodes: list[Node]) -> int:
        """:meth:`put_new_many` of those of ``nodes`` whose id is neither stored already
        nor an earlier one's (the others are skipped); returns how many it put."""
        id_keys = self._engram._id_keys(list(map(_id_of, nodes)))
        first: dict[bytes, int] = {}
        for i, id_key in enumerate(id_keys):
            first.setdefault(id_key, i)
        txn = self._txn
        stored = txn.stored_keys("ids", first) if txn.count("ids") else set()
        fresh = [i for key, i in first.items() if key not in stored]
        self._put_checked([nodes[i] for i in fresh], [id_keys[i] for i in fresh])
        return len(fresh)

    def _end_chunk(self) -> None:
        """Index what the open batch holds now (a bulk ingest's chunk: one BM25 segment), so
        the chunk's nodes can go."""
        if self._index_batch is not None:
            self._index_batch.flush()

    def put_new_many(self, nodes: list[Node]) -> list[str]:
        """:meth:`put_new` for many nodes; every id is checked before anything is written.

        Raises:
            DuplicateIdError: an id exists already or repeats in ``nodes``.
            ValidationError: a node holds what the write API refuses (as :meth:`put_new`).
        """
        for node in nodes:
            check_written(node)
        return self._put_new_many(nodes)

    def _put_new_many(self, nodes: list[Node]) -> list[str]:
        """:meth:`put_new_many` unchecked: for nodes ``bulk`` built and checked, or a dump's records."""
        ids = list(map(_id_of, nodes))
        id_keys = self._engram._id_keys(ids)
        # The usual case: distinct ids, none stored, checked by the ids insert itself (one
        # pass over the B-tree). Otherwise nothing is written: find the first offender one
        # by one, for its message.
        if len(set(id_keys)) == len(id_keys) and self._put_fresh(nodes, id_keys):
            return ids
        txn = self._txn
        seen: set[bytes] = set()
        for node, id_key in zip(nodes, id_keys):
            if id_key in seen:  # nothing is stored yet: the hint to update would mislead
                raise DuplicateIdError(f"the id {shown(node.id)} repeats within one add_many",
                                       hint="give each memory of the batch its own id (nothing was written)")
            if txn.contains("ids", id_key):
                raise DuplicateIdError(f"a memory with id {shown(node.id)} exists")
            seen.add(id_key)
        raise StoreError("an id was found stored, and then not", hint="this is a bug in engramdb, please report it")

    def _put_checked(self, nodes: list[Node], id_keys: list[bytes]) -> None:
        """Write new ``nodes`` whose ids (blind keys ``id_keys``) are checked: distinct and
        not stored."""
        if not self._put_fresh(nodes, id_keys):
            raise CorruptFileError("an id checked as new is stored after all",
                                   hint="run `engramdb verify FILE`; restore from a dump or backup if it fails")

    def _put_fresh(self, nodes: list[Node], id_keys: list[bytes]) -> bool:
        """Write new ``nodes`` whose ids (blind keys ``id_keys``) are distinct; returns
        False, having written nothing, when one of the ids is stored already."""
        txn = self._txn
        docnos = txn.allocate_docnos(len(nodes))
        # The ids first: their insert is also the check that none is stored (key order fills
        # LMDB pages and visits each once).
        if txn.insert_new("ids", codec.sorted_id_rows(id_keys, docnos)):
            txn.release_docnos(docnos)
            return False
        keys = list(map(codec.u64, docnos))
        # new keys: fresh docnos, and ids checked above. Records are encoded a chunk at a time
        # (insert_many's), so a large batch's encoded records never all sit in memory at once.
        # Fresh docnos sort after every record, so they are appended: LMDB fills each page
        # (a plain insert at the end splits the last page in two, leaving pages ~5/6 full
        # with ~430-byte records).
        for start in range(0, len(nodes), 1024):
            txn.insert_many("nodes", list(zip(keys[start:start + 1024], codec.encode_nodes(nodes[start:start + 1024]))),
                            append=True)
        self._index(added=list(zip(docnos, nodes)))  # index hook
        return True

    def add(self, item: Node | str | Mapping[str, Any] = "", /, *, now: float | None = None, **fields: Any) -> str:
        """As :meth:`Engram.add`, inside this transaction."""
        return self._put_new(bulk.build(item, fields, now))

    def update(self, id: str, /, **changes: Any) -> Node:
        """As :meth:`Engram.update`, inside this transaction."""
        return self._update(id, changes, True)

    def _update_stub(self, id: str, /, **changes: Any) -> Node:
        """:meth:`update` that may set the reserved archive entry: for engramdb's archive
        writing a stub only (private: the entry set by hand claims an original that does not
        exist, which the write API refuses; a public ``update_stub`` let any caller do it
        before session 9)."""
        return self._update(id, changes, False)

    def _update(self, id: str, changes: dict[str, Any], checked: bool) -> Node:
        if "id" in changes and changes["id"] != id:
            raise ValidationError("a memory's id cannot change", hint="add a new memory and delete the old one")
        docno = self._docno(id)
        if docno is None:
            raise NotFoundError(f"no memory with id {shown(id)}")
        old = self._load(docno)
        unknown = set(changes) - _NODE_FIELDS
        if unknown:
            raise ValidationError(f"unknown memory fields: {', '.join(sorted(unknown))}")
        new = old.replace(**changes)
        if checked and ("tags" in changes or "metadata" in changes):
            check_written(new, old)
        if old.archived and "metadata" in changes:  # new metadata keeps the memory archived
            from .maintenance.archive import keep_entry

            new = keep_entry(self._txn, docno, old, new)
        if old.archived and new.archived and new.content != old.content:
            # the archive row holds the full text of the preview: a new text would be lost on unarchive
            from .maintenance.archive import info

            if (info(old) or {}).get("truncated"):  # unarchive refuses it: do not send the user there
                raise ValidationError(f"memory {id!r} was archived with truncation; its content is what is left",
                                      hint="add the new text as a new memory (and delete this one)")
            raise ValidationError(f"memory {id!r} is archived; its content is a preview",
                                  hint="unarchive it first, then change its content")
        self._txn.put("nodes", codec.u64(docno), codec.encode_node(new))
        self._index(removed=[(docno, old)], added=[(docno, new)])  # index hook
        return new

    def delete(self, id: str, /, *, missing_ok: bool = False) -> bool:
        """As :meth:`Engram.delete`, inside this transaction."""
        id_key = self._engram._id_key(id)
        raw = self._txn.get("ids", id_key)
        if raw is None:
            if missing_ok:
                return False
            raise NotFoundError(f"no memory with id {shown(id)}")
        docno = codec.from_u64(raw)
        record = self._txn.pop("nodes", codec.u64(docno))
        if record is None:
            raise _missing_record()
        old = self._engram.indexes.read_removed(record)  # the indexes need only its vector spaces
        self._txn.delete("ids", id_key)
        from .maintenance.archive import drop_original

        drop_original(self._txn, docno)  # its archive row, or its place in a group
        self._index(removed=[(docno, old)])  # index hook
        return True

    def delete_many(self, ids: Iterable[str], /, *, missing_ok: bool = False) -> int:
        """As :meth:`Engram.delete_many`, inside this transaction. Every id is looked up
        before anything is deleted."""
        ids = list(dict.fromkeys(ids))
        txn = self._txn
        # Every table is read and written in key order: pages are visited once, in order.
        by_key = sorted(zip(self._engram._id_keys(ids), ids))
        docnos = [txn.get("ids", id_key) for id_key, _ in by_key]
        if not missing_ok and None in docnos:
            missing = {id_ for (_, id_), raw in zip(by_key, docnos) if raw is None}
            raise NotFoundError(f"no memory with id {shown(next(i for i in ids if i in missing))}")
        found = sorted((codec.from_u64(raw), id_key) for (id_key, _), raw in zip(by_key, docnos) if raw is not None)
        if not found:
            return 0
        keys = [codec.u64(docno) for docno, _ in found]
        indexes = self._engram.indexes
        removed: list[tuple[int, Indexed]]
        if indexes.removal_reads_records(txn):  # the indexes need the records' vector spaces
            olds = txn.pop_many("nodes", keys)
            if None in olds:
                raise _missing_record()
            removed = [(docno, indexes.read_removed(old)) for (docno, _), old in zip(found, olds) if old is not None]
        else:  # nothing to read: the records are removed unopened
            from .index import NO_VECTORS

            if txn.delete_many("nodes", keys) != len(keys):
                raise _missing_record()
            removed = [(docno, NO_VECTORS) for docno, _ in found]
        txn.delete_many("ids", sorted(id_key for _, id_key in found))
        from .maintenance.archive import drop_originals

        drop_originals(txn, [docno for docno, _ in found])  # their archive rows, or places in groups
        self._index(removed=removed)  # index hook
        return len(found)

    def procedure_rows(self) -> list[dict[str, Any]]:
        """Every procedural-graph row (spec/agent.md), in the order of their msgpack bytes (the
        same in every store: keys are blind, so their order differs from store to store)."""
        return [codec.unpack(value, any_keys=True) for value in sorted(v for _, v in self._txn.items("procedures"))]

    def procedure_keys(self) -> list[bytes]:
        """The keys of every procedural-graph row, in key order, read without decrypting a row.
        A key is a hash of its row's content (:meth:`put_procedure_row`), so a key seen before
        always holds the row it held then: a caller can keep the rows it parsed by key."""
        return list(self._txn.keys("procedures"))

    def procedure_row(self, key: bytes) -> dict[str, Any] | None:
        """The procedural-graph row stored under ``key`` (from :meth:`procedure_keys`), or None.

        Raises:
            ValidationError: ``key`` is not bytes.
        """
        if not isinstance(key, bytes):
            raise ValidationError(f"a procedure row's key is bytes, got a {type(key).__name__}",
                                  hint="pass a key procedure_keys() returned")
        if len(key) != _PROCEDURE_KEY_BYTES:  # no row has such a key (and LMDB refuses an empty one)
            return None
        value = self._txn.get("procedures", key)
        return None if value is None else codec.unpack(value, any_keys=True)

    def put_procedure_row(self, row: Mapping[str, Any]) -> None:
        """Store one procedural-graph row (a map of msgpack-able values; keys sorted, so the
        same row always has the same key: a keyed hash of its msgpack, spec/file-format.md).

        Raises:
            ValidationError: the row is not a map, or holds a value msgpack cannot store.
        """
        canonical = _canonical_row(row)
        data = codec.pack(canonical)
        self._txn.put("procedures", self._procedure_key(data), data)

    def delete_procedure_row(self, row: Mapping[str, Any]) -> bool:
        """Delete a row as :meth:`procedure_rows` returned it; False when it is not stored."""
        return self._txn.delete("procedures", self._procedure_key(codec.pack(_canonical_row(row))))

    def _procedure_key(self, packed: bytes) -> bytes:
        """A row's key: its blind index (HMAC with the store's blind key), so the key of a
        guessable row (a tool's name) tells nothing without the passphrase. Files written
        before 2026-12-02 keyed rows by an unkeyed SHA-256, which confirmed such guesses; the
        first procedure write converts them, in its transaction (:meth:`Engram.compact` too)."""
        if self._txn.get("meta", _PROCEDURE_KEYS_KEY) is None:
            self._convert_procedure_keys()
        return self._txn.store.blind(b"procedure", packed)

    def _convert_procedure_keys(self) -> None:
        """Key the rows of an older file by their blind index, and note it (idempotent)."""
        for key, value in list(self._txn.items("procedures")):
            self._txn.delete("procedures", key)
            self._txn.put("procedures", self._txn.store.blind(b"procedure", value), value)
        self._txn.put("meta", _PROCEDURE_KEYS_KEY, b"\x01")
        format_features.add(self._txn, {format_features.PROCEDURE_KEYS})

    def archived(self, id: str) -> str | None:
        """The archived original of a memory, or None."""
        from .maintenance.archive import read_original

        docno = self._docno(id)
        return None if docno is None else read_original(self._txn, docno)

    def set_archived(self, id: str, original: str) -> None:
        """Keep ``original`` (zstd-compressed, sealed) as the archived full text of memory ``id``
        (restore's primitive; :meth:`archive` is the way to archive a memory).

        Raises:
            NotFoundError: no such id.
            ValidationError: ``original`` is not a string; or the memory is an archived stub
                that has its full text already (replacing it would lose that text), or was
                archived with truncation (it has no full text, and a row would damage the file).
        """
        node = self.find(id)
        if node is None:
            raise NotFoundError(f"no memory with id {shown(id)}")
        if not isinstance(original, str):
            raise ValidationError("an archived original must be a string")
        from .maintenance.archive import has_original, info

        entry = info(node)
        if entry is not None and entry.get("truncated"):
            raise ValidationError(f"memory {shown(id)} was archived with truncation; it cannot hold an archived text",
                                  hint="delete it and add the full text as a new memory")
        docno = self._docno(id)
        assert docno is not None  # find() just read it in this transaction
        if entry is not None and has_original(self._txn, docno):
            raise ValidationError(f"memory {shown(id)} is archived; set_archived would replace its full text",
                                  hint="unarchive it first (Engram.unarchive), then update or archive it again")
        self._set_archived(id, original)

    def _set_archived(self, id: str, original: str) -> None:
        """:meth:`set_archived` without the guard (archive() writes the row before the stub)."""
        docno = self._docno(id)
        if docno is None:
            raise NotFoundError(f"no memory with id {shown(id)}")
        from .maintenance.archive import write_original

        write_original(self._txn, docno, original)

    def drop_archived(self, id: str) -> bool:
        """Remove the archive row of memory ``id`` when it is not an archived stub's full text
        (a row written by :meth:`set_archived` alone); False when it had none.

        Raises:
            ValidationError: the memory is archived (its row is its only full text): unarchive
                or delete it instead.
        """
        from .maintenance.archive import info

        node = self.find(id)
        entry = None if node is None else info(node)
        if entry is not None and not entry.get("truncated"):
            raise ValidationError(f"memory {shown(id)} is archived; its archive row is its only full text",
                                  hint="unarchive it (Engram.unarchive) to get the text back, or delete the memory")
        return self._drop_archived(id)

    def _drop_archived(self, id: str) -> bool:
        """:meth:`drop_archived` without the guard (unarchive drops the row, then writes the original back)."""
        from .maintenance.archive import drop_original

        docno = self._docno(id)
        return docno is not None and drop_original(self._txn, docno)

    def archive(self, id: str, /, *, truncate: bool = False, now: float | None = None) -> int:
        """As :meth:`Engram.archive`, inside this transaction."""
        from .maintenance import archive

        return archive.archive(self, id, truncate=truncate, now=now)

    def unarchive(self, id: str, /) -> Node:
        """As :meth:`Engram.unarchive`, inside this transaction."""
        from .maintenance import archive

        return archive.unarchive(self, id)

    def full(self, id: str, /) -> Node:
        """As ``Engram.get(id, full=True)``, inside this transaction."""
        from .maintenance import archive

        return archive.full(self, id)


def _missing_record() -> CorruptFileError:
    return CorruptFileError("the id map points at a missing record",
                            hint="run `engramdb verify --fix FILE` to rebuild the id map")


def _canonical_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A procedure row with its map keys sorted at every level (string keys), so that its
    msgpack, and with it its key, does not depend on insertion order."""
    if not isinstance(row, Mapping):
        raise ValidationError(f"a procedure row must be a map, got {type(row).__name__}")

    def canon(value: Any) -> Any:
        if isinstance(value, Mapping):
            items = list(value.items())
            if all(isinstance(k, str) for k, _ in items):
                items.sort(key=_first)
            return {k: canon(v) for k, v in items}
        if isinstance(value, (list, tuple)):
            return [canon(v) for v in value]
        return value

    canonical: dict[str, Any] = canon(row)
    return canonical


_PROCEDURE_KEY_BYTES = 16
# set once the procedure rows are keyed by their blind index (Transaction._procedure_key)
_PROCEDURE_KEYS_KEY = b"procedures.blind"
