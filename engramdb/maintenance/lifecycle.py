"""The lifecycle as pure functions: decay, deduplicate, cluster, forget, consolidate.

They take lists of :class:`Memory` (Trace Lite's shape: one embedding per memory) and
return new lists; the input is never changed. With :meth:`MaintenanceConfig.trace_lite`
they give exactly what Engram Trace Lite 0.1.1 gives (checked against its own outputs in
``../shared/data/trace-lite/``); the default configuration adds engramdb's extensions
(pinned memories stay, duplicates are merged into their survivor, archived text is kept).
spec/maintenance.md states the semantics, including Trace Lite's tie-breaks.

Similarity is computed in blocks by matrix products; a pair whose product lies within
:data:`EXACT_BAND` of a threshold is computed again the way Trace Lite computes it (a
sequential sum in double precision), so a pair on the boundary is decided the same way.
The greedy steps (dedupe, clusters) then run over the pairs above the threshold only.
"""
from __future__ import annotations

import calendar
import math
import numbers
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timezone
from typing import Any, NamedTuple

import numpy as np

from ..errors import ValidationError
from ..records import now_ts

__all__ = [
    "Consolidated",
    "Decayed",
    "Deduplicated",
    "Forgotten",
    "MaintenanceConfig",
    "MaintenanceReport",
    "Memory",
    "Summarizer",
    "cluster",
    "consolidate",
    "cosine_similarity",
    "count_by_tier",
    "decay",
    "decay_tiers",
    "deduplicate",
    "forget",
    "greedy_clusters",
    "greedy_dedupe",
    "next_tier",
]

TIERS = ("hot", "warm", "cold", "archive")
DAY_MS = 86_400_000
EXACT_BAND = 1e-9  # matrix products this close to a threshold are recomputed exactly
MIN_SUMMARY_CHARS = 10  # a shorter summary leaves its cluster alone (Trace Lite)
BLOCK_ROWS = 1024

Summarizer = Callable[[list[str]], str]


@dataclass(frozen=True)
class MaintenanceConfig:
    """What a maintenance pass (pure or on a file) does.

    The first seven fields are Trace Lite's, with its defaults. The rest are engramdb's:

    - ``archive_truncate``: really drop archived text beyond ``archive_truncate_length``
      characters (Trace Lite always does). Off: the file keeps the full record in its
      archive table and a preview as content; the pure functions leave content alone.
    - ``keep_pinned``: pinned memories never decay, are never deduplicated away and are
      never summarized into a cluster.
    - ``merge_duplicates``: a removed duplicate's tags and access count go to its survivor.
    - ``decay_from``: ``"created_at"`` (Trace Lite) or ``"last_accessed"``.
    - ``decay_steps``: the most tiers one pass moves a memory (Trace Lite: 1). None moves
      it straight to the tier its age says, which makes a second pass at the same time
      change nothing (the file pass's default).
    - ``space``: the vector space the file pass compares in (None: the built-in hashed
      TF-IDF space ``engramdb/hashed-tfidf-v1``, created on first use).
    - ``batch_size``: memories written per write transaction by the file pass.
    - ``incremental``: compare only what changed since the last pass (False: everything).

    :meth:`trace_lite` gives Trace Lite's behaviour exactly (all extensions off).
    """

    dedupe_threshold: float = 0.92
    cluster_threshold: float = 0.78
    min_cluster_size: int = 3
    hot_days: float = 7.0
    warm_days: float = 30.0
    cold_days: float = 365.0
    archive_truncate_length: int = 200
    archive_truncate: bool = False
    keep_pinned: bool = True
    merge_duplicates: bool = True
    decay_from: str = "created_at"
    decay_steps: int | None = None
    space: str | None = None
    batch_size: int = 200
    incremental: bool = True

    def __post_init__(self) -> None:
        # NumPy numbers (a threshold computed with numpy, a pandas row) are taken as their Python values
        for name in ("dedupe_threshold", "cluster_threshold", "hot_days", "warm_days", "cold_days"):
            value = getattr(self, name)
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValidationError(f"MaintenanceConfig.{name} must be a finite number, got {value!r}")
            if isinstance(value, np.generic) or not isinstance(value, (int, float)):
                object.__setattr__(self, name, float(value))
        for name in ("min_cluster_size", "archive_truncate_length", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < 0:
                raise ValidationError(f"MaintenanceConfig.{name} must be a non-negative integer, got {value!r}")
            object.__setattr__(self, name, int(value))
        if self.batch_size < 1:
            raise ValidationError("MaintenanceConfig.batch_size must be at least 1")
        if self.decay_steps is not None:
            if (isinstance(self.decay_steps, (bool, np.bool_)) or not isinstance(self.decay_steps, numbers.Integral)
                    or self.decay_steps < 1):
                raise ValidationError(f"MaintenanceConfig.decay_steps must be None or at least 1, got {self.decay_steps!r}")
            object.__setattr__(self, "decay_steps", int(self.decay_steps))
        for name in ("archive_truncate", "keep_pinned", "merge_duplicates", "incremental"):
            value = getattr(self, name)
            # a truthy string such as "no" or "false" must not switch an option on
            if not isinstance(value, (bool, np.bool_)):
                raise ValidationError(f"MaintenanceConfig.{name} must be True or False, got {value!r}")
            object.__setattr__(self, name, bool(value))  # numpy.bool_ (a pandas row) as a bool
        if self.space is not None and not isinstance(self.space, str):
            raise ValidationError(f"MaintenanceConfig.space must be None or a space name, got {self.space!r}")
        if self.decay_from not in ("created_at", "last_accessed"):
            raise ValidationError(
                f"MaintenanceConfig.decay_from must be 'created_at' or 'last_accessed', got {self.decay_from!r}")

    @classmethod
    def trace_lite(cls, **overrides: Any) -> MaintenanceConfig:
        """Trace Lite 0.1.1's behaviour: every engramdb extension off, archived text truncated."""
        values: dict[str, Any] = {"archive_truncate": True, "keep_pinned": False, "merge_duplicates": False,
                                  "decay_from": "created_at", "decay_steps": 1}
        values.update(overrides)
        return cls(**values)

    def replace(self, **changes: Any) -> MaintenanceConfig:
        """A copy with ``changes`` applied (checked again)."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Memory:
    """One memory in Trace Lite's shape, with engramdb's ``pinned``.

    Times are seconds since the epoch (ages are measured in whole milliseconds, as Trace
    Lite measures them). ``embedding`` is a tuple of floats.
    """

    id: str
    content: str = ""
    embedding: tuple[float, ...] = ()
    tags: tuple[str, ...] = ()
    importance: float = 0.5
    tier: str = "hot"
    created_at: float = 0.0
    last_accessed: float = 0.0
    access_count: int = 0
    source: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    pinned: bool = False

    @classmethod
    def from_trace_lite(cls, data: Mapping[str, Any]) -> Memory:
        """A memory from Trace Lite's JSON form (camelCase keys, ISO 8601 times).

        Raises:
            ValidationError: ``id`` or ``createdAt`` is missing, or a field has the wrong type.
        """
        if not isinstance(data, Mapping):
            raise ValidationError(f"a Trace Lite memory is a JSON object, got {type(data).__name__}")
        for key in ("id", "createdAt"):
            if key not in data:
                raise ValidationError(f"a Trace Lite memory needs {key!r}", hint="Trace Lite writes id and createdAt")
        id_ = data["id"]
        if not isinstance(id_, str) or not id_:
            raise ValidationError(f"a Trace Lite memory's id must be a non-empty string, got {id_!r}")
        field_name = ""
        try:
            field_name = "content"
            content = data.get("content", "")
            if not isinstance(content, str):
                raise TypeError(f"not a string: {content!r}")
            field_name = "source"
            source = data.get("source") or ""
            if not isinstance(source, str):
                raise TypeError(f"not a string: {source!r}")
            field_name = "tier"
            tier = data.get("tier", "hot")
            if not isinstance(tier, str) or tier not in TIERS:
                raise ValueError(f"not one of {', '.join(TIERS)}: {tier!r}")
            field_name = "pinned"
            pinned = data.get("pinned", False)
            if not isinstance(pinned, (bool, np.bool_)):  # bool("false") is True
                raise TypeError(f"not true or false: {pinned!r}")
            field_name = "tags"
            tags = data.get("tags", ())
            if isinstance(tags, str):  # never a tuple of its letters
                raise TypeError("a string")
            tags = tuple(tags)
            if not all(isinstance(tag, str) for tag in tags):
                raise TypeError(f"not all strings: {list(tags)!r}")
            field_name = "embedding"
            raw = data.get("embedding", ())
            if isinstance(raw, (str, bytes)):
                raise TypeError("a string")
            embedding = tuple(float(x) for x in raw)
            field_name = "importance"
            importance = float(data.get("importance", 0.5))
            field_name = "accessCount"
            access_count = int(data.get("accessCount", 0))
            field_name = "metadata"
            metadata = dict(data.get("metadata") or {})
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValidationError(f"Trace Lite memory {id_!r}: {field_name} has the wrong type or value ({exc})",
                                  hint="content, source: strings; tier: hot, warm, cold or archive; pinned: "
                                       "true or false; tags: a list of strings; embedding: a list of numbers; "
                                       "importance, accessCount: numbers; metadata: an object") from None
        return cls(
            id=id_, content=content, embedding=embedding, tags=tags, importance=importance,
            tier=tier, created_at=parse_iso(data["createdAt"]),
            last_accessed=parse_iso(data.get("lastAccessed", data["createdAt"])),
            access_count=access_count, source=source,
            metadata=metadata, pinned=bool(pinned))

    def to_trace_lite(self) -> dict[str, Any]:
        """Trace Lite's JSON form of this memory (``pinned`` only when set)."""
        out = {
            "id": self.id, "content": self.content, "embedding": list(self.embedding),
            "tags": list(self.tags), "importance": self.importance, "tier": self.tier,
            "createdAt": format_iso(self.created_at), "lastAccessed": format_iso(self.last_accessed),
            "accessCount": self.access_count, "source": self.source, "metadata": dict(self.metadata),
        }
        if self.pinned:
            out["pinned"] = True
        return out


@dataclass
class MaintenanceReport:
    """What a pass did (or, with ``plan``, would do). Counts follow Trace Lite's report.

    ``archived`` counts memories whose content became a preview (truncated by the pure
    functions; moved to the archive table by the file pass, or, with ``archive_truncate``,
    cut there, as Trace Lite counts: ``archived_ids`` also lists those archived whole), ``bytes_dropped`` the UTF-8
    bytes of text really dropped (only with ``archive_truncate``). The file pass also
    fills ``compared`` (memories compared against the rest), ``batches`` and the ids.
    """

    before_total: int = 0
    before_by_tier: dict[str, int] = field(default_factory=dict)
    after_total: int = 0
    after_by_tier: dict[str, int] = field(default_factory=dict)
    decayed: int = 0
    deduplicated: int = 0
    clusters_found: int = 0
    summarized: int = 0
    archived: int = 0
    bytes_dropped: int = 0
    compared: int = 0
    batches: int = 0
    plan: bool = False
    full: bool = False
    now: float = 0.0
    duration_s: float = 0.0
    removed_ids: list[str] = field(default_factory=list)
    archived_ids: list[str] = field(default_factory=list)
    summary_ids: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        """Whether the pass changed (or would change) anything."""
        return bool(self.decayed or self.deduplicated or self.summarized or self.archived or self.archived_ids)

    def to_trace_lite(self) -> dict[str, Any]:
        """Trace Lite's report (without its timestamp and duration)."""
        return {
            "before": {"total": self.before_total, "byTier": dict(self.before_by_tier)},
            "after": {"total": self.after_total, "byTier": dict(self.after_by_tier)},
            "decayed": self.decayed, "deduplicated": self.deduplicated,
            "clustersFound": self.clusters_found, "summarized": self.summarized, "archived": self.archived,
        }

    def to_dict(self) -> dict[str, Any]:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), list) else
                         dict(v) if isinstance(v, dict) else v) for f in fields(self)}


class Decayed(NamedTuple):
    memories: list[Memory]
    changed: int


class Deduplicated(NamedTuple):
    memories: list[Memory]
    removed: int


class Forgotten(NamedTuple):
    memories: list[Memory]
    forgotten: int


class Consolidated(NamedTuple):
    memories: list[Memory]
    report: MaintenanceReport


# --- times ------------------------------------------------------------------------------

def parse_iso(text: str) -> float:
    """Seconds since the epoch of an ISO 8601 time (``Z`` or an offset; naive means UTC).

    Raises:
        ValidationError: not a string in ISO 8601 form.
    """
    if not isinstance(text, str):
        raise ValidationError(f"not an ISO 8601 time: {text!r}", hint="write it like 2026-06-01T12:00:00Z")
    expanded = _EXPANDED.fullmatch(text)
    if expanded:  # a year outside 0000-9999, as format_iso (toISOString) writes it
        year, month, day, hours, minutes, seconds, ms = (int(g or 0) for g in expanded.groups())
        if 1 <= month <= 12 and 1 <= day <= calendar.monthrange(2000 + year % 400, month)[1] \
                and hours < 24 and minutes < 60 and seconds < 60:
            days = _days_from_civil(year, month, day)
            return float(days * 86_400 + hours * 3600 + minutes * 60 + seconds) + ms / 1000
    try:
        value = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except (TypeError, ValueError):
        raise ValidationError(f"not an ISO 8601 time: {text!r}", hint="write it like 2026-06-01T12:00:00Z") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.timestamp()


# JavaScript's Date range: +-8.64e15 ms around the epoch (Trace Lite's clock cannot go further)
MAX_TIME = 8.64e12
_EXPANDED = re.compile(r"([+-][0-9]{6})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{3}))?Z")


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm, any year)."""
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - 719_468


def format_iso(ts: float) -> str:
    """``2026-06-01T12:00:00.000Z`` (milliseconds, UTC), as JavaScript's toISOString(),
    including its expanded years (``+055841-...``, ``-000001-...``) outside 0000-9999, which
    Python's datetime cannot represent.

    Raises:
        ValidationError: ``ts`` is not finite or beyond JavaScript's Date range (``MAX_TIME``).
    """
    if not -MAX_TIME <= ts <= MAX_TIME:  # also NaN
        raise ValidationError(f"a time of {ts!r} seconds is beyond the dates JavaScript can write",
                              hint="times are seconds since the epoch (a millisecond value is 1000 times too large)")
    ms = round(ts * 1000)
    days, rest = divmod(ms, 86_400_000)
    # days -> civil date (H. Hinnant's algorithm, proleptic Gregorian, any year)
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (month <= 2)
    shown = f"{year:04d}" if 0 <= year <= 9999 else f"{year:+07d}"
    hours, rest = divmod(rest, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    return f"{shown}-{month:02d}-{day:02d}T{hours:02d}:{minutes:02d}:{rest // 1000:02d}.{rest % 1000:03d}Z"


def _ms(ts: float) -> int:
    return round(ts * 1000)


def _check_memories(memories: Any) -> None:
    """Raises ValidationError unless ``memories`` is a sequence of :class:`Memory` (a list of
    Trace Lite's JSON objects raised AttributeError deep inside)."""
    if isinstance(memories, (str, bytes, Mapping)) or not isinstance(memories, Sequence):
        raise ValidationError(f"memories must be a list of Memory, got {type(memories).__name__}",
                              hint="convert Trace Lite's JSON objects with Memory.from_trace_lite")
    for m in memories:
        if not isinstance(m, Memory):
            raise ValidationError(f"memories must be Memory objects, got {type(m).__name__}",
                                  hint="convert Trace Lite's JSON objects with Memory.from_trace_lite")


# --- decay ------------------------------------------------------------------------------

def next_tier(tier: str, effective_age: float, config: MaintenanceConfig) -> str:
    """Down at most ``config.decay_steps`` tiers (all the way when None): hot -> warm past
    hot_days, warm -> cold past warm_days, cold -> archive past cold_days."""
    steps = 3 if config.decay_steps is None else config.decay_steps
    for _ in range(steps):
        if tier == "hot" and effective_age > config.hot_days:
            tier = "warm"
        elif tier == "warm" and effective_age > config.warm_days:
            tier = "cold"
        elif tier == "cold" and effective_age > config.cold_days:
            tier = "archive"
        else:
            break
    return tier


def effective_age(age_ms: float, access_count: float, importance: float) -> float:
    """Trace Lite's ``(ageDays - min(0.5 * accessCount, 5)) / (1 + 2 * importance)``."""
    return (age_ms / DAY_MS - min(access_count * 0.5, 5)) / (1 + importance * 2)


def decay_tiers(tiers: np.ndarray, age_ms: np.ndarray, access_count: np.ndarray, importance: np.ndarray,
                config: MaintenanceConfig, pinned: np.ndarray | None = None) -> np.ndarray:
    """The new tier code (index into hot, warm, cold, archive) of each memory, vectorised.

    The same floating-point operations as :func:`effective_age`, element by element, so
    the same decisions. ``tiers`` holds codes 0-3; ``pinned`` rows keep their tier when
    ``config.keep_pinned``.
    """
    age = (age_ms.astype(np.float64) / DAY_MS - np.minimum(access_count.astype(np.float64) * 0.5, 5.0)) \
        / (1 + importance.astype(np.float64) * 2)
    limits = np.array([config.hot_days, config.warm_days, config.cold_days, np.inf])
    tiers = np.asarray(tiers, dtype=np.int8).copy()
    frozen = pinned.astype(bool) if pinned is not None and config.keep_pinned else np.zeros(len(tiers), bool)
    for _ in range(3 if config.decay_steps is None else config.decay_steps):
        step = ~frozen & (tiers < 3) & (age > limits[np.minimum(tiers, 3)])
        if not step.any():
            break
        tiers += step.astype(np.int8)
    return tiers


def _decay_one(m: Memory, now_ms: int, config: MaintenanceConfig) -> str:
    if config.keep_pinned and m.pinned:
        return m.tier
    start = m.last_accessed if config.decay_from == "last_accessed" and m.last_accessed else m.created_at
    return next_tier(m.tier, effective_age(now_ms - _ms(start), m.access_count, m.importance), config)


def decay(memories: Sequence[Memory], config: MaintenanceConfig | None = None, *,
          now: float | None = None) -> Decayed:
    """Each memory moved down the tiers by its effective age at ``now`` (at most
    ``config.decay_steps`` tiers; Trace Lite's one step in parity mode).

    Returns the new list (unchanged memories are the same objects) and how many moved.
    """
    _check_memories(memories)
    config = config or MaintenanceConfig()
    now_ms = _ms(now_ts(now))
    out, changed = [], 0
    for m in memories:
        tier = _decay_one(m, now_ms, config)
        if tier != m.tier:
            changed += 1
            m = replace(m, tier=tier)
        out.append(m)
    return Decayed(out, changed)


# --- similarity -------------------------------------------------------------------------

def cosine_similarity(a: Sequence[float], b: Sequence[float]) -> float:
    """Trace Lite's cosine: sequential sums in double precision; 0 for a length mismatch,
    an empty vector or a zero norm."""
    if len(a) != len(b) or not len(a):
        return 0.0
    dot = na = nb = 0.0
    for x, y in zip(a, b):
        x, y = float(x), float(y)
        dot += x * y
        na += x * x
        nb += y * y
    denom = math.sqrt(na) * math.sqrt(nb)
    return 0.0 if denom == 0 else dot / denom


def _matrix(memories: Sequence[Memory]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Row indices grouped by embedding length, and each group's float64 unit rows."""
    groups: dict[int, list[int]] = {}
    for i, m in enumerate(memories):
        groups.setdefault(len(m.embedding), []).append(i)
    rows, units = [], []
    for dims, idx in groups.items():
        if dims == 0:
            continue
        x = np.array([memories[i].embedding for i in idx], dtype=np.float64)
        norms = np.sqrt(np.einsum("ij,ij->i", x, x))
        with np.errstate(invalid="ignore", divide="ignore"):
            u = np.where(norms[:, None] > 0, x / np.where(norms > 0, norms, 1)[:, None], 0.0)
        rows.append(np.asarray(idx, dtype=np.int64))
        units.append(u)
    return rows, units


def _pairs_above(memories: Sequence[Memory], threshold: float, *, strict: bool,
                 candidates: Sequence[int] | None = None) -> dict[int, list[int]]:
    """For each index i, the indices j > i (among ``candidates``) whose cosine with i is
    above ``threshold`` (strictly when ``strict``), ascending."""
    chosen = None
    if candidates is not None:
        chosen = np.zeros(len(memories), dtype=bool)
        chosen[list(candidates)] = True
    out: dict[int, list[int]] = {}
    if threshold < 0 or (threshold == 0 and not strict):
        # every pair of different lengths (similarity 0) passes too: no shortcut to take
        idx = range(len(memories)) if candidates is None else sorted(candidates)
        for i in idx:
            for j in idx:
                if j > i and _passes(cosine_similarity(memories[i].embedding, memories[j].embedding), threshold, strict):
                    out.setdefault(i, []).append(j)
        return out
    for rows, u in zip(*_matrix(memories)):
        if chosen is not None:
            keep = chosen[rows]
            rows, u = rows[keep], u[keep]
        for start in range(0, len(rows), BLOCK_ROWS):
            sims = u[start:start + BLOCK_ROWS] @ u.T
            hit = np.nonzero(sims > threshold - EXACT_BAND)
            for a, b in zip(*hit):
                i, j = int(rows[start + a]), int(rows[b])
                if j <= i:
                    continue
                s = float(sims[a, b])
                if abs(s - threshold) <= EXACT_BAND:
                    s = cosine_similarity(memories[i].embedding, memories[j].embedding)
                if _passes(s, threshold, strict):
                    out.setdefault(i, []).append(j)
    for js in out.values():
        js.sort()
    return out


def _passes(s: float, threshold: float, strict: bool) -> bool:
    return s > threshold if strict else s >= threshold


# --- dedupe -----------------------------------------------------------------------------

def greedy_dedupe(order: Iterable[int], neighbors: Mapping[int, Sequence[int]], score: Callable[[int], float],
                  pinned: Callable[[int], bool] | None = None) -> tuple[set[int], dict[int, int]]:
    """Trace Lite's dedupe over the pairs above the threshold.

    For each i in ``order`` not yet removed, walk its later neighbours j not yet removed:
    remove j when ``score(i) >= score(j)``, else remove i and stop. With ``pinned``, a
    pinned memory is never the one removed (two pinned duplicates both stay).
    Returns the removed set and, for each removed one, the survivor it lost to.
    """
    removed: set[int] = set()
    into: dict[int, int] = {}
    for i in order:
        if i in removed:
            continue
        for j in neighbors.get(i, ()):
            if j in removed:
                continue
            drop_j = score(i) >= score(j)
            if pinned is not None:
                pi, pj = pinned(i), pinned(j)
                if pi and pj:
                    continue
                if pi or pj:
                    drop_j = pi
            if drop_j:
                removed.add(j)
                into[j] = i
            else:
                removed.add(i)
                into[i] = j
                break
    return removed, into


def _score(m: Memory) -> float:
    return m.importance + m.access_count * 0.1


def survivor_of(i: int, into: Mapping[int, int]) -> int:
    """Follow the chain of merges to the memory that finally kept ``i``'s place."""
    while i in into:
        i = into[i]
    return i


def deduplicate(memories: Sequence[Memory], threshold: float | None = None, *,
                config: MaintenanceConfig | None = None) -> Deduplicated:
    """Drop near-duplicates (cosine strictly above ``threshold``, default the config's).

    Pairs are taken in input order; the higher ``importance + 0.1 * access_count`` stays,
    the earlier one on ties. Extensions (config): pinned memories stay; a removed
    duplicate's tags and access count are merged into its survivor.
    """
    _check_memories(memories)
    config = config or MaintenanceConfig()
    t = config.dedupe_threshold if threshold is None else threshold
    if len(memories) < 2:
        return Deduplicated(list(memories), 0)
    neighbors = _pairs_above(memories, t, strict=True)
    removed, into = greedy_dedupe(range(len(memories)), neighbors, lambda k: _score(memories[k]),
                                  (lambda k: memories[k].pinned) if config.keep_pinned else None)
    merged: dict[int, Memory] = {}
    if config.merge_duplicates and removed:
        for loser in sorted(removed):
            keeper = survivor_of(loser, into)
            merged[keeper] = merge_into(merged.get(keeper, memories[keeper]), memories[loser])
    out = [merged.get(i, m) for i, m in enumerate(memories) if i not in removed]
    return Deduplicated(out, len(removed))


def merge_into(keeper: Memory, loser: Memory) -> Memory:
    """``keeper`` with ``loser``'s tags added (keeper's first) and access counts summed."""
    tags = tuple(dict.fromkeys(keeper.tags + loser.tags))
    return replace(keeper, tags=tags, access_count=keeper.access_count + loser.access_count,
                   last_accessed=max(keeper.last_accessed, loser.last_accessed))


# --- clusters ---------------------------------------------------------------------------

def greedy_clusters(candidates: Sequence[int], neighbors: Callable[[int], Iterable[int]],
                    min_size: int) -> list[list[int]]:
    """Trace Lite's clusters: from each unassigned seed in order, the unassigned candidates
    at or above the threshold *to the seed* (``neighbors(seed)``: all of them, any order);
    a group under ``min_size`` is released (its members can join later groups)."""
    if len(candidates) < min_size:
        return []
    position = {c: k for k, c in enumerate(candidates)}
    assigned: set[int] = set()
    clusters = []
    for seed in candidates:
        if seed in assigned:
            continue
        group = [seed] + sorted((j for j in neighbors(seed) if j != seed and j not in assigned and j in position),
                                key=position.__getitem__)
        if len(group) >= min_size:
            clusters.append(group)
            assigned.update(group)
    return clusters


def _cluster_candidates(memories: Sequence[Memory], config: MaintenanceConfig) -> list[int]:
    return [i for i, m in enumerate(memories) if m.tier in ("warm", "cold")
            and not (config.keep_pinned and m.pinned)]


def cluster(memories: Sequence[Memory], config: MaintenanceConfig | None = None) -> list[list[int]]:
    """Groups of similar warm and cold memories, as lists of indices into ``memories``.

    Greedy from each seed in input order, similarity at or above ``cluster_threshold`` to
    the seed; groups smaller than ``min_cluster_size`` are released. Pinned memories are
    left out when ``config.keep_pinned``.
    """
    _check_memories(memories)
    config = config or MaintenanceConfig()
    candidates = _cluster_candidates(memories, config)
    if len(candidates) < config.min_cluster_size:
        return []
    pairs = _pairs_above(memories, config.cluster_threshold, strict=False, candidates=candidates)
    adjacency: dict[int, list[int]] = {}
    for i, js in pairs.items():
        for j in js:
            adjacency.setdefault(i, []).append(j)
            adjacency.setdefault(j, []).append(i)
    return greedy_clusters(candidates, lambda s: adjacency.get(s, ()), config.min_cluster_size)


# --- forget -----------------------------------------------------------------------------

def forget(memories: Sequence[Memory], query: Sequence[float], threshold: float = 0.7) -> Forgotten:
    """The memories whose cosine with ``query`` is below ``threshold`` (the survivors).

    Raises:
        ValidationError: ``memories`` are not Memory objects, or ``query`` is not a vector of numbers.
    """
    _check_memories(memories)
    try:
        q = np.asarray(query, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValidationError("query must be a vector of numbers", hint="the embedding to forget by") from None
    if q.ndim != 1:
        raise ValidationError(f"query must be one vector, got an array of shape {q.shape}")
    qn = math.sqrt(float(q @ q)) if q.size else 0.0
    survivors = []
    rows, units = _matrix(memories)
    sims = np.zeros(len(memories))
    for idx, u in zip(rows, units):
        if u.shape[1] == q.size and qn > 0:
            sims[idx] = u @ (q / qn)
    for i, m in enumerate(memories):
        s = float(sims[i])
        if abs(s - threshold) <= EXACT_BAND or len(m.embedding) != q.size or not qn:
            s = cosine_similarity(m.embedding, query)
        if s < threshold:
            survivors.append(m)
    return Forgotten(survivors, len(memories) - len(survivors))


# --- summaries and archive --------------------------------------------------------------

def _summarize(memories: list[Memory], clusters: list[list[int]], summarizer: Summarizer,
               now: float) -> tuple[list[Memory], int]:
    result = list(memories)
    drop: set[int] = set()
    merged = 0
    for group in clusters:
        try:
            summary = summarizer([memories[i].content for i in group])
        except Exception:
            continue
        if not isinstance(summary, str) or len(summary) < MIN_SUMMARY_CHARS:
            continue
        best = group[0]
        for i in group[1:]:
            if not _score(memories[best]) >= _score(memories[i]):
                best = i
        drop.update(i for i in group if i != best)
        m = result[best]
        result[best] = replace(
            m, content=summary, tags=tuple(dict.fromkeys(m.tags + ("consolidated",))),
            importance=max(memories[i].importance for i in group),
            metadata={**m.metadata, "consolidatedFrom": len(group), "consolidatedAt": format_iso(now)})
        merged += len(group) - 1
    return [m for i, m in enumerate(result) if i not in drop], merged


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units (JavaScript's ``length``)."""
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def utf16_prefix(text: str, units: int) -> str:
    """The longest prefix of at most ``units`` UTF-16 code units (never half a pair)."""
    if len(text) <= units and text.isascii():
        return text
    out = 0
    for k, ch in enumerate(text):
        out += 2 if ord(ch) > 0xFFFF else 1
        if out > units:
            return text[:k]
    return text


def preview(text: str, length: int) -> str:
    """Trace Lite's archive preview: the first ``length`` characters and ``...``."""
    return utf16_prefix(text, length) + "..."


def needs_archiving(m: Memory, length: int) -> bool:
    return m.tier == "archive" and length > 0 and utf16_len(m.content) > length and "consolidated" not in m.tags


def _archive(memories: list[Memory], config: MaintenanceConfig) -> tuple[list[Memory], int, int]:
    if not config.archive_truncate or config.archive_truncate_length <= 0:
        return memories, 0, 0
    out, changed, dropped = [], 0, 0
    for m in memories:
        if needs_archiving(m, config.archive_truncate_length):
            kept = preview(m.content, config.archive_truncate_length)
            dropped += len(m.content.encode("utf-8", "surrogatepass")) - len(kept[:-3].encode("utf-8", "surrogatepass"))
            m = replace(m, content=kept,
                        metadata={**m.metadata, "truncated": True, "originalLength": utf16_len(m.content)})
            changed += 1
        out.append(m)
    return out, changed, dropped


def count_by_tier(tiers: Iterable[str]) -> dict[str, int]:
    """Memories per tier: the four tiers always, any other tier after them."""
    counts = dict.fromkeys(TIERS, 0)
    for t in tiers:
        counts[t] = counts.get(t, 0) + 1
    return counts


def consolidate(memories: Sequence[Memory], config: MaintenanceConfig | None = None,
                summarizer: Summarizer | None = None, *, now: float | None = None) -> Consolidated:
    """The whole pass: decay, dedupe, clusters and summaries (only with a ``summarizer``),
    archive. Returns the new memories and the report.

    A summary replaces the content of its cluster's best memory (highest importance plus
    0.1 per access, the first on ties), which gains the tag ``consolidated``, the group's
    highest importance and ``consolidatedFrom``/``consolidatedAt`` in its metadata; the
    other members go. A summary under 10 characters, or a summarizer that raises, leaves
    its cluster alone.
    """
    _check_memories(memories)
    config = config or MaintenanceConfig()
    now = now_ts(now)
    started = time.perf_counter()
    report = MaintenanceReport(before_total=len(memories), before_by_tier=count_by_tier(m.tier for m in memories),
                               now=now, full=True)
    current, report.decayed = decay(memories, config, now=now)
    current, report.deduplicated = deduplicate(current, config=config)
    if summarizer is not None:
        clusters = cluster(current, config)
        report.clusters_found = len(clusters)
        if clusters:
            current, report.summarized = _summarize(current, clusters, summarizer, now)
    current, report.archived, report.bytes_dropped = _archive(current, config)
    report.after_total = len(current)
    report.after_by_tier = count_by_tier(m.tier for m in current)
    report.duration_s = time.perf_counter() - started
    return Consolidated(current, report)
