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
``Transaction``): anything with ``find``, ``update``, ``archived``, ``_set_archived`` and
``_drop_archived`` (the unguarded spellings: an archive writes the row before the stub, an
unarchive drops it while the record is still a stub). This module never imports the facade.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from .. import codec
from ..errors import CorruptFileError, NotFoundError, ValidationError
from ..records import ARCHIVE_KEY, Node, now_ts
from .lifecycle import preview as lifecycle_preview
from .lifecycle import utf16_len

__all__ = [
    "ARCHIVE_KEY",
    "GROUP_BIT",
    "PREVIEW_CHARS",
    "ArchiveTxn",
    "archive",
    "drop_original",
    "drop_originals",
    "full",
    "full_of",
    "has_original",
    "info",
    "iter_originals",
    "keep_entry",
    "pack_group",
    "pack_groups",
    "preview",
    "problems",
    "read_original",
    "unarchive",
    "unpack_group",
    "write_original",
]

PREVIEW_CHARS = 200  # Trace Lite's archive truncation length

# --- the archive table (spec/file-format.md, "Archive rows") --------------------------------
# Key u64be(docno): one original, a zstd frame of its UTF-8 (``codec.pack_archive``), as
# ``archive`` writes it. Key u64be(GROUP_BIT | last docno): a group of originals that
# ``compact`` packed together, ``GROUP_MARK`` + zstd(msgpack [[docno, text], ...]) in docno
# order; groups cover disjoint docno ranges, so a memory's group is the first group key at or
# after u64be(GROUP_BIT | docno). Every value is sealed by the store like any other.
GROUP_BIT = 1 << 63
GROUP_MARK = b"\x02"
GROUP_TEXT_BYTES = 256 * 1024  # a group holds at most this much UTF-8 ...
GROUP_MEMBERS = 1024  # ... and at most this many originals
GROUP_LEVEL = 9  # zstd level of a group (written once per compaction, read rarely)
_MAX_GROUP_BYTES = 64 * 1024 * 1024


def _group_key(last: int) -> bytes:
    return codec.u64(GROUP_BIT | last)


def pack_group(members: Sequence[tuple[int, str]]) -> bytes:
    """A group value: :data:`GROUP_MARK` + zstd of msgpack ``[[docno, text], ...]``
    (``members`` in increasing docno order)."""
    import zstandard

    body = codec.pack([[d, t] for d, t in members])
    return GROUP_MARK + zstandard.ZstdCompressor(level=GROUP_LEVEL).compress(body)


def unpack_group(value: bytes) -> list[tuple[int, str]]:
    """Inverse of :func:`pack_group`.

    Raises:
        CorruptFileError: not a group, or not one that decodes to increasing docnos and texts.
    """
    import zstandard

    if not value.startswith(GROUP_MARK):
        raise CorruptFileError("an archive group has an unknown format", hint="upgrade engramdb, or restore from a dump")
    try:
        frame = value[len(GROUP_MARK):]
        if zstandard.frame_content_size(frame) > _MAX_GROUP_BYTES:
            raise CorruptFileError("an archive group declares a size beyond the cap")
        body = zstandard.ZstdDecompressor().decompress(frame, max_output_size=_MAX_GROUP_BYTES)
    except zstandard.ZstdError:
        raise CorruptFileError("an archive group does not decompress") from None
    data = codec.unpack(body)
    out: list[tuple[int, str]] = []
    if not isinstance(data, list):
        raise CorruptFileError("an archive group is not a list of originals")
    for item in data:
        if (not isinstance(item, list) or len(item) != 2 or type(item[0]) is not int or not isinstance(item[1], str)
                or not 0 <= item[0] < GROUP_BIT or (out and item[0] <= out[-1][0])):
            raise CorruptFileError("an archive group holds a malformed original")
        out.append((item[0], item[1]))
    return out


def _group_of(txn: Any, docno: int) -> tuple[bytes, list[tuple[int, str]]] | None:
    """The group whose docno range holds ``docno`` (key, members), or None."""
    for key, value in txn.items("archive", start=_group_key(docno)):
        return key, unpack_group(value)
    return None


def read_original(txn: Any, docno: int) -> str | None:
    """The archived original of memory ``docno`` (its own row or its group's), or None.

    Raises:
        CorruptFileError: the row or group does not decode.
    """
    raw = txn.get("archive", codec.u64(docno))
    if raw is not None:
        return codec.unpack_archive(raw)
    group = _group_of(txn, docno)
    if group is not None:
        for d, text in group[1]:
            if d == docno:
                return text
    return None


def has_original(txn: Any, docno: int) -> bool:
    """Whether memory ``docno`` has an archived original."""
    return read_original(txn, docno) is not None


def write_original(txn: Any, docno: int, text: str) -> None:
    """Store ``text`` as the archived original of memory ``docno`` (its own row)."""
    drop_original(txn, docno)
    txn.put("archive", codec.u64(docno), codec.pack_archive(text))


def drop_original(txn: Any, docno: int) -> bool:
    """Remove the archived original of memory ``docno``: its row, or its place in a group
    (the group is rewritten without it, deleted when empty). False when it had none."""
    if txn.delete("archive", codec.u64(docno)):
        return True
    group = _group_of(txn, docno)
    if group is None:
        return False
    key, members = group
    rest = [(d, t) for d, t in members if d != docno]
    if len(rest) == len(members):
        return False
    if rest:
        txn.put("archive", key, pack_group(rest))
    else:
        txn.delete("archive", key)
    return True


def drop_originals(txn: Any, docnos: Iterable[int]) -> None:
    """:func:`drop_original` of many memories (``delete_many``): their rows in one call,
    and each group that holds some of them rewritten once."""
    wanted = sorted(set(docnos))
    txn.delete_many("archive", [codec.u64(d) for d in wanted])
    i = 0
    while i < len(wanted):
        found = next(txn.items("archive", start=_group_key(wanted[i])), None)
        if found is None:
            return
        key, value = found
        last = codec.from_u64(key) & ~GROUP_BIT
        j = i
        while j < len(wanted) and wanted[j] <= last:
            j += 1
        gone = set(wanted[i:j])
        members = unpack_group(value)
        rest = [(d, t) for d, t in members if d not in gone]
        if len(rest) != len(members):
            if rest:
                txn.put("archive", key, pack_group(rest))
            else:
                txn.delete("archive", key)
        i = j


def iter_originals(txn: Any) -> Iterator[tuple[int, str]]:
    """Every archived original (docno, text), rows first then groups, each in key order."""
    for key, value in txn.items("archive"):
        number = codec.from_u64(key)
        if number & GROUP_BIT:
            yield from unpack_group(value)
        else:
            yield number, codec.unpack_archive(value)


def pack_groups(txn: Any) -> int:
    """Pack the archived originals into groups (``compact`` calls it before copying): one
    zstd frame per run of up to :data:`GROUP_TEXT_BYTES` of text, so similar texts share
    their compression. Nothing is rewritten when every original is already in a group at
    least half full; otherwise every group is rebuilt, in docno order. Returns the number
    of groups written."""
    singles = groups = underfull = 0
    for key in txn.keys("archive"):
        if codec.from_u64(key) & GROUP_BIT:
            groups += 1
        else:
            singles += 1
    if not singles:
        for _, value in txn.items("archive", start=codec.u64(GROUP_BIT)):
            members = unpack_group(value)
            size = sum(len(t.encode("utf-8", "surrogatepass")) for _, t in members)
            underfull += size < GROUP_TEXT_BYTES // 2 and len(members) < GROUP_MEMBERS // 2
        if underfull <= 1:  # the last group of a run may be small
            return 0
    originals = sorted(iter_originals(txn))
    for key in list(txn.keys("archive")):
        txn.delete("archive", key)
    written = 0
    run: list[tuple[int, str]] = []
    size = 0
    for docno, text in originals:
        length = len(text.encode("utf-8", "surrogatepass"))
        if run and (size + length > GROUP_TEXT_BYTES or len(run) >= GROUP_MEMBERS):
            txn.put("archive", _group_key(run[-1][0]), pack_group(run))
            written += 1
            run, size = [], 0
        run.append((docno, text))
        size += length
    if run:
        txn.put("archive", _group_key(run[-1][0]), pack_group(run))
        written += 1
    return written


class ArchiveTxn(Protocol):
    """What the archive primitives need from a write transaction (``engramdb.engram.Transaction``)."""

    def find(self, id: str) -> Node | None: ...
    def update(self, id: str, /, **changes: Any) -> Node: ...
    def _update_stub(self, id: str, /, **changes: Any) -> Node: ...
    def archived(self, id: str) -> str | None: ...
    def _set_archived(self, id: str, original: str) -> None: ...
    def _drop_archived(self, id: str) -> bool: ...


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
        tx._set_archived(id, content)
    tx._update_stub(id, **{**(changes or {}), "content": kept, "tier": "archive",
                      "metadata": {**node.metadata, ARCHIVE_KEY: entry}})
    return dropped


def keep_entry(txn: Any, docno: int, old: Node, new: Node) -> Node:
    """``new``, an update of the record ``old`` of memory ``docno``, with ``old``'s archive
    entry when ``old`` is a stub and the update's metadata leaves the entry out (a user
    replacing the metadata): the memory stays archived, its content still a preview of the
    archived text, so its content stays protected and ``unarchive`` still restores it. Not
    when the archive row is gone: ``unarchive`` drops it before writing the original back."""
    entry = info(old)
    if entry is None or ARCHIVE_KEY in new.metadata:
        return new
    if not entry.get("truncated") and not has_original(txn, docno):
        return new
    return new.replace(metadata={**new.metadata, ARCHIVE_KEY: entry})


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
        # a stub's tier is "archive" unless it was changed while archived: that new value stays
        changes["tier"] = entry.get("tier", node.tier) if node.tier == "archive" else node.tier
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
    tx._drop_archived(id)
    changes = {name: getattr(restored, name) for name in ("content", "tier", "metadata")}
    return tx.update(id, **changes)


def problems(nodes: Mapping[int, Node], rows: Iterable[tuple[bytes, bytes]]) -> list[str]:
    """What is wrong between the stubs and the archive table (for ``Engram.verify``).

    ``nodes`` maps each docno to its decoded record; ``rows`` are the opened archive rows
    and groups. A row must belong to a memory and decompress to text; a group must decode,
    its docnos lie in its own range (after the previous group's last docno, at most its
    key's) and belong to memories with no row of their own; a stub archived without
    truncation must have its original, and a truncated one must not.
    """
    found: list[str] = []
    with_row: set[int] = set()
    previous_last = -1
    for key, value in sorted(rows):
        try:
            number = codec.from_u64(key)
            if number & GROUP_BIT:
                members = unpack_group(value)
            else:
                codec.unpack_archive(value)
                members = [(number, "")]
        except CorruptFileError as exc:
            found.append(f"archive row {key.hex()}: {exc.message}")
            continue
        if number & GROUP_BIT:
            last = number & ~GROUP_BIT
            if not members or members[0][0] <= previous_last or members[-1][0] > last:
                found.append(f"archive group {key.hex()} holds docnos outside its range")
            previous_last = last
        for docno, _ in members:
            if docno in with_row:
                found.append(f"memory {docno} has two archived originals")
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
