"""Quote selection: the most information-dense sentence of a chunk.

Each sentence scores ``0.5 * centrality + 0.5 * density`` where

* ``centrality`` is its TextRank score (Mihalcea & Tarau 2004: word-overlap Jaccard
  graph, damping 0.85, 10 power iterations), scaled so the best sentence has 1;
* ``density`` rewards decision words (``3 * share + 0.4 * count``), a readable length
  (10-25 words +0.2, under 5 words -0.3, over 40 words -0.1), vocabulary variety
  (``0.3 * unique/total``) and the first or last position (+0.1); a fragment (a
  sentence starting in lowercase when others start in uppercase: the chunk was cut
  mid-sentence) loses 1.0, so it is quoted only when nothing else is there.

Chat text is often lowercase and unpunctuated, so when the capital-letter sentence
split finds a single sentence the chunk is split by lines, then by bare ``.!?``.
The best sentence is returned with its whitespace collapsed to single spaces. Ties keep
the earlier sentence; only IEEE-exact arithmetic is used.
"""
from __future__ import annotations

import re
from operator import mul
from collections.abc import Collection

from .entities import UPPER_CLASS
from .zc import sentence_length_bonus

__all__ = ["select_quote", "split_sentences"]

DECISION_WORDS = frozenset({
    "decided", "chose", "choose", "will", "must", "committed", "resolved", "determined", "agreed",
    "concluded", "going", "plan", "intend", "shall",
})
_DAMPING = 0.85
MAX_TEXTRANK_SENTENCES = 48
_ITERATIONS = 10
_SPLIT = re.compile(rf"(?<=[.!?])[\"'\u201d\u2019)\]]*\s+(?=[{UPPER_CLASS}\"'\u201c\u2018(\[])")
_ABBREV = re.compile(r"(?:\b(?:Mr|Mrs|Ms|Dr|Prof|Sr|Jr|St|vs|etc|e\.g|i\.e|No|Vol|Fig)|\b[A-Z]{1,2})\.$")
_BARE_SPLIT = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"[a-z]+")


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` (stripped), with chat-friendly fallbacks."""
    parts: list[str] = []
    for part in _SPLIT.split(text):
        # "Mr. Darcy" and "J. Smith" end in a period but do not end a sentence
        if parts and _ABBREV.search(parts[-1], max(0, len(parts[-1]) - 8)):
            parts[-1] = parts[-1] + " " + part
        else:
            parts.append(part)
    if len(parts) <= 1:
        by_line = [s for s in (x.strip() for x in text.split("\n")) if len(s) > 10]
        if len(by_line) > 1:
            parts = by_line
        else:
            by_punct = [s for s in _BARE_SPLIT.split(text) if len(s.strip()) > 10]
            if len(by_punct) > 1:
                parts = by_punct
    out = [p.strip() for p in parts if p.strip()]
    return out or [text.strip()]


def _textrank(word_sets: list[set[str]]) -> list[float]:
    n = len(word_sets)
    if n <= 2 or n > MAX_TEXTRANK_SENTENCES:
        # one or two sentences always rank equal; past the cap (a list of one-liners,
        # quadratic to rank) centrality is left out and density alone decides
        return [1.0] * n
    sim = [[0.0] * n for _ in range(n)]
    for i in range(n):
        a = word_sets[i]
        for j in range(i + 1, n):
            b = word_sets[j]
            inter = len(a & b)
            if inter:
                sim[i][j] = sim[j][i] = inter / (len(a) + len(b) - inter)
    # column i of the row-normalized matrix: how sentence j votes for i
    normed = []
    for row in sim:
        total = sum(row)
        normed.append([v / total for v in row] if total > 0 else row)
    cols = list(zip(*normed))
    scores = [1.0 / n] * n
    base = (1.0 - _DAMPING) / n
    for _ in range(_ITERATIONS):
        scores = [base + _DAMPING * sum(map(mul, col, scores)) for col in cols]
    top = max(scores)
    return [s / top for s in scores] if top > 0 else scores


def select_quote(text: str, vocab: Collection[str] | None = None) -> str:
    """The key sentence of ``text`` (see the module docstring).

    ``vocab`` may hold the lowercase words of ``text`` (or of a text containing it); it
    only lets a chunk without decision words skip counting them.
    """
    trimmed = text.strip()
    if len(trimmed.split()) < 5:
        return " ".join(trimmed[:120].split())
    sentences = split_sentences(trimmed)
    if len(sentences) == 1:
        return " ".join(sentences[0].split())
    lowered = [s.lower() for s in sentences]
    lower_words = [s.split() for s in lowered]
    word_sets = [set(ws) for ws in lower_words]
    centrality = _textrank(word_sets)
    best, best_score = 0, float("-inf")
    last = len(sentences) - 1
    is_decision = DECISION_WORDS.__contains__
    # most chunks have no decision word at all: then no sentence needs counting
    if vocab is None:
        vocab = _WORD.findall(" ".join(lowered))
    any_decision = not DECISION_WORDS.isdisjoint(vocab)
    # a sentence starting in lowercase among capitalized ones is a fragment (a chunk cut
    # mid-sentence); in all-lowercase chat text nobody is penalized
    starts_lower = [s[0].islower() for s in sentences]
    mixed = any(starts_lower) and not all(starts_lower)
    for i, words in enumerate(lower_words):
        count = len(words)
        decisions = sum(map(is_decision, _WORD.findall(lowered[i]))) if any_decision else 0
        density = (
            (decisions / count if count else 0.0) * 3.0
            + decisions * 0.4
            + sentence_length_bonus(count)
            + (len(word_sets[i]) / count if count else 0.0) * 0.3
            + (0.1 if i == 0 or i == last else 0.0)
            - (1.0 if mixed and starts_lower[i] else 0.0)
        )
        score = 0.5 * centrality[i] + 0.5 * density
        if score > best_score:
            best, best_score = i, score
    return " ".join(sentences[best].split())
