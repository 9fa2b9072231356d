"""The derived indexes of one file: BM25 segments, vector blocks and the edge graph.

:class:`Indexes` is what the :class:`~engramdb.engram.Engram` facade holds per handle. It
is called *inside* the facade's write transactions, so a memory and its index entries
commit or roll back together::

    indexes.apply(txn, added=[(docno, node)], removed=[(docno, old_node)])

Everything here derives from the node records (plus user edges), so
:meth:`Indexes.rebuild` can always recreate it and :meth:`Indexes.verify` can check it.
"""
from __future__ import annotations

import operator
import struct
import weakref
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol
from collections.abc import Collection, Iterator, Mapping, Sequence

import msgpack
import numpy as np

from ..codec import decode_node, encode_node, record_spaces
from ..errors import ConfigMismatchError, CorruptFileError, EngramError
from ..records import Node
from .bm25 import SegmentedBM25, TermDocs
from .graph import Graph, NodeIds
from .nodecache import NodeCache
from .synonyms import Expander
from .tokenize import Tokenizer
from .vectors import EmbeddingSpace, VectorIndex

if TYPE_CHECKING:  # annotations only
    from ..store import Store, Txn

__all__ = [
    "TOKENIZER_KEY",
    "IndexBatch",
    "Indexed",
    "Indexes",
    "NO_VECTORS",
    "Removed",
    "init_meta",
    "iter_nodes",
    "load_tokenizer",
    "node_text",
]

TOKENIZER_KEY = b"index.tokenizer"
_U64 = struct.Struct(">Q")
_docno_of = operator.itemgetter(0)


class Indexed(Protocol):
    """What the indexes read of a memory's old version when it is removed: the names of
    the vector spaces it has a vector in (a :class:`~engramdb.records.Node` is one)."""

    @property
    def embeddings(self) -> Collection[str]: ...


@dataclass(frozen=True, slots=True)
class Removed:
    """A deleted memory as the indexes see it (:meth:`Indexes.read_removed`)."""

    embeddings: tuple[str, ...]


NO_VECTORS = Removed(())  # a deleted memory when no space needs its record (removal_reads_records)


def node_text(node: Node) -> str:
    """The text a node is indexed by: content, quote (when not inside the content),
    entities and topics."""
    if not (node.quote or node.entities or node.topics):  # the usual memory: its content alone
        return node.content
    parts = [node.content]
    if node.quote and node.quote not in node.content:
        parts.append(node.quote)
    parts.extend(node.entities)
    parts.extend(node.topics)
    return "\n".join(p for p in parts if p)


def init_meta(txn: Txn, tokenizer: Tokenizer | None = None) -> Tokenizer:
    """Record the tokenizer in a new file's meta (call once, at creation).

    Returns:
        The tokenizer recorded (``Tokenizer()`` when none is given).

    Raises:
        ConfigMismatchError: the file already records a different tokenizer.
    """
    tokenizer = tokenizer or Tokenizer()
    existing = txn.get("meta", TOKENIZER_KEY)
    if existing is not None:
        return load_tokenizer(txn, tokenizer)
    txn.put("meta", TOKENIZER_KEY, msgpack.packb(tokenizer.settings(), use_bin_type=True))
    return tokenizer


def load_tokenizer(txn: Txn, expected: Tokenizer | Mapping[str, Any] | None = None) -> Tokenizer:
    """The tokenizer a file was created with (checked against ``expected`` when given: a
    requested tokenizer (:meth:`Tokenizer.accepts`) or exact settings).

    Raises:
        ConfigMismatchError: no or unsupported settings, a mismatch with ``expected``, or
            stemming without PyStemmer installed.
    """
    data = txn.get("meta", TOKENIZER_KEY)
    if data is None:
        raise ConfigMismatchError("the file records no tokenizer settings",
                                  hint="the file was not created by engramdb.open(); run `engramdb verify FILE`")
    try:
        settings = msgpack.unpackb(data, raw=False)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise CorruptFileError("the tokenizer settings in meta do not decode") from exc
    if isinstance(expected, Tokenizer):
        if not expected.accepts(settings):
            raise ConfigMismatchError(f"the file was created with tokenizer {settings!r}, not {expected.settings()!r}",
                                      hint="a file keeps its tokenizer for life: open it without tokenizer=")
    elif expected is not None and dict(expected) != settings:
        raise ConfigMismatchError(f"the file was created with tokenizer {settings!r}, not {dict(expected)!r}")
    return Tokenizer.from_settings(settings)


def iter_nodes(txn: Txn) -> Iterator[tuple[int, Node]]:
    """Every (docno, node) of the ``nodes`` table, in docno order.

    Raises:
        CorruptFileError: a record does not decode.
    """
    for key, value in txn.items("nodes"):
        if len(key) != 8:
            raise CorruptFileError("a node key is not an 8-byte docno")
        yield _U64.unpack(key)[0], decode_node(value)


class _Embedded(NamedTuple):
    """A record's embeddings alone, which is what the vector check reads of it."""

    embeddings: Mapping[str, Any]


class Indexes:
    """BM25, vectors and the graph of one open store.

    Args:
        store: the :class:`~engramdb.store.Store` (for ``blind`` and ``last_txnid``).
        tokenizer: the file's tokenizer (:func:`load_tokenizer`).
    """

    def __init__(self, store: Store, tokenizer: Tokenizer, *, cache_mb: float | None = None) -> None:
        self.store = store
        self.tokenizer = tokenizer
        self.cache_mb = cache_mb  # each cache's limit in MiB (None: each cache's default)
        self.bm25 = SegmentedBM25(store.blind, store.last_txnid, cache_mb=cache_mb, blind_many=store.blind_many)
        self.vectors = VectorIndex(store.blind, store.last_txnid, tokenizer, cache_mb=cache_mb)
        self.graph = Graph()
        self._node_cache: NodeCache | None = None
        self._recall_expander: Expander | None = None  # recall's query expander, kept per handle
        # the batch of each open write transaction: its reads take the vectors it wrote from there
        # (they reach the blocks at its end), and every write of the handle joins it
        self._batches: weakref.WeakKeyDictionary[Txn, IndexBatch] = weakref.WeakKeyDictionary()

    @property
    def node_cache(self) -> NodeCache:
        """Decoded nodes and edge lists kept across commits (:mod:`engramdb.index.nodecache`),
        limited by this handle's ``cache_mb``."""
        cache = self._node_cache
        if cache is None:
            cache = self._node_cache = NodeCache(self.store, self.graph, self.cache_mb)
        return cache

    @classmethod
    def open(cls, store: Store, tokenizer: Tokenizer | None = None, *, cache_mb: float | None = None) -> Indexes:
        """The indexes of a file, with the tokenizer recorded in its meta; ``cache_mb``
        limits each decoded-data cache (see :func:`engramdb.open`).

        A file that records no tokenizer yet (new, or never written) gets ``tokenizer``
        (default ``Tokenizer()``); its settings are recorded by the first :meth:`apply`.

        Raises:
            ConfigMismatchError: see :func:`load_tokenizer`.
        """
        with store.read() as txn:
            if txn.get("meta", TOKENIZER_KEY) is not None:
                return cls(store, load_tokenizer(txn, tokenizer), cache_mb=cache_mb)
        return cls(store, tokenizer or Tokenizer(), cache_mb=cache_mb)

    def ensure_meta(self, txn: Txn) -> None:
        """Record this handle's tokenizer in meta if the file has none; refuse a different one.

        Raises:
            ConfigMismatchError: the file records another tokenizer.
        """
        data = txn.get("meta", TOKENIZER_KEY)
        if data is None:
            init_meta(txn, self.tokenizer)
            return
        try:
            recorded = msgpack.unpackb(data, raw=False)
        except Exception as exc:  # msgpack raises several unrelated types on bad input
            raise CorruptFileError("the tokenizer settings in meta do not decode") from exc
        if recorded != self.tokenizer.settings():
            raise ConfigMismatchError("another process recorded a different tokenizer for this file",
                                      hint="open the file again")

    def read_node(self, txn: Txn, docno: int, data: bytes) -> Node:
        """Decode the record of ``docno`` with its vectors (read from the vector blocks).

        Raises:
            CorruptFileError: the record does not decode, or a vector it names is missing.
        """
        batch = self._batches.get(txn) if txn.write else None
        pending = batch.pending(docno) if batch is not None else None
        if pending is not None:  # written in this transaction: its vectors are not in the blocks yet
            return decode_node(data, fetch=lambda names: {name: pending.embeddings[name] for name in names})
        return decode_node(data, fetch=lambda names: self.vectors.fetch(txn, docno, names))

    def removal_reads_records(self, txn: Txn) -> bool:
        """Whether removing memories needs their records (:meth:`read_removed`): only a
        vector space that is not ``auto`` holds rows for some memories and not others."""
        return any(not space.auto for space in self.vectors.spaces(txn).values())

    def read_removed(self, data: bytes) -> Removed:
        """What the indexes need of a memory being deleted, from its record ``data``: the
        names of its vector spaces (no decoding of the rest, no vector read).

        Raises:
            CorruptFileError: the record does not decode.
        """
        return Removed(record_spaces(data))

    def batch(self, txn: Txn) -> IndexBatch:
        """A buffer of changes for one transaction, flushed by :meth:`IndexBatch.flush` as
        one :meth:`apply` call (one segment however many memories the transaction adds). A
        transaction has one until :meth:`close_batch`: asked again, the same."""
        batch = self._batches.get(txn)
        if batch is None:
            batch = self._batches[txn] = IndexBatch(self, txn)
        return batch

    def open_batch(self, txn: Txn) -> IndexBatch | None:
        """The batch of the write transaction ``txn``, when it has one."""
        return self._batches.get(txn)

    def close_batch(self, txn: Txn) -> None:
        """Forget the batch of ``txn`` (flushed, or its transaction aborted): it holds the
        transaction, so the weak mapping alone would keep both."""
        self._batches.pop(txn, None)

    def terms(self, node: Node) -> list[str]:
        """The index terms of a node."""
        return self.tokenizer(node_text(node))

    def term_docs(self, docnos: Sequence[int], texts: Sequence[str]) -> TermDocs:
        """Tokenize ``texts`` (of documents ``docnos``) in one batch, for the BM25 index."""
        return TermDocs(docnos, *self.tokenizer.encode_many(texts))

    def apply(self, txn: Txn, added: Sequence[tuple[int, Node]], removed: Sequence[tuple[int, Indexed]]) -> None:
        """Index one write transaction's changes (an update is in both lists, same docno).

        Creates at most one BM25 segment and one vector block per space, then runs at most
        one small merge step.

        Raises:
            EmbeddingError: a node's embedding does not fit its space.
            ValidationError: the same docno is added twice.
            CorruptFileError: the index records are damaged.
        """
        self.ensure_meta(txn)
        added = sorted(added, key=_docno_of)
        removed = sorted({docno: node for docno, node in removed}.items())
        removed_docnos = [docno for docno, _ in removed]
        texts = [node_text(node) for _, node in added]
        self.vectors.apply(txn, added, texts, removed)
        self.bm25.apply(txn, self.term_docs([docno for docno, _ in added], texts), removed_docnos)
        if removed_docnos and txn.count("edges"):  # a file without edges skips the scans
            re_added = {docno for docno, _ in added}
            for docno in removed_docnos:
                if docno not in re_added:
                    self.graph.remove_node(txn, docno)

    def add_space(self, txn: Txn, space: EmbeddingSpace) -> None:
        """Record an embedding space; an ``auto`` space also embeds the existing nodes.

        Raises:
            ConfigMismatchError: a space of that name exists with other settings.
        """
        before = self.vectors.spaces(txn)
        self.vectors.add_space(txn, space)
        if space.name not in before and space.auto:
            self._rebuild_vectors(txn, list(iter_nodes(txn)))

    def _rebuild_vectors(self, txn: Txn, nodes: list[tuple[int, Node]], texts: list[str] | None = None) -> None:
        """Rewrite the vector blocks, and the records whose vectors move to them (first
        layout) or are missing (spec/vectors.md)."""
        rewrite = self.vectors.rebuild(txn, nodes, texts if texts is not None else [node_text(n) for _, n in nodes])
        if rewrite:
            txn.put_many("nodes", [(_U64.pack(docno), encode_node(node)) for docno, node in rewrite])

    def needs_migration(self, txn: Txn) -> bool:
        """Whether an index is in an older layout that a writable open converts
        (:meth:`migrate`).

        Raises:
            CorruptFileError: a vector directory or the space settings are damaged.
        """
        return self.vectors.needs_migration(txn) or self.bm25.needs_migration(txn)

    def migrate(self, txn: Txn) -> bool:
        """Convert the indexes of older layouts, in this transaction; returns whether
        anything changed. A writable open calls it. Vectors of the first layout (in the
        node records and in tombstoned blocks) move to one copy in docno-range blocks
        (spec/vectors.md, "Layouts"); BM25 postings keyed term first are keyed segment
        first (spec/bm25.md, "postings").

        Raises:
            CorruptFileError: a record or directory does not decode.
            EmbeddingError: a record's vector does not fit its space.
        """
        done = self.bm25.migrate(txn)
        if self.vectors.needs_migration(txn):
            self._rebuild_vectors(txn, list(iter_nodes(txn)))
            done = True
        return done

    def link_tunnels(self, txn: Txn, *, now: float = 0.0) -> int:
        """Recompute the derived tunnel edges over all nodes; returns their number."""
        return self.graph.link_tunnels(txn, list(iter_nodes(txn)), now=now)

    def rebuild(self, txn: Txn, *, now: float = 0.0) -> None:
        """Drop and rebuild every derived structure from the node records.

        User edges are kept (dangling ones dropped); tunnel edges are recomputed.

        Raises:
            CorruptFileError: a node record does not decode.
            EmbeddingError: a node's embedding does not fit its space.
        """
        nodes = list(iter_nodes(txn))
        texts = [node_text(n) for _, n in nodes]
        self.bm25.rebuild(txn, self.term_docs([docno for docno, _ in nodes], texts))
        self._rebuild_vectors(txn, nodes, texts)
        self.graph.repair(txn, [docno for docno, _ in nodes], {docno: node.id for docno, node in nodes})
        self.graph.link_tunnels(txn, nodes, now=now)

    def verify(self, txn: Txn) -> list[str]:
        """Problems where the indexes disagree with the node records (empty when consistent).

        One pass over the records: BM25 takes each one's terms as it goes, and only ~16
        bytes per memory are kept for the graph check (docno, hash of its id). The vector
        check gets the embeddings of the records that have some (every record and its text
        when an ``auto`` space exists).
        """
        try:
            spaces = self.vectors.spaces(txn)
        except EngramError:
            spaces = {}  # the vector check below reports it
        auto = any(space.auto for space in spaces.values())
        docnos, hashes = array("Q"), array("q")
        with_vectors: list[tuple[int, Any]] = []  # what the vector check reads of a record
        texts: list[str] = []
        failed: list[CorruptFileError] = []

        def docs() -> Iterator[tuple[int, list[str]]]:
            try:
                for docno, node in iter_nodes(txn):
                    docnos.append(docno)
                    hashes.append(hash(node.id))
                    if auto:  # every record's text is embedded again
                        with_vectors.append((docno, node))
                        texts.append(node_text(node))
                    elif node.embeddings:  # only which vectors it names (or holds, first layout)
                        with_vectors.append((docno, _Embedded(node.embeddings)))
                        texts.append("")
                    yield docno, self.terms(node)
            except CorruptFileError as exc:
                failed.append(exc)

        stream = docs()
        problems = self.bm25.verify(txn, stream)
        for _ in stream:  # BM25 stops early when its own records are damaged; the others need every node
            pass
        if failed:
            return [f"nodes: {failed[0].message}"]
        problems += self.vectors.verify(txn, with_vectors, texts)
        ids = NodeIds(np.frombuffer(docnos, np.uint64), np.frombuffer(hashes, np.int64))
        problems += self.graph.verify(txn, ids)
        return problems

    def merge(self, txn: Txn, max_steps: int = 1, *, force: bool = False) -> int:
        """Up to ``max_steps`` tiered merge steps on BM25 and on each vector space.

        ``force=True`` then merges every BM25 segment into one (a full optimise; vector
        blocks never hold deleted rows). ``compact`` does not need it: it purges deleted
        memories from the segments holding them (:meth:`purge`). Returns the number of
        steps run.
        """
        return self.bm25.merge(txn, max_steps, force=force) + self.vectors.merge(txn, max_steps, force=force)

    def purge(self, txn: Txn, max_steps: int = 1) -> int:
        """Up to ``max_steps`` steps of what compaction does to the BM25 index: merge the
        small segments into one, then rewrite the segments that hold deleted memories
        without them (spec/bm25.md, "Purge"; vector blocks never hold them: a delete
        rewrites its block). Returns the steps run (0: nothing is left to do)."""
        done = self.bm25.merge_small(txn) if max_steps > 0 else 0
        return done + self.bm25.purge(txn, max_steps - done)


class IndexBatch:
    """Changes of one write transaction, applied to the indexes in one call.

    ``remove`` after ``add`` of the same docno in the batch cancels the add; a docno
    indexed before the batch is tombstoned once, however often it changes.
    """

    def __init__(self, indexes: Indexes, txn: Txn) -> None:
        self._indexes = indexes
        self._txn = txn
        self._added: dict[int, Node] = {}
        self._removed: dict[int, Indexed] = {}
        self._fresh: set[int] = set()

    def add(self, docno: int, node: Node) -> None:
        """Index ``node`` under ``docno`` (after a :meth:`remove` of its old version)."""
        if docno not in self._removed and docno not in self._added:
            self._fresh.add(docno)
        self._added[docno] = node

    def add_many(self, items: Sequence[tuple[int, Node]]) -> None:
        """:meth:`add` of each ``(docno, node)``, in order."""
        added, removed = self._added, self._removed
        if not added and not removed:  # nothing buffered yet (a bulk add): every docno is fresh
            self._fresh.update(docno for docno, _ in items)
            added.update(items)
            return
        for docno, node in items:
            self.add(docno, node)

    def pending(self, docno: int) -> Node | None:
        """The version of ``docno`` this batch will index (written in its transaction), or None."""
        return self._added.get(docno)

    def remove(self, docno: int, node: Indexed) -> None:
        """Drop the indexed version of ``docno`` (``node``: that version, or what
        :meth:`Indexes.read_removed` gives of it)."""
        if docno in self._added:
            del self._added[docno]
        if docno in self._fresh:
            self._fresh.discard(docno)
            return
        self._removed.setdefault(docno, node)

    def flush(self) -> None:
        """Apply the buffered changes (a no-op when empty).

        Raises:
            EmbeddingError, ValidationError, CorruptFileError: see :meth:`Indexes.apply`.
        """
        if self._added or self._removed:
            added = sorted(self._added.items())
            removed = sorted(self._removed.items())
            self._added, self._removed, self._fresh = {}, {}, set()
            self._indexes.apply(self._txn, added, removed)
