"""Flags and emotions: word-boundary lexicons with negation scope.

A chunk is tokenized once (:func:`.normalize.tokenize`: lowercase words with inner
``'``/``-`` kept, punctuation as separate tokens). A keyword (one or more words) matches on whole tokens, so
"api" never fires inside "rapid". A match is *negated* when one of the up to
:data:`NEGATION_WINDOW` words before it, inside the same clause, is a negator ("not",
"never", "no", any "...n't", "without", "failed", ...): "we never decided" does not
flag DECISION, while "No, we decided" does (the comma closes the scope). A category
fires when at least one of its matches is not negated.

TECHNICAL is metadata: it names a subject rather than a claim, so negation does not
apply to it ("we don't use a database" is still technical), and it never changes the
weight (see :mod:`.weights`).
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice

from ..records import ALL_EMOTIONS, ALL_FLAGS
from .normalize import tokenize

__all__ = [
    "DECISION_WORDS",
    "EMOTION_KEYWORDS",
    "FLAG_KEYWORDS",
    "NEGATION_WINDOW",
    "Signals",
    "detect",
    "detect_emotions",
    "detect_flags",
]

FLAG_KEYWORDS: dict[str, tuple[str, ...]] = {
    # bare "agreed" and "resolved" are left out: social filler / "bug resolved"
    "DECISION": ("decided", "decide to", "chose", "chosen", "committed to", "concluded", "agreed to",
                 "going to", "will do", "must do", "we will", "we'll", "final decision", "settled on",
                 "made the call", "opted for"),
    "ORIGIN": ("founded", "originated", "first time ever", "inception", "birth of", "how it began",
               "where it started", "it all started", "it all began"),
    "CORE": ("fundamental", "essential", "key principle", "foundation of", "bedrock", "non-negotiable",
             "must always", "core value", "core values", "at the heart of"),
    "PIVOT": ("turning point", "breakthrough", "changed everything", "transformed", "pivotal",
              "game changer", "everything changed", "changed my mind", "pivoted"),
    "GENESIS": ("led to", "resulted in", "because of this", "gave rise to", "origin of", "which caused",
                "set in motion", "gives rise to", "give rise to"),
    "TECHNICAL": ("architecture", "implement", "implemented", "implementing", "implementation", "deploy",
                  "deployed", "deployment", "config", "configuration", "database", "databases", "module",
                  "modules", "infrastructure", "stack", "endpoint", "endpoints", "schema", "schemas",
                  "refactor", "refactored", "latency", "throughput"),
}

EMOTION_KEYWORDS: dict[str, tuple[str, ...]] = {
    "conviction": ("decided", "committed", "certain", "determined", "firm", "unwavering", "convinced"),
    "grief": ("lost", "sad", "mourning", "grief", "heartbroken", "devastated", "loss of", "grieving"),
    "joy": ("happy", "excited", "wonderful", "delighted", "elated", "thrilled", "joyful", "glad", "joy"),
    "fear": ("afraid", "worried", "scared", "terrified", "dread", "panic", "fearful", "terror", "fear"),
    "hope": ("hope", "hoping", "optimistic", "looking forward to", "aspire", "hopeful", "bright future"),
    "trust": ("trust", "rely on", "depend on", "confident in", "faith in", "assured", "reliable"),
    "wonder": ("incredible", "fascinating", "curious", "astonishing", "remarkable", "awe-inspiring"),
    "rage": ("angry", "furious", "hate", "outraged", "enraged", "livid", "infuriated", "seething"),
    "exhaustion": ("burnt out", "burned out", "overwhelmed", "drained", "exhausted", "depleted", "weary",
                   "burnout"),
    "shame": ("ashamed", "embarrassed", "humiliated", "mortified", "disgraced", "shameful"),
    "pride": ("proud", "accomplished", "achieved", "succeeded", "triumphant", "excellence"),
    "nostalgia": ("used to", "back then", "childhood", "memories", "once upon", "years ago", "miss the old",
                  "nostalgic"),
    "anxiety": ("anxious", "nervous", "uneasy", "restless", "apprehensive", "on edge", "stressed out",
                "anxiety"),
    "relief": ("relieved", "at last", "thankfully", "unburdened", "weight off", "relief"),
    "anticipation": ("upcoming", "looking forward to", "preparing for", "expecting", "anticipate",
                     "can't wait", "cant wait"),
    "frustration": ("frustrated", "annoyed", "irritated", "stuck on", "blocked by", "impossible to",
                    "pointless", "frustrating"),
    "gratitude": ("grateful", "thankful", "appreciate", "indebted", "gratitude"),
    "loneliness": ("lonely", "no one", "by myself", "disconnected", "abandoned", "solitude"),
    "inspiration": ("inspired", "motivated", "energized", "ignited", "driven", "passionate", "creative"),
    "confusion": ("confused", "unsure", "uncertain", "puzzled", "baffled", "don't understand"),
    "clarity": ("now i see", "makes sense now", "enlightened", "suddenly understood", "clicked for me"),
    "guilt": ("guilty", "regret", "should have", "shouldn't have", "my fault", "blame myself", "remorse"),
    "awe": ("awe", "breathtaking", "profound", "transcendent", "majestic", "overwhelming beauty"),
    "regret": ("wish i had", "if only", "missed opportunity", "looking back", "could've done",
               "should have done", "regretted"),
    "determination": ("will not stop", "never give up", "keep going", "persist", "push through",
                      "no matter what"),
    "vulnerability": ("vulnerable", "raw emotion", "open up", "honest about", "admit that", "being real"),
    "acceptance": ("at peace", "moved on", "let go", "embrace", "okay with", "come to terms"),
    "resistance": ("resist", "refuse to", "oppose", "push back", "disagree", "won't do"),
    "love": ("love", "adore", "cherish", "devoted", "affection", "warmth", "care deeply", "deeply care"),
    "loss": ("passed away", "over now", "no more", "goodbye forever", "farewell", "we lost them"),
}

DECISION_WORDS = frozenset({"decided", "chose", "committed", "resolved", "must", "will", "determined"})

NEGATORS = frozenset({
    "not", "no", "never", "neither", "nor", "hardly", "barely", "scarcely", "without", "unable",
    "failed", "refused", "denied", "cannot", "nobody", "nothing", "none", "avoided", "lack", "lacked",
})
# words that end a negation's scope like punctuation does ("not X but decided")
SCOPE_BREAKS = frozenset({".", "!", "?", ";", ":", ",", "but", "however", "although", "though", "yet"})
NEGATION_WINDOW = 6

# TECHNICAL names a subject, not a claim: "we don't use a database" is still technical
_NEGATION_EXEMPT = frozenset({"TECHNICAL"})
# punctuation tokens, for word counts (a set lookup per token stays in C via map)
_PUNCTUATION = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^`{|}~\u2018\u2019\u201c\u201d\u2013\u2014\u2026\u00ab\u00bb")

assert set(FLAG_KEYWORDS) == set(ALL_FLAGS) and set(EMOTION_KEYWORDS) == set(ALL_EMOTIONS)


def _phrase_tokens(phrase: str) -> tuple[str, ...]:
    return tuple(tokenize(phrase)[1])


def _build() -> tuple[dict[str, list[str]], dict[tuple[str, str], list[tuple[tuple[str, ...], str]]]]:
    """Single-word keywords by word; longer ones by their first two words."""
    single: dict[str, list[str]] = {}
    multi: dict[tuple[str, str], list[tuple[tuple[str, ...], str]]] = {}
    for table in (FLAG_KEYWORDS, EMOTION_KEYWORDS):
        for category, phrases in table.items():
            for phrase in phrases:
                toks = _phrase_tokens(phrase)
                if len(toks) == 1:
                    single.setdefault(toks[0], []).append(category)
                else:
                    multi.setdefault((toks[0], toks[1]), []).append((toks, category))
    return single, multi


_SINGLE, _MULTI = _build()
_MULTI_FIRST = frozenset(a for a, _ in _MULTI)


def _negated(tokens: list[str], i: int) -> bool:
    seen = 0
    k = i - 1
    while k >= 0 and seen < NEGATION_WINDOW:
        t = tokens[k]
        if t in SCOPE_BREAKS:
            return False
        k -= 1
        if not t[0].isalnum():
            continue  # quotes, dashes, brackets: no word, no scope break
        if t in NEGATORS or t.endswith("n't"):
            return True
        if t == "free" and k + 2 < i and tokens[k + 2] == "from":
            return True
        seen += 1
    return False


@dataclass(frozen=True)
class Signals:
    """What one chunk signals: flags and emotions (canonical order) and decision words."""

    flags: tuple[str, ...]
    emotions: tuple[str, ...]
    decision_count: int
    word_count: int


def _occurrences(tokens: list[str], word: str) -> Iterator[int]:
    i = -1
    while True:  # list.index scans in C; only real occurrences reach Python
        try:
            i = tokens.index(word, i + 1)
        except ValueError:
            return
        yield i


def _admit(tokens: list[str], i: int, categories: list[str], found: set[str]) -> None:
    negated: bool | None = None
    for category in categories:
        if category in found:
            continue
        if category in _NEGATION_EXEMPT:
            found.add(category)
            continue
        if negated is None:
            negated = _negated(tokens, i)
        if not negated:
            found.add(category)


def _match(tokens: list[str], vocab: set[str] | frozenset[str], found: set[str]) -> None:
    for word in sorted(_SINGLE.keys() & vocab):
        categories = _SINGLE[word]
        for i in _occurrences(tokens, word):
            if all(c in found for c in categories):
                break
            _admit(tokens, i, categories, found)
    if _MULTI_FIRST.isdisjoint(vocab):
        return
    n = len(tokens)
    for pair in sorted(_MULTI.keys() & set(zip(tokens, islice(tokens, 1, None)))):
        entries = _MULTI[pair]
        for i in _occurrences(tokens, pair[0]):
            if all(c in found for _, c in entries):
                break
            for phrase, category in entries:
                k = len(phrase)
                if category not in found and i + k <= n and tuple(tokens[i:i + k]) == phrase:
                    _admit(tokens, i, [category], found)


def detect(text: str, tokens: list[str] | None = None, vocab: set[str] | None = None) -> Signals:
    """Flags, emotions and decision-word counts of ``text`` in one pass.

    ``tokens`` are the lowercase tokens of ``text`` and ``vocab`` their set, when the
    caller has them already.
    """
    if tokens is None:
        tokens = tokenize(text)[1]
    if vocab is None:
        vocab = set(tokens)
    found: set[str] = set()
    _match(tokens, vocab, found)
    return Signals(
        flags=tuple(f for f in ALL_FLAGS if f in found),
        emotions=tuple(e for e in ALL_EMOTIONS if e in found),
        decision_count=sum(tokens.count(w) for w in DECISION_WORDS.intersection(vocab)),
        word_count=len(tokens) - sum(map(_PUNCTUATION.__contains__, tokens)),
    )


def detect_flags(text: str) -> list[str]:
    """The flags of ``text`` in :data:`ALL_FLAGS` order."""
    return list(detect(text).flags)


def detect_emotions(text: str) -> list[str]:
    """The emotions of ``text`` in :data:`ALL_EMOTIONS` order."""
    return list(detect(text).emotions)
