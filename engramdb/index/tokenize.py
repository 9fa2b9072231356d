"""The tokenizer: text -> index terms, fixed per file for its whole life.

The contract (spec/bm25.md, section "Tokenizer"):

1. Unicode NFKC normalisation, then ``str.lower()``.
2. Terms are the matches of ``(?u)\\b\\w\\w+\\b`` (Unicode word characters, two or more):
   the scikit-learn / bm25s pattern, so engramdb and bm25s agree token for token.
3. Stopwords (Lucene's 33-word English set by default) are removed before stemming.
4. Optional Snowball stemming through PyStemmer (``stemmer="english"``).

The settings are written into the file's ``meta`` at creation
(:meth:`Tokenizer.settings`) and read back on open (:meth:`Tokenizer.from_settings`),
so a file keeps its tokenization even when the library defaults change.
"""
from __future__ import annotations

import itertools
import re
import string
import unicodedata
from collections import defaultdict
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import ConfigMismatchError, ValidationError

__all__ = [
    "LUCENE_EN_STOPWORDS",
    "STOPWORD_SETS",
    "TOKEN_PATTERN",
    "Tokenizer",
    "stemming_available",
]

TOKEN_PATTERN = r"(?u)\b\w\w+\b"
_FAST_PATTERN = r"\w\w+"
SETTINGS_VERSION = 1

# Lucene's EnglishAnalyzer default stop set; also bm25s's "en" list.
LUCENE_EN_STOPWORDS = (
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into",
    "is", "it", "no", "not", "of", "on", "or", "such", "that", "the", "their", "then",
    "there", "these", "they", "this", "to", "was", "will", "with",
)
STOPWORD_SETS: dict[str, tuple[str, ...]] = {"lucene_en": LUCENE_EN_STOPWORDS, "none": ()}

# The batch path works on UTF-8 bytes. For ASCII text one bytes.translate does the
# lowercasing and the regex's job: ASCII letters, digits and "_" are exactly the ASCII
# characters Unicode \w matches, so mapping every other ASCII byte to a space and
# splitting yields the maximal word runs (one-character runs are dropped afterwards).
# NFKC leaves ASCII text unchanged. Non-ASCII text goes through the reference path; its
# words, UTF-8 encoded, hold no ASCII byte the table changes (all bytes of a multi-byte
# character are >= 0x80), so the same translate and split return them intact.
_WORD_ASCII = (string.ascii_letters + string.digits + "_").encode()
# Separates documents in the joined batch: kept by the table, never inside a word, and
# removed from any document that contains it before joining.
_DOC_SEP = b"\x00"
_SEP_TEXT = _DOC_SEP.decode()
_BATCH_TABLE = bytes(
    c if c in _WORD_ASCII.lower() or c >= 0x80 or c == _DOC_SEP[0]
    else c + 32 if c in string.ascii_uppercase.encode() else 0x20
    for c in range(256))
_ASCII_TABLE = str.maketrans({chr(c): " " for c in range(128) if c not in _WORD_ASCII}
                             | dict(zip(string.ascii_uppercase, string.ascii_lowercase)))
_DROP, _SEP_ID = -1, -2
_CHUNK_DOCS = 1024

# Bound the per-tokenizer stem memo so a long-lived handle over an open vocabulary
# cannot grow without limit; clearing is cheap and keeps results identical.
_STEM_CACHE_MAX = 200_000


def stemming_available() -> bool:
    """Whether PyStemmer (the optional ``stem`` extra) can be imported."""
    try:
        import Stemmer  # noqa: F401
    except ImportError:
        return False
    return True


def _load_stemmer(language: str) -> Callable[[str], str]:
    try:
        import Stemmer
    except ImportError as exc:
        raise ConfigMismatchError(
            f"this file's tokenizer stems words with Snowball ({language}) but PyStemmer is not installed",
            hint="pip install 'engramdb[stem]' (PyStemmer), then open the file again",
        ) from exc
    try:
        stemmer = Stemmer.Stemmer(language)
    except KeyError as exc:
        raise ConfigMismatchError(
            f"PyStemmer has no Snowball stemmer for language {language!r}",
            hint="use a language listed by Stemmer.algorithms(), e.g. 'english'",
        ) from exc
    return stemmer.stemWord


class Tokenizer:
    """Turns text into index terms.

    Args:
        stopwords: name of a stopword set: ``"lucene_en"`` (default) or ``"none"``.
        stemmer: a Snowball language for PyStemmer (e.g. ``"english"``), ``None`` for no
            stemming, or ``"auto"`` (the default): ``"english"`` when PyStemmer is
            installed, else ``None``. The resolved value is what :meth:`settings` records.
        normalize: a :func:`unicodedata.normalize` form, or ``None``.

    Raises:
        ValidationError: an unknown stopword set or normalisation form.
        ConfigMismatchError: stemming is asked for but PyStemmer is missing.
    """

    def __init__(self, *, stopwords: str = "lucene_en", stemmer: str | None = "auto",
                 normalize: str | None = "NFKC") -> None:
        if stopwords not in STOPWORD_SETS:
            raise ValidationError(
                f"unknown stopword set {stopwords!r}",
                hint=f"use one of {', '.join(sorted(STOPWORD_SETS))}",
            )
        if normalize not in (None, "NFC", "NFKC", "NFD", "NFKD"):
            raise ValidationError(f"unknown Unicode normalisation {normalize!r}", hint="use 'NFKC', 'NFC' or None")
        if stemmer == "auto":
            stemmer = "english" if stemming_available() else None
        if stemmer is not None and (not isinstance(stemmer, str) or not stemmer):
            raise ValidationError("stemmer must be a Snowball language name or None")
        self.stopwords_name = stopwords
        self.stemmer_name = stemmer
        self.normalize = normalize
        self._stop = frozenset(STOPWORD_SETS[stopwords])
        # Same matches as TOKEN_PATTERN (maximal runs of two or more word characters: a
        # match can only start inside a run after failing at a one-character run), ~35%
        # faster without the \b assertions. test_tokenize checks it against bm25s.
        self._findall = re.compile(_FAST_PATTERN).findall
        self._stem = _load_stemmer(stemmer) if stemmer else None
        self._memo: dict[str, str] = {}

    # --- settings persisted in meta ---------------------------------------------------

    def settings(self) -> dict[str, Any]:
        """The settings to record in the file's meta (plain JSON-like data)."""
        return {
            "version": SETTINGS_VERSION,
            "pattern": TOKEN_PATTERN,
            "lowercase": True,
            "normalize": self.normalize,
            "stopwords": self.stopwords_name,
            "stemmer": self.stemmer_name,
        }

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> "Tokenizer":
        """Rebuild the tokenizer a file was created with, or build one from options.

        Missing keys take the defaults, so ``{"stemmer": None}`` is a valid request; keys
        that are present must match what this version implements.

        Raises:
            ConfigMismatchError: unknown keys, settings from a newer tokenizer version, a
                pattern this version does not implement, or stemming without PyStemmer.
        """
        if not isinstance(settings, Mapping):
            raise ConfigMismatchError(f"tokenizer settings must be a mapping, got {type(settings).__name__}")
        unknown = sorted(set(settings) - {"version", "pattern", "lowercase", "normalize", "stopwords", "stemmer"})
        if unknown:
            raise ConfigMismatchError(f"unknown tokenizer settings: {', '.join(map(str, unknown))}",
                                      hint="known: stopwords, stemmer, normalize")
        version = settings.get("version", SETTINGS_VERSION)
        if (version != SETTINGS_VERSION or settings.get("pattern", TOKEN_PATTERN) != TOKEN_PATTERN
                or settings.get("lowercase", True) is not True):
            raise ConfigMismatchError(
                f"the file's tokenizer (version {version!r}) is not supported by this engramdb",
                hint="upgrade engramdb to open this file",
            )
        try:
            return cls(stopwords=settings.get("stopwords", "lucene_en"), stemmer=settings.get("stemmer", "auto"),
                       normalize=settings.get("normalize", "NFKC"))
        except ValidationError as exc:
            raise ConfigMismatchError(f"the tokenizer settings are not supported: {exc.message}") from exc

    def __repr__(self) -> str:
        return f"Tokenizer(stopwords={self.stopwords_name!r}, stemmer={self.stemmer_name!r}, normalize={self.normalize!r})"

    # --- tokenizing ---------------------------------------------------------------

    def words(self, text: str) -> list[str]:
        """Normalised, lowercased words with stopwords removed, before stemming."""
        stop = self._stop
        return [w for w in self._findall(self._normal_lower(text)) if w not in stop]

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
        lowercased and split by one ``bytes.translate`` of the whole batch instead of a
        regex scan each, all texts are split in one pass, and stopword filtering and stemming run once per
        distinct word rather than once per token.

        Returns:
            ``(terms, term_ids, lengths)``: the sorted distinct terms; for every token in
            text order its index into ``terms`` (int64), texts one after another; and the
            number of terms of each text. So text ``i`` is ``terms[term_ids[a:b]]`` with
            ``a = lengths[:i].sum()`` and ``b = a + lengths[i]``.

        Raises:
            ValidationError: an element of ``texts`` is not a string.
        """
        pieces = []
        for text in texts:
            if not isinstance(text, str):
                raise ValidationError(f"can only tokenize strings, got {type(text).__name__}")
            if not text.isascii():  # the reference path, words joined by spaces
                text = " ".join(self._findall(self._normal_lower(text)))
            elif _SEP_TEXT in text:
                text = text.translate(_ASCII_TABLE)  # a separator inside a document: a space, as in the regex path
            pieces.append(text)
        vocab: dict[bytes, int] = defaultdict(itertools.count().__next__)  # numbers words on first sight
        sep_id = vocab[_DOC_SEP]
        glue = b" " + _DOC_SEP + b" "
        parts = []
        # In chunks: a few thousand token objects at a time stay in the CPU caches (one
        # split of a large batch was measured ~25% slower per token).
        for start in range(0, len(pieces), _CHUNK_DOCS):
            tokens = glue.join([p.encode("utf-8", "surrogatepass")
                                for p in pieces[start:start + _CHUNK_DOCS]]).translate(_BATCH_TABLE).split()
            if start:
                parts.append(np.full(1, sep_id, dtype=np.int64))
            parts.append(np.fromiter(map(vocab.__getitem__, tokens), dtype=np.int64, count=len(tokens)))
        raw_ids = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        # Per distinct word: the separator, dropped (too short, a stopword), or its term's rank.
        stop = self._stop
        words = [w.decode("utf-8", "surrogatepass") for w in vocab]
        stems = self._stem_all([w for w in words if len(w) >= 2 and w not in stop and w != _SEP_TEXT])
        terms = sorted(set(stems.values()))
        rank = {t: i for i, t in enumerate(terms)}
        kinds = [_SEP_ID if w == _SEP_TEXT else rank[stems[w]] if w in stems else _DROP for w in words]
        mapped = np.asarray(kinds, dtype=np.int64)[raw_ids]
        kept = np.flatnonzero(mapped >= 0)
        # a text's length: the kept tokens between its separators
        ends = np.searchsorted(kept, np.flatnonzero(mapped == _SEP_ID))
        lengths = np.diff(ends, prepend=0, append=kept.size) if pieces else np.zeros(0, np.int64)
        return terms, mapped[kept], lengths.astype(np.int64)

    def _normal_lower(self, text: str) -> str:
        if self.normalize:
            text = unicodedata.normalize(self.normalize, text)
        return text.lower()

    def _stem_all(self, words: Sequence[str]) -> dict[str, str]:
        """word -> term for distinct words (memoised like :meth:`stem`)."""
        if self._stem is None:
            return {w: w for w in words}
        memo = self._memo
        if len(memo) >= _STEM_CACHE_MAX:
            memo.clear()
        stem = self._stem
        out = {}
        for w in words:
            term = memo.get(w)
            if term is None:
                term = stem(w)
                if len(memo) < _STEM_CACHE_MAX:
                    memo[w] = term
            out[w] = term
        return out

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
