"""Query-side recall features: what a question says about the memories that answer it.

Recall (:mod:`engramdb.recall`) ranks by text match (BM25, vectors, the hop). The features
here read the question once and then adjust the fused ranking with fields the memories
carry (spec/recall.md, section 6, "Query features"):

* **speaker** -- a memory said by someone (``metadata["speaker"]``, a string) is boosted
  when the question names that speaker: "What did Caroline research?" prefers what
  Caroline said over what others said to her.
* **source** -- memories that come from one source (``node.source``: a document, a chat
  session) are scored together first: a memory gains by the share of the question that
  its source's matching memories cover between them, so a turn of the session that is
  about the question beats an equally good match from a session that is not.
* **time** -- a question that asks about time ("when", "how long", "what year") boosts
  the memories whose text mentions a time ("yesterday", "last week", "in May", "2022").

Each feature is a multiplicative factor ``1 + weight * match`` with ``match`` in [0, 1];
the factors are bounded, so fusion can still stop early (:meth:`QueryFeatures.max_boost`).
Everything is a pure function of the query, the tokenizer, the index snapshot and the
nodes, computed in sorted order: deterministic.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .records import Node

__all__ = ["SOURCE_WEIGHT", "SPEAKER_KEY", "SPEAKER_WEIGHT", "TIME_WEIGHT", "QueryFeatures",
           "mentions_time", "asks_time"]

# The metadata key that names who said a memory (a conversation turn's speaker).
SPEAKER_KEY = "speaker"
# Module settings a caller may override; one free parameter per feature (spec/recall.md, section 6).
SPEAKER_WEIGHT = 0.25
SOURCE_WEIGHT = 0.5
TIME_WEIGHT = 0.25

_WEEKDAYS = "monday|tuesday|wednesday|thursday|friday|saturday|sunday"
_MONTHS = "january|february|march|april|may|june|july|august|september|october|november|december"
_UNITS = ("day|days|week|weeks|weekend|weekends|month|months|year|years|night|morning|evening|"
          "afternoon|summer|winter|spring|fall|autumn")
_TIME_QUESTION = re.compile(
    r"\bwhen\b|\bhow long\b|\bwhat (?:year|month|date|day|time)\b|\bhow many (?:years|months|weeks|days)\b", re.I)
_TIME_MENTION = re.compile(
    r"\b(?:yesterday|today|tonight|tomorrow|ago|recently|lately)\b"
    rf"|\b(?:last|next|this|past|coming|previous|few)\s+(?:{_WEEKDAYS}|{_UNITS})\b"
    rf"|\b(?:{_MONTHS})\b|\b(?:1[89]|20)\d\d\b|\b\d{{1,2}}(?:st|nd|rd|th)\b"
    rf"|\b(?:\d+|one|two|three|four|five|six|seven|eight|nine|ten|a|several)\s+(?:{_UNITS})\b"
    rf"|\b(?:on|since|by)\s+(?:{_WEEKDAYS})\b", re.I)


def asks_time(query: str) -> bool:
    """Whether ``query`` asks about a time ("when", "how long", "what year", ...)."""
    return bool(_TIME_QUESTION.search(query))


def mentions_time(text: str) -> bool:
    """Whether ``text`` mentions a time: a relative day or period ("yesterday", "last
    week", "two years ago"), a month, a year, a day of the month ("the 15th")."""
    return bool(_TIME_MENTION.search(text))


@dataclass
class QueryFeatures:
    """What one query says, and the boosts it gives a node.

    Attributes:
        terms: the query's index terms (all of them, question words included).
        tokenizer: the file's tokenizer (speakers are matched as index terms).
        temporal: whether the query asks about a time.
        sources: per candidate docno, its source's coverage of the query (set by
            :meth:`score_sources`).
    """

    terms: frozenset[str]
    tokenizer: Callable[[str], Sequence[str]]
    temporal: bool = False
    sources: dict[int, float] = field(default_factory=dict)
    _speakers: dict[str, bool] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, query: str, tokenizer: Callable[[str], Sequence[str]]) -> QueryFeatures:
        """The features of ``query`` under ``tokenizer``."""
        return cls(terms=frozenset(tokenizer(query)), tokenizer=tokenizer, temporal=asks_time(query))

    def max_boost(self) -> float:
        """An upper bound of :meth:`boost` over all nodes (after :meth:`score_sources`):
        the time factor only for a question about time, the source factor at the best
        source's match."""
        source = max(self.sources.values(), default=0.0)
        return ((1.0 + SPEAKER_WEIGHT) * (1.0 + SOURCE_WEIGHT * source)
                * (1.0 + (TIME_WEIGHT if self.temporal else 0.0)))

    def speaker_match(self, node: Node) -> float:
        """1.0 when the query names ``node``'s speaker (all of the name's terms), else 0."""
        speaker = node.metadata.get(SPEAKER_KEY) if node.metadata else None
        if not isinstance(speaker, str) or not speaker:
            return 0.0
        hit = self._speakers.get(speaker)
        if hit is None:
            toks = self.tokenizer(speaker)
            hit = self._speakers[speaker] = bool(toks) and all(t in self.terms for t in toks)
        return 1.0 if hit else 0.0

    def time_match(self, node: Node) -> float:
        """1.0 when the query asks about a time and ``node``'s content mentions one, else 0."""
        return 1.0 if self.temporal and mentions_time(node.content) else 0.0

    def score_sources(self, node_of: Callable[[int], Node | None], coverage: Callable[[str, Sequence[int]], Any],
                      term_weights: Mapping[str, float], ceiling: float, docnos: Sequence[int]) -> None:
        """Score each candidate's source, then the candidates by it: a source covers the
        query terms any of its candidates holds, and its match is ``sum w_t * idf(t)`` over
        those terms divided by ``ceiling`` (at most 1). ``coverage(term, docnos)`` gives
        per docno ``w_t * idf(t)`` when it holds the term, else 0. A candidate without a
        source is not judged by source: it gets the best source's match (see :meth:`boost`),
        so memories with a source never gain over those without one merely for having it,
        and a store without sources ranks as if the feature did not exist."""
        self.sources = {}
        if ceiling <= 0 or not SOURCE_WEIGHT:
            return
        source_of: dict[int, str] = {}
        for d in sorted(set(docnos)):
            node = node_of(d)
            if node is not None and node.source:
                source_of[d] = node.source
        if not source_of:
            return
        ds = sorted(source_of)
        covered: dict[str, dict[str, float]] = {}  # source -> term -> w * idf
        for term in sorted(term_weights):
            for d, mass in zip(ds, [float(m) for m in coverage(term, ds)]):
                if mass > 0:
                    covered.setdefault(source_of[d], {})[term] = mass
        totals = {src: min(1.0, sum(v for _, v in sorted(terms.items())) / ceiling)
                  for src, terms in covered.items()}
        self.sources = {d: totals.get(source_of[d], 0.0) for d in ds}

    def boost(self, node: Node, parts: dict[str, Any] | None = None, docno: int | None = None) -> float:
        """The product of the features' factors for ``node`` (>= 1); with ``parts``, each
        feature's match is recorded there (``speaker``, ``source``, ``time``)."""
        speaker = self.speaker_match(node)
        source = self.sources.get(docno) if docno is not None else None
        if source is None:  # not judged by source: the best source's match
            source = max(self.sources.values(), default=0.0)
        time = self.time_match(node)
        if parts is not None:
            parts.update(speaker=speaker, source=source, time=time)
        return (1.0 + SPEAKER_WEIGHT * speaker) * (1.0 + SOURCE_WEIGHT * source) * (1.0 + TIME_WEIGHT * time)
