"""The data model: memory nodes, typed edges, and the zettel-compress result types.

Everything here is plain data with validation; nothing touches a file. ``codec.py``
turns these into bytes, ``compress/`` produces :class:`CompressResult`, ``aaak.py``
writes and reads all of them as text.
"""
from __future__ import annotations

import math
import numbers
import operator
import time
import uuid
from dataclasses import MISSING, dataclass, field, fields, replace
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from . import _accel
from .errors import EmbeddingError, ValidationError, shown

__all__ = [
    "as_float32",
    "TIERS",
    "ARCHIVE_KEY",
    "ALL_FLAGS",
    "ALL_EMOTIONS",
    "EDGE_KINDS",
    "Node",
    "Edge",
    "Zettel",
    "Tunnel",
    "EntityIndex",
    "CompressResult",
    "new_id",
    "now_ts",
    "check_written",
    "STORED",
]

TIERS = ("hot", "warm", "cold", "archive")
ALL_FLAGS = ("DECISION", "ORIGIN", "CORE", "PIVOT", "GENESIS", "TECHNICAL")
ALL_EMOTIONS = (
    "conviction", "grief", "joy", "fear", "hope", "trust", "wonder", "rage",
    "exhaustion", "shame", "pride", "nostalgia", "anxiety", "relief", "anticipation",
    "frustration", "gratitude", "loneliness", "inspiration", "confusion", "clarity",
    "guilt", "awe", "regret", "determination", "vulnerability", "acceptance",
    "resistance", "love", "loss",
)
EDGE_KINDS = (
    "tunnel", "related", "supersedes", "contradicts", "derived_from",
    # procedural-graph relations
    "precedes", "requires", "part_of",
)

# The reserved metadata entry of an archived memory's stub (engramdb/maintenance/archive.py):
# {"length": UTF-16 code units of the original content, "tier": tier before archiving, "truncated": bool}
ARCHIVE_KEY = "engramdb.archive"

MAX_ID_BYTES = 1024
MAX_CONTENT_BYTES = 16 * 1024 * 1024


def new_id() -> str:
    """A random id (uuid4 hex). Random, not time-ordered: ids must not leak creation time."""
    return uuid.uuid4().hex


def now_ts(now: float | None = None) -> float:
    """The injected clock: ``now`` when given, else the wall clock.

    Raises:
        ValidationError: ``now`` is not a finite number of seconds (a string such as "2020"
            was read as 2020 seconds, other strings raised a raw ValueError).
    """
    if now is None:
        return time.time()
    if now.__class__ is float and now - now == 0.0:  # the common case: a finite float
        return now
    if isinstance(now, bool) or not isinstance(now, numbers.Real) or not math.isfinite(now):
        raise ValidationError(f"now must be a finite number of seconds since the epoch, got {now!r}"[:160],
                              hint="e.g. now=time.time(), or a datetime's .timestamp()")
    return float(now)


def _str_list(name: str, value: Any) -> tuple[str, ...]:
    if type(value) is tuple and not value:  # the common default: nothing to check
        return value
    if isinstance(value, str):
        raise ValidationError(f"{name} must be a list of strings, not a string")
    try:  # not `value or ()`: a NumPy array has no truth value, 0 or False is not a list
        out = () if value is None else tuple(value)
    except TypeError:
        raise ValidationError(f"{name} must be a list of strings, not {type(value).__name__}") from None
    for item in out:
        if not isinstance(item, str):
            raise ValidationError(f"{name} must contain only strings, got {type(item).__name__}")
    return out


def _finite(name: str, value: Any) -> float:
    if type(value) is float and math.isfinite(value):  # the common case, same result
        return value
    # any real number but a bool: a NumPy scalar (what a pandas column gives) is stored as the float it holds
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValidationError(f"{name} must be a number, got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond float range, e.g. 10**400
        raise ValidationError(f"{name} is too large to be a number ({str(value)[:20]}...)") from None
    if not math.isfinite(number):
        raise ValidationError(f"{name} must be finite, got {number}")
    return number


def _opt_int(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValidationError(f"{name} must be a non-negative integer or None")
    return int(value)  # a NumPy integer as the int it holds


def _normalize_metadata(value: Any, depth: int = 0) -> Any:
    """A JSON-like copy of ``value``: str keys; str/int/float/bool/None/bytes/list/dict values.

    Tuples become lists so a stored record compares equal to what it decodes to.
    """
    if depth > 32:
        raise ValidationError("metadata nests too deeply (more than 32 levels)")
    if value is None or type(value) is str:  # the common leaves first (Mapping checks are slower)
        return value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValidationError("metadata keys must be strings")
            out[k] = _normalize_metadata(v, depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [_normalize_metadata(v, depth + 1) for v in value]
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValidationError("metadata floats must be finite")
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if not -(2**63) <= value < 2**64:
            raise ValidationError("metadata integers must fit in 64 bits")
        return value
    if value is None or isinstance(value, (str, bool, bytes)):
        return value
    if isinstance(value, (np.integer, np.floating, np.bool_)):  # NumPy scalars (pandas rows): their Python value
        return _normalize_metadata(value.item(), depth)
    raise ValidationError(f"metadata values must be JSON-like, got {type(value).__name__}")


class _Stored:
    """The value of an embedding that a decoded record names but that was not read from
    the vector blocks (a record decoded without its vectors): encoding the node again
    keeps the name, so the stored vector stays the memory's."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "STORED"

    def __reduce__(self) -> str:
        return "STORED"


STORED: Any = _Stored()


def as_float32(value: Any, what: str, *, copy: bool = True) -> np.ndarray:
    """``value`` (an array, list or tuple of numbers) as a float32 array: a copy, or with
    ``copy=False`` the float32 array itself.

    Raises:
        EmbeddingError: ``what`` is not numbers, holds complex numbers (a cast keeps only
            their real parts, silently), or a value beyond float32's range (the cast raised a
            raw OverflowError for a Python int, or made it infinity).
    """
    if isinstance(value, np.ndarray):
        if value.dtype == np.float32:
            return np.array(value) if copy else value
        if value.dtype.kind == "c":
            raise EmbeddingError(f"{what} holds complex numbers",
                                 hint="pass real numbers: a float32 array, or a list of floats")
    try:
        with np.errstate(over="raise"):
            return np.array(value, dtype=np.float32) if copy else np.asarray(value, dtype=np.float32)
    except (FloatingPointError, OverflowError):
        raise EmbeddingError(f"{what} holds a value beyond float32's range (about 3.4e38)",
                             hint="embeddings are stored as float32: scale the vector down") from None
    except (TypeError, ValueError):
        raise EmbeddingError(f"{what} must be a vector of numbers",
                             hint="pass a list or a 1-D NumPy array of floats") from None


def _freeze_vector(name: str, value: Any) -> Any:
    """A read-only float32 copy of ``value`` (a NumPy array, list or tuple): NumPy input is
    copied as it is, never through Python floats.

    Raises:
        EmbeddingError: not a non-empty 1-D vector of finite numbers (spec/vectors.md: a
            vector with NaN or infinity MUST fail with EmbeddingError, a ValidationError).
    """
    if value is STORED:
        return value
    if isinstance(value, np.ndarray) and value.dtype == np.float32 and value.ndim == 1 and not value.flags.writeable:
        arr = value  # already frozen (a node copied with replace(), a vector read from the file)
    else:
        arr = as_float32(value, f"embedding {name!r}")
        arr.flags.writeable = False
    if arr.ndim != 1 or arr.size == 0:
        raise EmbeddingError(f"embedding {name!r} must be a non-empty 1-D vector")
    if not np.isfinite(arr).all():
        raise EmbeddingError(f"embedding {name!r} contains NaN or infinity")
    return arr


def _embeddings_equal(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    for name, vec in a.items():
        other = b[name]
        if vec is STORED or other is STORED:
            if vec is not other:
                return False
        elif not (vec.shape == other.shape and np.array_equal(vec, other)):
            return False
    return True


@dataclass(frozen=True, eq=False)
class Node:
    """One memory. See spec/file-format.md for the field rules.

    ``embeddings`` maps a space name to a float32 vector: a read-only 1-D NumPy array
    (NumPy input is copied without passing through Python floats; lists and tuples are
    converted once). Two nodes are equal when every field is, vectors compared by value.
    """

    id: str
    content: str = ""
    entities: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()
    quote: str = ""
    weight: float = 0.0
    flags: tuple[str, ...] = ()
    emotions: tuple[str, ...] = ()
    source_start: int | None = None
    source_end: int | None = None
    resolved_date: str | None = None
    tier: str = "hot"
    importance: float = 0.5
    created_at: float = 0.0
    last_accessed: float = 0.0
    access_count: int = 0
    pinned: bool = False
    tags: tuple[str, ...] = ()
    source: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    embeddings: Mapping[str, Any] = field(default_factory=dict)  # read: float32 arrays; given: also lists

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        mine, theirs = self.__dict__, other.__dict__
        return all(mine[name] == theirs[name] for name in _PLAIN_FIELDS) and \
            _embeddings_equal(mine["embeddings"], theirs["embeddings"])

    __hash__ = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        # Normalised values are written into the instance dict: a frozen dataclass forbids
        # setattr, and this is the cheap equivalent of object.__setattr__. The checks are
        # _NODE_CHECKS, in order (so a node with several bad fields reports the same one).
        # A field still holding its default object (not given) passes its checks unchanged.
        d = self.__dict__
        for name, check, default in _POST_INIT_CHECKS:
            if d[name] is not default:
                check(d)

    @property
    def archived(self) -> bool:
        """Whether this is an archived memory's stub: its ``content`` is a short preview, and
        ``Engram.get(id, full=True)`` gives the original (spec/maintenance.md, "Archive")."""
        return isinstance(self.metadata.get(ARCHIVE_KEY), Mapping)

    def replace(self, **changes: Any) -> Node:
        """A copy with ``changes`` applied (validated again)."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python form (lists, dicts), for JSON output."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                value = list(value)
            elif f.name == "embeddings":
                value = {k: None if v is STORED else v.tolist() for k, v in value.items()}
            elif f.name == "metadata":
                value = dict(value)
            out[f.name] = value
        return out

    @classmethod
    def from_fields(cls, data: Mapping[str, Any]) -> Node:
        """``Node(**data)``, validated the same way, about twice as fast (for bulk adds):
        the fields are set in one dict update instead of one ``object.__setattr__`` each.

        Raises:
            ValidationError: ``id`` is missing, a key is not a field, or a value is invalid.
        """
        if "id" not in data:
            raise ValidationError("id must be a non-empty string")
        if not _FIELD_SET.issuperset(data):
            raise ValidationError(f"unknown node fields: {', '.join(sorted(set(data) - _FIELD_SET))}")
        node = cls.__new__(cls)
        values = node.__dict__
        values.update(_FIELD_DEFAULTS)  # every field, in declaration order
        values["metadata"], values["embeddings"] = {}, {}  # the default factories' values
        values.update(data)
        # Only the given fields are checked, in the order of ``data``: every check looks at
        # its own field alone, and the defaults pass theirs unchanged, so a valid node comes
        # out the same. An invalid one is checked again in the constructor's order, which
        # raises the error the constructor raises when several fields are bad.
        try:
            for name in data:
                _FIELD_CHECKS[name](values)
        except Exception:
            values.update(data)
            for name, check in _NODE_CHECKS:
                if name in data:
                    check(values)
            raise
        return node

    @classmethod
    def from_fields_many(cls, rows: Sequence[Mapping[str, Any]]) -> list[Node]:
        """``[Node.from_fields(row) for row in rows]`` (same nodes, same first error).

        Dicts with the same keys, all among the plain text and number fields (a bulk
        load's records), are checked a column at a time (:meth:`plain_many`). Any other
        batch, or a column that does not pass, is built row by row.

        Raises:
            ValidationError: as :meth:`from_fields`, for the first invalid row.
        """
        nodes = cls.plain_many(rows) if rows else []
        return nodes if nodes is not None else [cls.from_fields(row) for row in rows]

    @classmethod
    def plain_many(cls, rows: Sequence[Mapping[str, Any]]) -> list[Node] | None:
        """The nodes of a bulk load's records, or None when ``rows`` are not such records
        (then :meth:`from_fields_many` builds them row by row, with its errors).

        Such records are dicts with the same keys, all among the plain text and number
        fields (``id`` among them), checked a column at a time: a column whose values are
        all of the field's exact type and within its limits passes every per-row check
        unchanged. An ``embeddings`` column whose rows each hold one vector in the same
        space, all NumPy arrays of one length, is stacked into one read-only float32 matrix
        (one copy, one finiteness check) whose rows become the nodes' vectors.
        """
        vectors = _embedding_column(rows) if rows and type(rows[0]) is dict and "embeddings" in rows[0] else None
        if not rows or not _columns_pass(rows, vectors is not None):
            return None
        native = _accel.NATIVE
        if native is not None and type(rows) is list:
            made: list[Node] = native.new_nodes(cls, _FIELD_DEFAULTS, rows, vectors)
            return made
        nodes: list[Node] = []
        new, append = cls.__new__, nodes.append
        for i, row in enumerate(rows):
            node = new(cls)
            values = node.__dict__
            values.update(_FIELD_DEFAULTS)
            values["metadata"], values["embeddings"] = {}, {}
            values.update(row)
            if vectors is not None:
                values["embeddings"] = vectors[i]
            append(node)
        return nodes

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Node:
        """Inverse of :meth:`to_dict`; unknown keys raise :class:`ValidationError`."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValidationError(f"unknown node fields: {', '.join(sorted(unknown))}")
        return cls(**dict(data))


def check_written(node: Node, old: Node | None = None) -> None:
    """Refuse what the write API must not store (``add``, ``add_many``, ``import_many``,
    an import, and ``update`` with ``old`` the stored record), though a stored record may
    hold it: reading runs the field checks too, so these are no field checks, and a
    restore writes a dump's records without them.

    - An empty or blank tag (one that ``old`` has already may stay).
    - The reserved metadata entry ``engramdb.archive`` (:data:`ARCHIVE_KEY`), which only
      engramdb's archive writes: one set by hand claims an archived original that does not
      exist, and ``verify`` reports the memory as damaged. An update may keep ``old``'s
      entry as it is; a new memory may carry a truncated archive's (``truncated: true``,
      tier ``archive``: no original exists), which an export writes for such a memory.

    Raises:
        ValidationError: a blank tag, or an archive entry other than those.
    """
    tags = node.tags
    if tags:
        kept = old.tags if old is not None else ()
        for tag in tags:
            if not tag.strip() and tag not in kept:
                raise ValidationError(f"memory {shown(node.id)} has an empty or blank tag ({tag!r})",
                                      hint="leave the empty tag out")
    metadata = node.metadata
    if not metadata or ARCHIVE_KEY not in metadata:
        return
    entry = metadata[ARCHIVE_KEY]
    if old is not None:
        if old.metadata.get(ARCHIVE_KEY) == entry:  # a stub's entry kept by a metadata update
            return
    elif _truncated_entry(entry) and node.tier == "archive":
        return
    raise ValidationError(
        f"memory {shown(node.id)}: the metadata key {ARCHIVE_KEY!r} is reserved for engramdb's archive",
        hint="rename the key, and use archive(id) to archive; to copy an archived memory, add get(id, full=True) "
             "(an old export's stub: drop the key from its line to import the preview)")


def _truncated_entry(entry: Any) -> bool:
    """Whether ``entry`` is the archive entry of a truncated archive, as archive writes it."""
    if not isinstance(entry, Mapping) or sorted(entry) != ["length", "tier", "truncated"]:
        return False
    length = entry["length"]
    return entry["truncated"] is True and entry["tier"] in TIERS and \
        not isinstance(length, bool) and isinstance(length, int) and length >= 0


NODE_FIELDS = tuple(f.name for f in fields(Node))
_PLAIN_FIELDS = tuple(name for name in NODE_FIELDS if name != "embeddings")
_FIELD_SET = frozenset(NODE_FIELDS)
_FIELD_DEFAULTS = {f.name: None if f.default is MISSING else f.default for f in fields(Node)}


# --- Node field checks ------------------------------------------------------------------
# Each takes the instance dict, checks one field and writes back its normalised value.
# Each has a shortcut for the common value (a short id, an empty tuple, a finite float, an
# empty mapping) that gives exactly what the full check would.

def _check_id(d: dict[str, Any]) -> None:
    id_ = d["id"]
    if not isinstance(id_, str) or not id_:
        raise ValidationError("id must be a non-empty string")
    # at most 4 UTF-8 bytes per code point (3 for a lone surrogate): short ids need no encode
    if len(id_) * 4 > MAX_ID_BYTES and len(id_.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES:
        raise ValidationError(f"id is longer than {MAX_ID_BYTES} bytes")


def _check_string(name: str) -> Any:
    def check(d: dict[str, Any]) -> None:
        if not isinstance(d[name], str):
            raise ValidationError(f"{name} must be a string")
    return check


def _check_content_size(d: dict[str, Any]) -> None:
    if len(d["content"]) > MAX_CONTENT_BYTES:
        # counted in characters (as the C column check counts them), not UTF-8 bytes
        raise ValidationError(f"content is longer than {MAX_CONTENT_BYTES} characters; split it or use ingest()")


def _check_str_list(name: str) -> Any:
    def check(d: dict[str, Any]) -> None:
        value = d[name]
        if value.__class__ is not tuple or value:
            d[name] = _str_list(name, value)
    return check


def _check_known(name: str, known: tuple[str, ...], unknown: Any) -> Any:
    """A check of a string-list field whose items must be in ``known`` (``unknown(item)``
    gives the error message)."""
    def check(d: dict[str, Any]) -> None:
        value = d[name]
        if value.__class__ is not tuple or value:
            items = d[name] = _str_list(name, value)
            for item in items:
                if item not in known:
                    raise ValidationError(unknown(item))
    return check


_check_flags = _check_known("flags", ALL_FLAGS, lambda f: f"unknown flag {f!r}; expected one of {', '.join(ALL_FLAGS)}")
_check_emotions = _check_known("emotions", ALL_EMOTIONS, lambda e: f"unknown emotion {e!r}; see engramdb.ALL_EMOTIONS")


def _check_finite(name: str) -> Any:
    def check(d: dict[str, Any]) -> None:
        value = d[name]
        if value.__class__ is not float or value - value != 0.0:  # x - x is 0.0 for exactly the finite floats
            d[name] = _finite(name, value)
    return check


def _check_importance_range(d: dict[str, Any]) -> None:
    if not 0.0 <= d["importance"] <= 1.0:  # decay divides by (1 + 2 * importance)
        raise ValidationError(f"importance must be between 0 and 1, got {d['importance']}",
                              hint="0 is the least important, 1 the most; the default is 0.5")


def _check_opt_int(name: str) -> Any:
    def check(d: dict[str, Any]) -> None:
        if d[name] is not None:
            d[name] = _opt_int(name, d[name])
    return check


def _check_resolved_date(d: dict[str, Any]) -> None:
    if d["resolved_date"] is not None and not isinstance(d["resolved_date"], str):
        raise ValidationError("resolved_date must be an ISO date string or None")


def _check_tier(d: dict[str, Any]) -> None:
    if not isinstance(d["tier"], str) or d["tier"] not in TIERS:  # `in` compares an array elementwise
        raise ValidationError(f"tier must be one of {', '.join(TIERS)}, got {d['tier']!r}")


def _check_access_count(d: dict[str, Any]) -> None:
    count = d["access_count"]
    if count.__class__ is not int:
        if isinstance(count, bool) or not isinstance(count, numbers.Integral):
            raise ValidationError("access_count must be a non-negative integer")
        count = d["access_count"] = int(count)  # a NumPy integer as the int it holds
    if count < 0:
        raise ValidationError("access_count must be a non-negative integer")


def _check_pinned(d: dict[str, Any]) -> None:
    if not isinstance(d["pinned"], bool):
        if not isinstance(d["pinned"], np.bool_):
            raise ValidationError("pinned must be a bool")
        d["pinned"] = bool(d["pinned"])


def _check_metadata(d: dict[str, Any]) -> None:
    metadata = d["metadata"]
    if metadata.__class__ is dict and not metadata:
        d["metadata"] = {}  # a copy, as _normalize_metadata makes
    elif not isinstance(metadata, Mapping):
        raise ValidationError("metadata must be a mapping")
    else:
        d["metadata"] = _normalize_metadata(metadata)


def _check_embeddings(d: dict[str, Any]) -> None:
    embeddings = d["embeddings"]
    if embeddings.__class__ is dict and not embeddings:
        d["embeddings"] = {}
        return
    if not isinstance(embeddings, Mapping):
        raise ValidationError("embeddings must map a space name to a vector")
    emb = {}
    for space, vec in embeddings.items():
        if not isinstance(space, str) or not space:
            raise ValidationError("embedding space names must be non-empty strings")
        emb[space] = _freeze_vector(space, vec)
    d["embeddings"] = emb


# (field, check) in the order Node validation runs them: a node with several bad fields
# always reports the first of them.
_NODE_CHECKS = (
    ("id", _check_id),
    ("content", _check_string("content")),
    ("quote", _check_string("quote")),
    ("source", _check_string("source")),
    ("content", _check_content_size),
    ("entities", _check_str_list("entities")),
    ("topics", _check_str_list("topics")),
    ("tags", _check_str_list("tags")),
    ("flags", _check_flags),
    ("emotions", _check_emotions),
    ("weight", _check_finite("weight")),
    ("importance", _check_finite("importance")),
    ("created_at", _check_finite("created_at")),
    ("last_accessed", _check_finite("last_accessed")),
    ("importance", _check_importance_range),
    ("source_start", _check_opt_int("source_start")),
    ("source_end", _check_opt_int("source_end")),
    ("resolved_date", _check_resolved_date),
    ("tier", _check_tier),
    ("access_count", _check_access_count),
    ("pinned", _check_pinned),
    ("metadata", _check_metadata),
    ("embeddings", _check_embeddings),
)


def _field_check(name: str) -> Any:
    """All of field ``name``'s checks, as one call."""
    checks = tuple(check for field_name, check in _NODE_CHECKS if field_name == name)
    if len(checks) == 1:
        return checks[0]

    first, second = checks  # content and importance have two

    def check_both(d: dict[str, Any]) -> None:
        first(d)
        second(d)
    return check_both


_FIELD_CHECKS = {name: _field_check(name) for name in NODE_FIELDS}
# (field, check, default object): a private sentinel for the id and the factory-made mappings,
# which no given value is
_NO_DEFAULT = object()
_DEFAULT_OBJECTS = {f.name: _NO_DEFAULT if f.default is MISSING else f.default for f in fields(Node)}
_POST_INIT_CHECKS = tuple((name, check, _DEFAULT_OBJECTS[name]) for name, check in _NODE_CHECKS)


# Per field with a column check, (kind, limit) as the C extension's columns_pass takes them
# (engramdb/_native.c): kind 0 an exact str of at most `limit` code points (-1: any length),
# 1 the same and non-empty, 2 an exact finite float, 3 one in [0, 1]. An id's limit is in code
# points: at most 4 UTF-8 bytes each, so MAX_ID_BYTES // 4 of them always fit. The pure-Python
# checks (_COLUMN_CHECKS) are made from this table, so the two paths share one set of limits.
_NATIVE_COLUMNS = {"id": (1, MAX_ID_BYTES // 4), "content": (0, MAX_CONTENT_BYTES), "quote": (0, -1),
                   "source": (0, -1), "weight": (2, 0), "importance": (3, 0), "created_at": (2, 0),
                   "last_accessed": (2, 0)}


def _column_check(kind: int, limit: int) -> Callable[[list[Any]], bool]:
    """The pure-Python check of a whole column of ``kind`` and ``limit`` (see
    :data:`_NATIVE_COLUMNS`); passing it implies every value passes the field's own check
    unchanged (exact types only: a subclass or a conversion goes row by row)."""
    if kind in (0, 1):
        def texts(values: list[Any]) -> bool:
            return set(map(type, values)) == {str} and (kind == 0 or all(values)) \
                and (limit < 0 or max(map(len, values)) <= limit)
        return texts

    def finite(values: list[Any]) -> bool:
        return set(map(type, values)) == {float} and all(map(math.isfinite, values)) \
            and (kind == 2 or (min(values) >= 0.0 and max(values) <= 1.0))
    return finite


_COLUMN_CHECKS = {name: _column_check(kind, limit) for name, (kind, limit) in _NATIVE_COLUMNS.items()}


def _columns_pass(rows: Sequence[Mapping[str, Any]], vectors_checked: bool = False) -> bool:
    """Whether ``rows`` are dicts with the same keys, ``id`` among them, each a field with a
    column check, and every column passes it (``embeddings`` too when ``vectors_checked``:
    :func:`_embedding_column` accepted it)."""
    first = rows[0]
    if type(first) is not dict:
        return False
    names = [name for name in first if not (vectors_checked and name == "embeddings")]
    if "id" not in first or not all(name in _COLUMN_CHECKS for name in names):
        return False
    native = _accel.NATIVE
    if native is not None:  # one pass over the rows in C, the same verdict
        return native.columns_pass(rows, tuple((name, -1, 0) if vectors_checked and name == "embeddings"
                                               else (name, *_NATIVE_COLUMNS[name]) for name in first))
    if set(map(type, rows)) != {dict}:
        return False
    keys = first.keys()
    if not all(keys == row.keys() for row in rows):
        return False
    return all(_COLUMN_CHECKS[name](list(map(operator.itemgetter(name), rows))) for name in names)


def _embedding_column(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    """The ``embeddings`` values of ``rows`` as views of one read-only float32 matrix, when
    every row's is a dict of one vector in the same space, each a 1-D NumPy array of one
    length and all finite (what the per-row check would give, bit for bit); else None."""
    try:
        columns = [row["embeddings"] for row in rows]
    except (KeyError, TypeError):
        return None
    first = columns[0]
    if type(first) is not dict or len(first) != 1:
        return None
    (name,) = first
    if not isinstance(name, str) or not name or any(type(c) is not dict or c.keys() != first.keys() for c in columns):
        return None
    vecs = [c[name] for c in columns]
    if set(map(type, vecs)) != {np.ndarray} or any(v.ndim != 1 for v in vecs):
        return None
    try:
        matrix = np.stack(vecs).astype(np.float32, copy=False)  # stack copies: the caller's arrays stay theirs
    except (ValueError, TypeError):
        return None
    if matrix.shape[1] == 0 or matrix.dtype != np.float32 or not np.isfinite(matrix).all():
        return None
    matrix.flags.writeable = False
    return [{name: row} for row in matrix]


@dataclass(frozen=True)
class Edge:
    """A typed, directed edge between two memory ids."""

    src: str
    dst: str
    kind: str = "related"
    weight: float = 1.0
    label: str = ""
    created_at: float = 0.0
    valid_from: float | None = None
    valid_to: float | None = None

    def __post_init__(self) -> None:
        for name in ("src", "dst"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValidationError(f"edge {name} must be a non-empty id string")
        if self.kind not in EDGE_KINDS:
            raise ValidationError(f"edge kind must be one of {', '.join(EDGE_KINDS)}, got {self.kind!r}")
        if not isinstance(self.label, str):
            raise ValidationError("edge label must be a string")
        object.__setattr__(self, "weight", _finite("weight", self.weight))
        object.__setattr__(self, "created_at", _finite("created_at", self.created_at))
        for name in ("valid_from", "valid_to"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _finite(name, value))


# --- zettel-compress result types (the pure pipeline's output) -----------------


@dataclass
class Zettel:
    """One compressed chunk: a note with its entity codes, topics, quote and signals."""

    id: str
    entities: list[str] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)
    quote: str = ""
    weight: float = 0.0
    emotions: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    source_start: int | None = None
    source_end: int | None = None
    resolved_date: str | None = None


@dataclass
class Tunnel:
    """An undirected link between two zettels that share entities or topics."""

    from_id: str
    to_id: str
    label: str = ""


@dataclass
class EntityIndex:
    """Entity names and their short stable codes, both ways."""

    name_to_code: dict[str, str] = field(default_factory=dict)
    code_to_name: dict[str, str] = field(default_factory=dict)


@dataclass
class CompressResult:
    """What ``compress`` returns and AAAK encodes.

    ``meta`` holds ``input_length``, ``chunk_count``, ``date``, ``title``, ``warnings``
    and (with ``keep_source``) ``source``: the normalized text the offsets index into.
    """

    zettels: list[Zettel] = field(default_factory=list)
    tunnels: list[Tunnel] = field(default_factory=list)
    entity_index: EntityIndex = field(default_factory=EntityIndex)
    meta: dict[str, Any] = field(default_factory=dict)
