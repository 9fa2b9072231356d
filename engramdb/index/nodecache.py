"""Decoded nodes and edge lists of the committed state, kept across commits.

recall's hop reads the node records and edges of a few hundred memories per query.
Decrypting and decoding them again after every commit made recall 5-10x slower in an
add-then-query loop (issue 15), though a commit that adds one memory changes none of
them. :class:`NodeCache` keeps them per handle and revalidates them by the file's change
log (spec/file-format.md, "Change log"): when a read snapshot is newer than what the
cache holds, the log entries of the commits in between name the docnos whose node record
or edges changed, and only those are dropped. A commit of this process drops them at
once (a forgotten memory's decoded record does not outlive the commit); another
process's commit, at this handle's next read.

Entries are valid for exactly one committed state (the sealed state's ``seq``): a read
of an older snapshot (another thread's long read) and every read inside a write
transaction go past the cache. The cache is bounded (``cache_mb``, default
:data:`DEFAULT_CACHE_MB`), evicting least recently used entries.
"""
from __future__ import annotations

import struct
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, TypeVar, cast
from collections.abc import Callable, Collection

from ..codec import decode_node
from ..records import Node
from .graph import Graph, hop_row

if TYPE_CHECKING:  # annotations only
    from ..store import Changes, Txn

__all__ = ["DEFAULT_CACHE_MB", "NodeCache", "NodeView"]

DEFAULT_CACHE_MB = 32.0
# What an entry costs beyond its record's bytes (the Node object, its lists and strings'
# headers, the dict entry), and per neighbour of an edge list; estimates, not measured per entry.
NODE_OVERHEAD = 600
EDGES_OVERHEAD = 200
PER_NEIGHBOUR = 100
_U64 = struct.Struct(">Q")
_MISSING: Any = object()
T = TypeVar("T")


class NodeCache:
    """A bounded LRU of decoded nodes (``("n", docno)``), hop rows (``("e", docno)``: the
    node's row of the hop's transition matrix, :func:`~engramdb.index.graph.hop_row`, without
    neighbours that do not exist) and superseded flags (``("s", docno)``) of one committed
    state of the file.

    Reads take no lock: an entry is used only when the cache still holds the state the
    reader's snapshot shows (its generation, bumped whenever the state moves, is checked
    after the lookup); writes and eviction take the lock.

    Args:
        store: the :class:`~engramdb.store.Store` (the cache registers for its commits).
        graph: the edge storage the neighbour lists come from.
        cache_mb: the limit in MiB (0 keeps nothing beyond the current query; None:
            :data:`DEFAULT_CACHE_MB`).

    Attributes:
        decoded: node records decrypted and decoded through the cache (a count of work).
        edge_reads: edge lists (neighbours or superseded flags) read through the cache.
    """

    def __init__(self, store: Any, graph: Graph, cache_mb: float | None = None) -> None:
        self._graph = graph
        self.max_bytes = int((DEFAULT_CACHE_MB if cache_mb is None else cache_mb) * 2**20)
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, int], tuple[Any, int]] = OrderedDict()
        self.nbytes = 0
        self._seq: int | None = None  # the sealed state's seq the entries are valid for
        self._txnid = 0  # the newest snapshot id validated
        self._next_docno = 0  # of that state: a docno from here on did not exist
        self._gen = 0  # bumped whenever the entries start to describe another state
        self.decoded = 0
        self.edge_reads = 0
        store.on_commit(self)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.nbytes = 0

    def purge(self, changes: Any, state: tuple[int, int, int] | None = None) -> None:
        """Drop what ``changes`` (a :class:`~engramdb.store.Changes`) says changed. ``state``
        (``(seq, next_docno, snapshot id)`` of the commit) moves the cache on to that state
        when it held the one the commit started from (``seq - 1``), so the next read neither
        loads the change log nor drops anything again."""
        with self._lock:
            self._drop(changes)
            if state is not None and self._seq is not None and state[0] == self._seq + 1:
                self._gen += 1  # views of the older state read past the cache from now on
                self._seq, self._next_docno, self._txnid = state[0], state[1], max(self._txnid, state[2])

    def _drop(self, changes: Changes | None) -> None:
        """Drop the entries ``changes`` names, or every entry when it is None or says
        everything changed. The caller holds the lock."""
        if changes is None or changes.everything:
            self._entries.clear()
            self.nbytes = 0
            return
        for docno in changes.nodes or ():
            self._pop(("n", docno))
        for docno in changes.edges or ():
            self._pop(("e", docno))
            self._pop(("s", docno))

    def _pop(self, key: tuple[str, int]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.nbytes -= entry[1]

    def _sync(self, txn: Txn) -> int | None:
        """Bring the cache to ``txn``'s committed state; returns the generation that labels
        it, or None when the cache cannot serve ``txn`` (a write transaction, or an older
        snapshot than the cache holds)."""
        if getattr(txn, "write", True):
            return None
        state = txn.state
        seq, sid = state.seq, txn.snapshot_id
        with self._lock:
            if self._seq == seq:
                self._txnid = max(self._txnid, sid)
                return self._gen
            if self._seq is not None and seq < self._seq and sid <= self._txnid:
                return None  # an older snapshot than the cache's: read past it
            # first use, or the state was rebuilt (an older seq in a newer snapshot): start over
            changes = None if self._seq is None or seq < self._seq else txn.changes_since(self._seq)
            self._gen += 1
            self._drop(changes)
            self._seq, self._txnid, self._next_docno = seq, sid, state.next_docno
            return self._gen

    def _get(self, gen: int, key: tuple[str, int]) -> Any:
        entry = self._entries.get(key)
        if entry is None or self._gen != gen:  # checked after the lookup: see the class docstring
            return _MISSING
        try:
            self._entries.move_to_end(key)
        except KeyError:  # evicted meanwhile by another thread; the value is still right
            pass
        return entry[0]

    def _put(self, gen: int, key: tuple[str, int], value: Any, nbytes: int) -> None:
        if nbytes > self.max_bytes:
            return
        with self._lock:
            if self._gen != gen or key[1] >= self._next_docno:
                return  # the cache moved on meanwhile (or a docno this state does not know)
            old = self._entries.pop(key, None)
            if old is not None:
                self.nbytes -= old[1]
            self._entries[key] = (value, nbytes)
            self.nbytes += nbytes
            while self.nbytes > self.max_bytes:
                _, (_, size) = self._entries.popitem(last=False)
                self.nbytes -= size

    def view(self, txn: Txn) -> NodeView:
        """The accessor of one read (one recall) of ``txn``."""
        return NodeView(self, txn, self._sync(txn))


class NodeView:
    """Nodes, hop rows and superseded flags of one snapshot, through the cache when it
    holds that snapshot's state (``gen`` not None), else read directly."""

    def __init__(self, cache: NodeCache, txn: Txn, gen: int | None) -> None:
        self._cache = cache
        self._txn = txn
        self._gen = gen

    def _through(self, key: tuple[str, int], load: Callable[[int], tuple[T, int]]) -> T:
        """The cached value of ``key``, else ``load(docno)``'s (value, estimated bytes), kept."""
        cache, gen = self._cache, self._gen
        if gen is not None:
            found = cache._get(gen, key)
            if found is not _MISSING:
                return cast(T, found)
        value, nbytes = load(key[1])
        if gen is not None:
            cache._put(gen, key, value, nbytes)
        return value

    def node(self, docno: int) -> Node | None:
        """The node of ``docno`` (None when it does not exist)."""
        return self._through(("n", docno), self._load_node)

    def _load_node(self, docno: int) -> tuple[Node | None, int]:
        raw = self._txn.get("nodes", _U64.pack(docno))
        if raw is None:
            return None, NODE_OVERHEAD
        self._cache.decoded += 1
        return decode_node(raw), NODE_OVERHEAD + len(raw)

    def hop_row(self, docno: int) -> tuple[tuple[int, float], ...]:
        """``docno``'s row of the hop (:func:`~engramdb.index.graph.hop_row` of its
        neighbours), without the neighbours that have no node record (dangling edges of a
        damaged file carry weight but lead nowhere)."""
        return self._through(("e", docno), self._load_row)

    def hop_rows(self, docnos: Collection[int]) -> dict[int, tuple[tuple[int, float], ...]]:
        """:meth:`hop_row` of each of ``docnos`` (one call per ranking: the cached ones are
        looked up in one pass)."""
        return self._many("e", docnos, self.hop_row)

    def nodes(self, docnos: Collection[int]) -> dict[int, Node | None]:
        """:meth:`node` of each of ``docnos`` (the cached ones looked up in one pass)."""
        return self._many("n", docnos, self.node)

    def _many(self, tag: str, docnos: Collection[int], one: Callable[[int], T]) -> dict[int, T]:
        """``one(docno)`` of each of ``docnos``, the values the cache holds taken in one pass
        (marked as used, as :meth:`_through` does), the rest through ``one``."""
        cache, gen = self._cache, self._gen
        out: dict[int, T] = {}
        missing: list[int] = []
        if gen is None:
            missing = list(docnos)
        else:
            entries, touch = cache._entries, cache._entries.move_to_end
            for docno in docnos:
                key = (tag, docno)
                entry = entries.get(key)
                if entry is None:
                    missing.append(docno)
                    continue
                out[docno] = entry[0]
                try:
                    touch(key)
                except KeyError:  # evicted meanwhile by another thread; the value is still right
                    pass
            if cache._gen != gen:  # the cache moved on during the pass: read them all
                missing, out = list(docnos), {}
        for docno in missing:
            out[docno] = one(docno)
        return out

    def _load_row(self, docno: int) -> tuple[tuple[tuple[int, float], ...], int]:
        contains = self._txn.contains
        row = tuple((dst, share) for dst, share in hop_row(self._cache._graph.neighbours(self._txn, docno))
                    if contains("nodes", _U64.pack(dst)))
        self._cache.edge_reads += 1
        return row, EDGES_OVERHEAD + PER_NEIGHBOUR * len(row)

    def superseded(self, docno: int) -> bool:
        """Whether some memory supersedes ``docno`` (:meth:`Graph.superseded`)."""
        return self._through(("s", docno), self._load_superseded)

    def _load_superseded(self, docno: int) -> tuple[bool, int]:
        self._cache.edge_reads += 1
        return self._cache._graph.superseded(self._txn, docno), EDGES_OVERHEAD
