"""The maintenance pass over a file: the lifecycle of lifecycle.py on the stored memories.

A pass has three phases (spec/maintenance.md, "The pass over a file"):

1. **Plan**, in a read snapshot (no lock): the lifecycle state the last pass left
   (``meta/maint.state``: one row per memory with what decay and dedupe need) plus the
   memories changed since (the change log ``meta/maint.dirty.<docno>``, written by every
   update and delete, and the docnos allocated since) give the current rows without
   reading every record. Decay is vectorised over the rows; dedupe and clusters compare
   the changed memories (all of them on a first or full pass) with the stored vectors,
   one matrix product per block of rows.
2. **Apply**, in write transactions of at most ``batch_size`` memories each: the plan
   (with the summaries already computed) is written first, then applied batch by batch,
   each batch recording its progress. An operation whose memory changed after the
   snapshot is skipped (its change-log token moved); the next pass sees it.
3. **Finish**: one transaction writes the new state and the report, and drops the plan
   and the change-log entries the pass accounted for.

A pass killed anywhere leaves the plan in the file; the next call finishes that plan
(with the plan's ``now``) and returns its report, so killed-then-resumed equals one
uninterrupted pass. This module never imports the facade: it gets the store, the indexes
and a transaction factory from ``Engram.maintain``.
"""
from __future__ import annotations

import functools
import hashlib
import math
import os
import re
import time
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .. import codec
from ..errors import BusyError, CorruptFileError, EmbeddingError, ValidationError
from ..records import ARCHIVE_KEY, Node, now_ts
from ..index import Indexes, node_text
from ..index.graph import Graph
from ..index.vectors import HASHED_MODEL, EmbeddingSpace, HashedTfidfEmbedder
from ..store import Store, Txn
from . import archive as archive_ops
from .lifecycle import (
    TIERS,
    MaintenanceConfig,
    MaintenanceReport,
    Summarizer,
    count_by_tier,
    decay_tiers,
    MAX_TIME,
    MIN_SUMMARY_CHARS,
    format_iso,
    greedy_clusters,
    greedy_dedupe,
    utf16_len,
)

__all__ = [
    "BUILTIN_SPACE",
    "DIRTY_PREFIX",
    "LAST_KEY",
    "PLAN_KEY",
    "PROGRESS_KEY",
    "STATE_KEY",
    "Progress",
    "log_changes",
    "maintain",
    "read_last_pass",
]

DIRTY_PREFIX = b"maint.dirty."
STATE_KEY = b"maint.state"
PLAN_KEY = b"maint.plan"
PROGRESS_KEY = b"maint.progress"
LAST_KEY = b"maint.last"
BUILTIN_SPACE = "hashed-tfidf-v1"
BUILTIN_DIMS = 256
SIM_BAND = 1e-4  # float32 products this close to a threshold are recomputed exactly
BLOCK_ROWS = 2048
BLOCK_CELLS = 1 << 24
PAIR_CHUNK = 1 << 16  # pairs whose cosine is recomputed at a time (two 100 MB gathers at 384 dims)
# pivot pruning (_pivot_pairs): worth its set-up from this many rows on
PIVOT_MIN_ROWS = 4096
PRUNE_MIN_THRESHOLD = 0.2  # below, almost nothing is far enough to prune
ROWS_PER_PIVOT = 64
MAX_PIVOTS = 1024
PIVOT_CHUNK = 64
PIVOT_SAMPLE = 20_000
PIVOT_ROUNDS = 4
PIVOT_BANDS = np.radians([10.0, 20.0, 30.0, 40.0, 48.0])  # a row's band: its angle to its pivot
PRUNE_MARGIN = 1e-2  # radians (and cosine) added to every bound: float32 rounding is ~1e-6 in a
# cosine, ~1.5e-3 rad in an angle near 0
PRUNE_MAX_REACH = math.radians(88.0)  # a group reaching further is compared with everything,
PRUNE_MAX_SHARE = 0.04  # and so is one whose bound keeps more than this share of the columns
STATE_VERSION = 1

Progress = Callable[[str, int, int], None]

# the state's columns: name -> dtype (little-endian)
COLUMNS = {"docno": "<u8", "tier": "i1", "start": "<i8", "last": "<i8", "importance": "<f8",
           "access": "<i8", "flags": "u1", "ccount": "<i4"}
PINNED, CONSOLIDATED, STUB = 1, 2, 4
TIER_CODE = {t: i for i, t in enumerate(TIERS)}


class PassTxn(Protocol):
    """What the pass needs from a write transaction of the facade (``engram.Transaction``)."""

    _txn: Txn

    def find(self, id: str) -> Node | None: ...
    def update(self, id: str, /, **changes: Any) -> Node: ...
    def _update_stub(self, id: str, /, **changes: Any) -> Node: ...
    def delete(self, id: str, /, *, missing_ok: bool = False) -> bool: ...
    def delete_many(self, ids: Iterable[str], /, *, missing_ok: bool = False) -> int: ...
    def _put_new(self, node: Node) -> str: ...
    def link(self, src: str, dst: str, kind: str = ..., *, weight: float = ..., now: float | None = ...) -> None: ...
    def archived(self, id: str) -> str | None: ...
    def _set_archived(self, id: str, original: str) -> None: ...
    def _drop_archived(self, id: str) -> bool: ...


@dataclass
class Target:
    """What the pass works on: the store, its indexes and a write-transaction factory."""

    store: Store
    indexes: Indexes
    transaction: Callable[[], AbstractContextManager[Any]]


# --- the change log (written by the facade's index hook) ---------------------------------

def log_changes(txn: Txn, docnos: Sequence[int]) -> None:
    """Record that the memories ``docnos`` changed (updated or deleted) in this transaction.

    The value is this commit's sequence number: a token that moves with every change, so the
    pass can tell whether a memory changed again after it looked.
    """
    if not docnos:
        return
    token = codec.u64(txn.state.seq + 1)
    txn.put_many("meta", [(DIRTY_PREFIX + codec.u64(d), token) for d in sorted(set(docnos))])


def _dirty(txn: Txn) -> dict[int, bytes]:
    return {codec.from_u64(k[len(DIRTY_PREFIX):]): v for k, v in txn.items("meta", DIRTY_PREFIX)}


# --- the lifecycle state ------------------------------------------------------------------

def _empty_rows() -> dict[str, np.ndarray]:
    return {name: np.zeros(0, dtype=dt) for name, dt in COLUMNS.items()}


def _pack_rows(rows: Mapping[str, np.ndarray]) -> dict[str, bytes]:
    return {name: np.ascontiguousarray(rows[name], dtype=dt).tobytes() for name, dt in COLUMNS.items()}


def _unpack_rows(data: Mapping[str, bytes]) -> dict[str, np.ndarray]:
    try:
        rows = {name: np.frombuffer(data[name], dtype=dt).copy() for name, dt in COLUMNS.items()}
    except (KeyError, TypeError, ValueError):
        raise CorruptFileError("the maintenance state is malformed",
                               hint="run `engramdb maintain` with a full pass (it rebuilds the state)") from None
    if len({len(v) for v in rows.values()}) != 1:
        raise CorruptFileError("the maintenance state is malformed",
                               hint="run `engramdb maintain` with a full pass (it rebuilds the state)")
    return rows


def _fingerprint(config: MaintenanceConfig, space: str) -> list[Any]:
    """The settings the state's rows and counts depend on: another value means a full pass."""
    return [STATE_VERSION, space, config.dedupe_threshold, config.cluster_threshold, config.decay_from,
            config.keep_pinned]


_POS = {name: codec.field_position(name) for name in ("id", "tier", "created_at", "last_accessed", "importance",
                                                       "access_count", "pinned", "tags", "metadata")}


def _row_of(docno: int, f: list[Any]) -> tuple[int, int, int, int, float, int, int, int]:
    """A state row from a record's raw fields (``codec.record_fields``: no Node is built,
    the pass reads every record of the file on a full pass)."""
    flags = (PINNED if f[_POS["pinned"]] is True else 0) | (CONSOLIDATED if "consolidated" in f[_POS["tags"]] else 0) \
        | (STUB if ARCHIVE_KEY in f[_POS["metadata"]] else 0)
    return (docno, TIER_CODE.get(f[_POS["tier"]], 0), _ms(f[_POS["created_at"]]),
            _ms(f[_POS["last_accessed"]]), float(f[_POS["importance"]]),
            _i64(int(f[_POS["access_count"]])), flags, 0)


def _i64(value: int, limit: int = 2**63 - 1) -> int:
    """``value`` within ``-limit..limit``, for the state's int64 columns. A memory may hold a
    time past them (a nanosecond clock given as seconds) or an access count of 2**63 or
    more: saturated, they decay as they would, instead of failing every pass."""
    return -limit if value < -limit else limit if value > limit else value


def _ms(value: float) -> int:
    """A time in milliseconds for the state, within +-2**62 (some 146 million years), so that
    an age (now minus it, in int64) cannot overflow."""
    return _i64(round(value * 1000), 2**62)


def _rows_from(records: Sequence[tuple[int, list[Any]]]) -> dict[str, np.ndarray]:
    if not records:
        return _empty_rows()
    try:
        cols = list(zip(*(_row_of(d, f) for d, f in records)))
    except (TypeError, ValueError, OverflowError):
        raise CorruptFileError("a node record holds invalid fields",
                               hint="run `engramdb verify FILE` to find it; restore from a dump") from None
    return {name: np.asarray(col, dtype=dt) for (name, dt), col in zip(COLUMNS.items(), cols)}


def _concat(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    rows = {name: np.concatenate([a[name], b[name]]) for name in COLUMNS}
    order = np.argsort(rows["docno"], kind="stable")
    return {name: v[order] for name, v in rows.items()}


def _take(rows: Mapping[str, np.ndarray], keep: np.ndarray) -> dict[str, np.ndarray]:
    return {name: v[keep] for name, v in rows.items()}


# --- similarity in blocks ------------------------------------------------------------------

def _exact(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of two stored float32 vectors, correctly rounded sums (deterministic)."""
    x, y = a.astype(np.float64).tolist(), b.astype(np.float64).tolist()
    na, nb = math.sqrt(math.fsum(v * v for v in x)), math.sqrt(math.fsum(v * v for v in y))
    return 0.0 if na == 0 or nb == 0 else math.fsum(p * q for p, q in zip(x, y)) / (na * nb)


class _Space:
    """The comparable vectors: unit rows of the space's live vectors, in docno order."""

    def __init__(self, docnos: np.ndarray, matrix: np.ndarray, *, normalized: bool = False) -> None:
        docnos = docnos.astype(np.uint64)
        if len(docnos) > 1 and not bool(np.all(docnos[1:] > docnos[:-1])):
            order = np.argsort(docnos, kind="stable")
            docnos, matrix = docnos[order], matrix[order]
        self.docnos = docnos
        raw = np.ascontiguousarray(matrix, dtype=np.float32)
        self.raw = raw
        self.unit: np.ndarray
        if normalized:  # a normalize space stores unit rows (and zero rows are never stored)
            self.unit = raw
        else:
            norms = np.sqrt(np.einsum("ij,ij->i", raw, raw, dtype=np.float64)).astype(np.float32)
            self.unit = raw / np.where(norms > 0, norms, 1)[:, None]
            self.unit[norms == 0] = 0

    def rows_of(self, docnos: np.ndarray) -> np.ndarray:
        """Row index of each docno, -1 where it has no vector."""
        pos = np.searchsorted(self.docnos, docnos.astype(np.uint64))
        pos = np.minimum(pos, max(len(self.docnos) - 1, 0))
        found = (len(self.docnos) > 0) & (self.docnos[pos] == docnos.astype(np.uint64)) if len(self.docnos) else \
            np.zeros(len(docnos), bool)
        return np.where(found, pos, -1)

    def exact(self, i: int, j: int) -> float:
        return _exact(self.raw[i], self.raw[j])


def _above(space: _Space, sims: np.ndarray, rows: np.ndarray, cols: np.ndarray, threshold: float,
           strict: bool) -> np.ndarray:
    """Which of the pairs (``rows[k]``, ``cols[k]``) with float32 cosine ``sims[k]`` are
    above ``threshold`` (``>`` when ``strict``, else ``>=``); a product within
    :data:`SIM_BAND` of the threshold is decided on the exact cosine."""
    keep = (sims > threshold) if strict else (sims >= threshold)
    for k in np.nonzero(np.abs(sims - threshold) <= SIM_BAND)[0]:
        exact = space.exact(int(rows[k]), int(cols[k]))
        keep[k] = exact > threshold if strict else exact >= threshold
    return keep


def _pairs(space: _Space, rows: np.ndarray, cols_mask: np.ndarray, threshold: float, strict: bool,
           *, triangle: bool, progress: Callable[[int], None] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) vector-row pairs with cosine above ``threshold`` (``>`` when ``strict``, else
    ``>=``), ``row`` from ``rows`` and ``col`` where ``cols_mask``; never a row with itself.
    With ``triangle`` each unordered pair once, as ``row < col`` (``rows`` must then be every
    row in ``cols_mask``). Many rows and a positive threshold: pivot pruning
    (:func:`_pivot_pairs`); else every product, in blocks (:func:`_block_pairs`)."""
    if len(rows) >= PIVOT_MIN_ROWS and threshold - SIM_BAND > PRUNE_MIN_THRESHOLD:
        return _pivot_pairs(space, np.asarray(rows, np.int64), cols_mask, threshold, strict, triangle=triangle,
                            progress=progress)
    return _block_pairs(space, rows, cols_mask, threshold, strict, triangle=triangle, progress=progress)


def _block_pairs(space: _Space, rows: np.ndarray, cols_mask: np.ndarray, threshold: float, strict: bool,
                 *, triangle: bool, progress: Callable[[int], None] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_pairs` by every product: one matrix product per block of rows."""
    out_r, out_c = [], []
    cols = np.nonzero(cols_mask)[0]
    if not len(rows) or not len(cols):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    rows = np.sort(rows)
    step = max(64, min(BLOCK_ROWS, BLOCK_CELLS // len(cols)))  # a block's products stay ~64 MB
    for start in range(0, len(rows), step):
        block = rows[start:start + step]
        use = cols[np.searchsorted(cols, block[0]):] if triangle else cols
        sims = space.unit[block] @ space.unit[use].T
        r, c = np.nonzero(sims > threshold - SIM_BAND)
        if len(r):
            s = sims[r, c]
            gr, gc = block[r], use[c]
            keep = gr != gc
            if triangle:
                keep &= gc > gr
            keep &= _above(space, s, gr, gc, threshold, strict)
            out_r.append(gr[keep])
            out_c.append(gc[keep])
        if progress:
            progress(min(start + step, len(rows)))
    if not out_r:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(out_r), np.concatenate(out_c)


def _kmeans_pivots(unit: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
    """``k`` unit pivots (float32 rows) from a few rounds of spherical k-means over a fixed
    stride sample of ``rows``, started from evenly spaced rows: deterministic. Any pivots
    give exact results; good ones only prune more."""
    sample = rows[::max(1, len(rows) // PIVOT_SAMPLE)]
    pivots = unit[sample[np.linspace(0, len(sample) - 1, k).astype(np.int64)]].astype(np.float64)
    data = unit[sample]
    for _ in range(PIVOT_ROUNDS):
        assign = np.argmax(data @ pivots.astype(np.float32).T, axis=1)
        onehot = np.zeros((k, len(sample)), np.float32)
        onehot[assign, np.arange(len(sample))] = 1.0
        sums = (onehot @ data).astype(np.float64)  # each pivot's members summed
        norms = np.linalg.norm(sums, axis=1)
        moved = norms > 0  # an empty pivot stays where it was
        pivots[moved] = sums[moved] / norms[moved, None]
    out: np.ndarray = pivots.astype(np.float32)
    return out


def _pivot_pairs(space: _Space, rows: np.ndarray, cols_mask: np.ndarray, threshold: float, strict: bool,
                 *, triangle: bool, progress: Callable[[int], None] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_pairs` with exact pruning by pivots (spec/maintenance.md, "Exactness").

    The rows are grouped by their nearest pivot ``c`` and by their angle to it (bands); a
    group whose widest angle is ``R`` can only have a pair above the threshold (angle
    ``theta_t``) with a column within ``R + theta_t`` of ``c`` (the angle between unit
    vectors is a metric), so only those columns are multiplied. Wide groups (no pruning to
    gain) are compared by every product. In ``triangle`` mode the groups are ordered, tight
    first, and a group only meets columns of its own or a later group (the pair is found
    from the earlier side, or cannot be above the threshold at all)."""
    unit = space.unit
    cols_all = np.nonzero(cols_mask)[0]
    nonzero = np.einsum("ij,ij->i", unit, unit) > 0.25  # zero rows (no direction) never pass t > 0
    rows = np.sort(rows[nonzero[rows]])
    cols_all = cols_all[nonzero[cols_all]]
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    if not len(rows) or not len(cols_all):
        return empty
    k = int(min(MAX_PIVOTS, max(1, len(rows) // ROWS_PER_PIVOT)))
    pivots = _kmeans_pivots(unit, rows, k)
    theta_t = math.acos(min(1.0, threshold - SIM_BAND - PRUNE_MARGIN))
    home = np.empty(len(rows), np.int64)  # each row's nearest pivot, and its angle to it
    best = np.empty(len(rows), np.float32)
    for start in range(0, len(rows), 8192):
        rc = unit[rows[start:start + 8192]] @ pivots.T
        home[start:start + 8192] = np.argmax(rc, axis=1)
        best[start:start + 8192] = rc[np.arange(len(rc)), home[start:start + 8192]]
    angle = np.arccos(np.clip(best.astype(np.float64), -1.0, 1.0))
    band = np.searchsorted(PIVOT_BANDS, angle)
    # groups (pivot, band), in that order, each with its reach: widest angle + theta_t
    key = home * (len(PIVOT_BANDS) + 1) + band
    order = np.lexsort((rows, key))
    keys, starts = np.unique(key[order], return_index=True)
    groups = []
    wide_rows = []
    for gkey, a, b in zip(keys.tolist(), starts.tolist(), [*starts[1:].tolist(), len(order)]):
        members = rows[order[a:b]]
        reach = float(angle[order[a:b]].max()) + theta_t + PRUNE_MARGIN
        if reach <= PRUNE_MAX_REACH:
            groups.append((gkey // (len(PIVOT_BANDS) + 1), reach, members))
        else:
            wide_rows.append(members)
    out_r: list[np.ndarray] = []
    out_c: list[np.ndarray] = []
    rank = np.full(len(unit), len(groups), np.int64)  # a row's group order (wide rows: last)
    for gi, (_, _, members) in enumerate(groups):
        rank[members] = gi
    done = 0
    gi = 0
    for first in range(0, k, PIVOT_CHUNK):  # the columns' cosines to a chunk of pivots at a time
        last = min(k, first + PIVOT_CHUNK)
        if gi >= len(groups) or groups[gi][0] >= last:
            continue
        col_cos = np.empty((last - first, len(cols_all)), np.float32)
        for start in range(0, len(cols_all), 8192):
            col_cos[:, start:start + 8192] = pivots[first:last] @ unit[cols_all[start:start + 8192]].T
        while gi < len(groups) and groups[gi][0] < last:
            pivot, reach, members = groups[gi]
            cand = cols_all[col_cos[pivot - first] >= math.cos(reach)]
            if len(cand) > len(cols_all) * PRUNE_MAX_SHARE:  # too little pruned: compare it with
                rank[members] = len(groups)                   # everything, with the wide rows
                wide_rows.append(members)
                cand = cand[:0]
            elif triangle:
                cand = cand[rank[cand] >= gi]
            if len(cand):
                step = max(1, BLOCK_CELLS // len(cand))
                for s0 in range(0, len(members), step):
                    _collect(space, members[s0:s0 + step], cand, threshold, strict, out_r, out_c,
                             same=(rank[cand] == gi) if triangle else None)
            done += len(members)
            gi += 1
        if progress:
            progress(done)
    if wide_rows:
        wrows = np.sort(np.concatenate(wide_rows))
        if triangle:
            wmask = np.zeros(len(unit), bool)
            wmask[wrows] = True
            wr, wc = _block_pairs(space, wrows, wmask, threshold, strict, triangle=True)
        else:
            wr, wc = _block_pairs(space, wrows, cols_mask, threshold, strict, triangle=False)
        out_r.append(wr)
        out_c.append(wc)
        if progress:
            progress(len(rows))
    if not out_r:
        return empty
    r, c = np.concatenate(out_r), np.concatenate(out_c)
    if triangle:
        r, c = np.minimum(r, c), np.maximum(r, c)
    return r, c


def _collect(space: _Space, block: np.ndarray, cand: np.ndarray, threshold: float, strict: bool,
             out_r: list[np.ndarray], out_c: list[np.ndarray], *, same: np.ndarray | None) -> None:
    """The pairs above the threshold between rows ``block`` and columns ``cand`` (one
    product). ``same`` marks the columns of the block's own group, of which only those after
    the row are kept (each unordered pair once); None keeps every pair but a row with itself."""
    sims = space.unit[block] @ space.unit[cand].T
    r, c = np.nonzero(sims > threshold - SIM_BAND)
    if not len(r):
        return
    gr, gc = block[r], cand[c]
    keep = gr != gc
    if same is not None:
        keep &= ~same[c] | (gc > gr)
    keep &= _above(space, sims[r, c], gr, gc, threshold, strict)
    out_r.append(gr[keep])
    out_c.append(gc[keep])


# --- planning -------------------------------------------------------------------------------

def _space_name(target: Target, txn: Txn, config: MaintenanceConfig) -> tuple[str, bool]:
    """The space to compare in, and whether it must be created (the built-in one, first use)."""
    spaces = target.indexes.vectors.spaces(txn)
    if config.space is not None:
        if config.space not in spaces:
            raise EmbeddingError(f"unknown embedding space {config.space!r} (known: {', '.join(sorted(spaces)) or 'none'})",
                                 hint="create it with Engram.add_space, or leave MaintenanceConfig.space unset")
        return config.space, False
    for name in sorted(spaces):
        if spaces[name].model == HASHED_MODEL and spaces[name].auto:
            return name, False
    return BUILTIN_SPACE, True


def _builtin_vectors(target: Target, txn: Txn, docnos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The built-in space's vectors computed in memory (a plan on a file that lacks it)."""
    embed = HashedTfidfEmbedder(BUILTIN_DIMS, target.indexes.tokenizer)
    texts = [node_text(codec.decode_node(txn.get_present("nodes", codec.u64(int(d))), vectors=False)) for d in docnos]
    mat = embed(texts) if texts else np.zeros((0, BUILTIN_DIMS), np.float32)
    keep = np.any(mat != 0, axis=1)
    return docnos[keep], mat[keep]


_WORD_RE = re.compile(r"\w+")
# words that state a fact a similarity cannot weigh: one of them changed in a long text moves
# the vector little, yet "15000" / "25000" or "March" / "April" are two different facts
_CALENDAR_WORDS = frozenset((
    "january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
    "november", "december", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"))
# what ends a sentence (or a line): the capitalised word after it is not taken as a name
_SENTENCE_END = frozenset(".!?:;\n")


def _is_name(text: str, start: int) -> bool:
    """Whether the word at ``start`` of ``text`` is capitalised and not the first of a sentence."""
    if not text[start].isupper():
        return False
    i = start - 1
    while i >= 0 and text[i] in " \t":  # a walk back, not a slice: a long text has many words
        i -= 1
    return i >= 0 and text[i] not in _SENTENCE_END


def _unseen_words(tokenizer: Any, text: str) -> tuple[frozenset[str], tuple[str, ...]]:
    """What the built-in space cannot tell apart in ``text``: the words the index (and so the
    space) does not see (stop words and single characters), and, in text order, the words it
    cannot weigh: those holding a digit or naming a month or weekday (numbers, dates, times)
    and names (capitalised words not starting a sentence), normalised and lowercased as the
    tokenizer does. The order matters: "Alice owes Bob" and "Bob owes Alice" hold the same
    words, so the same vector."""
    form = tokenizer.normalize
    normal = unicodedata.normalize(form, text) if form else text
    low = normal.lower()
    kept = set(tokenizer.words(text))
    # positions in `normal`, not in `low`: lowercasing can lengthen a string ("İ" -> "i̇")
    facts = tuple(w for w, start in ((m.group().lower(), m.start()) for m in _WORD_RE.finditer(normal))
                  if w in _CALENDAR_WORDS or any(c.isdigit() for c in w) or _is_name(normal, start))
    return frozenset(w for w in _WORD_RE.findall(low) if w not in kept), facts


def _seen_alike(pairs: tuple[np.ndarray, np.ndarray], node_of: Callable[[int], Node],
                tokenizer: Any) -> tuple[np.ndarray, np.ndarray]:
    """The duplicate pairs of the built-in space whose texts also agree on the words it
    cannot see or weigh. Its vectors hold only the index's words, so "The migration is done"
    and "The migration is not done", or "Call mom at 5" and "Call mom at 6", have the same
    vector (cosine 1); and in a long text one other number or month ("the budget is 15000" /
    "25000") stays above the threshold: merged as duplicates, one of two different memories
    was deleted."""
    memo: dict[int, tuple[frozenset[str], tuple[str, ...]]] = {}

    def unseen(r: int) -> tuple[frozenset[str], tuple[str, ...]]:
        got = memo.get(r)
        if got is None:
            got = memo[r] = _unseen_words(tokenizer, node_text(node_of(r)))
        return got

    a, b = pairs
    keep = np.fromiter((unseen(x) == unseen(y) for x, y in zip(a.tolist(), b.tolist())), bool, len(a))
    return a[keep], b[keep]


def _summary_id(member_ids: Sequence[str]) -> str:
    digest = hashlib.sha256("\x00".join(sorted(member_ids)).encode("utf-8", "surrogatepass")).hexdigest()
    return "summary-" + digest[:24]


def _plan(target: Target, config: MaintenanceConfig, summarizer: Summarizer | None, now: float,
          *, plan_only: bool, progress: Progress | None) -> dict[str, Any]:
    """Read a snapshot and decide everything; returns the plan (nothing written)."""
    store = target.store
    report = MaintenanceReport(now=now, plan=plan_only)
    with store.read() as txn:
        space_name, create = _space_name(target, txn, config)
        fingerprint = _fingerprint(config, space_name)
        raw_state = txn.get("meta", STATE_KEY)
        state = codec.unpack(raw_state) if raw_state is not None else None
        full = (not config.incremental or state is None or create or not isinstance(state, dict)
                or state.get("fingerprint") != fingerprint)
        tokens = _dirty(txn)
        next_docno = txn.state.next_docno
        records: list[tuple[int, list[Any]]]
        if not full:
            assert state is not None
            old = _unpack_rows(state["rows"])
            start = int(state["next_docno"])
            found = {codec.from_u64(k): codec.record_fields(v) for k, v in txn.items("nodes", start=codec.u64(start))}
            changed = sorted(set(tokens) | set(found))
            for d in tokens:
                raw = None if d in found else txn.get("nodes", codec.u64(d))
                if raw is not None:
                    found[d] = codec.record_fields(raw)
            records = sorted(found.items())
            keep = ~np.isin(old["docno"], np.asarray(changed, dtype=np.uint64))
            rows = _concat(_take(old, keep), _rows_from(records))
            dirty = np.asarray([d for d, _ in records], dtype=np.uint64)
            # one row per stored memory, or the state lists memories that are gone (a forget
            # while a pass planned in another process, which then wrote the rows back): a full pass
            full = len(rows["docno"]) != txn.count("nodes")
        if full:
            records = [(codec.from_u64(k), codec.record_fields(v)) for k, v in txn.items("nodes")]
            rows = _rows_from(records)
            dirty = rows["docno"].copy()
        report.full = full
        if create:
            vdocs, vmat = _builtin_vectors(target, txn, rows["docno"])
        else:
            vdocs, vmat = target.indexes.vectors.live_rows(txn, space_name)
        normalized = create or bool(target.indexes.vectors.spaces(txn)[space_name].normalize)
        hashed = create or target.indexes.vectors.spaces(txn)[space_name].model == HASHED_MODEL
        space = _Space(np.asarray(vdocs), np.asarray(vmat), normalized=normalized)
        node_cache: dict[int, Node] = {}
        known_ids = {d: f[_POS["id"]] for d, f in records}
        del records

        def id_of(docno: int) -> str:
            got = known_ids.get(docno)
            return got if isinstance(got, str) else node(docno).id

        def node(docno: int) -> Node:
            got = node_cache.get(docno)
            if got is None:
                got = node_cache[docno] = codec.decode_node(txn.get_present("nodes", codec.u64(docno)), vectors=False)
            return got

        n = len(rows["docno"])
        tiers_before = [TIERS[t] for t in rows["tier"]]
        report.before_total = n
        report.before_by_tier = count_by_tier(tiers_before)

        # 1. decay, vectorised over the rows
        start_ms = rows["last"] if config.decay_from == "last_accessed" else rows["start"]
        if config.decay_from == "last_accessed":
            start_ms = np.where(rows["last"] != 0, rows["last"], rows["start"])
        new_tier = decay_tiers(rows["tier"], round(now * 1000) - start_ms, rows["access"], rows["importance"],
                               config, (rows["flags"] & PINNED) != 0)
        decayed = new_tier != rows["tier"]
        report.decayed = int(decayed.sum())

        # 2. similarities: changed rows (or all) against every comparable row
        vrow = space.rows_of(rows["docno"])
        has_vec = vrow >= 0
        comparable = has_vec & ((rows["flags"] & (STUB | CONSOLIDATED)) == 0)
        candidate = comparable & ((new_tier == 1) | (new_tier == 2))
        if config.keep_pinned:
            candidate &= (rows["flags"] & PINNED) == 0
        is_dirty = np.isin(rows["docno"], dirty)
        entered = candidate & ~((rows["tier"] == 1) | (rows["tier"] == 2))  # became warm/cold now
        query = (comparable & (is_dirty | entered)) if not full else comparable
        comp_v = np.zeros(len(space.docnos), bool)
        comp_v[vrow[comparable]] = True
        cand_v = np.zeros(len(space.docnos), bool)
        cand_v[vrow[candidate]] = True
        row_of_v = np.full(len(space.docnos), -1, np.int64)
        row_of_v[vrow[has_vec]] = np.nonzero(has_vec)[0]
        qv = vrow[query]
        report.compared = int(query.sum())
        tick = (lambda done: progress("compare", done, len(qv))) if progress else None
        threshold = min(config.dedupe_threshold, config.cluster_threshold)
        pr, pc = _pairs(space, qv, comp_v, threshold, strict=False, triangle=full, progress=tick)
        sims_needed = len(pr)
        # exact decisions per threshold for the pairs found
        dd_r: list[np.ndarray] = []
        dd_c: list[np.ndarray] = []
        cl_r: list[np.ndarray] = []
        cl_c: list[np.ndarray] = []
        if sims_needed:
            # in chunks: at 100k x 384 there are millions of pairs, and their rows would be GBs
            s = np.concatenate([np.einsum("ij,ij->i", space.unit[pr[k:k + PAIR_CHUNK]], space.unit[pc[k:k + PAIR_CHUNK]])
                                for k in range(0, len(pr), PAIR_CHUNK)])
            for (thr, strict, out_r, out_c) in ((config.dedupe_threshold, True, dd_r, dd_c),
                                                 (config.cluster_threshold, False, cl_r, cl_c)):
                keep = _above(space, s, pr, pc, thr, strict)
                out_r.append(row_of_v[pr[keep]])
                out_c.append(row_of_v[pc[keep]])
        dd = (np.concatenate(dd_r), np.concatenate(dd_c)) if dd_r else (np.zeros(0, np.int64),) * 2
        cl = (np.concatenate(cl_r), np.concatenate(cl_c)) if cl_r else (np.zeros(0, np.int64),) * 2

        if hashed and len(dd[0]):
            dd = _seen_alike(dd, lambda r: node(int(rows["docno"][r])), target.indexes.tokenizer)

        # 3. dedupe (greedy in docno order over the pairs above the threshold)
        neighbors: dict[int, list[int]] = {}
        for a, b in zip(np.minimum(*dd).tolist(), np.maximum(*dd).tolist()):
            neighbors.setdefault(a, []).append(b)
        for js in neighbors.values():
            js[:] = sorted(set(js))
        score = rows["importance"] + rows["access"] * 0.1
        pinned = (rows["flags"] & PINNED) != 0
        removed, into = greedy_dedupe(sorted(neighbors), neighbors, lambda k: float(score[k]),
                                      (lambda k: bool(pinned[k])) if config.keep_pinned else None)
        report.deduplicated = len(removed)
        alive = np.ones(n, bool)
        alive[list(removed)] = False
        merges: dict[int, dict[str, Any]] = {}
        survivor: dict[int, int] = {}
        for loser in sorted(removed):
            keeper = loser
            while keeper in into:
                keeper = into[keeper]
            survivor[loser] = keeper
            if config.merge_duplicates:
                m = merges.setdefault(keeper, {"tags": list(node(int(rows["docno"][keeper])).tags),
                                               "access_count": int(rows["access"][keeper]),
                                               "last_accessed": int(rows["last"][keeper])})
                lost = node(int(rows["docno"][loser]))
                m["tags"] = list(dict.fromkeys(m["tags"] + list(lost.tags)))
                m["access_count"] = _i64(m["access_count"] + int(rows["access"][loser]))
                m["last_accessed"] = max(m["last_accessed"], int(rows["last"][loser]))

        # 4. cluster neighbour counts (an upper bound kept in the state), clusters, summaries
        ccount = rows["ccount"].astype(np.int64)
        ccount[query] = 0
        if len(cl[0]):
            both = candidate[cl[0]] & candidate[cl[1]]
            a, b = cl[0][both], cl[1][both]
            np.add.at(ccount, a, 1)
            if full:
                np.add.at(ccount, b, 1)
            else:
                np.add.at(ccount, b[~query[b]], 1)  # an old row's bound grows by its new neighbours
        summaries: list[dict[str, Any]] = []
        archive_now: dict[int, bool] = {}
        if summarizer is not None:
            cand_alive = candidate & alive
            seeds = np.nonzero(cand_alive & (ccount + 1 >= config.min_cluster_size))[0]
            adjacency: dict[int, list[int]] = {}
            if len(seeds):
                ctick = (lambda done: progress("cluster", done, len(seeds))) if progress else None
                cand_v2 = np.zeros(len(space.docnos), bool)
                cand_v2[vrow[cand_alive]] = True
                sr, sc = _pairs(space, vrow[seeds], cand_v2, config.cluster_threshold, strict=False,
                                triangle=False, progress=ctick)
                for a, b in zip(row_of_v[sr].tolist(), row_of_v[sc].tolist()):
                    adjacency.setdefault(a, []).append(b)
                ccount[seeds] = 0
                np.add.at(ccount, row_of_v[sr], 1)
            groups = greedy_clusters(np.nonzero(cand_alive)[0].tolist(), lambda s: adjacency.get(s, ()),
                                     config.min_cluster_size)
            report.clusters_found = len(groups)
            for gi, group in enumerate(groups):
                if progress:
                    progress("summarize", gi, len(groups))
                members = [node(int(rows["docno"][i])) for i in group]
                try:
                    text = summarizer([m.content for m in members])
                except Exception:
                    continue
                if not isinstance(text, str) or len(text) < MIN_SUMMARY_CHARS:
                    continue
                best = int(group[0])
                for i in group[1:]:
                    if not score[best] >= score[i]:
                        best = int(i)
                lead = node(int(rows["docno"][best]))
                summary = {
                    "id": _summary_id([m.id for m in members]), "content": text,
                    "tags": list(dict.fromkeys(list(lead.tags) + ["consolidated"])),
                    "importance": max(m.importance for m in members), "tier": lead.tier, "source": lead.source,
                    "metadata": {"consolidatedFrom": len(group), "consolidatedAt": format_iso(now)},
                    "sources": [m.id for m in members]}
                if _summary_node(summary, now) is None:
                    continue  # a text no memory can hold: left alone, like a summarizer that raises
                summaries.append(summary)
                report.summarized += len(group)
                for i in group:
                    archive_now[i] = False  # sources are archived whole
        # 5. archive: memories in the archive tier not archived yet (truncated at the config's
        # length, as the pure pass truncates; a length of 0 truncates nothing there either)
        truncating = config.archive_truncate and config.archive_truncate_length > 0
        to_archive = np.nonzero(alive & (new_tier == 3) & ((rows["flags"] & STUB) == 0))[0]
        for i in to_archive.tolist():
            archive_now.setdefault(i, truncating and not (rows["flags"][i] & CONSOLIDATED))
        report.archived = len(archive_now)
        if truncating:  # Trace Lite counts the memories whose text is cut, not those kept whole
            limit = config.archive_truncate_length
            report.archived = sum(1 for i, cut in archive_now.items()
                                  if cut and utf16_len(node(int(rows["docno"][i])).content) > limit)

        # the operations, one per memory, in docno order
        ops: list[list[Any]] = []
        for i in sorted(set(np.nonzero(decayed & alive)[0].tolist()) | set(removed) | set(merges) | set(archive_now)):
            d = int(rows["docno"][i])
            op: dict[str, Any] = {}
            if i in removed:
                op["delete"] = True
                # deleted only while its survivor is unchanged; with merge_duplicates its edges go
                # there (a plan stored without "into" deletes it as before)
                k = int(rows["docno"][survivor[i]])
                op["into"] = [k, id_of(k), bool(config.merge_duplicates)]
            else:
                if decayed[i]:
                    op["tier"] = TIERS[int(new_tier[i])]
                    if i in archive_now and new_tier[i] == 3:
                        # the stub's tier is "archive" all the same; its archive entry keeps the
                        # tier it comes back in: "archive" there made unarchive give back a live
                        # memory in the archive tier, which the next pass archived again
                        op["tier"] = "cold"
                if i in merges:
                    op.update(merges[i])
                    op["last_accessed"] = op["last_accessed"] / 1000
                if i in archive_now:
                    op["archive"] = archive_now[i]
            ops.append([d, id_of(d), tokens.get(d), op])
            if i in removed:
                report.removed_ids.append(id_of(d))
            elif i in archive_now:
                report.archived_ids.append(id_of(d))
        report.summary_ids = [s["id"] for s in summaries]

        # the state after the pass
        post = dict(rows)
        post["tier"] = np.where(decayed, new_tier, rows["tier"]).astype(np.int8)
        post["ccount"] = np.minimum(ccount, 2**31 - 1).astype(np.int32)
        for i, m in merges.items():
            post["access"] = post["access"].copy()
            post["last"] = post["last"].copy()
            post["access"][i] = m["access_count"]
            post["last"][i] = m["last_accessed"]
        flags = post["flags"].copy()
        for i in archive_now:
            flags[i] |= STUB
            post["tier"][i] = 3
        post["flags"] = flags
        post = _take(post, alive)
        report.after_total = int(alive.sum()) + len(summaries)
        report.after_by_tier = count_by_tier([TIERS[t] for t in post["tier"]] + [s["tier"] for s in summaries])
        report.batches = -(-(len(ops) + len(summaries)) // config.batch_size) if ops or summaries else 0
    return {"id": os.urandom(16), "now": now, "space": space_name, "create_space": create, "ops": ops,
            "chars": config.archive_truncate_length if truncating else archive_ops.PREVIEW_CHARS,
            "summaries": summaries, "report": report, "tokens": tokens, "next_docno": next_docno, "base": raw_state,
            "state": {"fingerprint": fingerprint, "next_docno": int(next_docno), "rows": _pack_rows(post)}}


# --- applying -------------------------------------------------------------------------------

def _encode_plan(plan: Mapping[str, Any]) -> bytes:
    report: MaintenanceReport = plan["report"]
    return codec.pack({
        "v": 1, "id": plan["id"], "now": plan["now"], "space": plan["space"], "create_space": plan["create_space"],
        "chars": plan["chars"],
        "ops": plan["ops"], "summaries": plan["summaries"], "report": report.to_dict(),
        "tokens": [[d, t] for d, t in sorted(plan["tokens"].items())], "state": plan["state"]})


def _decode_plan(raw: bytes) -> dict[str, Any]:
    data = codec.unpack(raw)
    if not isinstance(data, dict) or data.get("v") != 1:
        raise CorruptFileError("the pending maintenance plan is malformed",
                               hint="restore from a dump, or delete and re-run maintenance")
    report = MaintenanceReport(**data["report"])
    return {**data, "report": report, "tokens": {int(d): t for d, t in data["tokens"]}}


def _apply_op(tx: PassTxn, plan: Mapping[str, Any], entry: Sequence[Any]) -> int:
    """Apply one memory's non-delete operation (deletes go through :func:`_apply_deletes`)
    unless the memory changed since the plan; returns the bytes of text dropped."""
    docno, id_, token, op = entry
    txn = tx._txn
    key = DIRTY_PREFIX + codec.u64(docno)
    if txn.get("meta", key) != token:
        return 0  # changed (or deleted: that logs too) after the snapshot: the next pass sees it
    if not _is_stored(tx, docno):
        return 0  # gone without a change-log entry (forget drops it): nothing left to change
    dropped = 0
    changes = {k: op[k] for k in ("tier", "tags", "access_count", "last_accessed") if k in op}
    if "archive" in op:  # one record write: the changes, then the stub (index rebuilt from it)
        truncate = bool(op["archive"])
        # a plan stored before "chars" was recorded truncated at the preview's length
        chars = int(plan.get("chars", archive_ops.PREVIEW_CHARS)) if truncate else archive_ops.PREVIEW_CHARS
        dropped = archive_ops.archive(tx, id_, truncate=truncate, chars=chars, now=plan["now"], changes=changes)
    elif changes:
        # none of these fields is indexed: patch the record in place (no decoding of its
        # embeddings, no index entries rewritten). The change-log entry an update would
        # write is the one dropped just below.
        txn.put("nodes", codec.u64(docno), codec.patch_node(txn.get_present("nodes", codec.u64(docno)), changes))
    txn.delete("meta", key)  # our own change: the new state accounts for it
    return dropped


def _apply_deletes(tx: PassTxn, graph: Graph, plan: Mapping[str, Any], op_docnos: set[int],
                   entries: Sequence[Sequence[Any]]) -> None:
    """The delete operations of one batch, in one ``delete_many``: each unless its memory
    changed since the plan (as :func:`_apply_op`). No other operation of the pass changes a
    memory that the pass deletes, so doing them first in their batch changes no outcome.
    A duplicate whose survivor changed or went since the plan stays (:func:`_unchanged`);
    with ``merge_duplicates`` a deleted duplicate's edges go to its survivor first
    (:meth:`Graph.move_edges`)."""
    txn = tx._txn
    keys = [DIRTY_PREFIX + codec.u64(e[0]) for e in entries]
    due = [(e, key) for e, key in zip(entries, keys) if txn.get("meta", key) == e[2] and _is_stored(tx, e[0])]
    kept = [e[0] for e, _ in due if "into" in e[3] and not _unchanged(tx, plan, op_docnos, int(e[3]["into"][0]))]
    if kept:
        # its survivor changed (or went) since the snapshot: it may no longer hold this text.
        # Kept, and logged as changed, so the next pass compares it again
        log_changes(txn, kept)
        due = [(e, key) for e, key in due if e[0] not in kept]
    if not due:
        return
    for e, _ in due:
        # in this transaction, before the delete would drop them; one by one in docno order,
        # so an edge between two duplicates of one batch ends as no edge (no self-link)
        into = e[3].get("into")
        if into is not None and (len(into) < 3 or into[2]):
            graph.move_edges(txn, e[0], int(into[0]), into[1])
    tx.delete_many([e[1] for e, _ in due])
    txn.delete_many("meta", [key for _, key in due])  # our own changes: the new state accounts for them


def _summary_node(s: Mapping[str, Any], now: float) -> Node | None:
    """The memory a planned summary becomes, or None when its text cannot be stored (longer
    than a memory may be, a lone surrogate): checked when the pass plans, so that a stored
    plan never holds a summary its apply would refuse, which no later call could finish."""
    try:
        node = Node(id=s["id"], content=s["content"], tags=tuple(s["tags"]), importance=s["importance"],
                    tier=s["tier"], source=s["source"], metadata=s["metadata"], created_at=now, last_accessed=now)
        codec.encode_node(node)
    except ValidationError:
        return None
    return node


def _apply_summary(tx: PassTxn, plan: Mapping[str, Any], s: Mapping[str, Any], op_docnos: set[int]) -> None:
    if tx.find(s["id"]) is not None:
        return
    now = plan["now"]
    node = _summary_node(s, now)
    if node is None:  # a plan stored before summaries were checked: skipping it lets the pass finish
        return
    tx._put_new(node)
    for src in s["sources"]:
        if tx.find(src) is None:
            continue
        tx.link(s["id"], src, "derived_from", now=now)
        docno = _docno_of(tx, src)
        key = DIRTY_PREFIX + codec.u64(docno)
        # unchanged since the snapshot: its token is the snapshot's, or none once this plan's
        # own operation on it was applied (which takes it out of the change log)
        expected = None if docno in op_docnos else plan["tokens"].get(docno)
        if tx._txn.get("meta", key) == expected:
            archive_ops.archive(tx, src, truncate=False, now=now)
            tx._txn.delete("meta", key)  # our own change (a source changed meanwhile stays for the next pass)


def _unchanged(tx: PassTxn, plan: Mapping[str, Any], op_docnos: set[int], docno: int) -> bool:
    """Whether memory ``docno`` is stored and unchanged since the plan's snapshot: its change-log
    token is the snapshot's, or none once this plan's own operation on it was applied (which
    takes it out of the change log; any later change logs a new token)."""
    if not _is_stored(tx, docno):
        return False
    token = tx._txn.get("meta", DIRTY_PREFIX + codec.u64(docno))
    return token == plan["tokens"].get(docno) or (token is None and docno in op_docnos)


def _is_stored(tx: PassTxn, docno: int) -> bool:
    """Whether memory ``docno`` is still stored. A docno is never given again, so its
    record is the memory the plan named (an id deleted and added again has a new docno)."""
    return tx._txn.contains("nodes", codec.u64(docno))


def _docno_of(tx: PassTxn, id_: str) -> int:
    raw = tx._txn.get_present("ids", tx._txn.store.blind(b"id", id_.encode("utf-8", "surrogatepass")))
    return codec.from_u64(raw)


def _run_plan(target: Target, plan: dict[str, Any], batch_size: int, progress: Progress | None) -> MaintenanceReport:
    report: MaintenanceReport = plan["report"]
    steps: list[tuple[str, Any]] = [("op", e) for e in plan["ops"]] + [("summary", s) for s in plan["summaries"]]
    total = len(steps)
    op_docnos = {e[0] for e in plan["ops"]}
    while True:
        with target.transaction() as tx:
            prog = tx._txn.get("meta", PROGRESS_KEY)
            if prog is None:
                break  # finished (by another process)
            plan_id, done, _ = codec.unpack(prog)
            if plan_id != plan["id"]:
                break
            if done >= total:
                _finish(tx._txn, plan)
                break
            batch = steps[done:done + batch_size]
            deletes = [item for kind, item in batch if kind == "op" and item[3].get("delete")]
            _apply_deletes(tx, target.indexes.graph, plan, op_docnos, deletes)
            dropped = 0
            for kind, item in batch:
                if kind == "op":
                    if not item[3].get("delete"):
                        dropped += _apply_op(tx, plan, item)
                else:
                    _apply_summary(tx, plan, item, op_docnos)
            report.bytes_dropped += dropped
            done = min(done + batch_size, total)
            tx._txn.put("meta", PROGRESS_KEY, codec.pack([plan["id"], done, report.bytes_dropped]))
        if progress:
            progress("write", done, total)
    return report


def _finish(txn: Txn, plan: Mapping[str, Any]) -> None:
    """The last transaction: new state and report, processed change-log entries dropped."""
    report: MaintenanceReport = plan["report"]
    prog = txn.get("meta", PROGRESS_KEY)
    if prog is not None:
        report.bytes_dropped = codec.unpack(prog)[2]
    # A planned delete that _apply_deletes skipped (the duplicate, or its survivor, changed
    # since the snapshot) left its memory stored (a docno is never given again): the report
    # lists and counts only the duplicates the pass deleted, not the plan's decisions
    kept = {e[1] for e in plan["ops"] if e[3].get("delete") and txn.contains("nodes", codec.u64(e[0]))}
    if kept:
        report.removed_ids = [i for i in report.removed_ids if i not in kept]
        report.deduplicated = len(report.removed_ids)
    for d, token in plan["tokens"].items():
        key = DIRTY_PREFIX + codec.u64(d)
        if txn.get("meta", key) == token:
            txn.delete("meta", key)
    txn.put("meta", STATE_KEY, codec.pack(plan["state"]))
    txn.put("meta", LAST_KEY, codec.pack(_last_record(report)))
    txn.delete("meta", PLAN_KEY)
    txn.delete("meta", PROGRESS_KEY)


def _last_record(report: MaintenanceReport) -> dict[str, Any]:
    """What ``stats`` shows of the last pass: when (the pass's clock) and what it did. Counts
    only: no ids, so a forgotten memory leaves no trace here."""
    # clamped: a plan stored by a version that took any finite ``now`` must still finish
    return {"at": format_iso(min(max(report.now, -MAX_TIME), MAX_TIME)), "memories": report.after_total, "decayed": report.decayed,
            "deduplicated": report.deduplicated, "clusters": report.clusters_found,
            "summarized": report.summarized, "archived": report.archived, "bytes_dropped": report.bytes_dropped,
            "compared": report.compared, "full": report.full}


def read_last_pass(txn: Txn) -> dict[str, Any] | None:
    """When the last finished pass ran and what it did (for ``stats``), or None when none ran."""
    raw = txn.get("meta", LAST_KEY)
    if raw is None:
        return None
    data = codec.unpack(raw)
    return data if isinstance(data, dict) else None


def maintain(target: Target, config: MaintenanceConfig | None = None, summarizer: Summarizer | None = None, *,
             now: float | None = None, plan: bool = False, progress: Progress | None = None) -> MaintenanceReport:
    """One maintenance pass over the file (see the module docstring and spec/maintenance.md).

    Raises:
        ValidationError: bad arguments.
        EmbeddingError: ``config.space`` names no space of the file.
        ReadOnlyError: the file is open read-only (unless ``plan``).
        ValidationError: called inside a ``db.transaction()`` block (unless ``plan``).
    """
    config = config or MaintenanceConfig()
    if not isinstance(config, MaintenanceConfig):
        raise ValidationError("config must be a MaintenanceConfig")
    if summarizer is not None and not callable(summarizer):
        raise ValidationError("summarizer must be a callable from a list of texts to one text")
    if not plan:  # its batches must commit one by one (resumable, checkpointed)
        target.store.outside_transaction("maintain()")
    started = time.perf_counter()
    with target.store.read() as txn:
        pending = txn.get("meta", PLAN_KEY)
    if pending is not None:
        pending_plan = _decode_plan(pending)
        report: MaintenanceReport
        if plan:
            report = pending_plan["report"]
            report.plan = True
            return report
        report = _run_plan(target, pending_plan, config.batch_size, progress)
        report.duration_s = time.perf_counter() - started
        return report
    now = now_ts(now)
    if not -MAX_TIME <= now <= MAX_TIME:  # the pass writes it as an ISO time, as JavaScript can
        raise ValidationError(f"now must be a finite number of seconds since the epoch within JavaScript's dates "
                              f"(+-{MAX_TIME:.3g}), got {now!r}",
                              hint="a millisecond timestamp (Date.now()) is 1000 times too large")
    for _ in range(_PLAN_ATTEMPTS):
        new_plan = _plan(target, config, summarizer, now, plan_only=plan, progress=progress)
        report = new_plan["report"]
        if plan:
            report.duration_s = time.perf_counter() - started
            return report
        if new_plan["create_space"]:
            space = EmbeddingSpace(name=BUILTIN_SPACE, model=HASHED_MODEL, dims=BUILTIN_DIMS, normalize=True,
                                   auto=True)
            target.store.write(functools.partial(_add_builtin_space, target, space=space))
        if target.store.write(functools.partial(_begin, plan=new_plan)):
            break
        # Another pass (another process) or a forget changed the state after this plan's
        # snapshot: it may have applied these very operations already (and dropped their
        # change-log entries, which is how an operation sees a change), so plan again.
    else:
        raise BusyError(f"other maintenance passes changed the file while this one planned, {_PLAN_ATTEMPTS} times",
                        hint="run maintain again once the other passes have finished")
    if new_plan["ops"] or new_plan["summaries"]:
        if progress:
            progress("write", 0, len(new_plan["ops"]) + len(new_plan["summaries"]))
        report = _run_plan(target, new_plan, config.batch_size, progress)
    report.duration_s = time.perf_counter() - started
    return report


_PLAN_ATTEMPTS = 3


def _add_builtin_space(target: Target, txn: Txn, *, space: Any) -> None:
    if space.name not in target.indexes.vectors.spaces(txn):  # another pass may have created it
        target.indexes.add_space(txn, space)


def _begin(txn: Txn, plan: Mapping[str, Any]) -> bool:
    """Store ``plan`` (or, with nothing to write, finish it: the state and when this pass
    ran), unless another pass or a forget has changed the state or the change log it was
    planned from: False then."""
    if txn.get("meta", PLAN_KEY) is not None:
        raise ValidationError("another maintenance pass is running on this file",
                              hint="wait for it; a killed pass is finished by the next call")
    if txn.get("meta", STATE_KEY) != plan["base"]:
        return False
    # a change-log entry is removed only by a pass (or forget) that has dealt with its memory
    if any(txn.get("meta", DIRTY_PREFIX + codec.u64(d)) is None for d in plan["tokens"]):
        return False
    txn.put("meta", PROGRESS_KEY, codec.pack([plan["id"], 0, 0]))
    if plan["ops"] or plan["summaries"]:
        txn.put("meta", PLAN_KEY, _encode_plan(plan))
    else:
        _finish(txn, plan)
    return True


def iter_dirty(txn: Txn) -> Iterator[int]:
    """Docnos in the change log (for tests and stats)."""
    yield from _dirty(txn)
