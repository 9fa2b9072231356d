"""Readers that turn other tools' memory files into engramdb records, and a JSONL exporter.

Everything here is pure: readers take a file object (or bytes/str) and yield records;
nothing is written anywhere. The caller (``engramdb import``) puts them into a store.

Sources:

* **AAAK v1/v2 text** (zettel-compress) and v3 result documents — :func:`iter_aaak`:
  one :class:`~engramdb.records.Node` per zettel, then one ``tunnel`` edge per tunnel.
* **JSONL of Trace-Lite ``Memory`` objects** — :func:`iter_jsonl`: one node per line.
* **Terronex ``.engram`` 1.x and 2.x** (magic ``ENGRAM``, msgpack header, msgpack or
  AES-256-GCM payload) — :func:`iter_terronex`: one node per memory node, then edges for links and
  for the parent/child hierarchy. Read-only.

:func:`export_jsonl` writes nodes as Trace-Lite ``Memory`` lines; it adds an
``engramdb`` block so that :func:`iter_jsonl` restores the exact node.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import struct
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, BinaryIO, NamedTuple, TextIO, cast
from collections.abc import Iterable, Iterator, Mapping

import numpy as np

from .aaak import decode, is_encrypted_dump, tjson_dumps, tjson_untag
from .errors import (
    AAAKParseError,
    EngramError,
    ImportFormatError,
    ModeMismatchError,
    ValidationError,
    WrongPassphraseError,
    shown,
)
from .records import ALL_EMOTIONS, ALL_FLAGS, ARCHIVE_KEY, TIERS, Edge, Node, now_ts

__all__ = [
    "ImportItem",
    "EntityTable",
    "ImportReport",
    "detect_format",
    "iter_import",
    "iter_aaak",
    "iter_jsonl",
    "iter_terronex",
    "export_jsonl",
    "export_lines",
]


class EntityTable(NamedTuple):
    """The ``E:`` entity index of an imported AAAK document: entity code -> name.

    ``engramdb import`` stores it with the file (tunnel labels such as ``BN1+BN7`` are
    written in these codes) and dumps write it back out.
    """

    code_to_name: dict[str, str]


ImportItem = Node | Edge | EntityTable

TERRONEX_MAGIC = b"ENGRAM"
# Terronex writes these fixed KDF parameters (src/io.ts); they are not stored in the file.
_TX_ARGON2 = {"time_cost": 3, "memory_cost": 65536, "parallelism": 1}
_TX_PBKDF2_ITERATIONS = 100_000
_MAX_JSONL_LINE = 64 * 1024 * 1024
_MAX_TERRONEX_BYTES = 4 * 1024 * 1024 * 1024
_ENGRAMDB_BLOCK = "engramdb"
_EXPORT_VERSION = 1


def _read_all(source: Any, limit: int) -> bytes:
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    elif hasattr(source, "read"):
        data = source.read(limit + 1)
        if isinstance(data, str):
            raise ImportFormatError("this format is binary; open the file with 'rb'")
    else:
        raise ImportFormatError(f"cannot read from a {type(source).__name__}; pass a file object or bytes")
    if len(data) > limit:
        raise ImportFormatError(f"the file is larger than {limit} bytes")
    return data


def detect_format(head: bytes) -> str:
    """Guess the format of a file from its first bytes (at least 16 are best).

    Returns:
        One of ``"terronex"``, ``"aaak-encrypted"``, ``"aaak-dump"``, ``"aaak"``, ``"jsonl"``.

    Raises:
        ImportFormatError: none of the supported formats.
    """
    head = bytes(head)
    if head.startswith(TERRONEX_MAGIC):
        return "terronex"
    if is_encrypted_dump(head):
        return "aaak-encrypted"
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not text:
        raise ImportFormatError("the source is empty (or begins with nothing but blank lines): nothing to import",
                                hint="check the path, and that whatever wrote the file finished")
    if text.startswith(b"FILE:||||v3|dump"):
        return "aaak-dump"
    if text.startswith(b"{"):
        return "jsonl"
    if text.startswith(b"FILE:") or text[:1].isdigit():
        return "aaak"
    if text.startswith(b"["):
        raise ImportFormatError("the source is a JSON array, not JSON Lines (one memory object a line)",
                                hint=_ONE_MEMORY_A_LINE)
    raise ImportFormatError("unrecognized file format (expected AAAK, JSONL memories or a Terronex .engram file)")


def iter_import(
    source: BinaryIO, *, fmt: str | None = None, passphrase: str | bytes | None = None,
    space: str = "default", now: float | None = None, id_prefix: str = "", skip_bad_embeddings: bool = False,
    report: ImportReport | None = None, dims: Mapping[str, int] | None = None,
) -> Iterator[ImportItem]:
    """Read any supported source; ``fmt`` is detected from the first bytes when omitted.

    Args:
        source: a binary file object positioned at the start (seekable when ``fmt`` is None).
        fmt: ``"aaak"``, ``"jsonl"`` or ``"terronex"``.
        passphrase: for encrypted Terronex files.
        space: embedding space name for imported vectors.
        now: the clock for records that carry no timestamps.
        id_prefix: prepended to every imported id (to keep several imports apart).
        skip_bad_embeddings, report: see :func:`iter_terronex`.
        dims: the target store's spaces (name -> dims): a JSONL embedding of another length
            is refused naming its line (:func:`iter_jsonl`).

    Raises:
        ImportFormatError: unknown or malformed input (AAAK dumps are restored, not imported).
    """
    if fmt is None:
        head = source.read(64)
        source.seek(0)
        fmt = detect_format(head)
    if fmt in ("aaak-dump", "aaak-encrypted"):
        raise ImportFormatError("this is an engramdb dump", hint="use `engramdb restore DUMP FILE` for dumps")
    if fmt == "aaak":
        return iter_aaak(source, now=now, id_prefix=id_prefix, report=report)
    if fmt == "jsonl":
        return iter_jsonl(source, space=space, now=now, id_prefix=id_prefix, dims=dims)
    if fmt == "terronex":
        return iter_terronex(source, passphrase=passphrase, space=space, id_prefix=id_prefix,
                             skip_bad_embeddings=skip_bad_embeddings, report=report)
    raise ImportFormatError(f"unknown import format {fmt!r}; use aaak, jsonl or terronex")


# --- AAAK v1 / v2 (and v3 result documents) -----------------------------------------


def iter_aaak(
    source: str | bytes | TextIO | BinaryIO, *, strict: bool = False, now: float | None = None,
    id_prefix: str = "", report: ImportReport | None = None,
) -> Iterator[ImportItem]:
    """The entity table of an AAAK result document, its zettels as nodes, then its tunnels
    as ``tunnel`` edges.

    First comes an :class:`EntityTable` (the ``E:`` index, code -> name) when the document
    has one. A node's ``content`` is its source passage when the document carries
    ``meta["source"]`` and offsets, else its quote. Its ``importance`` is the zettel's
    weight (zettel-compress normalizes weights into [0, 1]; a weight outside is clamped to
    it; a non-finite weight is refused). ``created_at``/``last_accessed`` are ``now``;
    ``metadata["aaak"]`` keeps the document's date and title. The lenient reader's
    warnings (a malformed line it skipped, ...) go to ``report.warnings``.

    Raises:
        ImportFormatError: the text is not AAAK (or, with ``strict``, malformed), or a
            zettel cannot be a node (empty id, non-finite weight, negative offset).
    """
    if hasattr(source, "read"):
        source = source.read()
    try:
        result = decode(source, strict=strict)
    except AAAKParseError as exc:
        raise ImportFormatError(f"not a readable AAAK document: {exc.message}",
                                hint=exc.hint) from None
    if report is not None:  # each is a line the reader skipped or read otherwise than it says
        report.warnings.extend(str(w) for w in result.meta.get("warnings") or ())
    ts = now_ts(now)
    text_source = result.meta.get("source")
    doc = {k: result.meta[k] for k in ("date", "title") if isinstance(result.meta.get(k), str)}
    if result.entity_index.code_to_name:
        yield EntityTable(dict(result.entity_index.code_to_name))
    for z in result.zettels:
        content = z.quote
        if (isinstance(text_source, str) and z.source_start is not None and z.source_end is not None
                and 0 <= z.source_start <= z.source_end <= len(text_source)):
            content = text_source[z.source_start:z.source_end]
        try:
            yield Node(
                id=id_prefix + z.id, content=content, entities=tuple(z.entities), topics=tuple(z.topics),
                quote=z.quote, weight=z.weight, flags=tuple(f for f in z.flags if f in ALL_FLAGS),
                emotions=tuple(e for e in z.emotions if e in ALL_EMOTIONS), source_start=z.source_start,
                source_end=z.source_end, resolved_date=z.resolved_date, created_at=ts, last_accessed=ts,
                importance=min(1.0, max(0.0, z.weight)) if math.isfinite(z.weight) else 0.5,
                source="import:aaak", metadata={"aaak": doc} if doc else {},
            )
        except ValidationError as exc:
            raise ImportFormatError(f"zettel {z.id!r} cannot be imported: {exc.message}") from None
    for t in result.tunnels:
        try:
            yield Edge(id_prefix + t.from_id, id_prefix + t.to_id, "tunnel", label=t.label, created_at=ts)
        except ValidationError as exc:
            raise ImportFormatError(f"tunnel {t.from_id!r}<->{t.to_id!r} cannot be imported: {exc.message}") from None


# --- JSONL of Trace-Lite Memory objects ---------------------------------------------


def _parse_time(value: Any, name: str, default: float) -> float:
    """ISO 8601 strings (Trace-Lite) or numbers in milliseconds (JavaScript Date.now())."""
    if value is None:
        return default
    if isinstance(value, bool):
        raise ValidationError(f"{name} must be an ISO 8601 string or milliseconds")
    if isinstance(value, (int, float)):
        return float(value) / 1000.0
    if isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValidationError(f"{name} {value[:40]!r} is not an ISO 8601 date") from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=timezone.utc)
        return dt.timestamp()
    raise ValidationError(f"{name} must be an ISO 8601 string or milliseconds")


def _format_time(ts: float) -> str | float | None:
    try:
        dt = datetime.fromtimestamp(ts, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        # Out of datetime's range: milliseconds (which _parse_time also reads), or null when even
        # that overflows; the engramdb block keeps the exact value either way.
        ms = ts * 1000.0
        return ms if math.isfinite(ms) else None
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _vector(value: Any, name: str) -> list[float] | None:
    """A JSON embedding: a list, or the {"0": x, "1": y} object JSON.stringify makes of a Float32Array."""
    if value is None:
        return None
    if isinstance(value, dict):
        try:
            keys = sorted(value, key=int)
        except (TypeError, ValueError):
            raise ValidationError(f"{name} must be a list of numbers") from None
        if keys != [str(i) for i in range(len(keys))]:
            raise ValidationError(f"{name} has gaps in its indexes")
        value = [value[k] for k in keys]
    if not isinstance(value, list) or not value:
        raise ValidationError(f"{name} must be a non-empty list of numbers")
    for x in value:
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise ValidationError(f"{name} must contain only numbers")
    return [float(x) for x in value]


_ONE_MEMORY_A_LINE = ("write one memory object a line (JSON Lines), e.g. `jq -c '.[]' FILE` for an array, "
                      "`jq -c '.memories[]' FILE` for {\"memories\": [...]}")


def _not_one_document(obj: Any) -> None:
    """Refuse a first line that is a whole JSON document rather than a memory: before, it
    was called a memory without an id, which did not say what was wrong."""
    if isinstance(obj, dict) and "id" not in obj:
        if isinstance(obj.get("zettels"), list):
            raise ImportFormatError("line 1 is a zettel-compress compress() result (JSON), not a memory",
                                    hint="import its AAAK text (zettel-compress encode(), or `engramdb.encode`) or "
                                         "run `engramdb ingest` on the source text")
        if isinstance(obj.get("memories"), list):
            raise ImportFormatError("line 1 is one JSON document holding a list of memories, not JSON Lines",
                                    hint=_ONE_MEMORY_A_LINE)


def _memory_to_node(obj: Any, space: str, now: float, id_prefix: str) -> Node:
    if not isinstance(obj, dict):
        raise ValidationError("each line must be a JSON object (a Memory)")
    block = obj.get(_ENGRAMDB_BLOCK)
    if isinstance(block, dict) and block.get("v") == _EXPORT_VERSION and isinstance(block.get("node"), dict):
        # Written by export_jsonl: the block has every field exactly; content and metadata live
        # in the Memory fields so Trace-Lite sees them.
        fields = dict(block["node"])
        fields["content"] = obj.get("content", "")
        fields["metadata"] = obj.get("metadata") or {}
        fields["id"] = id_prefix + str(fields.get("id", ""))
        if "tags" in fields:
            fields["tags"] = _without_blank_tags(fields["tags"])
        return Node.from_dict(fields)
    if not _NODE_ONLY_KEYS.isdisjoint(obj) and _MEMORY_ONLY_KEYS.isdisjoint(obj):
        return _node_line(obj, now, id_prefix)
    mem_id = obj.get("id")
    if isinstance(mem_id, bool) or not isinstance(mem_id, (str, int)) or mem_id == "":
        raise ValidationError("a Memory needs a non-empty string id")
    embedding = _vector(obj.get("embedding"), "embedding")
    tier = obj.get("tier", "hot")
    if isinstance(tier, str):
        tier = tier.lower()
    importance = obj.get("importance", 0.5)
    tags: Any = _without_blank_tags(obj.get("tags") or [])  # JSON as read: Node's checks refuse what is not a list of strings
    metadata = obj.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise ValidationError("metadata must be an object")
    created = _parse_time(obj.get("createdAt"), "createdAt", now)
    return Node(
        id=id_prefix + str(mem_id), content=obj.get("content", ""), tags=tags, importance=importance,
        tier=tier, created_at=created,
        last_accessed=_parse_time(obj.get("lastAccessed"), "lastAccessed", created),
        access_count=obj.get("accessCount", 0), source=obj.get("source") or "",
        metadata=metadata, embeddings={space: tuple(embedding)} if embedding is not None else {},
    )


# engramdb's own field names (`engramdb list --json`, `get --json`, Node.to_dict()) that a
# Trace-Lite Memory does not have: a line with any of them is read with engramdb's names.
# Read as a Memory, its created_at, pinned, entities, weight, ... were dropped without a word.
_NODE_FIELDS = frozenset(Node.__dataclass_fields__)
_NODE_ONLY_KEYS = _NODE_FIELDS - {"id", "content", "tags", "importance", "tier", "source", "metadata"}
# A Trace-Lite Memory's own field names: a line with any of them is a Memory, read as before
# the engramdb shape existed (keys a Memory does not have are ignored, ``weight`` or ``pinned``
# included), so a Trace-Lite export with extra keys of its own keeps importing.
_MEMORY_ONLY_KEYS = frozenset({"createdAt", "lastAccessed", "accessCount", "embedding"})


def _node_line(obj: dict[str, Any], now: float, id_prefix: str) -> Node:
    """A line in engramdb's field names (timestamps ISO 8601 or seconds; ``archived`` as
    ``list --json`` prints it)."""
    unknown = sorted(set(obj) - _NODE_FIELDS - {"archived"})
    if unknown:
        raise ValidationError(f"the line mixes engramdb's field names with unknown keys {', '.join(unknown)[:80]}",
                              hint="use one shape a line: engramdb's fields (as `engramdb list --json` prints "
                                   "them) or a Trace-Lite Memory (createdAt, accessCount, embedding)")
    if obj.get("archived") is True or ARCHIVE_KEY in (obj.get("metadata") or {}):
        raise ValidationError("an archived memory's preview (its full text is not in the line)",
                              hint="write the file with `engramdb export` (archived memories whole) or "
                                   "`engramdb get --full --json`")
    fields = {k: v for k, v in obj.items() if k != "archived"}
    mem_id = fields.get("id")
    if isinstance(mem_id, bool) or not isinstance(mem_id, (str, int)) or mem_id == "":
        raise ValidationError("a memory needs a non-empty string id")
    fields["id"] = id_prefix + str(mem_id)
    for name, default in (("created_at", now), ("last_accessed", None)):
        value = fields.get(name)
        if isinstance(value, str):  # as `list --json` prints them; numbers are seconds, as in Node
            fields[name] = _parse_time(value, name, now)
        elif value is None:
            fields[name] = fields.get("created_at", now) if default is None else default
    if "tags" in fields:
        fields["tags"] = _without_blank_tags(fields["tags"])
    if fields.get("metadata") is None:
        fields["metadata"] = {}
    if fields.get("embeddings") is None:
        fields["embeddings"] = {}
    return Node.from_dict(fields)


def _without_blank_tags(tags: Any) -> Any:
    """``tags`` without its empty or blank strings, when it is a list: the write API refuses
    them, and an older engramdb's export or a foreign source may hold them (taken before
    session 8), so one such tag must not refuse the whole import."""
    if isinstance(tags, list):
        return [t for t in tags if not isinstance(t, str) or t.strip()]
    return tags


def iter_jsonl(
    source: str | bytes | TextIO | BinaryIO, *, space: str = "default", now: float | None = None,
    id_prefix: str = "", max_line_chars: int = _MAX_JSONL_LINE, dims: Mapping[str, int] | None = None,
) -> Iterator[Node]:
    """One node per JSONL line of Trace-Lite ``Memory`` objects.

    Field mapping: ``id``, ``content``, ``tags``, ``importance``, ``tier``, ``accessCount``,
    ``source``, ``metadata`` map to the node fields of the same meaning; ``createdAt`` /
    ``lastAccessed`` are ISO 8601 strings (or JavaScript milliseconds); ``embedding`` goes
    into the space ``space``. A line with engramdb's own field names (``created_at``,
    ``pinned``, ``embeddings``, ... as ``engramdb list --json`` prints them; timestamps ISO 8601
    or seconds) and none of a Memory's own (``createdAt``, ``lastAccessed``, ``accessCount``,
    ``embedding``) is read with those names, every field kept. Blank lines are skipped. Lines written by
    :func:`export_jsonl` are restored exactly, but for blank tags (an older
    engramdb stored them; the write API refuses them), which are left out, as they are
    from any line.

    ``dims``: the dimensions of the target store's spaces (name -> dims), so that an
    embedding of another length is refused naming its line, as one that disagrees with an
    earlier line is.

    Raises:
        ImportFormatError: a line that is not JSON, is too long, or is not a valid Memory
            (the message names the line).
    """
    if isinstance(source, (bytes, bytearray)):
        source = io.BytesIO(bytes(source))
    if isinstance(source, str):
        source = io.StringIO(source)
    wrapper: io.TextIOWrapper | None = None
    if isinstance(source, (io.RawIOBase, io.BufferedIOBase)) or "b" in getattr(source, "mode", ""):
        # a binary stream (an open mode with "b" is one, whatever its class)
        wrapper = io.TextIOWrapper(cast(BinaryIO, source), encoding="utf-8", errors="strict", newline="")
    try:
        yield from _jsonl_lines(wrapper or cast(TextIO, source), space, now_ts(now), id_prefix, max_line_chars,
                                dims or {})
    finally:
        if wrapper is not None:  # give the caller's binary file back open
            try:
                wrapper.detach()
            except (ValueError, OSError):
                pass


_TOO_LARGE_HINT = ("numbers must fit a float (magnitude below about 1.8e308): correct the value on the line named "
                   "(an embedding value, a timestamp or the importance)")


def _jsonl_lines(source: TextIO, space: str, ts: float, id_prefix: str, max_line_chars: int,
                 target_dims: Mapping[str, int]) -> Iterator[Node]:
    lineno = 0
    # space -> (dims, line) of the source's first embedding in it (line 0: the target store's
    # space): a later line of another length failed only at insert time, with a message that
    # named no line.
    first_dims: dict[str, tuple[int, int]] = {name: (n, 0) for name, n in target_dims.items()}
    while True:
        try:
            line = source.readline(max_line_chars + 1)
        except UnicodeDecodeError as exc:
            raise ImportFormatError(f"line {lineno + 1}: not UTF-8 ({exc.reason})") from None
        if not line:
            return
        lineno += 1
        if lineno == 1 and line.startswith("\ufeff"):  # a BOM (Notepad, PowerShell), as detect_format allows
            line = line[1:]
        if len(line) > max_line_chars:
            raise ImportFormatError(f"line {lineno} is longer than {max_line_chars} characters")
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if lineno == 1:
                _not_one_document(obj)
            if isinstance(obj, dict) and isinstance(obj.get(_ENGRAMDB_BLOCK), dict):
                obj = tjson_untag(obj)
            node = _memory_to_node(obj, space, ts, id_prefix)
        except RecursionError:
            raise ImportFormatError(f"line {lineno}: JSON nests too deeply") from None
        except AAAKParseError as exc:
            raise ImportFormatError(f"line {lineno}: {exc.message}") from None
        except json.JSONDecodeError as exc:
            if lineno == 1 and line.strip() in ("{", "["):
                raise ImportFormatError("line 1: the source is one JSON document over many lines, not JSON Lines",
                                        hint=_ONE_MEMORY_A_LINE) from None
            raise ImportFormatError(f"line {lineno}: {exc}") from None
        except OverflowError:  # an integer beyond float range (JSON has no size limit)
            raise ImportFormatError(f"line {lineno}: a number is too large for a float",
                                    hint=_TOO_LARGE_HINT) from None
        except (ValueError, TypeError) as exc:  # JSONDecodeError and ValidationError are
            # ValueErrors; OverflowError: an integer beyond float range (JSON has no size limit)
            message = exc.message if isinstance(exc, EngramError) else str(exc)
            # a hint the line's check wrote for this case says what to do; the generic one does not
            hint = exc.hint if isinstance(exc, EngramError) and exc.hint != type(exc).default_hint else None
            raise ImportFormatError(f"line {lineno}: {message}", hint=hint) from None
        for name, vec in sorted(node.embeddings.items()):
            dims, where = first_dims.setdefault(name, (len(vec), lineno))
            if len(vec) != dims and not where:
                raise ImportFormatError(
                    f"line {lineno}: an embedding of {len(vec)} values, but space {name!r} of the target store has "
                    f"{dims} dims",
                    hint=f"every embedding of a space must have the same length (one model): fix or drop line "
                         f"{lineno}'s embedding, or import into a space of its own with --space NAME")
            if len(vec) != dims:
                raise ImportFormatError(
                    f"line {lineno}: an embedding of {len(vec)} values, but space {name!r} has {dims} dims "
                    f"(set by line {where})",
                    hint=f"every embedding of a space must have the same length (one model): fix or drop line "
                         f"{lineno}'s embedding, or import the other model's memories on their own with --space")
        yield node


def export_jsonl(nodes: Iterable[Node], fp: TextIO | BinaryIO, *, space: str | None = None) -> int:
    """Write nodes as JSONL Trace-Lite ``Memory`` objects (one per line, keys sorted).

    ``embedding`` is the vector of ``space`` (default: the node's only or first space by
    name; ``null`` when it has none); timestamps are ISO 8601 with milliseconds. An extra
    ``engramdb`` key carries every other field exactly, so :func:`iter_jsonl` gives back
    the same nodes; metadata bytes are written as ``{"$bytes": base64}``.

    All or nothing: when a node is refused (or anything else raises, reading ``nodes``
    included), ``fp`` is left as it was. A seekable ``fp`` positioned at its end (a file
    opened to write, ``io.StringIO``) is written line by line and cut back to where it
    started; to anything else (a pipe, a terminal, a file appended to through ``>>``) the
    lines are written once every node is made, so they are held in memory.

    An archived memory's stub (``db.scan()`` gives them) is refused unless it was archived
    with truncation (it has no original): its line would lose the text past the preview and
    import as a memory ``verify`` reports as damaged. Pass the memory as it was before
    archiving, as ``engramdb export`` does:
    ``export_jsonl((db.get(n.id, full=True) if n.archived else n for n in db.scan()), fp)``.

    Returns:
        The number of lines written.

    Raises:
        ValidationError: something that is not a Node, or a stub of a non-truncating archive
            (nothing is written).
    """
    binary = isinstance(fp, (io.RawIOBase, io.BufferedIOBase)) or "b" in getattr(fp, "mode", "")

    def write(line: str) -> None:
        if binary:
            cast(BinaryIO, fp).write(line.encode("utf-8"))
        else:
            cast(TextIO, fp).write(line)

    lines = export_lines(nodes, space=space)
    start = _rewind_point(fp)
    count = 0
    try:
        if start is None:
            lines = iter(list(lines))  # what is written cannot be taken back: every line made first
        for line in lines:
            write(line)
            count += 1
    except BaseException as err:
        if start is not None:
            try:
                fp.seek(start)
                fp.truncate()
            except (OSError, ValueError):  # the first error is the one to report
                raise err from None
        elif count:  # the write itself failed part-way: nothing to take back with
            raise
        if isinstance(err, EngramError):
            err.hint = "nothing was written; " + err.hint if err.hint else "nothing was written"
        raise
    return count


def _rewind_point(fp: Any) -> int | None:
    """Where ``fp``'s writes start, when cutting it back there after an error loses nothing it
    held before: a seekable ``fp`` positioned at its end. None otherwise: a pipe or terminal, a
    file opened in the middle ("r+"), or one whose writes go elsewhere than its position (a
    file opened for appending, as a shell's ``>>`` gives stdout, reports position 0)."""
    try:
        if not fp.seekable():
            return None
        fp.flush()
        position: int = fp.tell()
        end = fp.seek(0, io.SEEK_END)
        if end != position:
            fp.seek(position)
            return None
        return position
    except (AttributeError, ValueError, OSError):  # a duck-typed writer, or a closed file: not ours to seek
        return None


def export_lines(nodes: Iterable[Node], *, space: str | None = None) -> Iterator[str]:
    """The lines :func:`export_jsonl` writes for ``nodes`` (each ending in a newline), one
    node at a time: for a caller streaming an export itself (``engramdb export``), which
    then writes what came before an error.

    Raises:
        ValidationError: as :func:`export_jsonl`, when the node is reached.
    """
    for node in nodes:
        if not isinstance(node, Node):
            raise ValidationError(f"export_jsonl takes Node objects, got {type(node).__name__}")
        if node.archived and node.metadata[ARCHIVE_KEY].get("truncated") is not True:
            raise ValidationError(f"memory {shown(node.id)} is an archived stub; its line would lose the archived text",
                                  hint="export db.get(id, full=True) for an archived memory, "
                                       "as `engramdb export` does: export_jsonl((db.get(n.id, full=True) if "
                                       "n.archived else n for n in db.scan()), fp)")
        chosen = space if space is not None else (sorted(node.embeddings)[0] if node.embeddings else None)
        vec = node.embeddings.get(chosen) if chosen is not None else None
        block = node.to_dict()
        del block["content"], block["metadata"]
        record = {
            "id": node.id, "content": node.content, "embedding": vec.tolist() if vec is not None else None,
            "tags": list(node.tags), "importance": node.importance, "tier": node.tier,
            "createdAt": _format_time(node.created_at), "lastAccessed": _format_time(node.last_accessed),
            "accessCount": node.access_count, "source": node.source, "metadata": dict(node.metadata),
            _ENGRAMDB_BLOCK: {"v": _EXPORT_VERSION, "node": block},
        }
        yield tjson_dumps(record) + "\n"


# --- Terronex .engram v1 ------------------------------------------------------------


# the source's own passphrase, apart from the store's (and a Terronex file has no recovery key)
_TX_PASSPHRASE_HINT = ("give the Terronex file's own passphrase: $ENGRAM_SOURCE_PASSPHRASE or "
                       "--source-passphrase-file (passphrase= in Python), not the store's")


def _tx_key(passphrase: str | bytes, salt: bytes, kdf: str) -> bytes:
    secret = passphrase.encode("utf-8") if isinstance(passphrase, str) else bytes(passphrase)
    if not secret:
        raise ValidationError("the passphrase is empty")
    if kdf == "argon2id":
        from argon2.low_level import Type, hash_secret_raw

        if len(salt) < 8:  # argon2 refuses it with its own HashingError
            raise ImportFormatError("the encrypted Terronex header has a salt shorter than 8 bytes",
                                    hint="the file is damaged; use an undamaged copy")

        return hash_secret_raw(secret=secret, salt=salt, hash_len=32, type=Type.ID, version=19, **_TX_ARGON2)
    return hashlib.pbkdf2_hmac("sha256", secret, salt, _TX_PBKDF2_ITERATIONS, 32)


def _jsonable(value: Any, depth: int = 0) -> Any:
    """Make a msgpack value fit node metadata (str keys, 64-bit ints, no ext types)."""
    import msgpack

    if depth > 30:
        return None
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): _jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, depth + 1) for v in value]
    if isinstance(value, msgpack.ExtType):
        return {"ext": value.code, "data": value.data}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool, bytes)):
        return value
    return repr(value)


# The smallest normal float32. A model's embedding never holds subnormal values; bytes that
# msgpackr's default packing took from the wrong place in memory usually do.
_F32_TINY = float(np.finfo(np.float32).tiny)
_MAX_PLAUSIBLE = 1e6
_MIN_NORM = 1e-6


@dataclass
class ImportReport:
    """What an import left out: ``bad_embeddings`` holds ``(node id, reason)`` for every
    Terronex embedding dropped under ``skip_bad_embeddings=True``; ``warnings`` the lenient
    AAAK reader's messages (``meta["warnings"]``: a malformed line skipped, a header count
    that does not match, ...), one per line."""

    bad_embeddings: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _tx_embedding(value: Any) -> tuple[np.ndarray | None, str]:
    """An embedding as msgpackr writes it, and how it was stored: ``"bin"`` (raw float32
    bytes), ``"list"`` (numbers) or ``"ext"`` (msgpackr's typed-array extension 0x74).

    Raises:
        ValidationError: it cannot be read as floats at all (the caller reports it).
    """
    import msgpack

    if value is None:
        return None, ""
    if isinstance(value, msgpack.ExtType):
        # msgpackr's typed-array extension: first byte = typed-array kind (7 Float32, 8 Float64).
        if value.code != 0x74 or not value.data or value.data[0] not in (7, 8):
            raise ValidationError(f"unsupported embedding encoding (msgpack ext {value.code})")
        dtype = np.dtype("<f4" if value.data[0] == 7 else "<f8")
        if (len(value.data) - 1) % dtype.itemsize:
            raise ValidationError("embedding bytes are not a whole number of floats")
        with np.errstate(over="ignore", invalid="ignore"):
            return np.frombuffer(value.data[1:], dtype=dtype).astype(np.float32), "ext"
    if isinstance(value, (bytes, bytearray)):
        if len(value) % 4:
            raise ValidationError(f"{len(value)} embedding bytes are not a whole number of float32 values")
        return np.frombuffer(bytes(value), dtype="<f4"), "bin"
    if isinstance(value, (dict, list)):  # a number list, or a Float32Array that went through JSON
        with np.errstate(over="ignore", invalid="ignore"):  # out-of-range values become inf: reported below
            return np.asarray(_vector(value, "embedding"), dtype=np.float32), "list"
    raise ValidationError(f"unsupported embedding type {type(value).__name__}")


def _embedding_problem(vec: np.ndarray, how: str, dims: int | None) -> str | None:
    """Why an embedding cannot be imported as it is, or None (spec/aaak.md section 7)."""
    if dims is not None and vec.size != dims:
        return f"{vec.size} values where the file declares {dims} dimensions"
    if not np.isfinite(vec).all():
        return "values that are not finite numbers"
    if how == "bin":
        # Raw float32 bytes: the path msgpackr's default settings take for a Float32Array, and
        # the one that damages it. Accept them only when they look like an embedding.
        mags = np.abs(vec.astype(np.float64))
        if ((mags > 0) & (mags < _F32_TINY)).any() or (mags > _MAX_PLAUSIBLE).any() \
                or float(np.sqrt((mags ** 2).sum())) < _MIN_NORM:
            return ("float32 bytes that are not an embedding (subnormal, huge or all-zero values: a Float32Array "
                    "that msgpackr's default settings damaged)")
    return None


_TX_LINK_KINDS = {"related": "related", "contradicts": "contradicts", "supersedes": "supersedes",
                  "elaborates": "derived_from", "summarizes": "derived_from", "references": "related",
                  "causes": "related", "derived_from": "derived_from"}


def _ms(value: Any, default: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return default
    return float(value) / 1000.0


def _tx_node(raw: Any, space: str, id_prefix: str, entity_names: dict[str, list[str]],
             embedding: np.ndarray | None) -> Node:
    if not isinstance(raw, dict):
        raise ValidationError("a node must be a map")
    nid = raw.get("id")
    if not isinstance(nid, str) or not nid:
        raise ValidationError("a node needs a non-empty string id")
    content = raw.get("content") or {}
    if not isinstance(content, dict):
        content = {"type": "text", "data": content}
    data = content.get("data", "")
    temporal = raw.get("temporal") or {}
    quality = raw.get("quality") or {}
    meta = raw.get("metadata") or {}
    if not isinstance(temporal, dict) or not isinstance(quality, dict) or not isinstance(meta, dict):
        raise ValidationError("temporal, quality and metadata must be maps")
    created = _ms(temporal.get("created"), 0.0)
    tier = temporal.get("decayTier", "hot")
    score = quality.get("score", 0.5)
    extra = {k: v for k, v in content.items() if k != "data"}
    terronex = {
        "content": extra, "parent_id": raw.get("parentId"), "children": raw.get("children"),
        "depth": raw.get("depth"), "path": raw.get("path"), "embedding_model": raw.get("embeddingModel"),
        "temporal": temporal, "quality": quality,
        "metadata": {k: v for k, v in meta.items() if k not in ("tags", "custom")},
    }
    for key in ("position", "confidence"):  # format 2.x node fields
        if key in raw:
            terronex[key] = raw[key]
    if not isinstance(data, str):
        terronex["data"] = data  # binary content (image, audio) is kept, not dropped
        data = ""
    metadata: dict[str, Any] = {"terronex": _jsonable(terronex)}
    if meta.get("custom") is not None:
        metadata["custom"] = _jsonable(meta["custom"])
    tags = meta.get("tags") or []
    source_file = meta.get("sourceFile")
    # a float32 array: Node freezes any 1-D array into its tuple of floats
    embeddings: dict[str, Any] = {space: embedding} if embedding is not None and embedding.size else {}
    return Node(
        id=id_prefix + nid, content=data, entities=tuple(entity_names.get(nid, ())),
        tier=tier if tier in TIERS else "hot",
        importance=float(score) if isinstance(score, (int, float)) and not isinstance(score, bool)
        and math.isfinite(score) else 0.5,
        created_at=created, last_accessed=_ms(temporal.get("accessed"), created),
        tags=tuple(t for t in tags if isinstance(t, str) and t.strip()) if isinstance(tags, list) else (),
        source=source_file if isinstance(source_file, str) else "import:terronex",
        metadata=metadata, embeddings=embeddings,
    )


def _declared_dims(header: dict[Any, Any]) -> int | None:
    """The embedding dimensions a Terronex header declares: ``embedding.dimensions`` (2.x),
    else ``schema.embeddingDims`` (1.x)."""
    for section, key in (("embedding", "dimensions"), ("schema", "embeddingDims")):
        part = header.get(section)
        value = part.get(key) if isinstance(part, dict) else None
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # msgpackr writes some integers as float64
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def iter_terronex(
    source: bytes | BinaryIO, *, passphrase: str | bytes | None = None, space: str = "default",
    id_prefix: str = "", verify_integrity: bool = True, max_bytes: int = _MAX_TERRONEX_BYTES,
    skip_bad_embeddings: bool = False, report: ImportReport | None = None,
) -> Iterator[ImportItem]:
    """Nodes of a Terronex ``.engram`` file (format 1.x or 2.x), then its links and
    hierarchy as edges.

    Layout (read-only): ``ENGRAM`` | major (1 or 2) | minor | u32 LE header length |
    msgpack header | payload, where the payload is msgpack ``{nodes, entities, links,
    deltas}``, or AES-256-GCM ciphertext‖tag of it with a key from argon2id (t=3,
    m=64 MiB, p=1) or PBKDF2-SHA256 (100,000 iterations) over the header's salt. The
    header's unkeyed SHA-256 ``integrity`` of the stored payload is checked first. Format
    2.x (the writer of ``@terronex/engram`` 2.x) has the same layout; its header adds
    ``embedding`` (model, dimensions, provider), its nodes ``position`` and ``confidence``
    (kept under ``metadata["terronex"]``), its links the types ``supports``,
    ``derived_from`` and ``similar_to``.

    Mapping: ``content.data`` → content (binary data is kept in metadata), ``embedding``
    → the ``space`` vector, ``temporal.created/accessed`` (ms) → ``created_at`` /
    ``last_accessed``, ``decayTier`` → tier, ``quality.score`` → importance,
    ``metadata.tags`` → tags, ``metadata.sourceFile`` → source, entity mentions → the
    node's entities, the rest under ``metadata["terronex"]``. Links become edges
    (``related``/``contradicts``/``supersedes``/``derived_from``; ``elaborates``/
    ``summarizes`` → ``derived_from``; ``follows`` → ``precedes`` reversed; others
    ``related`` with the type as label; ``bidirectional`` adds the reverse edge);
    ``parentId`` gives a ``part_of`` edge from child to parent.

    Embeddings are checked before anything is yielded: one that does not decode to the
    declared dimensions (``embedding.dimensions`` or ``schema.embeddingDims``; else those
    of the file's first good embedding), to finite numbers, or, when stored as raw float32
    bytes, to values an embedding can hold (no subnormal or huge values, not all zero:
    msgpackr's default settings damage a ``Float32Array`` that way) is reported with its
    node id.

    Args:
        skip_bad_embeddings: import such nodes without their embedding instead of stopping;
            ``report.bad_embeddings`` then lists them.
        report: filled with what was left out.

    Raises:
        ImportFormatError: not a Terronex 1.x/2.x file, damaged, an unreadable record, or
            bad embeddings (unless ``skip_bad_embeddings``); the message names the nodes.
        ModeMismatchError: the file is encrypted and no passphrase was given.
        WrongPassphraseError: the passphrase does not decrypt the payload.
    """
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    data = _read_all(source, max_bytes)
    if not data.startswith(TERRONEX_MAGIC):
        raise ImportFormatError("not a Terronex .engram file (no ENGRAM magic)")
    if len(data) < 12:
        raise ImportFormatError("the Terronex file is truncated (header)")
    major, minor, header_len = data[6], data[7], struct.unpack_from("<I", data, 8)[0]
    if major not in (1, 2):
        raise ImportFormatError(f"Terronex format version {major}.{minor} is not supported (1.x and 2.x are)",
                                hint="export JSONL from it with the Terronex tools and import that")
    if 12 + header_len > len(data):
        raise ImportFormatError("the Terronex file is truncated (header length beyond the end)")
    try:
        header = _tx_unpack(data[12:12 + header_len])
    except _TooBig as exc:
        raise ImportFormatError(f"the Terronex header {exc}", hint=_BOMB_HINT) from None
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise ImportFormatError(f"the Terronex header is not valid msgpack: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("security"), dict):
        raise ImportFormatError("the Terronex header has no security section")
    security = header["security"]
    payload = data[12 + header_len:]
    integrity = security.get("integrity")
    if (verify_integrity and isinstance(integrity, (bytes, bytearray)) and len(integrity) == 32
            and hashlib.sha256(payload).digest() != bytes(integrity)):
        raise ImportFormatError("Terronex integrity check failed: the file is damaged",
                                hint="use an undamaged copy, or pass verify_integrity=False to try anyway")
    if security.get("encrypted"):
        if passphrase is None:
            raise ModeMismatchError("this Terronex file is encrypted", hint=_TX_PASSPHRASE_HINT)
        salt, nonce = security.get("salt"), security.get("nonce")
        if not isinstance(salt, (bytes, bytearray)) or not isinstance(nonce, (bytes, bytearray)) or len(nonce) != 12:
            raise ImportFormatError("the encrypted Terronex header lacks a salt or a 12-byte nonce")
        kdf = "argon2id" if security.get("kdf") == "argon2id" else "pbkdf2"
        key = _tx_key(passphrase, bytes(salt), kdf)
        try:
            payload = AESGCM(key).decrypt(bytes(nonce), payload, None)
        except InvalidTag:
            raise WrongPassphraseError("the passphrase does not decrypt this Terronex file (or it is damaged)",
                                       hint=_TX_PASSPHRASE_HINT) from None
        except ValueError as exc:
            raise ImportFormatError(f"the Terronex payload cannot be decrypted: {exc}") from None
    try:
        body = _tx_unpack(payload)
    except _TooBig as exc:
        raise ImportFormatError(f"the Terronex payload {exc}", hint=_BOMB_HINT) from None
    except Exception as exc:
        raise ImportFormatError(f"the Terronex payload is not valid msgpack: {exc}") from None
    if not isinstance(body, dict) or not isinstance(body.get("nodes", []), list):
        raise ImportFormatError("the Terronex payload has no node list")
    for name in ("entities", "links"):
        if not isinstance(body.get(name) or [], list):
            raise ImportFormatError(f"the Terronex payload's {name} is not a list",
                                    hint="the file is damaged or not a Terronex file; use an undamaged copy")
    entity_names: dict[str, list[str]] = {}
    for ent in body.get("entities") or []:
        if not isinstance(ent, dict) or not isinstance(ent.get("name"), str):
            continue
        mentions = ent.get("mentions")
        for mention in mentions if isinstance(mentions, list) else ():
            if isinstance(mention, dict) and isinstance(mention.get("nodeId"), str):
                names = entity_names.setdefault(mention["nodeId"], [])
                if ent["name"] not in names:
                    names.append(ent["name"])
    nodes, parents = _tx_nodes(body.get("nodes") or [], _declared_dims(header), space, id_prefix, entity_names,
                               skip_bad_embeddings, report)
    yield from nodes
    for child, parent, created in parents:
        yield Edge(child, parent, "part_of", created_at=created)
    for index, link in enumerate(body.get("links") or []):
        try:
            yield from _tx_edges(link, id_prefix)
        except ValidationError as exc:
            raise ImportFormatError(f"Terronex link #{index}: {exc.message}") from None


_BOMB_HINT = ("a Terronex file written by Terronex stays far within these limits (the AAAK specification's "
              "'Limits on hostile input'); this one was made to expand: do not import it")


class _TooBig(Exception):
    """A msgpack document holds more containers or longer ones than its size honestly needs."""


def _tx_unpack(data: bytes) -> Any:
    """Msgpack decoding bounded by the input's size (issue 16 finding 8: a 50 MB msgpack bomb took 3.5 GB).

    Each byte of msgpack can become a 56-64 byte Python list or dict (``0x80`` is an empty
    map), so besides the per-container caps (a string, bin or ext at most the input's
    length; an array at most one element per 2 bytes; a map one entry per 4 bytes), the
    number of arrays and maps is capped at one per 16 input bytes (plus 64): a real
    Terronex node is a map of several fields with text, far more than 16 bytes per container.
    """
    import msgpack

    size = len(data)
    budget = [size // 16 + 64]

    def count(value: Any) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise _TooBig(f"holds more than {size // 16 + 64} arrays and maps for its {size} bytes")
        return value

    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True,
                               max_str_len=size, max_bin_len=size, max_ext_len=size,
                               max_array_len=size // 2 + 16, max_map_len=size // 4 + 16,
                               list_hook=count, object_hook=count)
    except ValueError as exc:
        if "exceeds max" in str(exc):  # msgpack's message for a container beyond the caps
            raise _TooBig(f"declares a container too large for its {size} bytes ({exc})") from None
        raise


def _tx_nodes(raws: list[Any], dims: int | None, space: str, id_prefix: str, entity_names: dict[str, list[str]],
              skip_bad: bool, report: ImportReport | None) -> tuple[list[Node], list[tuple[str, str, float]]]:
    """Every node, its embedding checked; bad embeddings stop the import or are left out."""
    nodes: list[Node] = []
    parents: list[tuple[str, str, float]] = []
    bad: list[tuple[str, str]] = []
    for index, raw in enumerate(raws):
        nid = raw.get("id") if isinstance(raw, dict) else None
        name = nid if isinstance(nid, str) and nid else f"#{index}"
        embedding = None
        if isinstance(raw, dict):
            try:
                embedding, how = _tx_embedding(raw.get("embedding"))
                problem = None if embedding is None else _embedding_problem(embedding, how, dims)
            except ValidationError as exc:
                problem = exc.message
            if problem is not None:
                bad.append((name, problem))
                embedding = None
            elif embedding is not None and dims is None and embedding.size:
                dims = embedding.size  # no declared dimensions: the first good embedding sets them
        try:
            node = _tx_node(raw, space, id_prefix, entity_names, embedding)
        except ValidationError as exc:
            raise ImportFormatError(f"Terronex node {name}: {exc.message}") from None
        parent = raw.get("parentId")
        if isinstance(parent, str) and parent:
            parents.append((node.id, id_prefix + parent, node.created_at))
        nodes.append(node)
    if bad and not skip_bad:
        listed = "; ".join(f"node {nid}: {why}" for nid, why in bad[:5])
        more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
        raise ImportFormatError(
            f"{len(bad)} embedding(s) cannot be imported as they are: {listed}{more}",
            hint="nothing was imported; pass --skip-bad-embeddings (skip_bad_embeddings=True) to import these "
                 "memories without their embeddings",
        )
    if report is not None:
        report.bad_embeddings.extend(bad)
    return nodes, parents


def _tx_edges(link: Any, id_prefix: str) -> Iterator[Edge]:
    if not isinstance(link, dict):
        raise ValidationError("a link must be a map")
    src, dst, kind = link.get("sourceId"), link.get("targetId"), link.get("type", "related")
    if not isinstance(src, str) or not isinstance(dst, str):
        raise ValidationError("a link needs sourceId and targetId strings")
    if not isinstance(kind, str):
        raise ValidationError("a link type must be a string")
    weight = link.get("confidence", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        weight = 1.0
    created = _ms(link.get("created"), 0.0)
    src, dst = id_prefix + src, id_prefix + dst
    if kind == "follows":  # "A follows B" is "B precedes A"
        pairs = [(dst, src, "precedes", "")]
    else:
        mapped = _TX_LINK_KINDS.get(kind, "related")
        label = "" if kind == mapped else str(kind)
        pairs = [(src, dst, mapped, label)]
    if link.get("bidirectional"):
        pairs.append((pairs[0][1], pairs[0][0], pairs[0][2], pairs[0][3]))
    for a, b, k, label in pairs:
        yield Edge(a, b, k, weight=float(weight), label=label, created_at=created)
