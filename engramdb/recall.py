"""The query pipeline: expand -> BM25 -> vectors -> fuse -> boosts -> tunnel hop -> top k.

Every step is deterministic: query terms are scored in sorted order, rankings break ties
by docno, and nothing iterates a set or dict in hash order, so the same file and query
give the same hits in every process (whatever ``PYTHONHASHSEED``). The read path takes no
write lock; only ``touch=True`` writes (one batched transaction after the read).

Scoring (spec/bm25.md, "Recall"):

* ``rrf``: reciprocal rank fusion ``sum 1 / (RRF_K + rank)`` over the BM25 ranking and
  one ranking per embedding space that can embed the query (rank 1 is the best).
* multiplied by the tier boost, by ``SUPERSEDED_PENALTY`` when another memory
  supersedes this one, and by ``1 + DATE_WEIGHT * proximity`` when the query names a
  year or month near the memory's ``resolved_date``;
* plus, for memories reached by one tunnel/edge hop from the top hits, a share of the
  seeds' score by personalised PageRank (``HOP_WEIGHT``).
"""
from __future__ import annotations

import datetime as _dt
import math
import re
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .codec import decode_node, encode_node
from .errors import EngramError, ValidationError
from .index import Indexes
from .index.bm25 import top_k as _top_k
from .index.graph import personalized_pagerank
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

RRF_K = 60
TIER_BOOST = {"hot": 1.0, "warm": 0.97, "cold": 0.93, "archive": 0.85}
SUPERSEDED_PENALTY = 0.5
DATE_WEIGHT = 0.25
HOP_WEIGHT = 0.3
HOP_SEEDS = 5
HOP_PER_SEED = 8
# How many ranked candidates each retriever hands to fusion, relative to top_k.
CANDIDATES_PER_K = 8
MIN_CANDIDATES = 50
_U64 = struct.Struct(">Q")
_WORD = re.compile(r"\w+|[^\w\s]")


@dataclass(frozen=True)
class Hit:
    """One recalled memory.

    Attributes:
        id: the memory's id.
        score: the final score (higher is better).
        node: the memory.
        docno: its internal document number (the tie-break key).
        parts: with ``explain=True``, the score's parts: ``bm25`` (raw BM25), ``bm25_rank``,
            ``vector:<space>`` / ``vector_rank:<space>``, ``rrf``, ``tier``, ``superseded``,
            ``date``, ``hop``.
    """

    id: str
    score: float
    node: Node
    docno: int
    parts: dict[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the node without its embeddings)."""
        node = self.node.to_dict()
        node.pop("embeddings", None)
        out: dict[str, Any] = {"id": self.id, "score": self.score, "node": node}
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
    raise ValidationError(f"{name} must be a timestamp, a date or a datetime")


def _str_set(value: Any, name: str, allowed: Sequence[str] | None = None) -> tuple[str, ...] | None:
    if value is None:
        return None
    items = (value,) if isinstance(value, str) else tuple(value)
    for item in items:
        if not isinstance(item, str):
            raise ValidationError(f"{name} must be strings")
        if allowed is not None and item not in allowed:
            raise ValidationError(f"unknown {name[:-1]} {item!r}; expected one of {', '.join(allowed)}")
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


def _load(txn: Any, docno: int, cache: dict[int, Node | None]) -> Node | None:
    if docno not in cache:
        raw = txn.get("nodes", _U64.pack(docno))
        cache[docno] = None if raw is None else decode_node(raw)
    return cache[docno]


def _rank(docnos: np.ndarray, scores: np.ndarray, limit: int) -> list[tuple[int, float]]:
    docnos, scores = _top_k(docnos, scores, limit)
    return [(int(d), float(s)) for d, s in zip(docnos, scores)]


def _date_bonus(node: Node, dates: Sequence[QueryDate]) -> float:
    nd = parse_date(node.resolved_date)
    if nd is None or not dates:
        return 0.0
    return max(q.proximity(nd) for q in dates)


def recall(store: Any, indexes: Indexes, query: str, *, top_k: int = 5, hops: bool = True,
           expand_query: bool = True, after: Any = None, before: Any = None, tiers: Any = None,
           tags: Any = None, flags: Any = None, explain: bool = False, touch: bool = False,
           now: float | None = None) -> list[Hit]:
    """The memories that best answer ``query``.

    Args:
        store: the open :class:`~engramdb.store.Store`.
        indexes: its :class:`~engramdb.index.Indexes`.
        query: free text.
        top_k: how many hits to return.
        hops: add memories one edge/tunnel hop from the top hits.
        expand_query: add synonyms of the query words (weight 0.4) and date proximity.
        after, before: keep memories created at/after ``after`` and before ``before``
            (timestamps, dates or datetimes).
        tiers, tags, flags: keep memories in one of these tiers / with one of these tags /
            one of these flags.
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
        raise ValidationError("the query must be a string")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValidationError("top_k must be a non-negative integer")
    keep = _Filter(after, before, tiers, tags, flags)
    if top_k == 0:
        return []
    terms = indexes.tokenizer(query)
    weights = _expander(indexes).expand(terms) if expand_query else {t: float(c) for t, c in _counts(terms)}
    dates = query_dates(query) if expand_query else []
    limit = max(MIN_CANDIDATES, CANDIDATES_PER_K * top_k)
    filtering = any(v is not None for v in (keep.after, keep.before, keep.tiers, keep.tags, keep.flags))
    with store.read() as txn:
        cache: dict[int, Node | None] = {}
        bm_docs, bm_scores = indexes.bm25.scores(txn, weights) if weights else (np.zeros(0, np.uint64), np.zeros(0))
        rankings: list[tuple[str, list[tuple[int, float]]]] = []
        if filtering and bm_docs.size:
            ok = np.fromiter((_passes(txn, int(d), cache, keep) for d in bm_docs), dtype=bool, count=bm_docs.size)
            bm_docs, bm_scores = bm_docs[ok], bm_scores[ok]
        rankings.append(("bm25", _rank(bm_docs, bm_scores, limit)))
        for name, space in sorted(indexes.vectors.spaces(txn).items()):
            if indexes.vectors.count(txn, name) == 0:
                continue
            qvec = indexes.vectors.embed_query(txn, name, query)
            if qvec is None:
                continue
            v_docs, v_scores = indexes.vectors.scores(txn, name, qvec)
            positive = v_scores > 0  # no similarity at all is no evidence
            v_docs, v_scores = v_docs[positive], v_scores[positive]
            if filtering and v_docs.size:
                ok = np.fromiter((_passes(txn, int(d), cache, keep) for d in v_docs), dtype=bool, count=v_docs.size)
                v_docs, v_scores = v_docs[ok], v_scores[ok]
            rankings.append((f"vector:{name}", _rank(v_docs, v_scores, limit)))
        hits = _fuse_and_boost(txn, indexes, rankings, dates, keep, cache, top_k, hops, explain)
    if touch and hits and not store.readonly:
        hits = _touch(store, hits, now_ts(now))
    return hits


def _counts(terms: Sequence[str]) -> list[tuple[str, int]]:
    out: dict[str, int] = {}
    for t in terms:
        out[t] = out.get(t, 0) + 1
    return sorted(out.items())


def _passes(txn: Any, docno: int, cache: dict[int, Node | None], keep: _Filter) -> bool:
    node = _load(txn, docno, cache)
    return node is not None and keep(node)


def _fuse_and_boost(txn: Any, indexes: Indexes, rankings: Sequence[tuple[str, list[tuple[int, float]]]],
                    dates: Sequence[QueryDate], keep: _Filter, cache: dict[int, Node | None], top_k: int,
                    hops: bool, explain: bool) -> list[Hit]:
    parts: dict[int, dict[str, float]] = {}
    fused: dict[int, float] = {}
    for name, ranking in rankings:
        for rank, (docno, score) in enumerate(ranking, start=1):
            fused[docno] = fused.get(docno, 0.0) + 1.0 / (RRF_K + rank)
            p = parts.setdefault(docno, {})
            p[name] = score
            p[f"{name.replace(':', '_rank:') if ':' in name else name + '_rank'}"] = float(rank)
    scored: dict[int, float] = {}
    for docno in sorted(fused):
        node = _load(txn, docno, cache)
        if node is None or not keep(node):
            continue  # deleted since the index was read, or filtered out
        scored[docno] = _boost(txn, indexes, docno, node, fused[docno], dates, parts.setdefault(docno, {}))
    if hops and scored:
        _hop(txn, indexes, scored, keep, cache, dates, parts)
    order = sorted(scored.items(), key=lambda item: (-item[1], item[0]))[:top_k]
    hits = []
    for docno, score in order:
        node = cache[docno]
        assert node is not None
        hits.append(Hit(id=node.id, score=score, node=node, docno=docno,
                        parts=dict(sorted(parts[docno].items())) if explain else None))
    return hits


def _boost(txn: Any, indexes: Indexes, docno: int, node: Node, base: float, dates: Sequence[QueryDate],
           parts: dict[str, float]) -> float:
    tier = TIER_BOOST.get(node.tier, 1.0)
    superseded = SUPERSEDED_PENALTY if indexes.graph.superseded(txn, docno) else 1.0
    date = DATE_WEIGHT * _date_bonus(node, dates)
    parts["rrf"] = parts.get("rrf", 0.0) + base
    parts["tier"] = tier
    parts["superseded"] = superseded
    parts["date"] = date
    return base * tier * superseded * (1.0 + date)


def _hop(txn: Any, indexes: Indexes, scored: dict[int, float], keep: _Filter, cache: dict[int, Node | None],
         dates: Sequence[QueryDate], parts: dict[int, dict[str, float]]) -> None:
    """Spread the top seeds' scores one hop by personalised PageRank over their edges."""
    seeds = sorted(scored.items(), key=lambda item: (-item[1], item[0]))[:HOP_SEEDS]
    neighbourhood: dict[int, dict[int, float]] = {}
    for docno, _ in seeds:
        nbrs = indexes.graph.neighbours(txn, docno)
        best = sorted(nbrs.items(), key=lambda item: (-item[1], item[0]))[:HOP_PER_SEED]
        neighbourhood[docno] = dict(sorted(best))
    nodes = sorted({d for d, _ in seeds} | {n for nb in neighbourhood.values() for n in nb})
    if len(nodes) == len(seeds):
        return
    index = {d: i for i, d in enumerate(nodes)}
    adj = np.zeros((len(nodes), len(nodes)))
    for src, nbrs in neighbourhood.items():
        for dst, w in nbrs.items():
            adj[index[src], index[dst]] += w
            adj[index[dst], index[src]] += w
    restart = np.zeros(len(nodes))
    for docno, score in seeds:
        restart[index[docno]] = score
    ppr = personalized_pagerank(adj, restart)
    mass = sum(score for _, score in seeds)
    for docno in nodes:
        if docno in scored:
            continue
        node = _load(txn, docno, cache)
        if node is None or not keep(node):
            continue
        base = HOP_WEIGHT * float(ppr[index[docno]]) * mass
        p = parts.setdefault(docno, {})
        p["hop"] = base
        scored[docno] = _boost(txn, indexes, docno, node, base, dates, p)
        p["rrf"] = 0.0


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
            out.append(Hit(id=hit.id, score=hit.score, node=node, docno=hit.docno, parts=hit.parts))
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
    ``max_tokens`` (a span that does not fit is skipped, later smaller ones may still fit),
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
        raise ValidationError("max_tokens must be a non-negative integer")
    if source is not None and not isinstance(source, str):
        raise ValidationError("source must be a string")
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
