"""CJK bigrams (spec/bm25.md, "Tokenizer"): text without spaces is searchable, text without CJK
characters tokenizes as before, and files made before keep their tokens."""
from __future__ import annotations

import io
import re
import unicodedata

import msgpack
import pytest
from conftest import GOLDEN, PASSPHRASE, TEST_KDF, golden_copy
from hypothesis import given, settings
from hypothesis import strategies as st

import engramdb
from engramdb import _accel
from engramdb.errors import ConfigMismatchError, ValidationError
from engramdb.index import TOKENIZER_KEY
from engramdb.index import tokenize as tk
from engramdb.index.synonyms import Expander
from engramdb.index.tokenize import Tokenizer

# The settings every file recorded before CJK bigrams (PyStemmer installed), written out:
# such a file must keep them, byte for byte, and tokenize as it did.
OLD_SETTINGS = {"version": 1, "pattern": r"(?u)\b\w\w+\b", "lowercase": True, "normalize": "NFKC",
                "stopwords": "lucene_en", "stemmer": "english"}

BIGRAM = Tokenizer(stemmer=None)
OLD = Tokenizer(stemmer=None, cjk=None)


@pytest.mark.parametrize(("text", "terms"), [
    # Japanese: kanji, hiragana and katakana in one run, bigrams across the script changes
    ("日本語のメモ", ["日本", "本語", "語の", "のメ", "メモ"]),
    ("東京タワーに行った", ["東京", "京タ", "タワ", "ワー", "ーに", "に行", "行っ", "った"]),
    # Chinese
    ("我喜欢北京", ["我喜", "喜欢", "欢北", "北京"]),
    # Korean with spaces: each word its bigrams (a one-syllable word itself); without: one run
    ("안녕하세요 세계 또", ["안녕", "녕하", "하세", "세요", "세계", "또"]),
    ("안녕하세요세계", ["안녕", "녕하", "하세", "세요", "요세", "세계"]),
    # mixed scripts: the Latin words as before, the CJK run split off them
    ("Meeting with 田中さん about the API", ["meeting", "田中", "中さ", "さん", "about", "api"]),
    ("API田中 2024年", ["api", "田中", "2024", "年"]),
    # one-character words: a lone CJK character is kept (Lucene's unigram), a Latin one is not
    ("日 本 a", ["日", "本"]),
    ("x東", ["東"]),
    # emoji are no word characters: they split runs and give no term
    ("😀東京😀 emoji", ["東京", "emoji"]),
    # punctuation splits runs (the Japanese full stop, the katakana middle dot)
    ("東京。大阪・京都", ["東京", "大阪", "京都"]),
    # full-width Latin and half-width katakana are folded by NFKC before splitting
    ("ＡＰＩキー", ["api", "キー"]),
    ("ｶﾀｶﾅ", ["カタ", "タカ", "カナ"]),
])
def test_named_examples(text, terms):
    assert BIGRAM(text) == terms


def test_without_cjk_bigrams_a_run_is_one_word():
    """The old tokenizer (cjk=None) is unchanged: a run of word characters is one word."""
    assert OLD("日本語のメモ") == ["日本語のメモ"]
    assert OLD("Meeting with 田中さん about the API") == ["meeting", "田中さん", "about", "api"]
    assert OLD("日 本") == []


def test_query_of_a_word_finds_the_text_holding_it():
    """The defect: "日本語" was no term of "日本語のメモ", so recall found nothing."""
    for doc, query in [("日本語のメモ", "日本語"), ("東京タワーに行った", "東京"), ("Meeting with 田中さん about the API", "田中"),
                       ("ＡＰＩキーを更新した", "APIキー"), ("한국어를 배우고 있어요", "한국어")]:
        assert BIGRAM(query) and set(BIGRAM(query)) <= set(BIGRAM(doc)), (doc, query)
        assert not set(OLD(query)) <= set(OLD(doc)) or OLD(query) == [], (doc, query)


def test_thai_is_not_bigrammed():
    """Thai (no spaces, not CJK) tokenizes as before: a documented limitation."""
    text = "ภาษาไทยไม่มีช่องว่าง"
    assert BIGRAM(text) == OLD(text)


def test_stemming_and_stopwords_leave_cjk_terms_alone():
    tok = Tokenizer(stemmer="english")
    assert tok("The running 田中さん") == ["run", "田中", "中さ", "さん"]


# -- properties -------------------------------------------------------------------------------

HIRAGANA = "あいうえおかきくけこのにをはがです"
KATAKANA = "アイウエオカキクケコタワーメモ"
HAN = "日本語東京大阪京都北田中山川人年月時我喜欢"
HANGUL = "안녕하세요세계한국어또"
CJK_CHARS = HIRAGANA + KATAKANA + HAN + HANGUL
OTHER = "abcXYZ019_é "
cjk_text = st.text(alphabet=st.sampled_from(CJK_CHARS + OTHER + ".,!。、・😀\n"), max_size=40)


def _no_cjk(text: str) -> str:
    """``text`` NFKC-normalised without its CJK characters (NFKC can make some: "㈱")."""
    return "".join(c for c in unicodedata.normalize("NFKC", text) if tk._HAS_CJK(c) is None)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60), st.sampled_from([dict(stemmer=None), dict(stemmer="english"),
                                              dict(stemmer=None, stopwords="none", normalize=None)]))
def test_text_without_cjk_tokenizes_as_before(text, options):
    text = _no_cjk(text)
    new, old = Tokenizer(cjk="bigram", **options), Tokenizer(cjk=None, **options)
    assert new(text) == old(text)
    assert new.words(text) == old.words(text)


@settings(max_examples=200, deadline=None)
@given(cjk_text, st.data())
def test_terms_of_a_cjk_piece_are_terms_of_the_text(text, data):
    """The query of a CJK run of the text (whole, or two or more of its characters) has only
    terms the text has: recall finds the text by any part of its runs."""
    tok = Tokenizer(stemmer=None)
    runs = [m.group(1) for word in re.findall(r"\w+", text) for m in tk._CJK_PIECES(word) if m.group(1)]
    if not runs:
        return
    run = data.draw(st.sampled_from(runs))
    if len(run) > 1:
        start = data.draw(st.integers(0, len(run) - 2))
        run = run[start:data.draw(st.integers(start + 2, len(run)))]
    assert tok(run)
    assert set(tok(run)) <= set(tok(text))


@settings(max_examples=100, deadline=None)
@given(st.lists(cjk_text | st.text(max_size=12), max_size=6), st.booleans(), st.sampled_from([None, "bigram"]))
def test_batch_path_equals_reference(batch, native, cjk):
    """encode_many (the bulk path; with the C scan and with numpy) gives the reference terms."""
    if native and _accel.NATIVE is None:
        pytest.fail("engramdb._native is not built: rebuild it (RULES.md)")
    tok = Tokenizer(stemmer="english", cjk=cjk)
    saved = _accel.NATIVE
    _accel.NATIVE = saved if native else None
    try:
        terms, ids, lengths = tok.encode_many(batch)
    finally:
        _accel.NATIVE = saved
    want = [tok(text) for text in batch]
    assert lengths.tolist() == [len(doc) for doc in want]
    assert [terms[i] for i in ids.tolist()] == [t for doc in want for t in doc]


def test_synonym_expansion_works_over_bigrams():
    exp = Expander(Tokenizer())
    weights = exp.expand(exp.drop_question_words(Tokenizer()("東京のcar")))
    assert {"東京", "car"} <= set(weights)


# -- settings ---------------------------------------------------------------------------------

def test_settings_record_the_mode_and_old_settings_stay_as_they_were():
    assert Tokenizer().settings() == dict(OLD_SETTINGS, version=2, cjk="bigram")
    assert Tokenizer(cjk=None).settings() == OLD_SETTINGS  # the same dict, no "cjk" key
    assert Tokenizer.from_settings(OLD_SETTINGS).cjk is None  # a file's version 1: no bigrams
    assert Tokenizer.from_settings({"stemmer": None}).cjk == "bigram"  # a request: the default
    assert Tokenizer.from_settings({"cjk": None}).settings()["version"] == 1
    again = Tokenizer.from_settings(Tokenizer().settings())
    assert again.settings() == Tokenizer().settings() and again("日本語") == ["日本", "本語"]


@pytest.mark.parametrize("settings_", [
    dict(OLD_SETTINGS, cjk="bigram"),                # version 1 has no cjk
    dict(OLD_SETTINGS, version=2, cjk=None),         # version 2 always names its mode
    dict(OLD_SETTINGS, version=3, cjk="bigram"),     # a later version
    dict(OLD_SETTINGS, version=True),                # a bool is no version
    dict(OLD_SETTINGS, version=2, cjk="trigram"),    # an unknown mode
])
def test_unsupported_cjk_settings_are_refused(settings_):
    with pytest.raises(ConfigMismatchError):
        Tokenizer.from_settings(settings_)


def test_bad_cjk_argument():
    with pytest.raises(ValidationError, match="unknown CJK mode"):
        Tokenizer(cjk="unigram")


def test_a_request_without_cjk_accepts_an_old_file_and_one_naming_it_does_not():
    assert Tokenizer.from_settings({"stemmer": "english"}).accepts(OLD_SETTINGS)
    assert Tokenizer.from_settings({}).accepts(OLD_SETTINGS)
    assert not Tokenizer.from_settings({"cjk": "bigram"}).accepts(OLD_SETTINGS)
    assert not Tokenizer.from_settings({"stemmer": None}).accepts(OLD_SETTINGS)  # another stemmer still differs
    assert Tokenizer.from_settings({"cjk": None}).accepts(OLD_SETTINGS)
    new = Tokenizer().settings()
    assert not Tokenizer.from_settings({"cjk": None}).accepts(new)
    assert Tokenizer.from_settings({}).accepts(new)


# -- files ------------------------------------------------------------------------------------

MEMORIES = ["日本語のメモ", "東京タワーに行った", "Meeting with 田中さん about the API", "我喜欢北京的秋天",
            "한국어를 배우고 있어요", "The weather in Paris was nice"]


def _found(db, query: str) -> list[str]:
    return [h.node.content for h in db.recall(query, hops=False)]


def test_recall_finds_cjk_text_by_its_words(make_db):
    db = make_db()
    for text in MEMORIES:
        db.add(text)
    assert db.indexes.tokenizer.settings()["cjk"] == "bigram"
    assert _found(db, "日本語")[0] == "日本語のメモ"
    assert _found(db, "東京")[0] == "東京タワーに行った"
    assert _found(db, "田中")[0] == "Meeting with 田中さん about the API"
    assert _found(db, "北京")[0] == "我喜欢北京的秋天"
    assert _found(db, "한국어")[0] == "한국어를 배우고 있어요"
    assert _found(db, "ｔｏｋｙｏ タワー")[0] == "東京タワーに行った"  # full width, NFKC
    assert _found(db, "Paris")[0] == "The weather in Paris was nice"
    hit = db.recall("日本語", explain=True, hops=False)[0]
    assert hit.parts and hit.parts["bm25"] > 0
    context = db.recall_context("東京", max_tokens=200)
    assert "東京タワーに行った" in context.text


def test_bulk_import_indexes_as_one_at_a_time(make_db):
    one, bulk = make_db("one.engram"), make_db("bulk.engram")
    for text in MEMORIES:
        one.add(text)
    bulk.add_many(MEMORIES)
    for query in ["日本語", "東京", "田中", "北京", "한국어", "api"]:
        assert _found(one, query) == _found(bulk, query)


def test_a_file_with_the_old_settings_keeps_its_tokens(make_db, tmp_path):
    db = make_db("old.engram", tokenizer=OLD_SETTINGS)
    with db._store.read() as txn:
        assert txn.get("meta", TOKENIZER_KEY) == msgpack.packb(OLD_SETTINGS, use_bin_type=True)
    db.add("日本語のメモ")
    db.close()
    for options in ({}, {"tokenizer": {"stemmer": "english"}}, {"tokenizer": OLD_SETTINGS}):
        db = make_db("old.engram", **options)
        assert db.indexes.tokenizer.cjk is None
        assert _found(db, "日本語") == []  # as before: the run is one word
        assert _found(db, "日本語のメモ") == ["日本語のメモ"]
        db.close()
    with pytest.raises(ConfigMismatchError, match="created with tokenizer"):
        make_db("old.engram", tokenizer={"cjk": "bigram"})
    new = make_db("new.engram")
    new.close()
    with pytest.raises(ConfigMismatchError):
        make_db("new.engram", tokenizer={"cjk": None})


def test_the_golden_file_of_the_first_release_keeps_its_tokenizer(tmp_path):
    """A file written by the first release: its settings, and so its dump's header, are
    unchanged, and CJK text added to it is indexed as it always was (one word a run)."""
    with engramdb.open(golden_copy(tmp_path), passphrase="golden-passphrase") as db:
        with db._store.read() as txn:
            assert msgpack.unpackb(txn.get("meta", TOKENIZER_KEY)) == OLD_SETTINGS
        assert db.indexes.tokenizer.settings() == OLD_SETTINGS
        db.add("日本語のメモ", id="jp")
        assert _found(db, "日本語") == []
        assert _found(db, "日本語のメモ") == ["日本語のメモ"]
        buf = io.StringIO()
        db.dump(buf)
    golden_header = (GOLDEN / "store-v1.aaak").read_text(encoding="utf-8").split("\n", 2)[:2]  # @set tokenizer
    assert buf.getvalue().split("\n", 2)[:2] == golden_header


@pytest.mark.parametrize("tokenizer", [None, OLD_SETTINGS])
def test_dump_and_restore_keep_the_setting(make_db, tmp_path, tokenizer):
    db = make_db("src.engram", tokenizer=tokenizer)
    for text in MEMORIES:
        db.add(text)
    want = db.indexes.tokenizer.settings()
    buf = io.StringIO()
    db.dump(buf)
    db.close()
    dest = tmp_path / "restored.engram"
    engramdb.restore(io.StringIO(buf.getvalue()), dest, passphrase=PASSPHRASE, kdf=TEST_KDF)
    restored = make_db("restored.engram")
    assert restored.indexes.tokenizer.settings() == want
    assert _found(restored, "日本語") == (["日本語のメモ"] if tokenizer is None else [])
