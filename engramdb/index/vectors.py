"""Embedding spaces and exact vector search inside the encrypted file (spec/vectors.md).

Layout (values sealed by the store; no space name or id appears in a key):

``meta`` table
    ``b"index.spaces"`` -> msgpack ``{name: {"model", "dims", "dtype", "normalize", "auto"}}``.
``vectors`` table
    ``blind(space) | u32 0``                -> the space's directory: rows per block, count, change log.
    ``blind(space) | 0x01 | u64be(block)``  -> the rows of docnos ``block * R`` to ``block * R + R - 1``.

A block is ``u16le n | u16le R | u32le dims | bitmap | n x dims float32 (LE)``. Files of the
first layout (blocks by write batch, with tombstones) are read and converted (spec/vectors.md).
Search is exact: the live rows are read into one float32 matrix kept in memory (refreshed
when another process commits), each row's dot product with the query computed on its own
(:func:`row_dots`), and the top k taken with ``argpartition``; ties break by docno ascending.
"""
from __future__ import annotations

import math
import struct
import threading
import zlib
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from collections.abc import Callable, Iterator, Mapping, Sequence

import msgpack
import numpy as np
from numpy.typing import NDArray

from ..crypto import ENVELOPE_OVERHEAD
from ..errors import CorruptFileError, EmbeddingError, ValidationError
from ..records import STORED, as_float32
from .bm25 import snapshot_id, top_k
from .tokenize import Tokenizer

if TYPE_CHECKING:  # annotations only
    from ..store import Txn

__all__ = [
    "DTYPES",
    "HASHED_MODEL",
    "Embedder",
    "EmbeddingSpace",
    "HashedTfidfEmbedder",
    "check_embedder",
    "row_dots",
    "LocalModelEmbedder",
    "VectorIndex",
    "decode_vector_block",
    "encode_vector_block",
]

SPACES_KEY = b"index.spaces"
DTYPES = ("float32",)
HASHED_MODEL = "engramdb/hashed-tfidf-v1"
_BLOCK_HEAD = struct.Struct("<II")
_U32 = struct.Struct(">I")
_DIR = _U32.pack(0)
MAX_DIMS = 65_536
# Terms whose slot the built-in embedder remembers (the first seen: the common ones). Each
# costs ~150 bytes and saves ~5 % of a text's embedding; at 1,000,000 a long-lived handle
# held ~146 MiB per built-in space, outside every cache limit. 32,768: under 5 MiB.
MAX_SLOTS = 32_768


class Embedder(Protocol):
    """Turns texts into a float32 matrix of shape ``(len(texts), dims)``."""

    def __call__(self, texts: list[str]) -> np.ndarray: ...


class HashedTfidfEmbedder:
    """A deterministic embedder that needs no model: hashed, sublinear TF x IDF.

    Each index term (from the file's tokenizer) is hashed with CRC-32 to a dimension and
    a sign (the hashing trick); its weight is ``(1 + ln tf) * idf`` where ``idf`` comes
    from an optional fixed table (default 1.0, i.e. pure sublinear TF). Rows are
    L2-normalised. The same text gives the same bytes in every process.

    Args:
        dims: output dimensions.
        tokenizer: the tokenizer (the file's, so query and document terms agree).
        idf: optional term -> idf weights.

    Raises:
        ValidationError: ``dims`` is not a positive integer.
    """

    def __init__(self, dims: int = 256, tokenizer: Tokenizer | None = None,
                 idf: Mapping[str, float] | None = None) -> None:
        if isinstance(dims, bool) or not isinstance(dims, int) or not 0 < dims <= MAX_DIMS:
            raise ValidationError(f"dims must be an integer in 1..{MAX_DIMS}")
        self.dims = dims
        self.tokenizer = tokenizer or Tokenizer(stemmer=None)
        self.idf = dict(idf or {})
        self._slots: dict[str, tuple[int, float]] = {}

    def _slot(self, term: str) -> tuple[int, float]:
        slot = self._slots.get(term)
        if slot is None:
            h = zlib.crc32(term.encode("utf-8", "surrogatepass"))
            slot = (h % self.dims, 1.0 if (h >> 31) & 1 else -1.0)
            if len(self._slots) < MAX_SLOTS:
                self._slots[term] = slot
        return slot

    def __call__(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dims), dtype=np.float64)
        for row, text in enumerate(texts):
            for term, tf in sorted(Counter(self.tokenizer(text)).items()):
                dim, sign = self._slot(term)
                out[row, dim] += sign * (1.0 + math.log(tf)) * self.idf.get(term, 1.0)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        np.divide(out, norms, out=out, where=norms > 0)
        return out.astype(np.float32)


class LocalModelEmbedder:
    """A sentence-transformers model loaded from local files only (never downloaded).

    The optional extra: ``pip install sentence-transformers`` and a model directory (or a
    model already in the local cache). Loading is lazy, on the first call.

    Args:
        model: a local path or the name of a model present in the local cache.
        normalize: L2-normalise the output rows.

    Raises:
        EmbeddingError: (on first use) sentence-transformers is not installed, or the model
            is not available locally.
    """

    def __init__(self, model: str, *, normalize: bool = True) -> None:
        if not isinstance(model, str) or not model:
            raise EmbeddingError("LocalModelEmbedder needs a model path or name")
        self.model = model
        self.normalize = normalize
        self._impl: Any = None

    def _load(self) -> Any:
        if self._impl is None:
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError as exc:
                raise EmbeddingError("sentence-transformers is not installed",
                                     hint="pip install sentence-transformers, or use the built-in "
                                          f"{HASHED_MODEL!r} space") from exc
            try:
                self._impl = SentenceTransformer(self.model, local_files_only=True)
            except Exception as exc:  # the library raises OSError, ValueError, HF errors...
                raise EmbeddingError(f"the model {self.model!r} is not available locally",
                                     hint="download it once yourself and pass its directory; "
                                          "engramdb never downloads models") from exc
        return self._impl

    def __call__(self, texts: list[str]) -> np.ndarray:
        out = self._load().encode(list(texts), normalize_embeddings=self.normalize, convert_to_numpy=True)
        return np.asarray(out, dtype=np.float32)


@dataclass(frozen=True)
class EmbeddingSpace:
    """An embedding space recorded in the file's meta.

    Attributes:
        name: the space's name (what ``Node.embeddings`` keys use).
        model: the model id that produced the vectors (free text; enforced on reopen).
        dims: vector dimensions.
        dtype: storage dtype (only ``"float32"``).
        normalize: L2-normalise vectors on write and queries on search (cosine).
        auto: compute missing vectors from the node text with the built-in hashed embedder
            (only for ``model == HASHED_MODEL``).
    """

    name: str
    model: str
    dims: int
    dtype: str = "float32"
    normalize: bool = True
    auto: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise EmbeddingError("an embedding space needs a non-empty name")
        if not isinstance(self.model, str) or not self.model:
            raise EmbeddingError("an embedding space needs a model id", hint="e.g. 'all-MiniLM-L6-v2'")
        for what, text in (("name", self.name), ("model id", self.model)):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate: the settings record could not be written
                raise EmbeddingError(f"the embedding space's {what} {text!r} is not valid Unicode (a lone surrogate)",
                                     hint="pass a name of valid characters") from None
        if isinstance(self.dims, np.integer):  # a NumPy count (a model's output shape) is a count
            object.__setattr__(self, "dims", int(self.dims))
        if isinstance(self.dims, bool) or not isinstance(self.dims, int) or not 0 < self.dims <= MAX_DIMS:
            raise EmbeddingError(f"dims must be an integer in 1..{MAX_DIMS}, got {self.dims!r}")
        for flag in ("normalize", "auto"):
            value = getattr(self, flag)
            if isinstance(value, np.bool_):
                object.__setattr__(self, flag, bool(value))
            elif not isinstance(value, bool):  # by truthiness, normalize="false" would normalise
                raise EmbeddingError(f"{flag} must be True or False, got {value!r}",
                                     hint=f"pass {flag}=True or {flag}=False")
        if self.dtype not in DTYPES:
            raise EmbeddingError(f"unsupported vector dtype {self.dtype!r}", hint="use 'float32'")
        if self.auto and self.model != HASHED_MODEL:
            raise EmbeddingError("auto-embedding needs the built-in model", hint=f"use model={HASHED_MODEL!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "dims": self.dims, "dtype": self.dtype,
                "normalize": self.normalize, "auto": self.auto}


# --- layout 2 (engramdb 1.x since issue 15): one copy of each vector, blocks by docno range -----

_TAG = b"\x01"  # block keys: blind(space) | 0x01 | u64be(docno // rows_per_block)
_U64BE = struct.Struct(">Q")
_HEAD = struct.Struct("<HHI")  # rows present, rows per block, dims
LAYOUT = 2
PAGE_SIZE = 4096  # spec/file-format.md: LMDB page size
_PAGE_HEADER = 16  # LMDB's page header: an overflow value of n bytes takes (n + 15) // 4096 + 1 pages
MAX_BLOCK_BYTES = 64 * 1024
MAX_ROWS_PER_BLOCK = 4096
STREAM_ROWS = 256  # rows scored per call in a streamed search (a 384-dim buffer: 384 KiB)
DEFAULT_CACHE_MB = 2048.0


def rows_per_block(dims: int) -> int:
    """Rows per block of a space of ``dims`` dimensions: the count whose full, sealed block
    wastes the least of the LMDB overflow pages it occupies (at most 64 KiB; ties go to
    more rows). Recorded in the space's directory when the space gets its first block."""
    row = dims * 4
    best, best_eff = 1, -1.0
    for rows in range(1, MAX_ROWS_PER_BLOCK + 1):
        size = ENVELOPE_OVERHEAD + _HEAD.size + (rows + 7) // 8 + rows * row
        if size > MAX_BLOCK_BYTES and rows > 1:
            break
        pages = (size + _PAGE_HEADER - 1) // PAGE_SIZE + 1
        eff = rows * row / (pages * PAGE_SIZE)
        if eff >= best_eff:
            best, best_eff = rows, eff
    return best


def encode_vector_block(offsets: np.ndarray, matrix: np.ndarray, rows: int) -> bytes:
    """One block of a space: ``u16le n | u16le rows | u32le dims | bitmap | n x dims float32 LE``.

    ``offsets`` (ascending, distinct, below ``rows``) are the rows' docnos minus the
    block's first docno; the bitmap (``ceil(rows / 8)`` bytes, bit ``i`` of byte ``i // 8``
    counted from the least significant) marks them.

    Raises:
        ValidationError: the offsets and the matrix do not fit each other or ``rows``.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    matrix = np.ascontiguousarray(matrix, dtype="<f4")
    if (matrix.ndim != 2 or offsets.ndim != 1 or offsets.size != matrix.shape[0] or not 0 < rows <= 0xFFFF
            or (offsets.size and (offsets[0] < 0 or offsets[-1] >= rows or np.any(np.diff(offsets) <= 0)))):
        raise ValidationError("a vector block needs ascending distinct offsets below its row count, one per row")
    bits = np.zeros(rows, dtype=bool)
    bits[offsets] = True
    return (_HEAD.pack(offsets.size, rows, matrix.shape[1]) + np.packbits(bits, bitorder="little").tobytes()
            + matrix.tobytes())


def decode_vector_block(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`encode_vector_block`: ``(offsets, matrix)``, the matrix a read-only
    float32 view of ``data``.

    Raises:
        CorruptFileError: the header, bitmap and length disagree.
    """
    if len(data) < _HEAD.size:
        raise CorruptFileError("a vector block is truncated", hint="run `engramdb verify FILE`")
    n, rows, dims = _HEAD.unpack_from(data)
    nbits = (rows + 7) // 8
    if rows == 0 or n > rows or len(data) != _HEAD.size + nbits + n * dims * 4:
        raise CorruptFileError("a vector block has the wrong length", hint="run `engramdb verify FILE`")
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8, count=nbits, offset=_HEAD.size), bitorder="little")
    offsets = np.flatnonzero(bits)
    if offsets.size != n or (offsets.size and offsets[-1] >= rows):
        raise CorruptFileError("a vector block's bitmap disagrees with its row count",
                               hint="run `engramdb verify FILE`")
    matrix = np.frombuffer(data, dtype="<f4", count=n * dims, offset=_HEAD.size + nbits).reshape(n, dims)
    return offsets, matrix.astype(np.float32, copy=False)


LOG_ENTRIES = 64


class _Dir:
    """A layout-2 space directory: ``{"layout": 2, "rows": rows per block, "dims": dims,
    "count": live rows, "seq": changes so far, "log": [[seq, lowest block it touched], ...]}``
    (the last 64 changes: a reader whose matrix is a few changes old re-reads only the blocks
    from the lowest one touched)."""

    __slots__ = ("rows", "dims", "count", "seq", "log")

    def __init__(self, rows: int, dims: int, count: int = 0, seq: int = 0,
                 log: list[tuple[int, int]] | None = None) -> None:
        self.rows, self.dims, self.count, self.seq = rows, dims, count, seq
        self.log: list[tuple[int, int]] = log or []

    def changed(self, lowest_block: int) -> None:
        """Count one change whose lowest touched block is ``lowest_block``."""
        self.seq += 1
        self.log = [*self.log[-(LOG_ENTRIES - 1):], (self.seq, lowest_block)]

    def lowest_since(self, seq: int) -> int | None:
        """The lowest block changed after ``seq``; None when the log does not reach back."""
        entries = [block for s, block in self.log if s > seq]
        if seq > self.seq or len(entries) != self.seq - seq:
            return None
        return min(entries, default=None)

    def encode(self) -> bytes:
        return msgpack.packb({"layout": LAYOUT, "rows": self.rows, "dims": self.dims, "count": self.count,
                              "seq": self.seq, "log": [list(e) for e in self.log]}, use_bin_type=True)


def _decode_dir(data: bytes | None) -> _Dir | _VDir | None:
    """A space directory of either layout (None when the space has none yet).

    Raises:
        CorruptFileError: the record does not decode.
    """
    if data is None:
        return None
    try:
        raw = msgpack.unpackb(data, raw=False)
        if isinstance(raw, dict) and "layout" in raw:
            if raw["layout"] != LAYOUT:
                raise ValueError("unknown layout")
            d = _Dir(int(raw["rows"]), int(raw["dims"]), int(raw["count"]), int(raw["seq"]),
                     [(int(s), int(b)) for s, b in raw.get("log", [])])
            if not (0 < d.rows <= 0xFFFF and 0 < d.dims <= MAX_DIMS and d.count >= 0):
                raise ValueError("out of range")
            return d
    except Exception as exc:  # msgpack and shape errors alike mean a damaged record
        raise CorruptFileError("a vector directory record is malformed",
                               hint="run `engramdb verify --fix FILE`") from exc
    return _VDir.decode(data)


def _legacy_decode_block(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """A block of the first layout: ``u32le rows | u32le dims | rows x u64le docno | float32``.

    Raises:
        CorruptFileError: the lengths do not match the header.
    """
    if len(data) < _BLOCK_HEAD.size:
        raise CorruptFileError("a vector block is truncated")
    rows, dims = _BLOCK_HEAD.unpack_from(data)
    if len(data) != _BLOCK_HEAD.size + rows * 8 + rows * dims * 4:
        raise CorruptFileError("a vector block has the wrong length")
    docnos = np.frombuffer(data, dtype="<u8", count=rows, offset=_BLOCK_HEAD.size).astype(np.uint64)
    matrix = np.frombuffer(data, dtype="<f4", count=rows * dims, offset=_BLOCK_HEAD.size + rows * 8)
    return docnos, matrix.reshape(rows, dims).astype(np.float32)


# A row within this of its normalised self (every component) is a unit vector engramdb stored.
_STORED_UNIT_TOL = 1e-5


def _check_matrix(space: EmbeddingSpace, vectors: Any, *, stored: bool = False) -> np.ndarray:
    """Validate and (if the space says so) normalise a (rows, dims) matrix.

    ``stored``: the rows are vectors engramdb stored (a dump's): a row that is already a
    unit vector is kept bit for bit. Float32 normalisation is not idempotent (a unit row
    divided by its float32 norm moves by an ulp), so a restore changed every vector."""
    arr = as_float32(vectors, f"space {space.name!r}: the vector", copy=False)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] != space.dims:
        got = arr.shape[-1] if arr.ndim else 0
        raise EmbeddingError(f"space {space.name!r} has {space.dims} dims, got a vector of {got}")
    if not np.all(np.isfinite(arr)):
        raise EmbeddingError(f"space {space.name!r}: the vector contains NaN or infinity")
    if space.normalize:
        given = arr
        arr, zero = unit_rows(arr)
        if zero.any():
            raise EmbeddingError(f"space {space.name!r} normalises vectors, and a zero vector cannot be normalised",
                                 hint="skip empty texts or create the space with normalize=False")
        if stored:
            unit = np.max(np.abs(arr - given), axis=1) <= _STORED_UNIT_TOL
            arr[unit] = given[unit]
    return arr


# Float32 squares overflow above ~1.8e19 and lose precision below ~1e-19: a row whose float32
# norm is infinite or under this floor is normalised in float64 instead.
_NORM_FLOOR = 1e-15


def unit_rows(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(rows / their L2 norms as float32, which rows are zero)`` for a finite float32 matrix
    (zero rows stay zero). Norms are float32, as engramdb always computed them, except for
    rows whose float32 squares overflow or underflow: those are normalised in float64, so a
    finite vector of large (or tiny) values is not stored as zeros (or refused as zero)."""
    with np.errstate(over="ignore", under="ignore"):
        norms = np.linalg.norm(arr, axis=1, keepdims=True)
    # _check_matrix runs twice per space per recall: the usual matrix (every norm in range)
    # takes two reductions (a query, one float) instead of the boolean passes below
    rows = norms.shape[0]
    if rows == 1:
        lo = hi = float(norms[0, 0])
    elif rows:
        lo, hi = float(norms.min()), float(norms.max())  # NaN propagates: not in range
    else:
        lo, hi = _NORM_FLOOR, 0.0
    if lo >= _NORM_FLOOR and hi < math.inf:
        return (arr / norms).astype(np.float32, copy=False), np.zeros(rows, dtype=bool)
    odd = np.flatnonzero(~(norms[:, 0] >= _NORM_FLOOR) | ~np.isfinite(norms[:, 0]))
    wide = arr[odd].astype(np.float64)
    wide_norms = np.linalg.norm(wide, axis=1, keepdims=True)
    zero = np.zeros(arr.shape[0], dtype=bool)
    zero[odd] = wide_norms[:, 0] == 0
    norms[odd] = 1.0
    out = (arr / norms).astype(np.float32)
    out[odd] = np.divide(wide, wide_norms, out=np.zeros_like(wide), where=wide_norms > 0)
    return out, zero


def row_dots(matrix: np.ndarray, q: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``matrix @ q``, each row's dot product computed the same way wherever the row sits.

    BLAS (``@``) picks its kernel by the matrix's shape: one row's score changed with the
    number of rows around it (a search block by block, a matrix a few rows longer), so
    equal vectors scored differently by their position and broke the docno order of ties.
    NumPy's einsum sums each row on its own (and is no slower for one query vector).
    ``out``: a float32 array of ``len(matrix)`` to write the scores into."""
    got: np.ndarray = np.einsum("ij,j->i", matrix, q, out=out)
    return got


def _embed(space: EmbeddingSpace, emb: Callable[[list[str]], Any], texts: list[str]) -> np.ndarray:
    """``emb(texts)`` as float32, for documents and queries alike.

    Raises:
        EmbeddingError: the embedder returned something that is not numbers. An error raised
            inside the embedder itself (the user's model) propagates unchanged, with its traceback.
    """
    out = emb(texts)
    try:
        return as_float32(out, f"the answer of the embedder of space {space.name!r}", copy=False)
    except EmbeddingError as exc:
        raise EmbeddingError(exc.message, hint="an embedder returns a float32 array (n, dims) for n texts") from None


def _one_space_column(spaces: Mapping[str, EmbeddingSpace],
                      nodes: Sequence[tuple[int, Any]]) -> tuple[str, list[int], list[Any]] | None:
    """``(space, docnos, vectors)`` when every node has exactly one vector, all in the same
    known space and all NumPy arrays of its dimensions (what ``add_many`` of embedded
    memories gives), found with a few passes in C; else None (the caller goes node by node,
    which also finds the first error)."""
    if not nodes:
        return None
    embeddings = [node.embeddings for _, node in nodes]
    first = embeddings[0]
    if len(first) != 1:
        return None
    (name,) = first
    space = spaces.get(name)
    if space is None or not all(len(e) == 1 and name in e for e in embeddings):
        return None
    vecs = [e[name] for e in embeddings]
    if set(map(type, vecs)) != {np.ndarray} or set(map(len, vecs)) != {space.dims}:
        return None
    return name, [docno for docno, _ in nodes], vecs


def _keep_unchanged(rows: dict[str, tuple[list[int], np.ndarray]], added: Sequence[tuple[int, Any]],
                    removed: Sequence[tuple[int, Any]]) -> None:
    """Put back, in ``rows`` (:meth:`VectorIndex.vectors_for`'s), the stored vector of each
    updated memory whose vector in a space is the one it had: float32 normalisation is not
    idempotent, so normalising a stored unit row again moved it by an ulp (an update of the
    memory's tags changed its vector)."""
    old_vectors = {docno: old.embeddings for docno, old in removed  # a deleted one's: only names
                   if isinstance(getattr(old, "embeddings", None), Mapping) and old.embeddings}
    if not old_vectors:
        return
    new_nodes = dict(added)
    for name, (docnos, matrix) in rows.items():
        for i, docno in enumerate(docnos):
            old = old_vectors.get(docno, {}).get(name)
            node = new_nodes.get(docno)
            new = node.embeddings.get(name) if node is not None else None
            if (isinstance(old, np.ndarray) and isinstance(new, np.ndarray)
                    and (new is old or np.array_equal(new, old)) and not np.array_equal(matrix[i], old)):
                matrix[i] = old


def _flags_as_bools(cfg: Any) -> Any:
    """A stored space's settings with ``normalize`` and ``auto`` as bools: before session 11,
    ``add_space(normalize="false")`` (or ``normalize=None``) was stored as it was and acted
    by its truthiness (its vectors were normalised, or not), so such a file reads as what it did."""
    if isinstance(cfg, dict):
        cfg = {k: bool(v) if k in ("normalize", "auto") and (v is None or isinstance(v, (str, int, float))) else v
               for k, v in cfg.items()}
    return cfg


class _VDir:
    """A space's directory in the first layout (read to migrate a file): its blocks and
    tombstones. A tombstone ``(docno, before)`` says: rows of ``docno`` in blocks numbered
    below ``before`` are dead."""

    __slots__ = ("next", "blocks", "dead_docs", "dead_before")

    def __init__(self) -> None:
        self.next = 1
        self.blocks: dict[int, int] = {}  # block number -> rows (including dead ones)
        self.dead_docs = np.zeros(0, np.uint64)  # sorted, distinct
        self.dead_before = np.zeros(0, np.uint32)

    @classmethod
    def decode(cls, data: bytes) -> _VDir:
        d = cls()
        try:
            raw = msgpack.unpackb(data, raw=False)
            d.next = int(raw["next"])
            d.blocks = {int(b): int(n) for b, n in raw["blocks"]}
            d.dead_docs = np.frombuffer(raw["dead_docs"], dtype="<u8").astype(np.uint64)
            d.dead_before = np.frombuffer(raw["dead_before"], dtype="<u4").astype(np.uint32)
            if d.dead_docs.size != d.dead_before.size:
                raise ValueError("tombstone columns differ")
        except Exception as exc:  # msgpack and shape errors alike mean a damaged record
            raise CorruptFileError("a vector directory record is malformed",
                                   hint="run `engramdb verify --fix FILE`") from exc
        return d

    def live_mask(self, blockno: int, docnos: np.ndarray) -> np.ndarray:
        """Which rows of block ``blockno`` are live."""
        if not self.dead_docs.size or not docnos.size:
            return np.ones(docnos.size, dtype=bool)
        pos = np.searchsorted(self.dead_docs, docnos)
        pos[pos == self.dead_docs.size] = 0
        dead = (self.dead_docs[pos] == docnos) & (self.dead_before[pos] > blockno)
        live: NDArray[np.bool_] = ~dead
        return live

class _SpaceCache:
    """The live matrix of a space with the state it was built from, and the last block a
    lookup decoded (sequential reads of a dump decode each block once)."""

    __slots__ = ("live", "last", "used")

    def __init__(self) -> None:
        # (snapshot id, directory seq, docnos, matrix): replaced as a whole, so a reader on
        # another snapshot never sees a half-updated pair. docnos and matrix are the first rows
        # of larger buffers (their .base); rows past ``used`` are written by nobody yet, so
        # rows appended there never change what an older view shows.
        self.live: tuple[int, tuple[str, int | None], np.ndarray, np.ndarray] | None = None
        self.last: tuple[int, int, np.ndarray, np.ndarray] | None = None
        self.used = 0


def _frozen_row(row: np.ndarray) -> np.ndarray:
    out = np.array(row, dtype=np.float32)  # a copy: the node must not pin the block or the matrix
    out.flags.writeable = False
    return out


def check_embedder(name: str, embedder: object, model: str | None = None) -> None:
    """Raise EmbeddingError unless ``embedder``, for space ``name`` of ``model`` (None: not
    known yet), is callable (it would fail at the first query) and the space's model is not
    the built-in one: every handle embeds a built-in space with engramdb's own embedder, so
    one handle's embedder there wrote vectors the others (and their ``verify``) disagree with."""
    if not callable(embedder):
        raise EmbeddingError(f"the embedder of space {name!r} must be callable, got {type(embedder).__name__}",
                             hint="pass a function from a list of texts to a float32 array (n, dims)")
    if model == HASHED_MODEL:
        raise EmbeddingError(f"space {name!r} uses the built-in model {HASHED_MODEL}: every handle embeds it "
                             "with engramdb's own embedder, so it takes no embedder",
                             hint="for your own model, add a space named after it: "
                                  "add_space(name, dims=..., model='your-model', embedder=fn)")


class VectorIndex:
    """The vector blocks of one open file, with an in-memory matrix per space.

    Args:
        blind: ``store.blind``.
        last_txnid: ``store.last_txnid`` (a change refreshes the matrices).
        tokenizer: the file's tokenizer, for the built-in embedder.
        cache_mb: the most MiB of matrices kept between searches (None: 2048). A space
            whose matrix is larger is searched block by block, holding one block at a time.
    """

    def __init__(self, blind: Callable[[bytes, bytes], bytes], last_txnid: Callable[[], int],
                 tokenizer: Tokenizer | None = None, *, cache_mb: float | None = None) -> None:
        self._blind_fn = blind
        self._last_txnid = last_txnid
        self._tokenizer = tokenizer
        self._spaces_state: tuple[int, dict[str, EmbeddingSpace]] | None = None
        self._caches: dict[str, _SpaceCache] = {}
        self._embedders: dict[str, Callable[[list[str]], np.ndarray]] = {}
        # the built-in model's embedder per space, apart from the user's: a built-in space is
        # embedded by it on every handle, whatever this one registered under its name
        self._builtin: dict[str, Callable[[list[str]], np.ndarray]] = {}
        self._lock = threading.Lock()  # loads a matrix: the bound holds for all spaces together
        self.cache_bytes = int((DEFAULT_CACHE_MB if cache_mb is None else max(0.0, float(cache_mb))) * 2**20)
        # set by restore on its own handle: the nodes' vectors are a dump's, stored as they are
        self.stored_rows = False

    # --- spaces -------------------------------------------------------------------------

    def _prefix(self, name: str) -> bytes:
        return self._blind_fn(b"space", name.encode("utf-8", "surrogatepass"))

    @staticmethod
    def _read_spaces(txn: Txn) -> dict[str, EmbeddingSpace]:
        data = txn.get("meta", SPACES_KEY)
        if data is None:
            return {}
        try:
            raw = msgpack.unpackb(data, raw=False)
            return {name: EmbeddingSpace(name=name, **_flags_as_bools(cfg)) for name, cfg in sorted(raw.items())}
        except (EmbeddingError, TypeError, ValueError, msgpack.UnpackException) as exc:
            raise CorruptFileError("the embedding-space settings in meta are malformed") from exc

    def _refresh(self, txn: Txn) -> dict[str, EmbeddingSpace]:
        if txn.write:
            return self._read_spaces(txn)
        txnid = snapshot_id(txn, self._last_txnid)
        state = self._spaces_state
        if state is None or txnid != state[0]:
            state = self._spaces_state = (txnid, self._read_spaces(txn))
        return state[1]

    def spaces(self, txn: Txn) -> dict[str, EmbeddingSpace]:
        """The file's embedding spaces by name.

        Raises:
            CorruptFileError: the settings record is damaged.
        """
        return dict(self._refresh(txn))

    def add_space(self, txn: Txn, space: EmbeddingSpace) -> None:
        """Record a new embedding space (a write). Re-adding an identical space is a no-op.

        Raises:
            ConfigMismatchError: a space of that name exists with other settings.
            EmbeddingError: a new space of the built-in model whose name has an embedder on
                this handle (``set_embedder`` before the space existed).
        """
        from ..errors import ConfigMismatchError

        spaces = self._read_spaces(txn)
        old = spaces.get(space.name)
        if old is not None:
            if old != space:
                raise ConfigMismatchError(
                    f"embedding space {space.name!r} exists with model {old.model!r}, {old.dims} dims, "
                    f"normalize={old.normalize}, auto={old.auto}",
                    hint="use another space name, or add it with the same settings")
            return
        registered = self._embedders.get(space.name)
        if registered is not None:
            check_embedder(space.name, registered, space.model)  # it would write this handle's auto vectors
        spaces[space.name] = space
        txn.put("meta", SPACES_KEY, msgpack.packb({n: s.to_dict() for n, s in sorted(spaces.items())},
                                                  use_bin_type=True))

    def set_embedder(self, name: str, embedder: Callable[[list[str]], np.ndarray], model: str | None = None) -> None:
        """Register the embedder used for queries (and auto vectors) in space ``name``, of
        ``model`` when the space exists.

        Raises:
            EmbeddingError: ``embedder`` is not callable (it would fail at the first query),
                or the space's model is the built-in one.
        """
        check_embedder(name, embedder, model)
        self._embedders[name] = embedder

    def embedder(self, space: EmbeddingSpace) -> Callable[[list[str]], np.ndarray] | None:
        """The built-in embedder for a space of the built-in model (an embedder registered under
        its name on this handle, before another handle created it, is not used: its vectors
        would differ from every other handle's), else the registered one, or None."""
        if space.model != HASHED_MODEL:
            return self._embedders.get(space.name)
        emb = self._builtin.get(space.name)
        if emb is None:
            emb = self._builtin[space.name] = HashedTfidfEmbedder(space.dims, self._tokenizer)
        return emb

    def _space(self, spaces: Mapping[str, EmbeddingSpace], name: str) -> EmbeddingSpace:
        space = spaces.get(name)
        if space is None:
            known = ", ".join(sorted(spaces)) or "none"
            raise EmbeddingError(f"unknown embedding space {name!r} (known: {known})",
                                 hint="create it first with Engram.add_space(name, dims=..., model=...)")
        return space

    # --- layout -------------------------------------------------------------------------

    def _dir(self, txn: Txn, name: str) -> _Dir | _VDir | None:
        return _decode_dir(txn.get("vectors", self._prefix(name) + _DIR))

    def needs_migration(self, txn: Txn) -> bool:
        """Whether a space is still in the first layout (vectors in the node records and
        tombstoned blocks): a writable open converts it (:meth:`rebuild`).

        Raises:
            CorruptFileError: a directory or the space settings are damaged.
        """
        try:
            return any(isinstance(self._dir(txn, name), _VDir) for name in self._read_spaces(txn))
        except CorruptFileError:
            return False  # verify reports it; verify --fix rebuilds (and so converts) the vectors

    # --- writes ---------------------------------------------------------------------------

    def _auto_rows(self, spaces: Mapping[str, EmbeddingSpace], nodes: Sequence[tuple[int, Any]],
                   texts: Sequence[str]) -> dict[str, tuple[list[int], np.ndarray]]:
        """The built-in vectors of the nodes without their own, per ``auto`` space."""
        out: dict[str, tuple[list[int], np.ndarray]] = {}
        for name, space in spaces.items():
            if not space.auto:
                continue
            todo = [(i, docno) for i, (docno, node) in enumerate(nodes) if name not in node.embeddings and texts[i]]
            if not todo:
                continue
            emb = self.embedder(space)
            if emb is None:  # auto spaces use the hashed model, whose embedder is built in
                raise EmbeddingError(f"no embedder for the embedding space {name!r}",
                                     hint="register one with set_embedder() before adding memories")
            mat = _embed(space, emb, [texts[i] for i, _ in todo])
            if mat.ndim != 2 or mat.shape[0] != len(todo):  # else rows would go to the wrong memories
                raise EmbeddingError(f"the embedder of space {name!r} returned an array of shape {mat.shape} "
                                     f"for {len(todo)} texts",
                                     hint="an embedder returns a float32 array (n, dims) for n texts")
            keep = np.flatnonzero(np.any(mat != 0, axis=1))  # an empty text has no vector
            if keep.size:
                out[name] = ([todo[int(i)][1] for i in keep], mat[keep])
        return out

    def vectors_for(self, txn: Txn, nodes: Sequence[tuple[int, Any]], texts: Sequence[str]) -> dict[str, tuple[list[int], np.ndarray]]:
        """Validated rows per space for ``nodes`` (their embeddings plus auto vectors).

        Raises:
            EmbeddingError: an unknown space, wrong dims, or non-finite values.
        """
        spaces = self._read_spaces(txn) if txn.write else self._refresh(txn)
        column = _one_space_column(spaces, nodes)
        if column is not None:  # a bulk add's usual batch: one vector each, one space, one length
            name, docnos, vecs = column
            out = {name: (docnos, _check_matrix(spaces[name], np.stack(vecs), stored=self.stored_rows))}
        else:
            out = self._rows_one_by_one(spaces, nodes)
        for name, (docnos, mat) in self._auto_rows(spaces, nodes, texts).items():
            mat = _check_matrix(spaces[name], mat)
            if name in out:
                out[name] = (out[name][0] + docnos, np.concatenate([out[name][1], mat]))
            else:
                out[name] = (docnos, mat)
        return dict(sorted(out.items()))

    def _rows_one_by_one(self, spaces: dict[str, EmbeddingSpace],
                         nodes: Sequence[tuple[int, Any]]) -> dict[str, tuple[list[int], np.ndarray]]:
        """:meth:`vectors_for`'s rows of the nodes' own vectors, node by node (any batch).

        Raises:
            EmbeddingError: an unknown space or wrong dims.
        """
        rows: dict[str, tuple[list[int], list[Any]]] = {}
        for (docno, node) in nodes:
            for name, vec in node.embeddings.items():
                space = self._space(spaces, name)
                if vec is STORED:
                    raise EmbeddingError(f"memory #{docno} names a stored vector in {name!r} that was not read",
                                         hint="this is a bug in engramdb, please report it")
                if len(vec) != space.dims:  # checked per row: a ragged batch cannot be stacked
                    raise EmbeddingError(f"space {name!r} has {space.dims} dims, got a vector of {len(vec)}")
                entry = rows.setdefault(name, ([], []))
                entry[0].append(docno)
                entry[1].append(vec)
        return {name: (docnos, _check_matrix(spaces[name], np.stack(vecs) if vecs else vecs, stored=self.stored_rows))
                for name, (docnos, vecs) in rows.items() if docnos}

    def _new_dir(self, space: EmbeddingSpace, seq: int = 0) -> _Dir:
        return _Dir(rows_per_block(space.dims), space.dims, 0, seq)

    def apply(self, txn: Txn, added: Sequence[tuple[int, Any]], texts: Sequence[str],
              removed: Sequence[tuple[int, Any]]) -> None:
        """Drop the rows of the ``removed`` (docno, old node) pairs and store the vectors of
        ``added``: each block touched is rewritten once.

        Raises:
            EmbeddingError: an added node has a vector for an unknown space, of the wrong
                dims, or with NaN/infinity.
            CorruptFileError: a space is still in the first layout (open the file writable
                to migrate it) or a block is damaged.
        """
        spaces = self._read_spaces(txn)
        if not spaces:
            for _, node in added:
                if node.embeddings:
                    self._space(spaces, sorted(node.embeddings)[0])
            return
        new_rows = self.vectors_for(txn, added, texts)
        if removed and added:
            _keep_unchanged(new_rows, added, removed)
        for name in sorted(spaces):
            # an auto space may hold a row for any memory; otherwise only where the old
            # record had a vector in this space
            gone = [docno for docno, old in removed if spaces[name].auto or name in old.embeddings]
            if not gone and name not in new_rows:
                continue
            prefix = self._prefix(name)
            d = _decode_dir(txn.get("vectors", prefix + _DIR)) or self._new_dir(spaces[name])
            if isinstance(d, _VDir):
                raise CorruptFileError(f"the embedding space {name!r} is in the first vector layout",
                                       hint="open the file writable once to convert it")
            docnos, matrix = new_rows.get(name, ([], np.zeros((0, d.dims), np.float32)))
            touched = np.concatenate([np.asarray(docnos, dtype=np.uint64), np.asarray(gone, dtype=np.uint64)])
            self._write_rows(txn, prefix, d, np.asarray(docnos, dtype=np.uint64), matrix,
                             np.asarray(sorted(set(gone)), dtype=np.uint64))
            d.changed(int(touched.min()) // d.rows)
            txn.put("vectors", prefix + _DIR, d.encode())

    def _write_rows(self, txn: Txn, prefix: bytes, d: _Dir, docnos: np.ndarray, matrix: np.ndarray,
                    gone: np.ndarray) -> None:
        """Set the rows ``docnos`` to ``matrix`` and remove the rows ``gone`` (not re-set)."""
        order = np.argsort(docnos, kind="stable")
        docnos, matrix = docnos[order], matrix[order]
        if docnos.size > 1 and np.any(docnos[1:] == docnos[:-1]):
            raise ValidationError("a vector is added twice for one memory in one transaction")
        rows = d.rows
        blocks = np.union1d(np.unique(docnos // rows), np.unique(gone // rows)).astype(np.uint64)
        starts = np.searchsorted(docnos, blocks * rows)
        ends = np.searchsorted(docnos, (blocks + 1) * rows)
        gstarts = np.searchsorted(gone, blocks * rows)
        gends = np.searchsorted(gone, (blocks + 1) * rows)
        items: list[tuple[bytes, bytes]] = []
        for i, blockno in enumerate(blocks.tolist()):
            key = prefix + _TAG + _U64BE.pack(blockno)
            base = blockno * rows
            offs = (docnos[starts[i]:ends[i]] - np.uint64(base)).astype(np.int64)
            mat = matrix[starts[i]:ends[i]]
            old = txn.get("vectors", key)
            if old is not None:
                old_offs, old_mat = decode_vector_block(old)
                drop = (gone[gstarts[i]:gends[i]] - np.uint64(base)).astype(np.int64)
                keep = ~np.isin(old_offs, np.concatenate([offs, drop]))
                d.count -= old_offs.size
                if not keep.all() or offs.size:
                    offs = np.concatenate([old_offs[keep], offs])
                    mat = np.concatenate([old_mat[keep], mat])
                    by = np.argsort(offs, kind="stable")
                    offs, mat = offs[by], mat[by]
                else:
                    offs, mat = old_offs, old_mat
                    d.count += offs.size
                    continue  # nothing of this block changes
            d.count += offs.size
            if offs.size:
                items.append((key, encode_vector_block(offs, mat, rows)))
            elif old is not None:
                txn.delete("vectors", key)
        if items:
            txn.put_many("vectors", items)

    def layout(self, txn: Txn) -> dict[str, dict[str, int]]:
        """Per space, the vector blocks as stored: how many, their rows, the dead ones among them.

        Raises:
            CorruptFileError: a directory is damaged.
        """
        out = {}
        for name in sorted(self._read_spaces(txn)):
            prefix = self._prefix(name)
            d = _decode_dir(txn.get("vectors", prefix + _DIR))
            if isinstance(d, _VDir):
                out[name] = {"blocks": len(d.blocks), "rows": sum(d.blocks.values()),
                             "dead_rows": int(d.dead_docs.size)}
            else:
                blocks = sum(1 for key in txn.keys("vectors", prefix + _TAG) if len(key) == len(prefix) + 9)
                out[name] = {"blocks": blocks, "rows": d.count if d else 0, "dead_rows": 0}
        return out

    def merge(self, txn: Txn, max_steps: int = 1, *, force: bool = False) -> int:
        """Blocks never hold dead rows (a delete rewrites its block), so there is nothing to
        merge: returns 0. Kept for the indexes' common maintenance call."""
        return 0

    def _stored_rows(self, txn: Txn, name: str) -> dict[int, np.ndarray]:
        """Every row of a layout-2 space, by docno (for a rebuild)."""
        docnos, matrix = self._load(txn, name, self._prefix(name), _decode_dir(txn.get("vectors", self._prefix(name) + _DIR)))
        return {int(doc): matrix[i] for i, doc in enumerate(docnos.tolist())}

    def rebuild(self, txn: Txn, nodes: Sequence[tuple[int, Any]], texts: Sequence[str]) -> list[tuple[int, Any]]:
        """Rewrite every vector block from the vectors the memories have: those stored in
        the blocks (a record names its spaces), those in records of the first layout, and
        the ``auto`` vectors recomputed. Returns the ``(docno, node)`` pairs whose record
        must be rewritten: records of the first layout (their vectors now live in the
        blocks only) and records naming a vector that is missing (dropped from them).

        Raises:
            EmbeddingError: a node holds a vector that does not fit its space.
        """
        spaces = self._read_spaces(txn)
        seqs: dict[str, int] = {}
        stored: dict[str, dict[int, np.ndarray]] = {}
        for name in spaces:
            try:
                d = _decode_dir(txn.get("vectors", self._prefix(name) + _DIR))
            except CorruptFileError:
                d = None
            seqs[name] = d.seq + 1 if isinstance(d, _Dir) else 0
            if isinstance(d, _Dir):
                try:
                    stored[name] = self._stored_rows(txn, name)
                except CorruptFileError:
                    stored[name] = {}  # damaged blocks: their vectors are lost
        resolved: list[tuple[int, Any]] = []
        rewrite: list[tuple[int, Any]] = []
        for docno, node in nodes:
            emb = node.embeddings
            if emb and any(v is STORED for v in emb.values()):
                found = {name: stored.get(name, {}).get(docno) for name in emb}
                node = node.replace(embeddings={name: v for name, v in found.items() if v is not None})
                if any(v is None for v in found.values()):
                    rewrite.append((docno, node))
            elif emb:
                rewrite.append((docno, node))  # a first-layout record: its vectors move to the blocks
            resolved.append((docno, node))
        for key in list(txn.keys("vectors")):
            txn.delete("vectors", key)
        for name, space in spaces.items():
            txn.put("vectors", self._prefix(name) + _DIR, self._new_dir(space, seqs[name]).encode())
        # a copy made in C (list(): no thread switch inside): a query of this handle in another
        # thread may add a space's cache meanwhile (_cache), which a loop over the live dict
        # would fail on ("dictionary changed size during iteration")
        for cache in list(self._caches.values()):
            cache.last = None
        self.apply(txn, resolved, texts, [])
        return rewrite

    # --- reads ----------------------------------------------------------------------------------

    def _cache(self, name: str) -> _SpaceCache:
        cache = self._caches.get(name)
        if cache is None:
            cache = self._caches[name] = _SpaceCache()
        return cache

    def _load(self, txn: Txn, name: str, prefix: bytes, d: _Dir | _VDir | None) -> tuple[np.ndarray, np.ndarray]:
        """(docnos, matrix) of every live row, read block by block into one preallocated matrix.

        Raises:
            CorruptFileError: a block is damaged or the rows do not add up to the directory's count.
        """
        if d is None:
            space = self._read_spaces(txn).get(name)
            return np.zeros(0, np.uint64), np.zeros((0, space.dims if space else 0), np.float32)
        if isinstance(d, _VDir):
            return self._load_legacy(txn, prefix, d)
        # spare rows for appends (np.empty maps them lazily: no memory until written)
        capacity = d.count + max(256, d.count // 8)
        docnos = np.empty(capacity, np.uint64)[:d.count]
        matrix = np.empty((capacity, d.dims), np.float32)[:d.count]
        self._read_blocks(txn, name, prefix, d, 0, docnos, matrix, 0)
        return docnos, matrix

    def _blocks(self, txn: Txn, name: str, prefix: bytes, d: _Dir, first_block: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(docnos, rows) of each block from ``first_block`` on, in docno order.

        Raises:
            CorruptFileError: a block is damaged or has other dimensions than the space.
        """
        for key, plain in txn.items("vectors", prefix + _TAG, start=prefix + _TAG + _U64BE.pack(first_block)):
            if len(key) != len(prefix) + 9:
                continue
            offs, mat = decode_vector_block(plain)
            if mat.shape[1] != d.dims:
                raise CorruptFileError(f"the vector blocks of space {name!r} disagree with its directory",
                                       hint="run `engramdb verify --fix FILE`")
            yield offs.astype(np.uint64) + np.uint64(_U64BE.unpack_from(key, len(prefix) + 1)[0] * d.rows), mat

    def _read_blocks(self, txn: Txn, name: str, prefix: bytes, d: _Dir, first_block: int, docnos: np.ndarray,
                     matrix: np.ndarray, pos: int) -> None:
        """Decrypt the blocks from ``first_block`` on into ``docnos[pos:]``, ``matrix[pos:]``,
        which must end exactly at the directory's count.

        Raises:
            CorruptFileError: a block is damaged, or the blocks do not add up to the count.
        """
        for docs, mat in self._blocks(txn, name, prefix, d, first_block):
            end = pos + docs.size
            if end > docnos.size:
                break
            docnos[pos:end] = docs
            matrix[pos:end] = mat
            pos = end
        else:
            if pos == docnos.size:
                return
        raise CorruptFileError(f"the vector blocks of space {name!r} disagree with its directory's count "
                               f"({d.count})", hint="run `engramdb verify --fix FILE`")

    def _appended(self, txn: Txn, name: str, prefix: bytes, d: _Dir, cache: _SpaceCache,
                  live: tuple[int, tuple[str, int | None], np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray] | None:
        """The matrix of ``d`` from the cached one when the changes since only added rows
        after it (the add-then-search loop): the blocks from the lowest one changed are read,
        and the new rows land in the buffers' spare rows. None when that does not apply."""
        old_docs, old_mat = live[2], live[3]
        seq = live[1][1]
        low = d.lowest_since(seq) if seq is not None else None
        base_docs, base_mat = old_docs.base, old_mat.base
        if (low is None or d.count < old_docs.size or cache.used != old_docs.size or base_docs is None
                or base_mat is None or base_docs.shape[0] < d.count or base_mat.shape[0] < d.count
                or base_mat.shape[1] != d.dims):
            return None
        keep = int(np.searchsorted(old_docs, np.uint64(low * d.rows)))  # rows before the first changed block
        tail_docs = np.empty(d.count - keep, np.uint64)
        tail_mat = np.empty((d.count - keep, d.dims), np.float32)
        self._read_blocks(txn, name, prefix, d, low, tail_docs, tail_mat, 0)
        n_old = old_docs.size
        if not (np.array_equal(tail_docs[:n_old - keep], old_docs[keep:])
                and np.array_equal(tail_mat[:n_old - keep], old_mat[keep:])):
            return None  # a row before the new ones changed (a delete or an update)
        docnos, matrix = base_docs[:d.count], base_mat[:d.count]
        docnos[n_old:] = tail_docs[n_old - keep:]
        matrix[n_old:] = tail_mat[n_old - keep:]
        cache.used = d.count
        return docnos, matrix

    def _load_legacy(self, txn: Txn, prefix: bytes, d: _VDir) -> tuple[np.ndarray, np.ndarray]:
        docs, mats = [], []
        for blockno in sorted(d.blocks):
            data = txn.get("vectors", prefix + _U32.pack(blockno))
            if data is None:
                raise CorruptFileError(f"vector block {blockno} is missing", hint="run `engramdb verify --fix FILE`")
            docnos, matrix = _legacy_decode_block(data)
            keep = d.live_mask(blockno, docnos)
            docs.append(docnos[keep])
            mats.append(matrix[keep])
        if not docs:
            return np.zeros(0, np.uint64), np.zeros((0, 0), np.float32)
        docnos, matrix = np.concatenate(docs), np.concatenate(mats)
        order = np.argsort(docnos, kind="stable")
        return docnos[order], np.ascontiguousarray(matrix[order])

    def _matrix(self, txn: Txn, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(docnos, matrix) of the live rows of space ``name``, in docno order; None when the
        matrix is larger than the cache allows (then :meth:`scores` streams the blocks).

        Kept in memory between queries; rebuilt only when the space changed (a commit
        elsewhere that touches no vector keeps the matrix).
        """
        cache = self._cache(name)
        sid = None if txn.write else snapshot_id(txn, self._last_txnid)
        live = cache.live
        if live is not None and sid is not None and live[0] == sid:
            return live[2], live[3]
        prefix = self._prefix(name)
        d = _decode_dir(txn.get("vectors", prefix + _DIR))
        key = ("seq", d.seq) if isinstance(d, _Dir) else ("legacy", sid)
        if live is not None and sid is not None and live[1] == key:
            cache.live = (sid, key, live[2], live[3])
            return live[2], live[3]
        size = d.count * d.dims * 4 if isinstance(d, _Dir) else 0
        if size > self.cache_bytes:
            cache.live = None
            return None
        if sid is None:  # a write transaction: its state is not committed, nothing is cached
            return self._load(txn, name, prefix, d)
        # one space at a time, so the matrices held together stay within the limit: a space
        # that does not fit beside the others' is streamed (evicting them instead would
        # reload every space on every recall, which queries them all)
        with self._lock:
            if size > self.cache_bytes - self._held_bytes(name):
                cache.live = None
                return None
            live = cache.live
            got = None
            if live is not None and isinstance(d, _Dir) and live[1][0] == "seq":
                got = self._appended(txn, name, prefix, d, cache, live)
            if got is None:
                cache.live = None  # drop the old matrix before reading the new one
                got = self._load(txn, name, prefix, d)
                cache.used = got[0].size
            cache.live = (sid, key, got[0], got[1])
        return got

    def _held_bytes(self, name: str) -> int:
        """The bytes of the matrices this handle holds for spaces other than ``name``."""
        return sum(c.live[3].nbytes for n, c in list(self._caches.items()) if n != name and c.live is not None)

    def live_rows(self, txn: Txn, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(docnos, matrix) of the live rows of space ``name``, in docno order: the cached
        matrix, or, when it is larger than the cache allows, read from the blocks and not kept."""
        got = self._matrix(txn, name)
        if got is not None:
            return got
        return self._load(txn, name, self._prefix(name), self._dir(txn, name))

    def preload(self, txn: Txn) -> None:
        """Load the matrix of every space that fits the cache, so :meth:`fetch` of many
        memories in any order reads no block (a dump).

        Raises:
            CorruptFileError: a block is damaged.
        """
        if not txn.write:
            for name in self._refresh(txn):
                self._matrix(txn, name)

    def fetch(self, txn: Txn, docno: int, names: Sequence[str]) -> dict[str, np.ndarray]:
        """The stored vectors of memory ``docno`` in the spaces ``names`` (its record's list):
        read-only float32 arrays, exactly as stored.

        Raises:
            CorruptFileError: a vector the record names is missing, or its block is damaged.
        """
        out = {}
        sid = None if txn.write else snapshot_id(txn, self._last_txnid)
        for name in names:
            cache = self._cache(name)
            live = cache.live
            if live is not None and sid is not None and live[0] == sid:
                i = int(np.searchsorted(live[2], docno))
                if i < live[2].size and int(live[2][i]) == docno:
                    out[name] = _frozen_row(live[3][i])
                    continue
            prefix = self._prefix(name)
            d = _decode_dir(txn.get("vectors", prefix + _DIR))
            if not isinstance(d, _Dir):
                raise CorruptFileError(f"memory #{docno} names a vector in {name!r} that is not stored",
                                       hint="run `engramdb verify --fix FILE`")
            blockno = docno // d.rows
            last = cache.last
            if last is not None and sid is not None and last[0] == sid and last[1] == blockno:
                offs, mat = last[2], last[3]
            else:
                data = txn.get("vectors", prefix + _TAG + _U64BE.pack(blockno))
                if data is None:
                    raise CorruptFileError(f"memory #{docno} names a vector in {name!r} that is not stored",
                                           hint="run `engramdb verify --fix FILE`")
                offs, mat = decode_vector_block(data)
                if sid is not None:
                    cache.last = (sid, blockno, offs, mat)
            i = int(np.searchsorted(offs, docno - blockno * d.rows))
            if i >= offs.size or int(offs[i]) != docno - blockno * d.rows:
                raise CorruptFileError(f"memory #{docno} names a vector in {name!r} that is not stored",
                                       hint="run `engramdb verify --fix FILE`")
            out[name] = _frozen_row(mat[i])
        return out

    def _stream_scores(self, txn: Txn, name: str, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Scores of every row, one block in memory at a time (a matrix over the cache limit).

        Raises:
            CorruptFileError: a block is damaged, or the blocks do not add up to the count.
        """
        prefix = self._prefix(name)
        d = _decode_dir(txn.get("vectors", prefix + _DIR))
        assert isinstance(d, _Dir)
        docnos = np.empty(d.count, np.uint64)
        scores = np.empty(d.count, np.float32)
        # blocks are small (42 rows at 384 dims) and einsum's cost per call is half of such a
        # block's: a few blocks are gathered into a buffer that stays in cache and scored at
        # once (each row is still summed on its own: the same bits)
        buf = np.empty((max(STREAM_ROWS, d.rows), d.dims), np.float32)
        pos = fill = 0
        for docs, mat in self._blocks(txn, name, prefix, d, 0):
            end = pos + docs.size
            if end > d.count:
                break
            docnos[pos:end] = docs
            if fill + docs.size > buf.shape[0]:
                row_dots(buf[:fill], q, out=scores[pos - fill:pos])
                fill = 0
            buf[fill:fill + docs.size] = mat
            fill += docs.size
            pos = end
        else:
            if pos == d.count:
                row_dots(buf[:fill], q, out=scores[pos - fill:pos])
                return docnos, scores
        raise CorruptFileError(f"the vector blocks of space {name!r} disagree with its directory's count "
                               f"({d.count})", hint="run `engramdb verify --fix FILE`")

    def scores(self, txn: Txn, space: str, query: Any) -> tuple[np.ndarray, np.ndarray]:
        """Dot-product scores (cosine for normalised spaces) of every live row.

        Raises:
            EmbeddingError: unknown space, wrong dims or non-finite query.
        """
        sp = self._space(self._refresh(txn), space)
        q = _check_matrix(sp, query)[0]
        got = self._matrix(txn, space)
        if got is None:
            return self._stream_scores(txn, space, q)
        docnos, matrix = got
        return docnos, row_dots(matrix, q)

    def search(self, txn: Txn, space: str, query: Any, k: int) -> list[tuple[int, float]]:
        """Exact top ``k`` (docno, score): score descending, docno ascending.

        Raises:
            EmbeddingError: unknown space, wrong dims or non-finite query.
        """
        docnos, scores = self.scores(txn, space, query)
        docnos, scores = top_k(docnos, scores, k)
        return [(int(d), float(s)) for d, s in zip(docnos, scores)]

    def embed_query(self, txn: Txn, space: str, text: str) -> np.ndarray | None:
        """The query vector of ``text`` in ``space`` (None when no embedder is known).

        Raises:
            EmbeddingError: unknown space, or the embedder returned a bad vector.
        """
        sp = self._space(self._refresh(txn), space)
        emb = self.embedder(sp)
        if emb is None:
            return None
        vec = _embed(sp, emb, [text])
        # one text, one row: (1, dims), or a (dims,) vector. The first row of a longer answer
        # would be another text's vector (spec/vectors.md: (n, dims) for n texts)
        if not (vec.ndim == 1 or (vec.ndim == 2 and vec.shape[0] == 1)):
            raise EmbeddingError(f"the embedder of space {space!r} returned an array of shape {vec.shape} "
                                 "for 1 text (a query)",
                                 hint="an embedder returns a float32 array (n, dims) for n texts: (1, dims) here")
        if not np.any(vec):
            return None
        row: np.ndarray = _check_matrix(sp, vec)[0]
        return row

    def count(self, txn: Txn, space: str) -> int:
        """Live vectors in ``space``.

        Raises:
            EmbeddingError: unknown space.
        """
        self._space(self._refresh(txn), space)
        d = _decode_dir(txn.get("vectors", self._prefix(space) + _DIR))
        if isinstance(d, _Dir):
            return d.count
        got = self._matrix(txn, space)
        return 0 if got is None else int(got[0].size)

    def verify(self, txn: Txn, nodes: Sequence[tuple[int, Any]], texts: Sequence[str]) -> list[str]:
        """Compare the stored rows with the node records: every vector a record names is
        stored and nothing else is, and the ``auto`` rows equal the recomputed vectors (the
        first layout: every row equals its record's vector)."""
        problems = []
        try:
            spaces = self._read_spaces(txn)
            legacy = [(docno, node) for docno, node in nodes
                      if node.embeddings and not any(v is STORED for v in node.embeddings.values())]
            own = {name: sorted(docno for docno, node in nodes if name in node.embeddings) for name in spaces}
            expected = self.vectors_for(txn, legacy, [""] * len(legacy)) if legacy else {}
            auto = self._auto_rows(spaces, nodes, texts)
        except (CorruptFileError, EmbeddingError) as exc:
            return [f"vectors: {exc.message}"]
        for name in sorted(spaces):
            try:
                got = self._load(txn, name, self._prefix(name), _decode_dir(txn.get("vectors", self._prefix(name) + _DIR)))
            except CorruptFileError as exc:
                problems.append(f"vectors: space {name!r}: {exc.message}")
                continue
            docnos, matrix = got
            exp_docs = own[name] + (auto[name][0] if name in auto else [])
            if sorted(exp_docs) != docnos.tolist():
                problems.append(f"vectors: space {name!r} holds {docnos.size} rows, the records name "
                                f"{len(exp_docs)} vectors")
                continue
            checks = [expected.get(name), auto.get(name)]
            for check in checks:
                if check is None:
                    continue
                idx = np.searchsorted(docnos, np.asarray(check[0], dtype=np.uint64))
                if not np.array_equal(matrix[idx], _check_matrix(spaces[name], check[1])):
                    problems.append(f"vectors: space {name!r} holds rows that differ from the vectors they "
                                    "derive from")
                    break
        return problems
