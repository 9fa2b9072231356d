"""Recall over a compress result, without a file: :func:`recall_result` (``engramdb.recall_result``).

It ranks zettels the way a store's recall ranks memories, on the same terms:

* the store's tokenizer (NFKC, Lucene's English stopwords, Snowball stemming), so "token"
  finds "tokens" and "rotating" finds "rotate";
* the store's query expansion: question words dropped, synonym clusters added at weight 0.4
  (:mod:`engramdb.index.synonyms`);
* Lucene's BM25 (k1 = 1.2, b = 0.75, ``idf = ln(1 + (N - df + 0.5) / (df + 0.5))``), each
  query term weighted, over each zettel's source passage (when the result carries
  ``meta["source"]``, or ``source=`` is given, and the zettel has offsets) or quote, plus
  its topics and entities, as zettel-compress indexes them;
* the store's date bonus: a score is multiplied by ``1 + DATE_WEIGHT * proximity`` when the
  query names a year or month near the zettel's ``resolved_date``.

Then, as zettel-compress does, the scores (normalized to the best) are blended 0.6/0.4 with a
personalized PageRank over the tunnel graph seeded by them (20 iterations, damping 0.85), so a
zettel tunnelled to a direct hit can surface. ``after``/``before`` keep zettels whose
``resolved_date`` is in range as zettel-compress defines it (ISO prefixes compared as text at
the bound's length, both ends inclusive); a zettel without a resolved date has no date to
compare (a compress result has no ``created_at``) and is left out when a bound is given. Ties
break by position, so the order is deterministic.
"""
from __future__ import annotations

import datetime
import math
from functools import lru_cache
from typing import Any

import numpy as np

from ..errors import ValidationError
from ..index.synonyms import DATE_WEIGHT, Expander, QueryDate, parse_date, query_dates
from ..index.tokenize import Tokenizer
from ..records import CompressResult, Zettel

__all__ = ["recall_result", "check_recall_options", "resolved_in_range"]

_K1, _B = 1.2, 0.75
_ALPHA = 0.85
_ITERATIONS = 20
_OPTIONS = ("top_k", "hops", "expand_query", "after", "before", "source", "tokenizer")


@lru_cache(maxsize=4)
def _expander(tokenizer: Tokenizer) -> Expander:
    return Expander(tokenizer)


@lru_cache(maxsize=1)
def _default_tokenizer() -> Tokenizer:
    return Tokenizer()


def resolved_in_range(resolved: str, after: str | None, before: str | None) -> bool:
    """zettel-compress's date filter: ``resolved`` (ISO text) against ISO prefixes, both
    bounds inclusive at their own precision (``after="2023-05"`` keeps ``2023-05-01``)."""
    if after is not None and resolved[: len(after)] < after:
        return False
    return not (before is not None and resolved[:len(before)] > before)


def recall_result(result: CompressResult, query: str, *, top_k: int = 5, hops: bool = True,
                  expand_query: bool = True, after: str | datetime.date | None = None,
                  before: str | datetime.date | None = None,
                  source: str | None = None, tokenizer: Tokenizer | None = None) -> list[Zettel]:
    """The ``top_k`` zettels of ``result`` that best match ``query``, best first.

    Args:
        result: a :func:`engramdb.compress` result (or a decoded AAAK document).
        query: free text.
        top_k: how many zettels to return.
        hops: blend in a personalized PageRank over the tunnels.
        expand_query: add synonyms of the query words and the date bonus.
        after, before: ISO dates (``YYYY``, ``YYYY-MM`` or ``YYYY-MM-DD``, or a ``date``) bounding
            the zettels' ``resolved_date`` (inclusive); zettels without one are left out when
            either is given. Another ISO form (a date-time, ``20230501``, ``2023-W18``) stands
            for its date, as in a store's recall (:mod:`engramdb.filters`).
        source: the source text the zettels' offsets point into, when ``result.meta`` has no
            ``"source"`` (for instance after decoding AAAK); zettel-compress's ``source`` option.
        tokenizer: the tokenizer (default: a store's default tokenizer).

    Raises:
        ValidationError: a bad argument.
    """
    if not isinstance(result, CompressResult):
        raise ValidationError(f"recall_result takes a CompressResult, got {type(result).__name__}",
                              hint="pass what engramdb.compress() or engramdb.decode() returned")
    if not isinstance(query, str):
        raise ValidationError(f"query must be a str, got {type(query).__name__}",
                              hint="pass the question as text: recall_result(result, \"what did Alice decide?\")")
    if isinstance(top_k, np.integer):  # NumPy's (pandas rows give them), as a store's recall takes them
        top_k = int(top_k)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValidationError(f"top_k must be a non-negative integer, got {top_k!r}",
                              hint="e.g. recall_result(result, query, top_k=5) (the default)")
    if not isinstance(hops, (bool, np.bool_)) or not isinstance(expand_query, (bool, np.bool_)):
        raise ValidationError(f"hops and expand_query must be True or False, got hops={hops!r}, "
                              f"expand_query={expand_query!r}", hint="pass recall_result(..., hops=False) to turn it off")
    from ..filters import _iso_bound, parse_time  # not at import: engramdb.filters imports this module

    bounds: list[str | None] = []
    for name, value in (("after", after), ("before", before)):
        # a bound the store's filters would refuse is refused here too, and one they take is
        # compared as they compare it (a datetime string or ISO basic as its date), not as raw text
        try:
            if value is not None and not isinstance(value, (str, datetime.date)):
                raise ValidationError("not a date")
            parse_time(value, name)
        except ValidationError:
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
            raise ValidationError(f"{name} must be an ISO date string (YYYY, YYYY-MM or YYYY-MM-DD), a date or None, "
                                  f"got {shown}", hint=f"e.g. {name}='2023-05-01' or {name}=datetime.date(2023, 5, 1)"
                                  ) from None
        bounds.append(None if value is None else _iso_bound(value))
    after, before = bounds
    if source is not None and not isinstance(source, str):
        raise ValidationError(f"source must be the source text (a str) or None, got {type(source).__name__}",
                              hint="pass recall_result(..., source=text) with the text that was compressed")
    if tokenizer is not None and not isinstance(tokenizer, Tokenizer):
        raise ValidationError(f"tokenizer must be an engramdb.Tokenizer, got {type(tokenizer).__name__}",
                              hint="pass recall_result(..., tokenizer=engramdb.Tokenizer(...)) or leave it out")
    tok = tokenizer or _default_tokenizer()
    bounded = after is not None or before is not None
    zettels = [z for z in result.zettels
               if not bounded or (z.resolved_date is not None and resolved_in_range(z.resolved_date, after, before))]
    if not zettels or top_k == 0:
        return []
    expander = _expander(tok)
    terms = expander.drop_question_words(tok(query))
    if not terms:
        return []
    weights = expander.expand(terms) if expand_query else _counts(terms)
    text = source if source is not None else result.meta.get("source") if isinstance(result.meta, dict) else None
    docs = [tok(" ".join([_body(z, text), *z.topics, *z.entities])) for z in zettels]
    scores = _bm25(docs, weights)
    top = max(scores)
    if top <= 0:
        return []
    final = [s / top for s in scores]
    dates = query_dates(query) if expand_query else []
    if dates:
        final = [s * (1.0 + DATE_WEIGHT * _date_bonus(z, dates)) if s > 0 else 0.0 for s, z in zip(final, zettels)]
    if hops and result.tunnels:
        final = _blend_pagerank(zettels, result, final)
    order = sorted((i for i in range(len(zettels)) if final[i] > 0), key=lambda i: (-final[i], i))
    return [zettels[i] for i in order[:top_k]]


def _counts(terms: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for t in terms:
        out[t] = out.get(t, 0.0) + 1.0
    return out


def _body(z: Zettel, text: Any) -> str:
    if (isinstance(text, str) and z.source_start is not None and z.source_end is not None
            and 0 <= z.source_start < z.source_end <= len(text)):
        return text[z.source_start:z.source_end]
    return z.quote


def _date_bonus(z: Zettel, dates: list[QueryDate]) -> float:
    nd = parse_date(z.resolved_date)
    return 0.0 if nd is None else max(q.proximity(nd) for q in dates)


def _bm25(docs: list[list[str]], weights: dict[str, float]) -> list[float]:
    n = len(docs)
    avg = sum(len(d) for d in docs) / n or 1.0
    df: dict[str, int] = {}
    for d in docs:
        for t in set(d):
            if t in weights:
                df[t] = df.get(t, 0) + 1
    idf = {t: math.log(1.0 + (n - c + 0.5) / (c + 0.5)) for t, c in df.items()}
    scores = []
    for d in docs:
        tf: dict[str, int] = {}
        for t in d:
            if t in idf:
                tf[t] = tf.get(t, 0) + 1
        norm = _K1 * (1 - _B + _B * len(d) / avg)
        scores.append(sum(weights[t] * idf[t] * f * (_K1 + 1) / (f + norm) for t, f in sorted(tf.items())))
    return scores


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
        ValidationError: an option :func:`recall_result` does not take.
    """
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise ValidationError(
            f"unknown recall option(s): {', '.join(unknown)}", hint=f"valid: {', '.join(_OPTIONS)}"
        )
    return options
