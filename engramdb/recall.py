"""The query pipeline: expand -> BM25 and vectors (each spread one hop) -> RRF -> boosts -> top k.

Every step is deterministic: query terms are scored in sorted order, rankings break ties
by docno, and nothing iterates a set or dict in hash order, so the same file and query
give the same hits in every process (whatever ``PYTHONHASHSEED``). The read path takes no
write lock; only ``touch=True`` writes (one batched transaction after the read).

Scoring (spec/bm25.md, "Recall"):

* each retriever (BM25; one per embedding space that can embed the query) ranks its
  candidates by its score plus ``HOP_WEIGHT`` times the score one step of personalised
  PageRank moves to them over edges and tunnels from the other candidates, so the
  neighbours of strong matches rise (and join the list);
* ``rrf``: reciprocal rank fusion ``sum 1 / (RRF_K + rank)`` over those rankings;
* multiplied by the tier boost, by ``SUPERSEDED_PENALTY`` when another memory
  supersedes this one, and by ``1 + DATE_WEIGHT * proximity`` when the query names a
  year or month near the memory's ``resolved_date``.

The hop runs inside each retriever, before fusion, because RRF flattens scores: spread
over ranks it lets weak neighbours overtake strong matches (on LoCoMo, R@10 0.48 against
0.66 when spread over raw BM25 scores; see spec/bm25.md).
"""
from __future__ import annotations

import bisect
import datetime as _dt
import math
import re
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .codec import decode_node, encode_node
from .errors import ValidationError
from .index import Indexes
from .index.bm25 import lucene_idf
from .index.bm25 import top_k as _top_k
from .index.graph import one_hop
from .index.synonyms import Expander, QueryDate, parse_date, query_dates
from .records import ALL_FLAGS, TIERS, Node, now_ts

__all__ = [
    "Hit",
    "Context",
    "Passage",
    "recall",
    "recall_context",
    "count_tokens",
]

_ARGS_HINT = "see help(engramdb.Engram.recall) for the arguments and their types"
RRF_K = 60
# Tier only breaks near-ties: with RRF_K = 60 two adjacent ranks at the top differ by
# about 1.6 %, so a factor below that never lets a colder tier lose a whole rank to a
# hotter memory that matched worse (a 0.97 warm factor used to; tests/test_recall.py).
TIER_BOOST = {"hot": 1.0, "warm": 0.995, "cold": 0.99, "archive": 0.98}
SUPERSEDED_PENALTY = 0.5
DATE_WEIGHT = 0.25
HOP_WEIGHT = 0.6
MIN_VECTOR_SCORE = 1e-5
# How many ranked candidates each retriever hands to fusion, relative to top_k.
CANDIDATES_PER_K = 8
MIN_CANDIDATES = 50
_U64 = struct.Struct(">Q")
_WORD = re.compile(r"\w+|[^\w\s]")
# The calibration of relevance (spec/recall.md, "Relevance"; tools/bench/calibrate_relevance.py).
RARE_TERMS = 2.0
VECTOR_FLOOR = 0.3
VECTOR_POWER = 1.5


def relevance_of(features: dict[str, float]) -> float:
    """A hit's relevance from its raw match features (spec/recall.md, "Relevance")."""
    cov = features.get("coverage:bm25", 0.0)
    best = 0.0
    if cov > 0:
        covered = cov * features["bm25_ceiling"] / features["bm25_rare_idf"]  # in rare-term units
        best = cov * min(1.0, covered / RARE_TERMS)
    for key, value in features.items():
        if key.startswith("match:vector:"):
            best = max(best, (max(0.0, value - VECTOR_FLOOR) / (1.0 - VECTOR_FLOOR)) ** VECTOR_POWER)
    return min(1.0, max(0.0, best))


@dataclass(frozen=True)
class Hit:
    """One recalled memory.

    Attributes:
        id: the memory's id.
        score: the final score (higher is better). A fused rank value: it orders the hits
            of one query and means nothing across queries.
        node: the memory.
        docno: its internal document number (the tie-break key).
        parts: with ``explain=True``, the score's parts: ``bm25`` (raw BM25, 0 for a memory
            reached only by the hop), ``hop:bm25`` (the score the hop added), ``bm25_rank``,
            ``vector:<space>`` / ``hop:vector:<space>`` / ``vector_rank:<space>``, ``rrf``,
            ``tier``, ``superseded``, ``date``, and the inputs of ``relevance``:
            ``bm25_ceiling`` (the query's highest attainable BM25) and ``match:<retriever>``.
        relevance: how well the memory matches the query, in [0, 1], comparable across
            queries and stores (spec/recall.md, "Relevance"): use it for cut-offs. It
            ignores the ranking boosts (tier, date, superseded).
    """

    id: str
    score: float
    node: Node
    docno: int
    parts: dict[str, float] | None = None
    relevance: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the node without its embeddings)."""
        node = self.node.to_dict()
        node.pop("embeddings", None)
        out: dict[str, Any] = {"id": self.id, "score": self.score, "relevance": self.relevance, "node": node}
        if self.parts is not None:
            out["parts"] = dict(self.parts)
        return out


@dataclass(frozen=True)
class Passage:
    """A source span admitted into a context, with the hits it came from."""

    source: str
    start: int | None
    end: int | None
    text: str
    ids: tuple[str, ...]
    tokens: int


@dataclass(frozen=True)
class Context:
    """What :func:`recall_context` returns: passages in document order, within the budget."""

    passages: tuple[Passage, ...] = ()
    tokens: int = 0
    hits: tuple[Hit, ...] = field(default=())

    @property
    def text(self) -> str:
        """The passages joined by blank lines."""
        return "\n\n".join(p.text for p in self.passages)


def count_tokens(text: str) -> int:
    """The default token counter: words and punctuation marks (close to LLM token counts
    for English prose, and never below them by much)."""
    return len(_WORD.findall(text))


def _ts(value: Any, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        return value.timestamp()
    if isinstance(value, _dt.date):
        return _dt.datetime(value.year, value.month, value.day, tzinfo=_dt.timezone.utc).timestamp()
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        partial = {4: "%Y", 7: "%Y-%m"}.get(len(text))
        try:
            parsed = _dt.datetime.strptime(text, partial) if partial else _dt.datetime.fromisoformat(text)
        except ValueError:
            pass
        else:
            return _ts(parsed, name)
    raise ValidationError(f"{name} must be a timestamp, a date, a datetime or an ISO date string, got {value!r}",
                          hint="e.g. after='2023-05-01', after=datetime.date(2023, 5, 1) or a Unix timestamp")


def _str_set(value: Any, name: str, allowed: Sequence[str] | None = None) -> tuple[str, ...] | None:
    if value is None:
        return None
    items = (value,) if isinstance(value, str) else tuple(value)
    for item in items:
        if not isinstance(item, str):
            raise ValidationError(f"{name} must be strings", hint=_ARGS_HINT)
        if allowed is not None and item not in allowed:
            raise ValidationError(f"unknown {name[:-1]} {item!r}; expected one of {', '.join(allowed)}", hint=_ARGS_HINT)
    return tuple(sorted(set(items)))


class _Filter:
    def __init__(self, after, before, tiers, tags, flags) -> None:
        self.after = _ts(after, "after")
        self.before = _ts(before, "before")
        self.tiers = _str_set(tiers, "tiers", TIERS)
        self.tags = _str_set(tags, "tags")
        self.flags = _str_set(flags, "flags", ALL_FLAGS)

    def __call__(self, node: Node) -> bool:
        if self.after is not None and node.created_at < self.after:
            return False
        if self.before is not None and node.created_at >= self.before:
            return False
        if self.tiers is not None and node.tier not in self.tiers:
            return False
        if self.tags is not None and not set(self.tags) & set(node.tags):
            return False
        if self.flags is not None and not set(self.flags) & set(node.flags):
            return False
        return True


def _expander(indexes: Indexes) -> Expander:
    exp = getattr(indexes, "_recall_expander", None)
    if exp is None or exp.tokenizer is not indexes.tokenizer:
        exp = Expander(indexes.tokenizer)
        indexes._recall_expander = exp
    return exp


def _date_bonus(node: Node, dates: Sequence[QueryDate]) -> float:
    nd = parse_date(node.resolved_date)
    if nd is None or not dates:
        return 0.0
    return max(q.proximity(nd) for q in dates)


def recall(store: Any, indexes: Indexes, query: str, *, top_k: int = 5, hops: bool = True,
           expand_query: bool = True, after: Any = None, before: Any = None, tiers: Any = None,
           tags: Any = None, flags: Any = None, min_relevance: float = 0.0, explain: bool = False,
           touch: bool = False, now: float | None = None) -> list[Hit]:
    """The memories that best answer ``query``.

    Args:
        store: the open :class:`~engramdb.store.Store`.
        indexes: its :class:`~engramdb.index.Indexes`.
        query: free text.
        top_k: how many hits to return.
        hops: spread each retriever's scores one edge/tunnel hop (personalised PageRank's
            first step), so memories linked to strong matches rise and join the results.
        expand_query: add synonyms of the query words (weight 0.4) and date proximity.
        after, before: keep memories created at/after ``after`` and before ``before``
            (timestamps, dates or datetimes).
        tiers, tags, flags: keep memories in one of these tiers / with one of these tags /
            one of these flags.
        min_relevance: keep only hits whose :attr:`Hit.relevance` is at least this (in
            [0, 1]); fewer than ``top_k`` hits, or none, may pass.
        explain: fill :attr:`Hit.parts` with the score's parts.
        touch: bump ``access_count`` and ``last_accessed`` of the hits (one write).
        now: the clock for ``touch`` (injectable).

    Returns:
        Hits, best first; ties broken by docno (insertion order).

    Raises:
        ValidationError: bad arguments.
        CorruptFileError, DecryptionError: the file is damaged.
    """
    if not isinstance(query, str):
        raise ValidationError("the query must be a string", hint=_ARGS_HINT)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValidationError("top_k must be a non-negative integer", hint=_ARGS_HINT)
    keep = _Filter(after, before, tiers, tags, flags)
    if (isinstance(min_relevance, bool) or not isinstance(min_relevance, (int, float))
            or not 0.0 <= min_relevance <= 1.0):
        raise ValidationError(f"min_relevance must be a number in [0, 1], got {min_relevance!r}", hint=_ARGS_HINT)
    if top_k == 0:
        return []
    expander = _expander(indexes)
    terms = expander.drop_question_words(indexes.tokenizer(query))
    weights = expander.expand(terms) if expand_query else {t: float(c) for t, c in _counts(terms)}
    dates = query_dates(query) if expand_query else []
    limit = max(MIN_CANDIDATES, CANDIDATES_PER_K * top_k)
    with store.read() as txn:
        ctx = _Run(txn, indexes, keep, hops)
        rankings: list[tuple[str, list[tuple[int, float, float]]]] = []
        features: dict[int, dict[str, float]] = {}
        if weights:
            # with filters every match must be checked; without, the fast exact top suffices
            found = indexes.bm25.scores(txn, weights) if ctx.filtering else indexes.bm25.top(txn, weights, limit)
            rankings.append(("bm25", ctx.ranking(*found, limit)))
        for name in sorted(indexes.vectors.spaces(txn)):
            if indexes.vectors.count(txn, name) == 0:
                continue
            qvec = indexes.vectors.embed_query(txn, name, query)
            if qvec is None:
                continue
            v_docs, v_scores = indexes.vectors.scores(txn, name, qvec)
            # No similarity is no evidence. A cosine within float32 rounding of zero is no
            # similarity either: its sign depends on how the matrix was blocked (incremental
            # vs rebuilt), and counting it would make rankings depend on write history.
            positive = v_scores > MIN_VECTOR_SCORE
            ranking = ctx.ranking(v_docs[positive], v_scores[positive], limit)
            rankings.append((f"vector:{name}", ranking))
            for docno, score, hop in ranking:
                features.setdefault(docno, {})[f"match:vector:{name}"] = score + hop
        if weights:
            _bm25_features(txn, indexes, rankings, terms, weights, features)
        hits = ctx.fuse(rankings, features, dates, top_k, explain, float(min_relevance))
    if touch and hits and not store.readonly:
        hits = _touch(store, hits, now_ts(now))
    return hits


def _counts(terms: Sequence[str]) -> list[tuple[str, int]]:
    out: dict[str, int] = {}
    for t in terms:
        out[t] = out.get(t, 0) + 1
    return sorted(out.items())


class _Run:
    """The state of one recall: its snapshot, node cache, filter and neighbour cache."""

    def __init__(self, txn: Any, indexes: Indexes, keep: _Filter, hops: bool) -> None:
        self.txn = txn
        self.indexes = indexes
        self.keep = keep
        self.hops = hops
        # decoded nodes and edges of this snapshot, shared by the queries that read it
        shared = indexes.read_cache(txn)
        self._shared = shared if shared is not None else {}
        self.nodes: dict[int, Node | None] = {}
        self.has_edges = txn.count("edges") > 0
        self.filtering = any(v is not None for v in (keep.after, keep.before, keep.tiers, keep.tags, keep.flags))

    def node(self, docno: int) -> Node | None:
        """The live node of ``docno`` (None when deleted or filtered out)."""
        node = self.nodes.get(docno, ...)
        if node is ...:
            key = ("node", docno)
            node = self._shared.get(key, ...)
            if node is ...:
                raw = self.txn.get("nodes", _U64.pack(docno))
                node = self._shared[key] = None if raw is None else decode_node(raw)
            self.nodes[docno] = node
        return node if node is not None and self.keep(node) else None

    def neighbours(self, docno: int) -> dict[int, float]:
        key = ("nbrs", docno)
        nb = self._shared.get(key)
        if nb is None:
            nb = self._shared[key] = self.indexes.graph.neighbours(self.txn, docno)
        return nb

    def superseded(self, docno: int) -> bool:
        key = ("superseded", docno)
        flag = self._shared.get(key)
        if flag is None:
            flag = self._shared[key] = self.indexes.graph.superseded(self.txn, docno)
        return flag

    def ranking(self, docnos: np.ndarray, scores: np.ndarray, limit: int) -> list[tuple[int, float, float]]:
        """The best ``limit`` (docno, score, hop share) of one retriever, after filters and the hop.

        The hop adds ``HOP_WEIGHT * (P^T s)[d]`` to every candidate and its neighbours, where
        ``s`` holds the candidates' scores and ``P`` the row-normalised edge weights: the
        mass one step of personalised PageRank from the candidates moves to ``d``.
        """
        docnos, scores = self._passing_top(docnos, scores, limit) if self.filtering else _top_k(docnos, scores, limit)
        if not (self.hops and docnos.size and self.has_edges):
            # nothing to spread: the ranking is the top itself, already (score desc, docno)
            return [(d, s, 0.0) for d, s in zip(docnos.tolist(), scores.tolist())]
        base = dict(zip(docnos.tolist(), scores.tolist()))
        moved = one_hop({d: self.neighbours(d) for d in base}, base)
        spread: dict[int, float] = {}
        for d in sorted(moved):
            if moved[d] > 0 and (d in base or self.node(d) is not None):
                spread[d] = HOP_WEIGHT * moved[d]
        total = {d: base.get(d, 0.0) + spread.get(d, 0.0) for d in sorted(set(base) | set(spread))}
        ranked = sorted(total.items(), key=lambda item: (-item[1], item[0]))[:limit]
        return [(d, base.get(d, 0.0), spread.get(d, 0.0)) for d, _ in ranked]

    def _passing_top(self, docnos: np.ndarray, scores: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """``_top_k`` of the documents that pass the filter. Checking a document decodes its
        node, so they are checked best first and only until ``limit`` pass: the best
        ``2 * limit`` first, the rest (sorted only then) when too few of those pass."""
        head_d, head_s = _top_k(docnos, scores, 2 * limit)

        def best_first() -> Iterator[tuple[int, float]]:
            yield from zip(head_d.tolist(), head_s.tolist())
            if head_d.size < docnos.size:  # _top_k is the head of this same order
                rest = np.lexsort((docnos, -scores))[head_d.size:]
                yield from zip(docnos[rest].tolist(), scores[rest].tolist())

        keep_d: list[int] = []
        keep_s: list[float] = []
        for d, s in best_first():
            if len(keep_d) == limit:
                break
            if self.node(d) is not None:
                keep_d.append(d)
                keep_s.append(s)
        return np.asarray(keep_d, dtype=docnos.dtype), np.asarray(keep_s, dtype=np.float64)

    def fuse(self, rankings: Sequence[tuple[str, list[tuple[int, float, float]]]],
             features: dict[int, dict[str, float]], dates: Sequence[QueryDate], top_k: int, explain: bool,
             min_relevance: float) -> list[Hit]:
        fused: dict[int, float] = {}
        for _, ranking in rankings:
            for rank, (docno, _, _) in enumerate(ranking, start=1):
                fused[docno] = fused.get(docno, 0.0) + 1.0 / (RRF_K + rank)
        relevance = {docno: relevance_of(features.get(docno, {})) for docno in fused}
        parts = _explain_parts(rankings) if explain else None
        if parts is not None:
            for docno, p in parts.items():
                p.update(features.get(docno, {}))
        # Boosts need the node, and decoding is the cost of a query, so walk candidates by
        # fused score and stop once even the largest boost cannot lift the next one into
        # the top k (the result is the same as boosting every candidate).
        max_boost = max(TIER_BOOST.values()) * (1.0 + (DATE_WEIGHT if dates else 0.0))
        scored: dict[int, float] = {}
        kth: list[tuple[float, int]] = []  # the best k (score, -docno) so far, ascending
        for docno, base in sorted(fused.items(), key=lambda item: (-item[1], item[0])):
            if len(kth) == top_k and base * max_boost < kth[0][0]:
                break
            if relevance[docno] < min_relevance:
                continue
            node = self.node(docno)
            if node is None:
                continue  # deleted since the index was read, or filtered out
            scored[docno] = score = self._boost(docno, node, base, dates, None if parts is None else parts[docno])
            bisect.insort(kth, (score, -docno))
            if len(kth) > top_k:
                del kth[0]
        order = sorted(scored.items(), key=lambda item: (-item[1], item[0]))[:top_k]
        hits = []
        for docno, score in order:
            node = self.nodes[docno]
            assert node is not None  # scored nodes passed self.node()
            hits.append(Hit(id=node.id, score=score, node=node, docno=docno,
                            parts=None if parts is None else dict(sorted(parts[docno].items())),
                            relevance=relevance[docno]))
        return hits

    def _boost(self, docno: int, node: Node, base: float, dates: Sequence[QueryDate],
               parts: dict[str, float] | None) -> float:
        tier = TIER_BOOST.get(node.tier, 1.0)
        superseded = SUPERSEDED_PENALTY if self.superseded(docno) else 1.0
        date = DATE_WEIGHT * _date_bonus(node, dates)
        if parts is not None:
            parts.update(rrf=base, tier=tier, superseded=superseded, date=date)
        return base * tier * superseded * (1.0 + date)


def _bm25_features(txn: Any, indexes: Indexes, rankings: Sequence[tuple[str, list[tuple[int, float, float]]]],
                   terms: Sequence[str], weights: dict[str, float], features: dict[int, dict[str, float]]) -> None:
    """The BM25 inputs of relevance (spec/recall.md, "Relevance") for every candidate of any
    retriever: the query's ceiling ``bm25_ceiling`` (the least upper bound of a BM25 score),
    ``bm25_rare_idf`` (the idf of a term one document holds), ``coverage:bm25`` (the share of
    the ceiling the candidate's terms cover; synonyms at their weight) and, for the BM25
    ranking, ``match:bm25`` (its score plus hop over the ceiling). The ceiling counts only what
    the user asked (the original terms), so the values compare across queries."""
    ceiling = indexes.bm25.ceiling(txn, dict(_counts(terms)))
    docnos = sorted({d for _, ranking in rankings for d, _, _ in ranking})
    if not docnos or ceiling <= 0:
        return
    covered = indexes.bm25.coverage(txn, weights, docnos).tolist()
    rare = float(lucene_idf(indexes.bm25.doc_count(txn), 1))
    for docno, cov in zip(docnos, covered):
        features.setdefault(docno, {}).update({
            "bm25_ceiling": ceiling, "bm25_rare_idf": rare, "coverage:bm25": min(1.0, cov / ceiling)})
    for name, ranking in rankings:
        if name == "bm25":
            for docno, score, hop in ranking:
                features[docno]["match:bm25"] = (score + hop) / ceiling


def _explain_parts(rankings: Sequence[tuple[str, list[tuple[int, float, float]]]]) -> dict[int, dict[str, float]]:
    """Per docno, each retriever's score, rank and hop share (for ``explain=True``)."""
    parts: dict[int, dict[str, float]] = {}
    for name, ranking in rankings:
        rank_key = name.replace(":", "_rank:") if ":" in name else name + "_rank"
        hop_key = "hop:" + name
        for rank, (docno, score, hop) in enumerate(ranking, start=1):
            p = parts.setdefault(docno, {})
            p[name] = score
            p[rank_key] = float(rank)
            if hop:
                p[hop_key] = hop
    return parts


def _touch(store: Any, hits: list[Hit], now: float) -> list[Hit]:
    """Bump the hits' access counters in one write transaction; returns the updated hits."""

    def bump(txn: Any) -> list[Hit]:
        out = []
        for hit in hits:
            key = _U64.pack(hit.docno)
            raw = txn.get("nodes", key)
            if raw is None:
                continue
            node = decode_node(raw)
            if node.id != hit.id:
                continue
            node = node.replace(access_count=node.access_count + 1, last_accessed=now)
            txn.put("nodes", key, encode_node(node))
            out.append(Hit(id=hit.id, score=hit.score, node=node, docno=hit.docno, parts=hit.parts,
                           relevance=hit.relevance))
        return out

    return store.write(bump)


# --- small-to-big context ---------------------------------------------------------------


def default_source_loader(store: Any) -> Callable[[Any, str], str | None]:
    """Reads a source text from the ``sources`` table, keyed by ``blind(b"source", name)``."""

    def load(txn: Any, name: str) -> str | None:
        raw = txn.get("sources", store.blind(b"source", name.encode("utf-8", "surrogatepass")))
        if raw is None:
            return None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return None

    return load


def recall_context(store: Any, indexes: Indexes, query: str, *, top_k: int = 10, max_tokens: int = 2000,
                   source: str | None = None, token_counter: Callable[[str], int] = count_tokens,
                   source_loader: Callable[[Any, str], str | None] | None = None,
                   **recall_kwargs: Any) -> Context:
    """Small-to-big retrieval: rank memories, then return their source passages.

    Each hit contributes its source span (``node.source`` text from ``source_start`` to
    ``source_end``), or its own content when it has none. Overlapping or touching spans of
    one source merge. Spans are admitted in rank order while the total stays within
    ``max_tokens`` (a span that does not fit is skipped, later smaller ones may still fit; when
    even the best span alone is too big, it is cut to the whole words that fit, from its quote),
    and are emitted in document order: sources (and memories without one) in order of their
    earliest memory (insertion order), spans of a source by offset.

    Args:
        store, indexes: as for :func:`recall`.
        query: free text.
        top_k: how many hits to draw passages from.
        max_tokens: the hard token budget (by ``token_counter``).
        source: only hits whose ``node.source`` equals this.
        token_counter: text -> tokens (default :func:`count_tokens`).
        source_loader: ``(txn, name) -> text`` (default: the ``sources`` table).
        **recall_kwargs: passed to :func:`recall` (filters, ``hops``...).

    Returns:
        The :class:`Context`.

    Raises:
        ValidationError: bad arguments.
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise ValidationError("max_tokens must be a non-negative integer", hint=_ARGS_HINT)
    if source is not None and not isinstance(source, str):
        raise ValidationError("source must be a string", hint=_ARGS_HINT)
    fetch = top_k if source is None else max(top_k * 4, MIN_CANDIDATES)
    hits = recall(store, indexes, query, top_k=fetch, **recall_kwargs)
    if source is not None:
        hits = [h for h in hits if h.node.source == source]
    hits = hits[:top_k]
    loader = source_loader or default_source_loader(store)
    texts: dict[str, str | None] = {}
    # spans[source] = list of [start, end, ids]; content-only hits use source "" + docno
    admitted: dict[str, list[list[Any]]] = {}
    # document order: sources (and content-only memories) by their earliest memory's docno
    source_order: dict[str, int] = {}
    used = 0
    with store.read() as txn:
        for hit in hits:
            node = hit.node
            src_text = None
            if node.source and node.source_start is not None and node.source_end is not None:
                if node.source not in texts:
                    texts[node.source] = loader(txn, node.source)
                src_text = texts[node.source]
            if src_text is not None and node.source_start < node.source_end <= len(src_text):
                key, start, end = node.source, node.source_start, node.source_end
            else:
                key, start, end = f"\x00{hit.docno}", 0, len(node.content)
                texts[key] = node.content
            spans = admitted.get(key, [])
            merged = _merge_span(spans, start, end, hit.id)
            text = texts[key] or ""
            new_cost = sum(token_counter(text[s:e]) for s, e, _ in merged)
            old_cost = sum(token_counter(text[s:e]) for s, e, _ in spans)
            if used - old_cost + new_cost > max_tokens:
                if used == 0 and not admitted:  # the best passage alone is too big: keep what fits of it
                    window = _fit_window(text, start, end, node.quote, max_tokens, token_counter)
                    if window is not None:
                        admitted[key] = [[window[0], window[1], [hit.id]]]
                        used = token_counter(text[window[0]:window[1]])
                        source_order[key] = hit.docno
                continue
            used += new_cost - old_cost
            admitted[key] = merged
            source_order[key] = min(source_order.get(key, hit.docno), hit.docno)
    passages = []
    for key in sorted(admitted, key=lambda k: (source_order[k], k)):
        text = texts[key] or ""
        content_only = key.startswith("\x00")
        for start, end, ids in admitted[key]:
            piece = text[start:end]
            passages.append(Passage(source="" if content_only else key, start=None if content_only else start,
                                    end=None if content_only else end, text=piece, ids=tuple(ids),
                                    tokens=token_counter(piece)))
    return Context(passages=tuple(passages), tokens=used, hits=tuple(hits))


def _fit_window(text: str, start: int, end: int, quote: str, budget: int,
                counter: Callable[[str], int]) -> tuple[int, int] | None:
    """The longest run of whole words of ``text[start:end]`` within ``budget`` tokens, starting at
    the memory's quote when the span contains it (the most informative sentence), else at ``start``."""
    at = text.find(quote, start, end) if quote else -1
    lo = at if at >= 0 else start
    cuts = [m.end() for m in re.finditer(r"\S+", text[lo:end])]
    best = None
    left, right = 0, len(cuts) - 1
    while left <= right:  # token counts only grow with the window, so bisect on the word count
        mid = (left + right) // 2
        if counter(text[lo:lo + cuts[mid]]) <= budget:
            best, left = (lo, lo + cuts[mid]), mid + 1
        else:
            right = mid - 1
    return best


def _merge_span(spans: list[list[Any]], start: int, end: int, hit_id: str) -> list[list[Any]]:
    """``spans`` (sorted, disjoint) plus [start, end), merging overlapping or touching ones."""
    out: list[list[Any]] = []
    cur = [start, end, [hit_id]]
    for s, e, ids in spans:
        if e < cur[0] or s > cur[1]:
            out.append([s, e, list(ids)])
        else:
            cur = [min(s, cur[0]), max(e, cur[1]), list(ids) + [i for i in cur[2] if i not in ids]]
    out.append(cur)
    out.sort(key=lambda span: (span[0], span[1]))
    return out
