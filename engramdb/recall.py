"""The query pipeline: expand -> BM25 and vectors (each spread one hop) -> RRF -> boosts -> top k.

Every step is deterministic: query terms are scored in sorted order, rankings break ties
by docno, and nothing iterates a set or dict in hash order, so the same file and query
give the same hits in every process (whatever ``PYTHONHASHSEED``). The read path takes no
write lock; only ``touch=True`` writes (one batched transaction after the read).

Scoring (spec/bm25.md, "Recall"):

* each retriever (BM25; one per embedding space that can embed the query) ranks its
  candidates by its score plus ``HOP_WEIGHT`` times the score one step of personalised
  PageRank moves to them over edges and tunnels from the other candidates (at most the
  best of those candidates' scores), so the neighbours of strong matches rise (and join
  the list), and a memory that matches nothing stays below the best match it is linked
  to however many matches it is linked to;
* ``rrf``: weighted fusion of those rankings (:mod:`engramdb.fusion`, weights from a
  :class:`~engramdb.fusion.FusionWeights`, ``fusion=``): BM25 alone keeps reciprocal rank
  fusion ``1 / (60 + rank)``; with spaces, each ranking's standard scores summed, a space
  weighted by its agreement with BM25, and the sum's order turned back into
  ``1 / (60 + rank)`` (spec/recall.md, section 5);
* multiplied by the tier boost, by ``SUPERSEDED_PENALTY`` when another memory
  supersedes this one, and by ``1 + DATE_WEIGHT * proximity`` when the query names a
  year or month near the memory's ``resolved_date``;
* and by the query features of :mod:`engramdb.recall_features` (speaker, source, time:
  spec/recall.md, section 6).

The hop runs inside each retriever, before fusion, because RRF flattens scores: spread
over ranks it lets weak neighbours overtake strong matches (on LoCoMo, R@10 0.48 against
0.66 when spread over raw BM25 scores; see spec/bm25.md).
"""
from __future__ import annotations

import bisect
import copy
import datetime as _dt
import inspect
import math
import re
import struct
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from .codec import decode_node, encode_node
from .errors import ReadOnlyError, ValidationError
from .filters import Filter, NameSet, TimeBound
from .fusion import (DEFAULT_FUSION, LIFT_DEPTH, FusionWeights, SpaceSignal, check_fusion, fuse_rankings, lift, standout,
                     tied_ranks)
from .index import Indexes
from .index.bm25 import IdfMasses, lucene_idf
from .index.bm25 import top_k as _top_k
from .index.synonyms import DATE_WEIGHT, Expander, QueryDate, parse_date, query_dates
from .records import Node, now_ts
from .recall_features import QueryFeatures
from .store import Store, Txn
from .tokens import estimate_tokens, token_counter

__all__ = [
    "Hit",
    "Context",
    "Passage",
    "recall",
    "recall_context",
]

_ARGS_HINT = "see help(engramdb.Engram.recall) for the arguments and their types"
# Tier only breaks near-ties: with rrf_k = 60 (FusionWeights) two adjacent ranks at the top differ by
# about 1.6 %, so a factor below that never lets a colder tier lose a whole rank to a
# hotter memory that matched worse (a 0.97 warm factor used to; tests/test_recall.py).
TIER_BOOST = {"hot": 1.0, "warm": 0.995, "cold": 0.99, "archive": 0.98}
SUPERSEDED_PENALTY = 0.5
# The hop's weight: a neighbour gains HOP_WEIGHT times the score one PageRank step moves to it.
# Below 1, so a memory that matches nothing never ties the best match it is linked to (its gain
# is capped at that match's score, _spread_capped); 0.9 was chosen by leave-one-conversation-out
# cross-validation on LoCoMo (spec/recall.md, section 7; tools/bench/locomo_cv.py).
HOP_WEIGHT = 0.9
MIN_VECTOR_SCORE = 1e-5
# How many ranked candidates each retriever hands to fusion, relative to top_k.
CANDIDATES_PER_K = 8
MIN_CANDIDATES = 50
_U64 = struct.Struct(">Q")
# The calibration of relevance (spec/recall.md, "Relevance"; tools/bench/calibrate_relevance.py).
RARE_TERMS = 2.0
VECTOR_FLOOR = 0.3
VECTOR_POWER = 1.5


def relevance_of(features: dict[str, float]) -> float:
    """A hit's relevance from its raw match features (spec/recall.md, "Relevance")."""
    best = _lexical_relevance(features)
    for key, value in features.items():
        if key.startswith("match:vector:"):
            best = max(best, (max(0.0, value - VECTOR_FLOOR) / (1.0 - VECTOR_FLOOR)) ** VECTOR_POWER)
    return min(1.0, max(0.0, best))


def _lexical_relevance(features: dict[str, float]) -> float:
    """:func:`relevance_of` of the BM25 features alone (``match:vector:*`` left out)."""
    cov = features.get("coverage:bm25", 0.0)
    if cov > 0:
        covered = cov * features["bm25_ceiling"] / features["bm25_rare_idf"]  # in rare-term units
        return min(1.0, max(0.0, cov * min(1.0, covered / RARE_TERMS)))
    return 0.0


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
            ``tier``, ``superseded``, ``date``, the query features' matches ``speaker``,
            ``source`` and ``time`` (spec/recall.md section 6), and the inputs of ``relevance``:
            ``bm25_ceiling`` (the query's highest attainable BM25), ``bm25_rare_idf`` (the idf of
            a term in one document), ``coverage:bm25`` and ``match:<retriever>``.
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
    """A source span admitted into a context, with the hits it came from.

    Attributes:
        source: the source's name (``""`` for a memory without one: its content is the passage).
        start, end: the passage's character offsets in the source (None without a source).
        text: the passage, from the start of a sentence to the end of one (a passage cut to
            fit a budget ends at a sentence end too, or, when not even one sentence fits,
            at a word followed by ``" …"``).
        ids: the memories it came from, best first.
        tokens: the tokens of :attr:`block` by the context's counter.
        date: when it is from: the memories' ``resolved_date`` (or the day they were
            stored), ``"A to B"`` when they differ, None when unknown.
        heading: the line that heads it: ``### <source> (<date>)``, ``### memory <id> (<date>)``
            for a memory without a source, without `` (<date>)`` when the date is unknown.
    """

    source: str
    start: int | None
    end: int | None
    text: str
    ids: tuple[str, ...]
    tokens: int
    date: str | None = None
    heading: str = ""

    @property
    def block(self) -> str:
        """The heading line, then the text."""
        return f"{self.heading}\n{self.text}" if self.heading else self.text


@dataclass(frozen=True)
class Context:
    """What :func:`recall_context` returns: passages in document order, within the budget.

    ``tokens`` is the count of :attr:`text` itself by the counter used, never above the budget.
    """

    passages: tuple[Passage, ...] = ()
    tokens: int = 0
    hits: tuple[Hit, ...] = field(default=())

    @property
    def text(self) -> str:
        """The passages' blocks (heading line, then text), separated by blank lines."""
        return PASSAGE_SEPARATOR.join(p.block for p in self.passages)


PASSAGE_SEPARATOR = "\n\n"


def _expander(indexes: Indexes) -> Expander:
    exp = indexes._recall_expander
    if exp is None or exp.tokenizer is not indexes.tokenizer:
        exp = Expander(indexes.tokenizer)
        indexes._recall_expander = exp
    return exp


def _date_bonus(node: Node, dates: Sequence[QueryDate]) -> float:
    nd = parse_date(node.resolved_date)
    if nd is None or not dates:
        return 0.0
    return max(q.proximity(nd) for q in dates)


def as_int(value: object) -> int | None:
    """``value`` as an int when it is an integer (NumPy's too, as pandas rows give them; not a
    bool), else None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return int(value) if isinstance(value, np.integer) else None


def as_real(value: object) -> float | None:
    """``value`` when it is a real number (NumPy's as its Python value; not a bool), else None."""
    if type(value) in (int, float):
        return value  # type: ignore[return-value]
    if isinstance(value, (np.integer, np.floating)):  # np.float64 is a float too: as Python's
        real: float = value.item()
        return real
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def recall(store: Store, indexes: Indexes, query: str, *, top_k: int = 5, hops: bool = True,
           expand_query: bool = True, after: TimeBound | None = None, before: TimeBound | None = None,
           tiers: NameSet | None = None, tags: NameSet | None = None, any_tags: NameSet | None = None,
           flags: NameSet | None = None, any_flags: NameSet | None = None,
           source: str | None = None, min_relevance: float = 0.0, explain: bool = False,
           touch: bool = False, now: float | None = None, fusion: FusionWeights | None = None) -> list[Hit]:
    """The memories that best answer ``query``.

    Args:
        store: the open :class:`~engramdb.store.Store`.
        indexes: its :class:`~engramdb.index.Indexes`.
        query: free text.
        top_k: how many hits to return.
        hops: spread each retriever's scores one edge/tunnel hop (personalised PageRank's
            first step), so memories linked to strong matches rise and join the results.
        expand_query: add synonyms of the query words (weight 0.4) and date proximity.
        after, before, tiers, tags, any_tags, flags, any_flags, source: filters, with the
            same meaning everywhere (:mod:`engramdb.filters`). ``after``/``before`` are date
            bounds (timestamps, dates, datetimes or ISO strings): a memory with a
            ``resolved_date`` is kept when that date is within them as zettel-compress
            compares dates (ISO text at the bound's precision, both ends inclusive:
            ``after="2023-05"`` keeps ``2023-05-01``), any other memory when it was created
            at/after ``after`` and before ``before``. Kept: in one of ``tiers``; with all
            ``tags`` / at least one of ``any_tags``; with all ``flags`` / one of
            ``any_flags``; of this ``source``.
        min_relevance: keep only hits whose :attr:`Hit.relevance` is at least this (in
            [0, 1]); fewer than ``top_k`` hits, or none, may pass.
        explain: fill :attr:`Hit.parts` with the score's parts.
        touch: bump ``access_count`` and ``last_accessed`` of the hits (one write).
        now: the clock for ``touch`` (injectable).
        fusion: the weights the retrievers are fused with (default
            :data:`~engramdb.fusion.DEFAULT_FUSION`; spec/recall.md, "Fusion").

    Returns:
        Hits, best first; ties broken by docno (insertion order).

    Raises:
        ValidationError: bad arguments.
        ReadOnlyError: ``touch=True`` on a read-only handle.
        CorruptFileError, DecryptionError: the file is damaged.
    """
    if not isinstance(query, str):
        raise ValidationError("the query must be a string", hint=_ARGS_HINT)
    top = as_int(top_k)
    if top is None or top < 0:
        raise ValidationError(f"top_k must be a non-negative integer, got {top_k!r}", hint=_ARGS_HINT)
    top_k = top
    for name, switch in (("hops", hops), ("expand_query", expand_query), ("explain", explain), ("touch", touch)):
        if not isinstance(switch, (bool, np.bool_)):  # by truthiness, hops="no" would spread
            raise ValidationError(f"{name} must be True or False, got {switch!r}", hint=_ARGS_HINT)
    if touch and store.readonly:  # it would write nothing, and say nothing of it
        raise ReadOnlyError("touch=True records the hits' access (a write), and this handle is read-only",
                            hint="open the file with readonly=False to record accesses, or recall with touch=False")
    keep = Filter(after=after, before=before, tiers=tiers, tags=tags, any_tags=any_tags, flags=flags,
                  any_flags=any_flags, source=source)
    floor = as_real(min_relevance)
    if floor is None or not 0.0 <= floor <= 1.0:
        raise ValidationError(f"min_relevance must be a number in [0, 1], got {min_relevance!r}", hint=_ARGS_HINT)
    min_relevance = floor
    weights_of_fusion = check_fusion(fusion)
    if top_k == 0:
        return []
    expander = _expander(indexes)
    terms = expander.drop_question_words(indexes.tokenizer(query))
    weights = expander.expand(terms) if expand_query else {t: float(c) for t, c in _counts(terms)}
    dates = query_dates(query) if expand_query else []
    qfeatures = QueryFeatures.of(query, indexes.tokenizer)
    limit = max(MIN_CANDIDATES, CANDIDATES_PER_K * top_k)
    with store.read() as txn:
        ctx = _Run(txn, indexes, keep, hops, qfeatures)
        rankings: list[tuple[str, list[tuple[int, float, float]]]] = []
        features: dict[int, dict[str, float]] = {}
        signals: dict[str, SpaceSignal] = {}
        if weights:
            # with filters every match must be checked; without, the fast exact top suffices
            found = indexes.bm25.scores(txn, weights) if ctx.filtering else indexes.bm25.top(txn, weights, limit)
            rankings.append(("bm25", ctx.ranking(*found, limit)))
        spaces = indexes.vectors.spaces(txn)
        # BM25's best direct matches, in docno order: each space's lift is measured on them
        lexical_top = sorted(d for d, s, _ in rankings[0][1][:LIFT_DEPTH] if s > 0) if rankings else []
        for name in sorted(spaces):
            if indexes.vectors.count(txn, name) == 0:
                continue
            qvec = indexes.vectors.embed_query(txn, name, query)
            if qvec is None:
                continue
            v_docs, v_scores = indexes.vectors.scores(txn, name, qvec)
            signals[f"vector:{name}"] = _signal(spaces[name].model, v_docs, v_scores, lexical_top)
            # No similarity is no evidence. A cosine within float32 rounding of zero is no
            # similarity either: its sign depends on how the matrix was blocked (incremental
            # vs rebuilt), and counting it would make rankings depend on write history.
            positive = v_scores > MIN_VECTOR_SCORE
            ranking = ctx.ranking(v_docs[positive], v_scores[positive], limit)
            rankings.append((f"vector:{name}", ranking))
            for docno, score, hop in ranking:
                features.setdefault(docno, {})[f"match:vector:{name}"] = score + hop
        if weights:
            counts = dict(_counts(terms))
            # the query's highest attainable BM25, over what the user asked (the original terms)
            # (each term's w * idf and docnos once per query, in this txn: the ceiling and the
            # coverages below all read them; the expanded weights only when they differ)
            masses = indexes.bm25.idf_mass(txn, counts)
            ceiling = indexes.bm25.ceiling(txn, counts, masses=masses)
            candidates = sorted({d for _, ranking in rankings for d, _, _ in ranking})
            ctx.prefetch(candidates)
            weighted = masses if weights == counts else None
            _bm25_features(txn, indexes, rankings, ceiling, weights, candidates, features, weighted)
            _source_features(txn, indexes, ctx, qfeatures, counts, ceiling, candidates, masses)
        hits = ctx.fuse(rankings, features, dates, top_k, explain, float(min_relevance), weights_of_fusion, signals)
    if touch and hits:
        hits = _touch(store, hits, now_ts(now))
    return hits


def _signal(model: str, docnos: np.ndarray, scores: np.ndarray, lexical_top: list[int]) -> SpaceSignal:
    """A space's :class:`~engramdb.fusion.SpaceSignal` on one query: its :func:`~engramdb.fusion.standout`
    and its :func:`~engramdb.fusion.lift` over ``lexical_top`` (BM25's best direct matches,
    ascending), from its similarities ``scores`` to every live row ``docnos`` (docno order; all
    of them, before filters: they are the query's background)."""
    if scores.size == 0:
        return SpaceSignal(model)
    mean, std, count = float(scores.mean(dtype=np.float64)), float(scores.std(dtype=np.float64)), int(scores.size)
    top = np.asarray(lexical_top, dtype=docnos.dtype)
    pos = np.searchsorted(docnos, top)
    inside = pos < docnos.size
    pos = pos[inside][docnos[pos[inside]] == top[inside]]  # the matches that have a vector here
    top_mean = float(scores[pos].mean(dtype=np.float64)) if pos.size else 0.0
    return SpaceSignal(model, standout(float(scores.max()), mean, std, count),
                       lift(top_mean, int(pos.size), mean, std, count))


def _counts(terms: Sequence[str]) -> list[tuple[str, int]]:
    out: dict[str, int] = {}
    for t in terms:
        out[t] = out.get(t, 0) + 1
    return sorted(out.items())


def _spread_capped(rows: dict[int, tuple[tuple[int, float], ...]], seeds: dict[int, float]) -> dict[int, float]:
    """:func:`~engramdb.index.graph.spread` (the same sums, in the same order), each node's
    sum capped at the best score among the seeds that give it a positive share.

    Summed over many matches, a hub linked to all of them would collect more than any of
    them and outrank the memories that match (0.9 x the scores of 50 leaves). Where the sum
    stays below that best score (an inner turn of a chain of turns: each neighbour passes
    half its score), its floats are unchanged.
    """
    moved: dict[int, float] = {}
    best: dict[int, float] = {}
    get, top = moved.get, best.get
    for src in sorted(seeds):
        row = rows.get(src)
        if row:
            score = seeds[src]
            for dst, share in row:
                moved[dst] = get(dst, 0.0) + score * share
                if share > 0 and score > top(dst, -math.inf):
                    best[dst] = score
    return {d: min(m, top(d, 0.0)) for d, m in moved.items()}


class _Run:
    """The state of one recall: its snapshot, node cache, filter and neighbour cache."""

    def __init__(self, txn: Txn, indexes: Indexes, keep: Filter, hops: bool,
                 qfeatures: QueryFeatures | None = None) -> None:
        self.txn = txn
        self.qfeatures = qfeatures
        self.indexes = indexes
        self.keep = keep
        self.hops = hops
        # decoded nodes and edges, kept across queries and commits (index/nodecache.py)
        self._view = indexes.node_cache.view(txn)
        self.nodes: dict[int, Node | None] = {}
        self.has_edges = txn.count("edges") > 0
        self.filtering = keep.active

    def node(self, docno: int) -> Node | None:
        """The live node of ``docno`` (None when deleted or filtered out)."""
        node = self.nodes.get(docno, ...)
        if node is ...:
            node = self.nodes[docno] = self._view.node(docno)
        return node if node is not None and (not self.filtering or self.keep(node)) else None

    def prefetch(self, docnos: Sequence[int]) -> None:
        """Look the nodes of ``docnos`` up at once (the cached ones in one pass), for :meth:`node`."""
        nodes = self.nodes
        missing = [d for d in docnos if d not in nodes]
        if missing:
            nodes.update(self._view.nodes(missing))

    def superseded(self, docno: int) -> bool:
        return self._view.superseded(docno)

    def ranking(self, docnos: np.ndarray, scores: np.ndarray, limit: int) -> list[tuple[int, float, float]]:
        """The best ``limit`` (docno, score, hop share) of one retriever, after filters and the hop.

        The hop adds ``HOP_WEIGHT * min((P^T s)[d], b[d])`` to every candidate and its
        neighbours, where ``s`` holds the candidates' scores, ``P`` the row-normalised edge
        weights (``P^T s``: the mass one step of personalised PageRank from the candidates
        moves to ``d``) and ``b[d]`` the best score among the candidates with an edge to
        ``d``: a node's hop gain never exceeds what its best neighbour alone could give it.
        """
        docnos, scores = self._passing_top(docnos, scores, limit) if self.filtering else _top_k(docnos, scores, limit)
        if not (self.hops and docnos.size and self.has_edges):
            # nothing to spread: the ranking is the top itself, already (score desc, docno)
            return [(d, s, 0.0) for d, s in zip(docnos.tolist(), scores.tolist())]
        seeds = docnos.tolist()
        base = dict(zip(seeds, scores.tolist()))
        moved = _spread_capped(self._view.hop_rows(seeds), base)  # rows lead to existing nodes only
        if self.filtering:
            node = self.node
            moved = {d: m for d, m in moved.items() if d in base or node(d) is not None}
        # the candidates' totals, base plus HOP_WEIGHT times what moved to them (only what
        # moved > 0 counts: the same floats as adding them one by one, in numpy)
        to = np.fromiter(moved.keys(), np.int64, len(moved))
        share = np.fromiter(moved.values(), np.float64, len(moved))
        positive = share > 0
        to, share = to[positive], HOP_WEIGHT * share[positive]
        cands, at = np.unique(np.concatenate((docnos.astype(np.int64), to)), return_inverse=True)
        own = np.zeros(cands.size)
        own[at[:docnos.size]] = scores
        hop = np.zeros(cands.size)
        hop[at[docnos.size:]] = share
        order = np.lexsort((cands, -(own + hop)))[:limit]  # score desc, then docno
        return list(zip(cands[order].tolist(), own[order].tolist(), hop[order].tolist()))

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
             min_relevance: float, fusion: FusionWeights = DEFAULT_FUSION,
             signals: dict[str, SpaceSignal] | None = None) -> list[Hit]:
        fused = fuse_rankings(rankings, _lexical_strength(rankings, features), fusion, signals)
        relevance: dict[int, float] = {}  # of the candidates walked below (the rest cannot place)
        parts = _explain_parts(rankings) if explain else None
        if parts is not None:
            for docno, p in parts.items():
                p.update(features.get(docno, {}))
        # Boosts need the node, and decoding is the cost of a query, so walk candidates by
        # fused score and stop once even the largest boost cannot lift the next one into
        # the top k (the result is the same as boosting every candidate).
        max_boost = max(TIER_BOOST.values()) * (1.0 + (DATE_WEIGHT if dates else 0.0))
        if self.qfeatures is not None:
            max_boost *= self.qfeatures.max_boost()
        scored: dict[int, float] = {}
        kth: list[tuple[float, int]] = []  # the best k (score, -docno) so far, ascending
        walk = np.fromiter(fused.keys(), np.int64, len(fused))
        values = np.fromiter(fused.values(), np.float64, len(fused))
        order = np.lexsort((walk, -values))  # fused score desc, then docno
        no_features: dict[str, float] = {}
        # without a space, a candidate's features hold no vector match: relevance is BM25's alone
        relevance_from = relevance_of if any(name != "bm25" for name, _ in rankings) else _lexical_relevance
        for docno, base in zip(walk[order].tolist(), values[order].tolist()):
            if len(kth) == top_k and base * max_boost < kth[0][0]:
                break
            relevance[docno] = rel = relevance_from(features.get(docno, no_features))
            if rel < min_relevance:
                continue
            node = self.node(docno)
            if node is None:
                continue  # deleted since the index was read, or filtered out
            scored[docno] = score = self._boost(docno, node, base, dates, None if parts is None else parts[docno])
            bisect.insort(kth, (score, -docno))
            if len(kth) > top_k:
                del kth[0]
        hits = []
        for docno, score in sorted(scored.items(), key=lambda item: (-item[1], item[0]))[:top_k]:
            node = self.nodes[docno]
            assert node is not None  # scored nodes passed self.node()
            hits.append(Hit(id=node.id, score=score, node=_own_copy(node), docno=docno,
                            parts=None if parts is None else dict(sorted(parts[docno].items())),
                            relevance=relevance[docno]))
        return hits

    def _boost(self, docno: int, node: Node, base: float, dates: Sequence[QueryDate],
               parts: dict[str, float] | None) -> float:
        tier = TIER_BOOST.get(node.tier, 1.0)
        superseded = SUPERSEDED_PENALTY if self.superseded(docno) else 1.0
        date = DATE_WEIGHT * _date_bonus(node, dates) if dates else 0.0
        if parts is not None:
            parts.update(rrf=base, tier=tier, superseded=superseded, date=date)
        features = 1.0 if self.qfeatures is None else self.qfeatures.boost(node, parts, docno)
        return base * tier * superseded * (1.0 + date) * features


def _lexical_strength(rankings: Sequence[tuple[str, list[tuple[int, float, float]]]],
                      features: dict[int, dict[str, float]]) -> float:
    """The BM25-only relevance of BM25's best match (0 without one): how strong the lexical
    evidence is, for :attr:`FusionWeights.weak_match_trust`."""
    lexical = next((r for n, r in rankings if n == "bm25"), None)
    if not lexical:
        return 0.0
    return _lexical_relevance(features.get(lexical[0][0], {}))


def _bm25_features(txn: Txn, indexes: Indexes, rankings: Sequence[tuple[str, list[tuple[int, float, float]]]],
                   ceiling: float, weights: dict[str, float], docnos: Sequence[int],
                   features: dict[int, dict[str, float]], masses: IdfMasses | None = None) -> None:
    """The BM25 inputs of relevance (spec/recall.md, "Relevance") for every candidate of any
    retriever (``docnos``, ascending): the query's ceiling ``bm25_ceiling`` (the least upper
    bound of a BM25 score), ``bm25_rare_idf`` (the idf of a term one document holds),
    ``coverage:bm25`` (the share of the ceiling the candidate's terms cover; synonyms at
    their weight) and, for the BM25 ranking, ``match:bm25`` (its score plus hop over the
    ceiling). The ceiling counts only what the user asked (the original terms), so the
    values compare across queries. ``masses``: ``idf_mass(txn, weights)`` when the caller has it."""
    if not docnos or ceiling <= 0:
        return
    covered = np.minimum(1.0, indexes.bm25.coverage(txn, weights, docnos, masses=masses) / ceiling).tolist()
    rare = float(lucene_idf(indexes.bm25.doc_count(txn), 1))
    for docno, cov in zip(docnos, covered):
        own = features.get(docno)
        if own is None:
            features[docno] = {"bm25_ceiling": ceiling, "bm25_rare_idf": rare, "coverage:bm25": cov}
        else:
            own.update({"bm25_ceiling": ceiling, "bm25_rare_idf": rare, "coverage:bm25": cov})
    for name, ranking in rankings:
        if name == "bm25":
            for docno, score, hop in ranking:
                features[docno]["match:bm25"] = (score + hop) / ceiling


def _source_features(txn: Txn, indexes: Indexes, ctx: _Run, qfeatures: QueryFeatures, counts: dict[str, int],
                     ceiling: float, docnos: Sequence[int], masses: IdfMasses) -> None:
    """Score the candidates' sources by how much of the query they cover between them
    (:meth:`QueryFeatures.score_sources`; spec/recall.md, section 6). ``masses`` is
    ``idf_mass(txn, counts)`` (each term's coverage reads its entry)."""
    def coverage(term: str, ds: Sequence[int]) -> np.ndarray:
        one = {term: counts[term]}
        return indexes.bm25.coverage(txn, one, ds, masses={term: masses[term]} if term in masses else None)

    qfeatures.score_sources(ctx.node, coverage, counts, ceiling, docnos)


def _explain_parts(rankings: Sequence[tuple[str, list[tuple[int, float, float]]]]) -> dict[int, dict[str, float]]:
    """Per docno, each retriever's score, rank and hop share (for ``explain=True``)."""
    parts: dict[int, dict[str, float]] = {}
    for name, ranking in rankings:
        rank_key = name.replace(":", "_rank:") if ":" in name else name + "_rank"
        hop_key = "hop:" + name
        for (rank, docno), (_, score, hop) in zip(tied_ranks(ranking), ranking):
            p = parts.setdefault(docno, {})
            p[name] = score
            p[rank_key] = float(rank)  # the rank fusion used (ties share one)
            if hop:
                p[hop_key] = hop
    return parts


def _own_copy(node: Node) -> Node:
    """``node`` with a metadata of its own: the decoded node is shared with the handle's node
    cache, and a caller changing ``hit.node.metadata`` (a plain dict on a frozen Node) must
    not change what later queries return."""
    if not node.metadata:
        return node
    out = copy.copy(node)
    object.__setattr__(out, "metadata", copy.deepcopy(node.metadata))
    return out


def _touch(store: Store, hits: list[Hit], now: float) -> list[Hit]:
    """Bump the hits' access counters in one write transaction; returns the updated hits."""

    def bump(txn: Txn) -> list[Hit]:
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

    bumped: list[Hit] = store.write(bump)
    return bumped


# --- small-to-big context ---------------------------------------------------------------


def default_source_loader(store: Store) -> Callable[[Txn, str], str | None]:
    """Reads a source text from the ``sources`` table, keyed by ``blind(b"source", name)``."""

    def load(txn: Txn, name: str) -> str | None:
        raw = txn.get("sources", store.blind(b"source", name.encode("utf-8", "surrogatepass")))
        if raw is None:
            return None
        try:
            text: str = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
        return text

    return load


def recall_context(store: Store, indexes: Indexes, query: str, *, top_k: int = 10, max_tokens: int = 2000,
                   source: str | None = None, source_text: str | None = None,
                   count_tokens: Callable[[str], int] | None = None,
                   source_loader: Callable[[Txn, str], str | None] | None = None,
                   **recall_kwargs: Any) -> Context:
    """Small-to-big retrieval: rank memories, then return their source passages.

    Each hit contributes its source span (``node.source`` text from ``source_start`` to
    ``source_end``), widened to whole sentences, or its own content when it has none.
    Overlapping or touching spans of one source merge. Spans are admitted in rank order
    while the whole rendered :attr:`Context.text` (each passage headed by its source and
    date) stays within ``max_tokens`` under ``count_tokens``: a span that does not fit is
    skipped, later smaller ones may still fit; when even the best span alone is too big, it
    is cut to the sentences that fit, from its quote's sentence (to words when not even one
    sentence fits). Passages are emitted in document order: sources (and memories without
    one) in order of their earliest memory (insertion order), spans of a source by offset.

    Args:
        store, indexes: as for :func:`recall`.
        query: free text.
        top_k: how many hits to draw passages from.
        max_tokens: the hard token budget of :attr:`Context.text` (by ``count_tokens``).
        source: only hits whose ``node.source`` equals this (a name filter).
        source_text: the text the hits' offsets point into, used instead of the file's stored
            source texts (zettel-compress's ``source`` option: for memories imported from AAAK,
            whose source text the file does not hold). With several documents in one file,
            combine it with ``source=`` so only that document's memories are cut from it.
        count_tokens: text -> tokens (default :func:`engramdb.estimate_tokens`).
        source_loader: ``(txn, name) -> text`` (default: the ``sources`` table).
        **recall_kwargs: passed to :func:`recall` (filters, ``hops``...).

    Returns:
        The :class:`Context`.

    Raises:
        ValidationError: bad arguments, a ``count_tokens`` that fails or returns
            something other than a non-negative int, or one that counts more than
            ``max_tokens`` in the empty text (``Context.tokens`` is the count of the text,
            ``count_tokens("")`` for an empty context).
    """
    budget = as_int(max_tokens)
    if budget is None or budget < 0:
        raise ValidationError(f"max_tokens must be a non-negative integer, got {max_tokens!r}", hint=_ARGS_HINT)
    max_tokens = budget
    if source is not None and not isinstance(source, str):
        raise ValidationError("source must be a string", hint=_ARGS_HINT)
    if source_text is not None and not isinstance(source_text, str):
        raise ValidationError("source_text must be the source text (a str)", hint=_ARGS_HINT)
    unknown = sorted(set(recall_kwargs) - _RECALL_OPTIONS)
    if unknown:  # else recall() raises a TypeError that names recall, not what the caller called
        raise ValidationError(f"recall_context takes no option {', '.join(unknown)}",
                              hint="its options: max_tokens, source, source_text, count_tokens, source_loader, "
                                   "top_k and recall's " + ", ".join(sorted(_RECALL_OPTIONS)))
    count = token_counter(count_tokens)
    # a counter with a fixed overhead (a BOS token) counts the empty text too: the budget is a
    # hard limit on the text as returned, and under one that small no context, not even "", fits
    empty = count("")
    if empty > max_tokens:
        raise ValidationError(f"count_tokens counts {empty} tokens in the empty text, more than max_tokens={max_tokens}: "
                              "no context can fit", hint=f"raise max_tokens to at least {empty} plus the passages' tokens")
    hits = recall(store, indexes, query, top_k=top_k, source=source, **recall_kwargs)
    loader = source_loader or default_source_loader(store)
    layout = _Layout(count)
    with store.read() as txn:
        for hit in hits:
            node = hit.node
            src_text = None
            name = node.source
            if source_text is not None and node.source_start is not None and node.source_end is not None:
                name = name or "source_text"  # memories without a source name: the given text
                layout.texts[name] = src_text = source_text
            elif node.source and node.source_start is not None and node.source_end is not None:
                if node.source not in layout.texts:
                    loaded = loader(txn, node.source)
                    if loaded is not None and not isinstance(loaded, str):
                        raise ValidationError(f"source_loader returned a {type(loaded).__name__} for "
                                              f"{node.source!r}; it must return the text (a str) or None",
                                              hint="decode bytes first; return None for a source it does not have")
                    layout.texts[node.source] = loaded
                src_text = layout.texts[node.source]
            s0, e0 = node.source_start, node.source_end
            if src_text is not None and s0 is not None and e0 is not None and 0 <= s0 < e0 <= len(src_text):
                key = name
                start, end = sentence_span(src_text, s0, e0)
            else:  # the content itself, without its leading and trailing whitespace
                content = node.content
                key, start, end = f"\x00{hit.docno}", len(content) - len(content.lstrip()), len(content.rstrip())
                if start >= end:
                    continue  # only whitespace (reached by the hop): nothing to show
                layout.texts[key] = content
            layout.offer(key, start, end, hit, max_tokens)
    passages = layout.passages()
    text = PASSAGE_SEPARATOR.join(p.block for p in passages)
    return Context(passages=passages, tokens=count(text) if passages else empty, hits=tuple(hits))


# what recall_context passes on to recall() (its other options are recall_context's own)
_RECALL_OPTIONS = frozenset(inspect.signature(recall).parameters) - {"store", "indexes", "query", "top_k", "source"}
# A sentence ends at . ! ? … before whitespace, at the full stops of Chinese and Japanese
# (U+3002, U+FF01, U+FF1F, never followed by a space), or at a line break. Only match ends
# are used: {1,16}, not +, so a long run of dots is not rescanned from each of its dots
# (quadratic), and a run still ends where it did.
_SENTENCE_END = re.compile(r"[.!?\u2026]{1,16}[\"'\u201d\u2019)\]]*(?=\s|$)"
                           r"|[\u3002\uff01\uff1f]+[\u300d\u300f\uff09\"'\u201d\u2019)\]]*|\n")
# A word ends before whitespace; Chinese and Japanese have no spaces, so after each character,
# but never before a mark that belongs to it (a kana's voicing mark in NFD text, "か" + U+3099
# being "が"; a variation selector; a combining mark; a joiner).
_MARKS = ("\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u200c\u200d\u20d0-\u20ff\u302a-\u302f\u3099\u309a"
          "\ufe00-\ufe0f\ufe20-\ufe2f\U000e0100-\U000e01ef")
# (The voicing marks U+3099/U+309A are no character of their own here: a run of them after one
# kana is read once, not again from each of them.)
_WORD_END = re.compile(r"\S(?=\s|$)|[\u3040-\u3098\u309b-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]"
                       "[" + _MARKS + "]*(?=[^\\s" + _MARKS + "])")
# how far a span is widened to reach a sentence boundary (a longer sentence is cut at a word)
SENTENCE_REACH = 400


def sentence_span(text: str, start: int, end: int, reach: int = SENTENCE_REACH) -> tuple[int, int]:
    """``[start, end)`` widened to whole sentences of ``text``: back to the start of the
    sentence holding ``start`` and on to the end of the one holding ``end - 1`` (a sentence
    ends at ``.``, ``!``, ``?`` or ``…`` (with closing quotes or brackets) before whitespace,
    at a Chinese or Japanese full stop, or at a line break). When no boundary lies within ``reach`` characters, the span is
    widened to whole words instead. Leading and trailing whitespace is left out."""
    lo = max(0, start - reach)
    ends = [m.end() for m in _SENTENCE_END.finditer(text, lo, start)]
    if ends:
        new_start = ends[-1]
    elif lo == 0:
        new_start = 0
    else:
        new_start = start
        while new_start > lo and not text[new_start - 1].isspace():
            new_start -= 1
    while end > new_start and text[end - 1].isspace():
        end -= 1
    hi = min(len(text), end + reach)
    base = max(new_start, end - 1)
    window = text[base:hi]
    m = _SENTENCE_END.search(window)
    if m is not None and (m.end() < len(window) or hi == len(text)):
        new_end = base + m.end()
    elif hi == len(text):
        new_end = len(text)
    else:
        w = _WORD_END.search(text, base, hi)
        new_end = w.end() if w is not None else end
    new_end = max(new_end, end)
    while new_start < new_end and text[new_start].isspace():
        new_start += 1
    while new_end > new_start and text[new_end - 1].isspace():
        new_end -= 1
    return new_start, new_end


class _Layout:
    """The passages admitted so far, and the text they render to."""

    def __init__(self, count: Callable[[str], int]) -> None:
        self.count = count
        self.texts: dict[str, str | None] = {}
        # admitted[key] = sorted disjoint [start, end, ids]; content-only hits use key "\0" + docno
        self.admitted: dict[str, list[list[Any]]] = {}
        self.order: dict[str, int] = {}  # document order: a key's earliest memory's docno
        self.nodes: dict[str, Node] = {}
        self.cut: dict[str, str] = {}  # key -> text appended to a passage cut within a sentence
        # Each key's rendered blocks, kept so that an offer renders only the spans of its own
        # key, not the whole context again (which made recall_context quadratic in top_k):
        # key -> {(start, end, ids): (block, words)}, and the sums of chars, words and blocks
        # over all keys, enough to give estimate_tokens of the whole text (the separator is
        # whitespace, so words and characters add up exactly) without building it.
        self.blocks: dict[str, dict[tuple[int, int, tuple[str, ...]], tuple[str, int]]] = {}
        self.key_sums: dict[str, tuple[int, int, int]] = {}
        self.sums = (0, 0, 0)

    def offer(self, key: str, start: int, end: int, hit: Hit, budget: int) -> None:
        """Admit ``hit``'s span if the whole context still fits ``budget``; when it is the
        first span and does not fit, admit the largest piece of it that does."""
        self.nodes[hit.id] = hit.node
        spans = _merge_span(self.admitted.get(key, []), start, end, hit.id, self.texts[key] or "")
        key_order = min(self.order.get(key, hit.docno), hit.docno)
        blocks = self._blocks(key, spans)
        if self._fits(key, spans, blocks, key_order, budget):
            self._commit(key, spans, blocks, key_order)
        elif not self.admitted:
            order = dict(self.order)
            order[key] = key_order
            self._fit_first(key, start, end, hit, budget, order)

    def _blocks(self, key: str, spans: list[list[Any]]) -> dict[tuple[int, int, tuple[str, ...]], tuple[str, int]]:
        known = self.blocks.get(key, {})
        out = {}
        for start, end, ids in spans:
            span = (start, end, tuple(ids))
            block = known.get(span)
            if block is None:
                text = self._passage(key, start, end, ids).block
                block = (text, len(text.split()))
            out[span] = block
        return out

    def _fits(self, key: str, spans: list[list[Any]], blocks: dict[tuple[int, int, tuple[str, ...]], tuple[str, int]],
              key_order: int, budget: int) -> bool:
        if self.count is estimate_tokens:  # counted from the sums: the same figure as the whole text's
            chars, words, n = self.sums
            old = self.key_sums.get(key, (0, 0, 0))
            new = _block_sums(blocks)
            chars, words, n = chars - old[0] + new[0], words - old[1] + new[1], n - old[2] + new[2]
            chars += len(PASSAGE_SEPARATOR) * max(n - 1, 0)
            return max(-(-13 * words // 10), -(-chars // 4)) <= budget
        order = dict(self.order)
        order[key] = key_order
        parts: list[str] = []
        for k in sorted(set(self.admitted) | {key}, key=lambda k: (order[k], k)):
            parts.extend(b for b, _ in (blocks if k == key else self.blocks[k]).values())
        return self.count(PASSAGE_SEPARATOR.join(parts)) <= budget

    def _commit(self, key: str, spans: list[list[Any]], blocks: dict[tuple[int, int, tuple[str, ...]], tuple[str, int]],
                key_order: int) -> None:
        self.admitted[key] = spans
        self.order[key] = key_order
        self.blocks[key] = blocks
        old = self.key_sums.get(key, (0, 0, 0))
        new = self.key_sums[key] = _block_sums(blocks)
        self.sums = tuple(a - b + c for a, b, c in zip(self.sums, old, new))  # type: ignore[assignment]

    def _fit_first(self, key: str, start: int, end: int, hit: Hit, budget: int, order: dict[str, int]) -> None:
        text = self.texts[key] or ""
        quote = hit.node.quote
        at = text.find(quote, start, end) if quote else -1
        lo = sentence_span(text, at, at + 1)[0] if at >= 0 else start
        lo = max(lo, start)

        def fits(cut: int, suffix: str = "") -> bool:
            self.cut = {key: suffix} if suffix else {}
            ok = self.count(self.render({key: [[lo, cut, [hit.id]]]}, order)) <= budget
            self.cut = {}
            return ok

        # a cut ends at its last sentence, never after the blank or line breaks that follow it
        # (a line break ends a sentence too): "a.\n\nb." gives the cuts after "a." and "b."
        sentence_ends = sorted({_rstrip_at(text, lo, m.end()) for m in _SENTENCE_END.finditer(text, lo, end)} - {lo})
        if not sentence_ends or sentence_ends[-1] < end:
            sentence_ends.append(end)
        best = _last_fitting(sentence_ends, fits)
        suffix = ""
        if best is None:  # not even one sentence: whole words, marked as cut
            suffix = " \u2026"
            word_ends = [m.end() for m in _WORD_END.finditer(text, lo, sentence_ends[0])]
            best = _last_fitting(word_ends, lambda cut: fits(cut, suffix))
        if best is None:
            return
        self.cut = {key: suffix} if suffix else {}
        spans = [[lo, best, [hit.id]]]
        self._commit(key, spans, self._blocks(key, spans), order[key])

    def _date(self, ids: Sequence[str]) -> str | None:
        found = (_node_date(self.nodes[i]) for i in ids if i in self.nodes)
        dates = sorted({d for d in found if d is not None})
        if not dates:
            return None
        return dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"

    def _passage(self, key: str, start: int, end: int, ids: Sequence[str]) -> Passage:
        text = self.texts[key] or ""
        content_only = key.startswith("\x00")
        date = self._date(ids)
        label = f"memory {ids[0]}" if content_only else key
        heading = f"### {_one_line(label)}" + (f" ({date})" if date else "")
        return Passage(source="" if content_only else key, start=None if content_only else start,
                       end=None if content_only else end, text=text[start:end] + self.cut.get(key, ""),
                       ids=tuple(ids), tokens=0, date=date, heading=heading)

    def _passages(self, admitted: dict[str, list[list[Any]]], order: dict[str, int]) -> list[Passage]:
        return [self._passage(key, start, end, ids)
                for key in sorted(admitted, key=lambda k: (order[k], k)) for start, end, ids in admitted[key]]

    def render(self, admitted: dict[str, list[list[Any]]], order: dict[str, int]) -> str:
        return PASSAGE_SEPARATOR.join(p.block for p in self._passages(admitted, order))

    def passages(self) -> tuple[Passage, ...]:
        return tuple(Passage(source=p.source, start=p.start, end=p.end, text=p.text, ids=p.ids,
                             tokens=self.count(p.block), date=p.date, heading=p.heading)
                     for p in self._passages(self.admitted, self.order))


def _block_sums(blocks: dict[tuple[int, int, tuple[str, ...]], tuple[str, int]]) -> tuple[int, int, int]:
    """(characters, words, blocks) of a key's rendered blocks."""
    return sum(len(b) for b, _ in blocks.values()), sum(w for _, w in blocks.values()), len(blocks)


def _rstrip_at(text: str, lo: int, cut: int) -> int:
    """``cut`` moved back over the whitespace before it (not below ``lo``)."""
    while cut > lo and text[cut - 1].isspace():
        cut -= 1
    return cut


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _node_date(node: Node) -> str | None:
    if node.resolved_date:
        return str(node.resolved_date)
    if node.created_at:
        return _dt.datetime.fromtimestamp(node.created_at, _dt.timezone.utc).date().isoformat()
    return None


def _last_fitting(cuts: Sequence[int], fits: Callable[[int], bool]) -> int | None:
    """The largest cut that fits, by bisection (a longer piece never counts fewer tokens)."""
    best = None
    left, right = 0, len(cuts) - 1
    while left <= right:
        mid = (left + right) // 2
        if fits(cuts[mid]):
            best, left = cuts[mid], mid + 1
        else:
            right = mid - 1
    return best


def _merge_span(spans: list[list[Any]], start: int, end: int, hit_id: str, text: str) -> list[list[Any]]:
    """``spans`` (sorted, disjoint) plus [start, end), merging overlapping ones and those that
    only whitespace of ``text`` separates (adjacent sentences make one passage)."""
    out: list[list[Any]] = []
    cur: list[Any] = [start, end, [hit_id]]
    for s, e, ids in spans:
        if (e < cur[0] and text[e:cur[0]].strip()) or (s > cur[1] and text[cur[1]:s].strip()):
            out.append([s, e, list(ids)])
        else:
            cur = [min(s, cur[0]), max(e, cur[1]), list(ids) + [i for i in cur[2] if i not in ids]]
    out.append(cur)
    out.sort(key=lambda span: (span[0], span[1]))
    return out
