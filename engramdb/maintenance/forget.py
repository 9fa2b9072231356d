"""Forget: remove memories so that nothing of them is left in the file.

``delete`` removes a memory from every table, but LMDB keeps the freed pages (and the
ciphertext, or plaintext, they hold) until they are reused, and the index keeps the
memory's postings and vector rows in its segments as tombstoned entries until a merge
rewrites them. :func:`forget` does the whole job, in this order:

1. choose the memories: by id, and/or every memory whose vector is at least
   ``threshold`` similar (cosine, in a normalised space) to a query text or embedding;
   for a query text, an archived memory is also compared by its archived original,
   embedded again in each space that embeds the query (its stub's vector is only its
   preview's, so a subject past the preview would not choose it);
2. in one write transaction, delete them (records, id map, archive rows, postings,
   vectors, every edge touching them) and the sealed source passages (``sources``) that
   no remaining memory uses;
3. compact the file: the BM25 segments that still hold them are rewritten without them
   (vector blocks never hold them) and a copy without free pages replaces the file.

The maintenance pass's incremental state drops their rows too, and a pass left unfinished
(killed) is finished first, since its stored plan may name them.

The receipt names the memories, the entries removed per table, and the summaries built
from them (memories with a ``derived_from`` edge to one of them), which are kept: forget
those too if their text must go.

The functions take an open ``Engram`` (duck-typed; this package never imports the facade).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from .. import codec
from . import run
from .archive import has_original, iter_originals
from ..errors import AlreadyOpenError, EmbeddingError, EngramError, NotFoundError, ValidationError
from ..index import node_text
from ..index.tokenize import negations
from ..index.vectors import HASHED_MODEL, EmbeddingSpace, row_dots, unit_rows
from ..records import as_float32
from ..store import Txn

__all__ = ["INDEX_TABLES", "RECORD_TABLES", "ForgetReceipt", "forget"]

# Tables whose removed entries are counted exactly; the index tables' counts also shrink
# from the merge that rewrites their segments.
RECORD_TABLES = ("nodes", "ids", "archive", "edges", "sources")
INDEX_TABLES = ("postings", "segments", "vectors")
ORIGINALS_BATCH = 256  # archived originals embedded per call of a space's embedder


@dataclass(frozen=True)
class ForgetReceipt:
    """What :meth:`engramdb.Engram.forget` removed (or, with ``dry_run``, would remove).

    Attributes:
        ids: the forgotten memories, in insertion order.
        removed: entries removed per table. ``nodes``, ``ids``, ``archive``, ``edges`` (two
            keys per edge: forward and reverse) and ``sources`` count exactly what belonged
            to the forgotten memories; ``postings``, ``segments`` and ``vectors`` are how
            many fewer entries those tables hold after the merge (absent on a dry run).
        summaries: ids of kept memories built from forgotten ones (``derived_from`` edges).
        dry_run: nothing was written.
        size_before, size_after: the file's size in bytes around the forget (equal on a dry run).
    """

    ids: tuple[str, ...]
    removed: dict[str, int] = field(default_factory=dict)
    summaries: tuple[str, ...] = ()
    dry_run: bool = False
    size_before: int = 0
    size_after: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python form, for JSON output."""
        return {"ids": list(self.ids), "removed": dict(self.removed), "summaries": list(self.summaries),
                "dry_run": self.dry_run, "size_before": self.size_before, "size_after": self.size_after}


def _check_threshold(threshold: Any) -> float:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not -1.0 <= threshold <= 1.0:
        raise ValidationError(f"threshold must be a number between -1 and 1, got {threshold!r}",
                              hint="the default, 0.7, is Trace Lite's")
    return float(threshold)


def _query_vector(embedding: ArrayLike) -> np.ndarray:
    """``embedding`` as one float32 vector: 1-D, or one row (what an embedder returns for one text).

    Raises:
        EmbeddingError: not finite numbers, or not one vector (a batch of rows is not flattened into one).
    """
    vec = as_float32(embedding, "embedding", copy=False)
    if vec.ndim == 2 and vec.shape[0] == 1:
        vec = vec[0]
    if vec.ndim != 1 or vec.size == 0:
        raise EmbeddingError(f"embedding must be one non-empty vector, got an array of shape {vec.shape}",
                              hint="forget by one query vector per call")
    if not np.isfinite(vec).all():
        raise EmbeddingError("embedding contains NaN or infinity", hint="pass a vector of finite numbers")
    return vec


def _cosines(vectors: Any, txn: Txn, name: str, vec: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(docnos, cosine of each stored row with ``vec``) in a space that keeps its vectors as
    given: its search scores are dot products, which a cosine threshold does not bound (a
    row of norm 10 scores 10). A zero row scores 0, as in Trace Lite.

    Raises:
        EmbeddingError: ``vec`` is the zero vector (no direction to compare).
    """
    q, zero = unit_rows(np.asarray(vec, dtype=np.float32).reshape(1, -1))
    if zero[0]:
        raise EmbeddingError("a zero vector has no direction to compare")
    docnos, matrix = vectors.live_rows(txn, name)
    rows, _ = unit_rows(np.asarray(matrix, dtype=np.float32))
    # each row on its own, as recall scores: BLAS (`@`) moved a score by an ulp with the
    # number of rows, so equal copies fell on both sides of a threshold equal to their score
    return docnos, row_dots(rows, q[0])


def _original_scores(embedder: Any, space: EmbeddingSpace, texts: list[str],
                     q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cosine of each text's vector (``embedder``'s, normalised) with the unit query ``q``,
    and which texts have a zero vector (no direction: not compared, as an ``auto`` space
    stores no vector for such a text).

    Raises:
        EmbeddingError: the embedder did not return a finite (len(texts), dims) matrix.
    """
    try:
        mat = np.asarray(embedder(texts), dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise EmbeddingError(f"the embedder of space {space.name!r} did not return numbers ({exc})",
                             hint="an embedder returns a float32 array (n, dims) for n texts") from None
    if mat.shape != (len(texts), space.dims) or not np.isfinite(mat).all():
        raise EmbeddingError(f"the embedder of space {space.name!r} did not return {len(texts)} finite vectors "
                             f"of {space.dims} dims (got an array of shape {mat.shape})",
                             hint="an embedder returns a float32 array (n, dims) for n texts")
    rows, zero = unit_rows(mat)
    return row_dots(rows, q), zero  # each text on its own, whatever the batch (see _cosines)


def _by_originals(engram: Any, txn: Txn, queries: dict[str, np.ndarray], threshold: float,
                  negated: tuple[str, ...]) -> set[int]:
    """Docnos whose archived original (own row or group member), embedded as its space
    embeds text, is at least ``threshold`` similar to the query vector of that space
    (``queries``: space name -> the query text's vector). The stub's vector is only its
    preview's, so the original is what tells whether the memory is about the query.
    Normalised like the stored rows: a cosine, whether or not the space normalises. In the
    built-in space an original must also have the query's negation words (``negated``)."""
    vectors = engram.indexes.vectors
    spaces = vectors.spaces(txn)
    plans = []
    for name, vec in sorted(queries.items()):
        embedder = vectors.embedder(spaces[name])
        if embedder is not None:
            sp = spaces[name]  # the query as the stored rows meet it: as is when normalised, else as in _cosines
            q = vec if sp.normalize else unit_rows(np.asarray(vec, dtype=np.float32).reshape(1, -1))[0][0]
            plans.append((name, sp, embedder, q, sp.model == HASHED_MODEL))
    found: set[int] = set()
    if not plans:
        return found
    batch: list[tuple[int, str]] = []

    def flush() -> None:
        docnos = np.fromiter((d for d, _ in batch), dtype=np.uint64, count=len(batch))
        texts = [t for _, t in batch]
        for name, space, embedder, q, hashed in plans:
            try:
                scores, zero = _original_scores(embedder, space, texts, q)
            except EmbeddingError as exc:
                raise ValidationError(f"the archived originals cannot be compared in space {name!r}: {exc.message}",
                                      hint=exc.hint or "fix the space's embedder, or forget by id") from None
            hit = ~zero & (scores >= threshold)
            if hashed:
                hit &= np.fromiter((negations(t) == negated for t in texts), bool, len(texts))
            found.update(int(d) for d in docnos[hit])
        batch.clear()

    for docno, text in iter_originals(txn):
        batch.append((docno, text))
        if len(batch) >= ORIGINALS_BATCH:
            flush()
    if batch:
        flush()
    return found


def _by_similarity(engram: Any, txn: Txn, query: str | None, embedding: ArrayLike | None, threshold: float,
                   space: str | None) -> set[int]:
    """Docnos whose vector in some space is at least ``threshold`` similar to the query, and
    (for a query text) those whose archived original is (:func:`_by_originals`)."""
    vectors = engram.indexes.vectors
    spaces = vectors.spaces(txn)
    names = sorted(spaces) if space is None else [space]
    if space is not None and space not in spaces:
        raise ValidationError(f"no embedding space {space!r} in this file",
                              hint=f"spaces: {', '.join(sorted(spaces)) or 'none'}")
    found: set[int] = set()
    text_queries: dict[str, np.ndarray] = {}
    negated = negations(query) if query is not None else ()
    used = 0
    for name in names:
        queries: list[tuple[np.ndarray, bool]] = []  # (vector, compare negation words)
        if query is not None:
            vec = vectors.embed_query(txn, name, query)
            if vec is not None:
                queries.append((vec, spaces[name].model == HASHED_MODEL))
                text_queries[name] = vec
        if embedding is not None:
            vec = _query_vector(embedding)
            if vec.shape[0] == spaces[name].dims:
                if spaces[name].normalize:
                    vec = unit_rows(vec[None, :])[0][0]
                queries.append((vec, False))
        for vec, hashed in queries:
            try:
                if spaces[name].normalize:
                    docnos, scores = vectors.scores(txn, name, vec)
                else:
                    docnos, scores = _cosines(vectors, txn, name, vec)
            except EmbeddingError as exc:
                raise ValidationError(f"the query does not fit space {name!r}: {exc.message}") from None
            used += 1
            hits = (int(d) for d in docnos[scores >= threshold])
            if hashed:  # its vectors drop stop words: "... will come" and "... will not come" score 1
                hits = (d for d in hits if negations(node_text(codec.decode_node(
                    txn.get_present("nodes", codec.u64(d))))) == negated)
            found.update(hits)
    if not used:
        what = "query text" if embedding is None else "embedding"
        raise ValidationError(f"no embedding space of this file can compare the {what}",
                              hint="forget by id (recall finds them), give an embedding of a space's dims, or "
                                   "add the built-in space that embeds text: db.add_space('hashed-tfidf-v1', dims=256) "
                                   "(the first `engramdb maintain FILE` pass adds it too)")
    found |= _by_originals(engram, txn, text_queries, threshold, negated)
    return found


def _select(engram: Any, txn: Txn, ids: Sequence[str] | None, query: str | None, embedding: ArrayLike | None,
            threshold: float, space: str | None) -> list[int]:
    chosen: set[int] = set()
    for id_ in ids or ():
        raw = txn.get("ids", engram._id_key(id_))
        if raw is None:
            raise NotFoundError(f"no memory with id {id_!r}", hint="nothing was forgotten; check the ids")
        chosen.add(codec.from_u64(raw))
    if query is not None or embedding is not None:
        chosen |= _by_similarity(engram, txn, query, embedding, threshold, space)
    return sorted(chosen)


def _edge_keys(engram: Any, txn: Txn, docnos: Iterable[int]) -> set[tuple[int, int, str]]:
    graph = engram.indexes.graph
    edges: set[tuple[int, int, str]] = set()
    for docno in docnos:
        edges.update((docno, dst, edge.kind) for dst, edge, _ in graph.outgoing(txn, docno))
        edges.update((src, docno, kind) for src, kind in graph.incoming(txn, docno))
    return edges


def _plan(engram: Any, txn: Txn, docnos: list[int]) -> tuple[list[str], dict[str, int], list[str], list[bytes]]:
    """(ids, exact counts of the record tables, summary ids, source keys to drop)."""
    doomed = set(docnos)
    nodes = {docno: codec.decode_node(txn.get_present("nodes", codec.u64(docno))) for docno in docnos}
    graph = engram.indexes.graph
    summaries: set[int] = set()
    for docno in docnos:
        summaries.update(src for src, kind in graph.incoming(txn, docno)
                         if kind == "derived_from" and src not in doomed)
    summary_ids = sorted(codec.decode_node(txn.get_present("nodes", codec.u64(d))).id for d in summaries)
    wanted = {node.source for node in nodes.values() if node.source}
    still_used: set[str] = set()
    if wanted:
        for key, value in txn.items("nodes"):
            if codec.from_u64(key) not in doomed:
                source = codec.decode_node(value).source
                if source in wanted:
                    still_used.add(source)
    blind = engram._store.blind
    source_keys = [key for key in (blind(b"source", name.encode("utf-8", "surrogatepass"))
                                   for name in sorted(wanted - still_used)) if txn.get("sources", key) is not None]
    counts = {
        "nodes": len(docnos), "ids": len(docnos),
        "archive": sum(has_original(txn, d) for d in docnos),
        "edges": 2 * len(_edge_keys(engram, txn, docnos)),
        "sources": len(source_keys),
    }
    return [nodes[d].id for d in docnos], counts, summary_ids, source_keys


def _scrub_maintenance_state(txn: Txn, docnos: Sequence[int]) -> None:
    """Drop the forgotten memories from the maintenance pass's incremental state (their rows:
    tier, times, importance) and from its change log, as the next pass would have. The
    state then describes the remaining memories exactly as before."""
    raw = txn.get("meta", run.STATE_KEY)
    if raw is not None:
        state = codec.unpack(raw)
        if isinstance(state, dict) and "rows" in state:
            rows = run._unpack_rows(state["rows"])
            keep = ~np.isin(rows["docno"], np.asarray(docnos, dtype=np.uint64))
            if not keep.all():
                state["rows"] = run._pack_rows(run._take(rows, keep))
                txn.put("meta", run.STATE_KEY, codec.pack(state))
    for docno in docnos:
        txn.delete("meta", run.DIRTY_PREFIX + codec.u64(docno))


def forget(engram: Any, *, ids: Sequence[str] | None = None, query: str | None = None,
           embedding: ArrayLike | None = None,
           threshold: float = 0.7, dry_run: bool = False, space: str | None = None) -> ForgetReceipt:
    """Remove memories and everything derived from them from ``engram``'s file, then merge
    the index and compact the file, so that no page holds their text or ciphertext.

    Args:
        ids: memories to forget by id (each must exist).
        query: also forget every memory whose vector, in a space that can embed this text
            (e.g. the built-in hashed TF-IDF space), scores at least ``threshold``. An
            archived memory is chosen when its stub's vector or its archived original
            (embedded by the same space's embedder) reaches the threshold.
        embedding: likewise for a query vector, in every space of its dimension; an
            archived memory only by its stub's vector (a vector cannot embed its
            original: forget it by id, or by a query text, to be sure its text goes).
        threshold: the similarity (cosine in a normalised space) at or above which a
            memory is forgotten.
        dry_run: only report what would be forgotten.
        space: compare ``query``/``embedding`` in this space only.

    Raises:
        ValidationError: nothing to choose by, an empty query, a bad threshold, or no space can
            compare the query.
        NotFoundError: an id is missing (nothing is forgotten).
        AlreadyOpenError: the memories were removed but another handle keeps the file from
            being compacted (run ``engramdb compact FILE`` once it is closed).
        StorageFullError: no disk space; when its message says the memories were removed,
            only the compaction failed (run ``engramdb compact FILE`` once there is space).
    """
    if ids is None and query is None and embedding is None:
        raise ValidationError("forget needs ids, a query or an embedding",
                              hint="e.g. db.forget(ids=[...]) or db.forget(query='...', threshold=0.8)")
    if isinstance(ids, str):
        raise ValidationError("ids must be a list of ids, not a string", hint=f"write ids=[{ids!r}]")
    if query is not None and not isinstance(query, str):
        raise ValidationError("query must be a string")
    if query is not None and not query.strip():  # it said no space "can compare the query text": misleading
        raise ValidationError("the query is empty",
                              hint="give the text whose similar memories to forget, e.g. query='my old address', "
                                   "or choose them by ids")
    if not isinstance(dry_run, (bool, np.bool_)):  # a truthy "no" or 0.0 must not decide whether data goes
        raise ValidationError(f"dry_run must be True or False, got {dry_run!r}",
                              hint="pass dry_run=True to only report what would be forgotten, dry_run=False to forget")
    dry_run = bool(dry_run)  # numpy.bool_ as a bool (the receipt's field)
    threshold = _check_threshold(threshold)
    store = engram._store
    size_before = store.env_info()["file_size"]
    with store.read() as txn:
        docnos = _select(engram, txn, list(ids) if ids is not None else None, query, embedding, threshold, space)
        forgotten, counts, summaries, source_keys = _plan(engram, txn, docnos)
    if dry_run or not docnos:
        return ForgetReceipt(ids=tuple(forgotten), removed=counts if docnos else {}, summaries=tuple(summaries),
                             dry_run=dry_run, size_before=size_before, size_after=size_before)

    store.outside_transaction("forget()")  # it commits the removal, then compacts
    with store.read() as txn:
        pending = txn.get("meta", run.PLAN_KEY) is not None
    if pending:  # a killed maintenance pass's plan may hold their ids or summaries: finish it first
        engram.maintain()

    def remove(txn: Txn) -> dict[str, int]:
        before = {table: txn.count(table) for table in INDEX_TABLES}
        with engram._batched(txn) as tx:
            for id_ in forgotten:
                tx.delete(id_)
        for key in source_keys:
            txn.delete("sources", key)
        _scrub_maintenance_state(txn, docnos)
        return before

    index_before = store.write(remove)
    try:
        engram.compact()  # purges them from every segment that still holds them, then copies
    except AlreadyOpenError as exc:
        raise AlreadyOpenError(f"the memories were removed, but the file could not be compacted: {exc.message}",
                               hint="their old pages stay in the file until `engramdb compact FILE` runs with "
                                    "no other handle open") from None
    except EngramError as exc:  # e.g. a full disk: the removal is committed, a retry would find no such ids
        raise type(exc)(f"the memories were removed, but the file could not be compacted: {exc.message}",
                        hint=f"their old pages stay in the file until `engramdb compact FILE` succeeds "
                             f"({exc.hint})" if exc.hint else "their old pages stay in the file until "
                             "`engramdb compact FILE` succeeds") from None
    with store.read() as txn:
        removed = dict(counts)
        removed.update({table: max(0, index_before[table] - txn.count(table)) for table in INDEX_TABLES})
    return ForgetReceipt(ids=tuple(forgotten), removed=removed, summaries=tuple(summaries), dry_run=False,
                         size_before=size_before, size_after=store.env_info()["file_size"])
