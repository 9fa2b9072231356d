"""Records <-> bytes: versioned msgpack, zstd for large records, size-capped decoding.

A node record is ``codec byte | body``. Codec byte 1 is msgpack; 2 is zstd-compressed
msgpack (used when the packed record is larger than ``ZSTD_THRESHOLD``, where
compression pays for itself). The body is a msgpack array whose first element is the
schema version, so fields can be appended in later versions without breaking old files.

Schema 1 (a memory without vectors, and every record of the first vector layout) ends
with ``{space: float32 LE bytes}``; schema 2 (a memory with vectors) ends with the sorted
list of its spaces, the vectors themselves living once, in the vector blocks
(spec/vectors.md). Schema 3 (what engramdb writes since issue 15) stores the same fields
compactly: the fields at their default are left out and a bit mask says which are there
(``[3, mask, id, created_at, *the others present]``); :func:`record_fields` expands it to
the schema-1/2 array, so every reader sees one shape (spec/file-format.md, "Node record").
"""
from __future__ import annotations

import math
import operator
import struct
import threading
from collections.abc import Callable, Mapping
from typing import Any, cast

import msgpack
import numpy as np
import zstandard

from . import _accel
from .errors import CorruptFileError, ValidationError, shown
from .records import _FIELD_DEFAULTS, STORED, Node

NODE_SCHEMA = 1
NODE_SCHEMA_VECTORS = 2  # the record lists its spaces; the vectors are in the blocks
NODE_SCHEMA_COMPACT = 3  # the fields at their default left out (a mask says which are there)
CODEC_MSGPACK = 1
CODEC_ZSTD = 2
ZSTD_THRESHOLD = 2048
# Caps stop a format bug (or a hostile plaintext file) from becoming a memory bomb. A node
# record holds at most this many bytes (msgpack, before compression): the largest content
# (16 Mi characters, 64 MiB of UTF-8) with an id and its other fields fits; a write of a
# larger record is refused, as its read would be.
MAX_RECORD_BYTES = 64 * 1024 * 1024 + 64 * 1024
_U64 = struct.Struct(">Q")


class ZstdPerThread(threading.local):
    """``compress`` and ``decompress`` of a zstd compressor (``level``) and decompressor of
    the calling thread's own: python-zstandard's objects must not be used by two threads at
    once (one handle's queries run in several threads; a shared decompressor gave them
    CorruptFileError on sound blocks), and making one per call costs a context each time."""

    def __init__(self, level: int) -> None:
        self.compress = zstandard.ZstdCompressor(level=level).compress
        self.decompress = zstandard.ZstdDecompressor().decompress


_compressor = _decompressor = ZstdPerThread(level=3)
_local = threading.local()


def _encode_error(exc: Exception) -> ValidationError:
    """The error for a value msgpack refused; a lone surrogate gets a hint of its own."""
    if isinstance(exc, UnicodeEncodeError) and "surrogate" in exc.reason:
        # half of a UTF-16 pair: a string cut between the two, or bytes decoded with
        # errors="surrogateescape"; UTF-8 (the file's text encoding) cannot hold it
        return ValidationError(
            f"cannot encode value: the text holds a lone surrogate {exc.object[exc.start]!r} at position {exc.start}",
            hint="replace it before storing, e.g. text.encode('utf-8', 'replace').decode('utf-8') "
                 "(or fix the source that cut a UTF-16 pair or decoded with surrogateescape)")
    return ValidationError(f"cannot encode value: {exc}")


def pack(obj: Any) -> bytes:
    """Canonical msgpack (bin type for bytes, str for text).

    Raises:
        ValidationError: the object holds a type msgpack cannot store (or an int beyond 64 bits).
    """
    try:
        return msgpack.packb(obj, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise _encode_error(exc) from None


def unpack(data: bytes, *, any_keys: bool = False) -> Any:
    """Size-capped msgpack decoding.

    Map keys must be strings (or bytes) unless ``any_keys``.

    Raises:
        CorruptFileError: the bytes are not valid msgpack within the caps.
    """
    # n bytes hold at most n items (n / 2 map entries): as tight as a fixed cap on hostile
    # input, and never below what a record within MAX_RECORD_BYTES can hold (a fixed bytes / 8
    # refused a metadata list of 9 million zeros, 9 MB, that had been stored)
    size = len(data)
    try:
        return msgpack.unpackb(
            data, raw=False, strict_map_key=not any_keys, use_list=True,
            max_bin_len=size, max_str_len=size, max_array_len=size, max_map_len=size // 2,
        )
    except (ValueError, TypeError, msgpack.UnpackException, msgpack.ExtraData, RecursionError) as exc:
        # msgpack raises several unrelated types on bad input
        raise CorruptFileError(f"a record does not decode: {type(exc).__name__}") from None


def u64(n: int) -> bytes:
    """A docno or counter as an 8-byte big-endian key (sorts numerically)."""
    return _U64.pack(n)


def sorted_id_rows(id_keys: list[bytes], docnos: range) -> list[tuple[bytes, bytes]]:
    """``sorted(zip(id_keys, map(u64, docnos)))`` for distinct 16-byte keys (blind ids):
    the same rows, sorted by numpy on the keys read as two big-endian uint64s (the bytes'
    order), without a Python comparison per pair or a random walk over the key objects."""
    blob = b"".join(id_keys)
    if len(id_keys) < 256 or len(blob) != 16 * len(id_keys) or len(id_keys) != len(docnos):
        return sorted(zip(id_keys, map(u64, docnos)))  # (few rows: numpy's set-up costs more)
    words = np.frombuffer(blob, dtype=">u8").reshape(-1, 2)
    order = np.lexsort((words[:, 1], words[:, 0]))
    ids = words[order].tobytes()
    nos = np.arange(docnos.start, docnos.stop, docnos.step, dtype=np.uint64)[order].astype(">u8").tobytes()
    return list(zip([ids[i:i + 16] for i in range(0, len(ids), 16)], [nos[i:i + 8] for i in range(0, len(nos), 8)]))


def from_u64(data: bytes) -> int:
    if len(data) != 8:
        raise CorruptFileError("an 8-byte number has the wrong length")
    n: int = _U64.unpack(data)[0]
    return n


def pack_archive(content: str) -> bytes:
    """An archived original: zstd of its UTF-8 text."""
    return _compressor.compress(content.encode("utf-8", "surrogatepass"))


def _decompress(data: bytes, what: str) -> bytes:
    """zstd within MAX_RECORD_BYTES. python-zstandard allocates a frame's declared content size up
    front (max_output_size only bounds frames that declare none), so check that size first."""
    try:
        if zstandard.frame_content_size(data) > MAX_RECORD_BYTES:
            raise CorruptFileError(f"{what} declares a size beyond the {MAX_RECORD_BYTES}-byte cap")
        return _decompressor.decompress(data, max_output_size=MAX_RECORD_BYTES)
    except zstandard.ZstdError:
        raise CorruptFileError(f"{what} does not decompress") from None


def unpack_archive(data: bytes) -> str:
    """Inverse of :func:`pack_archive`.

    Raises:
        CorruptFileError: the bytes do not decompress to UTF-8 within the size cap.
    """
    text = _decompress(data, "an archived original")
    try:
        return text.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        raise CorruptFileError("an archived original is not UTF-8") from None


def _vector_from(data: bytes) -> np.ndarray:
    """A first-layout record's vector: a read-only float32 view of its bytes."""
    if not isinstance(data, bytes) or len(data) % 4:
        raise CorruptFileError("an embedding in a record has a bad length")
    return np.frombuffer(data, dtype="<f4").astype(np.float32, copy=False)


def _packer() -> msgpack.Packer:
    """This thread's reusable Packer (cheaper than packb's fresh one per call; it resets itself
    after an error). Produces the same bytes as :func:`pack`."""
    packer = getattr(_local, "packer", None)
    if packer is None:
        packer = _local.packer = msgpack.Packer(use_bin_type=True)
    return packer


# The node fields in record order (between the schema version and the embeddings): one
# itemgetter call reads them all from the node's instance dict (a frozen dataclass keeps
# every field there; plain dict lookups are ~3x faster than attribute lookups).
_NODE_RECORD_NAMES = (
    "id", "content", "entities", "topics", "quote", "weight", "flags", "emotions", "source_start", "source_end",
    "resolved_date", "tier", "importance", "created_at", "last_accessed", "access_count", "pinned", "tags",
    "source", "metadata")
_NODE_RECORD_FIELDS = operator.itemgetter(*_NODE_RECORD_NAMES)
_MSGPACK_PREFIX = bytes((CODEC_MSGPACK,))
_ZSTD_PREFIX = bytes((CODEC_ZSTD,))


# Schema 3. The record's fields after the schema version, in order: ``id`` and
# ``created_at`` always, then each of these with its bit (1 << position) in the mask when
# it differs from its default (``last_accessed``'s default is ``created_at``; ``spaces`` is
# the sorted list of the memory's vector spaces). A value equals its default when it has
# the default's type and value (so 0 is not 0.0, and -0.0 is stored).
# The two most common first, so a memory with a text and a vector has a one-byte mask.
_OPTIONAL = (
    "content", "spaces", "entities", "topics", "quote", "weight", "flags", "emotions", "source_start", "source_end",
    "resolved_date", "tier", "importance", "last_accessed", "access_count", "pinned", "tags", "source", "metadata")
_OPTIONAL_DEFAULTS: tuple[Any, ...] = ("", (), (), (), "", 0.0, (), (), None, None, None, "hot", 0.5, None, 0, False,
                                       (), "", {})
_LAST_ACCESSED = _OPTIONAL.index("last_accessed")
_SPACES = _OPTIONAL.index("spaces")
_OPTIONAL_FIELDS = operator.itemgetter(*_OPTIONAL[_SPACES + 1:])  # from a node's instance dict
# where each optional field sits in record_fields' array (after the schema version)
_OPTIONAL_AT = tuple(1 + (_NODE_RECORD_NAMES.index(name) if name != "spaces" else len(_NODE_RECORD_NAMES))
                     for name in _OPTIONAL)
_ID_AT, _CREATED_AT = 1 + _NODE_RECORD_NAMES.index("id"), 1 + _NODE_RECORD_NAMES.index("created_at")
_MASK_ALL = (1 << len(_OPTIONAL)) - 1


def _is_default(value: Any, default: Any) -> bool:
    if type(default) is tuple:  # a list field: empty (a Node holds tuples, a decoded record lists)
        return type(value) in (tuple, list) and not value
    if type(default) is dict:
        return type(value) is dict and not value
    if type(value) is not type(default) or value != default:
        return False
    return type(value) is not float or math.copysign(1.0, value) == math.copysign(1.0, default)  # -0.0 == 0.0


def _compact(id_: Any, created: Any, optional: list[Any]) -> list[Any]:
    """The schema-3 array of a record's fields (``optional`` in ``_OPTIONAL`` order, with
    ``last_accessed`` as stored)."""
    mask = 0
    present: list[Any] = [NODE_SCHEMA_COMPACT, 0, id_, created]
    defaults = list(_OPTIONAL_DEFAULTS)
    defaults[_LAST_ACCESSED] = created
    for bit, (value, default) in enumerate(zip(optional, defaults)):
        if not _is_default(value, default):
            mask |= 1 << bit
            present.append(value)
    present[1] = mask
    return present


# The fields after ``spaces`` of a memory that sets none of them (the usual bulk-added one),
# ``last_accessed`` aside: two tuple comparisons find it. A Node's fields have their exact
# types (validated: floats are float, counts int, flags bool, lists tuples), so equal means
# the default but for the sign of a zero (0.0 == -0.0), checked for the two floats that may
# be zero at their default.
_REST = _OPTIONAL[_SPACES + 1:]
_REST_LAST = _REST.index("last_accessed")
_REST_HEAD = _OPTIONAL_DEFAULTS[_SPACES + 1:][:_REST_LAST]
_REST_TAIL = _OPTIONAL_DEFAULTS[_SPACES + 1:][_REST_LAST + 1:]
_REST_WEIGHT = _REST.index("weight")
_copysign = math.copysign


def _compact_node(values: dict[str, Any], spaces: list[str]) -> list[Any]:
    """The schema-3 array of a node (its instance dict), as :func:`_compact`."""
    rest = _OPTIONAL_FIELDS(values)
    created, content, last = values["created_at"], values["content"], values["last_accessed"]
    if (content and rest[:_REST_LAST] == _REST_HEAD and rest[_REST_LAST + 1:] == _REST_TAIL and last == created
            and _copysign(1.0, rest[_REST_WEIGHT]) > 0 and (last or _copysign(1.0, last) == _copysign(1.0, created))):
        return [NODE_SCHEMA_COMPACT, 0b11, values["id"], created, content, spaces] if spaces \
            else [NODE_SCHEMA_COMPACT, 0b01, values["id"], created, content]
    return _compact(values["id"], created, [content, spaces, *rest])


def _compact_fields(fields: list[Any]) -> list[Any]:
    """A schema-1/2 array (record_fields' shape) in schema 3; a first-layout record that
    holds its vectors (schema 1 with a non-empty map) stays as it is."""
    vectors = fields[-1]
    if fields[0] == NODE_SCHEMA and vectors:
        return fields
    optional = [fields[at] for at in _OPTIONAL_AT]
    optional[_SPACES] = vectors if fields[0] == NODE_SCHEMA_VECTORS else ()
    return _compact(fields[_ID_AT], fields[_CREATED_AT], optional)


_EMPTY_LIST = tuple(i for i, d in enumerate(_OPTIONAL_DEFAULTS) if type(d) is tuple)
_EMPTY_MAP = tuple(i for i, d in enumerate(_OPTIONAL_DEFAULTS) if type(d) is dict)
_TEMPLATE: list[Any] = [None] * (2 + len(_NODE_RECORD_NAMES))
for _at, _default in zip(_OPTIONAL_AT, _OPTIONAL_DEFAULTS):
    _TEMPLATE[_at] = None if type(_default) in (tuple, dict) else _default
_plans: dict[int, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], bool]] = {}


def _plan(mask: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], bool]:
    """For a mask: where its fields go, where fresh empty lists and maps go, and whether
    ``last_accessed`` is ``created_at`` (computed once per mask: a file has few)."""
    plan = _plans.get(mask)
    if plan is None:
        bits = range(len(_OPTIONAL))
        plan = (tuple(_OPTIONAL_AT[b] for b in bits if mask >> b & 1),
                tuple(_OPTIONAL_AT[b] for b in _EMPTY_LIST if not mask >> b & 1),
                tuple(_OPTIONAL_AT[b] for b in _EMPTY_MAP if not mask >> b & 1),
                not mask >> _LAST_ACCESSED & 1)
        if len(_plans) < 4096:
            _plans[mask] = plan
    return plan


def _expand(fields: list[Any]) -> list[Any]:
    """A schema-3 array -> the schema-1/2 array of the same record.

    Raises:
        CorruptFileError: the mask or the number of fields disagree.
    """
    mask = fields[1] if len(fields) >= 4 else None
    if type(mask) is not int or not 0 <= mask <= _MASK_ALL:
        raise CorruptFileError("a compact node record's field mask does not match its fields")
    present, lists, maps, same_time = _plan(mask)
    if len(fields) != 4 + len(present):
        raise CorruptFileError("a compact node record's field mask does not match its fields")
    out = _TEMPLATE[:]
    out[_ID_AT] = fields[2]
    out[_CREATED_AT] = fields[3]
    for at, value in zip(present, fields[4:]):
        out[at] = value
    for at in lists:
        out[at] = []
    for at in maps:
        out[at] = {}
    if same_time:
        out[_OPTIONAL_AT[_LAST_ACCESSED]] = fields[3]
    if out[-1]:  # a present spaces field: checked as schema 2's (non-empty, sorted, distinct)
        out[0] = NODE_SCHEMA_VECTORS
    else:
        if mask >> _SPACES & 1:
            raise CorruptFileError("a compact node record lists an empty set of vector spaces")
        out[0], out[-1] = NODE_SCHEMA, {}
    return out


def encode_node(node: Node) -> bytes:
    """Node -> record bytes.

    Raises:
        ValidationError: a field holds a value msgpack cannot store.
    """
    return encode_nodes([node])[0]


# The fields a node in the C extension's common shape leaves at their default objects
# (``plain_records`` in engramdb/_native.c), and those objects.
_PLAIN_NAMES = tuple(name for name in _REST if name not in ("last_accessed", "metadata"))
_PLAIN_DEFAULTS = tuple(_FIELD_DEFAULTS[name] for name in _PLAIN_NAMES)


def encode_nodes(nodes: list[Node]) -> list[bytes]:
    """:func:`encode_node` of each node (one call for a batch). With the C extension, the
    nodes of the common shape (only id, content and the timestamps set, vectors' spaces
    listed) are encoded by one C call, byte for byte as below; the others here.

    Raises:
        ValidationError: a field holds a value msgpack cannot store.
    """
    native = _accel.NATIVE
    if native is None or not nodes:
        return _encode_nodes(nodes)
    out: list[bytes | None] = native.plain_records([node.__dict__ for node in nodes], _PLAIN_NAMES, _PLAIN_DEFAULTS,
                                                   ZSTD_THRESHOLD)
    if None in out:
        rest = [i for i, record in enumerate(out) if record is None]
        for i, record in zip(rest, _encode_nodes([nodes[i] for i in rest])):
            out[i] = record
    return cast("list[bytes]", out)


def _encode_nodes(nodes: list[Node]) -> list[bytes]:
    """:func:`encode_nodes` in Python."""
    pack = _packer().pack
    out = []
    try:
        for node in nodes:
            values = node.__dict__
            # tuples pack as msgpack arrays, exactly like lists
            embeddings = values["embeddings"]
            spaces = sorted(embeddings)  # the vectors are written to the vector blocks by the index
            body = pack(_compact_node(values, spaces))
            if len(body) > MAX_RECORD_BYTES:  # (the C path's plain records are always within)
                raise ValidationError(
                    f"memory {shown(node.id)} is too large: {len(body)} bytes encoded, a record holds at most "
                    f"{MAX_RECORD_BYTES}", hint="shorten its quote, metadata or tags (keep long text in content, "
                    "or split it into several memories)")
            if len(body) > ZSTD_THRESHOLD:
                out.append(_ZSTD_PREFIX + _compressor.compress(body))
            else:
                out.append(_MSGPACK_PREFIX + body)
    except (TypeError, ValueError, OverflowError) as exc:
        raise _encode_error(exc) from None
    return out


def record_fields(data: bytes) -> list[Any]:
    """Record bytes -> the record's msgpack array, unvalidated (schema version first, then
    the fields in ``_NODE_RECORD_NAMES`` order, then the embeddings: a map of vector bytes in
    schema 1, the list of space names in schema 2).

    Raises:
        CorruptFileError: unknown codec or schema, or bytes that do not decode.
    """
    if not data:
        raise CorruptFileError("an empty node record")
    kind, body = data[0], data[1:]
    if kind == CODEC_ZSTD:
        body = _decompress(body, "a compressed node record")
    elif kind != CODEC_MSGPACK:
        raise CorruptFileError(f"unknown record codec {kind}", hint="upgrade engramdb, or restore from a dump")
    fields = unpack(body)
    if isinstance(fields, list) and fields and fields[0] == NODE_SCHEMA_COMPACT:
        return _expand(fields)
    if not isinstance(fields, list) or not fields or fields[0] not in (NODE_SCHEMA, NODE_SCHEMA_VECTORS) \
            or len(fields) < 22:
        raise CorruptFileError("a node record has an unknown schema", hint="upgrade engramdb to read this file")
    return fields


def record_spaces(data: bytes) -> tuple[str, ...]:
    """The names of the vector spaces record ``data`` has a vector in, without building the
    node (what the indexes need of a deleted memory's record).

    Raises:
        CorruptFileError: the record does not decode, or its list of spaces is malformed.
    """
    embeddings = record_fields(data)[21]
    if isinstance(embeddings, dict):  # schema 1: the vectors themselves, keyed by space
        embeddings = list(embeddings)
    if not isinstance(embeddings, list) or not all(isinstance(n, str) for n in embeddings):
        raise CorruptFileError("a node record holds invalid fields: the record's list of vector spaces")
    return tuple(embeddings)


def field_position(name: str) -> int:
    """Where field ``name`` sits in :func:`record_fields`' array."""
    return 1 + _NODE_RECORD_NAMES.index(name)


def decode_node(data: bytes, *, vectors: bool = True,
                fetch: Callable[[list[str]], Mapping[str, Any]] | None = None) -> Node:
    """Record bytes -> Node (``vectors=False``: without its embeddings, which are most of
    the decoding work of a first-layout record that has any; the maintenance pass reads
    records so).

    A schema-2 record names its spaces; ``fetch(names)`` reads the vectors from the vector
    blocks. Without it, each is the placeholder :data:`~engramdb.records.STORED`, which
    encodes back to the same record.

    Raises:
        CorruptFileError: unknown codec or schema, bad shape, or fields that fail validation.
    """
    fields = record_fields(data)
    try:
        (_, id_, content, entities, topics, quote, weight, flags, emotions, ss, se, rd, tier, importance,
         created, accessed, count, pinned, tags, source, metadata, embeddings) = fields[:22]
        if fields[0] == NODE_SCHEMA_VECTORS:
            if not (isinstance(embeddings, list) and embeddings and all(isinstance(n, str) for n in embeddings)
                    and embeddings == sorted(set(embeddings))):
                raise ValidationError("the record's list of vector spaces")
            if not vectors:
                embeddings = {}
            elif fetch is not None:
                embeddings = dict(fetch(embeddings))
            else:
                embeddings = dict.fromkeys(embeddings, STORED)
        elif not isinstance(embeddings, dict):
            raise ValidationError("embeddings")
        elif vectors:
            embeddings = {space: _vector_from(vec) for space, vec in embeddings.items()}
        return Node.from_fields({  # the constructor's checks, without its setattr per field
            "id": id_, "content": content, "entities": entities, "topics": topics, "quote": quote,
            "weight": weight, "flags": flags, "emotions": emotions, "source_start": ss, "source_end": se,
            "resolved_date": rd, "tier": tier, "importance": importance, "created_at": created,
            "last_accessed": accessed, "access_count": count, "pinned": pinned, "tags": tags, "source": source,
            "metadata": metadata,
            "embeddings": embeddings if vectors else {},
        })
    except (ValidationError, TypeError, ValueError) as exc:
        raise CorruptFileError(f"a node record holds invalid fields: {exc}") from None


# Positions of the fields a record can be patched in place (after the schema version).
_PATCHABLE = ("tier", "importance", "last_accessed", "access_count", "pinned", "tags")
_FIELD_POSITION = {name: field_position(name) for name in _PATCHABLE}


def patch_node(data: bytes, changes: dict[str, Any]) -> bytes:
    """Record bytes with some plain fields replaced, without decoding the rest (embeddings
    stay bytes): the same bytes as ``encode_node(decode_node(data).replace(**changes))``.

    Only the fields in ``_PATCHABLE`` (none of which the indexes read) can be patched; the
    values are validated as the node constructor does.

    Raises:
        ValidationError: a field that cannot be patched, or an invalid value.
        CorruptFileError: the record does not decode.
    """
    from .records import _FIELD_CHECKS

    unknown = set(changes) - set(_PATCHABLE)
    if unknown:
        raise ValidationError(f"cannot patch fields: {', '.join(sorted(unknown))}")
    values = dict(changes)
    for name in changes:
        _FIELD_CHECKS[name](values)  # validates and normalises (tags -> tuple of str, ...)
    fields = record_fields(data)
    for name, value in values.items():
        fields[_FIELD_POSITION[name]] = value
    try:
        out = _packer().pack(_compact_fields(fields))
    except (TypeError, ValueError, OverflowError) as exc:
        raise _encode_error(exc) from None
    return _ZSTD_PREFIX + _compressor.compress(out) if len(out) > ZSTD_THRESHOLD else _MSGPACK_PREFIX + out
