"""Segmented BM25 postings inside the encrypted file (spec/bm25.md).

Layout (every value is sealed by the store; keys never hold a plaintext term or id):

``postings`` table
    ``segno (u32 BE) | blind(term) (16 bytes)`` -> posting block of that term in that segment
    (segment first, so a new segment's blocks are one contiguous run of keys and pages;
    directories of version 1 and 2 keyed ``blind | segno``, converted by :meth:`SegmentedBM25.migrate`).
``segments`` table
    ``b"dir"``                -> the directory: live segments, tombstones, corpus statistics.
    ``b"s" | segno (u32 BE)`` -> the segment's documents: docnos and lengths (a posting block
                                  whose "tf" column is the document length).
    ``b"v" | segno (u32 BE)`` -> the blinded terms present in the segment (for merges).

    ``b"d" | run (u32 BE)``   -> a run of tombstones: sorted dead docnos of one segment.

A write transaction adds one immutable segment. A delete or update marks the old
``(segment, docno)`` pair dead (a tombstone): the transaction's tombstones of a segment
go into one new run record, merged with the segment's newest runs only while those are
less than twice its size (a binary counter), so a delete rewrites O(log dead) tombstones
amortised, never the segment's whole dead list. Queries skip dead pairs and merges drop
them. Segments merge by a tiered policy (:data:`MERGE_FACTOR` segments of the same size
tier become one), in bounded steps.

Scoring is Lucene's BM25 as bm25s implements it (method ``"lucene"``)::

    idf(t)      = ln(1 + (N - df + 0.5) / (df + 0.5))
    score(d, q) = sum over query terms t (repeats count): w_t * idf(t) * tf / (tf + k1 * (1 - b + b * dl / avgdl))

with k1 = 1.2, b = 0.75, N the live document count and avgdl their mean length. Ties
break by docno ascending.
"""
from __future__ import annotations

import functools
import hashlib
import heapq
import itertools
import math
import struct
import sys
import threading
import weakref
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any, TypeVar, cast
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence

import numpy as np
from numpy.typing import NDArray
import zstandard

import msgpack

from .. import _accel
from ..cache import LRUCache, mb_to_bytes
from ..codec import ZstdPerThread
from ..errors import CorruptFileError, ValidationError

if TYPE_CHECKING:  # annotations only
    from ..store import Txn

__all__ = [
    "K1",
    "B",
    "IdfMasses",
    "MERGE_FACTOR",
    "SegmentedBM25",
    "TermDocs",
    "count_postings",
    "encode_block",
    "encode_blocks",
    "decode_block",
    "decode_blocks",
    "lucene_idf",
    "lucene_tf_part",
    "snapshot_id",
    "top_k",
]

K1 = 1.2
B = 0.75
# SegmentedBM25.idf_mass: per query term, (w * idf, its live docnos as sorted runs)
IdfMasses = dict[str, tuple[float, list[np.ndarray]]]
MERGE_FACTOR = 10
# Segments whose dead fraction reaches this are rewritten alone, dropping their tombstones.
DEAD_REWRITE_FRACTION = 0.5
# apply() runs at most one merge step, and only when it reads at most this many documents,
# so a single remember() never pays for a large merge; larger merges run from merge().
AUTO_MERGE_MAX_DOCS = 20_000
# A merge or purge rewrites postings in chunks of whole terms holding about this many
# postings (read, filtered and encoded together), so its memory is one chunk's (tens of
# MB), whatever the size of the segments it rewrites; blocks are read _MERGE_BATCH at a time.
MERGE_CHUNK_POSTINGS = 1 << 20
_MERGE_BATCH = 512

BLOCK_RAW = 1
BLOCK_ZSTD = 2
# Below this a zstd frame costs more than it saves: from 96 to 255 bytes it saved ~23 % of
# those blocks (~60 KB per 32k-document segment) for ~9 us of CPU each (spec/bm25.md, "Blocks")
_ZSTD_MIN = 256
_MAX_BLOCK_BYTES = 1 << 31
_HEAD = struct.Struct("<BIBB")  # kind, count, docno-delta width, value width
_SEG = struct.Struct(">I")
BLIND_LEN = 16
DIR_KEY = b"dir"
# 4: as 3, and a segment listed with layout 1 is packed (one PACKED_PREFIX record, no
# per-term records); written while any segment is packed, else 3, which older engramdb reads.
# 3: postings keyed segment first. 2: keyed ``blind | segno`` (read; a writable open converts
# it, SegmentedBM25.migrate). 1: also tombstones inline in the directory (migrated by any write).
PACKED_VERSION = 4
SEG_FIRST_VERSION = 3
RUN_PREFIX = b"d"  # b"d" | u32be(run) -> a run of one segment's dead docnos
# b"p" | u32be(segment) -> a small segment's postings in one record (spec/bm25.md, "segments"):
# a commit then seals a handful of records instead of one per distinct term, and a merge of
# small segments reads one record per segment instead of one per (term, segment).
PACKED_PREFIX = b"p"
# Writers pack segments of at most SMALL_SEGMENT_DOCS documents (tests set it False to write
# the version-3 layout, per-term records only, as engramdb before 2026-12-01 did).
PACK_SMALL = True
_U32 = struct.Struct("<I")
# A new run of tombstones absorbs the segment's newest runs while they are smaller than this
# many times its size: runs then shrink geometrically (at most ~log2(dead) of them) and each
# tombstone is rewritten O(log dead) times in all.
RUN_MERGE_RATIO = 2
# top(): a posting list longer than this many times all the other query lists together is
# probed by binary search instead of scanned (see SegmentedBM25.top); measured at 100k
# documents, probing wins from about 6x on.
LOOKUP_RATIO = 8.0
# top(): each term's best documents are cached at least this deep (a recall asks for a few
# times its top_k).
TERM_TOP_CACHED = 64
# The decoded-postings cache's default limit (MiB), settable with engramdb.open(cache_mb=).
DEFAULT_CACHE_MB = 64.0
# A term's cached postings keep the segments of at most this many documents (the ones the
# automatic merges rewrite: MERGE_FACTOR of them fit in AUTO_MERGE_MAX_DOCS) in a small
# "delta" run apart from the large segments' "base" run, so a commit or a small merge
# never copies or rereads a long posting list.
SMALL_SEGMENT_DOCS = AUTO_MERGE_MAX_DOCS // MERGE_FACTOR
# The per-thread score accumulator of top() is allocated with this much room past the
# largest docno (a fraction), so a stream of new documents reallocates it rarely.
_ACC_HEADROOM = 1 / 16
# A handle remembers where its latest merges moved each input segment's postings (for
# relabelling cached deltas, SegmentedBM25._moved) for about this many merged-away segments
# (~100 bytes each; an entry older than that is rebuilt from the blocks, as before).
_MERGES_KEPT = 4096
# Runs longer than this keep their postings' count per (tf, dl) pair, for ranking.
_GROUPED_MIN = 4 * TERM_TOP_CACHED + 64
# A long run keeps apart, grouped by pair, the postings of the pairs fewer than this many
# postings dominate (its "frontier", see _Run): they hold its best documents to this depth
# under any N and avgdl (recall asks BM25 for max(50, 8 * top_k): up to top_k 32). Measured
# at 100k documents: 1.8 % of the longest runs' postings, 5 % over 199 runs of 320-98k
# (1.9 % and 0.6 % at depth 64).
_FRONTIER_DEPTH = 4 * TERM_TOP_CACHED
# ... unless the frontier holds more than this share of the run (its docnos would then cost
# more memory than ranking the pairs over the whole run costs time).
_FRONTIER_MAX_SHARE = 0.25
# Runs longer than this keep their docnos as uint32 when they fit (half the memory of int64;
# shorter runs stay int64, which indexes without a cast).
_COMPACT_MIN = 2048
# a long run without a usable frontier is scanned whole by the C extension's best_runs up to
# this many postings (a pass over its codes, ~1 ns each); beyond, its pairs are ranked first
_SCAN_MAX = 1 << 16

T = TypeVar("T")
_zstd = ZstdPerThread(level=1)  # one compressor and decompressor per thread (see there)


# --- pure functions -----------------------------------------------------------------


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _unpack(data: bytes) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise CorruptFileError(f"an index record does not decode ({type(exc).__name__})",
                               hint="run `engramdb verify --fix FILE` to rebuild the indexes") from None


def snapshot_id(txn: Txn, fallback: Callable[[], int]) -> int:
    """The id of the committed state ``txn`` reads (what a cache built from it is valid for).

    ``store.last_txnid()`` called after the transaction began may already be newer than the
    snapshot, and labelling a cache with it would serve stale data until the next commit.
    ``fallback`` serves transaction objects without a snapshot id (test doubles).
    """
    snapshot = getattr(txn, "snapshot_id", None)
    return int(snapshot) if snapshot is not None else fallback()


def lucene_idf(n_docs: int, df: np.ndarray | int) -> np.ndarray | float:
    """Lucene's idf: ``ln(1 + (N - df + 0.5) / (df + 0.5))`` (always positive)."""
    return np.log1p((n_docs - np.asarray(df, dtype=np.float64) + 0.5) / (np.asarray(df, dtype=np.float64) + 0.5))


@functools.lru_cache(maxsize=4096)
def _idf(n_docs: int, df: int) -> float:
    """:func:`lucene_idf` of one term as a float, memoised (a numpy call on a scalar costs
    microseconds, and every query term asks for it; ``math.log1p`` would differ from numpy's
    in the last bit for some inputs, and scores must not depend on the path). The same
    float operations as :func:`lucene_idf`, on scalars (its 0-d arrays cost more)."""
    fdf = float(df)
    return float(np.log1p((n_docs - fdf + 0.5) / (fdf + 0.5)))


# numpy.log1p's float64 loop for the C extension's idf_values: [] until first asked, then
# [the call-info capsule] or [None] (numpy without the API, or a loop that does not give
# _idf's bits: then numpy's ufunc is called as before)
_LOG1P_LOOP: list[Any] = []


def _log1p_loop(native: _accel.Native) -> Any:
    """numpy.log1p's strided float64 loop as a capsule for ``native.idf_values`` (numpy's
    documented, unstable ``ufunc._resolve_dtypes_and_context`` / ``_get_strided_loop``, NumPy
    >= 1.24), or None. Checked once against :func:`_idf` on a sample (one element and
    several): the loop is the one ``np.log1p`` runs over a contiguous array, so it gives
    the same bits; a numpy that answered otherwise is not used."""
    loop = None
    try:
        f8 = np.dtype(np.float64)
        loop = np.log1p._resolve_dtypes_and_context((f8, None))[1]  # type: ignore[attr-defined]
        np.log1p._get_strided_loop(loop, fixed_strides=(f8.itemsize, f8.itemsize))  # type: ignore[attr-defined]
        for n_docs, dfs in ((1000, [7]), (10**6 + 3, [1, 2, 3, 17, 250, 4096, 65537, 10**6, 999_999, 0, 31])):
            if native.idf_values(loop, n_docs, dfs) != [_idf(n_docs, df) for df in dfs]:
                loop = None
                break
    except Exception:  # any failure of an unstable numpy API: use np.log1p
        loop = None
    _LOG1P_LOOP[:] = [loop]
    return loop


def _idfs(n_docs: int, dfs: Sequence[int]) -> list[float]:
    """:func:`_idf` of each of ``dfs``, the same floats: the same scalar operations for the
    argument, then one ``np.log1p`` over them all (numpy's log1p loop computes each element
    alone, so an element's bits do not depend on the array it is in; a test checks it against
    :func:`_idf`). After a commit every query term's idf is new (N moved), and a numpy call
    per term cost ~5 µs on the CPU a commit leaves cold; the ufunc call around the loop
    still ~20 µs a query, so the C extension computes the arguments and calls numpy's own
    log1p loop directly (``idf_values``: the same loop, the same bits; :func:`_log1p_loop`)."""
    native = _accel.NATIVE
    if native is not None and dfs:
        loop = _LOG1P_LOOP[0] if _LOG1P_LOOP else _log1p_loop(native)
        if loop is not None:
            return native.idf_values(loop, n_docs, dfs)
    if len(dfs) <= 1:
        return [_idf(n_docs, df) for df in dfs]
    args = [(n_docs - fdf + 0.5) / (fdf + 0.5) for fdf in map(float, dfs)]
    out: list[float] = np.log1p(np.array(args)).tolist()
    return out


def lucene_tf_part(tf: np.ndarray, dl: np.ndarray, avgdl: float, k1: float = K1, b: float = B) -> np.ndarray:
    """The term-frequency factor ``tf / (tf + k1 * (1 - b + b * dl / avgdl))`` in float64."""
    tf = tf.astype(np.float64)
    part: NDArray[np.float64] = tf / (k1 * ((1.0 - b) + b * dl.astype(np.float64) / avgdl) + tf)
    return part


def top_k(docnos: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best (docno, score) pairs: score descending, then docno ascending.

    Exact under ties: every candidate tied with the k-th score is considered before the
    docno tie-break, so the result does not depend on input order.
    """
    if k <= 0 or docnos.size == 0:
        return docnos[:0], scores[:0]
    if docnos.size > k:
        part = np.argpartition(-scores, k - 1)[:k]
        threshold = scores[part].min()
        keep = scores >= threshold
        docnos, scores = docnos[keep], scores[keep]
    order = np.lexsort((docnos, -scores))[:k]
    return docnos[order], scores[order]


def _top_numpy(acc: np.ndarray, terms: Sequence[Sequence[tuple[np.ndarray, np.ndarray | None, np.ndarray]]],
               longest: int, best: np.ndarray | None, k: int, floor: float) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`SegmentedBM25.top`'s adds and selection for two or more terms (``k`` positive),
    in numpy (the C extension's ``top_terms`` gives the same arrays in one call).

    ``terms``: each term's runs ``(docnos, codes, values)``, in the summation order; ``acc``:
    a zeroed accumulator beyond every docno, zeroed again on return; ``longest``: the term
    looked up rather than added (-1: none), ``best`` its ``k`` best docnos; ``floor``: a
    score the k-th best reaches (0.0: none known). The candidates are the other terms'
    docnos and ``best``; the result their ``k`` best, score descending then docno ascending.
    """
    if longest >= 0:
        cand = np.concatenate([r[0] for i, runs in enumerate(terms) if i != longest for r in runs]
                              + [cast("np.ndarray", best)])
    else:
        cand = np.concatenate([r[0] for runs in terms for r in runs])
    try:
        for i, runs in enumerate(terms):  # sorted term order: the same sums as scores()
            for docnos, codes, values in runs:
                if i == longest:
                    # cand may repeat a docno; a fancy-indexed add then adds once, as it must
                    pos = np.searchsorted(docnos, _as_dtype_of(cand, docnos))
                    pos[pos == docnos.size] = 0
                    hit = docnos[pos] == cand
                    at = pos[hit]
                    acc[cand[hit]] += values[at if codes is None else codes[at]]
                else:
                    acc[docnos] += values if codes is None else values[codes]
        cscores = acc[cand]
    finally:
        acc[cand] = 0.0  # every touched slot is a candidate
    if floor > 0:
        keep = cscores >= floor
        cand, cscores = cand[keep], cscores[keep]
    m = k * len(terms)
    if cand.size > m:
        threshold = cscores[np.argpartition(-cscores, m - 1)[:m]].min()
        keep = cscores >= threshold
        cand, cscores = cand[keep], cscores[keep]
    order = np.lexsort((cand, -cscores))
    cand, cscores = cand[order], cscores[order]
    first = np.ones(cand.size, dtype=bool)
    first[1:] = cand[1:] != cand[:-1]
    return cand[first][:k].astype(np.uint64), cscores[first][:k]


def _width(max_value: int) -> int:
    if max_value < 1 << 8:
        return 1
    if max_value < 1 << 16:
        return 2
    if max_value < 1 << 32:
        return 4
    return 8


_DT = {1: "<u1", 2: "<u2", 4: "<u4", 8: "<u8"}


def encode_block(docnos: np.ndarray, values: np.ndarray) -> bytes:
    """Encode strictly increasing docnos and their positive counts (spec/bm25.md, "Blocks").

    Docnos are delta-coded; both columns use the narrowest little-endian width that fits.
    Bodies larger than a few dozen bytes are zstd-compressed.

    Raises:
        ValidationError: the docnos are not strictly increasing or the columns differ in length.
    """
    docnos = np.asarray(docnos, dtype=np.uint64)
    if docnos.ndim != 1:
        raise ValidationError("a posting block needs two 1-D columns of equal length")
    return encode_blocks(docnos, values, np.asarray([0, docnos.size]))[0]


def _as_dtype_of(values: np.ndarray, like: np.ndarray) -> np.ndarray:
    """``values`` (docnos) in ``like``'s dtype when they all fit it, so that a binary search
    of them in ``like`` does not copy ``like`` to a common dtype; else as they are."""
    if values.dtype == like.dtype or not values.size or int(values.max()) > np.iinfo(like.dtype).max:
        return values
    return values.astype(like.dtype)


def _widths(maxima: np.ndarray) -> np.ndarray:
    return np.select([maxima < 1 << 8, maxima < 1 << 16, maxima < 1 << 32], [1, 2, 4], 8)


def encode_blocks(docnos: np.ndarray, values: np.ndarray, bounds: np.ndarray) -> list[bytes]:
    """:func:`encode_block` for many blocks at once: block ``j`` is rows
    ``bounds[j]:bounds[j + 1]``. Vectorised, so a segment of many short posting lists costs
    a few numpy passes plus one small bytes join per block.

    Raises:
        ValidationError: docnos not strictly increasing within a block, or column mismatch.
    """
    docnos = np.asarray(docnos, dtype=np.uint64)
    values = np.asarray(values, dtype=np.uint64)
    bounds = np.asarray(bounds, dtype=np.int64)
    if docnos.shape != values.shape or docnos.ndim != 1:
        raise ValidationError("a posting block needs two 1-D columns of equal length")
    native = _accel.NATIVE
    if native is not None and bounds.ndim == 1 and bounds.size and bounds[0] == 0 and bounds[-1] == docnos.size \
            and (bounds.size < 2 or np.all(bounds[1:] >= bounds[:-1])):
        made = native.posting_blocks(np.ascontiguousarray(docnos), np.ascontiguousarray(values),
                                     np.ascontiguousarray(bounds), _ZSTD_MIN)
        if made is not None:  # None: docnos not increasing somewhere, said below
            blocks, compress = made
            zc = _zstd.compress
            for j in compress:
                raw = blocks[j]
                blocks[j] = raw[:_HEAD.size] + zc(memoryview(raw)[_HEAD.size:])
            return blocks
    starts, ends = bounds[:-1], bounds[1:]
    if docnos.size > 1:
        inner = np.ones(docnos.size - 1, dtype=bool)
        inner[starts[(starts > 0) & (starts < docnos.size)] - 1] = False
        if not np.all(docnos[1:][inner] > docnos[:-1][inner]):
            raise ValidationError("posting docnos must be strictly increasing")
    deltas = np.diff(docnos, prepend=np.uint64(0))
    nonempty = starts < ends
    deltas[starts[nonempty]] = docnos[starts[nonempty]]
    dws = np.ones(len(starts), dtype=np.int64)
    vws = np.ones(len(starts), dtype=np.int64)
    if docnos.size:
        dws[nonempty] = _widths(np.maximum.reduceat(deltas, starts[nonempty]))
        vws[nonempty] = _widths(np.maximum.reduceat(values, starts[nonempty]))
    cols_d = {w: deltas.astype(_DT[w]) for w in set(dws[nonempty].tolist())}
    cols_v = {w: values.astype(_DT[w]) for w in set(vws[nonempty].tolist())}
    out = []
    head, zc = _HEAD.pack, _zstd.compress
    for a, b, dw, vw in zip(starts.tolist(), ends.tolist(), dws.tolist(), vws.tolist()):
        if a == b:
            out.append(head(BLOCK_RAW, 0, 1, 1))
            continue
        body = cols_d[dw][a:b].tobytes() + cols_v[vw][a:b].tobytes()
        if len(body) >= _ZSTD_MIN:
            out.append(head(BLOCK_ZSTD, b - a, dw, vw) + zc(body))
        else:
            out.append(head(BLOCK_RAW, b - a, dw, vw) + body)
    return out


def _block_body(data: bytes) -> tuple[int, int, int, bytes]:
    """``(count, docno width, value width, body)`` of a block, checked and decompressed."""
    if len(data) < _HEAD.size:
        raise CorruptFileError("a posting block is truncated")
    kind, count, dw, vw = _HEAD.unpack_from(data)
    if dw not in _DT or vw not in _DT or count * (dw + vw) > _MAX_BLOCK_BYTES:
        raise CorruptFileError("a posting block has an invalid header")
    body = data[_HEAD.size:]
    if kind == BLOCK_ZSTD:
        try:
            body = _zstd.decompress(body, max_output_size=count * (dw + vw))
        except zstandard.ZstdError:
            raise CorruptFileError("a posting block does not decompress") from None
    elif kind != BLOCK_RAW:
        raise CorruptFileError(f"unknown posting block kind {kind}", hint="upgrade engramdb to read this file")
    if len(body) != count * (dw + vw):
        raise CorruptFileError("a posting block has the wrong length")
    return count, dw, vw, body


def decode_block(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`encode_block`: ``(docnos uint64, values uint32-or-wider)``.

    Raises:
        CorruptFileError: unknown block kind, bad widths, or a length that does not match.
    """
    count, dw, vw, body = _block_body(data)
    deltas = np.frombuffer(body, dtype=_DT[dw], count=count).astype(np.uint64)
    values = np.frombuffer(body, dtype=_DT[vw], count=count, offset=count * dw).astype(np.int64)
    docnos = np.cumsum(deltas, dtype=np.uint64)
    if count > 1 and not np.all(deltas[1:] > 0):
        raise CorruptFileError("a posting block's docnos are not increasing")
    return docnos, values


def _decode_raw_blocks(datas: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """:func:`decode_blocks` of many small uncompressed blocks, vectorised over all of them
    (a merge of small segments decodes ~500 blocks of a few postings each, where a Python
    step per block cost more than the decoding); None when a block is compressed or not
    well formed (the per-block path then decodes it or raises the precise error)."""
    n = len(datas)
    if n < 16:
        return None
    lens = np.fromiter(map(len, datas), dtype=np.int64, count=n)
    if int(lens.min()) < _HEAD.size:
        return None
    buf = np.frombuffer(b"".join(datas), dtype=np.uint8)
    starts = np.cumsum(lens) - lens
    kind = buf[starts]
    count = (buf[starts + 1].astype(np.int64) | buf[starts + 2].astype(np.int64) << 8
             | buf[starts + 3].astype(np.int64) << 16 | buf[starts + 4].astype(np.int64) << 24)
    dw = buf[starts + 5].astype(np.int64)
    vw = buf[starts + 6].astype(np.int64)
    ok = np.isin(dw, (1, 2, 4, 8)) & np.isin(vw, (1, 2, 4, 8))
    if not (bool(np.all(kind == BLOCK_RAW)) and bool(ok.all()) and np.array_equal(lens, _HEAD.size + count * (dw + vw))):
        return None
    total = int(count.sum())
    block_of = np.repeat(np.arange(n), count)
    first = np.cumsum(count) - count
    j = np.arange(total, dtype=np.int64) - first[block_of]
    rdw, rvw = dw[block_of], vw[block_of]
    dpos = starts[block_of] + _HEAD.size + j * rdw
    vpos = starts[block_of] + _HEAD.size + count[block_of] * rdw + j * rvw
    deltas = np.zeros(total, dtype=np.uint64)
    values = np.zeros(total, dtype=np.uint64)
    for k in range(8):  # little-endian bytes, as many as each row's width
        rows = np.flatnonzero(rdw > k)
        if rows.size:
            deltas[rows] |= buf[dpos[rows] + k].astype(np.uint64) << np.uint64(8 * k)
        rows = np.flatnonzero(rvw > k)
        if rows.size:
            values[rows] |= buf[vpos[rows] + k].astype(np.uint64) << np.uint64(8 * k)
    later = j > 0
    if not np.all(deltas[later] > 0):
        raise CorruptFileError("a posting block's docnos are not increasing")
    sums = np.cumsum(deltas, dtype=np.uint64)  # uint64 wraps: the differences below stay exact
    heads = first[count > 0]
    docnos = sums - np.repeat(sums[heads] - deltas[heads], count[count > 0])
    return docnos, values.astype(np.int64), count


def decode_blocks(datas: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`decode_block` of many blocks at once (merges read thousands of them).

    Returns:
        ``(docnos uint64, values int64, counts)``: the blocks' columns one after another,
        block ``i`` having ``counts[i]`` rows.

    Raises:
        CorruptFileError: as :func:`decode_block`, for any of the blocks.
    """
    raw = _decode_raw_blocks(datas)
    if raw is not None:
        return raw
    parsed = [_block_body(data) for data in datas]
    counts = np.fromiter((p[0] for p in parsed), dtype=np.int64, count=len(parsed))
    if not counts.sum():
        return np.zeros(0, np.uint64), np.zeros(0, np.int64), counts
    # one view per block column, widened and joined by one concatenate each
    deltas = np.concatenate([np.frombuffer(body, _DT[dw], count) for count, dw, _, body in parsed]).astype(np.uint64)
    values = np.concatenate([np.frombuffer(body, _DT[vw], count, count * dw)
                             for count, dw, vw, body in parsed]).astype(np.int64)
    starts = (np.cumsum(counts) - counts)[counts > 0]
    later = np.ones(deltas.size, dtype=bool)
    later[starts] = False
    if not np.all(deltas[later] > 0):
        raise CorruptFileError("a posting block's docnos are not increasing")
    sums = np.cumsum(deltas, dtype=np.uint64)  # uint64 wraps: the differences below stay exact
    docnos = sums - np.repeat(sums[starts] - deltas[starts], counts[counts > 0])
    return docnos, values, counts


def _blind_order(blinds: Sequence[bytes]) -> list[int]:
    """The positions of distinct ``blinds`` in ascending byte order (numpy on the 16-byte
    keys read as two big-endian uint64s: the bytes' order, without a comparison per pair)."""
    blob = b"".join(blinds)
    if len(blinds) < 64 or len(blob) != 16 * len(blinds):
        return sorted(range(len(blinds)), key=blinds.__getitem__)
    words = np.frombuffer(blob, dtype=">u8").reshape(-1, 2)
    order: list[int] = np.lexsort((words[:, 1], words[:, 0])).tolist()
    return order


def encode_packed(blinds: Sequence[bytes], blocks: Sequence[bytes]) -> bytes:
    """A packed small segment (spec/bm25.md, "segments"): ``u32le n ‖ n sorted 16-byte
    blinds ‖ (n + 1) u32le offsets into the blocks ‖ the blocks``, a term's block at the
    blind's position. ``blinds`` need not be sorted; they are stored sorted."""
    order = _blind_order(blinds)
    sizes = np.fromiter((len(blocks[i]) for i in order), dtype=np.int64, count=len(order))
    offsets = np.zeros(len(order) + 1, dtype="<u4")
    if sizes.size and int(sizes.sum()) > 0xFFFFFFFF:
        raise ValueError("a packed segment's blocks exceed 4 GiB")  # a bug: small segments are far smaller
    offsets[1:] = np.cumsum(sizes)
    return b"".join([_U32.pack(len(order)), *(blinds[i] for i in order), offsets.tobytes(),
                     *(blocks[i] for i in order)])


def _malformed_packed() -> CorruptFileError:
    return CorruptFileError("a packed BM25 segment record is malformed", hint="run `engramdb verify --fix FILE`")


class _Packed:
    """A decoded packed segment: its terms (blind -> position, in sorted order) and the
    plaintext the posting blocks are cut from. Immutable once committed (cached per handle)."""

    __slots__ = ("index", "data", "offsets", "base")

    def __init__(self, data: bytes) -> None:
        n = _U32.unpack_from(data)[0] if len(data) >= _U32.size else -1
        at = _U32.size + BLIND_LEN * n
        self.base = at + 4 * (n + 1)
        if n < 0 or len(data) < self.base:
            raise _malformed_packed()
        blinds = [data[i:i + BLIND_LEN] for i in range(_U32.size, at, BLIND_LEN)]
        offsets = np.frombuffer(data, dtype="<u4", count=n + 1, offset=at)
        if (offsets[0] != 0 or int(offsets[-1]) != len(data) - self.base
                or (n and not bool(np.all(offsets[1:] - offsets[:-1].astype(np.int64) >= _HEAD.size)))
                or any(a >= b for a, b in itertools.pairwise(blinds))):
            raise _malformed_packed()  # every block holds at least a header; the blinds strictly increase
        self.index = dict(zip(blinds, range(n)))
        self.offsets: list[int] = offsets.tolist()
        self.data = data

    def block(self, blind: bytes) -> bytes | None:
        """The term's block (plaintext), or None when the segment does not hold the term."""
        i = self.index.get(blind)
        if i is None:
            return None
        return self.data[self.base + self.offsets[i]:self.base + self.offsets[i + 1]]

    def blinds(self) -> list[bytes]:
        """The segment's terms, sorted."""
        return list(self.index)

    @property
    def nbytes(self) -> int:
        return len(self.data) + 120 * len(self.index)


class TermDocs:
    """Tokenized documents as flat columns, what a segment is built from.

    Document ``i`` has number ``docnos[i]`` and the terms ``terms[term_ids[a:b]]`` in order,
    where ``a = lengths[:i].sum()`` and ``b = a + lengths[i]``; ``terms`` is sorted and
    distinct. :meth:`Tokenizer.encode_many` produces the last three columns directly, so
    bulk ingest never builds a Python list of terms per document.
    """

    __slots__ = ("docnos", "terms", "term_ids", "lengths")

    def __init__(self, docnos: Sequence[int] | np.ndarray, terms: list[str], term_ids: np.ndarray,
                 lengths: np.ndarray) -> None:
        self.docnos = np.asarray(docnos, dtype=np.uint64)
        self.terms = terms
        self.term_ids = np.asarray(term_ids, dtype=np.int64)
        self.lengths = np.asarray(lengths, dtype=np.int64)
        if self.docnos.shape != self.lengths.shape or int(self.lengths.sum()) != self.term_ids.size:
            raise ValidationError("tokenized documents: docnos, lengths and terms do not match")

    @classmethod
    def from_pairs(cls, docs: Sequence[tuple[int, Sequence[str]]]) -> TermDocs:
        """From ``(docno, terms)`` pairs."""
        # a defaultdict numbering new terms on first sight: a C-level lookup per token
        vocab: dict[str, int] = defaultdict(itertools.count().__next__)
        term_ids: list[int] = []
        lengths: list[int] = []
        for _, terms in docs:
            term_ids += map(vocab.__getitem__, terms)
            lengths.append(len(terms))
        words = sorted(vocab)
        rank_of_term = np.empty(len(vocab), dtype=np.int64)
        rank_of_term[[vocab[w] for w in words]] = np.arange(len(words))
        return cls([d for d, _ in docs], words, rank_of_term[np.asarray(term_ids, dtype=np.int64)],
                   np.asarray(lengths, dtype=np.int64))

    def __len__(self) -> int:
        return int(self.docnos.size)


def _term_docs(docs: TermDocs | Sequence[tuple[int, Sequence[str]]]) -> TermDocs:
    return docs if isinstance(docs, TermDocs) else TermDocs.from_pairs(docs)


def count_postings(docs: TermDocs | Sequence[tuple[int, Sequence[str]]]
                   ) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """Invert documents: ``(docno, terms)`` pairs or a :class:`TermDocs`.

    Returns:
        ``(words, docnos, tfs, bounds)``: the sorted distinct terms, and flat columns in
        which term ``words[j]`` owns rows ``bounds[j]:bounds[j + 1]`` (docno order).
    """
    docs = _term_docs(docs)
    if not docs.term_ids.size:
        return [], np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros(1, np.int64)
    n = len(docs)
    order_docs = np.argsort(docs.docnos, kind="stable")
    native = _accel.NATIVE
    if native is not None:  # the same columns, by counting (engramdb/_native.c)
        made = native.count_postings(np.ascontiguousarray(docs.term_ids, dtype=np.int64),
                                     np.ascontiguousarray(docs.lengths, dtype=np.int64),
                                     np.ascontiguousarray(order_docs, dtype=np.int64),
                                     np.ascontiguousarray(docs.docnos, dtype=np.uint64), len(docs.terms))
        return (docs.terms, np.frombuffer(made[0], dtype=np.uint64), np.frombuffer(made[1], dtype=np.int64),
                np.frombuffer(made[2], dtype=np.int64))
    rank_of_doc = np.empty(n, dtype=np.int64)
    rank_of_doc[order_docs] = np.arange(n)
    # one sort of (term rank, doc rank) keys; runs of equal keys are the term frequencies
    keys = docs.term_ids * n + np.repeat(rank_of_doc, docs.lengths)
    keys.sort()
    first = np.empty(keys.size, dtype=bool)
    first[0] = True
    np.not_equal(keys[1:], keys[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    uniq = keys[starts]
    tfs = np.diff(np.append(starts, keys.size))
    bounds = np.searchsorted(uniq // n, np.arange(len(docs.terms) + 1))
    return docs.terms, docs.docnos[order_docs][uniq % n], tfs, bounds


def _check_distinct(docnos: np.ndarray, message: str) -> None:
    """Raise ValidationError (``message`` formatted with the smallest repeated docno) on a repeat."""
    if docnos.size > 1:
        ordered = np.sort(docnos)
        repeats = ordered[1:][ordered[1:] == ordered[:-1]]
        if repeats.size:
            raise ValidationError(message.format(int(repeats[0])))


def _code_dtype(n_pairs: int) -> type[np.unsignedinteger[Any]]:
    """The narrowest unsigned dtype that holds the codes of a table of ``n_pairs`` pairs."""
    return np.uint8 if n_pairs <= 1 << 8 else np.uint16 if n_pairs <= 1 << 16 else np.uint32


def _check_weight(term: str, w: Any) -> float:
    """``w`` as a float, when it is a positive finite number.

    Raises:
        ValidationError: it is not.
    """
    if not isinstance(w, (int, float)) or isinstance(w, bool) or not (w > 0 and math.isfinite(w)):
        raise ValidationError(f"query term weight for {term!r} must be a positive number")
    return float(w)


def _part(tf: np.ndarray, dl: np.ndarray, idf: float | np.ndarray, avgdl: float, w: float) -> np.ndarray:
    """``w * idf * tf / (tf + k1 * (1 - b + b * dl / avgdl))`` elementwise: the same float
    operations, in the same order, as :func:`lucene_tf_part` per posting (so per pair and per
    posting give the same bits)."""
    # in place, one temporary: B * dl / avgdl, + (1 - B), * K1, + tf, tf / that, * idf, * w
    # (the same operations in the same order as ``idf * (tf / (K1 * ((1 - B) + B * dl / avgdl) + tf))``)
    part: NDArray[np.float64] = np.multiply(dl, B, dtype=np.float64)
    part /= avgdl
    part += 1.0 - B
    part *= K1
    part += tf
    np.divide(tf, part, out=part)
    part *= idf
    if w != 1:
        part *= w
    return part


def _parts(groups: Sequence[tuple[np.ndarray, np.ndarray, float, float]], avgdl: float) -> list[np.ndarray]:
    """:func:`_part` of each ``(tf, dl, idf, w)`` group, computed in one pass over the groups
    concatenated (idf and w repeated per element): the same float operations per element,
    so the same bits, in a dozen numpy calls for a whole query instead of eight per group
    (after a commit every query term's parts are new: N and avgdl moved). The C extension's
    ``pair_values`` makes the same operations per element in one call (the same bits)."""
    native = _accel.NATIVE
    if native is not None:
        sizes = [g[0].size for g in groups]
        part: NDArray[np.float64] = np.empty(sum(sizes))
        native.pair_values(part, groups, avgdl, K1, B)
        return [part] if len(sizes) == 1 else _split(part, sizes)
    if len(groups) == 1:
        tf, dl, idf, w = groups[0]
        return [_part(tf, dl, idf, avgdl, w)]
    sizes = [g[0].size for g in groups]
    part = _part(np.concatenate([g[0] for g in groups]), np.concatenate([g[1] for g in groups]),
                 np.repeat(np.array([g[2] for g in groups]), sizes), avgdl, 1.0)
    if any(g[3] != 1 for g in groups):
        part *= np.repeat(np.array([g[3] for g in groups]), sizes)
    return _split(part, sizes)


def _split(flat: np.ndarray, sizes: Sequence[int]) -> list[np.ndarray]:
    """``flat`` cut into consecutive views of ``sizes`` (what ``np.split`` at the cumulative
    sizes gives, by plain slicing: np.split costs ~15 us of Python per call, and every query
    after a commit splits its parts once)."""
    out = []
    at = 0
    for size in sizes:
        out.append(flat[at:at + size])
        at += size
    return out


class _Pairs:
    """The distinct (tf, dl) pairs of one term's postings in the large segments: a posting
    stores only the code (index) of its pair, so length normalisation is computed at query
    time over the pairs, a few hundred values, and gathered per posting (spec/bm25.md,
    "Caches").

    Immutable once shared: :meth:`extend` returns a new table whose first codes are the same.
    """

    __slots__ = ("tf", "dl", "index")

    def __init__(self, tf: np.ndarray, dl: np.ndarray, index: dict[int, int]) -> None:
        self.tf = tf  # float64 per pair
        self.dl = dl  # float64 per pair
        self.index = index  # (tf << 32 | dl) -> code

    @classmethod
    def empty(cls) -> _Pairs:
        return cls(np.zeros(0), np.zeros(0), {})

    def extend(self, tfs: np.ndarray, dls: np.ndarray) -> tuple[_Pairs, np.ndarray]:
        """``(pairs, codes)``: the codes of the postings ``(tfs, dls)``, in a table holding
        this one's pairs (same codes) plus any new ones."""
        keys = (tfs.astype(np.uint64) << np.uint64(32)) | dls.astype(np.uint64)
        uniq, inverse = np.unique(keys, return_inverse=True)
        index = self.index
        known = [index.get(key) for key in uniq.tolist()]
        pairs = self
        if None in known:
            index = dict(index)
            new_keys = []
            for i, key in enumerate(uniq.tolist()):
                if known[i] is None:
                    known[i] = index[key] = len(index)
                    new_keys.append(key)
            new = np.asarray(new_keys, dtype=np.uint64)
            pairs = _Pairs(np.concatenate([self.tf, (new >> np.uint64(32)).astype(np.float64)]),
                           np.concatenate([self.dl, (new & np.uint64(0xFFFFFFFF)).astype(np.float64)]), index)
        return pairs, np.asarray(known, dtype=_code_dtype(len(index)))[inverse.reshape(-1)]


class _Run:
    """A term's postings in the large segments: docnos (increasing; uint32 in a run longer
    than :data:`_COMPACT_MIN` whose docnos fit, else int64) and pair codes.

    A long run also keeps how many postings each pair holds (``counts``) and, grouped by
    pair, the docnos of its *frontier*: the pairs that fewer than :data:`_FRONTIER_DEPTH`
    postings dominate (as large a tf and as short a document; the part grows with tf and
    shrinks with dl, so only those pairs can hold the term's best documents, whatever N and
    avgdl). Its best documents are then found by ranking pairs and gathering a few postings,
    not by scanning the run (spec/bm25.md, "Caches"). A cached long run holds about 5 bytes
    per posting (uint32 docnos, uint8 codes up to 256 pairs; issue 15: the lists of the
    common queries at 1M documents then fit the default cache), plus its frontier's docnos.
    """

    __slots__ = ("segs", "docnos", "codes", "counts", "front", "front_sizes", "front_starts", "front_total",
                 "front_docnos", "rest", "_nbytes")

    def __init__(self, segs: tuple[int, ...], docnos: np.ndarray, codes: np.ndarray, pairs: _Pairs) -> None:
        self.segs = segs
        if docnos.size > _COMPACT_MIN and docnos.dtype != np.uint32 and int(docnos[-1]) <= 0xFFFFFFFF:
            docnos = docnos.astype(np.uint32)  # increasing: the last is the largest
        self.docnos = docnos
        self.codes = codes
        # built rarely: only when a large segment comes or goes
        self.counts: np.ndarray | None = None
        # the frontier: its pair codes (ascending), their posting counts, where each pair's
        # docnos start in front_docnos, its posting count; and the other pairs' codes
        self.front: np.ndarray | None = None
        self.front_sizes = self.front_starts = self.front_docnos = self.rest = self.front
        self.front_total = 0
        if docnos.size > _GROUPED_MIN:
            self.counts = counts = np.bincount(codes, minlength=len(pairs.index))
            present = np.flatnonzero(counts)
            in_front = _frontier(pairs.tf[present], pairs.dl[present], counts[present], _FRONTIER_DEPTH)
            front = present[in_front]  # pair codes, ascending
            sizes = counts[front]
            total = int(sizes.sum())
            if total <= docnos.size * _FRONTIER_MAX_SHARE:
                self.front, self.rest, self.front_sizes, self.front_total = front, present[~in_front], sizes, total
                self.front_starts = np.cumsum(sizes) - sizes
                mask = np.zeros(counts.size, dtype=bool)
                mask[front] = True
                at = np.flatnonzero(mask[codes])
                # grouped by pair in code order, docnos increasing within a pair (a stable sort)
                self.front_docnos = docnos[at[np.argsort(codes[at], kind="stable")]]
        # counted once: the arrays never change, and every entry a commit changes is charged
        # to the cache again (summing eight arrays' sizes cost ~6 µs per entry, cold)
        arrays = (self.docnos, self.codes, self.counts, self.front, self.front_sizes, self.front_starts,
                  self.front_docnos, self.rest)
        self._nbytes = int(sum(a.nbytes for a in arrays if a is not None))

    def renamed(self, segs: tuple[int, ...]) -> _Run:
        """The same postings, labelled as covering ``segs`` (arrays shared, nothing recomputed)."""
        run = object.__new__(_Run)
        for name in _Run.__slots__:
            setattr(run, name, getattr(self, name))
        run.segs = segs
        return run

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def best(self, k: int, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best (docnos, values[codes]) of this run, ties to the lower docno: the
        same arrays as ``top_k(docnos, values[codes], k)``.

        From the frontier when it holds them: the frontier's pairs ranked by value, the
        postings of those above the k-th best posting's value and the lowest docnos of
        those equal to it gathered (within a pair, docnos increase), provided every pair
        off the frontier is worth less than that value (else, e.g. a rounding tie, the
        pairs are ranked over the whole run)."""
        if self.counts is None or self.docnos.size <= 4 * k + 64:
            return top_k(self.docnos, values[self.codes], k)
        got = None if self.front is None else self._frontier_best(k, values)
        return got if got is not None else self._pairs_best(k, values)

    def _frontier_best(self, k: int, values: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """:meth:`best` from the frontier, or None when the frontier cannot tell it. The C
        extension's ``frontier_best`` does the same in one call (the same arrays: it only
        compares values; a differential test checks it): ~25 numpy calls cost ~70 µs on
        the CPU a commit leaves cold."""
        if k <= 0 or self.front_total < k:
            return None
        native = _accel.NATIVE
        if native is not None:
            docnos = np.empty(k, dtype=cast("np.ndarray", self.front_docnos).dtype)
            scores = np.empty(k)
            if native.frontier_best(values, self.front, self.front_sizes, self.front_starts, self.front_docnos,
                                    self.rest, k, docnos, scores) < 0:
                return None
            return docnos, scores
        return self._frontier_best_numpy(k, values)

    def _frontier_best_numpy(self, k: int, values: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """:meth:`_frontier_best` in numpy (``k`` positive, the frontier holding ``k``)."""
        sizes = cast("np.ndarray", self.front_sizes)
        vals = values[cast("np.ndarray", self.front)]
        order = np.argsort(-vals, kind="stable")
        ranked = vals[order]
        sizes = sizes[order]
        cum = sizes.cumsum()
        j = int(cum.searchsorted(k))
        kth = ranked[j]  # the k-th best posting's value
        rest = cast("np.ndarray", self.rest)
        if rest.size and values[rest].max() >= kth:
            return None  # a pair off the frontier may reach it (a rounding tie): not exact from here
        above = j  # the pairs worth more than kth (fewer than k postings)...
        while above and ranked[above - 1] == kth:
            above -= 1
        tied = j + 1  # ... and those worth as much
        while tied < ranked.size and ranked[tied] == kth:
            tied += 1
        # every posting of the pairs above, and the lowest docnos of each tied pair, as many
        # as the top k can still take: all the tied postings that can make it
        take = sizes[:tied].copy()
        np.minimum(take[above:], k - (int(cum[above - 1]) if above else 0), out=take[above:])
        ends = take.cumsum()
        pos = np.repeat(cast("np.ndarray", self.front_starts)[order[:tied]] - (ends - take), take)
        pos += np.arange(pos.size)
        return top_k(cast("np.ndarray", self.front_docnos)[pos], np.repeat(ranked[:tied], take), k)

    def _pairs_best(self, k: int, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`best` by ranking the run's pairs: the pairs whose value reaches the k-th
        best posting's hold every candidate (ties included), so only their postings are
        ranked (a scan of the run's codes)."""
        counts = np.zeros(values.size, dtype=np.int64)  # the pair table may have grown since
        counts[:cast("np.ndarray", self.counts).size] = cast("np.ndarray", self.counts)
        ranked = np.argsort(-values, kind="stable")
        cum = np.cumsum(counts[ranked])
        j = min(int(np.searchsorted(cum, k)), ranked.size - 1)
        chosen = (values >= values[ranked[j]]) & (counts > 0)
        idx = np.flatnonzero(chosen[self.codes])
        return top_k(self.docnos[idx], values[self.codes[idx]], k)


def _frontier(tf: np.ndarray, dl: np.ndarray, counts: np.ndarray, limit: int) -> np.ndarray:
    """Which of the pairs ``(tf, dl)`` (distinct, each holding ``counts`` postings) fewer
    than ``limit`` postings of other pairs dominate (a pair dominates another when its tf is
    at least as large and its dl at most as large: its part is then larger, whatever N and
    avgdl). Computed tf level by tf level, highest first, over a histogram of the dl ranks
    of the pairs seen so far."""
    out = np.zeros(tf.size, dtype=bool)
    if not tf.size:
        return out
    dl_rank = np.unique(dl, return_inverse=True)[1].reshape(-1)
    hist = np.zeros(int(dl_rank.max()) + 1, dtype=np.int64)
    by_tf = np.argsort(-tf, kind="stable")
    bounds = np.flatnonzero(np.diff(tf[by_tf])) + 1
    for level in np.split(by_tf, bounds):
        ranks = dl_rank[level]  # distinct: the pairs of one level differ in dl
        hist[ranks] += counts[level]
        out[level] = np.cumsum(hist)[ranks] - counts[level] < limit  # minus the pair's own postings
    return out


class _Delta:
    """A term's live postings in the small segments holding it (the segments commits add and
    automatic merges rewrite): per posting its docno (int64, increasing), tf and dl (float64),
    so a new segment's postings are appended without coding pairs, and the term's part is
    computed per posting (:func:`_part`; there are few).

    ``key`` is what it was built from: the small segments holding the term, in order, and
    their tombstone counts; ``sizes`` how many of the postings each of those segments gave
    (what :meth:`SegmentedBM25._moved` follows through merges). Immutable.
    """

    __slots__ = ("key", "docnos", "tf", "dl", "sizes")

    def __init__(self, key: tuple[tuple[int, ...], tuple[int, ...]], docnos: np.ndarray, tf: np.ndarray,
                 dl: np.ndarray, sizes: tuple[int, ...]) -> None:
        self.key = key
        self.docnos = docnos
        self.tf = tf
        self.dl = dl
        self.sizes = sizes

    @property
    def nbytes(self) -> int:
        return int(self.docnos.nbytes + self.tf.nbytes + self.dl.nbytes) + 8 * len(self.sizes)


class _TermPostings:
    """A term's live postings over the live segments of one directory state: the ``base``
    run of the large segments and the ``delta`` of the small ones (which commits add and
    automatic merges rewrite: updating the delta concatenates a few cached small blocks,
    never a copy of the term's whole list).

    Immutable but for :attr:`seen` and the memo: a newer state that changes the term's
    postings gets a new object built from this one, reusing its parts; one that does not
    (the usual case after a commit or a small merge: the term is in none of the new small
    segments) is served by this one as it is.
    """

    __slots__ = ("epoch", "live", "dead_sizes", "dead", "pairs", "base", "delta", "memo", "bkey", "seen")

    def __init__(self, epoch: int, live: tuple[int, ...], dead: dict[int, np.ndarray], pairs: _Pairs,
                 base: _Run, delta: _Delta, dead_sizes: dict[int, int] | None = None,
                 bkey: tuple[tuple[int, ...], tuple[int, ...]] | None = None) -> None:
        self.epoch = epoch
        self.live = live
        self.dead = dead  # segno -> the dead docnos this state was filtered by (covered segments only)
        self.dead_sizes = {s: int(a.size) for s, a in dead.items()} if dead_sizes is None else dead_sizes
        # the large segments the base covers and their tombstone counts (:attr:`_View.bkey`;
        # None: not known, e.g. built inside a write transaction)
        self.bkey = bkey
        # the serial of the last read state (:attr:`_Dir.serial`) this entry was found to
        # cover: ``live`` and ``dead_sizes`` name the state it was built for, and it stays
        # right for every later state that changes neither its base nor its small segments
        # (a hint, written by any thread: a stale one only costs a recheck)
        self.seen = 0
        self.pairs = pairs  # the base run's pair table
        self.base = base
        self.delta = delta
        # (n_docs, total_len, w) -> (base pair values, delta parts, {k: best k}); the latest few states
        self.memo: dict[tuple[int, int, float],
                        tuple[np.ndarray, np.ndarray, dict[int, tuple[np.ndarray, np.ndarray]]]] = {}

    def relabelled(self, live: tuple[int, ...], dead: dict[int, np.ndarray], dead_sizes: dict[int, int],
                   delta: _Delta, bkey: tuple[tuple[int, ...], tuple[int, ...]]) -> _TermPostings:
        """The same base (arrays and pair table shared), with ``delta``, labelled as covering
        the state ``(live, dead_sizes)``: nothing copied or recomputed."""
        out = object.__new__(_TermPostings)
        out.epoch, out.live, out.dead, out.dead_sizes = self.epoch, live, dead, dead_sizes
        out.pairs, out.base, out.delta, out.memo, out.bkey, out.seen = self.pairs, self.base, delta, {}, bkey, 0
        return out

    @property
    def size(self) -> int:
        return int(self.base.docnos.size + self.delta.docnos.size)

    def docnos(self) -> list[np.ndarray]:
        return [a for a in (self.base.docnos, self.delta.docnos) if a.size]

    @property
    def nbytes(self) -> int:
        return (self.base.nbytes + self.delta.nbytes
                + self.pairs.tf.nbytes * 2 + 64 * len(self.pairs.index) + 4096)


class _Term:
    """One query term's postings and weight under one directory state, for scoring.

    ``runs`` holds ``(docnos, codes, values)`` per non-empty part: the base run's pair codes
    and pair values, or the delta's ``codes`` None and its parts per posting."""

    __slots__ = ("postings", "runs", "w", "best_memo", "size", "max_docno")

    def __init__(self, postings: _TermPostings, w: float,
                 memo: tuple[np.ndarray, np.ndarray, dict[int, tuple[np.ndarray, np.ndarray]]]) -> None:
        self.postings = postings
        self.w = w
        self.size = postings.size
        base, delta = postings.base, postings.delta
        self.runs: list[tuple[np.ndarray, np.ndarray | None, np.ndarray]] = []
        if base.docnos.size:
            self.runs.append((base.docnos, base.codes, memo[0]))
        if delta.docnos.size:
            self.runs.append((delta.docnos, None, memo[1]))
        self.best_memo = memo[2]
        self.max_docno = max(int(base.docnos[-1]) if base.docnos.size else -1,
                             int(delta.docnos[-1]) if delta.docnos.size else -1)

    @staticmethod
    def of(found: Sequence[tuple[_TermPostings, float]], n_docs: int, total_len: int, cached: bool) -> list[_Term]:
        """The terms of ``found`` (postings, weight) under a state of ``n_docs`` documents of
        ``total_len`` in all: their parts memoised per state and weight (``cached``), the
        missing ones computed together (:func:`_parts`)."""
        memos: list[tuple[np.ndarray, np.ndarray, dict[int, tuple[np.ndarray, np.ndarray]]] | None]
        memos = [p.memo.get((n_docs, total_len, w)) for p, w in found] if cached else [None] * len(found)
        if None in memos:
            native = _accel.NATIVE
            loop = None if native is None else _LOG1P_LOOP[0] if _LOG1P_LOOP else _log1p_loop(native)
            if loop is not None:
                # the idfs and the values in one C call (term_values: the operations of _idfs
                # and _parts, the same bits): on the CPU a commit leaves cold the Python around
                # them cost ~10 µs a query
                values = iter(cast("_accel.Native", native).term_values(
                    loop, n_docs, total_len / n_docs, K1, B,
                    [(p.size, w, p.pairs.tf if p.base.docnos.size else None, p.pairs.dl,
                      p.delta.tf if p.delta.docnos.size else None, p.delta.dl)
                     for (p, w), memo in zip(found, memos) if memo is None], np.empty))
                for i, ((p, w), memo) in enumerate(zip(found, memos)):
                    if memo is None:
                        base, delta = next(values)
                        memo = memos[i] = (p.base.docnos if base is None else base,
                                           p.delta.tf if delta is None else delta, {})
                        if cached:
                            if len(p.memo) >= 4:
                                p.memo.clear()
                            p.memo[(n_docs, total_len, w)] = memo
                return [_Term(p, w, memo) for (p, w), memo in zip(found, memos) if memo is not None]
            groups: list[tuple[np.ndarray, np.ndarray, float, float]] = []
            idfs = iter(_idfs(n_docs, [p.size for (p, _), memo in zip(found, memos) if memo is None]))
            for (p, w), memo in zip(found, memos):
                if memo is None:
                    idf = next(idfs)
                    if p.base.docnos.size:
                        groups.append((p.pairs.tf, p.pairs.dl, idf, w))
                    if p.delta.docnos.size:
                        groups.append((p.delta.tf, p.delta.dl, idf, w))
            parts = iter(_parts(groups, total_len / n_docs))
            for i, ((p, w), memo) in enumerate(zip(found, memos)):
                if memo is None:
                    memo = memos[i] = (next(parts) if p.base.docnos.size else p.base.docnos,
                                       next(parts) if p.delta.docnos.size else p.delta.tf, {})
                    if cached:
                        if len(p.memo) >= 4:
                            p.memo.clear()
                        p.memo[(n_docs, total_len, w)] = memo
        return [_Term(p, w, memo) for (p, w), memo in zip(found, memos) if memo is not None]

    def weighted(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(docnos, w * part)`` per run."""
        return [(docnos, values if codes is None else values[codes]) for docnos, codes, values in self.runs]

    def best(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best (docnos, weighted parts), ties to the lower docno (memoised per
        state and weight, at least :data:`TERM_TOP_CACHED` deep)."""
        memo = self.best_memo
        depth = max(k, TERM_TOP_CACHED)
        # the memo is shared by the threads querying this term in this state, and another one
        # may add a depth meanwhile: scan a copy made in C (tuple(); no thread switch inside)
        got = memo.get(depth) or next((v for d, v in tuple(memo.items()) if d >= k), None)
        if got is None:
            native = _accel.NATIVE
            got = self._best_numpy(depth) if native is None else self._best_native(depth, native)
            memo[depth] = got
        return got[0][:k], got[1][:k]

    def _best_numpy(self, depth: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``depth`` best of each run, then of them together (:func:`top_k`)."""
        parts = [top_k(docnos, values, depth) if codes is None else self.postings.base.best(depth, values)
                 for docnos, codes, values in self.runs]
        if len(parts) == 1:
            return parts[0]
        return top_k(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), depth)

    def _best_native(self, depth: int, native: _accel.Native) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_best_numpy` with the C extension: a long base run's best from its frontier
        (or its ranked pairs, beyond :data:`_SCAN_MAX` postings), then every run in one
        ``best_runs`` call (a bounded heap: the same entries in the same order as
        :func:`top_k`, value descending then docno ascending; docnos int64). After a commit
        every term's best is new (N and avgdl moved), and ``top_k``'s ~10 numpy calls per
        run, twice, cost ~25 µs each on the CPU a commit leaves cold."""
        runs: list[tuple[np.ndarray, np.ndarray | None, np.ndarray]] = []
        base = self.postings.base
        for docnos, codes, values in self.runs:
            if codes is not None and base.counts is not None and docnos.size > 4 * depth + 64:
                got = base._frontier_best(depth, values) if base.front is not None else None
                if got is None and docnos.size > _SCAN_MAX:
                    got = base._pairs_best(depth, values)
                if got is not None:
                    if len(self.runs) == 1:
                        return got
                    runs.append((got[0], None, got[1]))
                    continue
            runs.append((docnos, codes, values))
        n = min(depth, sum(r[0].size for r in runs))
        docnos_out = np.empty(n, dtype=np.int64)
        values_out = np.empty(n)
        native.best_runs(runs, depth, docnos_out, values_out)
        return docnos_out, values_out

    def ranked(self, k: int) -> bool:
        """Whether :meth:`best` of ``k`` is memoised already."""
        return any(depth >= k for depth in tuple(self.best_memo))  # a copy: see best()

    def kth_best(self, k: int) -> float:
        """The k-th best weighted part (0.0 with fewer than ``k`` postings): a lower bound
        of the k-th best score of any query holding this term (the term's k best documents
        each score at least their part from it, as parts are positive)."""
        if self.size < k:
            return 0.0
        return float(self.best(k)[1][k - 1])


def _lookup_best(postings: _TermPostings, w: float,
                 memo: tuple[np.ndarray, np.ndarray, dict[int, tuple[np.ndarray, np.ndarray]]], k: int) -> np.ndarray:
    """The docnos of :meth:`_Term.best` of ``k`` (``query_top``'s looked-up term)."""
    return _Term(postings, w, memo).best(k)[0]


# --- the directory --------------------------------------------------------------------


class _Dir:
    """The decoded directory record (mutable copy inside a write transaction)."""

    __slots__ = ("epoch", "next", "n_docs", "total_len", "segs", "runs", "pending", "committed", "version",
                 "packed", "unwritten", "unpacked", "_sig", "terms_of", "fresh", "dead_live", "view", "serial")

    def __init__(self, epoch: int = 0, next_segno: int = 1) -> None:
        self.epoch = epoch
        self.next = next_segno
        self.n_docs = 0
        self.total_len = 0
        # segno -> [ndocs (including dead), total length of its docs]
        self.segs: dict[int, list[int]] = {}
        # segno -> its stored tombstone runs, oldest first: [run number, dead docnos in it]
        self.runs: dict[int, list[list[int]]] = {}
        # segno -> sorted uint64 arrays of docnos tombstoned but not yet stored as a run (this
        # write, or a version-1 directory's inline list); a write stores them before encoding
        self.pending: dict[int, list[np.ndarray]] = {}
        # numbers (segments and runs share the counter) below this were committed when the
        # record was read: their records are immutable and safe to cache in the handle
        self.committed = next_segno
        # as read (1: migrated by the next write); a new index is keyed segment first. Only
        # the layout checks read it: the version a write stores is :attr:`written_version`
        self.version = SEG_FIRST_VERSION
        # the packed segments (layout 1: one PACKED_PREFIX record each, no per-term records)
        self.packed: set[int] = set()
        # write transactions: packed records of segments this write created, kept until it
        # stores the directory. An optimisation: a merge in the same write often rewrites
        # such a segment (the tenth small one), and a record it never stored needs no pages
        # that the same write then frees (LMDB would leave those unwritten past the end of
        # the file, which the open accepts: store.py's check_file_end)
        self.unwritten: dict[int, bytes] = {}
        # write transactions: the decoded :attr:`unwritten` records (a query or a merge in the
        # write asks once per term and segment); dropped with them
        self.unpacked: dict[int, _Packed] = {}
        self._sig: tuple[tuple[int, ...], dict[int, int]] | None = None
        # read states only: small segment -> its terms (carried over to the next state)
        self.terms_of: dict[int, Container[bytes]] = {}
        self.fresh: dict[int, _Fresh] = {}  # the small segments among those this handle wrote
        self.dead_live: dict[int, np.ndarray] | None = None  # read states: segno -> dead docnos
        self.view: _View | None = None  # read states only: what every term's catch-up asks
        self.serial = 0  # read states: a number the handle gives each state it reads (never reused)

    @classmethod
    def decode(cls, data: bytes | None) -> _Dir:
        if data is None:
            return cls()
        raw = _unpack(data)
        try:
            if raw["v"] not in (1, 2, 3, PACKED_VERSION):
                raise CorruptFileError("the BM25 directory has an unknown version", hint="upgrade engramdb")
            d = cls(int(raw["epoch"]), int(raw["next"]))
            d.version = raw["v"]
            d.n_docs = int(raw["n"])
            d.total_len = int(raw["len"])
            if raw["v"] >= PACKED_VERSION:
                d.segs = {int(s): [int(n), int(ln)] for s, n, ln, _ in raw["segs"]}
                layouts = {int(s): layout for s, _, _, layout in raw["segs"]}
                if any(layout not in (0, 1) for layout in layouts.values()):
                    raise ValueError("a segment has an unknown layout")
                d.packed = {s for s, layout in layouts.items() if layout == 1}
            else:
                d.segs = {int(s): [int(n), int(ln)] for s, n, ln in raw["segs"]}
            if raw["v"] == 1:
                for s, b in raw["dead"]:
                    d.pending[int(s)] = [np.frombuffer(b, dtype="<u8").astype(np.uint64)]
            else:
                for s, run, count in raw["runs"]:
                    d.runs.setdefault(int(s), []).append([int(run), int(count)])
            if any(s not in d.segs for s in itertools.chain(d.runs, d.pending)) or any(
                    not 0 < run < d.next or count <= 0 for runs in d.runs.values() for run, count in runs):
                raise ValueError("a tombstone run names an unknown segment or number")
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptFileError("the BM25 directory record is malformed") from exc
        return d

    def encode(self) -> bytes:
        if any(self.pending.values()):
            raise AssertionError("tombstones not stored as runs")  # a bug: every write stores them first
        version = self.written_version
        return _pack({
            "v": version,
            "epoch": self.epoch,
            "next": self.next,
            "n": self.n_docs,
            "len": self.total_len,
            "segs": [[s, n, ln, int(s in self.packed)] if version >= PACKED_VERSION else [s, n, ln]
                     for s, (n, ln) in sorted(self.segs.items())],
            "runs": [[s, run, count] for s, runs in sorted(self.runs.items()) for run, count in runs],
        })

    def committed_copy(self) -> _Dir:
        """What a reader decodes from :meth:`encode`'s record, without encoding and decoding
        it: a fresh copy with every number committed and nothing memoised."""
        c = _Dir(self.epoch, self.next)
        c.version = self.written_version
        c.packed = set(self.packed)
        c.n_docs, c.total_len = self.n_docs, self.total_len
        c.segs = {s: [n, ln] for s, (n, ln) in sorted(self.segs.items())}
        c.runs = {s: [[run, count] for run, count in runs] for s, runs in sorted(self.runs.items()) if runs}
        return c

    @property
    def written_version(self) -> int:
        """The version :meth:`encode` writes: 4 while a segment is packed, else 3 (which
        engramdb before 2026-12-01 reads), or 2 for a file still keyed term first (a
        ``repair=True`` open keeps its layout; such a file holds no packed segment)."""
        if not self.seg_first:
            if self.packed:
                raise AssertionError("a packed segment in a term-first file")  # a bug: writers pack only segment first
            return 2
        return PACKED_VERSION if self.packed else 3

    @property
    def seg_first(self) -> bool:
        """Whether postings are keyed segment first (version 3), else ``blind | segno``."""
        return self.version >= SEG_FIRST_VERSION

    def posting_key(self, blind: bytes, segno: int) -> bytes:
        """The ``postings`` key of a term's block in segment ``segno``, in this directory's layout."""
        return _SEG.pack(segno) + blind if self.version >= SEG_FIRST_VERSION else blind + _SEG.pack(segno)

    def dead_count(self, segno: int) -> int:
        """Dead documents of segment ``segno`` (stored runs and pending)."""
        return (sum(count for _, count in self.runs.get(segno, ()))
                + sum(int(a.size) for a in self.pending.get(segno, ())))

    def dead_counts(self) -> dict[int, int]:
        """segno -> dead documents, for the segments that have any."""
        return {s: n for s in sorted(self.runs.keys() | self.pending.keys()) if s in self.segs and (n := self.dead_count(s))}

    def signature(self) -> tuple[tuple[int, ...], dict[int, int]]:
        """(live segments in order, segment -> number of tombstones): what a term's cached
        postings are labelled with. Memoised: call it on a directory no longer changed (a
        decoded committed state), or recompute after changes (:meth:`touch`)."""
        sig = self._sig
        if sig is None:
            sig = self._sig = (tuple(sorted(self.segs)), self.dead_counts())
        return sig

    def touch(self) -> None:
        """Forget the memoised :meth:`signature` (after changing segments or tombstones)."""
        self._sig = None

    def live_count(self, segno: int) -> int:
        return self.segs[segno][0] - self.dead_count(segno)


class _View:
    """What bringing any term's cached postings up to one read state needs, computed once per
    state (issue 15: in the add-then-query loop a query term's entry is usually many commits
    and merges old, so a summary of the step from the previous state does not serve it; this
    does, whatever the entry's age):

    ``small``
        the state's small segments, in order, with their term sets (None: ask the postings
        table), so a term's holders are a few set lookups;
    ``bkey``
        the large segments and their tombstone counts. An entry with an equal ``bkey`` (and
        epoch) has the right base run: a segment's tombstones only ever grow, so an equal
        count is an equal set. Then only the delta may differ, and it is rebuilt from the
        small blocks (cached, or this handle's :class:`_Fresh` columns) only when the term's
        holders or their tombstone counts changed;
    ``dead``
        segment -> its dead docnos, for the live segments that have any (what the entries
        of this state are labelled as filtered by).

    A cached entry's holders here are its delta's holders still live plus those of the
    small segments its state did not have (:meth:`since`) that hold the term: a few set
    lookups per term instead of one per small segment (:meth:`SegmentedBM25._holders`).
    """

    __slots__ = ("small", "bkey", "dead", "small_set", "_since")

    def __init__(self, small: list[tuple[int, Container[bytes] | None]],
                 bkey: tuple[tuple[int, ...], tuple[int, ...]], dead: dict[int, np.ndarray]) -> None:
        self.small = small
        self.bkey = bkey
        self.dead = dead
        self.small_set = frozenset(s for s, _ in small)
        # an entry's live segments -> the small segments of this state not among them (entries
        # of one earlier state share the answer; a few dozen earlier states are remembered)
        self._since: dict[tuple[int, ...], list[tuple[int, Container[bytes] | None]]] = {}

    def since(self, live: tuple[int, ...]) -> list[tuple[int, Container[bytes] | None]]:
        """The small segments of this state (with their term sets) that ``live`` lacks."""
        got = self._since.get(live)
        if got is None:
            known = set(live)
            got = [(s, t) for s, t in self.small if s not in known]
            if len(self._since) >= 64:
                self._since.clear()  # queries may add meanwhile (no lock): a lost entry is recomputed
            self._since[live] = got
        return got


def _dead_map(docnos: np.ndarray, dead: np.ndarray | None) -> tuple[int, np.ndarray] | None:
    """A segment's dead documents as a bitmap over its docno range ``(first docno, bitmap)``
    (one lookup per posting when a merge filters millions of them), None when none."""
    if dead is None or not dead.size or not docnos.size:
        return None
    lo = int(docnos[0])
    bitmap = np.zeros(int(docnos[-1]) - lo + 1, dtype=bool)
    inside = dead[(dead >= docnos[0]) & (dead <= docnos[-1])]
    bitmap[inside - np.uint64(lo)] = True
    return lo, bitmap


def _live_rows(docnos: np.ndarray, dead: tuple[int, np.ndarray] | None) -> np.ndarray:
    """Which of a segment's posting ``docnos`` (uint64) are not dead in its :func:`_dead_map`."""
    if dead is None:
        return np.ones(docnos.size, dtype=bool)
    lo, bitmap = dead
    rel = docnos - np.uint64(lo)  # wraps below the segment's first docno: caught as too large
    if rel.size and int(rel.max()) >= bitmap.size:
        raise CorruptFileError("a posting names a document missing from its segment",
                               hint="run `engramdb verify --fix FILE`")
    keep: np.ndarray = ~bitmap[rel]
    return keep


def _batched(items: Iterable[T], n: int) -> Iterator[list[T]]:
    it = iter(items)
    while batch := list(itertools.islice(it, n)):
        yield batch


def _seg_key(prefix: bytes, segno: int) -> bytes:
    return prefix + _SEG.pack(segno)


def _tier(live_docs: int) -> int:
    return 0 if live_docs < MERGE_FACTOR else int(math.log(live_docs, MERGE_FACTOR) + 1e-9)


def _ndead(dead: Mapping[int, np.ndarray | int], segno: int) -> int:
    value = dead.get(segno, 0)
    return value if isinstance(value, int) else int(value.size)


def plan_merge(segs: Mapping[int, Sequence[int]], dead: Mapping[int, np.ndarray | int]) -> list[int] | None:
    """The next merge step of the tiered policy, or None when nothing needs merging.

    A segment at least half dead is rewritten alone first. Otherwise, among segments
    grouped by size tier (``floor(log10(live docs))``), the lowest tier holding at least
    :data:`MERGE_FACTOR` segments merges its ``MERGE_FACTOR`` oldest ones. ``dead`` maps a
    segment to its dead documents (an array) or their number.
    """
    for segno in sorted(segs):
        ndocs = segs[segno][0]
        ndead = _ndead(dead, segno)
        if ndead and ndead >= DEAD_REWRITE_FRACTION * ndocs:
            return [segno]
    tiers: dict[int, list[int]] = {}
    for segno in sorted(segs):
        live = segs[segno][0] - _ndead(dead, segno)
        tiers.setdefault(_tier(live), []).append(segno)
    for tier in sorted(tiers):
        if len(tiers[tier]) >= MERGE_FACTOR:
            return tiers[tier][:MERGE_FACTOR]
    return None


def _purge_group(segs: Mapping[int, Sequence[int]], dead: Mapping[int, int]) -> list[int]:
    """The next :meth:`SegmentedBM25.purge` step: the oldest (at most :data:`MERGE_FACTOR`)
    segments holding tombstones of the lowest tier that has any; empty when there is none."""
    tiers: dict[int, list[int]] = {}
    for segno in sorted(segs):
        if n := dead.get(segno, 0):
            tiers.setdefault(_tier(segs[segno][0] - n), []).append(segno)
    return tiers[min(tiers)][:MERGE_FACTOR] if tiers else []


# --- the index ------------------------------------------------------------------------


class _Seg:
    """A decoded segment's documents (immutable once committed): increasing docnos and
    their lengths. :meth:`decoded` keeps them in the narrowest dtypes that hold them (a
    cached 1M-document segment then takes ~5 MB instead of 16)."""

    __slots__ = ("docnos", "lens")

    def __init__(self, docnos: np.ndarray, lens: np.ndarray) -> None:
        self.docnos = docnos
        self.lens = lens

    @classmethod
    def decoded(cls, data: bytes) -> _Seg:
        docnos, lens = decode_block(data)
        if docnos.size and int(docnos[-1]) <= 0xFFFFFFFF:
            docnos = docnos.astype(np.uint32)
        if lens.size:
            lens = lens.astype(f"u{_width(int(lens.max()))}", copy=False)
        return cls(docnos, lens)


class _Fresh:
    """A small segment this handle wrote, as it wrote it: per term, its postings as
    (docnos int64, tf float64, dl float64) views of flat columns. Adopted once the write
    transaction commits, so a query after this handle's own commit reads the new segment
    without an LMDB read, a decryption or a decode (spec/bm25.md, "Caches").

    Supports ``blind in fresh`` (the segment's term set, as its ``v`` record lists it)."""

    __slots__ = ("rows", "docnos", "tf", "dl")

    def __init__(self, blinds: Sequence[bytes], docnos: np.ndarray, tfs: np.ndarray, bounds: np.ndarray,
                 seg: _Seg) -> None:
        self.rows = dict(zip(blinds, itertools.pairwise(bounds.tolist())))
        self.docnos = docnos.astype(np.int64)
        self.tf = tfs.astype(np.float64)
        self.dl = seg.lens[np.searchsorted(seg.docnos, docnos)].astype(np.float64)

    def __contains__(self, blind: object) -> bool:
        return blind in self.rows

    def block(self, blind: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The term's postings in the segment (dead ones included), or None without any."""
        at = self.rows.get(blind)
        if at is None:
            return None
        a, b = at
        return self.docnos[a:b], self.tf[a:b], self.dl[a:b]

    @property
    def nbytes(self) -> int:
        return int(self.docnos.nbytes * 3) + 120 * len(self.rows)


class _Written:
    """What a write transaction wrote, for the read path to adopt once it commits: the
    directory as last written and the small segments it created (their columns)."""

    __slots__ = ("dir", "segments", "merges")

    def __init__(self) -> None:
        self.dir: _Dir | None = None
        # segno -> (blinds, docnos, tfs, bounds) as count_postings / a merge gave them, and the segment
        self.segments: dict[int, tuple[Sequence[bytes], np.ndarray, np.ndarray, np.ndarray, _Seg]] = {}
        # merged-away segno -> (epoch, the segment its live postings went to, its tombstones then)
        self.merges: dict[int, tuple[int, int, int]] = {}


class SegmentedBM25:
    """The BM25 index of one open file.

    Args:
        blind: ``store.blind`` (purpose, value) -> 16-byte blind index.
        last_txnid: ``store.last_txnid``; a change makes the next read check the directory.
        cache_mb: the limit of the decoded-postings cache in MiB (None:
            :data:`DEFAULT_CACHE_MB`); least recently used entries are evicted.

    The cache holds decrypted postings, per term, labelled with the live segments (and
    their tombstone counts) they cover: segments are immutable and their numbers never
    reused, so a commit that adds a segment only appends that segment's postings to the
    terms a query touches, and length normalisation is computed at query time
    (spec/bm25.md, "Caches"). Only data read through read transactions is cached, so an
    aborted write can never leave stale entries.
    """

    def __init__(self, blind: Callable[[bytes, bytes], bytes], last_txnid: Callable[[], int], *,
                 cache_mb: float | None = None,
                 blind_many: Callable[[bytes, list[bytes]], list[bytes]] | None = None) -> None:
        self._blind_fn = blind
        self._blind_many_fn = blind_many
        self._last_txnid = last_txnid
        self._blinds: dict[str, bytes] = {}
        self._txnid: int | None = None
        self._dir: _Dir | None = None
        self._serials = itertools.count(1)  # _Dir.serial of each read state switched to
        self._cache = LRUCache(mb_to_bytes(cache_mb, DEFAULT_CACHE_MB))
        # committed tombstone runs (immutable, numbers never reused): run -> dead docnos
        self._runs: dict[int, np.ndarray] = {}
        # segno -> (its run numbers, the union of those runs), for the read path
        self._dead_union: dict[int, tuple[tuple[int, ...], np.ndarray]] = {}
        # work counters (tests check how much a write rewrites): tombstones written into run
        # records, and run records written
        self.tombstones_written = 0
        self.runs_written = 0
        # write transaction -> the directory's ``next`` when it first read it: numbers below
        # are committed (later ones were written by the transaction itself, which may abort)
        self._txn_committed: weakref.WeakKeyDictionary[Txn, int] = weakref.WeakKeyDictionary()
        # write transaction -> what it wrote, adopted by the read path once it commits
        self._written: weakref.WeakKeyDictionary[Txn, _Written] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._local = threading.local()
        # posting blocks read and decoded by this handle's queries, and term deltas and large
        # runs its queries built (counts of work for tests)
        self.blocks_decoded = 0
        self.deltas_built = 0
        self.runs_built = 0
        # the most postings one merge or purge chunk held (tests check the bound)
        self.merge_chunk_postings = 0
        # this handle's committed merges (the latest :data:`_MERGES_KEPT`): merged-away segno ->
        # (epoch, the segment its live postings went to, its tombstone count then). Facts about
        # the file's history (segment numbers are never reused within an epoch), whatever state
        # a query reads: :meth:`_moved` follows them to relabel a term's delta without reading it
        self._merged: dict[int, tuple[int, int, int]] = {}
        self.deltas_moved = 0  # deltas relabelled through merges (a work counter for tests)

    # --- keys and caches ----------------------------------------------------------------

    @property
    def cache(self) -> LRUCache:
        """The decoded-postings cache (its ``nbytes`` never exceeds its ``max_bytes``)."""
        return self._cache

    def cache_nbytes(self) -> int:
        """Bytes held by the decoded-postings cache now."""
        return self._cache.nbytes

    def blind(self, term: str) -> bytes:
        """The blinded key of ``term`` (memoised per handle)."""
        b = self._blinds.get(term)
        if b is None:
            if len(self._blinds) > 100_000:
                self._blinds.clear()
            b = self._blinds[term] = self._blind_fn(b"term", term.encode("utf-8", "surrogatepass"))
        return b

    def blind_all(self, terms: Sequence[str]) -> list[bytes]:
        """:meth:`blind` of each term; the ones not memoised in one batch call (``blind_many``)."""
        memo = self._blinds
        new = [term for term in terms if term not in memo]
        if new and self._blind_many_fn is not None:
            if len(memo) + len(new) > 100_000:
                memo.clear()
            memo.update(zip(new, self._blind_many_fn(b"term", [term.encode("utf-8", "surrogatepass") for term in new])))
            get = memo.get
            return [get(term) or self.blind(term) for term in terms]
        return [self.blind(term) for term in terms]

    def _directory(self, txn: Txn) -> _Dir:
        """The directory as of ``txn``; cached for read transactions until a commit."""
        if txn.write:
            return self._write_directory(txn)
        sid = snapshot_id(txn, self._last_txnid)
        with self._lock:
            if self._dir is None or sid != self._txnid:
                self._switch(_Dir.decode(txn.get("segments", DIR_KEY)), sid)
            assert self._dir is not None
            return self._dir

    def _switch(self, d: _Dir, sid: int) -> None:
        """Make ``d``, the committed state of snapshot ``sid``, the read path's directory
        (under ``_lock``)."""
        prev = self._dir
        if prev is not None and d.epoch != prev.epoch:
            self._cache.clear()
            self._merged.clear()  # hygiene: records carry their epoch, and no entry of the old one is left
        elif prev is not None:
            for segno in prev.segs:
                if segno not in d.segs:  # merged-away segments never come back
                    self._cache.pop(("s", segno))
                    self._cache.pop(("f", segno))
                    self._cache.pop(("p", segno))
            # the term sets of the small segments still live (immutable) carry over. Queries on
            # ``prev`` insert into these dicts without the lock (_terms_of, _adopt): iterate a
            # copy made in C (tuple(): no bytecode runs, so no thread switch), not the live dict,
            # which another thread may grow between two steps of the loop ("dictionary changed
            # size during iteration"). An entry added after the copy is only looked up again.
            d.terms_of.update((segno, t) for segno, t in tuple(prev.terms_of.items()) if segno in d.segs)
            d.fresh.update((segno, f) for segno, f in tuple(prev.fresh.items()) if segno in d.segs)
        self._drop_old_runs(d)
        d.serial = next(self._serials)
        self._dir, self._txnid = d, sid

    def _written_by(self, txn: Txn) -> _Written | None:
        """The record of what write transaction ``txn`` wrote (None: a transaction object
        that cannot report its commit, e.g. a test double)."""
        w = self._written.get(txn)
        if w is None:
            hook = getattr(txn, "after_commit", None)
            if hook is None:
                return None
            w = self._written[txn] = _Written()
            hook(functools.partial(self._adopt, w))
        return w

    def _adopt(self, w: _Written, sid: int) -> None:
        """After this handle's write transaction committed as snapshot ``sid``: its
        directory becomes the read path's (no record to read and decode at the next query),
        and the small segments it created are kept as written (:class:`_Fresh`), so the
        next query reads none of them from the file. Both are exactly what the file now
        holds: segment numbers are never reused."""
        d = w.dir
        if d is None:
            return
        with self._lock:
            adopted = self._txnid is None or sid > self._txnid
            if adopted:
                self._switch(d, sid)
        for segno, (blinds, docnos, tfs, bounds, seg) in w.segments.items():
            if segno in d.segs and d.segs[segno][0] <= SMALL_SEGMENT_DOCS:
                fresh = _Fresh(blinds, docnos, tfs, bounds, seg)
                self._cache.put(("s", segno), seg, seg.docnos.nbytes + seg.lens.nbytes)
                self._cache.put(("f", segno), fresh, fresh.nbytes)
                if adopted:
                    d.fresh[segno] = fresh
                    d.terms_of[segno] = fresh.rows
        w.segments.clear()
        if w.merges:
            merged = self._merged
            merged.update(w.merges)  # one C call: readers may look up meanwhile (no lock)
            w.merges.clear()
            if len(merged) > _MERGES_KEPT:
                for segno in list(merged)[:len(merged) - _MERGES_KEPT // 2]:  # the oldest (insertion order)
                    merged.pop(segno, None)
        if adopted:
            # the state's view now, while the commit's data is at hand, rather than in the
            # next query (when everything it needs is in memory; else that query makes it)
            self._view(None, d)

    def _remember(self, txn: Txn, segno: int, blinds: Sequence[bytes], docnos: np.ndarray, tfs: np.ndarray,
                  bounds: np.ndarray, seg_docnos: np.ndarray, seg_lens: np.ndarray) -> None:
        """Keep a small segment's columns as this transaction writes them (see :meth:`_adopt`)."""
        if seg_docnos.size <= SMALL_SEGMENT_DOCS and (w := self._written_by(txn)) is not None:
            w.segments[segno] = (blinds, docnos, tfs, bounds, _Seg(seg_docnos, seg_lens.astype(np.int64)))

    def _write_directory(self, txn: Txn) -> _Dir:
        """The directory inside a write transaction, its ``committed`` mark set to what was
        committed when the transaction first read it."""
        d = _Dir.decode(txn.get("segments", DIR_KEY))
        d.committed = self._committed_mark(txn, d.committed)
        return d

    def _committed_mark(self, txn: Txn, next_segno: int) -> int:
        try:
            return self._txn_committed.setdefault(txn, next_segno)
        except TypeError:  # a transaction object without weak references: cache nothing
            return 0

    def _drop_old_runs(self, d: _Dir) -> None:
        """Forget decoded tombstone runs that ``d`` no longer lists (merged or rewritten)."""
        live = {run for runs in d.runs.values() for run, _ in runs}
        # Queries insert into both dicts without the lock (_run, _dead, _dead_in_memory), and
        # _put_directory calls this without it while _switch may run it under it: scan a copy
        # made in C (list(); no bytecode, so no thread switch) and pop what may be gone already.
        for run in [r for r in list(self._runs) if r not in live and r < d.committed]:
            self._runs.pop(run, None)
        for segno in [s for s in list(self._dead_union) if s not in d.segs]:
            self._dead_union.pop(segno, None)

    def _run(self, txn: Txn, d: _Dir, run: int) -> np.ndarray:
        """The dead docnos of tombstone run ``run`` (sorted uint64)."""
        out = self._runs.get(run)
        if out is None:
            data = txn.get("segments", _seg_key(RUN_PREFIX, run))
            if data is None:
                raise CorruptFileError(f"BM25 tombstone run {run} is missing", hint="run `engramdb verify --fix FILE`")
            out = decode_block(data)[0]
            if run < d.committed:  # committed: immutable, and its number is never reused
                self._runs[run] = out
        return out

    def _dead(self, txn: Txn, d: _Dir, segno: int) -> np.ndarray | None:
        """The sorted dead docnos of segment ``segno`` as of ``d`` (None: none)."""
        runs = d.runs.get(segno, ())
        pending = d.pending.get(segno, ())
        if not runs and not pending:
            return None
        numbers = tuple(run for run, _ in runs)
        shared = not pending and all(run < d.committed for run in numbers)
        if shared:
            hit = self._dead_union.get(segno)
            if hit is not None and hit[0] == numbers:
                return hit[1]
        arrays = [self._run(txn, d, run) for run in numbers] + list(pending)
        out = arrays[0] if len(arrays) == 1 else np.sort(np.concatenate(arrays))
        if shared:
            self._dead_union[segno] = (numbers, out)
        return out

    def _dead_mask(self, txn: Txn, d: _Dir, segno: int, docnos: np.ndarray) -> np.ndarray:
        """Which of the sorted ``docnos`` are dead in ``segno``: a binary search per run, so
        the cost grows with the number of runs (~log of the dead), not with the dead."""
        mask = np.zeros(docnos.size, dtype=bool)
        arrays = [self._run(txn, d, run) for run, _ in d.runs.get(segno, ())] + d.pending.get(segno, [])
        for dead in arrays:
            if dead.size:
                pos = np.minimum(np.searchsorted(dead, docnos), dead.size - 1)
                mask |= dead[pos] == docnos
        return mask

    def _segment(self, txn: Txn, segno: int, local: dict[int, _Seg] | None = None, committed: int = 0) -> _Seg:
        # a write transaction may decode a segment it created itself (and may abort), so it
        # caches only in ``local``, a dict that lives for one apply()/merge() call, except
        # segments numbered below ``committed`` (committed ones: immutable, never reused)
        seg = local.get(segno) if local is not None else None
        if seg is None:
            seg = self._cache.get(("s", segno))
        if seg is None:
            data = txn.get("segments", _seg_key(b"s", segno))
            if data is None:
                raise CorruptFileError(f"BM25 segment {segno} is missing", hint="run `engramdb verify --fix FILE`")
            seg = _Seg.decoded(data)
            if not txn.write or segno < committed:
                self._cache.put(("s", segno), seg, seg.docnos.nbytes + seg.lens.nbytes)
            elif local is not None:
                local[segno] = seg
        return seg

    def _dead_in_memory(self, d: _Dir) -> dict[int, np.ndarray] | None:
        """:meth:`_dead_arrays` of every live segment of the committed state ``d`` from the
        decoded runs in memory, without a transaction; None when one is not there."""
        if any(d.pending.values()):
            return None
        out = {}
        for segno, runs in d.runs.items():
            numbers = tuple(run for run, _ in runs)
            if not numbers or segno not in d.segs:
                continue
            hit = self._dead_union.get(segno)
            if hit is not None and hit[0] == numbers:
                out[segno] = hit[1]
                continue
            arrays = []
            for run in numbers:
                got = self._runs.get(run)
                if got is None:
                    return None
                arrays.append(got)
            union = arrays[0] if len(arrays) == 1 else np.sort(np.concatenate(arrays))
            self._dead_union[segno] = (numbers, union)
            if union.size:
                out[segno] = union
        return out

    def _dead_arrays(self, txn: Txn, d: _Dir, segnos: Iterable[int]) -> dict[int, np.ndarray]:
        """segno -> its sorted dead docnos, for the segments of ``segnos`` that have any."""
        out = {}
        with_dead = d.runs.keys() | d.pending.keys()
        for segno in segnos:
            if segno in with_dead and d.dead_count(segno):
                dead = self._dead(txn, d, segno)
                if dead is not None and dead.size:
                    out[segno] = dead
        return out

    def _terms_of(self, txn: Txn, d: _Dir, segno: int) -> Container[bytes] | None:
        """The blinded terms of a small segment (its packed record's, or its ``v`` record as
        a set, cached), or None for a large segment or inside a write transaction (then the
        postings table answers)."""
        terms = d.terms_of.get(segno)
        if terms is None and not txn.write and d.segs[segno][0] <= SMALL_SEGMENT_DOCS:
            fresh = self._cache.get(("f", segno))
            if fresh is not None:  # written by this handle (kept with the state while the segment lives)
                d.fresh[segno] = fresh
                terms = fresh.rows
            elif segno in d.packed:
                terms = self._packed(txn, d, segno).index
            else:
                terms = self._cache.get(("v", segno))
                if terms is None:
                    try:
                        terms = frozenset(self._listed_terms(txn, segno))
                    except CorruptFileError:
                        return None  # damaged: let the postings table answer
                    self._cache.put(("v", segno), terms, 100 * len(terms))
            d.terms_of[segno] = terms
        return cast("Container[bytes]", terms)

    def _listed_terms(self, txn: Txn, segno: int) -> list[bytes]:
        """The sorted blinds of a per-term segment's terms (its ``v`` record)."""
        data = txn.get("segments", _seg_key(b"v", segno)) or b""
        if len(data) % BLIND_LEN:
            raise CorruptFileError(f"the term list of BM25 segment {segno} is damaged",
                                   hint="run `engramdb verify --fix FILE`")
        return [data[i:i + BLIND_LEN] for i in range(0, len(data), BLIND_LEN)]

    def _packed(self, txn: Txn, d: _Dir, segno: int) -> _Packed:
        """Packed segment ``segno``, decoded once per handle (a committed segment is
        immutable and its number never reused; one a write transaction created may abort,
        so it is decoded again each time)."""
        hit = self._cache.get(("p", segno))
        if hit is not None:
            return cast("_Packed", hit)
        data = d.unwritten.get(segno) if txn.write else None
        if data is not None:
            packed = d.unpacked.get(segno)
            if packed is None:  # segment numbers are not reused within a write: decoded once
                packed = d.unpacked[segno] = _Packed(data)
            return packed
        data = txn.get("segments", _seg_key(PACKED_PREFIX, segno))
        if data is None:
            raise CorruptFileError(f"BM25 segment {segno}'s postings are missing", hint="run `engramdb verify --fix FILE`")
        packed = _Packed(data)
        if not txn.write or segno < d.committed:
            self._cache.put(("p", segno), packed, packed.nbytes)
        return packed

    def _segment_blocks(self, txn: Txn, d: _Dir, segno: int) -> Iterator[tuple[bytes, bytes | None]]:
        """Each term of segment ``segno`` with its block (None: listed, but no block)."""
        if segno in d.packed:
            packed = self._packed(txn, d, segno)
            for blind in packed.index:
                yield blind, packed.block(blind)
        else:
            for blind in self._listed_terms(txn, segno):
                yield blind, txn.get("postings", d.posting_key(blind, segno))

    def _raw_block(self, txn: Txn, d: _Dir, blind: bytes,
                   segno: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """A term's postings in one segment, dead ones included: (docnos int64, tfs, doc
        lengths), or None when the segment does not hold the term."""
        if segno in d.packed:
            data = self._packed(txn, d, segno).block(blind)
        else:
            terms = self._terms_of(txn, d, segno)
            if terms is not None and blind not in terms:
                return None
            data = txn.get("postings", d.posting_key(blind, segno))
        if data is None:
            return None
        self.blocks_decoded += 1
        docnos, tfs = decode_block(data)
        seg = self._segment(txn, segno)
        pos = np.searchsorted(seg.docnos, _as_dtype_of(docnos, seg.docnos))
        if pos.size and (pos[-1] >= seg.docnos.size or not np.array_equal(seg.docnos[pos], docnos)):
            raise CorruptFileError("a posting names a document missing from its segment",
                                   hint="run `engramdb verify --fix FILE`")
        return docnos.astype(np.int64), tfs, seg.lens[pos]

    def _block(self, txn: Txn, d: _Dir, blind: bytes, segno: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """A term's live (docnos int64, tfs, doc lengths) in one segment, or None when the
        segment does not hold the term."""
        block = self._raw_block(txn, d, blind, segno)
        if block is None:
            return None
        docnos, tfs, dls = block
        dead = self._dead(txn, d, segno)
        if dead is not None and dead.size:
            keep = ~np.isin(docnos, dead)
            docnos, tfs, dls = docnos[keep], tfs[keep], dls[keep]
        return docnos, tfs, dls

    def _small_block(self, txn: Txn, d: _Dir, blind: bytes,
                     segno: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """A term's postings in a small segment, dead ones included, as (docnos int64, tf
        float64, dl float64), decoded once per handle (a read transaction's segments are
        committed: immutable, their numbers never reused), or None when it has none."""
        if txn.write:
            hit = None
        else:
            fresh = d.fresh.get(segno)
            if fresh is None and segno not in d.terms_of:
                fresh = self._cache.get(("f", segno))
            if fresh is not None:  # written by this handle: the columns as written, no read
                return fresh.block(blind)
            hit = self._cache.get(("b", blind, segno))
        if hit is None:
            block = self._raw_block(txn, d, blind, segno)
            if block is None:
                return None
            hit = (block[0], block[1].astype(np.float64), block[2].astype(np.float64))
            if not txn.write:
                self._cache.put(("b", blind, segno), hit, 3 * hit[0].nbytes)
        return cast("tuple[np.ndarray, np.ndarray, np.ndarray]", hit)

    def _holds(self, txn: Txn, d: _Dir, blind: bytes, segno: int) -> bool:
        """Whether small segment ``segno`` may hold the term (its cached term set says so, or
        there is none to ask: a write transaction, a damaged ``v`` record)."""
        terms = d.terms_of.get(segno)
        if terms is None:
            terms = self._terms_of(txn, d, segno)
        return terms is None or blind in terms

    @staticmethod
    def _counts(d: _Dir, segnos: tuple[int, ...]) -> tuple[int, ...]:
        """The tombstone counts of ``segnos`` in ``d`` (a :class:`_Delta` key's second half)."""
        dead_sizes = d.signature()[1]
        return tuple([dead_sizes.get(s, 0) for s in segnos]) if dead_sizes else (0,) * len(segnos)

    def _delta(self, txn: Txn, d: _Dir, blind: bytes, holders: tuple[int, ...], old: _Delta | None,
               counts: tuple[int, ...] | None = None) -> _Delta:
        """The term's live postings in the small segments ``holders`` (increasing segnos);
        ``old`` itself when it was built from the same segments and tombstones. ``counts``:
        the holders' tombstone counts (:meth:`_counts`), when the caller has them."""
        if counts is None:
            counts = self._counts(d, holders)
        if old is not None and old.key[0] == holders and old.key[1] == counts:
            return old
        parts = []
        sizes: list[int] = []
        at = 0
        if old is not None and (at := len(old.key[0])) < len(holders) \
                and holders[:at] == old.key[0] and counts[:at] == old.key[1]:
            native = _accel.NATIVE
            if native is not None and not txn.write and not any(counts[at:]) and len(holders) - at < 64:
                # only segments this handle wrote came, with no tombstones (the agent loop's
                # add-then-query): their blocks and the copy in one C call (fresh_delta: the
                # same arrays as the loop below; ~10 µs of Python per delta on a cold CPU)
                fresh = [d.fresh.get(s) for s in holders[at:]]
                if None not in fresh:
                    self.deltas_built += 1
                    docnos, tf, dl, added, increasing = native.fresh_delta(blind, old.docnos, old.tf, old.dl, fresh,
                                                                           np.empty, np.int64)
                    if not increasing:
                        order = np.argsort(docnos, kind="stable")  # an update re-added an older docno
                        docnos, tf, dl = docnos[order], tf[order], dl[order]
                    return _Delta((holders, counts), docnos, tf, dl, old.sizes + added)
            if old.docnos.size:
                parts.append((old.docnos, old.tf, old.dl))  # only segments were added: append theirs
            sizes.extend(old.sizes)
        else:
            at = 0
            if old is not None and self._merged:
                moved = self._moved(txn, d, blind, holders, counts, old)
                if moved is not None:
                    self.deltas_moved += 1
                    return moved
        self.deltas_built += 1
        for segno, count in zip(holders[at:], counts[at:]):
            block = self._small_block(txn, d, blind, segno)
            if block is None:
                sizes.append(0)
                continue
            if count:
                dead = self._dead(txn, d, segno)
                if dead is not None and dead.size:
                    keep = ~np.isin(block[0], dead)
                    block = (block[0][keep], block[1][keep], block[2][keep])
            sizes.append(int(block[0].size))
            if block[0].size:
                parts.append(block)
        if not parts:
            return _Delta((holders, counts), np.zeros(0, np.int64), np.zeros(0), np.zeros(0), tuple(sizes))
        if len(parts) == 1:
            docnos, tf, dl = parts[0]
        else:
            native = _accel.NATIVE
            if native is not None:  # one C call for numpy's three concatenates and the order check
                n = sum(p[0].size for p in parts)
                docnos, tf, dl = np.empty(n, dtype=np.int64), np.empty(n), np.empty(n)
                increasing = native.concat_postings(parts, docnos, tf, dl)
            else:
                docnos, tf, dl = (np.concatenate([p[i] for p in parts]) for i in range(3))
                increasing = all(int(a[0][-1]) < int(b[0][0]) for a, b in itertools.pairwise(parts))
            if not increasing:
                order = np.argsort(docnos, kind="stable")  # an update re-added an older docno, or a merge interleaved
                docnos, tf, dl = docnos[order], tf[order], dl[order]
        return _Delta((holders, counts), docnos, tf, dl, tuple(sizes))

    def _moved(self, txn: Txn, d: _Dir, blind: bytes, holders: tuple[int, ...], counts: tuple[int, ...],
               old: _Delta) -> _Delta | None:
        """``old``'s postings relabelled as the term's delta in the small segments ``holders``
        (tombstone ``counts``) when they are the same postings, moved by merges this handle
        committed; None when that is not shown (then the delta is rebuilt).

        Shown when every old holder that gave postings is either still a holder with the
        same tombstones, or was merged, with the tombstones ``old`` was filtered by (an equal
        count is an equal set: a segment's tombstones only grow), into a segment that was
        merged on with none, and so on, into a holder of ``d`` with none; and the holders
        of ``d`` are those and no other, and hold as many of the term's postings as ``old``
        had from them. Each moved posting is then in ``d``'s holders (a merge keeps every
        live posting), so an equal count leaves no room for another one (an update that
        re-added an older docno, a new segment merged in). A delta is in docno order, so
        the same postings are the same arrays."""
        merged = self._merged
        segs = d.segs
        epoch = d.epoch
        kept: dict[int, int] = {}  # old holder still live -> its tombstones then
        kept_sizes: dict[int, int] = {}
        targets: set[int] = set()
        need = 0
        for segno, count, size in zip(old.key[0], old.key[1], old.sizes):
            if segno in segs:
                kept[segno], kept_sizes[segno] = count, size
                continue
            if not size:
                continue  # gave nothing: wherever its postings went, none of them was live
            at = segno
            while True:
                step = merged.get(at)
                if step is None or step[0] != epoch or step[2] != count:
                    return None
                at = step[1]
                if at in segs:
                    break
                count = 0  # a merge output moves on whole only when it had no tombstones
            targets.add(at)
            need += size
        sizes = []
        got = 0
        for segno, count in zip(holders, counts):
            if segno in kept:
                if kept.pop(segno) != count:
                    return None
                sizes.append(kept_sizes[segno])
            elif segno in targets and not count:
                targets.discard(segno)
                block = self._small_block(txn, d, blind, segno)
                size = 0 if block is None else int(block[0].size)
                sizes.append(size)
                got += size
            else:
                return None  # a holder ``old`` knows nothing of
        if kept or targets or got != need:
            return None
        return _Delta((holders, counts), old.docnos, old.tf, old.dl, tuple(sizes))

    def _term_run(self, txn: Txn, d: _Dir, blind: bytes, segnos: Sequence[int], pairs: _Pairs,
                  prefix: _Run | None = None, kill: np.ndarray | None = None) -> tuple[_Pairs, _Run]:
        """One docno-ordered run over large segments: ``prefix`` without the docnos in
        ``kill``, then the term's live postings in ``segnos``. Segments with larger docnos
        only append; a sort happens only when an update re-added an older docno or a merge
        interleaved."""
        self.runs_built += 1
        docs: list[np.ndarray] = []
        codes: list[np.ndarray] = []
        segs: list[int] = []
        if prefix is not None:
            keep = None
            if kill is not None and kill.size and prefix.docnos.size:
                keep = ~np.isin(prefix.docnos, kill)
            docs.append(prefix.docnos if keep is None else prefix.docnos[keep])
            codes.append(prefix.codes if keep is None else prefix.codes[keep])
            segs.extend(prefix.segs)
        found = False
        for segno in segnos:
            block = self._block(txn, d, blind, segno)
            if block is not None and block[0].size:
                # coded a segment at a time: a common term's tf and length columns (and the
                # sort that codes them) never exist for the whole list at once (issue 15)
                pairs, block_codes = pairs.extend(block[1], block[2])
                docs.append(block[0])
                codes.append(block_codes)
                found = True
        segs.extend(segnos)
        if prefix is not None and not found and len(docs) == 1 and docs[0] is prefix.docnos:
            return pairs, prefix.renamed(tuple(segs))
        dtype = _code_dtype(len(pairs.index))
        docs = [a for a in docs if a.size]
        codes = [c.astype(dtype, copy=False) for c in codes if c.size]
        if not docs:
            return pairs, _Run(tuple(segs), np.zeros(0, np.int64), np.zeros(0, dtype), pairs)
        docnos = docs[0] if len(docs) == 1 else np.concatenate(docs)
        all_codes = codes[0] if len(codes) == 1 else np.concatenate(codes)
        if len(docs) > 1 and any(int(a[-1]) >= int(b[0]) for a, b in itertools.pairwise(docs)):
            order = np.argsort(docnos, kind="stable")  # an update re-added an older docno, or a merge interleaved
            docnos, all_codes = docnos[order], all_codes[order]
        return pairs, _Run(tuple(segs), docnos, all_codes, pairs)

    def _view(self, txn: Txn | None, d: _Dir) -> _View | None:
        """:class:`_View` of the read state ``d``, computed once (by :meth:`_adopt` after this
        handle's commit, else by the state's first query), then kept with ``d``. Without a
        transaction (``txn`` None) only from what is in memory: None when a term set or a
        tombstone run would have to be read."""
        view = d.view
        if view is None:
            live, dead_sizes = d.signature()
            segs = d.segs
            terms_of = d.terms_of
            dead = d.dead_live
            if txn is None:
                if any(s not in terms_of for s in live if segs[s][0] <= SMALL_SEGMENT_DOCS):
                    return None
                if dead is None:
                    dead = self._dead_in_memory(d)
                    if dead is None:
                        return None
                    d.dead_live = dead
            small = [(s, terms_of[s] if s in terms_of else self._terms_of(cast("Txn", txn), d, s))
                     for s in live if segs[s][0] <= SMALL_SEGMENT_DOCS]
            big = tuple(s for s in live if segs[s][0] > SMALL_SEGMENT_DOCS)
            if dead is None:
                dead = d.dead_live = self._dead_arrays(cast("Txn", txn), d, live)
            view = d.view = _View(small, (big, tuple(dead_sizes.get(s, 0) for s in big)), dead)
        return view

    def _term_postings(self, txn: Txn, d: _Dir, blind: bytes) -> _TermPostings:
        """A term's live postings in ``d``'s state, from the cache when it covers that
        state, else by updating the cached entry with what changed since (new segments,
        new tombstones, merged segments), else read from the file."""
        live, dead_sizes = d.signature()
        if txn.write:  # nothing cached: a write transaction may abort
            holders = tuple(s for s in live if d.segs[s][0] <= SMALL_SEGMENT_DOCS and self._holds(txn, d, blind, s))
            return self._build(txn, d, blind, holders, self._dead_arrays(txn, d, live))
        old: _TermPostings | None = self._cache.get(("t", blind))
        if old is not None:
            if old.seen == d.serial:
                return old
            if old.epoch == d.epoch and old.live == live and old.dead_sizes == dead_sizes:
                old.seen = d.serial
                return old
        view = d.view or cast("_View", self._view(txn, d))
        same = old is not None and old.epoch == d.epoch
        native = _accel.NATIVE
        counts: tuple[int, ...] | None = None
        if native is not None:
            # _holders and _counts in one C call (the same tuples): on the CPU a commit leaves
            # cold their Python cost ~10 µs per query term
            prev_live, prev_held = (old.live, old.delta.key[0]) if old is not None and same else ((), ())
            holders, counts = native.term_holders(blind, view.small, prev_live, prev_held, dead_sizes)
        elif old is not None and same:
            holders = self._holders(view, old, blind)
        else:
            holders = tuple([s for s, t in view.small if t is None or blind in t])
        if old is not None and same and old.bkey == view.bkey:
            # the base is right as it is (the usual case after a commit or a small merge)
            delta = old.delta
            # compare the holders' tombstone counts even when this state has none: ``d`` may be
            # OLDER than the entry (a read transaction or thread still on an earlier snapshot
            # after a newer one was queried), and then the entry's delta is filtered by
            # tombstones ``d`` does not have (``_counts`` gives zeros for a state without any)
            if counts is None:
                counts = self._counts(d, holders)
            if delta.key[0] == holders and delta.key[1] == counts:
                old.seen = d.serial  # and so is the delta: the entry covers this state as it is
                return old
            # relabelled with the delta of the term's holders now
            entry = old.relabelled(live, view.dead, dead_sizes, self._delta(txn, d, blind, holders, delta, counts),
                                   view.bkey)
        else:
            updated = self._update(txn, d, blind, old, holders, view) if old is not None and old.epoch == d.epoch else None
            entry = self._build(txn, d, blind, holders, view.dead) if updated is None else updated
            entry.bkey = view.bkey
        entry.seen = d.serial
        self._cache.put(("t", blind), entry, entry.nbytes)
        return entry

    @staticmethod
    def _holders(view: _View, old: _TermPostings, blind: bytes) -> tuple[int, ...]:
        """The small segments of ``view``'s state that may hold the term (increasing) from its
        cached entry ``old`` (same epoch): the holders of ``old``'s delta that are still live
        (``old.live``'s small segments holding the term are exactly those: term sets are
        immutable), and of the segments ``old``'s state lacked, those that hold it. The same
        segments as asking every small segment of the state, with lookups only for the ones
        that came since (a holder of ``old`` whose term set was unknown then stays one)."""
        small = view.small_set
        held = [s for s in old.delta.key[0] if s in small]
        new = [s for s, t in view.since(old.live) if t is None or blind in t]
        if new:
            held.extend(new)
            held.sort()  # usually sorted already: the segments that came are the newest
        return tuple(held)

    def _build(self, txn: Txn, d: _Dir, blind: bytes, holders: tuple[int, ...],
               dead: dict[int, np.ndarray]) -> _TermPostings:
        """A term's live postings in ``d``'s state read from the file (blocks the cache holds
        are not read again): the large segments' run, and the delta of the small segments
        ``holders`` (those that may hold the term). ``dead``: the state's dead docnos per
        segment."""
        live, dead_sizes = d.signature()
        pairs, base = self._term_run(txn, d, blind, [s for s in live if d.segs[s][0] > SMALL_SEGMENT_DOCS],
                                     _Pairs.empty())
        return _TermPostings(d.epoch, live, dead, pairs, base, self._delta(txn, d, blind, holders, None), dead_sizes)

    def _update(self, txn: Txn, d: _Dir, blind: bytes, old: _TermPostings, holders: tuple[int, ...],
                view: _View) -> _TermPostings | None:
        """``old`` brought to ``d``'s state when its base run is not right as it is (a large
        segment came, or tombstones in one), the term being in the small segments
        ``holders``; None when it cannot be (a large segment of its base was merged away, or
        ``old`` is from a newer state than ``d``)."""
        live, dead_sizes = d.signature()
        if any(s not in d.segs for s in old.base.segs):
            return None
        kill_parts = []
        for segno, prev in old.dead.items():
            if segno not in d.segs:
                continue
            count = dead_sizes.get(segno, 0)
            if count < prev.size:
                return None  # ``old`` saw tombstones this state does not have: a newer state
            if count > prev.size and d.segs[segno][0] > SMALL_SEGMENT_DOCS:
                now = self._dead(txn, d, segno)
                if now is not None:
                    kill_parts.append(np.setdiff1d(now, prev, assume_unique=True))
        for segno, count in dead_sizes.items():
            if count and segno not in old.dead and segno in old.live and d.segs[segno][0] > SMALL_SEGMENT_DOCS:
                now = self._dead(txn, d, segno)
                if now is not None:
                    kill_parts.append(now)
        kill = np.concatenate(kill_parts).astype(np.int64) if kill_parts else None
        old_base = set(old.base.segs)
        new_big = [s for s in view.bkey[0] if s not in old_base]
        base, pairs = old.base, old.pairs
        if new_big or (kill is not None and base.docnos.size and np.isin(base.docnos, kill).any()):
            pairs, base = self._term_run(txn, d, blind, new_big, pairs, base, kill)
        delta = self._delta(txn, d, blind, holders, old.delta)
        return _TermPostings(d.epoch, live, view.dead, pairs, base, delta, dead_sizes)

    # --- queries --------------------------------------------------------------------------

    def stats(self, txn: Txn) -> tuple[int, int]:
        """(live documents, total length of the live documents)."""
        d = self._directory(txn)
        return d.n_docs, d.total_len

    def _found(self, txn: Txn, query_terms: Mapping[str, float] | Sequence[str]
               ) -> tuple[list[tuple[_TermPostings, float]], _Dir]:
        """The query's terms that match something as (postings, weight), in sorted order (the
        summation order), and the state."""
        weights = dict(query_terms) if isinstance(query_terms, Mapping) else dict(Counter(query_terms))
        d = self._directory(txn)
        native = _accel.NATIVE
        if native is not None and not txn.write and d.n_docs > 0:
            # the loop below in C (query_found: the same calls, minus the Python a term whose
            # cached entry covers this state needs; ~5 functions per term)
            return native.query_found(sorted(weights), weights, _check_weight, self._blinds, self.blind, self._cache.get,
                                      d.serial, self._term_postings, txn, d), d
        found = []
        for term in sorted(weights):  # a fixed order keeps float sums identical everywhere
            w = _check_weight(term, weights[term])
            if d.n_docs <= 0:
                continue
            postings = self._term_postings(txn, d, self.blind(term))
            if postings.size:
                found.append((postings, w))
        return found, d

    def _weighted(self, txn: Txn, query_terms: Mapping[str, float] | Sequence[str]) -> list[_Term]:
        """The query's terms that match something, in sorted order (the summation order)."""
        found, d = self._found(txn, query_terms)
        return _Term.of(found, d.n_docs, d.total_len, not txn.write) if found else []

    def ceiling(self, txn: Txn, query_terms: Mapping[str, float] | Sequence[str],
                masses: IdfMasses | None = None) -> float:
        """The least upper bound of any document's score for ``query_terms``: ``sum w_t * idf(t)``
        over every query term, matched or not (the tf factor tends to 1, never reaching it).
        A term no live document holds counts with ``df = 0``. 0.0 on an empty index.

        ``masses``: :meth:`idf_mass` of the same ``query_terms`` in the same ``txn``, when the
        caller already has it (it is then not recomputed; the result is the same).

        Raises:
            ValidationError: a weight is not a positive finite number.
        """
        if masses is None:
            masses = self.idf_mass(txn, query_terms)
        return float(sum(mass for mass, _ in masses.values()))

    def coverage(self, txn: Txn, query_terms: Mapping[str, float] | Sequence[str],
                 docnos: Sequence[int], masses: IdfMasses | None = None) -> np.ndarray:
        """Per document, ``sum w_t * idf(t)`` over the query terms it contains (the part of
        :meth:`ceiling` it covers, ignoring term frequency and length).

        ``masses``: :meth:`idf_mass` of the same ``query_terms`` in the same ``txn``, when the
        caller already has it (it is then not recomputed; the result is the same).

        Raises:
            ValidationError: a weight is not a positive finite number.
        """
        if masses is None:
            masses = self.idf_mass(txn, query_terms)
        wanted = np.asarray(docnos, dtype=np.int64)
        out = np.zeros(wanted.size)
        probes: dict[np.dtype[Any], np.ndarray] = {}  # wanted in each run's dtype, converted once
        for w_idf, runs in masses.values():
            if runs:
                hit = np.zeros(wanted.size, dtype=bool)
                for run in runs:
                    probe = probes.get(run.dtype)
                    if probe is None:
                        probe = probes[run.dtype] = _as_dtype_of(wanted, run)
                    hit |= run.take(np.searchsorted(run, probe), mode="clip") == wanted
                # adding 0.0 where there is no hit changes nothing: the same sums as before
                np.add(out, w_idf, out=out, where=hit)
        return out

    def idf_mass(self, txn: Txn, query_terms: Mapping[str, float] | Sequence[str]) -> IdfMasses:
        """Per query term (sorted), ``(w_t * idf(t), its live docnos as runs)``: what
        :meth:`ceiling` and :meth:`coverage` are computed from. Compute it once per query and
        pass it to both as ``masses=`` (in the same ``txn``: it belongs to that snapshot).
        Empty on an empty index.

        Raises:
            ValidationError: a weight is not a positive finite number.
        """
        weights = dict(query_terms) if isinstance(query_terms, Mapping) else dict(Counter(query_terms))
        d = self._directory(txn)
        out: IdfMasses = {}
        for term in sorted(weights):  # fixed summation order
            w = _check_weight(term, weights[term])
            if d.n_docs <= 0:
                continue
            postings = self._term_postings(txn, d, self.blind(term))
            mass = w * _idf(d.n_docs, postings.size)
            out[term] = (mass, postings.docnos())
        return out

    def scores(self, txn: Txn, query_terms: Mapping[str, float] | Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """BM25 scores of every live document matching at least one query term.

        Args:
            txn: a store transaction.
            query_terms: index terms, a repeated term counting once per occurrence, or a
                mapping term -> positive weight (a weight of 2 equals repeating the term).

        Returns:
            ``(docnos uint64, scores float64)``, in docno order.

        Raises:
            ValidationError: a weight is not a positive finite number.
        """
        parts = self._weighted(txn, query_terms)
        if not parts:
            return np.zeros(0, np.uint64), np.zeros(0, np.float64)
        runs = [run for p in parts for run in p.weighted()]
        docs = np.concatenate([r[0] for r in runs])
        contrib = np.concatenate([r[1] for r in runs])
        out_docs, inverse = np.unique(docs, return_inverse=True)
        # bincount adds in array order, i.e. term order: the same sums as top()
        return out_docs.astype(np.uint64), np.bincount(inverse, weights=contrib, minlength=out_docs.size)

    def _accumulator(self, size: int) -> np.ndarray:
        """A zeroed float64 array of at least ``size`` slots, one per thread (reused).

        It grows by :data:`_ACC_HEADROOM` (not doubling), so at 1M documents it holds 8.5 MB
        rather than 16 MB per thread: new documents only ever add a few slots."""
        acc = getattr(self._local, "acc", None)
        if acc is None or acc.size < size:
            acc = self._local.acc = None  # the old array goes before the new one is allocated
            acc = self._local.acc = np.zeros(max(size + int(size * _ACC_HEADROOM), 1024))
        return acc

    def top(self, txn: Txn, query_terms: Mapping[str, float] | Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best (docnos uint64, scores), score descending then docno ascending.

        Equal, bit for bit, to ``top_k(*scores(...), k)``, and faster:

        * Contributions go into a dense per-thread accumulator, term by term in sorted
          order (each term's docnos are distinct, so a fancy-indexed add is exact, and the
          sums are the same floats as :meth:`scores`; the C extension's ``top_terms``
          makes the same additions, and selects the same ``k`` best, in one call).
        * When one posting list is much longer than all the others together, it is not
          scanned: its contribution is looked up (binary search) for the documents of the
          other lists, plus its own ``k`` best documents. A document that matches only
          that term and is not among its ``k`` best is beaten by those ``k``, each of
          which scores at least as much (contributions are positive) and wins a tie on
          docno, so it cannot be in the top ``k``.
        * Candidate entries below a floor are dropped first: the k-th best contribution
          of any one term, which the k-th best score cannot be below.
        * Only the best ``k * terms`` candidate entries are examined: a document fills at
          most one entry per list, so fewer entries than that can beat the k-th best
          document, and every tie is kept. A document's entries all carry its final score,
          so after sorting by (score desc, docno) its duplicates are adjacent.

        (MaxScore-style pruning was measured here and lost: with numpy, estimating the
        threshold and binary-searching the skipped lists cost more than adding them.)

        Raises:
            ValidationError: a weight is not a positive finite number.
        """
        k = min(k, sys.maxsize)  # the C calls take a Py_ssize_t; no answer holds more documents
        native = _accel.NATIVE
        if native is None:
            parts = self._weighted(txn, query_terms)
        else:
            found, d = self._found(txn, query_terms)
            loop = _LOG1P_LOOP[0] if _LOG1P_LOOP else _log1p_loop(native)
            if len(found) > 1 and k > 0 and loop is not None:
                # _Term.of and the rest of this method in one C call (query_top: the same
                # memos, values and top_terms call): on the CPU a commit leaves cold, their
                # Python (~25 function calls for 4 terms) costs more than the work
                return native.query_top(found, d.n_docs, d.total_len, not txn.write, loop, K1, B, LOOKUP_RATIO, k,
                                        getattr(self._local, "acc", None), self._accumulator, _lookup_best,
                                        np.empty, np.uint64)
            parts = _Term.of(found, d.n_docs, d.total_len, not txn.write) if found else []
        if not parts or k <= 0:
            return np.zeros(0, np.uint64), np.zeros(0, np.float64)
        if len(parts) == 1:
            docnos, scores = parts[0].best(k)
            return docnos.astype(np.uint64), scores
        sizes = [p.size for p in parts]
        longest = max(range(len(parts)), key=sizes.__getitem__)
        lookup = sizes[longest] > LOOKUP_RATIO * (sum(sizes) - sizes[longest])
        best = parts[longest].best(k)[0] if lookup else None
        acc = self._accumulator(max(p.max_docno for p in parts) + 1)
        runs = [p.runs for p in parts]
        if native is not None:
            # the adds and the selection of _top_numpy in one C call (top_terms: the same
            # additions in the same order, and the k best distinct candidates, which is what
            # its floor, argpartition, lexsort and dedupe keep): their ~20 numpy calls cost
            # ~40 µs a query on the CPU a commit leaves cold, ~25 warm
            return native.top_terms(acc, runs, longest if lookup else -1, best, k, np.empty, np.uint64)
        # the floor from the terms whose ranking is at hand (computing the others' costs more
        # than the candidates it drops)
        floor = max(p.kth_best(k) if (lookup and i == longest) or p.ranked(k) else 0.0 for i, p in enumerate(parts))
        return _top_numpy(acc, runs, longest if lookup else -1, best, k, floor)

    def search(self, txn: Txn, query_terms: Mapping[str, float] | Sequence[str], k: int) -> list[tuple[int, float]]:
        """The top ``k`` (docno, score), score descending then docno ascending.

        Raises:
            ValidationError: a weight is not a positive finite number.
        """
        docs, scores = self.top(txn, query_terms, k)
        return [(int(a), float(s)) for a, s in zip(docs, scores)]

    def doc_count(self, txn: Txn) -> int:
        """The number of live documents."""
        return self._directory(txn).n_docs

    # --- writes -----------------------------------------------------------------------------

    def _write_segment(self, txn: Txn, d: _Dir, docs: TermDocs) -> int | None:
        if not len(docs):
            return None
        segno = d.next
        d.next += 1
        words, docnos, tfs, bounds = count_postings(docs)
        blinds = self.blind_all(words)
        blocks = encode_blocks(docnos, tfs, bounds)
        order = np.argsort(docs.docnos, kind="stable")
        seg_docnos = docs.docnos[order]
        seg_lens = docs.lengths[order].astype(np.uint64)
        self._remember(txn, segno, blinds, docnos, tfs, bounds, seg_docnos, seg_lens)
        txn.put("segments", _seg_key(b"s", segno), encode_block(seg_docnos, seg_lens))
        if self._packs(d, len(docs)):
            self._put_packed(txn, d, segno, blinds, blocks)
        else:
            self._insert_postings(txn, d, segno, blinds, blocks)
            txn.put("segments", _seg_key(b"v", segno), b"".join(sorted(blinds)))
        total = int(seg_lens.sum())
        d.segs[segno] = [len(docs), total]
        d.n_docs += len(docs)
        d.total_len += total
        return segno

    @staticmethod
    def _packs(d: _Dir, ndocs: int) -> bool:
        """Whether a new segment of ``ndocs`` documents is written packed: a small one (the
        segments commits add and automatic merges rewrite) in a file keyed segment first."""
        return PACK_SMALL and d.seg_first and ndocs <= SMALL_SEGMENT_DOCS

    def _put_packed(self, txn: Txn, d: _Dir, segno: int, blinds: Sequence[bytes], blocks: Sequence[bytes]) -> None:
        """Encode a new small segment's blocks as one record (its term list included), stored
        with the directory (:meth:`_put_directory`) unless a merge of this write removes it."""
        d.unwritten[segno] = encode_packed(blinds, blocks)
        d.packed.add(segno)

    def _insert_postings(self, txn: Txn, d: _Dir, segno: int, blinds: Sequence[bytes], blocks: Sequence[bytes]) -> None:
        """Write a new segment's blocks (keys of a fresh segment number are new). Segment
        first, the keys sort after every key in the table (``segno`` is the largest yet), so
        they are appended in key order: pages filled in turn, none of the old ones touched."""
        if d.seg_first:  # one key prefix: the blinds' order (numpy's, on 16-byte keys) is the keys'
            prefix = _SEG.pack(segno)
            items = [(prefix + blinds[i], blocks[i]) for i in _blind_order(blinds)]
        else:
            items = sorted(zip((d.posting_key(b, segno) for b in blinds), blocks))
        txn.insert_many("postings", items, append=d.seg_first)

    def _tombstone(self, txn: Txn, d: _Dir, docnos: Iterable[int], local: dict[int, _Seg]) -> int:
        """Mark the live versions of ``docnos`` dead (pending in ``d`` until
        :meth:`_store_tombstones`); returns how many were indexed and live.

        The live version of a document is in the newest segment holding it (merges and
        updates only ever write live documents into new segments); a dead copy found there
        sends the search on to older segments, as before.
        """
        rest = np.fromiter(docnos, dtype=np.uint64)
        if not rest.size:  # an add: nothing to mark (and np.unique's first call imports numpy.ma)
            return 0
        rest = np.unique(rest)
        marked = 0
        for segno in sorted(d.segs, reverse=True):
            if not rest.size:
                break
            seg = self._segment(txn, segno, local, d.committed)
            if not seg.docnos.size:
                continue
            pos = np.minimum(np.searchsorted(seg.docnos, rest), seg.docnos.size - 1)
            found = seg.docnos[pos] == rest
            if not found.any():
                continue
            hits, at = rest[found], pos[found]
            already = self._dead_mask(txn, d, segno, hits)
            rest = np.sort(np.concatenate([rest[~found], hits[already]])) if already.any() else rest[~found]
            new = hits[~already]
            if new.size:
                d.pending.setdefault(segno, []).append(new)
                d.n_docs -= int(new.size)
                d.total_len -= int(seg.lens[at[~already]].sum())
                marked += int(new.size)
        return marked

    def _store_tombstones(self, txn: Txn, d: _Dir) -> None:
        """Write each segment's pending tombstones as one new run, absorbing the segment's
        newest runs while they hold less than :data:`RUN_MERGE_RATIO` times the new run's
        tombstones (so every run is at least twice the size of the next newer one)."""
        for segno in sorted(d.pending):
            arrays = [a for a in d.pending[segno] if a.size]
            if segno not in d.segs or not arrays:
                continue
            dead = np.sort(np.concatenate(arrays)) if len(arrays) > 1 else arrays[0]
            runs = d.runs.setdefault(segno, [])
            absorbed: list[np.ndarray] = []
            while runs and runs[-1][1] < RUN_MERGE_RATIO * (int(dead.size) + sum(int(a.size) for a in absorbed)):
                run, _ = runs.pop()
                absorbed.append(self._run(txn, d, run))
                txn.delete("segments", _seg_key(RUN_PREFIX, run))
            if absorbed:
                dead = np.sort(np.concatenate([dead, *absorbed]))
            if dead.size > 1 and not np.all(dead[1:] > dead[:-1]):
                raise CorruptFileError("a document is tombstoned twice", hint="run `engramdb verify --fix FILE`")
            run = d.next
            d.next += 1
            txn.put("segments", _seg_key(RUN_PREFIX, run), encode_block(dead, np.ones(dead.size, np.uint64)))
            runs.append([run, int(dead.size)])
            self.tombstones_written += int(dead.size)
            self.runs_written += 1
        d.pending.clear()

    def _put_directory(self, txn: Txn, d: _Dir) -> None:
        if d.unwritten:
            # every one is live: a merge removes the record of a segment it replaces
            assert d.unwritten.keys() <= d.segs.keys(), "an unwritten packed segment is not listed"
            txn.insert_many("segments", [(_seg_key(PACKED_PREFIX, segno), data)
                                         for segno, data in sorted(d.unwritten.items())])
            d.unwritten.clear()
            d.unpacked.clear()
        self._store_tombstones(txn, d)
        txn.put("segments", DIR_KEY, d.encode())
        self._drop_old_runs(d)
        w = self._written_by(txn)
        if w is not None:
            w.dir = d.committed_copy()

    def apply(self, txn: Txn, added: TermDocs | Sequence[tuple[int, Sequence[str]]], removed: Iterable[int],
              *, auto_merge: bool = True) -> None:
        """Index one write transaction: tombstone ``removed`` docnos, then add one segment.

        An update is the docno in both lists. At most one small merge step follows
        (documents read bounded by :data:`AUTO_MERGE_MAX_DOCS`).

        Raises:
            ValidationError: a docno is added twice in one call.
            CorruptFileError: the index records are damaged.
        """
        d = self._write_directory(txn)
        local: dict[int, _Seg] = {}
        self._tombstone(txn, d, removed, local)
        added = _term_docs(added)
        _check_distinct(added.docnos, "document {} added twice in one index batch")
        self._write_segment(txn, d, added)
        if auto_merge:
            self._merge_steps(txn, d, 1, AUTO_MERGE_MAX_DOCS)
        self._put_directory(txn, d)

    def layout(self, txn: Txn) -> dict[str, int]:
        """The segments as stored: how many, the documents they index (live and dead).

        Raises:
            CorruptFileError: the directory is damaged.
        """
        d = _Dir.decode(txn.get("segments", DIR_KEY))
        return {"segments": len(d.segs), "live_docs": d.n_docs, "dead_docs": sum(d.dead_counts().values()),
                "tombstone_runs": sum(len(runs) for runs in d.runs.values())}

    def merge(self, txn: Txn, max_steps: int = 1, *, force: bool = False) -> int:
        """Run up to ``max_steps`` merge steps; returns how many ran.

        With ``force=True`` a step merges every segment into one when the policy has nothing
        left to do (a full optimise, streamed like every merge; compaction does not need
        it: :meth:`purge` removes deleted documents from the segments holding them).

        Raises:
            CorruptFileError: the index records are damaged.
        """
        d = self._write_directory(txn)
        done = self._merge_steps(txn, d, max_steps, None)
        if force and done < max_steps and (len(d.segs) > 1 or d.dead_counts()):
            self._merge_segments(txn, d, sorted(d.segs))
            done += 1
        if done or d.version == 1:  # a version-1 directory is migrated by any write
            self._put_directory(txn, d)
        return done

    def _merge_steps(self, txn: Txn, d: _Dir, max_steps: int, max_docs: int | None) -> int:
        done = 0
        while done < max_steps:
            plan = plan_merge(d.segs, d.dead_counts())
            if plan is None:
                break
            if max_docs is not None and sum(d.segs[s][0] for s in plan) > max_docs:
                break
            self._merge_segments(txn, d, plan)
            done += 1
        return done

    def purge(self, txn: Txn, max_steps: int = 1) -> int:
        """Rewrite segments that hold tombstones without their deleted documents, in up to
        ``max_steps`` steps; returns how many steps ran (0: nothing left to purge).

        The candidates are the segments holding any tombstone. A step rewrites the
        oldest candidates of one size tier (:func:`plan_merge`'s tiers), at most
        :data:`MERGE_FACTOR` of them, into one segment of their live documents (lowest
        tier first), so a purge leaves no more segments than it found and often fewer. Each
        step streams the postings term by term in bounded chunks
        (:data:`MERGE_CHUNK_POSTINGS`): the work is that of the segments holding deleted
        documents, the memory one chunk's, never the whole index's. Scores do not change.

        Raises:
            CorruptFileError: the index records are damaged.
        """
        d = self._write_directory(txn)
        done = 0
        while done < max_steps:
            group = _purge_group(d.segs, d.dead_counts())
            if not group:
                break
            self._merge_segments(txn, d, group)
            done += 1
        if done or d.version == 1:
            self._put_directory(txn, d)
        return done

    def merge_small(self, txn: Txn) -> int:
        """Merge every small segment (at most :data:`SMALL_SEGMENT_DOCS` documents) into one
        when there are several; returns 1 when it did, else 0. Compaction runs it: each
        segment costs a block and an envelope per term it holds, which small segments do not
        amortise (three 150-document segments take twice the postings pages of one), and the
        policy leaves up to nine per tier. The work is bounded: at most nine segments per
        tier below that size.

        Raises:
            CorruptFileError: the index records are damaged.
        """
        d = self._write_directory(txn)
        small = [segno for segno in sorted(d.segs) if d.segs[segno][0] <= SMALL_SEGMENT_DOCS]
        if len(small) < 2:
            return 0
        self._merge_segments(txn, d, small)
        self._put_directory(txn, d)
        return 1

    def _merge_segments(self, txn: Txn, d: _Dir, segnos: Sequence[int]) -> None:
        """Replace ``segnos`` by one segment holding their live documents.

        Streams: the (term, segment) blocks are visited in term order (a merge of the
        segments' sorted term lists) and rewritten in chunks of about
        :data:`MERGE_CHUNK_POSTINGS` postings, so memory holds one chunk, not the segments'
        postings; within a term, the segments' blocks are concatenated in segment order and
        sorted only when their docnos interleave (an update re-adds an older docno)."""
        segnos = sorted(segnos)
        deads: list[tuple[int, np.ndarray] | None] = []
        live_docs, live_lens = [], []
        for segno in segnos:
            seg = self._segment(txn, segno, None, d.committed)
            dead = _dead_map(seg.docnos, self._dead(txn, d, segno))
            keep = _live_rows(seg.docnos, dead)
            live_docs.append(seg.docnos[keep])
            live_lens.append(seg.lens[keep])
            deads.append(dead)
        docnos = np.concatenate(live_docs)
        lens = np.concatenate(live_lens)
        if docnos.size > 1 and not np.all(docnos[1:] > docnos[:-1]):
            order = np.argsort(docnos, kind="stable")
            docnos, lens = docnos[order], lens[order]
        new = d.next if docnos.size else None
        if new is not None and (w := self._written_by(txn)) is not None:
            # where each input's live postings go (their tombstones as filtered now), kept by
            # the handle once the write commits (:meth:`_adopt`, :meth:`_moved`)
            w.merges.update((segno, (d.epoch, new, d.dead_count(segno))) for segno in segnos)
        # a packed segment is read whole, once, and its record deleted; a per-term one's
        # blocks are popped as the merge reaches them. When nothing stays, a packed segment
        # is not read at all (its one record goes below), only the per-term ones' term lists
        packs = {k: self._packed(txn, d, segno) for k, segno in enumerate(segnos)
                 if segno in d.packed} if new is not None else {}
        pairs = heapq.merge(*[[(blind, k) for blind in (packs[k].blinds() if k in packs
                                                        else self._listed_terms(txn, segno))]
                              for k, segno in enumerate(segnos) if k in packs or segno not in d.packed])
        new_blinds: list[bytes] = []
        if new is None:  # nothing stays: remove the blocks unread
            for batch in _batched(pairs, _MERGE_BATCH):
                txn.delete_many("postings", [d.posting_key(blind, segnos[k]) for blind, k in batch])
        else:
            small = docnos.size <= SMALL_SEGMENT_DOCS  # kept for this handle (_remember): bounded
            packed = self._packs(d, int(docnos.size))
            cols: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
            new_blocks: list[bytes] = []
            for chunk, datas in self._merge_chunks(txn, d, segnos, pairs, packs):
                blinds, blocks, col_d, col_t, per_term = self._rewrite_chunk(chunk, datas, deads)
                if packed:
                    new_blocks += blocks
                elif blinds:
                    self._insert_postings(txn, d, new, blinds, blocks)
                new_blinds += blinds
                if small:
                    cols.append((col_d, col_t, per_term))
            if small and new_blinds:
                bounds = np.concatenate(([0], np.cumsum(np.concatenate([c[2] for c in cols]))))
                self._remember(txn, new, new_blinds, np.concatenate([c[0] for c in cols]),
                               np.concatenate([c[1] for c in cols]), bounds, docnos, lens)
            if packed:
                self._put_packed(txn, d, new, new_blinds, new_blocks)
        for segno in segnos:
            txn.delete("segments", _seg_key(b"s", segno))
            d.unpacked.pop(segno, None)
            if d.unwritten.pop(segno, None) is None:
                txn.delete("segments", _seg_key(PACKED_PREFIX if segno in d.packed else b"v", segno))
            d.packed.discard(segno)
            del d.segs[segno]
            for run, _ in d.runs.pop(segno, ()):
                txn.delete("segments", _seg_key(RUN_PREFIX, run))
            d.pending.pop(segno, None)
        if new is not None:
            d.next += 1
            txn.put("segments", _seg_key(b"s", new), encode_block(docnos, lens))
            if new not in d.packed:
                txn.put("segments", _seg_key(b"v", new), b"".join(new_blinds))
            d.segs[new] = [int(docnos.size), int(lens.sum())]

    def _merge_chunks(self, txn: Txn, d: _Dir, segnos: Sequence[int], pairs: Iterable[tuple[bytes, int]],
                      packs: Mapping[int, _Packed]) -> Iterator[tuple[list[tuple[bytes, int]], list[bytes]]]:
        """Remove the blocks of ``pairs`` (``(blind, segment index)`` in term order) and yield
        them in chunks of whole terms, a chunk closed once it holds
        :data:`MERGE_CHUNK_POSTINGS` postings: ``(its pairs, their plaintexts)``. The blocks
        of the packed segments ``packs`` (by segment index) are cut from their records
        (which the caller deletes)."""
        chunk: list[tuple[bytes, int]] = []
        datas: list[bytes] = []
        total = 0
        for batch in _batched(pairs, _MERGE_BATCH):
            if packs:
                got: list[bytes | None] = [packs[k].block(blind) if k in packs else None for blind, k in batch]
                rows = [i for i, (_, k) in enumerate(batch) if k not in packs]
                if rows:
                    popped = txn.pop_many("postings", [d.posting_key(batch[i][0], segnos[batch[i][1]]) for i in rows])
                    for i, data in zip(rows, popped):
                        got[i] = data
            else:
                got = txn.pop_many("postings", [d.posting_key(blind, segnos[k]) for blind, k in batch])
            for pair, data in zip(batch, got):
                if data is None:
                    raise CorruptFileError("a BM25 segment lists a term with no posting block",
                                           hint="run `engramdb verify --fix FILE`")
                if total >= MERGE_CHUNK_POSTINGS and pair[0] != chunk[-1][0]:
                    yield chunk, datas
                    chunk, datas, total = [], [], 0
                chunk.append(pair)
                datas.append(data)
                total += _HEAD.unpack_from(data)[1] if len(data) >= _HEAD.size else 0
        if chunk:
            yield chunk, datas

    def _rewrite_chunk(self, chunk: Sequence[tuple[bytes, int]], datas: list[bytes],
                       deads: Sequence[tuple[int, np.ndarray] | None]
                       ) -> tuple[list[bytes], list[bytes], np.ndarray, np.ndarray, np.ndarray]:
        """Encode the live postings of ``chunk``'s blocks (``(blind, segment index)`` pairs in
        term order, their plaintexts ``datas``) as the new segment's blocks; returns the
        blinds that kept a posting, in order, their blocks, and the columns encoded
        (docnos, tfs, and each blind's number of postings)."""
        col_d, col_t, counts = decode_blocks(datas)
        self.merge_chunk_postings = max(self.merge_chunk_postings, int(col_d.size))
        seg_of = np.fromiter((k for _, k in chunk), dtype=np.int64, count=len(chunk))
        if len(deads) == 1:
            keep = _live_rows(col_d, deads[0])
        else:
            keep = np.ones(col_d.size, dtype=bool)
            col_seg = np.repeat(seg_of, counts)
            for k, dead in enumerate(deads):
                if dead is not None:
                    rows = np.flatnonzero(col_seg == k)
                    keep[rows] = _live_rows(col_d[rows], dead)
        # term index of each row: blocks of one blind are adjacent in ``chunk``
        first = np.ones(len(chunk), dtype=bool)
        first[1:] = [chunk[i][0] != chunk[i - 1][0] for i in range(1, len(chunk))]
        term_of_block = np.cumsum(first) - 1
        col_term = np.repeat(term_of_block, counts)
        if not keep.all():
            col_d, col_t, col_term = col_d[keep], col_t[keep], col_term[keep]
        n_terms = int(term_of_block[-1]) + 1 if len(chunk) else 0
        per_term = np.bincount(col_term, minlength=n_terms)
        if col_d.size > 1:
            same = col_term[1:] == col_term[:-1]
            if not np.all(col_d[1:][same] > col_d[:-1][same]):  # interleaved segments: sort per term
                order = np.lexsort((col_d, col_term))
                col_d, col_t = col_d[order], col_t[order]
        present = np.flatnonzero(per_term)
        if not present.size:
            return [], [], col_d, col_t, per_term[:0]
        bounds = np.concatenate(([0], np.cumsum(per_term[present])))
        blocks = encode_blocks(col_d, col_t, bounds)
        blinds = [chunk[i][0] for i in np.flatnonzero(first)[present].tolist()]
        return blinds, blocks, col_d, col_t, per_term[present]

    def needs_migration(self, txn: Txn) -> bool:
        """Whether the postings are keyed ``blind | segno`` (directory version 1 or 2): a
        writable open converts them (:meth:`migrate`). A damaged directory says no (verify
        reports it; ``verify --fix`` rebuilds the index in the current layout)."""
        try:
            data = txn.get("segments", DIR_KEY)
            return data is not None and not _Dir.decode(data).seg_first
        except CorruptFileError:
            return False

    def migrate(self, txn: Txn) -> bool:
        """Convert postings keyed ``blind | segno`` to ``segno | blind`` (directory version 3)
        in this transaction; returns whether it did. Every block moves to its new key
        (sealed again: an envelope is bound to its key), tombstones of a version-1
        directory become runs, and segments, docnos and blocks stay as they are, so scores
        and cached postings do not change.

        Raises:
            CorruptFileError: the directory or a block is damaged.
        """
        if not self.needs_migration(txn):
            return False
        d = self._write_directory(txn)
        txn.rekey("postings", lambda key: key[BLIND_LEN:] + key[:BLIND_LEN])
        d.version = SEG_FIRST_VERSION
        self._put_directory(txn, d)
        return True

    def rebuild(self, txn: Txn, docs: TermDocs | Sequence[tuple[int, Sequence[str]]]) -> None:
        """Drop every posting and segment and index ``docs`` as one segment.

        Segment numbers keep increasing and the epoch changes, so caches in other handles
        can never confuse old and new segments.

        Raises:
            ValidationError: a docno appears twice.
        """
        try:
            old = _Dir.decode(txn.get("segments", DIR_KEY))
            epoch, next_segno = old.epoch + 1, old.next
        except CorruptFileError:
            epoch, next_segno = 1, 1
        for table in ("postings", "segments"):
            keys = list(txn.keys(table))
            for key in keys:
                if table == "segments" and key[:1] in (b"s", b"v", RUN_PREFIX, PACKED_PREFIX) and len(key) == 5:
                    next_segno = max(next_segno, _SEG.unpack(key[1:])[0] + 1)
                if table == "postings" and len(key) == BLIND_LEN + 4:
                    # either layout (the directory may be unreadable): the segment number is
                    # the small end, the other is a random blind
                    segno = min(_SEG.unpack(key[:4])[0], _SEG.unpack(key[BLIND_LEN:])[0])
                    next_segno = max(next_segno, segno + 1)
            txn.delete_many(table, keys)
        docs = _term_docs(docs)
        _check_distinct(docs.docnos, "docno {} appears twice in the documents to index")
        d = _Dir(epoch, next_segno)
        d.committed = self._committed_mark(txn, next_segno)
        self._write_segment(txn, d, docs)
        self._put_directory(txn, d)

    def verify(self, txn: Txn, docs: Iterable[tuple[int, Sequence[str]]]) -> list[str]:
        """Compare the index with ``docs`` (every live docno and its terms, best in docno
        order, consumed once).

        Memory stays small: the postings are read one block at a time and summed into one
        64-bit digest per indexed document (sum of tf x hash(term)), then the documents are
        read in chunks and their digests compared, so verify holds ~24 bytes per indexed
        document instead of every document's terms (issue 15).

        Returns:
            Human-readable problems; empty when postings, lengths and statistics agree.
        """
        problems: list[str] = []
        try:
            d = self._write_directory(txn) if txn.write else _Dir.decode(txn.get("segments", DIR_KEY))
        except CorruptFileError as exc:
            return [f"bm25: {exc.message}"]
        seg_docnos: list[np.ndarray] = []
        seg_lens: list[np.ndarray] = []
        seg_digests: list[np.ndarray] = []
        try:
            for segno in sorted(d.segs):
                seg = self._segment(txn, segno)
                runs = d.runs.get(segno, ())
                arrays = [self._run(txn, d, run) for run, _ in runs] + d.pending.get(segno, [])
                if [a.size for a in arrays[:len(runs)]] != [count for _, count in runs]:
                    problems.append(f"bm25: a tombstone run of segment {segno} does not hold the count listed")
                dead = np.concatenate(arrays) if arrays else np.zeros(0, np.uint64)
                if np.unique(dead).size != dead.size or not np.isin(dead, seg.docnos).all():
                    problems.append(f"bm25: segment {segno} has tombstones repeated or of documents it lacks")
                live = ~np.isin(seg.docnos, dead)
                docnos = seg.docnos[live].astype(np.uint64)  # increasing, as the segment keeps them
                digests = np.zeros(docnos.size, np.uint64)
                for blind, data in self._segment_blocks(txn, d, segno):
                    if data is None:
                        problems.append(f"bm25: segment {segno} lists a term with no posting block")
                        continue
                    pd, pt = decode_block(data)
                    pos = np.minimum(np.searchsorted(docnos, pd), max(docnos.size - 1, 0))
                    hit = docnos[pos] == pd if docnos.size else np.zeros(pd.size, bool)
                    # a block's docnos increase, so ``pos[hit]`` has no repeats: += adds each once
                    digests[pos[hit]] += pt[hit].astype(np.uint64) * np.uint64(_term_hash(blind))
                seg_docnos.append(docnos)
                seg_lens.append(seg.lens[live].astype(np.int64))
                seg_digests.append(digests)
        except CorruptFileError as exc:
            return problems + [f"bm25: {exc.message}"]
        act_docnos, act_lens, act_digests = _live_documents(problems, seg_docnos, seg_lens, seg_digests)
        del seg_docnos, seg_lens, seg_digests
        seen = np.zeros(act_docnos.size, bool)
        missing = wrong = n_exp = len_exp = 0
        first_missing = first_wrong = -1
        for chunk in _chunks(docs, VERIFY_CHUNK_DOCS):
            docnos = np.fromiter((docno for docno, _ in chunk), np.uint64, len(chunk))
            lens = np.fromiter((len(terms) for _, terms in chunk), np.int64, len(chunk))
            digests = self._doc_digests([terms for _, terms in chunk])
            n_exp += len(chunk)
            len_exp += int(lens.sum())
            pos = np.minimum(np.searchsorted(act_docnos, docnos), max(act_docnos.size - 1, 0))
            found = act_docnos[pos] == docnos if act_docnos.size else np.zeros(docnos.size, bool)
            seen[pos[found]] = True
            if not found.all():
                missing += int((~found).sum())
                first = int(docnos[~found].min())
                first_missing = first if first_missing < 0 else min(first_missing, first)
            bad = found.copy()
            bad[found] = (act_digests[pos[found]] != digests[found]) | (act_lens[pos[found]] != lens[found])
            if bad.any():
                wrong += int(bad.sum())
                first = int(docnos[bad].min())
                first_wrong = first if first_wrong < 0 else min(first_wrong, first)
        extra = act_docnos[~seen]
        if missing:
            problems.append(f"bm25: {missing} documents are not indexed (first docno {first_missing})")
        if extra.size:
            problems.append(f"bm25: {extra.size} indexed documents no longer exist (first docno {int(extra[0])})")
        if wrong:
            problems.append(f"bm25: {wrong} documents have postings that differ from their text "
                            f"(first docno {first_wrong})")
        if (d.n_docs, d.total_len) != (n_exp, len_exp):
            problems.append(f"bm25: statistics say {d.n_docs} documents / {d.total_len} terms, "
                            f"the records give {n_exp} / {len_exp}")
        return problems

    def _doc_digests(self, docs: Sequence[Sequence[str]]) -> np.ndarray:
        """Per document, the sum of tf x hash(blind term) (mod 2**64) that :meth:`verify`
        sums from the postings."""
        counts = [Counter(terms) for terms in docs]
        vocab = list({term: None for c in counts for term in c})
        hashes = dict(zip(vocab, map(_term_hash, self.blind_all(vocab))))
        out = np.zeros(len(docs), np.uint64)
        for i, c in enumerate(counts):
            out[i] = sum(tf * hashes[term] for term, tf in c.items()) & _U64_MASK
        return out


VERIFY_CHUNK_DOCS = 4096  # documents whose terms verify holds at once
_U64_MASK = 2**64 - 1


def _term_hash(blind: bytes) -> int:
    """A blinded term's 64-bit hash, for verify's per-document digests."""
    return int.from_bytes(hashlib.blake2b(blind, digest_size=8).digest(), "little")


def _chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def _live_documents(problems: list[str], docnos: list[np.ndarray], lens: list[np.ndarray],
                    digests: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The segments' live documents in docno order: (docnos, lengths, digests). A document
    live in two segments is reported and counted once, with its postings of both and the
    length of the later segment."""
    if not docnos:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros(0, np.uint64)
    all_docnos, all_lens, all_digests = np.concatenate(docnos), np.concatenate(lens), np.concatenate(digests)
    order = np.argsort(all_docnos, kind="stable")  # equal docnos stay in segment order
    all_docnos, all_lens, all_digests = all_docnos[order], all_lens[order], all_digests[order]
    dup = all_docnos[1:] == all_docnos[:-1]
    if dup.any():
        problems += [f"bm25: document {docno} is live in two segments" for docno in all_docnos[1:][dup].tolist()]
        starts = np.flatnonzero(np.concatenate([[True], ~dup]))
        ends = np.concatenate([starts[1:], [all_docnos.size]]) - 1
        all_digests = np.add.reduceat(all_digests, starts)
        all_docnos, all_lens = all_docnos[starts], all_lens[ends]
    return all_docnos, all_lens, all_digests
