"""Topics: YAKE-style key terms and short phrases of one chunk.

After Campos et al. 2020 ("YAKE! Keyword extraction from single documents using
multiple local features"), simplified for short chunks:

* a unigram scores ``tf * (1 + spread) * boost`` where ``spread`` is the standard
  deviation of its positions over the chunk length and ``boost`` rewards surface forms
  that mark technical terms: CamelCase x2.5, ALL-CAPS x2.0, hyphen-ated x1.8, a
  technical suffix (-tion, -ment, -ity, ...) x1.3;
* a phrase is two or three adjacent content words (never across punctuation) of four
  or more letters each; it scores the mean of its words' scores times
  ``(1 + freq) / 2``, so a repeated phrase beats its words and a one-off one does not;
* at most half of the topics are phrases, and phrases share no word (the best one
  wins); a unigram covered by a chosen phrase is
  dropped unless it scores 1.5x higher than every phrase covering it;
* speaker labels ("Alice:"), names used as a speaker label three times or more, words
  under three letters, numbers and stop words are never topics, so a chat does not
  produce "thanks alice" or "2023".

Topics are lowercase; phrases use single spaces. Ordering is score descending, then
alphabetical, and only IEEE-exact arithmetic (+, *, /, sqrt) is used, so the result is
deterministic everywhere.
"""
from __future__ import annotations

import math
import re
from functools import lru_cache
from itertools import compress, islice
from operator import and_
from collections.abc import Callable, Collection

from .normalize import tokenize

__all__ = ["BASE_STOP_WORDS", "MAX_TOPICS", "extract_topics", "speaker_names"]

MAX_TOPICS = 8
MAX_PHRASES = (MAX_TOPICS + 1) // 2

BASE_STOP_WORDS = frozenset("""
a an the and but or nor for yet so in on at to of with by from about above below between into through during
before after against among around along across behind beside besides beyond despite except following inside
like near off onto out outside over past since throughout under until up upon within without is are was were
be been being have has had do does did will would could should may might shall must can need dare ought used
able i you he she it we they me him her us them my your his its our their this that these those who which what
where when how why all any both each few more most other some such no not only same than too very just also
however therefore thus hence moreover furthermore nevertheless otherwise indeed instead meanwhile already
always often usually sometimes never here there then now well back still even new good first last own right
great little small large big high long next early old young public private real best free different important
possible sure true false yes ok okay said says say one two three much many very upon every made make
yeah really think know got get like just thing things lot going want also don't i'm it's that's can't
didn't doesn't isn't wasn't won't i've i'll i'd you're we're they're let's there's what's
use using sounds amongst whilst mrs mr miss
hey hello wow thanks thank cool awesome nice lol haha gonna wanna guess see
""".split())

_TECH_SUFFIXES = (
    "tion", "ing", "ment", "ity", "ness", "ism", "ist", "ize", "ise", "ous", "ful", "less", "able", "ible",
)
_SPEAKER_COUNT = re.compile(r"^[ \t]*(?:\[[^\]\n]*\][ \t]*)?([A-Z][a-z]{2,15}):", re.MULTILINE)
_CAMEL = re.compile(r"[A-Z][a-z]+(?:[A-Z][a-z]*)+")


def speaker_names(text: str) -> frozenset[str]:
    """Lowercase names used as a speaker label at least 3 times (``"Alice:"``)."""
    counts: dict[str, int] = {}
    for name in _SPEAKER_COUNT.findall(text):
        key = name.lower()
        counts[key] = counts.get(key, 0) + 1
    return frozenset(k for k, c in counts.items() if c >= 3)


class _Memo(dict[str, bool]):
    """A dict that computes missing entries with ``fn`` (``map(memo.__getitem__, ...)``
    then stays in C for every token seen before)."""

    def __init__(self, fn: Callable[[str], bool]) -> None:
        super().__init__()
        self.fn = fn

    def __missing__(self, key: str) -> bool:
        if len(self) > _MEMO_MAX:
            self.clear()  # bounded: a long-lived process sees an open vocabulary
        value = self[key] = self.fn(key)
        return value


_MEMO_MAX = 200_000
# a phrase word needs four letters besides hyphens
_LONG_ENOUGH = _Memo(lambda t: len(t.replace("-", "")) >= 4)
_CONTENT_MEMOS: dict[tuple[frozenset[str], frozenset[str]], _Memo] = {}


def _content_memo(stop_words: frozenset[str], speakers: frozenset[str]) -> _Memo:
    key = (stop_words, speakers)
    memo = _CONTENT_MEMOS.get(key)
    if memo is None:
        if len(_CONTENT_MEMOS) > 64:
            _CONTENT_MEMOS.clear()
        memo = _CONTENT_MEMOS[key] = _Memo(
            lambda t: len(t) >= 3 and t[0].isalpha() and t not in stop_words and t not in speakers
        )
    return memo


@lru_cache(maxsize=1 << 16)
def _boost(raw: str) -> float:
    if len(raw) >= 2 and raw.isupper():
        return 2.0
    if _CAMEL.fullmatch(raw):
        return 2.5
    if "-" in raw and all(len(p) > 1 for p in raw.split("-")):
        return 1.8
    if len(raw) > 6 and raw.lower().endswith(_TECH_SUFFIXES):
        return 1.3
    return 1.0


def extract_topics(
    text: str,
    stop_words: Collection[str] = BASE_STOP_WORDS,
    speakers: Collection[str] = frozenset(),
    max_topics: int = MAX_TOPICS,
    tokens: tuple[list[str], list[str]] | None = None,
) -> list[str]:
    """Up to ``max_topics`` key terms of ``text`` (see the module docstring).

    ``stop_words`` and ``speakers`` are lowercase; ``tokens`` is
    :func:`.normalize.tokenize` of ``text`` when the caller has it already.
    """
    raw, lowers = tokenize(text) if tokens is None else tokens
    n = len(raw)
    if n == 0:
        return []

    ok = _content_memo(frozenset(stop_words), frozenset(speakers))
    content = list(map(ok.__getitem__, lowers))
    # a speaker label ("Alice:") is not a topic, nor is a parenthesized timestamp
    # "(1:56 pm on 8 May, 2023)": digits never qualify, "pm"/"on"/"may" are stop words
    i = 0
    while True:
        try:
            i = lowers.index(":", i + 1)
        except ValueError:
            break
        if content[i - 1] and raw[i - 1][0].isupper():
            content[i - 1] = False
    positions: dict[str, list[int]] = {}
    first_raw: dict[str, str] = {}
    for i in compress(range(n), content):
        t = lowers[i]
        if t in positions:
            positions[t].append(i)
        else:
            positions[t] = [i]
            first_raw[t] = raw[i]
    if not positions:
        return []

    scores: dict[str, float] = {}
    for t, pos in positions.items():
        k = len(pos)
        spread = 0.0
        if k > 1:
            mean = sum(pos) / k
            var = sum((p - mean) * (p - mean) for p in pos) / k
            spread = math.sqrt(var) / n
        scores[t] = (k / n) * (1.0 + spread) * _boost(first_raw[t])

    phrase_freq: dict[str, int] = {}  # display -> frequency
    phrase_words: dict[str, tuple[str, ...]] = {}  # display -> its words
    long_enough = _LONG_ENOUGH
    for i in compress(range(n - 1), map(and_, content, islice(content, 1, None))):
        a, b = lowers[i], lowers[i + 1]
        if a == b or not long_enough[a] or not long_enough[b]:
            continue
        key = a + " " + b
        freq = phrase_freq.get(key)
        if freq is None:
            phrase_freq[key] = 1
            phrase_words[key] = (a, b)
        else:
            phrase_freq[key] = freq + 1
        if i + 2 < n and content[i + 2]:
            c = lowers[i + 2]
            if c != b and c != a and long_enough[c]:
                key3 = key + " " + c
                freq = phrase_freq.get(key3)
                if freq is None:
                    phrase_freq[key3] = 1
                    phrase_words[key3] = (a, b, c)
                else:
                    phrase_freq[key3] = freq + 1

    # (-score, display) tuples sort natively: best first, then alphabetical
    candidates = []
    for display, freq in phrase_freq.items():
        words = phrase_words[display]
        total = scores[words[0]] + scores[words[1]]
        if len(words) == 3:
            total += scores[words[2]]
        candidates.append((-(total / len(words) * (1 + freq) / 2), display, words))
    candidates.sort()
    ranked_phrases = []
    taken: set[str] = set()
    for neg, display, words in candidates:
        # one phrase per word: "connection pool" excludes "connection pool sizing"
        if taken.isdisjoint(words):
            ranked_phrases.append((neg, display, words))
            taken.update(words)
            if len(ranked_phrases) == MAX_PHRASES:
                break
    covering: dict[str, float] = {}
    for neg, _, words in ranked_phrases:
        for w in words:
            covering[w] = max(covering.get(w, 0.0), -neg)
    unigrams = [(-sc, t) for t, sc in scores.items() if t not in covering or sc > covering[t] * 1.5]
    unigrams.sort()
    merged = [(neg, d) for neg, d, _ in ranked_phrases] + unigrams[: max_topics - len(ranked_phrases)]
    merged.sort()
    return [d for _, d in merged[:max_topics]]
