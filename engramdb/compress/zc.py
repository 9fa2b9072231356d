"""zettel-compress 1.0.0's per-chunk algorithm, ported to Python (spec/compress.md).

``compress`` runs this pipeline by default, so a text gives the zettels
zettel-compress gives (``tools/bench/parity_zettel_compress.py`` measures how close):

* chunks: paragraphs (blank-line separated, trimmed) packed greedily up to
  ``chunk_size``; the next chunk re-starts ``chunk_overlap`` characters back, snapped
  to a word start;
* entities: capitalized tokens of the chunk that the chunk itself supports as names
  (mid-sentence capital, a speaker label, never lowercase, not verb-shaped), then
  gendered pronoun coreference; codes from the first letter and two consonants;
* topics: simplified YAKE over the chunk (timestamps, speaker labels and names of
  frequent speakers removed first), up to 4 phrases and 8 terms;
* quote: TextRank blended with a decision-word score;
* flags and emotions: keyword tables (flags by substring, emotions on word
  boundaries), each with a 6-word negation window;
* weight: ``0.35`` per signal flag (max 0.9) + ``0.1`` per emotion (max 0.4) + half the
  decision-word density, rounded to 2 decimals;
* resolved date: the chunk's most specific absolute date, else a relative expression
  against the nearest preceding absolute date of the document (or the ``date``
  option), else the ``date`` option;
* tunnels: ``max(1.2 * entity Jaccard, topic-word Jaccard)`` over all pairs, or
  MinHash/LSH candidates above 500 zettels, top 3 per zettel.

Everything is deterministic: no set or dict order reaches the output (ties follow
document or insertion order, as JavaScript's stable sort does), and the hashes are
FNV-1a and a fixed mulberry32 stream. Lengths that decide chunk boundaries are counted
in UTF-16 code units, as JavaScript counts them; offsets are code points.

Three deliberate departures, each switchable (``fixes=``), are listed in
spec/compress.md section 15 with their reasons: ``decision-precision``,
``first-name-aliases`` and ``long-paragraphs``.
"""
from __future__ import annotations

import datetime as _dt
import math
import re
import unicodedata
from bisect import bisect_left
from dataclasses import dataclass
from itertools import accumulate, islice, pairwise
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from ..records import EntityIndex, Tunnel, Zettel
from .normalize import is_chat

__all__ = [
    "ALL_FIXES",
    "Chunk",
    "build_entity_index",
    "build_tunnels",
    "chunk_text",
    "compute_weight",
    "detect_emotions",
    "detect_entities",
    "detect_flags",
    "detect_speaker_names",
    "extract_topics",
    "keyword_pattern",
    "merge_first_name_aliases",
    "normalize_text",
    "precise_decision",
    "resolve_chunk_date",
    "resolve_coreferences",
    "scan_document_dates",
    "select_key_sentence",
]

#: the deliberate departures from zettel-compress 1.0.0 (spec/compress.md section 15)
ALL_FIXES = ("decision-precision", "first-name-aliases", "long-paragraphs")

# JavaScript's \s (ECMAScript WhiteSpace + LineTerminator), which Python's \s is not
_WS_CHARS = "\t\n\x0b\x0c\r \xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
            "\u2028\u2029\u202f\u205f\u3000\ufeff"
WS = "[" + _WS_CHARS + "]"
_WS_SET = frozenset(_WS_CHARS)
_WS_RUN = re.compile(WS + "+")
_WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_A = re.ASCII


def js_trim(s: str) -> str:
    """``String.prototype.trim``."""
    return s.strip(_WS_CHARS)


def js_split_ws(s: str) -> list[str]:
    """``s.split(/\\s+/)``: empty strings at the ends when ``s`` starts or ends in space."""
    return _WS_RUN.split(s)


def js_round2(x: float) -> float:
    """``Math.round(x * 100) / 100``."""
    return math.floor(x * 100 + 0.5) / 100


_MEMO_MAX = 200_000


class _Memo(dict[str, Any]):
    """A bounded memo of a pure function of one string."""

    def __init__(self, fn: Callable[[str], Any]) -> None:
        super().__init__()
        self.fn = fn

    def __missing__(self, key: str) -> Any:
        if len(self) > _MEMO_MAX:
            self.clear()
        value = self[key] = self.fn(key)
        return value


def _collation_key_uncached(s: str) -> tuple[tuple[int, str], ...]:
    # String.prototype.localeCompare (ICU root collation) on the short lowercase terms
    # compared here: punctuation sorts before digits, digits before letters, and an
    # accent only matters when nothing else differs
    key = []
    for c in unicodedata.normalize("NFD", s):
        if unicodedata.combining(c):
            continue
        key.append((2, c) if c.isalpha() else (1, c) if c.isdigit() else (0, c))
    return (*key, (-1, s))


_collation_key = _Memo(_collation_key_uncached).__getitem__


# ── normalization and chunking ────────────────────────────────────────────────


def normalize_text(text: str) -> str:
    """CRLF and CR become LF; offsets index the result."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


@dataclass(frozen=True)
class Chunk:
    """A chunk's text and its ``[start, end)`` offsets (code points) in the normalized text."""

    text: str
    start: int
    end: int


_ASTRAL = re.compile("[\U00010000-\U0010FFFF]")


class _U16:
    """Code point offset <-> UTF-16 offset (identity when the text is all BMP)."""

    def __init__(self, s: str) -> None:
        self.identity = s.isascii() or _ASTRAL.search(s) is None
        if not self.identity:
            self.pre = [0, *accumulate(2 if ord(c) > 0xFFFF else 1 for c in s)]

    def u16(self, cp: int) -> int:
        return cp if self.identity else self.pre[cp]

    def cp(self, u: int) -> int:
        if self.identity:
            return u
        lo, hi = 0, len(self.pre) - 1
        while lo < hi:  # the first code point whose UTF-16 offset is >= u
            mid = (lo + hi) // 2
            if self.pre[mid] < u:
                lo = mid + 1
            else:
                hi = mid
        return lo


def _paragraphs(s: str) -> list[tuple[int, int]]:
    paras: list[tuple[int, int]] = []
    cursor = 0
    bounds = [(m.start(), m.end()) for m in re.finditer(r"\n{2,}", s)] + [(len(s), len(s))]
    for a, b in bounds:
        start, end = cursor, a
        while start < end and s[start] in _WS_SET:
            start += 1
        while end > start and s[end - 1] in _WS_SET:
            end -= 1
        if end > start:
            paras.append((start, end))
        cursor = b
    return paras


def _overlap_start(s: str, m: _U16, prev_start: int, prev_end: int, overlap: int, next_para: int) -> int:
    if overlap <= 0:
        return next_para
    cand = max(prev_start, m.cp(m.u16(prev_end) - overlap))
    if cand == prev_start:
        return cand
    if cand > 0 and s[cand - 1] not in _WS_SET:
        while cand < prev_end and s[cand] not in _WS_SET:
            cand += 1
    while cand < prev_end and s[cand] in _WS_SET:
        cand += 1
    return cand if cand < prev_end else next_para


#: the ``long-paragraphs`` fix cuts any paragraph longer than this many chunk sizes (16,000
#: UTF-16 units by default: above Darcy's 14,071-unit letter, the longest paragraph of the
#: reference books, which zettel-compress keeps whole)
LONG_PARAGRAPH_CHUNKS = 20
_PIECE_END = re.compile(r"[.!?][\"')\]]*" + WS)


def _trimmed(s: str, start: int, end: int) -> tuple[int, int] | None:
    while start < end and s[start] in _WS_SET:
        start += 1
    while end > start and s[end - 1] in _WS_SET:
        end -= 1
    return (start, end) if end > start else None


def _cut_prose(s: str, m: _U16, start: int, end: int, size: int) -> list[tuple[int, int]]:
    """Pieces of at most ``size`` UTF-16 units: cut at the last line break in the second half
    of the window, else after the last sentence end, else at the last space, else hard."""
    out: list[tuple[int, int]] = []
    while m.u16(end) - m.u16(start) > size:
        limit = m.cp(m.u16(start) + size)
        if m.u16(limit) > m.u16(start) + size:
            limit -= 1  # an astral character straddles the window's end
        limit = max(limit, start + 1)
        floor = m.cp(m.u16(start) + size // 2)
        cut = s.rfind("\n", floor, limit)
        if cut == -1:
            for sm in _PIECE_END.finditer(s, floor, limit + 1):
                cut = sm.end() - 1
        if cut == -1:
            cut = next((k for k in range(limit - 1, floor - 1, -1) if s[k] in _WS_SET), limit)
        piece = _trimmed(s, start, cut)
        if piece:
            out.append(piece)
        rest = _trimmed(s, cut, end)
        if rest is None:
            return out
        start = rest[0]
    out.append((start, end))
    return out


def _cut_paragraph(s: str, m: _U16, start: int, end: int, size: int) -> list[tuple[int, int, bool]]:
    """The ``long-paragraphs`` fix: a paragraph over ``size`` whose lines are chat messages
    becomes one piece per message (flagged ``True``); any piece over
    ``LONG_PARAGRAPH_CHUNKS * size`` is cut into pieces of at most ``size``."""
    if m.u16(end) - m.u16(start) <= size:
        return [(start, end, False)]
    chat = is_chat(s[start:end])
    spans = [(start, end)]
    if chat:
        spans = []
        line = start
        while line < end:
            nl = s.find("\n", line, end)
            nl = end if nl == -1 else nl
            piece = _trimmed(s, line, nl)
            if piece:
                spans.append(piece)
            line = nl + 1
    out: list[tuple[int, int, bool]] = []
    for a, b in spans:
        if m.u16(b) - m.u16(a) > LONG_PARAGRAPH_CHUNKS * size:
            out.extend((x, y, chat) for x, y in _cut_prose(s, m, a, b, size))
        else:
            out.append((a, b, chat))
    return out


def _line_start(s: str, at: int, prev_end: int, next_piece: int) -> int:
    # the first line start at or after ``at`` inside the previous chunk: a chunk of a cut chat
    # opens with a message and its speaker label, never mid-message
    if at > 0 and s[at - 1] != "\n":
        nl = s.find("\n", at, prev_end)
        if nl == -1:
            return next_piece
        at = nl + 1
    while at < prev_end and s[at] in _WS_SET:
        at += 1
    return at if at < prev_end else next_piece


def chunk_text(s: str, chunk_size: int = 800, chunk_overlap: int = 100,
               cut_long: bool = False) -> list[Chunk]:
    """Pack the paragraphs of the normalized text ``s`` into chunks (``cut_long``: the
    ``long-paragraphs`` fix cuts a chat paragraph into its messages, where a chunk's overlap
    starts at a message, and any paragraph over ``LONG_PARAGRAPH_CHUNKS`` chunk sizes into
    pieces of at most ``chunk_size``)."""
    if not js_trim(s):
        return []
    m = _U16(s)
    chunks: list[Chunk] = []
    start = end = -1
    pieces: Iterable[tuple[int, int, bool]]
    if cut_long:
        pieces = [piece for a, b in _paragraphs(s) for piece in _cut_paragraph(s, m, a, b, chunk_size)]
    else:
        pieces = ((a, b, False) for a, b in _paragraphs(s))
    for p_start, p_end, message in pieces:
        if start == -1:
            start, end = p_start, p_end
            continue
        if m.u16(p_end) - m.u16(start) > chunk_size:
            chunks.append(Chunk(s[start:end], start, end))
            prev_start = start
            start = _overlap_start(s, m, start, end, chunk_overlap, p_start)
            if message and start != prev_start and start != p_start:
                start = _line_start(s, start, end, p_start)
        end = p_end
    if start != -1:
        chunks.append(Chunk(s[start:end], start, end))
    return chunks


# ── entities ──────────────────────────────────────────────────────────────────

STOP_LIST = frozenset("""
I The A An It He She They We You But And Or In On At To Of For With By From That This These Those
When Where Which Who What How Then So If As Up About After Before Because While Although Though
Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February March April May June
July August September October November December Its My Our Their His Her Your Mr Mrs Dr
Yes No Not Just Also Very All Any Some Now Here There Today Tomorrow Yesterday
CEO CTO CFO COO VP Director Manager President Founder Engineer Developer Lead Admin
User Assistant System Bot Agent Human AI
Section Chapter Part Appendix Figure Table Page Step Note Example Item List Summary Overview
Introduction Conclusion Paragraph II III IV VI VII VIII IX XI XII
Prof Sir Dame Lord Lady Madam Miss Ms
Please Thanks Thank Sorry Hello Hi Hey Okay OK Sure Done Ready Maybe Perhaps Actually Basically
Honestly Anyway Alright Welcome Finally Meanwhile Overall Instead Otherwise However Therefore Thus Hence
Moreover Furthermore Additionally First Second Third Fourth Fifth Sixth Seventh Eighth Ninth Tenth
Each Every Both Phase Last Once Again Currently Recently Previously Originally Eventually Generally
Specifically Typically Unfortunately Fortunately Let Lets
Added Removed Fixed Updated Changed Created Deleted Moved Renamed Bumped Pushed Pulled Merged Committed
Deployed Released Tested Ran Used Applied Advised Asked Agreed Decided Started Finished Completed
Implemented Refactored Reviewed Wrote Built Made Did Said Got Went Saw Took Came Found Sent Told
Gave Thought Knew Check Run Use Try Make Add Fix Update Remove Install Open Close Start Stop
Keep Look See Go Think Consider Ensure Remember
""".split())

_EDGE_NONWORD = re.compile(r"^[^\w]+|[^\w]+$", _A)
_MID_PREV = frozenset("abcdefghijklmnopqrstuvwxyz0123456789,;)")


def _is_word(s: str, i: int) -> bool:
    return 0 <= i < len(s) and s[i] in _WORD_CHARS


_NON_WS_RUN = re.compile("[^" + _WS_CHARS + "]+")
_UPPER = re.compile("[A-Z]")
_LOWER_WORD_START = re.compile("(?<![A-Za-z0-9_])[a-z]")

# Where the old code ran one str.find per distinct name over the chunk (n names in a chunk of
# n words: n^2 characters compared), the names are put in a trie and the text walked once:
# from each place an occurrence can count, the walk reads only as far as some name goes on.


def _trie(words: Iterable[str]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for w in words:
        node = root
        for c in w:
            node = node.setdefault(c, {})
        node[""] = w  # "" is no character: the key of the word ending here
    return root


def _prefixes_at(text: str, i: int, end: int, trie: dict[str, Any]) -> Iterable[str]:
    """The words of ``trie`` that ``text[i:end]`` starts with, shortest first."""
    node = trie
    while True:
        word = node.get("")
        if word is not None:
            yield word
        if i >= end:
            return
        child = node.get(text[i])
        if child is None:
            return
        node = child
        i += 1


def _supported_names(names: Sequence[str], text: str) -> set[str]:
    """The ``names`` (distinct, each starting with ``A-Z``) that ``text`` supports as names.

    A name is supported by an occurrence capitalized after ``[a-z0-9,;)]`` and whitespace,
    or used as a ``Name:`` label at a line start; failing that it is dropped when the text
    uses it in lowercase as a whole word, or it is verb-shaped (``-ed``/``-ing``, title case).
    """
    segs = [(m.start(), m.end()) for m in _NON_WS_RUN.finditer(text)]
    trie = _trie(names)
    supported: set[str] = set()
    for k, (a, b) in enumerate(segs):
        if not "A" <= text[a] <= "Z":
            continue
        # a name has no whitespace, so an occurrence that can count (after whitespace or at
        # the start) opens a whitespace-free run; j is the last non-space before it
        j = segs[k - 1][1] - 1 if k else -1
        mid = j >= 0 and text[j] in _MID_PREV
        label_line = j < 0 or "\n" in text[j + 1:a]
        after_run = segs[k + 1][0] if k + 1 < len(segs) else len(text)
        for name in _prefixes_at(text, a, b, trie):
            if name in supported:
                continue
            e = a + len(name)
            if mid and _is_word(text, e - 1) != _is_word(text, e):
                supported.add(name)
            elif label_line:
                nxt = e if e < b else after_run  # the first non-space after the name
                if nxt < len(text) and text[nxt] == ":":
                    supported.add(name)
    lows: dict[str, list[str]] = {}
    for name in names:
        if name not in supported:
            lows.setdefault(name.lower(), []).append(name)
    used_lower: set[str] = set()
    if lows:
        # a lowercase use as a whole word starts a run of word characters
        low_trie = _trie(lows)
        k = 0
        for m in _LOWER_WORD_START.finditer(text):
            i = m.start()
            while segs[k][1] <= i:
                k += 1
            for low in _prefixes_at(text, i, segs[k][1], low_trie):
                e = i + len(low)
                if _is_word(text, e - 1) != _is_word(text, e):
                    used_lower.add(low)
            if len(used_lower) == len(lows):
                break
    out = set(supported)
    for low, group in lows.items():
        if low in used_lower:
            continue
        for name in group:
            if not ((name.endswith("ed") or name.endswith("ing")) and name == name[0] + name[1:].lower()):
                out.add(name)
    return out


def detect_entities(text: str, min_freq: int = 1) -> list[str]:
    """The candidate names of one chunk that the chunk supports, sorted."""
    freq: dict[str, int] = {}
    for raw in js_split_ws(text):
        if raw.islower():
            continue  # no capital letter: cannot become a name
        token = _EDGE_NONWORD.sub("", raw)
        token = token.removesuffix("'s")
        if len(token) < 2 or not ("A" <= token[0] <= "Z") or token in STOP_LIST:
            continue
        freq[token] = freq.get(token, 0) + 1
    frequent = [name for name, count in freq.items() if count >= min_freq]
    supported = _supported_names(frequent, text)
    return sorted(name for name in frequent if name in supported)


def _first_positions(text: str, names: Sequence[str]) -> list[int]:
    """``[text.find(name) for name in names]``, in one walk for the names starting ``A-Z``."""
    found: dict[str, int] = {}
    capitalized = {n for n in names if n and "A" <= n[0] <= "Z"}
    if capitalized:
        trie = _trie(capitalized)
        for m in _UPPER.finditer(text):
            for name in _prefixes_at(text, m.start(), len(text), trie):
                found.setdefault(name, m.start())
            if len(found) == len(capitalized):
                break
    return [found.get(n, -1) if n in capitalized else text.find(n) for n in names]


def _by_first_position(text: str, names: Sequence[str]) -> list[str]:
    """``sorted(names, key=text.find)`` (stable: equal positions keep their order)."""
    pos = _first_positions(text, names)
    return [names[k] for k in sorted(range(len(names)), key=pos.__getitem__)]


_VOWELS = frozenset("AEIOU")


def _to_code(name: str) -> str:
    letters = "".join(c for c in name if c.isascii() and c.isalpha()).upper()
    if not letters:
        return "UNK"
    first = letters[0]
    consonants = [c for c in letters[1:] if c not in _VOWELS]
    if len(consonants) >= 2:
        return first + consonants[0] + consonants[1]
    if len(consonants) == 1:
        return first + consonants[0] + letters[-1]
    return (first + letters[1:3]).ljust(3, "X")


def build_entity_index(names: Iterable[str]) -> EntityIndex:
    """Codes for ``names`` in sorted order; a collision takes ``XY1``, ``XY2``, ..."""
    index = EntityIndex()
    used: set[str] = set()
    # _to_code never gives a digit, so the codes XY1, XY2, ... come only from collisions here,
    # taken in order: the next free one is the count so far plus one (a scan from XY1 made
    # n colliding names cost n^2)
    taken: dict[str, int] = {}
    for name in sorted(set(names)):
        code = _to_code(name)
        if code in used:
            prefix = code[:2]
            taken[prefix] = taken.get(prefix, 0) + 1
            code = prefix + str(taken[prefix])
        used.add(code)
        index.name_to_code[name] = code
        index.code_to_name[code] = name
    return index


FEMALE_NAMES = frozenset("""
alice carol emma olivia sophia sofia mia amelia isabella ava charlotte emily sarah sara anna maria laura
julia lucy grace chloe hannah zoe ella lily nora ruby alicia diana elena eva irene jane karen kate
katherine linda lisa megan nancy nina rachel rebecca rita rosa susan tina wendy priya aisha fatima mei
yuki ingrid astrid clara elsa frida greta margaret beth carmen lucia paula silvia valentina bianca
francesca giulia martina katya natasha olga svetlana tatiana vera zara leila noor samira yasmin helen
ruth claire audrey naomi iris
""".split())
MALE_NAMES = frozenset("""
bob robert james john michael david william richard joseph thomas charles daniel matthew anthony mark
steven paul andrew joshua kenneth kevin brian george edward ronald timothy jason jeffrey ryan jacob gary
nicholas eric jonathan stephen larry justin scott brandon benjamin samuel frank gregory raymond alexander
patrick jack dennis jerry tyler aaron jose adam henry nathan douglas zachary peter kyle walter ethan
jeremy harold keith christian roger noah gerald carl terry sean austin arthur lawrence jesse dylan bryan
joe bruce albert gabriel logan juan carlos luis miguel pedro diego marco luca giovanni ahmed ali omar
hassan ravi raj kenji sven lars erik klaus hans ivan dmitri sergei boris liam oliver harry oscar leo
arjun vikram victor hugo felix simon martin tom
""".split())

_FEMALE_PRONOUN = re.compile(r"\b(?:she|her|hers|herself)\b", re.I | _A)
_MALE_PRONOUN = re.compile(r"\b(?:he|him|his|himself)\b", re.I | _A)
_PLURAL_PRONOUN = re.compile(r"\b(?:they|them|their|theirs)\b", re.I | _A)
_NAME_SPLIT = re.compile(r"[" + _WS_CHARS + "_-]")


def _gender(name: str) -> str:
    first = _NAME_SPLIT.split(name)[0].lower()
    if first in FEMALE_NAMES:
        return "female"
    if first in MALE_NAMES:
        return "male"
    return "unknown"


def resolve_coreferences(chunks: Sequence[Chunk], detected: Sequence[list[str]]) -> list[list[str]]:
    """Add the most recent gender-matching name to a chunk with a pronoun and no such name."""
    last: dict[str, str] = {}
    recent: dict[str, None] = {}  # names in the order last seen (a dict: moving one to the end is O(1))
    out: list[list[str]] = []
    for chunk, names in zip(chunks, detected):
        text = chunk.text
        aug = list(names)
        genders = {_gender(e) for e in names}
        for g, pattern in (("female", _FEMALE_PRONOUN), ("male", _MALE_PRONOUN)):
            if g in last and g not in genders and pattern.search(text) and last[g] not in aug:
                aug.append(last[g])
        if not names and _PLURAL_PRONOUN.search(text):
            for name in list(islice(reversed(recent), 2))[::-1]:
                if name not in aug:
                    aug.append(name)
        for name in _by_first_position(text, names):
            g = _gender(name)
            if g != "unknown":
                last[g] = name
            recent.pop(name, None)
            recent[name] = None
        out.append(sorted(aug))
    return out


def merge_first_name_aliases(chunk_entities: list[list[str]], speakers: Iterable[str]) -> list[list[str]]:
    """Fold a first-name prefix into the chat speaker it abbreviates (``Mel`` -> ``Melanie``).

    ``speakers`` are the lowercase names used as ``Name:`` labels (at least 3 times,
    :func:`detect_speaker_names`). A name is folded when it is title case, letters only,
    at least 3 letters, at least 2 letters shorter than exactly one speaker name it
    starts, and not a speaker itself. A text without speakers (a book) is unchanged.
    """
    speakers = sorted(set(speakers))
    alias: dict[str, str] = {}
    for names in chunk_entities:
        for name in names:
            low = name.lower()
            if name in alias or low in speakers or len(name) < 3 or not name.isalpha() \
                    or not name[0].isupper() or not name[1:].islower():
                continue
            longer = [s for s in speakers if s.startswith(low) and len(s) - len(low) >= 2]
            if len(longer) == 1:
                alias[name] = longer[0].capitalize()
    if not alias:
        return chunk_entities
    return [sorted({alias.get(n, n) for n in names}) for names in chunk_entities]


# ── topics ────────────────────────────────────────────────────────────────────

BASE_STOP_WORDS = frozenset("""
a an the and but or nor for yet so in on at to of with by from about above below between into through
during before after against among around along across behind beside besides beyond despite except
following inside like near off onto out outside over past since throughout under until up upon within
without is are was were be been being have has had do does did will would could should may might shall
must can need dare ought used able i you he she it we they me him her us them my your his its our their
this that these those who which what where when how why all any both each few more most other some such
no not only same than too very just also however therefore thus hence moreover furthermore nevertheless
otherwise indeed instead meanwhile already always often usually sometimes never here there then now well
back still even new good first last own right great little small large big high long next early old young
public private real best free different important possible sure true false yes ok okay
""".split())

_TECH_SUFFIX = re.compile(r"(?:tion|ing|ment|ity|ness|ism|ist|ize|ise|ous|ful|less|able|ible)$", re.I)
_PAREN_TS = re.compile(r"\([^)]{3,60}\)")
_SPEAKER_LABEL = re.compile(r"^[A-Z][a-zA-Z]{1,20}:" + WS + "*", re.M)
_SPEAKER_NAME = re.compile(r"\b([A-Z][a-z]{2,15}):", _A)
_CLEAN_EDGE = re.compile(r"^[^\w-]+|[^\w-]+$", _A)
_CLEAN_PUNCT = re.compile(r"['\".,!?;:()\[\]{}]")
_ALL_CAPS = re.compile(r"^[A-Z]{2,}$")
_CAMEL = re.compile(r"^[A-Z][a-z]+(?:[A-Z][a-z]*)+$")


def detect_speaker_names(text: str) -> frozenset[str]:
    """Lowercase names used as a ``Name:`` label 3 times or more."""
    counts: dict[str, int] = {}
    for m in _SPEAKER_NAME.finditer(text):
        name = m.group(1).lower()
        counts[name] = counts.get(name, 0) + 1
    return frozenset(n for n, c in counts.items() if c >= 3)


def _clean_token_uncached(raw: str) -> str:
    if raw.isalnum() and raw.isascii():
        return raw
    return _CLEAN_PUNCT.sub("", _CLEAN_EDGE.sub("", raw))


_clean_token = _Memo(_clean_token_uncached).__getitem__


def _boost_uncached(raw: str) -> float:
    if _ALL_CAPS.match(raw):
        return 2.0
    if _CAMEL.match(raw):
        return 2.5
    if "-" in raw and all(len(p) > 1 for p in raw.split("-")):
        return 1.8
    if len(raw) > 6 and _TECH_SUFFIX.search(raw):
        return 1.3
    return 1.0


class _Stat:
    __slots__ = ("freq", "positions", "boost")

    def __init__(self, raw: str, pos: int) -> None:
        self.freq = 1
        self.positions = [pos]
        self.boost = _boost(raw)

    def score(self, n: int) -> float:
        d = max(n, 1)
        tf = self.freq / d
        spread = 0.0
        pos = self.positions
        if len(pos) > 1:
            total = 0.0
            for p in pos:
                total += p
            mean = total / len(pos)
            var = 0.0
            for p in pos:
                var += (p - mean) * (p - mean)
            spread = math.sqrt(var / len(pos)) / d
        s = tf * (1 + spread)
        return s * self.boost if self.boost != 1.0 else s


_boost = _Memo(_boost_uncached).__getitem__


def extract_topics(text: str, stop_words: frozenset[str] = BASE_STOP_WORDS,
                   speakers: frozenset[str] | None = None, max_topics: int = 8) -> list[str]:
    """Up to ``max_topics`` lowercase key terms and phrases of one chunk, best first."""
    names = speakers if speakers is not None else detect_speaker_names(text)
    cleaned = _SPEAKER_LABEL.sub(" ", _PAREN_TS.sub(" ", text))
    if names:
        cleaned = re.sub(r"\b(" + "|".join(sorted(names)) + r")\b", " ", cleaned, flags=re.I | _A)
    stream = js_split_ws(cleaned)
    n = len(stream)
    clean = list(map(_clean_token, stream))
    lows = list(map(str.lower, clean))
    is_stop = [low in stop_words or len(low) < 3 for low in lows]

    stats: dict[str, _Stat] = {}
    for pos, (raw, low) in enumerate(zip(clean, lows)):
        if is_stop[pos]:  # includes every token under 2 characters
            continue
        st = stats.get(low)
        if st is None:
            stats[low] = _Stat(raw, pos)
        else:
            st.freq += 1
            st.positions.append(pos)
    if not stats:
        return []
    uni = {low: st.score(n) for low, st in stats.items()}

    phrases: dict[str, list[Any]] = {}  # display -> [tokens, score, freq]
    # a phrase is 2 or 3 adjacent content words (not stop words, 4+ letters without
    # hyphens), at least two of them different
    ok = [not is_stop[k] and len(clean[k].replace("-", "")) >= 4 for k in range(n)]
    for i in range(n - 1):
        if not (ok[i] and ok[i + 1]):
            continue
        for ln in (2, 3):
            if ln == 3 and (i + 2 >= n or not ok[i + 2]):
                break
            words = lows[i:i + ln]
            if len(set(words)) < 2:
                continue
            display = " ".join(words)
            comp = 1.0
            for w in words:
                comp *= uni.get(w, 0.01)
            ph = phrases.get(display)
            if ph is None:
                phrases[display] = [words, comp, 1]
            else:
                ph[2] += 1
                ph[1] = comp / (ph[2] * ph[2] + 1)
    chosen = sorted(((d, p) for d, p in phrases.items() if p[1] > 0), key=lambda x: -x[1][1])
    chosen = chosen[: math.ceil(max_topics / 2)]
    absorbed = {t for _, p in chosen for t in p[0]}
    unigrams = []
    for low, score in uni.items():
        if low in absorbed:
            covering = [p[1] for _, p in chosen if low in p[0]]
            if not all(score > c * 1.5 for c in covering):
                continue
        unigrams.append((low, score))
    unigrams.sort(key=lambda x: -x[1])
    unigrams = unigrams[: max_topics - len(chosen)]
    merged = [(d, p[1]) for d, p in chosen] + unigrams
    merged.sort(key=lambda x: (-x[1], _collation_key(x[0])))
    return [d for d, _ in merged[:max_topics]]


# ── quote ─────────────────────────────────────────────────────────────────────

DECISION_WORDS = frozenset(
    "decided chose choose will must committed resolved determined agreed concluded going plan intend shall".split()
)
_ABBREV = re.compile(r"\b(Mr|Mrs|Ms|Dr|Prof|Sr|Jr|vs|etc|e\.g|i\.e)\.", re.I | _A)
_INITIAL = re.compile(r"\b([A-Z]{1,2})\.", _A)
_SENT_SPLIT = re.compile(r"(?<=[.!?])" + WS + "+(?=[A-Z\"'])")
_PUNCT_SPLIT = re.compile(r"(?<=[.!?])" + WS + "+")
_NON_AZ = re.compile(r"[^a-z]")


_az_lower = _Memo(lambda w: _NON_AZ.sub("", w.lower())).__getitem__


def _split_sentences(text: str) -> list[str]:
    cleaned = _ABBREV.sub(lambda m: m.group(0).replace(".", "\0", 1), text)
    cleaned = _INITIAL.sub(lambda m: m.group(0).replace(".", "\0", 1), cleaned)
    parts = _SENT_SPLIT.split(cleaned)
    if len(parts) <= 1:
        by_line = [p for p in (js_trim(s) for s in re.split(r"\n+", cleaned)) if len(p) > 10]
        if len(by_line) > 1:
            parts = by_line
    if len(parts) <= 1:
        by_punct = [s for s in _PUNCT_SPLIT.split(cleaned) if len(js_trim(s)) > 10]
        if len(by_punct) > 1:
            parts = by_punct
    out = [r for r in (js_trim(p.replace("\0", ".")) for p in parts) if r]
    return out or [js_trim(text)]


def _text_rank(sets: list[set[str]]) -> list[float]:
    """TextRank over the sentences' lowercase word sets."""
    n = len(sets)
    if n == 1:
        return [1.0]
    sim = [[0.0] * n for _ in range(n)]
    for i in range(n):
        si = sets[i]
        for j in range(i + 1, n):
            inter = len(si & sets[j])
            union = len(si) + len(sets[j]) - inter
            sim[i][j] = sim[j][i] = inter / union if union > 0 else 0.0
    row_sums = []
    for j in range(n):
        total = 0.0
        for v in sim[j]:
            total += v
        row_sums.append(total)
    # incoming[i] adds (sim[j][i] / row_sums[j]) * score[j] over j != i in order; a zero
    # term leaves a float sum unchanged, so only the non-zero ones are kept
    into = [[(j, sim[j][i] / row_sums[j]) for j in range(n) if j != i and row_sums[j] > 0 and sim[j][i] != 0.0]
            for i in range(n)]
    scores = [1 / n] * n
    base = (1 - 0.85) / n
    for _ in range(10):
        nxt = []
        for i in range(n):
            incoming = 0.0
            for j, w in into[i]:
                incoming += w * scores[j]
            nxt.append(base + 0.85 * incoming)
        scores = nxt
    top = max(scores)
    return [s / top for s in scores] if top > 0 else scores


def _u16_slice(s: str, n: int) -> str:
    if s.isascii():
        return s[:n]
    out, used = [], 0
    for c in s:
        w = 2 if ord(c) > 0xFFFF else 1
        if used + w > n:
            if used < n:  # JavaScript keeps the lone high surrogate; keep the character
                out.append(c)
            break
        out.append(c)
        used += w
    return "".join(out)


def sentence_length_bonus(words: int) -> float:
    """The key-quote score's preference for sentences of 10-25 words (zettel-compress 1.0.0)."""
    if 10 <= words <= 25:
        return 0.2
    if words < 5:
        return -0.3
    if words > 40:
        return -0.1
    return 0.0


#: the ``long-paragraphs`` fix runs TextRank over blocks of at most this many consecutive
#: sentences (a chunk of the reference inputs has at most 90), so its cost stays linear
TEXTRANK_BLOCK = 256


def _blocked_text_rank(sets: list[set[str]], block: int) -> list[float]:
    n = len(sets)
    if n <= block:
        return _text_rank(sets)
    k = -(-n // block)  # blocks of near-equal size: a last block of one sentence would rank it 1.0
    bounds = [i * n // k for i in range(k + 1)]
    out: list[float] = []
    for a, b in pairwise(bounds):
        out.extend(_text_rank(sets[a:b]))
    return out


def select_key_sentence(text: str, block: int | None = None) -> str:
    """The chunk's most representative sentence (TextRank blended with decision words;
    ``block``: TextRank over that many consecutive sentences at a time, the
    ``long-paragraphs`` fix)."""
    trimmed = js_trim(text)
    if len(_WS_RUN.split(trimmed, 4)) < 5:  # fewer than 5 words
        return _u16_slice(trimmed, 120)
    sentences = _split_sentences(trimmed)
    # lowercasing never adds or removes whitespace: the same words, lowercase
    lowered = [js_split_ws(s.lower()) for s in sentences]
    sets = [set(w) for w in lowered]
    centrality = _text_rank(sets) if block is None else _blocked_text_rank(sets, block)
    best, best_score = sentences[0], -math.inf
    last = len(sentences) - 1
    for i, s in enumerate(sentences):
        words = lowered[i]
        count = len(words)
        decision = sum(1 for w in words if _az_lower(w) in DECISION_WORDS)
        density = decision / count if count else 0.0
        length_bonus = sentence_length_bonus(count)
        unique = len(set(words)) / count if count else 0.0
        position = 0.1 if i == 0 or i == last else 0.0
        decision_score = density * 3.0 + decision * 0.4 + length_bonus + unique * 0.3 + position
        score = 0.5 * centrality[i] + 0.5 * decision_score
        if score > best_score:
            best_score, best = score, s
    return js_trim(best)


# ── flags, emotions, weight ───────────────────────────────────────────────────

FLAG_KEYWORDS: dict[str, tuple[str, ...]] = {
    "DECISION": ("decided", "chose", "committed", "concluded", "agreed to", "going to", "will do", "must do",
                 "we will", "final decision"),
    "ORIGIN": ("founded", "originated", "first time ever", "inception", "birth of", "how it began",
               "where it started"),
    "CORE": ("fundamental", "essential", "key principle", "foundation of", "bedrock", "non-negotiable",
             "must always"),
    "PIVOT": ("turning point", "breakthrough", "changed everything", "transformed", "pivotal", "game changer",
              "everything changed"),
    "GENESIS": ("led to", "resulted in", "because of this", "gave rise to", "origin of", "which caused",
                "set in motion"),
    "TECHNICAL": ("architecture", "implement", "deploy", "config", "database", "module", "infrastructure", "stack",
                  "endpoint", "schema"),
}

EMOTION_KEYWORDS: dict[str, tuple[str, ...]] = {
    "conviction": ("decided", "committed", "certain", "determined", "firm", "unwavering"),
    "grief": ("lost", "sad", "mourning", "grief", "heartbroken", "devastated", "loss of"),
    "joy": ("happy", "excited", "wonderful", "delighted", "elated", "thrilled", "joyful", "glad"),
    "fear": ("afraid", "worried", "scared", "terrified", "dread", "panic", "fearful", "terror"),
    "hope": ("hope", "optimistic", "looking forward to", "aspire", "hopeful", "bright future"),
    "trust": ("trust", "rely on", "depend on", "confident in", "faith in", "assured", "reliable"),
    "wonder": ("incredible", "fascinating", "curious", "astonishing", "remarkable", "awe-inspiring"),
    "rage": ("angry", "furious", "hate", "outraged", "enraged", "livid", "infuriated", "seething"),
    "exhaustion": ("burnt out", "overwhelmed", "drained", "exhausted", "depleted", "weary", "burnout"),
    "shame": ("ashamed", "embarrassed", "humiliated", "mortified", "disgraced", "shameful"),
    "pride": ("proud", "accomplished", "achieved", "succeeded", "triumphant", "excellence"),
    "nostalgia": ("used to", "back then", "childhood", "memories", "once upon", "years ago", "miss the old"),
    "anxiety": ("anxious", "nervous", "uneasy", "restless", "apprehensive", "on edge", "stressed out"),
    "relief": ("relieved", "at last", "thankfully", "unburdened", "weight off"),
    "anticipation": ("upcoming", "looking forward to", "preparing for", "expecting", "anticipate", "cant wait"),
    "frustration": ("frustrated", "annoyed", "irritated", "stuck on", "blocked by", "impossible to", "pointless"),
    "gratitude": ("grateful", "thankful", "appreciate", "indebted", "gratitude"),
    "loneliness": ("lonely", "no one", "by myself", "disconnected", "abandoned", "solitude"),
    "inspiration": ("inspired", "motivated", "energized", "ignited", "driven", "passionate", "creative"),
    "confusion": ("confused", "unsure", "uncertain", "puzzled", "baffled", "don't understand"),
    "clarity": ("now i see", "makes sense now", "enlightened", "suddenly understood", "clicked for me"),
    "guilt": ("guilty", "regret", "should have", "shouldn't have", "my fault", "blame myself", "remorse"),
    "awe": ("awe", "breathtaking", "profound", "transcendent", "majestic", "overwhelming beauty"),
    "regret": ("wish i had", "if only", "missed opportunity", "looking back", "could've done", "should have done"),
    "determination": ("will not stop", "never give up", "keep going", "persist", "push through", "no matter what"),
    "vulnerability": ("vulnerable", "raw emotion", "open up", "honest about", "admit that", "being real"),
    "acceptance": ("at peace", "moved on", "let go", "embrace", "okay with", "come to terms"),
    "resistance": ("resist", "refuse to", "oppose", "push back", "disagree", "won't do"),
    "love": ("love", "adore", "cherish", "devoted", "affection", "warmth", "care deeply", "deeply care"),
    "loss": ("passed away", "over now", "no more", "goodbye forever", "farewell", "we lost them"),
}
def keyword_pattern(keywords: Iterable[str]) -> re.Pattern[str]:
    return re.compile(r"\b(?:" + "|".join(re.escape(k) for k in keywords) + r")\b", _A)


def _first_words(keywords: Iterable[str]) -> frozenset[str]:
    # a keyword's first \w run is a whole \w run of any text it matches on word boundaries
    return frozenset(re.match(r"\w+", k, _A).group(0) for k in keywords)  # type: ignore[union-attr]


_W_RUN = re.compile(r"\w+", _A)
_FLAG_PATTERNS = [(flag, keyword_pattern(kws), _first_words(kws)) for flag, kws in FLAG_KEYWORDS.items()]
_EMOTION_PATTERNS = [
    (emotion, keyword_pattern(kws), _first_words(kws))
    for emotion, kws in EMOTION_KEYWORDS.items()
]
_NEGATION_WORDS = frozenset(
    ["not", "n't", "never", "no", "neither", "hardly", "barely", "scarcely", "without", "unable", "failed",
     "refused", "denied"]
)
_IMPLICIT_NEGATORS = ("failed to", "unable to", "refused to", "avoided", "lack of", "free from")
_NOT_AZ_APOS = re.compile(r"[^a-z']")
WEIGHT_DECISION_WORDS = frozenset(["decided", "chose", "committed", "resolved", "must", "will", "determined"])
_WEIGHT_FLAGS = frozenset({"DECISION", "ORIGIN", "CORE", "PIVOT", "GENESIS"})


def _negated(lower: str, at: int) -> bool:
    window = lower[max(0, at - 50):at]
    tail = js_split_ws(js_trim(window))[-6:]
    if any(_NOT_AZ_APOS.sub("", w) in _NEGATION_WORDS for w in tail):
        return True
    for phrase in _IMPLICIT_NEGATORS:
        k = lower.rfind(phrase, max(0, at - 50), at + len(phrase))  # only a phrase within 50 counts
        if k != -1:
            return True
    return False


# decision-precision (spec/compress.md section 15): a DECISION keyword counts only
# where it records a decision, judged on its sentence
_DECISION_WORD = keyword_pattern(FLAG_KEYWORDS["DECISION"])
_SENTENCE_END = re.compile(r"[.!?\n]")
_NT = re.compile(r"n't$")
_SECOND_PERSON_BEFORE = re.compile(r"\b(?:you|you've|you'd|you've just|you just)" + WS + r"+$", _A)
_ADJECTIVE_BEFORE = re.compile(
    r"\b(?:more|most|less|least|very|quite|so|rather|too|a|an|was|were|is|am|be|been|seemed|looked|appeared)"
    + WS + r"+$", _A)
_DECIDED_VERB_AFTER = re.compile(WS + r"+(?:to|on|that|upon|against|between|whether|in favou?r)\b", _A)
_FIRST_PERSON_BEFORE = re.compile(
    r"\b(?:i'm|i am|we're|we are|i was|we were)" + WS + r"+(?:[a-z]+ly" + WS + r"+)?$", _A)
_GOING_TO_NOT_A_PLAN = frozenset(
    "be need have get happen a an the my your his her our their its this that these those some one".split())
_WE_BEFORE = re.compile(r"\b(?:i|we)" + WS + r"+$", _A)
_HEDGE = re.compile(r"\b(?:hopefully|maybe|perhaps|probably|might|hope|hoping|if)\b", _A)


def _records_decision(lower: str, m: re.Match[str], ends: Sequence[int]) -> bool:
    """``ends``: the offsets of ``lower``'s sentence ends (``_SENTENCE_END``), ascending; found once
    per text, since a search from each keyword made a text without them cost n^2."""
    at, kw = m.start(), m.group(0)
    k = bisect_left(ends, at)
    s0 = ends[k - 1] + 1 if k else 0
    k = bisect_left(ends, m.end())
    if k < len(ends) and lower[ends[k]] == "?":
        return False  # a question asks about a decision
    before = lower[s0:at]
    tail = js_split_ws(js_trim(lower[max(0, at - 50):at]))[-6:]
    if any(_NT.search(w) for w in tail):
        return False  # "haven't decided yet"
    if kw in ("decided", "chose") and _SECOND_PERSON_BEFORE.search(before):
        return False  # "I love that you chose pottery": praise of someone else's choice
    if kw == "decided" and _ADJECTIVE_BEFORE.search(before) and not _DECIDED_VERB_AFTER.match(lower, m.end()):
        return False  # "it was more decided", "a decided preference"
    if kw == "going to":
        nxt = re.match(WS + r"+([a-z']+)", lower[m.end():])
        if not _FIRST_PERSON_BEFORE.search(before) or nxt is None or nxt.group(1) in _GOING_TO_NOT_A_PLAN:
            return False  # "your project is going to be great", "I'm going to a conference"
    if kw == "will do" and not _WE_BEFORE.search(before):
        return False  # "Will do!" (an acknowledgement), "it will do"
    if kw == "we will" and _HEDGE.search(before):
        return False  # "Hopefully, we will find a place"
    return True


def precise_decision(text: str, pattern: re.Pattern[str] = _DECISION_WORD) -> bool:
    """Whether ``text`` records a decision: a DECISION keyword (``pattern``) that is not
    negated and passes the ``decision-precision`` checks of spec/compress.md section 15."""
    lower = text.lower().replace("\u2019", "'")  # same length: offsets stay valid
    ends: list[int] | None = None
    for m in pattern.finditer(lower):
        if _negated(lower, m.start()):
            continue
        if ends is None:
            ends = [e.start() for e in _SENTENCE_END.finditer(lower)]
        if _records_decision(lower, m, ends):
            return True
    return False


def _first_unnegated(pattern: re.Pattern[str], lower: str, firsts: frozenset[str] | None = None,
                     words: frozenset[str] | None = None) -> bool:
    if firsts is not None and words is not None and firsts.isdisjoint(words):
        return False  # a set test is cheap; the word-boundary regex is not
    return any(not _negated(lower, m.start()) for m in pattern.finditer(lower))


def detect_flags(text: str, precise: bool = False) -> list[str]:
    """The flags of one chunk, in ``ALL_FLAGS`` order: a keyword on word boundaries,
    not negated (``precise``: the ``decision-precision`` fix)."""
    lower = text.lower()
    words = frozenset(_W_RUN.findall(lower))
    out: list[str] = []
    for flag, pattern, firsts in _FLAG_PATTERNS:
        if flag == "DECISION" and precise:
            hit = precise_decision(lower)
        else:
            hit = _first_unnegated(pattern, lower, firsts, words)
        if hit:
            out.append(flag)
    return out


def detect_emotions(text: str) -> list[str]:
    """The emotions of one chunk, in ``ALL_EMOTIONS`` order."""
    lower = text.lower()
    words = frozenset(_W_RUN.findall(lower))
    return [e for e, pattern, firsts in _EMOTION_PATTERNS if _first_unnegated(pattern, lower, firsts, words)]


def compute_weight(emotions: Sequence[str], flags: Sequence[str], text: str) -> float:
    """The raw importance of a chunk, rounded to 2 decimals."""
    signal = sum(1 for f in flags if f in _WEIGHT_FLAGS)
    flag_score = min(signal * 0.35, 0.9)
    emotion_score = min(len(emotions) * 0.1, 0.4)
    words = js_split_ws(text.lower())
    count = sum(1 for w in words if _NOT_AZ_APOS.sub("", w) in WEIGHT_DECISION_WORDS)
    density = count / len(words) if words else 0.0
    return js_round2(min(flag_score + emotion_score + density * 0.5, 1.0))


# ── dates ─────────────────────────────────────────────────────────────────────

_MONTHS = {
    "january": 1, "jan": 1, "february": 2, "feb": 2, "march": 3, "mar": 3, "april": 4, "apr": 4, "may": 5,
    "june": 6, "jun": 6, "july": 7, "jul": 7, "august": 8, "aug": 8, "september": 9, "sep": 9, "sept": 9,
    "october": 10, "oct": 10, "november": 11, "nov": 11, "december": 12, "dec": 12,
}
_MN = "|".join(_MONTHS)
_S = WS
_RE_DMY = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?{_S}+({_MN})[,.]?{_S}*(\d{{4}})\b", re.I | _A)
_RE_MDY = re.compile(rf"\b({_MN}){_S}+(\d{{1,2}})(?:st|nd|rd|th)?[,.]?{_S}*(\d{{4}})\b", re.I | _A)
_RE_MY = re.compile(rf"\b({_MN}){_S}+(\d{{4}})\b", re.I | _A)
_RE_ISO = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b", _A)
_RE_YEAR = re.compile(rf"\b(?:in|since|back in|around|during|of|from){_S}+(\d{{4}})\b", re.I | _A)
_RE_PAREN = re.compile(
    rf"\([^\n\r\u2028\u2029]*?(?:\bon{_S}+)?(\d{{1,2}})(?:st|nd|rd|th)?{_S}+({_MN})[,.]?{_S}*(\d{{4}})"
    r"[^\n\r\u2028\u2029]*?\)", re.I | _A,
)

_LINE_BREAK = re.compile("[\n\r\u2028\u2029]")


# _RE_PAREN without its "(" + lazy prefix and its lazy tail + ")": the date itself, which may
# start after "on" and span line breaks (its blanks are WS), and where it may start.
_PAREN_HEAD, _PAREN_TAIL = r"\([^\n\r\u2028\u2029]*?", r"[^\n\r\u2028\u2029]*?\)"
assert _RE_PAREN.pattern.startswith(_PAREN_HEAD) and _RE_PAREN.pattern.endswith(_PAREN_TAIL)
_PAREN_DATE = re.compile(_RE_PAREN.pattern[len(_PAREN_HEAD):-len(_PAREN_TAIL)], _RE_PAREN.flags)
_PAREN_DATE_START = re.compile(r"\d|on", re.I | _A)


class ParenMatch:
    """A match of ``_RE_PAREN``: its span and its groups (day, month name, year)."""

    __slots__ = ("_start", "_end", "_groups")

    def __init__(self, start: int, end: int, groups: tuple[str, str, str]) -> None:
        self._start, self._end, self._groups = start, end, groups

    def start(self) -> int:
        return self._start

    def end(self) -> int:
        return self._end

    def groups(self) -> tuple[str, str, str]:
        return self._groups

    def group(self, i: int) -> str:
        return self._groups[i - 1]


def _paren_dates(text: str) -> Iterator[ParenMatch]:
    """The matches of ``_RE_PAREN.finditer(text)`` without its n^2 on a line of many ``(``
    or of many dates.

    The regex tries each place after the ``(`` on its line where the date may start, in
    order; at each date found, it reads on for a ``)`` on the line where the date ends. That
    read went to the line's end for every date without a ``)`` after it: a ``(`` before 2,000
    dates and no ``)`` took 0.22 s, 10x the dates 100x the time. Here each line's last ``)``
    is looked up once, so a date is checked in O(1). And whether an attempt at a ``(``
    succeeds depends only on what follows it on its line, so when one fails every later
    ``(`` of its line fails too: the scan goes on at the next line (``finditer`` tried them
    all, each reading to the line's end: 20 KB of ``(`` before a year took 7.8 s).
    """
    breaks = [m.start() for m in _LINE_BREAK.finditer(text)]
    n = len(text)
    last_close: dict[int, int] = {}  # line number -> its last ")" (-1: none)

    def line(at: int) -> tuple[int, int]:
        """(line number, end) of the line holding ``at``."""
        i = bisect_left(breaks, at)
        return i, breaks[i] if i < len(breaks) else n

    pos = 0
    while (p := text.find("(", pos)) != -1:
        _, end = line(p)
        for start in _PAREN_DATE_START.finditer(text, p + 1, end):
            d = _PAREN_DATE.match(text, start.start())
            if d is None:
                continue
            i, d_end = line(d.end())
            if i not in last_close:
                last_close[i] = text.rfind(")", breaks[i - 1] + 1 if i else 0, d_end)
            if last_close[i] >= d.end():
                close = text.find(")", d.end(), d_end)
                yield ParenMatch(p, close + 1, d.groups())  # type: ignore[arg-type]
                pos = close + 1
                break
        else:
            if end >= n:
                return
            pos = end + 1  # a line break is one character


PDate = tuple[int, int | None, int | None]  # (year, month, day); month and day may be unknown


@dataclass(frozen=True)
class DateHit:
    index: int
    end: int
    date: PDate


def _spec(d: PDate) -> int:
    return (4 if d[2] is not None else 0) + (2 if d[1] is not None else 0) + 1


_FOUR_DIGITS = re.compile(r"\d{4}", _A)
_PAREN_CUE = re.compile(r"\([^\n\r\u2028\u2029]*\d{4}")


def _extract_absolutes(text: str) -> list[DateHit]:
    if _FOUR_DIGITS.search(text) is None:
        return []  # every absolute date has a four-digit year
    raw: list[DateHit] = []
    # a "(... 8 May 2023 ...)" timestamp needs a "(" before a four-digit number on its line
    paren = _PAREN_CUE.search(text) is not None
    for rx, order in ((_RE_PAREN, "dmy"), (_RE_DMY, "dmy"), (_RE_MDY, "mdy")):
        if rx is _RE_PAREN and not paren:
            continue
        for m in (_paren_dates(text) if rx is _RE_PAREN else rx.finditer(text)):
            if order == "dmy":
                day, mname, year = int(m.group(1)), m.group(2).lower(), int(m.group(3))
            else:
                mname, day, year = m.group(1).lower(), int(m.group(2)), int(m.group(3))
            month = _MONTHS.get(mname)
            if month and 1900 <= year <= 2100 and 1 <= day <= 31:
                raw.append(DateHit(m.start(), m.end(), (year, month, day)))
    for m in _RE_ISO.finditer(text):
        y = int(m.group(1))
        if 1900 <= y <= 2100:
            raw.append(DateHit(m.start(), m.end(), (y, int(m.group(2)), int(m.group(3)))))
    for m in _RE_MY.finditer(text):
        month, y = _MONTHS.get(m.group(1).lower()), int(m.group(2))
        if month and 1900 <= y <= 2100:
            raw.append(DateHit(m.start(), m.end(), (y, month, None)))
    for m in _RE_YEAR.finditer(text):
        y = int(m.group(1))
        if 1900 <= y <= 2100:
            raw.append(DateHit(m.start(), m.end(), (y, None, None)))
    raw.sort(key=lambda h: (h.index, -h.end))
    hits: list[DateHit] = []
    # A hit is dropped when a kept one overlaps it and is at least as specific. Kept hits start
    # at or before it (raw is sorted by start), so one overlaps it exactly when it ends after
    # its start: the furthest end kept per specificity answers that in O(1), where comparing
    # with every kept hit made a text of n dates cost n^2.
    furthest: dict[int, int] = {}
    for h in raw:
        spec = _spec(h.date)
        if not any(end > h.index for s, end in furthest.items() if s >= spec):
            hits.append(h)
            furthest[spec] = max(furthest.get(spec, h.end), h.end)
    hits.sort(key=lambda h: h.index)
    return hits


def _iso(d: PDate) -> str:
    y, m, dd = d
    if m is None:
        return str(y)
    if dd is None:
        return f"{y}-{m:02d}"
    return f"{y}-{m:02d}-{dd:02d}"


def _js_date(y: int, m: int, d: int) -> _dt.date:
    # new Date(y, m - 1, d): months and days overflow into the next ones
    y += (m - 1) // 12
    m = (m - 1) % 12 + 1
    return _dt.date(y, m, 1) + _dt.timedelta(days=d - 1)


def _add_days(d: PDate, n: int) -> PDate:
    if d[1] is None or d[2] is None:
        return d
    x = _js_date(d[0], d[1], d[2] + n)
    return (x.year, x.month, x.day)


def _add_months(d: PDate, n: int) -> PDate:
    if d[1] is None:
        return (d[0] + n // 12, None, None)
    m = d[1] - 1 + n
    return (d[0] + m // 12, m % 12 + 1, d[2])


_WEEKDAY = {"sunday": 0, "monday": 1, "tuesday": 2, "wednesday": 3, "thursday": 4, "friday": 5, "saturday": 6}
_WD = "|".join(_WEEKDAY)


def _parse_session(date: str) -> PDate | None:
    m = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})", date)
    if m:
        return (int(m.group(1)), int(m.group(2)), int(m.group(3)))
    m = re.fullmatch(r"(\d{4})-(\d{2})", date)
    if m:
        return (int(m.group(1)), int(m.group(2)), None)
    m = re.fullmatch(r"(\d{4})", date)
    if m:
        return (int(m.group(1)), None, None)
    hits = _extract_absolutes(date)
    return hits[0].date if hits else None


def _r(p: str) -> re.Pattern[str]:
    return re.compile(p.replace(r"\s", WS), _A)


_REL: list[tuple[re.Pattern[str], Callable[[PDate, re.Match[str]], PDate]]] = [
    (_r(r"\byesterday\b"), lambda a, m: _add_days(a, -1)),
    (_r(r"\b(?:today|tonight)\b"), lambda a, m: a),
    (_r(r"\btomorrow\b"), lambda a, m: _add_days(a, 1)),
    (_r(r"\blast\s+week\b"), lambda a, m: _add_days(a, -7)),
    (_r(r"\bnext\s+week\b"), lambda a, m: _add_days(a, 7)),
    (_r(r"\bthis\s+week\b"), lambda a, m: a),
    (_r(r"\blast\s+month\b"), lambda a, m: _add_months(a, -1)),
    (_r(r"\bnext\s+month\b"), lambda a, m: _add_months(a, 1)),
    (_r(r"\bthis\s+month\b"), lambda a, m: (a[0], a[1], None) if a[1] else a),
    (_r(r"\blast\s+year\b"), lambda a, m: (a[0] - 1, None, None)),
    (_r(r"\bnext\s+year\b"), lambda a, m: (a[0] + 1, None, None)),
    (_r(r"\b(\d+)\s+days?\s+ago\b"), lambda a, m: _add_days(a, -int(m.group(1)))),
    (_r(r"\b(\d+)\s+days?\s+(?:from now|later)\b"), lambda a, m: _add_days(a, int(m.group(1)))),
    (_r(r"\b(\d+)\s+weeks?\s+ago\b"), lambda a, m: _add_days(a, -7 * int(m.group(1)))),
    (_r(r"\bin\s+(\d+)\s+weeks?\b"), lambda a, m: _add_days(a, 7 * int(m.group(1)))),
    (_r(r"\b(\d+)\s+months?\s+ago\b"), lambda a, m: _add_months(a, -int(m.group(1)))),
    (_r(r"\bin\s+(\d+)\s+months?\b"), lambda a, m: _add_months(a, int(m.group(1)))),
]
_REL_WEEKDAY = _r(rf"\b(last|next|this)\s+({_WD})\b")
_REL_AFTER = [
    (_r(rf"\bthe\s+(?:{_WD})\s+before\b"), -7),
    (_r(r"\bthe\s+week\s+before\b"), -7),
    (_r(rf"\bthe\s+(?:{_WD})\s+after\b"), 7),
    (_r(r"\bthe\s+week\s+after\b"), 7),
]


# every relative expression above contains one of these (weekdays end in "day")
_RELATIVE_CUES = ("day", "tonight", "tomorrow", "week", "month", "year")


def _resolve_relative(text: str, anchor: PDate) -> PDate | None:
    t = text.lower()
    if not any(cue in t for cue in _RELATIVE_CUES):
        return None
    for rx, fn in _REL:
        m = rx.search(t)
        if m:
            return fn(anchor, m)
    wm = _REL_WEEKDAY.search(t)
    if wm and anchor[2] is not None and anchor[1] is not None:
        target = _WEEKDAY[wm.group(2)]
        anchor_wd = (_js_date(anchor[0], anchor[1], anchor[2]).weekday() + 1) % 7
        delta = target - anchor_wd
        if wm.group(1) == "last" and delta >= 0:
            delta -= 7
        elif wm.group(1) == "next" and delta <= 0:
            delta += 7
        return _add_days(anchor, delta)
    for rx, days in _REL_AFTER:
        if rx.search(t):
            return _add_days(anchor, days)
    return None


def scan_document_dates(text: str) -> list[DateHit]:
    """Every absolute date of the document (the anchors of relative expressions)."""
    return _extract_absolutes(text)


def resolve_chunk_date(chunk: str, session: str | None, doc_hits: Sequence[DateHit], chunk_start: int,
                       starts: Sequence[int] | None = None) -> str | None:
    """The chunk's date: its most specific absolute date, else a relative expression
    resolved against the nearest preceding anchor, else ``session``."""
    local = _extract_absolutes(chunk)
    if local:
        best = local[0]
        for h in local[1:]:
            if _spec(h.date) > _spec(best.date):
                best = h
        return _iso(best.date)
    anchor_s = _parse_session(session) if session else None
    if starts is not None:
        import bisect
        k = bisect.bisect_left(starts, chunk_start)
        nearest = doc_hits[k - 1].date if k > 0 else anchor_s
    else:
        before = [h for h in doc_hits if h.index < chunk_start]
        nearest = before[-1].date if before else anchor_s
    if nearest is not None:
        rel = _resolve_relative(chunk, nearest)
        if rel is not None:
            return _iso(rel)
    return _iso(anchor_s) if anchor_s is not None else None


# ── tunnels ───────────────────────────────────────────────────────────────────

_LSH_ACTIVATION = 500
_K, _BANDS = 32, 16
_ROWS = _K // _BANDS
_BUCKET_CAP = 64
_M32 = 0xFFFFFFFF


def _imul(a: int, b: int) -> int:
    return (a * b) & _M32


def _mulberry32(seed: int) -> Callable[[], float]:
    state = [seed & _M32]

    def nxt() -> float:
        a = (state[0] + 0x6D2B79F5) & _M32
        state[0] = a
        t = _imul(a ^ (a >> 15), 1 | a)
        t = ((t + _imul(t ^ (t >> 7), 61 | t)) & _M32) ^ t
        return ((t ^ (t >> 14)) & _M32) / 4294967296

    return nxt


def _hash_params() -> tuple[list[int], list[int]]:
    rnd = _mulberry32(0x3777AAA1)
    a, b = [], []
    for _ in range(_K):
        a.append((math.floor(rnd() * 0xFFFFFFFF) | 1) & _M32)
        b.append(math.floor(rnd() * 0xFFFFFFFF) & _M32)
    return a, b


_HA, _HB = _hash_params()


def fnv1a(s: str) -> int:
    """FNV-1a over the UTF-16 code units of ``s``."""
    h = 0x811C9DC5
    data = s.encode("utf-16-le")
    for i in range(0, len(data), 2):
        h ^= data[i] | (data[i + 1] << 8)
        h = (h * 0x01000193) & _M32
    return h


_fnv = _Memo(fnv1a).__getitem__


def _signatures(token_lists: Sequence[Sequence[str]]) -> list[tuple[int, ...]]:
    """MinHash signatures: ``min((a_k * h + b_k) mod 2**32)`` over each list's tokens.

    uint64 products wrap mod 2**64, which keeps their low 32 bits exact.
    """
    import numpy as np

    a = np.array(_HA, dtype=np.uint64)[:, None]
    b = np.array(_HB, dtype=np.uint64)[:, None]
    out: list[tuple[int, ...]] = []
    empty = (_M32,) * _K
    for tokens in token_lists:
        if not tokens:
            out.append(empty)
            continue
        h = np.array([_fnv(t) for t in tokens], dtype=np.uint64)[None, :]
        v = (a * h + b) & np.uint64(_M32)
        out.append(tuple(int(x) for x in v.min(axis=1)))
    return out


def _lsh_pairs(sigs: Sequence[tuple[int, ...]]) -> list[tuple[int, int]]:
    buckets: dict[tuple[int, ...], list[int]] = {}
    for i, sig in enumerate(sigs):
        for b in range(_BANDS):
            buckets.setdefault((b, *sig[b * _ROWS:(b + 1) * _ROWS]), []).append(i)
    seen: set[tuple[int, int]] = set()
    for members in buckets.values():
        members = members[:_BUCKET_CAP]
        for x in range(len(members)):
            for y in range(x + 1, len(members)):
                seen.add((members[x], members[y]))
    return sorted(seen)


def _phrase_tokens(topics: Sequence[str]) -> list[str]:
    out: dict[str, None] = {}
    for t in topics:
        for w in js_split_ws(t):
            if len(w) >= 2:
                out[w] = None
    return list(out)


def build_tunnels(zettels: Sequence[Zettel], index: EntityIndex, threshold: float = 0.3, top_k: int = 3,
                  verbose_labels: bool = False) -> list[Tunnel]:
    """Tunnels between zettels sharing entities or topic words (top ``top_k`` per zettel)."""
    n = len(zettels)
    toks = [_phrase_tokens(z.topics) for z in zettels]
    tok_sets = [frozenset(t) for t in toks]
    ent_sets = [frozenset(z.entities) for z in zettels]
    if n <= _LSH_ACTIVATION:
        pairs: Iterable[tuple[int, int]] = ((i, j) for i in range(n) for j in range(i + 1, n))
    else:
        pairs = _lsh_pairs(_signatures([[*toks[k], *zettels[k].entities] for k in range(n)]))

    def code(name: str) -> str:
        return name if verbose_labels else index.name_to_code.get(name, name[:3].upper())

    cands: list[tuple[float, int, int, str]] = []
    for i, j in pairs:
        a, b = zettels[i], zettels[j]
        ea, eb = ent_sets[i], ent_sets[j]
        shared = [e for e in a.entities if e in eb] if (ea and eb and not ea.isdisjoint(eb)) else []
        ent_score = len(shared) / ((len(a.entities) + len(b.entities) - len(shared)) or 1) if shared else 0.0
        ta, tb = tok_sets[i], tok_sets[j]
        if ta and tb:
            inter = len(ta & tb)
            topic_score = inter / (len(ta) + len(tb) - inter)
        else:
            topic_score = 0.0
        score = max(ent_score * 1.2, topic_score)
        if score < threshold:
            continue
        if len(shared) >= 2:
            label = "+".join(code(e) for e in shared[:3])
        else:
            tb_topics = set(b.topics)
            phrases = [t for t in a.topics if t in tb_topics]
            if phrases:
                parts = "_".join(phrases[:2])
                label = f"{shared[0]}_{parts}".strip("_") if len(shared) == 1 else parts
            else:
                common = [t for t in toks[i] if t in tb][:2]
                label = "_".join(common) if common else (shared[0] if shared else "")
        cands.append((score, i, j, label))
    cands.sort(key=lambda c: -c[0])  # stable: ties keep pair order
    used = [0] * n
    accepted: list[Tunnel] = []
    for _, i, j, label in cands:
        if used[i] < top_k and used[j] < top_k:
            accepted.append(Tunnel(zettels[i].id, zettels[j].id, label))
            used[i] += 1
            used[j] += 1
    accepted.sort(key=lambda t: t.from_id)
    return accepted
