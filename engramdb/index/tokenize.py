"""The tokenizer: text -> index terms, fixed per file for its whole life.

The contract (spec/bm25.md, section "Tokenizer"):

1. Unicode NFKC normalisation, then ``str.lower()``.
2. Terms are the matches of ``(?u)\\b\\w\\w+\\b`` (Unicode word characters, two or more):
   the scikit-learn / bm25s pattern, so engramdb and bm25s agree token for token.
3. With ``cjk="bigram"`` (new files' default), a run of Han, Hiragana, Katakana or Hangul
   characters inside a word becomes its overlapping bigrams (a lone character: itself), as
   Lucene's CJKBigramFilter; text without such characters is tokenized as without it.
4. Stopwords (Lucene's 33-word English set by default) are removed before stemming.
5. Optional Snowball stemming through PyStemmer (``stemmer="english"``).

The settings are written into the file's ``meta`` at creation
(:meth:`Tokenizer.settings`) and read back on open (:meth:`Tokenizer.from_settings`),
so a file keeps its tokenization even when the library defaults change.
"""
from __future__ import annotations

import itertools
import operator
import re
import string
import unicodedata
from typing import Any, Literal, cast
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from .. import _accel
from ..errors import ConfigMismatchError, ValidationError

__all__ = [
    "LUCENE_EN_STOPWORDS",
    "NEGATIONS",
    "STOPWORD_SETS",
    "TOKEN_PATTERN",
    "Tokenizer",
    "negations",
    "stemming_available",
]

TOKEN_PATTERN = r"(?u)\b\w\w+\b"
_NormalForm = Literal["NFC", "NFD", "NFKC", "NFKD"]
_FAST_PATTERN = r"\w\w+"
# version 1: no "cjk" key (every file before CJK bigrams); version 2 adds it. A tokenizer
# without CJK bigrams records version 1, so its settings are those of files before them.
SETTINGS_VERSION = 2
_VERSION_WITHOUT_CJK = 1
CJK_MODES = ("bigram",)

# The characters bigrammed: the scripts Lucene's CJKBigramFilter handles (Han, Hiragana,
# Katakana, Hangul), as blocks. Only those that are word characters (\w) count, so
# punctuation inside a block (the radicals U+2E80-U+2FDF, symbols) still splits words.
# Han: CJK radicals, iteration and number marks (U+3005, U+3007, U+3021-3029, U+3038-303B),
# Extension A, Unified Ideographs, compatibility ideographs, Extensions B-H; Hiragana and
# Katakana (U+30FC, the prolonged sound mark, with them as in Lucene), their phonetic
# extensions, half-width forms and the Kana supplements; Hangul Jamo, compatibility Jamo,
# Jamo extensions, syllables and half-width forms.
_CJK_CLASS = ("\u1100-\u11ff\u2e80-\u2fdf\u3005\u3007\u3021-\u3029\u3038-\u303b\u3041-\u309f"
              "\u30a1-\u30ff\u3131-\u318f\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\ua960-\ua97f"
              "\uac00-\ud7ff\uf900-\ufaff\uff66-\uffdc\U0001b000-\U0001b16f\U00020000-\U0003134f")
# Whether a text may hold CJK characters: the blocks' span in three ranges, faster to test
# than the class (a text in the gaps takes the CJK split, which gives its words as
# TOKEN_PATTERN does). Latin, Greek, Cyrillic, ..., the punctuation of U+2000-2E7F (curly
# quotes, dashes) and the emoji (U+1F000-1FAFF) are outside them.
_MAY_HOLD_CJK = re.compile("[\u1100-\u11ff\u2e80-\U0001b16f\U00020000-\U0003134f]").search
_HAS_CJK = re.compile(f"[{_CJK_CLASS}]").search
_WORD_RUNS = re.compile(r"\w+").findall
# the pieces of a run of word characters: CJK characters (group 1) or others
_CJK_PIECES = re.compile(f"([{_CJK_CLASS}]+)|[^{_CJK_CLASS}]+").finditer

# Negation words: "not" is a stopword, so two texts that differ only in it have the same
# terms ("Use argparse" / "Do not use argparse"), hence the same built-in vector. Used by
# the agent's fact dedupe and by forget(query=). Contractions count as "not".
_NEGATION_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")
NEGATIONS = frozenset("not no never nor neither none nothing nobody nowhere without cannot".split())


def negations(text: str) -> tuple[str, ...]:
    """The negation words of ``text``, sorted (lowercased NFKC; ``don't``, ``can't``, ...
    and ``cannot`` as ``not``): texts whose negations differ say different things."""
    found = []
    for word in _NEGATION_WORD.findall(unicodedata.normalize("NFKC", text).lower().replace("\u2019", "'")):
        if word.endswith("n't") or word == "cannot":
            found.append("not")
        elif word in NEGATIONS:
            found.append(word)
    return tuple(sorted(found))


# Lucene's EnglishAnalyzer default stop set; also bm25s's "en" list.
LUCENE_EN_STOPWORDS = (
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into",
    "is", "it", "no", "not", "of", "on", "or", "such", "that", "the", "their", "then",
    "there", "these", "they", "this", "to", "was", "will", "with",
)
STOPWORD_SETS: dict[str, tuple[str, ...]] = {"lucene_en": LUCENE_EN_STOPWORDS, "none": ()}

# The batch path works on UTF-8 bytes. For ASCII text one bytes.translate does the
# lowercasing and the regex's job: ASCII letters, digits and "_" are exactly the ASCII
# characters Unicode \w matches, so mapping every other ASCII byte to a space yields the
# maximal word runs (one-character runs are dropped afterwards). NFKC leaves ASCII text
# unchanged. Non-ASCII text goes through the reference path; its words, UTF-8 encoded,
# hold no ASCII byte the table changes (all bytes of a multi-byte character are >= 0x80),
# so the same translate returns them intact.
_WORD_ASCII = (string.ascii_letters + string.digits + "_").encode()
_BATCH_TABLE = bytes(
    c if c in _WORD_ASCII.lower() or c >= 0x80
    else c + 32 if c in string.ascii_uppercase.encode() else 0x20
    for c in range(256))
_SPACE = 0x20
# A word of up to 16 bytes is numbered by its bytes read as two little-endian uint64s (the
# bytes after the word masked off), as the int ``low | high << 64``: exact, since a word
# holds no zero byte. Longer words (rare) are numbered by their bytes.
_KEY_BYTES = 8
_KEY_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(_KEY_BYTES + 1)], dtype=np.uint64)
_PAD = b" " * (2 * _KEY_BYTES)  # after a chunk: every word ends before it, and 16-byte reads stay inside
_MIX_LOW = np.uint64(0x9E3779B97F4A7C15)  # odd multipliers for the hash of a key pair
_MIX_HIGH = np.uint64(0xC2B2AE3D27D4EB4F)
_DROP = -1
_CHUNK_DOCS = 4096

# Bound the per-tokenizer stem memo so a long-lived handle over an open vocabulary
# cannot grow without limit; clearing is cheap and keeps results identical.
_STEM_CACHE_MAX = 200_000


def _is_word(word: str) -> bool:
    """Whether a word of the batch scan is a word, not a one-character run: ASCII texts'
    one-character runs are scanned, non-ASCII texts were split by the reference path, whose
    only one-character words are lone CJK characters (not ASCII)."""
    return len(word) >= 2 or not word.isascii()


def stemming_available() -> bool:
    """Whether PyStemmer (the optional ``stem`` extra) can be imported."""
    try:
        import Stemmer  # noqa: F401
    except ImportError:
        return False
    return True


def _unpack_key(key: int) -> bytes:
    """The word of a packed key (see ``_KEY_MASKS``)."""
    return key.to_bytes(2 * _KEY_BYTES, "little").rstrip(b"\x00")


def _group_pairs(low: np.ndarray, high: np.ndarray) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Group equal ``(low, high)`` uint64 pairs, like ``np.unique(..., return_inverse=True)``
    but several times faster.

    One sort of uint64s, each a hash of a pair in the high bits and the pair's position in
    the low bits (numpy sorts plain uint64s much faster than it argsorts), puts equal pairs
    next to each other; a group is a run of equal pairs. Only a hash shared by different
    pairs (rare) could split a pair's run: then ``np.unique`` takes over.

    Returns:
        ``(keys, pos, counts)``: the distinct pairs as ints ``low | high << 64`` (in no
        particular order), and the pairs' positions grouped: the first ``counts[0]`` of
        ``pos`` are those of ``keys[0]``, the next ``counts[1]`` those of ``keys[1]``, ...
    """
    n = low.size
    if n == 0:
        return [], np.zeros(0, np.int64), np.zeros(0, np.int64)
    bits = max(1, (n - 1).bit_length())
    pos_mask = np.uint64((1 << bits) - 1)
    packed = (((low ^ (high * _MIX_HIGH)) * _MIX_LOW) & ~pos_mask) | np.arange(n, dtype=np.uint64)
    packed.sort()
    pos = (packed & pos_mask).view(np.int64)
    sorted_low, sorted_high = np.take(low, pos), np.take(high, pos)
    first = np.empty(n, dtype=bool)
    first[0] = True
    np.not_equal(sorted_low[1:], sorted_low[:-1], out=first[1:])
    first[1:] |= sorted_high[1:] != sorted_high[:-1]
    heads = np.flatnonzero(first)
    hashes = packed[heads] >> np.uint64(bits)
    if hashes.size > 1 and not np.all(hashes[1:] != hashes[:-1]):  # two pairs share a hash: runs may split
        pairs, inverse = np.unique(np.stack([low, high], axis=1), axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        return ([a | b << 64 for a, b in pairs.tolist()], np.argsort(inverse, kind="stable"),
                np.bincount(inverse, minlength=len(pairs)))
    uniq_high = sorted_high[heads]
    keys = sorted_low[heads].tolist()
    longer = np.flatnonzero(uniq_high)  # the words of more than 8 bytes
    for i, h in zip(longer.tolist(), uniq_high[longer].tolist()):
        keys[i] |= h << 64
    return keys, pos, np.diff(heads, append=n)


def _stop_table(stopwords: frozenset[str]) -> tuple[np.ndarray, np.uint64, np.uint64] | None:
    """A perfect hash of the stopwords' keys (see ``_KEY_MASKS``): ``(table, mult, shift)``
    with ``table[(key * mult) >> shift] == key`` exactly for a stopword's key, so a batch
    drops stopword tokens before numbering them. None without stopwords of 2-8 ASCII bytes
    (the others are dropped after numbering, like every stopword before)."""
    keys = sorted({int.from_bytes(w.encode(), "little") for w in stopwords if w.isascii() and 2 <= len(w) <= _KEY_BYTES})
    if not keys:
        return None
    for bits in range(max(4, len(keys).bit_length() + 2), 17):
        for attempt in range(64):  # fixed odd multipliers: the same table in every process
            mult = (0x9E3779B97F4A7C15 + attempt * 0xD6E8FEB86659FD93) % 2**64 | 1
            slots = [(key * mult) % 2**64 >> (64 - bits) for key in keys]
            if len(set(slots)) == len(keys):
                table = np.zeros(1 << bits, dtype=np.uint64)  # 0 is no word's key: a word holds no zero byte
                table[slots] = keys
                return table, np.uint64(mult), np.uint64(64 - bits)
    return None


def _token_values(joined: bytes, offsets: np.ndarray, lookup: Callable[[Sequence[int | bytes]], np.ndarray],
                  stop: tuple[np.ndarray, np.uint64, np.uint64] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Split UTF-8 texts, joined by spaces, into word runs (see ``_BATCH_TABLE``), drop those
    of one byte (one ASCII character) and the stopwords in ``stop`` (:func:`_stop_table`),
    and give each other its word's value; the texts start at byte ``offsets``.

    ``lookup`` maps a list of distinct word keys (see ``_KEY_MASKS``; bytes for words
    beyond 16 bytes, which first pass through as key 0) to their values (int64).

    Returns:
        ``(values, firsts)``: each kept token's value, in text order, and each text's first
        kept token's index.
    """
    data = (joined + _PAD).translate(_BATCH_TABLE)
    is_word = np.frombuffer(data, dtype=np.uint8) != _SPACE
    # True at a word's first byte and just after its last: starts and ends alternate
    edges = np.empty(is_word.size, dtype=bool)
    edges[0] = is_word[0]
    np.not_equal(is_word[1:], is_word[:-1], out=edges[1:])
    edges = np.flatnonzero(edges)
    starts, ends = edges[0::2], edges[1::2]
    lens = ends - starts
    # an unaligned little-endian uint64 at every byte offset
    at = np.ndarray((len(data) - _KEY_BYTES + 1,), dtype="<u8", buffer=data, strides=(1,))
    # (np.take of the masks: several times faster than indexing; "clip" gives longer words 8 bytes)
    low = at[starts] & np.take(_KEY_MASKS, lens, mode="clip")
    # Tokens that never become terms leave before grouping (~40% of English text). A longer
    # word's first 8 bytes never equal a stopword's shorter key: its masked-off bytes are 0.
    drop = lens == 1
    if stop is not None:
        table, mult, shift = stop
        drop |= table[(low * mult) >> shift] == low
    kept = np.flatnonzero(~drop)
    starts, ends, lens, low = starts[kept], ends[kept], lens[kept], low[kept]
    firsts = np.searchsorted(starts, offsets)
    high = np.zeros_like(low)
    over = np.flatnonzero(lens > _KEY_BYTES)  # the words that need a second uint64 (~10% in English)
    high[over] = at[starts[over] + _KEY_BYTES] & np.take(_KEY_MASKS, lens[over] - _KEY_BYTES, mode="clip")
    rest = np.flatnonzero(lens > 2 * _KEY_BYTES) if lens.size and lens.max() > 2 * _KEY_BYTES else None
    if rest is not None:  # words beyond 16 bytes (rare) share key 0 here and get their values by their bytes
        low[rest] = high[rest] = 0
    keys, pos, counts = _group_pairs(low, high)
    values = np.empty(starts.size, dtype=np.int64)
    values[pos] = np.repeat(lookup(keys), counts)
    if rest is not None:
        values[rest] = lookup([data[a:b] for a, b in zip(starts[rest].tolist(), ends[rest].tolist())])
    return values, firsts


def _load_stemmer(language: str) -> tuple[Callable[[str], str], Callable[[list[str]], list[str]]]:
    """PyStemmer's ``(stemWord, stemWords)`` for ``language`` (its own cache off: the
    tokenizer memoises)."""
    try:
        import Stemmer
    except ImportError as exc:
        raise ConfigMismatchError(
            f"this file's tokenizer stems words with Snowball ({language}) but PyStemmer is not installed",
            hint="pip install 'engramdb[stem]' (PyStemmer), then open the file again",
        ) from exc
    try:
        stemmer = Stemmer.Stemmer(language, 0)
    except KeyError as exc:
        raise ConfigMismatchError(
            f"PyStemmer has no Snowball stemmer for language {language!r}",
            hint="use a language listed by Stemmer.algorithms(), e.g. 'english'",
        ) from exc
    stem: Callable[[str], str] = stemmer.stemWord  # PyStemmer is untyped: the library boundary
    stem_words: Callable[[list[str]], list[str]] = stemmer.stemWords
    return stem, stem_words


class Tokenizer:
    """Turns text into index terms.

    Args:
        stopwords: name of a stopword set: ``"lucene_en"`` (default) or ``"none"``.
        stemmer: a Snowball language for PyStemmer (e.g. ``"english"``), ``None`` for no
            stemming, or ``"auto"`` (the default): ``"english"`` when PyStemmer is
            installed, else ``None``. The resolved value is what :meth:`settings` records.
        normalize: a :func:`unicodedata.normalize` form, or ``None``.
        cjk: ``"bigram"`` (the default): a run of Han, Hiragana, Katakana or Hangul
            characters gives its overlapping bigrams (a lone one itself), so text without
            spaces is searchable; ``None``: every run of word characters is one word, as in
            files made before (spec/bm25.md, "Tokenizer").

    Raises:
        ValidationError: an unknown stopword set, normalisation form or CJK mode.
        ConfigMismatchError: stemming is asked for but PyStemmer is missing.
    """

    def __init__(self, *, stopwords: str = "lucene_en", stemmer: str | None = "auto",
                 normalize: str | None = "NFKC", cjk: str | None = "bigram") -> None:
        if stopwords not in STOPWORD_SETS:
            raise ValidationError(
                f"unknown stopword set {stopwords!r}",
                hint=f"use one of {', '.join(sorted(STOPWORD_SETS))}",
            )
        if normalize not in (None, "NFC", "NFKC", "NFD", "NFKD"):
            raise ValidationError(f"unknown Unicode normalisation {normalize!r}", hint="use 'NFKC', 'NFC' or None")
        if cjk is not None and cjk not in CJK_MODES:
            raise ValidationError(f"unknown CJK mode {cjk!r}", hint="use 'bigram' or None")
        if stemmer == "auto":
            stemmer = "english" if stemming_available() else None
        if stemmer is not None and (not isinstance(stemmer, str) or not stemmer):
            raise ValidationError("stemmer must be a Snowball language name or None")
        self.stopwords_name = stopwords
        self.stemmer_name = stemmer
        self.normalize = cast("_NormalForm | None", normalize)  # one of the four forms, checked above
        self.cjk = cjk
        # whether a request named its CJK mode (see accepts): from_settings clears it
        self._cjk_named = True
        self._stop = frozenset(STOPWORD_SETS[stopwords])
        self._stop_keys = _stop_table(self._stop)
        # Same matches as TOKEN_PATTERN (maximal runs of two or more word characters: a
        # match can only start inside a run after failing at a one-character run), ~35%
        # faster without the \b assertions. test_tokenize checks it against bm25s.
        self._findall = re.compile(_FAST_PATTERN).findall
        self._split = self._split_cjk if cjk else self._findall
        self._stem: Callable[[str], str] | None = None
        self._stem_words: Callable[[list[str]], list[str]] | None = None
        if stemmer:
            self._stem, self._stem_words = _load_stemmer(stemmer)
        self._memo: dict[str, str] = {}

    # --- settings persisted in meta ---------------------------------------------------

    def settings(self) -> dict[str, Any]:
        """The settings to record in the file's meta (plain JSON-like data).

        Without CJK bigrams: version 1 and no ``cjk`` key, exactly the settings of files
        made before them (their dumps and meta stay byte for byte the same)."""
        settings: dict[str, Any] = {
            "version": SETTINGS_VERSION if self.cjk else _VERSION_WITHOUT_CJK,
            "pattern": TOKEN_PATTERN,
            "lowercase": True,
            "normalize": self.normalize,
            "stopwords": self.stopwords_name,
            "stemmer": self.stemmer_name,
        }
        if self.cjk:
            settings["cjk"] = self.cjk
        return settings

    def accepts(self, recorded: Mapping[str, Any]) -> bool:
        """Whether a file that records ``recorded`` has the tokenizer this one asks for.

        Equal settings, or, when the request did not name ``cjk``, the same settings on a
        file made before CJK bigrams (version 1): such a file keeps its tokenizer, and
        opening it with the settings it was opened with before stays possible."""
        mine = self.settings()
        if recorded == mine:
            return True
        if self._cjk_named or not self.cjk:
            return False
        mine.pop("cjk")
        mine["version"] = _VERSION_WITHOUT_CJK
        return dict(recorded) == mine

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> Tokenizer:
        """Rebuild the tokenizer a file was created with, or build one from options.

        Missing keys take the defaults, so ``{"stemmer": None}`` is a valid request; keys
        that are present must match what this version implements. Settings that name their
        ``version`` are a file's: version 1 (files before CJK bigrams) means ``cjk=None``.

        Raises:
            ConfigMismatchError: unknown keys, settings from a newer tokenizer version, a
                pattern this version does not implement, or stemming without PyStemmer.
        """
        if not isinstance(settings, Mapping):
            raise ConfigMismatchError(f"tokenizer settings must be a mapping, got {type(settings).__name__}")
        unknown = sorted(set(settings) - {"version", "pattern", "lowercase", "normalize", "stopwords", "stemmer", "cjk"})
        if unknown:
            raise ConfigMismatchError(f"unknown tokenizer settings: {', '.join(map(str, unknown))}",
                                      hint="known: stopwords, stemmer, normalize, cjk")
        version = settings.get("version", SETTINGS_VERSION)
        old = type(version) is int and version == _VERSION_WITHOUT_CJK  # (True == 1: a bool is no version)
        if ((not old and (type(version) is not int or version != SETTINGS_VERSION))
                or (old and "cjk" in settings)
                or settings.get("pattern", TOKEN_PATTERN) != TOKEN_PATTERN
                or settings.get("lowercase", True) is not True):
            raise ConfigMismatchError(
                f"the file's tokenizer (version {version!r}) is not supported by this engramdb",
                hint="upgrade engramdb to open this file",
            )
        try:
            tokenizer = cls(stopwords=settings.get("stopwords", "lucene_en"), stemmer=settings.get("stemmer", "auto"),
                            normalize=settings.get("normalize", "NFKC"), cjk=None if old else settings.get("cjk", "bigram"))
        except ValidationError as exc:
            raise ConfigMismatchError(f"the tokenizer settings are not supported: {exc.message}") from exc
        if not old and "version" in settings and tokenizer.cjk is None:  # version 2 always names its mode
            raise ConfigMismatchError(f"the file's tokenizer (version {version!r}) has no CJK mode",
                                      hint="a version 2 tokenizer records cjk='bigram'; run `engramdb verify FILE`")
        tokenizer._cjk_named = "cjk" in settings or "version" in settings
        return tokenizer

    def __repr__(self) -> str:
        return (f"Tokenizer(stopwords={self.stopwords_name!r}, stemmer={self.stemmer_name!r}, "
                f"normalize={self.normalize!r}, cjk={self.cjk!r})")

    # --- tokenizing ---------------------------------------------------------------

    def words(self, text: str) -> list[str]:
        """Normalised, lowercased words with stopwords removed, before stemming."""
        stop = self._stop
        return [w for w in self._split(self._normal_lower(text)) if w not in stop]

    def _split_cjk(self, text: str) -> list[str]:
        """The words of normalised, lowercased ``text`` with CJK bigrams (before stopwords).

        A maximal run of word characters splits where CJK characters (``_CJK_CLASS``) start
        or stop; a CJK piece gives its overlapping bigrams (one character: itself, Lucene's
        lone unigram), any other piece of two or more characters is a word. Text without
        CJK characters gives exactly the matches of ``TOKEN_PATTERN``."""
        if text.isascii() or _MAY_HOLD_CJK(text) is None:
            return self._findall(text)
        words: list[str] = []
        for run in _WORD_RUNS(text):
            if _HAS_CJK(run) is None:
                if len(run) >= 2:
                    words.append(run)
                continue
            for m in _CJK_PIECES(run):
                piece = m.group()
                if m.group(1) is None:
                    if len(piece) >= 2:
                        words.append(piece)
                elif len(piece) == 1:
                    words.append(piece)
                else:
                    words.extend([piece[i:i + 2] for i in range(len(piece) - 1)])
        return words

    def stem(self, word: str) -> str:
        """The index term for one already-lowercased word (identity without a stemmer)."""
        if self._stem is None:
            return word
        memo = self._memo
        term = memo.get(word)
        if term is None:
            if len(memo) >= _STEM_CACHE_MAX:
                memo.clear()
            term = memo[word] = self._stem(word)
        return term

    def encode_many(self, texts: Sequence[str]) -> tuple[list[str], np.ndarray, np.ndarray]:
        """The index terms of many texts at once, as flat arrays (the bulk-ingest path).

        Equal to ``[self(t) for t in texts]``, and several times faster: ASCII texts are
        lowercased and split by one ``bytes.translate`` of a whole chunk instead of a regex
        scan each, tokens are found and numbered with numpy on the chunk's bytes (no Python
        object per token), and stopword filtering and stemming run once per distinct word.

        Returns:
            ``(terms, term_ids, lengths)``: the sorted distinct terms; for every token in
            text order its index into ``terms`` (int64), texts one after another; and the
            number of terms of each text. So text ``i`` is ``terms[term_ids[a:b]]`` with
            ``a = lengths[:i].sum()`` and ``b = a + lengths[i]``.

        Raises:
            ValidationError: an element of ``texts`` is not a string.
        """
        texts = list(texts)
        try:
            ascii_ = list(map(str.isascii, texts))
        except TypeError:  # not a str
            bad = next(text for text in texts if not isinstance(text, str))
            raise ValidationError(f"can only tokenize strings, got {type(bad).__name__}") from None
        for i in itertools.compress(range(len(texts)), map(operator.not_, ascii_)):
            texts[i] = " ".join(self._split(self._normal_lower(texts[i])))  # the reference path
        native = _accel.NATIVE
        if native is not None:
            return self._encode_native(native, texts, ascii_)
        # word key -> its term's number (terms numbered on first sight) or _DROP (too short,
        # a stopword); a new word is decoded, filtered and stemmed once
        kinds: dict[int | bytes, int] = {0: _DROP}  # 0: a word beyond 16 bytes, numbered by its bytes instead
        numbers: dict[str, int] = {}
        stop = self._stop

        def lookup(keys: Sequence[int | bytes]) -> np.ndarray:
            new = [key for key in keys if key not in kinds]
            if new:
                words = [(_unpack_key(k) if isinstance(k, int) else k).decode("utf-8", "surrogatepass") for k in new]
                stems = self._stem_all([w for w in words if _is_word(w) and w not in stop])
                for key, word in zip(new, words):
                    term = stems.get(word)
                    kinds[key] = _DROP if term is None else numbers.setdefault(term, len(numbers))
            return np.fromiter(map(kinds.__getitem__, keys), dtype=np.int64, count=len(keys))

        parts, doc_starts = [], []
        ntok = 0
        for start in range(0, len(texts), _CHUNK_DOCS):
            chunk = texts[start:start + _CHUNK_DOCS]
            sizes = np.fromiter(map(len, chunk if all(ascii_[start:start + _CHUNK_DOCS]) else  # UTF-8 bytes
                                    [text.encode("utf-8", "surrogatepass") for text in chunk]),
                                dtype=np.int64, count=len(chunk))
            offsets = np.concatenate(([0], np.cumsum(sizes[:-1] + 1)))  # each text's first byte, joined by spaces
            joined = " ".join(chunk).encode("utf-8", "surrogatepass")
            values, firsts = _token_values(joined, offsets, lookup, self._stop_keys)
            parts.append(values)
            doc_starts.append(firsts + ntok)
            ntok += values.size
        mapped = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        kept = np.flatnonzero(mapped >= 0)
        terms = sorted(numbers)
        rank = np.empty(len(terms), dtype=np.int64)
        rank[[numbers[t] for t in terms]] = np.arange(len(terms))
        # a text's length: the kept tokens from its first token to the next text's
        firsts = np.concatenate(doc_starts) if doc_starts else np.zeros(0, np.int64)
        lengths = np.diff(np.searchsorted(kept, firsts), append=kept.size)
        return terms, rank[mapped[kept]], lengths.astype(np.int64)

    def _encode_native(self, native: _accel.Native, texts: list[str], ascii_: list[bool]
                       ) -> tuple[list[str], np.ndarray, np.ndarray]:
        """:meth:`encode_many` with the C extension (engramdb/_native.c), once its texts are
        ASCII or went through the reference path: one pass over all the texts finds their
        words (``_BATCH_TABLE``'s bytes) and numbers the distinct ones, stopword filtering
        and stemming run once per distinct word, and a second pass keeps the tokens that are
        terms and counts each text's. The same terms, ids and lengths as the numpy path."""
        items: Sequence[str | bytes] = texts if all(ascii_) else \
            [text if is_ascii else text.encode("utf-8", "surrogatepass") for text, is_ascii in zip(texts, ascii_)]
        words, inverse, firsts = native.scan_texts(items, _BATCH_TABLE)
        stop = self._stop
        stems = self._stem_all([w for w in words if _is_word(w) and w not in stop])
        terms = sorted(set(stems.values()))
        rank = dict(zip(terms, range(len(terms))))
        get = stems.get
        values = np.fromiter((rank[t] if (t := get(w)) is not None else _DROP for w in words),
                             dtype=np.int64, count=len(words))
        ids, lengths = native.keep_tokens(inverse, firsts, values.tobytes())
        return terms, np.frombuffer(ids, dtype="=i8"), np.frombuffer(lengths, dtype="=i8")

    def _normal_lower(self, text: str) -> str:
        if self.normalize:
            text = unicodedata.normalize(self.normalize, text)
        return text.lower()

    def _stem_all(self, words: Sequence[str]) -> dict[str, str]:
        """word -> term for distinct words (memoised like :meth:`stem`)."""
        if self._stem_words is None or self._stem is None:
            return {w: w for w in words}
        memo = self._memo
        if len(memo) >= _STEM_CACHE_MAX:
            memo.clear()
        missing = [w for w in words if w not in memo]
        fresh = dict(zip(missing, self._stem_words(missing))) if missing else {}  # one PyStemmer call
        room = _STEM_CACHE_MAX - len(memo)
        memo.update(fresh if room >= len(fresh) else itertools.islice(fresh.items(), room))
        # another thread may clear the memo meanwhile: recompute, never fail (as __call__)
        get, stem = memo.get, self._stem
        return {w: fresh.get(w) or get(w) or stem(w) for w in words}

    def __call__(self, text: str) -> list[str]:
        """The index terms of ``text``, in order, duplicates kept.

        Raises:
            ValidationError: ``text`` is not a string.
        """
        if not isinstance(text, str):
            raise ValidationError(f"can only tokenize strings, got {type(text).__name__}")
        words = self.words(text)
        if self._stem is None:
            return words
        memo = self._memo
        try:  # the hot path: every word seen before (a dict lookup per token)
            return [memo[w] for w in words]
        except KeyError:
            pass
        if len(memo) >= _STEM_CACHE_MAX:
            memo.clear()
        stem = self._stem
        for w in words:
            if w not in memo:
                memo[w] = stem(w)
        get = memo.get  # another thread may clear the memo meanwhile: recompute, never fail
        return [get(w) or stem(w) for w in words]
