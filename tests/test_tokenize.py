"""The tokenizer: agrees with bm25s token for token, and its settings survive in meta."""
from __future__ import annotations

import builtins

import bm25s
import pytest
import Stemmer
from hypothesis import given, settings
from hypothesis import strategies as st

from engramdb.errors import ConfigMismatchError, ValidationError
from engramdb.index import tokenize as tk
from engramdb.index.tokenize import LUCENE_EN_STOPWORDS, Tokenizer

WORDS = ["Running", "runs", "the", "Café", "naïve", "ÉCOLE", "東京", "x", "42", "it's", "New-York", "and",
         "ＦＵＬＬ", "ﬁle", "über", "MOVED", "relocation", "a", "I", "dogs", "dog's"]
texts = st.lists(st.sampled_from(WORDS) | st.text(max_size=12), max_size=30).map(" ".join)


def test_lucene_stopwords_are_bm25s_english_list():
    assert tuple(sorted(LUCENE_EN_STOPWORDS)) == tuple(sorted(bm25s.stopwords.STOPWORDS_EN))


def _comparable(text: str, cjk: str | None) -> str:
    """``text`` as bm25s can be compared on: bm25s does no Unicode normalisation, so text NFKC
    leaves unchanged, and it has no CJK bigrams, so with them text without CJK characters
    (tests/test_tokenize_cjk.py checks that they change nothing else)."""
    import unicodedata

    text = unicodedata.normalize("NFKC", text)
    return text if cjk is None else "".join(c for c in text if tk._HAS_CJK(c) is None)


@settings(max_examples=100, deadline=None)
@given(texts, st.sampled_from([None, "bigram"]))
def test_tokens_equal_bm25s_without_stemming(text, cjk):
    text = _comparable(text, cjk)
    ours = Tokenizer(stemmer=None, cjk=cjk)(text)
    theirs = bm25s.tokenize([text], stopwords="en", return_ids=False, show_progress=False)[0]
    assert ours == theirs


@settings(max_examples=100, deadline=None)
@given(texts, st.sampled_from([None, "bigram"]))
def test_tokens_equal_bm25s_with_stemming(text, cjk):
    text = _comparable(text, cjk)
    ours = Tokenizer(stemmer="english", cjk=cjk)(text)
    stemmer = Stemmer.Stemmer("english")
    theirs = bm25s.tokenize([text], stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False)[0]
    assert ours == theirs


def test_unicode_normalisation_and_case():
    tok = Tokenizer(stemmer=None)
    assert tok("ＦＵＬＬ ﬁle CAFÉ Cafe\u0301") == ["full", "file", "café", "café"]
    assert tok("the cat and a dog") == ["cat", "dog"]
    assert Tokenizer(stemmer=None, stopwords="none")("the cat") == ["the", "cat"]


def test_stemming_maps_inflections_together():
    tok = Tokenizer(stemmer="english")
    assert tok("moved moving moves") == ["move"] * 3
    assert tok.words("The Moved") == ["moved"]


def test_settings_round_trip_and_are_plain_data():
    for tok in (Tokenizer(stemmer=None), Tokenizer(stemmer="english", stopwords="none", normalize=None),
                Tokenizer(cjk=None)):
        again = Tokenizer.from_settings(tok.settings())
        assert again.settings() == tok.settings()
        assert again("Moving the Boxes") == tok("Moving the Boxes")


def test_auto_stemmer_resolves_to_a_concrete_setting():
    assert Tokenizer().settings()["stemmer"] == "english"  # PyStemmer is a test dependency


@pytest.mark.parametrize("change", [{"version": 3}, {"pattern": r"\w+"}, {"lowercase": False}])
def test_unsupported_settings_are_refused(change):
    settings_ = dict(Tokenizer(stemmer=None).settings(), **change)
    with pytest.raises(ConfigMismatchError):
        Tokenizer.from_settings(settings_)


def test_incomplete_or_unknown_settings_are_refused():
    assert Tokenizer.from_settings({"stemmer": None}).settings() == Tokenizer(stemmer=None).settings()
    with pytest.raises(ConfigMismatchError, match="unknown tokenizer settings"):
        Tokenizer.from_settings({"stemming": True})
    with pytest.raises(ConfigMismatchError):
        Tokenizer.from_settings(["stemmer"])  # type: ignore[arg-type]
    with pytest.raises(ConfigMismatchError):
        Tokenizer.from_settings(dict(Tokenizer(stemmer=None).settings(), stopwords="klingon"))
    with pytest.raises(ConfigMismatchError, match="no Snowball stemmer"):
        Tokenizer(stemmer="klingon")


def test_bad_arguments():
    with pytest.raises(ValidationError):
        Tokenizer(stopwords="nope")
    with pytest.raises(ValidationError):
        Tokenizer(normalize="NFX")
    with pytest.raises(ValidationError):
        Tokenizer(stemmer=None)(b"bytes")  # type: ignore[arg-type]


def test_missing_pystemmer_is_a_clear_error(monkeypatch):
    real_import = builtins.__import__

    def no_stemmer(name, *args, **kwargs):
        if name == "Stemmer":
            raise ImportError("No module named 'Stemmer'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_stemmer)
    assert not tk.stemming_available()
    assert Tokenizer().settings()["stemmer"] is None  # "auto" falls back to no stemming
    with pytest.raises(ConfigMismatchError, match="PyStemmer is not installed") as err:
        Tokenizer.from_settings(dict(Tokenizer(stemmer=None).settings(), stemmer="english"))
    assert "pip install" in err.value.hint


def test_stem_memo_is_bounded(monkeypatch):
    monkeypatch.setattr(tk, "_STEM_CACHE_MAX", 3)
    tok = Tokenizer(stemmer="english")
    assert tok("alpha beta gamma delta epsilon") == ["alpha", "beta", "gamma", "delta", "epsilon"]
    assert tok("running zeta") == ["run", "zeta"]
    assert len(tok._memo) == 2  # full memo cleared before new words went in


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=40) | texts)
def test_fast_pattern_matches_the_declared_pattern(text):
    import re

    assert re.findall(tk._FAST_PATTERN, text) == re.findall(tk.TOKEN_PATTERN, text)


def test_stem_all_survives_the_memo_cleared_meanwhile():
    """Regression: _stem_all read a word it had found in the memo back with memo[w]; another
    thread clearing the memo in between (here: during the stemmer call) made it a KeyError."""
    tok = Tokenizer()
    tok("running")  # "running" is in the memo now
    stem_words = tok._stem_words
    assert stem_words is not None

    def clearing(words):
        out = stem_words(words)
        tok._memo.clear()
        return out

    tok._stem_words = clearing
    assert tok._stem_all(["running", "jumped"]) == {"running": "run", "jumped": "jump"}
