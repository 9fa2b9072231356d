"""A small in-memory recall over a compress result (used by ``CompressStream.recall``).

Okapi BM25 (k1 = 1.2, b = 0.75, Lucene's idf ``ln(1 + (N - df + 0.5) / (df + 0.5))``)
over each zettel's quote, topics and entities, optionally blended 0.6/0.4 with a
personalized PageRank over the tunnel graph seeded by the BM25 scores (20 iterations,
damping 0.85), so a zettel tunnelled to a direct hit can surface. ``after``/``before``
keep zettels whose ``resolved_date`` is in range (ISO prefixes compare as text). Ties
break by position, so the order is deterministic. The engine's full recall lives in
:mod:`engramdb.recall`; this one needs no file.
"""
from __future__ import annotations

import math
import re
from typing import Any

from ..errors import ValidationError
from ..records import CompressResult, Zettel

__all__ = ["recall_result"]

_WORD = re.compile(r"\w\w+")
_STOP = frozenset(
    "the a an and or but of in on at to for with is are was were be been it this that these those we you i "
    "they he she about what did do does our your their his her have has had will would can could should how "
    "when where".split()
)
_K1, _B = 1.2, 0.75
_ALPHA = 0.85
_ITERATIONS = 20


def _tokens(text: str) -> list[str]:
    return [t for t in _WORD.findall(text.lower()) if t not in _STOP]


def _date_ok(z: Zettel, after: str | None, before: str | None) -> bool:
    d = z.resolved_date
    if d is None:
        return False
    if after is not None and d[: len(after)] < after:
        return False
    if before is not None and d[: len(before)] > before:
        return False
    return True


def recall_result(result: CompressResult, query: str, *, top_k: int = 5, hops: bool = True,
                  after: str | None = None, before: str | None = None) -> list[Zettel]:
    """The ``top_k`` zettels of ``result`` that best match ``query``.

    Raises:
        ValidationError: a bad argument.
    """
    if not isinstance(query, str):
        raise ValidationError(f"query must be a str, got {type(query).__name__}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValidationError("top_k must be a non-negative integer")
    if not isinstance(hops, bool):
        raise ValidationError("hops must be True or False")
    for name, value in (("after", after), ("before", before)):
        if value is not None and not isinstance(value, str):
            raise ValidationError(f"{name} must be an ISO date string (YYYY, YYYY-MM or YYYY-MM-DD) or None")
    zettels = [z for z in result.zettels if (after is None and before is None) or _date_ok(z, after, before)]
    q = sorted(set(_tokens(query)))
    if not zettels or not q or top_k == 0:
        return []
    docs = [_tokens(" ".join([z.quote, *z.topics, *z.entities])) for z in zettels]
    n = len(docs)
    avg = sum(len(d) for d in docs) / n or 1.0
    df: dict[str, int] = {}
    for d in docs:
        for t in set(d):
            df[t] = df.get(t, 0) + 1
    scores = []
    for d in docs:
        tf: dict[str, int] = {}
        for t in d:
            tf[t] = tf.get(t, 0) + 1
        s = 0.0
        for t in q:
            f = tf.get(t, 0)
            if f:
                idf = math.log(1.0 + (n - df[t] + 0.5) / (df[t] + 0.5))
                s += idf * f * (_K1 + 1) / (f + _K1 * (1 - _B + _B * len(d) / avg))
        scores.append(s)
    top = max(scores)
    if top <= 0:
        return []
    final = [s / top for s in scores]
    if hops and result.tunnels:
        final = _blend_pagerank(zettels, result, final)
    order = sorted((i for i in range(n) if final[i] > 0), key=lambda i: (-final[i], i))
    return [zettels[i] for i in order[:top_k]]


def _blend_pagerank(zettels: list[Zettel], result: CompressResult, seed: list[float]) -> list[float]:
    n = len(zettels)
    where = {z.id: i for i, z in enumerate(zettels)}
    adj: list[list[int]] = [[] for _ in range(n)]
    for t in result.tunnels:
        a, b = where.get(t.from_id), where.get(t.to_id)
        if a is not None and b is not None:
            adj[a].append(b)
            adj[b].append(a)
    total = sum(seed)
    p = [s / total for s in seed]
    rank = list(p)
    for _ in range(_ITERATIONS):
        nxt = [(1 - _ALPHA) * pi for pi in p]
        dangling = sum(rank[i] for i in range(n) if not adj[i])
        for i in range(n):
            if adj[i]:
                share = _ALPHA * rank[i] / len(adj[i])
                for j in adj[i]:
                    nxt[j] += share
        if dangling:
            for j in range(n):
                nxt[j] += _ALPHA * dangling * p[j]
        rank = nxt
    top = max(rank)
    return [0.6 * s + 0.4 * (r / top if top > 0 else 0.0) for s, r in zip(seed, rank)]


def check_recall_options(options: dict[str, Any]) -> dict[str, Any]:
    """Reject unknown recall options early.

    Raises:
        ValidationError: an option other than top_k, hops, after, before.
    """
    unknown = sorted(set(options) - {"top_k", "hops", "after", "before"})
    if unknown:
        raise ValidationError(
            f"unknown recall option(s): {', '.join(unknown)}", hint="valid: top_k, hops, after, before"
        )
    return options
