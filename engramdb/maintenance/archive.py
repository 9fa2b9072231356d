"""Archive compaction: move a memory's full text out of the index into the archive table.

An archived memory is two things, written in one transaction:

* its **stub** in ``nodes``: the original record with ``content`` replaced by a short
  preview (the first ``chars`` characters, plus ``...`` when text was cut, as Trace Lite
  writes it; characters are UTF-16 code units, as Trace Lite counts them), ``tier`` set to ``"archive"``, and one reserved metadata entry,
  ``metadata["engramdb.archive"] = {"length": <UTF-16 code units of the original content>,
  "tier": <tier before>, "truncated": <bool>}``. The stub is what the index, recall and
  ``get(id)`` see; :attr:`engramdb.Node.archived` is True for it.
* its **archive row** (table ``archive``, key = docno): the original content,
  zstd-compressed and sealed like every other value (``codec.pack_archive``). A
  truncating archive (``truncate=True``) of a text longer than the preview writes no row:
  the text beyond the preview is gone, and the call returns the number of UTF-8 bytes
  dropped.

The original record is the stub without the reserved entry, with the archived content and
the previous tier: :func:`full` rebuilds it and :func:`unarchive` writes it back, byte for
byte the record that was archived (fields changed while archived, e.g. ``pinned`` or
``tags``, keep their new values). A dump (AAAK v3) carries the stub as a node, with its
metadata, and the archive row as an ``@a`` line, so a restore keeps the memory archived.

The functions take a transaction object of the facade (``Engram.transaction()`` /
``Transaction``): anything with ``find``, ``update``, ``archived``, ``set_archived`` and
``drop_archived``. This module never imports the facade.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from .. import codec
from ..errors import CorruptFileError, NotFoundError, ValidationError
from ..records import ARCHIVE_KEY, Node, now_ts
from .lifecycle import preview as lifecycle_preview
from .lifecycle import utf16_len

__all__ = [
    "ARCHIVE_KEY",
    "PREVIEW_CHARS",
    "ArchiveTxn",
    "archive",
    "full",
    "full_of",
    "info",
    "preview",
    "problems",
    "unarchive",
]

PREVIEW_CHARS = 200  # Trace Lite's archive truncation length


class ArchiveTxn(Protocol):
    """What the archive primitives need from a write transaction (``engramdb.engram.Transaction``)."""

    def find(self, id: str) -> Node | None: ...
    def update(self, id: str, /, **changes: Any) -> Node: ...
    def archived(self, id: str) -> str | None: ...
    def set_archived(self, id: str, original: str) -> None: ...
    def drop_archived(self, id: str) -> bool: ...


def preview(content: str, chars: int = PREVIEW_CHARS) -> str:
    """The stub's content: ``content`` itself when it has at most ``chars`` characters, else
    the pure pass's truncation (:func:`engramdb.maintenance.lifecycle.preview`: the first
    ``chars`` characters followed by ``...``; characters are UTF-16 code units, as Trace
    Lite counts them, and a cut never splits a surrogate pair)."""
    return content if utf16_len(content) <= chars else lifecycle_preview(content, chars)


def info(node: Node) -> Mapping[str, Any] | None:
    """The reserved archive entry of a stub (``length``, ``tier``, ``truncated``), or None
    when ``node`` is not archived."""
    entry = node.metadata.get(ARCHIVE_KEY)
    return entry if isinstance(entry, Mapping) else None


def _get(tx: ArchiveTxn, id: str) -> Node:
    node = tx.find(id)
    if node is None:
        raise NotFoundError(f"no memory with id {id!r}", hint="check the id (`engramdb recall FILE QUERY` shows ids)")
    return node


def archive(tx: ArchiveTxn, id: str, *, truncate: bool = False, chars: int = PREVIEW_CHARS,
            now: float | None = None, changes: Mapping[str, Any] | None = None) -> int:
    """Archive memory ``id`` inside ``tx``; returns the number of UTF-8 bytes of text dropped
    (always 0 unless ``truncate``). A memory that is archived already is left as it is (0).

    ``changes`` (fields other than ``content``, e.g. the maintenance pass's new tier) are
    applied first, in the same record write: the same result as ``update`` then ``archive``.

    ``now`` is accepted for the maintenance pass's uniform signature; archiving changes no
    timestamp (the stub keeps ``created_at`` and ``last_accessed``).

    Raises:
        NotFoundError: no such id.
        ValidationError: ``chars`` is not a positive integer.
    """
    now_ts(now)  # validates an injected clock like every other lifecycle call
    if isinstance(chars, bool) or not isinstance(chars, int) or chars < 1:
        raise ValidationError(f"chars must be a positive integer, got {chars!r}")
    node = _get(tx, id)
    if changes and "content" in changes:
        raise ValidationError("archive changes cannot include content")
    if info(node) is not None:
        if changes:
            tx.update(id, **changes)
        return 0
    if changes:
        node = node.replace(**changes)
    # a row without a stub entry (written by set_archived alone) already holds the original
    stored = tx.archived(id)
    content = node.content if stored is None else stored
    length = utf16_len(content)
    cut = length > chars
    # keys in sorted order, as a dump writes them (tjson), so a restored stub has the same bytes
    entry = {"length": length, "tier": node.tier, "truncated": bool(truncate and cut)}
    kept = preview(content, chars)
    dropped = 0
    if truncate and cut:
        dropped = len(content.encode("utf-8", "surrogatepass")) - len(kept[:-3].encode("utf-8", "surrogatepass"))
    else:  # a text no longer than the preview loses nothing: it is archived whole, and can be undone
        tx.set_archived(id, content)
    tx.update(id, **{**(changes or {}), "content": kept, "tier": "archive",
                     "metadata": {**node.metadata, ARCHIVE_KEY: entry}})
    return dropped


def full(tx: ArchiveTxn, id: str) -> Node:
    """The memory as it was before it was archived (the node itself when it is not archived).

    A truncated archive has no original left: its stub is returned.

    Raises:
        NotFoundError: no such id.
    """
    return full_of(tx, _get(tx, id))


def full_of(tx: ArchiveTxn, node: Node) -> Node:
    """:func:`full` of a node already read in ``tx``."""
    entry = info(node)
    original = tx.archived(node.id)
    if entry is None and original is None:
        return node
    if entry is not None and entry.get("truncated"):
        return node
    changes: dict[str, Any] = {}
    if original is not None:
        changes["content"] = original
    if entry is not None:
        changes["tier"] = entry.get("tier", node.tier)
        changes["metadata"] = {k: v for k, v in node.metadata.items() if k != ARCHIVE_KEY}
    return node.replace(**changes)


def unarchive(tx: ArchiveTxn, id: str) -> Node:
    """Put the original record of memory ``id`` back (content, tier, metadata) and drop its
    archive row; returns the restored node. A memory that is not archived is left as it is.

    Raises:
        NotFoundError: no such id.
        ValidationError: the memory was archived with ``truncate=True``; its text is gone.
    """
    node = _get(tx, id)
    entry = info(node)
    if entry is not None and entry.get("truncated"):
        raise ValidationError(f"memory {id!r} was archived with truncation; its full text is gone",
                              hint="only a non-truncating archive (the default) can be undone")
    restored = full_of(tx, node)
    if restored is node:
        return node
    tx.drop_archived(id)
    changes = {name: getattr(restored, name) for name in ("content", "tier", "metadata")}
    return tx.update(id, **changes)


def problems(nodes: Mapping[int, Node], rows: Iterable[tuple[bytes, bytes]]) -> list[str]:
    """What is wrong between the stubs and the archive rows (for ``Engram.verify``).

    ``nodes`` maps each docno to its decoded record; ``rows`` are the opened archive rows.
    A row must belong to a memory and decompress to text; a stub archived without
    truncation must have its row, and a truncated one must not.
    """
    found: list[str] = []
    with_row: set[int] = set()
    for key, value in rows:
        try:
            docno = codec.from_u64(key)
            codec.unpack_archive(value)
        except CorruptFileError as exc:
            found.append(f"archive row {key.hex()}: {exc.message}")
            continue
        with_row.add(docno)
        if docno not in nodes:
            found.append(f"archive row {docno} belongs to no memory")
    for docno, node in nodes.items():
        entry = info(node)
        if entry is None:
            continue
        if entry.get("truncated"):
            if docno in with_row:
                found.append(f"memory {node.id!r} was archived with truncation but has an archive row")
        elif docno not in with_row:
            found.append(f"archived memory {node.id!r} has lost its archive row (its full text)")
    return found
