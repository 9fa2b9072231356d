"""Bulk ingest: memories built from a batch's items and written a chunk at a time.

The work behind :meth:`Engram.add_many <engramdb.engram.Engram.add_many>` (one
transaction, chunked inside it) and :meth:`Engram.import_many
<engramdb.engram.Engram.import_many>` (one transaction per chunk, ids already stored
skipped). The facade hands in its store and a way to open its batched record writer on a
transaction (:class:`ChunkWriter`); this module owns the chunking, the building of nodes
from items, the map reservation and the paused garbage collector.
"""
from __future__ import annotations

import contextlib
import gc
import itertools
import operator
import threading
from contextlib import AbstractContextManager
from typing import Any, Protocol, cast
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from .errors import ValidationError
from .records import Node, check_written, new_id, now_ts
from .store import Store, Txn

__all__ = ["INGEST_CHUNK", "ChunkWriter", "add_many", "build", "build_many", "chunk_size", "import_many", "put_chunk"]

# add_many builds, writes and indexes this many memories at a time (one BM25 segment each):
# its own extra memory is a chunk's, whatever the batch's size. Measured at ~60 words a
# memory (tools/bench/README.md, "Writes"): ~215 MB of Python and numpy objects at 65,536,
# ~110 MB at 32,768, ~57 MB at 16,384; smaller chunks make more segments for queries to read
# until they merge, so 32,768 is the middle
INGEST_CHUNK = 32_768

_NODE_FIELDS = set(Node.__dataclass_fields__)

Item = Node | str | Mapping[str, Any]


class ChunkWriter(Protocol):
    """The facade's record writer inside one write transaction (``Engram._batched``): its
    index changes go into one batch."""

    def _put_new_many(self, nodes: list[Node]) -> list[str]:
        """Write new nodes (checked by build_many, or a dump's records); raises DuplicateIdError
        when an id is stored or repeats."""

    def _put_unstored(self, nodes: list[Node]) -> int:
        """Write the nodes whose id is neither stored nor an earlier one's; returns how many."""

    def _end_chunk(self) -> None:
        """Index what the batch holds (one BM25 segment), so the chunk's nodes can go."""


Batched = Callable[[Txn], AbstractContextManager[ChunkWriter]]


# --- building nodes from items --------------------------------------------------------

def build(item: Item, fields: Mapping[str, Any], now: float | None) -> Node:
    """The node ``Engram.add(item, now=now, **fields)`` stores.

    Raises:
        ValidationError: an unknown field, or an invalid value.
    """
    node = _build(item, fields, now)
    check_written(node)
    return node


def _build(item: Item, fields: Mapping[str, Any], now: float | None) -> Node:
    """:func:`build` without its check_written."""
    if isinstance(item, Node):
        if fields:
            item = item.replace(**fields)
        return item
    # dict first: an isinstance check against typing.Mapping costs microseconds per memory
    data: dict[str, Any] = dict(item) if isinstance(item, (dict, Mapping)) else {"content": item}
    data.update(fields)
    if not _NODE_FIELDS.issuperset(data):
        unknown = set(data) - _NODE_FIELDS
        raise ValidationError(f"unknown memory fields: {', '.join(sorted(unknown))}",
                              hint=f"known fields: {', '.join(sorted(_NODE_FIELDS))}")
    if "id" not in data:  # not setdefault: a fresh uuid4 per memory costs more than the check
        data["id"] = new_id()
    if "created_at" not in data:
        data["created_at"] = now_ts(now)
    data.setdefault("last_accessed", data["created_at"])
    return Node.from_fields(data)


def _direct(item: dict[str, Any]) -> bool:
    """Whether :func:`build` would pass ``item`` to Node.from_fields unchanged: it gives the
    id and both timestamps, and only node fields (from_fields copies the values)."""
    return "id" in item and "created_at" in item and "last_accessed" in item and _NODE_FIELDS.issuperset(item)


def build_many(items: Iterable[Item], now: float | None, *, as_stored: bool = False) -> list[Node]:
    """``[build(item, {}, now) for item in items]``. A dict that gives the id and both
    timestamps and only node fields (a bulk load's records) goes to Node.from_fields as
    is; a batch of such dicts, to Node.plain_many first (one check per column).

    ``as_stored``: the items are a dump's records, written as they were stored, without
    :func:`~engramdb.records.check_written` (archive entries, tags an older engramdb took).

    Raises:
        ValidationError: as :func:`build`, for the first invalid item.
    """
    nodes, plain = _build_many(items, now)
    if not (as_stored or plain):  # a bulk load's plain records have no tags or metadata
        for node in nodes:
            if node.tags or node.metadata:  # what check_written looks at
                check_written(node)
    return nodes


def _build_many(items: Iterable[Item], now: float | None) -> tuple[list[Node], bool]:
    """:func:`build_many` without its check_written, and whether the nodes were a bulk
    load's plain records (Node.plain_many's)."""
    seq = items if isinstance(items, list) else list(items)
    # the bulk load's records: one check of their columns (in C with the extension) and no
    # more passes over the rows. When plain_many declines them, they are built row by row
    # below (what Node.from_fields_many would do after asking plain_many again).
    # (plain_many checks that every row is a dict: the cast only tells mypy)
    if seq and type(seq[0]) is dict and _direct(seq[0]):
        plain = Node.plain_many(cast("list[dict[str, Any]]", seq))
        if plain is not None:
            return plain, True
    elif seq and set(map(type, seq)) == {dict}:
        dicts = cast("list[dict[str, Any]]", seq)  # every item is a dict, checked just above
        keys = dicts[0].keys()
        # ids given, timestamps not (what build adds), all with the same keys
        if "id" in keys and _NODE_FIELDS.issuperset(keys) and all(map(keys.__eq__, map(dict.keys, dicts))):
            rows = []
            for given in dicts:
                row = dict(given)
                if "created_at" not in row:
                    row["created_at"] = now_ts(now)
                row.setdefault("last_accessed", row["created_at"])
                rows.append(row)
            return Node.from_fields_many(rows), False
    nodes: list[Node] = []
    append = nodes.append
    for item in seq:
        append(Node.from_fields(item) if type(item) is dict and _direct(item) else _build(item, {}, now))
    return nodes, False


# --- sizing and the collector ---------------------------------------------------------

def _text_length(item: Any) -> int:
    """The length of an item's content text (0 when it has none or it is not a string)."""
    if isinstance(item, str):
        return len(item)
    content = item.get("content", "") if isinstance(item, Mapping) else getattr(item, "content", "")
    return len(content) if isinstance(content, str) else 0


_content = operator.itemgetter("content")
# Items whose texts _text_lengths reads at most; a sample's estimate off by some percent is
# absorbed by the map's growth (it at least doubles), a miss only costs a replay
_LENGTH_SAMPLE = 4096


def _text_lengths(items: Sequence[Any]) -> int:
    """``sum(map(_text_length, items))``, estimated from an evenly spaced sample of
    :data:`_LENGTH_SAMPLE` items when there are more (each pass over a large batch's items
    reads memory that is no longer in the CPU's caches; the figure only sizes the map)."""
    step = max(1, len(items) // _LENGTH_SAMPLE)
    sample = items[::step] if step > 1 else items
    try:
        if set(map(type, map(_content, sample))) <= {str}:
            return sum(map(len, map(_content, sample))) * len(items) // max(1, len(sample))
    except (KeyError, TypeError):  # an item that is not a mapping, or has no content
        pass
    return sum(map(_text_length, sample)) * len(items) // max(1, len(sample))


def _reserve(items: Sequence[Any]) -> int:
    """Bytes to grow the map by before writing ``items``: records, ids and postings take a
    few times the text (growing mid-transaction replays every write so far)."""
    return 3 * _text_lengths(items) + 512 * len(items)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector during a bulk write, restoring its previous state.

    A batch makes hundreds of thousands of long-lived objects and no reference cycles; the
    collector would re-traverse the whole growing heap each time it grows by a quarter
    (measured: ~10% of add_many's time on 100k memories).
    """
    global _gc_pauses, _gc_was_enabled
    # Threads may overlap: the first to enter pauses, the last to leave restores. Saving and
    # restoring per call would let an inner call re-disable what an outer one re-enabled.
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


_gc_lock = threading.Lock()
_gc_pauses = 0
_gc_was_enabled = True


# --- the two ingests --------------------------------------------------------------------

def add_many(store: Store, batched: Batched, items: Iterable[Item], now: float | None, *,
             chunk: int | None = None, before: Callable[[Txn], None] | None = None,
             after: Callable[[Txn], None] | None = None,
             progress: Callable[[int], None] | None = None, as_stored: bool = False) -> list[str]:
    """:meth:`Engram.add_many <engramdb.engram.Engram.add_many>`: one transaction, built,
    written and indexed ``chunk`` memories at a time (one BM25 segment each).

    Args:
        chunk: memories per segment; :data:`INGEST_CHUNK` (read at the call) for None.
        before: called with the transaction before the first memory is written, for what
            the memories need (an import's embedding spaces and entity table).
        after: called with the transaction after the last memory is indexed, for what
            needs them stored (an import's edges).
        progress: called after each chunk with the number of memories written so far.
        as_stored: the items are a dump's records (see :func:`build_many`).

    Raises:
        DuplicateIdError: an id exists already or repeats in ``items``.
        ValidationError: an item is invalid.
    """
    seq = items if isinstance(items, list) else list(items)
    size = INGEST_CHUNK if chunk is None else chunk

    def put_all(txn: Txn) -> list[str]:
        if before is not None:
            before(txn)
        ids: list[str] = []
        with batched(txn) as tx:
            for start in range(0, len(seq), size):
                ids += tx._put_new_many(build_many(seq[start:start + size], now, as_stored=as_stored))
                tx._end_chunk()  # this chunk's segment; its nodes can go
                if progress is not None:
                    progress(len(ids))
        if after is not None:
            after(txn)
        return ids

    with _gc_paused():
        return store.write(put_all, reserve=_reserve(seq))


def chunk_size(chunk: int | None) -> int:
    """The memories per transaction of a chunked import: ``chunk``, or :data:`INGEST_CHUNK`
    (read at the call, so setting ``engramdb.bulk.INGEST_CHUNK`` changes the default) for None.

    Raises:
        ValidationError: ``chunk`` is not a positive integer.
    """
    size = INGEST_CHUNK if chunk is None else chunk
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValidationError(f"chunk must be a positive number of memories, not {chunk!r}",
                              hint="leave it out for the default, engramdb.bulk.INGEST_CHUNK")
    return size


def import_many(store: Store, batched: Batched, items: Iterable[Item], now: float | None, *,
                chunk: int | None = None, progress: Callable[[int, int], None] | None = None) -> tuple[int, int]:
    """:meth:`Engram.import_many <engramdb.engram.Engram.import_many>`: one transaction per
    ``chunk`` memories (default :data:`INGEST_CHUNK`), ids stored already skipped; returns
    ``(added, skipped)``.

    Raises:
        ValidationError: ``chunk`` is not a positive integer, or an item is invalid (the
            chunks before it are committed).
    """
    size = chunk_size(chunk)
    source = iter(items)
    added = skipped = 0
    while batch := list(itertools.islice(source, size)):
        count = put_chunk(store, batched, batch, now)
        added, skipped = added + count, skipped + len(batch) - count
        del batch  # before the next chunk is read
        if progress is not None:
            progress(added, skipped)
    return added, skipped


def put_chunk(store: Store, batched: Batched, items: Sequence[Item], now: float | None, *,
              before: Callable[[Txn], None] | None = None) -> int:
    """One chunk of :func:`import_many`, in one transaction: ``items`` built, and those
    whose id is neither stored nor an earlier one's written and indexed, after
    ``before(txn)`` (what they need: an import's embedding spaces); returns how many
    were written.

    Raises:
        ValidationError: an item is invalid (nothing of the chunk is written).
    """
    with _gc_paused():  # a chunk at a time: the collector frees a chunk's cycles between them
        nodes = build_many(items, now)

        def put(txn: Txn) -> int:
            if before is not None:
                before(txn)
            with batched(txn) as tx:
                return tx._put_unstored(nodes)

        return store.write(put, reserve=_reserve(items))
