"""inject_context and wake_up: selection, formats, guarantees and the hard token budget."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engramdb.compress import compress, estimate_tokens, inject_context, wake_up
from engramdb.errors import ValidationError
from engramdb.records import CompressResult, Zettel

DOC = "\n\n".join(
    [
        "Alice founded the Orion project in 2019 to index research papers.",
        "The team met on Monday and talked about lunch and the weather for a while.",
        "After a long debate we decided to move the billing service to Postgres.",
        "Bob was worried about the migration timeline and the database schema.",
        "Security is a non-negotiable principle for Orion and its users.",
        "Carol explained the caching layer and the Redis cluster in detail.",
        "The benchmark results were a turning point: latency fell by half.",
        "Dave wrote the release notes and thanked everyone for the effort.",
        "We decided to ship the beta to ten customers next month.",
        "Eve asked about the Kafka consumer lag and the retry policy.",
        "Lunch options were discussed again without any conclusion.",
        "Frank reviewed the Terraform modules for the staging cluster.",
    ]
)


@pytest.fixture(scope="module")
def result() -> CompressResult:
    return compress(DOC, chunk_size=90, chunk_overlap=0, date="2023-05-08", title="Orion")


def test_estimate_tokens():
    assert estimate_tokens("") == 0
    assert estimate_tokens("one two three") == 4  # ceil(3 * 1.3)
    assert estimate_tokens("x" * 40) == 10  # character floor
    with pytest.raises(ValidationError):
        estimate_tokens(3)  # type: ignore[arg-type]


def test_aaak_on_request_only_emits_selected_entities_and_tunnels(result):
    out = inject_context(result, max_zettels=3, format="aaak")
    lines = out.splitlines()
    assert lines[0].startswith("FILE:") and "|v3" in lines[0]
    zettel_lines = [line for line in lines if line[:3].isdigit()]
    assert len(zettel_lines) == 3
    chosen = {line.split(":", 1)[0] for line in zettel_lines}
    for line in lines:
        if line.startswith("T:"):
            ends = line[2:].split("|", 1)[0].split("<->")
            assert set(ends) <= chosen
    entity_line = next((line for line in lines if line.startswith("E:")), "")
    chosen_names = {n for z in result.zettels if z.id in chosen for n in z.entities}
    for entry in filter(None, entity_line[2:].split(";")):
        assert entry.split("=", 1)[1] in chosen_names
    assert "source" not in out  # the document text is never dumped into a prompt


def test_json_and_markdown_formats(result):
    doc = json.loads(inject_context(result, format="json", max_zettels=4))
    assert len(doc["zettels"]) == 4 and "tunnels" in doc
    ids = [z["id"] for z in doc["zettels"]]
    assert ids == sorted(ids)  # document order
    md = inject_context(result, format="markdown", max_zettels=2)
    assert md == inject_context(result, max_zettels=2)  # markdown is the default
    assert len(md.splitlines()) == 2 and all(line.startswith("- ") for line in md.splitlines())
    codes = set(result.entity_index.code_to_name)
    assert not any(code in md.split() for code in codes) and "\\_" not in md  # names, not codes or escapes


def test_ranking_prefers_signal_flags(result):
    doc = json.loads(inject_context(result, format="json", max_zettels=3))
    assert all(set(z["flags"]) & {"DECISION", "ORIGIN", "CORE"} for z in doc["zettels"])


def test_filters_and_guarantees(result):
    doc = json.loads(inject_context(result, format="json", flags=["DECISION"], max_zettels=None))
    assert doc["zettels"] and all("DECISION" in z["flags"] for z in doc["zettels"])
    doc = json.loads(inject_context(result, format="json", min_weight=0.5, max_zettels=None))
    assert all(z["weight"] >= 0.5 for z in doc["zettels"])
    # PIVOT is not a ranking bonus flag, so with one slot only a guarantee brings it in
    plain = json.loads(inject_context(result, format="json", max_zettels=1))
    assert "PIVOT" not in plain["zettels"][0]["flags"]
    guaranteed = json.loads(inject_context(result, format="json", max_zettels=1, guarantee_flags=["PIVOT"]))
    assert any("PIVOT" in z["flags"] for z in guaranteed["zettels"])
    # guarantees draw from the whole result, even past min_weight
    low = json.loads(inject_context(result, format="json", min_weight=2.0, guarantee_flags=["CORE"]))
    assert [z for z in low["zettels"] if "CORE" in z["flags"]]


def test_mmr_avoids_near_duplicates():
    r = CompressResult(zettels=[
        Zettel(id="001", topics=["vault", "keys", "rotation"], quote="Rotate the Vault keys.", weight=1.0),
        Zettel(id="002", topics=["vault", "keys", "rotation"], quote="Rotate Vault keys monthly.", weight=0.95),
        Zettel(id="003", topics=["lunch", "pizza"], quote="Pizza on Friday.", weight=0.8),
    ])
    by_weight = json.loads(inject_context(r, format="json", max_zettels=2))
    mmr = json.loads(inject_context(r, format="json", max_zettels=2, selection="mmr"))
    assert [z["id"] for z in by_weight["zettels"]] == ["001", "002"]
    assert [z["id"] for z in mmr["zettels"]] == ["001", "003"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"format": "xml"},
        {"selection": "random"},
        {"max_zettels": -1},
        {"max_token_budget": -5},
        {"max_token_budget": 1.5},
        {"flags": "DECISION"},
        {"flags": ["DECIDED"]},
        {"guarantee_flags": ["nope"]},
        {"min_weight": float("nan")},
        {"count_tokens": 3},
    ],
)
def test_bad_arguments(result, kwargs):
    with pytest.raises(ValidationError):
        inject_context(result, **kwargs)


def test_bad_counter_is_reported(result):
    with pytest.raises(ValidationError):
        inject_context(result, max_token_budget=100, count_tokens=lambda s: -1)
    with pytest.raises(ValidationError):
        inject_context(result, max_token_budget=100, count_tokens=lambda s: 1 / 0)
    with pytest.raises(ValidationError):
        inject_context("not a result")  # type: ignore[arg-type]


def test_budget_zero_gives_empty_output(result):
    assert inject_context(result, max_token_budget=0) == ""


def _words_counter(text: str) -> int:
    # a deliberately different tokenizer: punctuation runs count extra
    return len(text.split()) + sum(1 for c in text if c in "|:+;=\"{}[],")


WORDS = st.sampled_from(
    "we decided to ship Alice Bob Carol founded the database turning point essential worried happy "
    "Kafka Redis lunch weather tomorrow 2023-05-08 migration schema and but not never led to".split()
)
PARAGRAPH = st.lists(WORDS, min_size=1, max_size=30).map(lambda ws: " ".join(ws) + ".")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(PARAGRAPH, min_size=1, max_size=10),
    st.integers(min_value=0, max_value=400),
    st.sampled_from(["aaak", "json", "markdown"]),
    st.sampled_from(["weight", "mmr"]),
    st.one_of(st.none(), st.integers(min_value=0, max_value=12)),
    st.booleans(),
)
def test_budget_is_never_exceeded(paragraphs, budget, fmt, selection, max_zettels, custom):
    r = compress("\n\n".join(paragraphs), chunk_size=80, chunk_overlap=10)
    counter = _words_counter if custom else None
    out = inject_context(
        r, format=fmt, selection=selection, max_zettels=max_zettels, max_token_budget=budget,
        count_tokens=counter, guarantee_flags=["DECISION"],
    )
    measure = counter or estimate_tokens
    assert measure(out) <= budget
    # a bigger budget never yields less
    more = inject_context(r, format=fmt, selection=selection, max_zettels=max_zettels,
                          max_token_budget=budget + 200, count_tokens=counter, guarantee_flags=["DECISION"])
    assert measure(more) <= budget + 200


def test_budget_keeps_most_important_first(result):
    big = inject_context(result, format="markdown", max_zettels=None)
    small = inject_context(result, format="markdown", max_zettels=None, max_token_budget=60)
    assert 0 < estimate_tokens(small) <= 60 < estimate_tokens(big)
    assert "decision" in small or "origin" in small or "core" in small


def test_wake_up(result):
    text = wake_up(result)
    assert text
    assert len(text.splitlines()) <= 5  # one line per moment
    assert "Origin:" in text or "Core:" in text  # ORIGIN/CORE/GENESIS moments are always candidates
    assert wake_up(CompressResult()) == ""
    single = compress("just one small note without any signal words in it at all")
    assert wake_up(single)
    assert wake_up(CompressResult(zettels=[Zettel(id="001")])) == "Zettel 001."
    with pytest.raises(ValidationError):
        wake_up(result, top_pct=0)
    assert len(wake_up(result, top_pct=1.0).split("Decision:")) <= 6


def test_wake_up_caps_at_five():
    text = "\n\n".join(f"Person{i} founded club number {i} in the city." for i in range(12))
    r = compress(text, chunk_size=50, chunk_overlap=0)
    assert wake_up(r).count("Origin:") == 5


@pytest.mark.parametrize("fmt", ["markdown", "json", "aaak"])
def test_a_zettel_that_fits_the_budget_is_not_left_out(fmt):
    """_fit skipped a zettel when the text so far plus the zettel's own count was over the
    budget, as if counts added up. They do not: estimate_tokens' floor is words for prose and
    characters for a long run (the sum of two lines' maxima is above the joined text's), and a
    tokenizer with a fixed overhead (a BOS token) counts it once per piece. Both zettels fit in
    exactly their joined text's count; one was returned."""
    prose = Zettel("1", quote=" ".join("abcdefghijklmnopqrst"), weight=0.9)  # 20 words: the words floor
    run = Zettel("2", quote="x" * 200, weight=0.8)  # one long word: the characters floor
    result = CompressResult([prose, run], [], meta={})
    overhead = lambda s: estimate_tokens(s) + 20  # noqa: E731  (a chat template's tokens)
    for counter in (None, overhead):
        count = counter or estimate_tokens
        both = inject_context(result, format=fmt)
        assert "x" * 200 in both and "a b c" in both
        assert inject_context(result, format=fmt, max_token_budget=count(both), count_tokens=counter) == both
