"""One token counter for every budget (issue 12, bug 3), and the text recall_context returns."""
from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engramdb
from engramdb.compress import compress, inject_context
from engramdb.errors import ValidationError
from engramdb import recall as recall_module
from engramdb.recall import sentence_span
from engramdb.tokens import estimate_tokens, token_counter

from conftest import NOW, PASSPHRASE, TEST_KDF

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCOMO = os.path.join(ROOT, "..", "shared", "data", "locomo", "locomo-dev.json")
COUNTERS = {
    "estimate": None,
    "chars": len,
    "words": lambda s: len(s.split()),
    "punct": lambda s: len(re.findall(r"\w+|[^\w\s]", s)),
}
WORDS = ["Alice", "moved", "to", "Berlin", "in", "2023.", "Bob", "prefers", "tea!", "The", "budget", "was",
         "approved?", "Carol", "said:", "\u201cno\u201d", "\n", "x" * 30, "caf\u00e9", "\u2026"]
texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=120).map(" ".join)


def test_one_counter_is_the_default_everywhere():
    assert engramdb.estimate_tokens is estimate_tokens
    assert token_counter(None) is estimate_tokens
    from engramdb.compress import estimate_tokens as from_compress

    assert from_compress is estimate_tokens


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("budget") / "b.engram"
    db = engramdb.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF)
    doc = " ".join(f"Sentence {i} says that Alice moved her budget meeting {i} times." for i in range(60))
    db.ingest(doc, title="minutes", now=NOW)
    db.add_many([f"note {i}: Alice and Bob discussed the budget in round {i}." for i in range(30)], now=NOW)
    yield db
    db.close()


@given(budget=st.integers(0, 400), query=st.sampled_from(["Alice budget", "Bob round 7", "meeting times"]),
       counter=st.sampled_from(sorted(COUNTERS)), top_k=st.integers(1, 12))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_recall_context_budget_is_a_hard_limit_under_any_counter(store, budget, query, counter, top_k):
    count = COUNTERS[counter] or estimate_tokens
    ctx = store.recall_context(query, top_k=top_k, max_tokens=budget, count_tokens=COUNTERS[counter])
    assert count(ctx.text) <= budget
    assert ctx.tokens == (count(ctx.text) if ctx.passages else 0)
    assert all(p.tokens == count(p.block) for p in ctx.passages)


@given(text=texts, budget=st.integers(0, 300), counter=st.sampled_from(sorted(COUNTERS)),
       fmt=st.sampled_from(["markdown", "json", "aaak"]))
@settings(max_examples=60, deadline=None)
def test_inject_context_budget_is_a_hard_limit_under_any_counter(text, budget, counter, fmt):
    count = COUNTERS[counter] or estimate_tokens
    out = inject_context(compress(text), max_token_budget=budget, count_tokens=COUNTERS[counter], format=fmt)
    assert count(out) <= budget


@given(text=texts, budget=st.integers(0, 200), counter=st.sampled_from(sorted(COUNTERS)))
@settings(max_examples=40, deadline=None)
def test_recall_context_over_random_texts(tmp_path_factory, text, budget, counter):
    count = COUNTERS[counter] or estimate_tokens
    with engramdb.open(tmp_path_factory.mktemp("r") / "r.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.ingest(text, title="t", now=NOW)
        db.add(text, now=NOW)
        ctx = db.recall_context("Alice Berlin budget tea", max_tokens=budget, count_tokens=COUNTERS[counter])
        assert count(ctx.text) <= budget


def test_a_bad_counter_is_a_validation_error(store):
    with pytest.raises(ValidationError):
        store.recall_context("Alice", count_tokens=lambda s: -1)
    with pytest.raises(ValidationError):
        store.recall_context("Alice", count_tokens=lambda s: 1 / 0)
    with pytest.raises(ValidationError):
        store.recall_context("Alice", count_tokens="len")


def test_locomo_context_stays_within_budget_by_estimate_tokens(tmp_path):
    """Bug 3: recall_context(q, max_tokens=500) returned up to 562 tokens by estimate_tokens."""
    if not os.path.exists(LOCOMO):
        pytest.skip(f"LoCoMo dev data not found at {LOCOMO}")
    with open(LOCOMO, encoding="utf-8") as f:
        sample = json.load(f)[0]
    conv = sample["conversation"]
    messages = []
    for n in range(1, 40):
        for turn in conv.get(f"session_{n}", []):
            messages.append({"speaker": turn["speaker"], "text": turn["text"], "date": conv[f"session_{n}_date_time"]})
    with engramdb.open(tmp_path / "l.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.ingest(messages, title="conv", now=NOW)
        questions = [qa["question"] for qa in sample["qa"]][:60]
        sizes = [estimate_tokens(db.recall_context(q, max_tokens=500).text) for q in questions]
    assert max(sizes) <= 500 and sum(s > 300 for s in sizes) > len(sizes) // 2  # full, and never over


# --- the text: sentences, headings, separation -----------------------------------------


def test_sentence_span_widens_to_whole_sentences():
    text = "First one. Second sentence is here! Third? Fourth line\nFifth part."
    a = text.index("sentence")
    assert text[slice(*sentence_span(text, a, a + 3))] == "Second sentence is here!"
    assert text[slice(*sentence_span(text, 0, 3))] == "First one."
    b = text.index("Fifth")
    assert text[slice(*sentence_span(text, b + 2, b + 4))] == "Fifth part."
    c = text.index("line")
    assert text[slice(*sentence_span(text, c, c + 2))] == "Fourth line"  # a line break ends a sentence
    # an already whole sentence (with the space after it) stays as it is
    s = text.index("Third")
    assert text[slice(*sentence_span(text, s, s + len("Third? ")))] == "Third?"


@given(st.text(alphabet="ab .!?\n", max_size=300), st.data())
@settings(max_examples=200, deadline=None)
def test_sentence_span_contains_the_span(text, data):
    start = data.draw(st.integers(0, len(text)))
    end = data.draw(st.integers(start, len(text)))
    lo, hi = sentence_span(text, start, end, reach=50)
    assert 0 <= lo <= hi <= len(text)
    assert text[start:end].strip() in text[lo:hi]
    assert text[lo:hi] == text[lo:hi].strip()


def test_context_heads_each_passage_and_separates_them(make_db):
    db = make_db()
    source = "".join(f"Sentence number {i} talks about topic{i}. " for i in range(20))
    db._store.write(lambda txn: txn.put("sources", db._store.blind(b"source", b"minutes.md"), source.encode()))

    def at(i: int) -> int:
        return source.index(f"number {i} ")  # mid-sentence on purpose

    db.add("about topic3", id="a", source="minutes.md", source_start=at(3), source_end=at(3) + 12,
           resolved_date="2024-05-02", now=NOW)
    db.add("about topic4", id="b", source="minutes.md", source_start=at(4), source_end=at(4) + 12,
           resolved_date="2024-05-03", now=NOW)
    db.add("about topic15", id="c", source="minutes.md", source_start=at(15), source_end=at(15) + 5,
           resolved_date="2024-06-01", now=NOW)
    db.add("a bare memory about topic4", id="bare", now=NOW)
    ctx = db.recall_context("topic3 topic4 topic15", max_tokens=1000, hops=False)
    blocks = ctx.text.split("\n\n")
    assert blocks == [p.block for p in ctx.passages]
    first, second, bare = ctx.passages
    # adjacent sentences make one passage, cut at sentence boundaries, dated by its memories
    assert first.text == "Sentence number 3 talks about topic3. Sentence number 4 talks about topic4."
    assert first.heading == "### minutes.md (2024-05-02 to 2024-05-03)"
    assert second.text == "Sentence number 15 talks about topic15." and second.heading == "### minutes.md (2024-06-01)"
    assert bare.heading == "### memory bare (2023-11-14)" and bare.text == "a bare memory about topic4"
    assert all(b.startswith("### ") for b in blocks)


def test_chinese_and_japanese_text_is_cut_at_its_own_sentence_ends(make_db):
    # 。！？ end a sentence with no space after them, and CJK text has no spaces to cut
    # words at: a long Japanese memory was one sentence of one word, so under any budget
    # smaller than all of it recall_context returned nothing.
    text = "東京タワーは一九五八年に完成した。" * 3 + "アリスは東京に住んでいる！" + "ボブは大阪で働いている。" * 30
    a = text.index("アリス")
    assert text[slice(*sentence_span(text, a, a + 3))] == "アリスは東京に住んでいる！"
    db = make_db()
    db.remember(text, id="jp", quote="アリスは東京に住んでいる！", resolved_date="2026-12-01")
    context = db.recall_context("アリスは東京に住んでいる", max_tokens=10)
    assert context.text == "### memory jp (2026-12-01)\nアリスは東京に住んでいる！" and context.tokens == 10
    longer = db.recall_context("アリスは東京に住んでいる", max_tokens=20)
    assert longer.passages[0].text.startswith("アリスは東京に住んでいる！ボブは") and longer.tokens <= 20
    assert longer.passages[0].text.endswith("。")
    # not even the sentence fits: it is cut after a character, marked as cut
    tight = db.recall_context("アリスは東京に住んでいる", max_tokens=9)
    assert tight.passages[0].text == "アリスは東京に \u2026" and tight.tokens == 9


def test_a_cut_within_chinese_or_japanese_never_parts_a_character_from_its_mark(make_db):
    """A cut could fall after a kana whose voicing mark follows it as a combining character
    (NFD text: "か" + U+3099 is "が"), or after an ideograph before its variation selector:
    the passage ended in "か", another word, or in a bare ideograph without its variant."""
    import unicodedata

    db = make_db()
    kana = unicodedata.normalize("NFD", "がぎぐげござじずぜぞだぢづでど" * 20)
    variants = "\u845b\U000E0100" * 100  # 葛 with an ideographic variation selector
    db.add("学校 " + kana, id="kana")
    db.add("ivs " + variants, id="ivs")
    texts: dict[str, list[str]] = {}
    for query, memory in (("学校", "kana"), ("ivs", "ivs")):
        content = db.get(memory).content
        cut = 0
        for budget in range(8, 40):
            for counter in (None, len):
                ctx = db.recall_context(query, max_tokens=budget, count_tokens=counter, top_k=1)
                if ctx.passages:
                    text = ctx.passages[0].text.removesuffix(" \u2026")
                    assert content.startswith(text)
                    texts.setdefault(memory, []).append(text)
                    cut += 1
                    following = content[len(text):len(text) + 1]
                    assert following not in ("\u3099", "\U000E0100"), (budget, text[-3:])
        assert cut > 10  # the budgets do cut within the memory
        assert any(len(t) > 5 for t in texts[memory])  # cut between characters, not only after the first word


def test_a_long_run_of_dots_is_cut_in_linear_time():
    # the sentence-end regex retried a run of dots that ends no sentence from each of its
    # dots (quadratic: 12,000 took 3 s); _fit_first scans the whole span of the best memory
    import signal

    def hang(signum, frame):
        raise AssertionError("did not finish within 60 s")

    text = "Alice met Bob in Paris. " + "\u2026" * 300_000 + "x The end."
    alarm = hasattr(signal, "SIGALRM")  # Windows has none: the result is still checked
    previous = signal.signal(signal.SIGALRM, hang) if alarm else None
    if alarm:
        signal.alarm(60)
    try:
        ends = [m.end() for m in recall_module._SENTENCE_END.finditer(text)]
        lo, hi = sentence_span(text, 3, 5)
    finally:
        if alarm:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
    assert ends == [23, len(text)] and text[lo:hi] == "Alice met Bob in Paris."


def test_numpy_numbers_are_taken_as_recall_already_takes_them(store):
    """recall/recall_context take NumPy counts (a29bb8c: pandas rows give them), but
    inject_context refused ``max_token_budget=np.int64(100)`` / ``max_zettels`` /
    ``min_weight=np.float32``, recall_result refused ``top_k=np.int64`` and ``hops=np.True_``,
    and a counter returning a NumPy integer (``mask.sum()``) was "not an int"."""
    result = compress("Alice moved to Berlin in May 2023. Bob stayed in Lisbon. Carol decided to adopt a dog.")
    plain = inject_context(result, max_zettels=3, max_token_budget=100, min_weight=0.0)
    assert plain
    assert inject_context(result, max_zettels=np.int64(3), max_token_budget=np.int64(100),
                          min_weight=np.float32(0.0)) == plain
    assert inject_context(result, max_token_budget=100, count_tokens=lambda s: np.int64(estimate_tokens(s))) \
        == inject_context(result, max_token_budget=100)
    ids = [z.id for z in engramdb.recall_result(result, "Alice Berlin", top_k=2)]
    assert ids and [z.id for z in engramdb.recall_result(result, "Alice Berlin", top_k=np.int64(2),
                                                         hops=np.True_, expand_query=np.True_)] == ids
    ctx = store.recall_context("Alice budget", max_tokens=120, count_tokens=lambda s: np.int64(len(s.split())))
    assert ctx.passages and ctx.tokens == len(ctx.text.split()) <= 120 and type(ctx.tokens) is int
    for bad in (np.float64(3.0), np.int64(-1), np.True_):
        with pytest.raises(ValidationError):
            inject_context(result, max_token_budget=100, count_tokens=lambda s, bad=bad: bad)


def test_a_passage_cut_to_fit_ends_at_its_last_sentence_not_after_the_blank_lines(make_db):
    """A passage cut to whole sentences ended after the line breaks that follow its last
    sentence (a line break ends a sentence too): "...stories?\\n\\n", blank lines the budget
    paid for, against "Leading and trailing whitespace is dropped" (spec/recall.md 3). A memory
    without a source kept its content's leading and trailing whitespace whole."""
    db = make_db()
    turns = [f"Melanie: turn {i} of the chat about pottery and painting." for i in range(40)]
    db.add("\n\n".join(turns), id="chat", resolved_date="2023-05-08")
    for budget in (30, 45, 60, 90, 120, 200):
        for counter in (None, len):
            ctx = db.recall_context("pottery painting", max_tokens=budget, count_tokens=counter)
            if ctx.passages:
                text = ctx.passages[0].text
                assert text == text.strip(), (budget, text[-20:])
                assert text.endswith(("painting.", " \u2026")), (budget, text[-20:])  # sentences, else words
                if budget >= 90:
                    assert text.endswith("painting.")
    # a memory's own content (no source) without its surrounding blanks and line breaks
    db.add("  \n a zebra crossed the road.  \n\n", id="padded", resolved_date="2023-05-08")
    assert db.recall_context("zebra").text == "### memory padded (2023-05-08)\na zebra crossed the road."


@pytest.mark.parametrize("counter", [None, len])
def test_recall_context_renders_each_passage_once_not_the_whole_context_per_hit(make_db, monkeypatch, counter):
    # Each hit used to re-render every passage admitted so far (top_k=1000: ~500,000 headings,
    # quadratic); now only the spans of the hit's own source or memory are rendered.
    db = make_db()
    n = 300
    db.add_many([f"note {i}: the budget of round {i}." for i in range(n)], now=NOW)
    rendered = []
    one_line = recall_module._one_line
    monkeypatch.setattr(recall_module, "_one_line", lambda text: rendered.append(text) or one_line(text))
    ctx = db.recall_context("budget", top_k=n, max_tokens=10**6, count_tokens=counter)
    assert len(ctx.passages) == n
    assert len(rendered) <= 3 * n  # old code: n * (n + 1) / 2 = 45,150


def test_an_empty_contexts_tokens_are_the_counters_count_of_the_empty_text(store):
    # tokens was 0 for an empty context even under a counter with a fixed overhead, and a
    # budget below that overhead was not checked: "" does not fit it either
    def with_overhead(text):
        return len(text) + 20

    empty = store.recall_context("zzzqqq", max_tokens=100, count_tokens=with_overhead)
    assert empty.passages == () and empty.text == ""
    assert empty.tokens == 20 == with_overhead(empty.text)
    full = store.recall_context("Alice budget", max_tokens=400, count_tokens=with_overhead)
    assert full.passages and full.tokens == with_overhead(full.text) <= 400
    with pytest.raises(ValidationError, match="empty text") as info:
        store.recall_context("Alice budget", max_tokens=19, count_tokens=with_overhead)
    assert "max_tokens" in info.value.hint
    assert store.recall_context("zzzqqq", max_tokens=0).tokens == 0  # estimate_tokens("") is 0


@pytest.mark.parametrize("fmt", ["markdown", "json", "aaak"])
def test_inject_context_refuses_a_budget_below_the_counters_count_of_the_empty_text(fmt):
    """inject_context returned "" when count_tokens("") was over max_token_budget: a text over
    its hard budget under that counter, without a word. Like recall_context's max_tokens, such
    a budget is a ValidationError; at the count of "" exactly, "" is returned."""
    def with_overhead(text):
        return len(text) + 20

    result = compress("Alice moved to Berlin in 2023. Bob prefers tea. The budget was approved.")
    with pytest.raises(ValidationError, match="empty text") as info:
        inject_context(result, max_token_budget=19, count_tokens=with_overhead, format=fmt)
    assert "max_token_budget" in info.value.hint and "20" in info.value.hint
    assert inject_context(result, max_token_budget=20, count_tokens=with_overhead, format=fmt) == ""
    full = inject_context(result, max_token_budget=10_000, count_tokens=with_overhead, format=fmt)
    assert full and with_overhead(full) <= 10_000
    assert inject_context(result, max_token_budget=0, format=fmt) == ""  # estimate_tokens("") is 0
