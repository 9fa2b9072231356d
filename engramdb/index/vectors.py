"""Embedding spaces and exact vector search inside the encrypted file (spec/vectors.md).

Layout (values sealed by the store; no space name or id appears in a key):

``meta`` table
    ``b"index.spaces"`` -> msgpack ``{name: {"model", "dims", "dtype", "normalize", "auto"}}``.
``vectors`` table
    ``blind(space) | u32 0``     -> the space's directory: live blocks, tombstones, count.
    ``blind(space) | u32 block`` -> one block: the rows one write batch added.

A block is ``u32 rows | u32 dims | rows x u64 docnos (LE) | rows x dims float32 (LE)``.
Search is exact: the live rows are concatenated into one float32 matrix kept in memory
(refreshed when another process commits), scored with one matrix-vector product, and
the top k taken with ``argpartition``; ties break by docno ascending.
"""
from __future__ import annotations

import math
import struct
import zlib
from collections import Counter
from dataclasses import dataclass
from typing import Any, Protocol
from collections.abc import Callable, Mapping, Sequence

import msgpack
import numpy as np
from numpy.typing import NDArray

from ..errors import CorruptFileError, EmbeddingError, ValidationError
from .bm25 import plan_merge, snapshot_id, top_k
from .tokenize import Tokenizer

__all__ = [
    "DTYPES",
    "HASHED_MODEL",
    "Embedder",
    "EmbeddingSpace",
    "HashedTfidfEmbedder",
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
AUTO_MERGE_MAX_ROWS = 20_000


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
            if len(self._slots) < 1_000_000:
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
        if isinstance(self.dims, bool) or not isinstance(self.dims, int) or not 0 < self.dims <= MAX_DIMS:
            raise EmbeddingError(f"dims must be an integer in 1..{MAX_DIMS}, got {self.dims!r}")
        if self.dtype not in DTYPES:
            raise EmbeddingError(f"unsupported vector dtype {self.dtype!r}", hint="use 'float32'")
        if self.auto and self.model != HASHED_MODEL:
            raise EmbeddingError("auto-embedding needs the built-in model", hint=f"use model={HASHED_MODEL!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "dims": self.dims, "dtype": self.dtype,
                "normalize": self.normalize, "auto": self.auto}


def encode_vector_block(docnos: np.ndarray, matrix: np.ndarray) -> bytes:
    """One block: row count, dims, docnos (u64 LE), then the float32 matrix (LE)."""
    docnos = np.asarray(docnos, dtype="<u8")
    matrix = np.ascontiguousarray(matrix, dtype="<f4")
    return _BLOCK_HEAD.pack(matrix.shape[0], matrix.shape[1]) + docnos.tobytes() + matrix.tobytes()


def decode_vector_block(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`encode_vector_block`.

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


def _check_matrix(space: EmbeddingSpace, vectors: Any) -> np.ndarray:
    """Validate and (if the space says so) normalise a (rows, dims) matrix."""
    try:
        arr = np.asarray(vectors, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise EmbeddingError(f"space {space.name!r}: the vector is not numeric") from exc
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] != space.dims:
        got = arr.shape[-1] if arr.ndim else 0
        raise EmbeddingError(f"space {space.name!r} has {space.dims} dims, got a vector of {got}")
    if not np.all(np.isfinite(arr)):
        raise EmbeddingError(f"space {space.name!r}: the vector contains NaN or infinity")
    if space.normalize:
        norms = np.linalg.norm(arr, axis=1, keepdims=True)
        if np.any(norms == 0):
            raise EmbeddingError(f"space {space.name!r} normalises vectors, and a zero vector cannot be normalised",
                                 hint="skip empty texts or create the space with normalize=False")
        arr = (arr / norms).astype(np.float32)
    return arr


class _VDir:
    """A space's directory: its blocks and tombstones.

    A tombstone ``(docno, before)`` says: rows of ``docno`` in blocks numbered below
    ``before`` are dead. Deleting or updating a memory therefore never reads a block;
    a re-added version lands in a block numbered ``before`` or higher and stays live.
    """

    __slots__ = ("next", "blocks", "dead_docs", "dead_before")

    def __init__(self) -> None:
        self.next = 1
        self.blocks: dict[int, int] = {}  # block number -> rows (including dead ones)
        self.dead_docs = np.zeros(0, np.uint64)  # sorted, distinct
        self.dead_before = np.zeros(0, np.uint32)

    @classmethod
    def decode(cls, data: bytes | None) -> _VDir:
        d = cls()
        if data is None:
            return d
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

    def encode(self) -> bytes:
        return msgpack.packb({
            "next": self.next,
            "blocks": [[b, n] for b, n in sorted(self.blocks.items())],
            "dead_docs": self.dead_docs.astype("<u8").tobytes(),
            "dead_before": self.dead_before.astype("<u4").tobytes(),
        }, use_bin_type=True)

    def kill(self, docnos: Sequence[int]) -> None:
        """Tombstone every current row of ``docnos`` (blocks below ``next``)."""
        if not docnos:
            return
        new = np.asarray(sorted(set(docnos)), dtype=np.uint64)
        keep = ~np.isin(self.dead_docs, new)
        self.dead_docs = np.concatenate([self.dead_docs[keep], new])
        self.dead_before = np.concatenate([self.dead_before[keep], np.full(new.size, self.next, np.uint32)])
        order = np.argsort(self.dead_docs, kind="stable")
        self.dead_docs, self.dead_before = self.dead_docs[order], self.dead_before[order]

    def live_mask(self, blockno: int, docnos: np.ndarray) -> np.ndarray:
        """Which rows of block ``blockno`` are live."""
        if not self.dead_docs.size or not docnos.size:
            return np.ones(docnos.size, dtype=bool)
        pos = np.searchsorted(self.dead_docs, docnos)
        pos[pos == self.dead_docs.size] = 0
        dead = (self.dead_docs[pos] == docnos) & (self.dead_before[pos] > blockno)
        live: NDArray[np.bool_] = ~dead
        return live

    def prune(self) -> None:
        """Drop tombstones that no remaining block can hold a row for."""
        oldest = min(self.blocks, default=self.next)
        keep = self.dead_before > oldest
        self.dead_docs, self.dead_before = self.dead_docs[keep], self.dead_before[keep]

    def key(self) -> _DirKey:
        """What the live matrix depends on."""
        return (tuple(sorted(self.blocks)), self.dead_docs.tobytes(), self.dead_before.tobytes())


# what a space's live matrix depends on: (block numbers, dead docnos, dead-before block numbers)
_DirKey = tuple[tuple[int, ...], bytes, bytes]


class _SpaceCache:
    """Decoded blocks (immutable) and the live matrix with the state it was built from."""

    __slots__ = ("blocks", "live")

    def __init__(self) -> None:
        self.blocks: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        # (snapshot id, directory key, docnos, matrix): replaced as a whole, so a reader on
        # another snapshot never sees a half-updated pair
        self.live: tuple[int, _DirKey, np.ndarray, np.ndarray] | None = None


class VectorIndex:
    """The vector blocks of one open file, with an in-memory matrix per space.

    Args:
        blind: ``store.blind``.
        last_txnid: ``store.last_txnid`` (a change refreshes the matrices).
        tokenizer: the file's tokenizer, for the built-in embedder.
    """

    def __init__(self, blind: Callable[[bytes, bytes], bytes], last_txnid: Callable[[], int],
                 tokenizer: Tokenizer | None = None) -> None:
        self._blind_fn = blind
        self._last_txnid = last_txnid
        self._tokenizer = tokenizer
        self._spaces_state: tuple[int, dict[str, EmbeddingSpace]] | None = None
        self._caches: dict[str, _SpaceCache] = {}
        self._embedders: dict[str, Callable[[list[str]], np.ndarray]] = {}

    # --- spaces -------------------------------------------------------------------------

    def _prefix(self, name: str) -> bytes:
        return self._blind_fn(b"space", name.encode("utf-8", "surrogatepass"))

    @staticmethod
    def _read_spaces(txn: Any) -> dict[str, EmbeddingSpace]:
        data = txn.get("meta", SPACES_KEY)
        if data is None:
            return {}
        try:
            raw = msgpack.unpackb(data, raw=False)
            return {name: EmbeddingSpace(name=name, **cfg) for name, cfg in sorted(raw.items())}
        except (EmbeddingError, TypeError, ValueError, msgpack.UnpackException) as exc:
            raise CorruptFileError("the embedding-space settings in meta are malformed") from exc

    def _refresh(self, txn: Any) -> dict[str, EmbeddingSpace]:
        if txn.write:
            return self._read_spaces(txn)
        txnid = snapshot_id(txn, self._last_txnid)
        state = self._spaces_state
        if state is None or txnid != state[0]:
            state = self._spaces_state = (txnid, self._read_spaces(txn))
        return state[1]

    def spaces(self, txn: Any) -> dict[str, EmbeddingSpace]:
        """The file's embedding spaces by name.

        Raises:
            CorruptFileError: the settings record is damaged.
        """
        return dict(self._refresh(txn))

    def add_space(self, txn: Any, space: EmbeddingSpace) -> None:
        """Record a new embedding space (a write). Re-adding an identical space is a no-op.

        Raises:
            ConfigMismatchError: a space of that name exists with other settings.
        """
        from ..errors import ConfigMismatchError

        spaces = self._read_spaces(txn)
        old = spaces.get(space.name)
        if old is not None:
            if old != space:
                raise ConfigMismatchError(
                    f"embedding space {space.name!r} exists with model {old.model!r}, {old.dims} dims",
                    hint="use another space name, or open with the same model and dims")
            return
        spaces[space.name] = space
        txn.put("meta", SPACES_KEY, msgpack.packb({n: s.to_dict() for n, s in sorted(spaces.items())},
                                                  use_bin_type=True))

    def set_embedder(self, name: str, embedder: Callable[[list[str]], np.ndarray]) -> None:
        """Register the embedder used for queries (and auto vectors) in space ``name``."""
        self._embedders[name] = embedder

    def embedder(self, space: EmbeddingSpace) -> Callable[[list[str]], np.ndarray] | None:
        """The registered embedder of ``space``, or the built-in one for its model."""
        emb = self._embedders.get(space.name)
        if emb is None and space.model == HASHED_MODEL:
            emb = self._embedders[space.name] = HashedTfidfEmbedder(space.dims, self._tokenizer)
        return emb

    def _space(self, spaces: Mapping[str, EmbeddingSpace], name: str) -> EmbeddingSpace:
        space = spaces.get(name)
        if space is None:
            known = ", ".join(sorted(spaces)) or "none"
            raise EmbeddingError(f"unknown embedding space {name!r} (known: {known})",
                                 hint="create it first with Engram.add_space(name, dims=..., model=...)")
        return space

    # --- writes ---------------------------------------------------------------------------

    def vectors_for(self, txn: Any, nodes: Sequence[tuple[int, Any]], texts: Sequence[str]) -> dict[str, tuple[list[int], np.ndarray]]:
        """Validated rows per space for ``nodes`` (their embeddings plus auto vectors).

        Raises:
            EmbeddingError: an unknown space, wrong dims, or non-finite values.
        """
        spaces = self._read_spaces(txn) if txn.write else self._refresh(txn)
        rows: dict[str, tuple[list[int], list[Any]]] = {}
        for (docno, node) in nodes:
            for name, vec in node.embeddings.items():
                space = self._space(spaces, name)
                if len(vec) != space.dims:  # checked per row: a ragged batch cannot be stacked
                    raise EmbeddingError(f"space {name!r} has {space.dims} dims, got a vector of {len(vec)}")
                entry = rows.setdefault(name, ([], []))
                entry[0].append(docno)
                entry[1].append(vec)
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
            mat = np.asarray(emb([texts[i] for i, _ in todo]), dtype=np.float32)
            entry = rows.setdefault(name, ([], []))
            for (_, docno), vec in zip(todo, mat):
                if np.any(vec):  # an empty text has no vector
                    entry[0].append(docno)
                    entry[1].append(vec)
        return {name: (docnos, _check_matrix(spaces[name], np.asarray(vecs, dtype=np.float32)))
                for name, (docnos, vecs) in sorted(rows.items()) if docnos}

    def _block(self, txn: Any, name: str, prefix: bytes, blockno: int) -> tuple[np.ndarray, np.ndarray]:
        cache = self._caches.setdefault(name, _SpaceCache())
        blk = cache.blocks.get(blockno)
        if blk is None:
            data = txn.get("vectors", prefix + _U32.pack(blockno))
            if data is None:
                raise CorruptFileError(f"vector block {blockno} of space {name!r} is missing",
                                       hint="run `engramdb verify --fix FILE`")
            blk = decode_vector_block(data)
            if not txn.write:
                cache.blocks[blockno] = blk
        return blk

    def apply(self, txn: Any, added: Sequence[tuple[int, Any]], texts: Sequence[str],
              removed: Sequence[tuple[int, Any]]) -> None:
        """Tombstone the rows of the ``removed`` (docno, old node) pairs, then add one block
        per space. No block is read: a tombstone marks the docno's rows in the blocks
        written so far.

        Raises:
            EmbeddingError: an added node has a vector for an unknown space, of the wrong
                dims, or with NaN/infinity.
        """
        spaces = self._read_spaces(txn)
        if not spaces:
            for _, node in added:
                if node.embeddings:
                    self._space(spaces, sorted(node.embeddings)[0])
            return
        new_rows = self.vectors_for(txn, added, texts)
        for name in sorted(spaces):
            # an auto space may hold a row for any memory; otherwise only where the old
            # record had a vector in this space
            gone = [docno for docno, old in removed if spaces[name].auto or name in old.embeddings]
            if not gone and name not in new_rows:
                continue
            prefix = self._prefix(name)
            d = _VDir.decode(txn.get("vectors", prefix + _DIR))
            d.kill(gone)
            if name in new_rows:
                docnos, matrix = new_rows[name]
                order = np.argsort(np.asarray(docnos, dtype=np.uint64), kind="stable")
                blockno = d.next
                d.next += 1
                txn.put("vectors", prefix + _U32.pack(blockno),
                        encode_vector_block(np.asarray(docnos, dtype=np.uint64)[order], matrix[order]))
                d.blocks[blockno] = len(docnos)
            self._merge_steps(txn, name, prefix, d, 1, AUTO_MERGE_MAX_ROWS)
            txn.put("vectors", prefix + _DIR, d.encode())

    def _merge_steps(self, txn: Any, name: str, prefix: bytes, d: _VDir, max_steps: int, max_rows: int | None,
                     *, everything: bool = False) -> int:
        done = 0
        while done < max_steps:
            rows = sum(d.blocks.values())
            plan = sorted(d.blocks) if everything else plan_merge({b: [n, 0] for b, n in d.blocks.items()}, {})
            if plan is None and d.dead_docs.size * 2 > rows and len(d.blocks) > 0:
                plan = sorted(d.blocks)  # mostly tombstones: rewrite everything
            if not plan or (max_rows is not None and sum(d.blocks[b] for b in plan) > max_rows):
                break  # nothing to merge (a forced merge of a space with no blocks left included)
            docs, mats = [], []
            for blockno in plan:
                docnos, matrix = self._block(txn, name, prefix, blockno)
                keep = d.live_mask(blockno, docnos)
                docs.append(docnos[keep])
                mats.append(matrix[keep])
                txn.delete("vectors", prefix + _U32.pack(blockno))
                del d.blocks[blockno]
            docnos = np.concatenate(docs)
            if docnos.size:
                matrix = np.concatenate(mats)
                order = np.argsort(docnos, kind="stable")
                blockno = d.next
                d.next += 1
                txn.put("vectors", prefix + _U32.pack(blockno), encode_vector_block(docnos[order], matrix[order]))
                d.blocks[blockno] = int(docnos.size)
            d.prune()
            done += 1
        return done

    def layout(self, txn: Any) -> dict[str, dict[str, int]]:
        """Per space, the vector blocks as stored: how many, their rows, the dead ones among them.

        Raises:
            CorruptFileError: a directory is damaged.
        """
        out = {}
        for name in sorted(self._read_spaces(txn)):
            d = _VDir.decode(txn.get("vectors", self._prefix(name) + _DIR))
            out[name] = {"blocks": len(d.blocks), "rows": sum(d.blocks.values()), "dead_rows": int(d.dead_docs.size)}
        return out

    def merge(self, txn: Any, max_steps: int = 1, *, force: bool = False) -> int:
        """Run up to ``max_steps`` merge steps per space; returns how many ran.

        With ``force=True`` a space with tombstones or several blocks is then rewritten
        into one block of live rows (so a forgotten memory's vector leaves the file at the
        next compaction).
        """
        done = 0
        for name in sorted(self._read_spaces(txn)):
            prefix = self._prefix(name)
            d = _VDir.decode(txn.get("vectors", prefix + _DIR))
            steps = self._merge_steps(txn, name, prefix, d, max_steps, None)
            if force and steps < max_steps and (len(d.blocks) > 1 or d.dead_docs.size):
                steps += self._merge_steps(txn, name, prefix, d, 1, None, everything=True)
            if steps:
                txn.put("vectors", prefix + _DIR, d.encode())
            done += steps
        return done

    def rebuild(self, txn: Any, nodes: Sequence[tuple[int, Any]], texts: Sequence[str]) -> None:
        """Drop every vector block and re-add the vectors of ``nodes``.

        Raises:
            EmbeddingError: a node holds a vector that does not fit its space.
        """
        spaces = self._read_spaces(txn)
        nexts = {}
        for name in spaces:
            try:
                nexts[name] = _VDir.decode(txn.get("vectors", self._prefix(name) + _DIR)).next
            except CorruptFileError:
                nexts[name] = 1
        for key in list(txn.keys("vectors")):
            txn.delete("vectors", key)
        for name in spaces:
            d = _VDir()
            d.next = nexts[name] + 1  # never reuse a block number another handle may have cached
            txn.put("vectors", self._prefix(name) + _DIR, d.encode())
        for cache in self._caches.values():
            cache.blocks.clear()
        self.apply(txn, nodes, texts, [])

    # --- search -------------------------------------------------------------------------------

    def _matrix(self, txn: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(docnos, matrix) of the live rows of space ``name``.

        Kept in memory between queries; rebuilt only when the space's blocks or tombstones
        changed (a commit elsewhere that touches no vector keeps the matrix).
        """
        cache = self._caches.setdefault(name, _SpaceCache())
        sid = None if txn.write else snapshot_id(txn, self._last_txnid)
        live = cache.live
        if live is not None and sid is not None and live[0] == sid:
            return live[2], live[3]
        prefix = self._prefix(name)
        d = _VDir.decode(txn.get("vectors", prefix + _DIR))
        key = d.key()
        if live is not None and sid is not None and live[1] == key:
            cache.live = (sid, key, live[2], live[3])
            return live[2], live[3]
        for blockno in [b for b in list(cache.blocks) if b not in d.blocks]:
            cache.blocks.pop(blockno, None)
        docs, mats = [], []
        for blockno in sorted(d.blocks):
            docnos, matrix = self._block(txn, name, prefix, blockno)
            keep = d.live_mask(blockno, docnos)
            if not keep.all():
                docnos, matrix = docnos[keep], matrix[keep]
            docs.append(docnos)
            mats.append(matrix)
        space = self._read_spaces(txn).get(name) if not mats else None
        docnos = np.concatenate(docs) if docs else np.zeros(0, np.uint64)
        matrix = np.ascontiguousarray(np.concatenate(mats)) if mats else \
            np.zeros((0, space.dims if space else 0), np.float32)
        if sid is not None:
            cache.live = (sid, key, docnos, matrix)
        return docnos, matrix

    def scores(self, txn: Any, space: str, query: Any) -> tuple[np.ndarray, np.ndarray]:
        """Dot-product scores (cosine for normalised spaces) of every live row.

        Raises:
            EmbeddingError: unknown space, wrong dims or non-finite query.
        """
        sp = self._space(self._refresh(txn), space)
        q = _check_matrix(sp, query)[0]
        docnos, matrix = self._matrix(txn, space)
        return docnos, matrix @ q

    def search(self, txn: Any, space: str, query: Any, k: int) -> list[tuple[int, float]]:
        """Exact top ``k`` (docno, score): score descending, docno ascending.

        Raises:
            EmbeddingError: unknown space, wrong dims or non-finite query.
        """
        docnos, scores = self.scores(txn, space, query)
        docnos, scores = top_k(docnos, scores, k)
        return [(int(d), float(s)) for d, s in zip(docnos, scores)]

    def embed_query(self, txn: Any, space: str, text: str) -> np.ndarray | None:
        """The query vector of ``text`` in ``space`` (None when no embedder is known).

        Raises:
            EmbeddingError: unknown space, or the embedder returned a bad vector.
        """
        sp = self._space(self._refresh(txn), space)
        emb = self.embedder(sp)
        if emb is None:
            return None
        vec = np.asarray(emb([text]), dtype=np.float32)
        if not np.any(vec):
            return None
        row: np.ndarray = _check_matrix(sp, vec)[0]
        return row

    def count(self, txn: Any, space: str) -> int:
        """Live vectors in ``space``.

        Raises:
            EmbeddingError: unknown space.
        """
        self._space(self._refresh(txn), space)
        return int(self._matrix(txn, space)[0].size)

    def verify(self, txn: Any, nodes: Sequence[tuple[int, Any]], texts: Sequence[str]) -> list[str]:
        """Compare the stored rows with the node records (and auto vectors)."""
        problems = []
        try:
            spaces = self._read_spaces(txn)
            expected = self.vectors_for(txn, nodes, texts)
        except (CorruptFileError, EmbeddingError) as exc:
            return [f"vectors: {exc.message}"]
        for name in sorted(spaces):
            try:
                docnos, matrix = self._matrix(txn, name)
            except CorruptFileError as exc:
                problems.append(f"vectors: space {name!r}: {exc.message}")
                continue
            exp_docs, exp_mat = expected.get(name, ([], np.zeros((0, spaces[name].dims), np.float32)))
            exp_order = np.argsort(np.asarray(exp_docs, dtype=np.uint64), kind="stable")
            order = np.argsort(docnos, kind="stable")
            if not (np.array_equal(np.asarray(exp_docs, dtype=np.uint64)[exp_order], docnos[order])
                    and np.array_equal(exp_mat[exp_order], matrix[order])):
                problems.append(f"vectors: space {name!r} holds {docnos.size} rows that differ from the "
                                f"{len(exp_docs)} vectors in the records")
        return problems
