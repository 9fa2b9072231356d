"""compress(): options, chunking offsets, dates, chat input, dedupe, merge, determinism."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engramdb.compress import (
    ALL_EMOTIONS,
    ALL_FLAGS,
    compress,
    compress_many,
    merge_results,
    normalize_weights,
    result_to_json,
    top_zettels,
)
from engramdb.compress import zc
from engramdb.compress.normalize import chunk_text, normalize_text
from engramdb.errors import EngramError, ValidationError
from engramdb.records import CompressResult, Zettel
import itertools

# engramdb's own pipeline (compress(method="refined"), spec/compress.md sections 2-8):
# the tests that use it check behaviours zettel-compress 1.0.0 (the default) does not have
compress_refined = partial(compress, method="refined")

ROOT = Path(__file__).resolve().parents[1]
BOOKS = ROOT.parent / "shared" / "data" / "gutenberg"
NOVEL = BOOKS / "pride_and_prejudice_pg1342.txt"
SCIENCE = BOOKS / "origin_of_species_pg1228.txt"

PROSE = (
    "The team met on Monday to plan the migration. Alice explained the current architecture "
    "and the database schema.\n\n"
    "After a long debate we decided to move the billing service to Postgres. It was a turning "
    "point for the project, and everyone felt relieved.\n\n"
    "Bob founded the platform group in 2019. The fundamental principle has not changed: keep "
    "the core small and the modules replaceable.\n\n"
    "Carol was worried about the timeline, but she agreed to own the rollout plan."
)


def test_result_shape_and_meta():
    r = compress(PROSE, date="2023-05-08", title="planning")
    assert isinstance(r, CompressResult)
    assert r.zettels and all(isinstance(z, Zettel) for z in r.zettels)
    assert [z.id for z in r.zettels] == [f"{i:03d}" for i in range(1, len(r.zettels) + 1)]
    assert r.meta["input_length"] == len(PROSE)
    assert r.meta["chunk_count"] == len(r.zettels)
    assert r.meta["date"] == "2023-05-08" and r.meta["title"] == "planning"
    assert r.meta["warnings"] == []
    assert r.meta["source"] == normalize_text(PROSE)
    for z in r.zettels:
        assert 0.0 <= z.weight <= 1.0
        assert set(z.flags) <= set(ALL_FLAGS) and set(z.emotions) <= set(ALL_EMOTIONS)
        assert z.entities == sorted(z.entities)
        for name in z.entities:
            code = r.entity_index.name_to_code[name]
            assert r.entity_index.code_to_name[code] == name


def test_small_chunks_cover_signals():
    r = compress(PROSE, chunk_size=150, chunk_overlap=0)
    assert len(r.zettels) >= 3
    flags = {f for z in r.zettels for f in z.flags}
    assert {"DECISION", "ORIGIN", "PIVOT", "CORE"} <= flags
    assert "relief" in {e for z in r.zettels for e in z.emotions}
    # rank normalization on several zettels spans the full range
    weights = [z.weight for z in r.zettels]
    assert max(weights) == 1.0 and min(weights) == 0.0


def test_keep_source_false_drops_source():
    r = compress(PROSE, keep_source=False)
    assert "source" not in r.meta
    assert r.zettels[0].source_start is not None  # offsets stay: they index normalize_text(text)


@pytest.mark.parametrize(
    "options",
    [
        {"chunksize": 100},
        {"chunk_size": 0},
        {"chunk_size": 100, "chunk_overlap": 100},
        {"chunk_overlap": -1},
        {"temperature": 0},
        {"temperature": float("nan")},
        {"tunnel_threshold": 1.5},
        {"tunnel_top_k": -1},
        {"dedupe": "yes"},
        {"dedupe_threshold": 0},
        {"stop_words": "the"},
        {"stop_words": [1]},
        {"date": 20230508},
        {"title": 3},
        {"min_entity_frequency": 0},
        {"keep_source": None},
        {"verbose_labels": 1},
    ],
)
def test_bad_options_raise_validation_error(options):
    with pytest.raises(ValidationError) as info:
        compress("some text here", **options)
    assert info.value.hint  # every error says what to do


def test_non_string_input():
    with pytest.raises(ValidationError):
        compress(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        compress_many("one string")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        compress_many(["ok", None])  # type: ignore[list-item]


def test_empty_and_short_input():
    r = compress("")
    assert r.zettels == [] and r.tunnels == [] and r.meta["chunk_count"] == 0
    r = compress("   \n\n  ")
    assert r.zettels == []
    r = compress("Short note.")
    assert len(r.zettels) == 1 and r.meta["warnings"]


def test_date_option_accepts_date_objects_and_refuses_garbage():
    import datetime

    r = compress(PROSE, date=datetime.date(2023, 5, 8))
    assert r.meta["date"] == "2023-05-08"
    with pytest.raises(ValidationError):
        compress(PROSE, date="sometime soon")


UNICODE_TEXT = (
    "Ünïcödé façade — naïve café 🎉🎉 emoji and CJK 漢字かな.\r\n\r\n"
    "Zoë met Émile in Zürich; they decided the 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 plan was final. "
    "e\u0301 combining accents and \u2028 odd line separators.\r\rÅsa wrote the Σ-notation notes.\n\n"
    + "Ελληνικά κείμενα και русский текст. " * 30
)


def _check_offsets(text: str, **options) -> None:
    size, overlap = options.get("chunk_size", 800), options.get("chunk_overlap", 100)
    # refined: NFC and every line break folded; offsets are its chunker's
    r = compress_refined(text, **options)
    source = r.meta["source"]
    assert source == normalize_text(text)
    chunks = chunk_text(source, size, overlap)
    assert len(chunks) == len(r.zettels)
    for z, c in zip(r.zettels, chunks):
        assert source[z.source_start:z.source_end] == c.text
        assert c.text == c.text.strip() and c.text
    # default (zettel-compress): only CR/CRLF folded; trimmed of JavaScript's whitespace
    r = compress(text, **options)
    source = r.meta["source"]
    assert source == zc.normalize_text(text)
    chunks = zc.chunk_text(source, size, overlap)
    assert len(chunks) == len(r.zettels)
    for z, c in zip(r.zettels, chunks):
        assert source[z.source_start:z.source_end] == c.text
        assert c.text == zc.js_trim(c.text) and c.text


def test_offsets_on_unicode_input():
    for size, overlap in ((800, 100), (120, 40), (60, 0)):
        _check_offsets(UNICODE_TEXT, chunk_size=size, chunk_overlap=overlap)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=0, max_size=120), max_size=8
    ),
    st.integers(min_value=20, max_value=300),
)
def test_offsets_property(parts, size):
    _check_offsets("\n\n".join(parts), chunk_size=size, chunk_overlap=size // 4)


def test_chunk_overlap_snaps_to_word_start():
    text = "\n\n".join(f"Paragraph {i} has several words in it to fill the chunk nicely." for i in range(30))
    chunks = chunk_text(text, 200, 50)
    for prev, cur in itertools.pairwise(chunks):
        assert cur.start < prev.end  # they overlap
        assert cur.start == 0 or text[cur.start - 1].isspace()  # never mid-word


def test_long_paragraph_is_split():
    chat = "\n".join(f"Alice: message number {i} about the deploy" for i in range(80))
    r = compress_refined(chat, chunk_size=300)
    assert len(r.zettels) > 5
    assert all(z.source_end - z.source_start <= 300 + 100 for z in r.zettels)


def test_chat_speakers_and_session_dates():
    chat = (
        "[2023-05-08] Session 3\n"
        "Alice: hi Bob, we decided to ship the beta.\n"
        "Bob: great, I will tell the team tomorrow.\n\n"
        "DATE: 9 May 2023\n"
        "Alice: did you tell them?\n"
        "Bob: yes, yesterday evening.\n"
    )
    r = compress_refined(chat, chunk_size=800)
    assert len(r.zettels) == 2  # a session header always starts a chunk
    assert {"Alice", "Bob"} <= set(r.entity_index.name_to_code)
    assert r.zettels[0].resolved_date == "2023-05-08"
    assert r.zettels[1].resolved_date == "2023-05-09"
    assert "DECISION" in r.zettels[0].flags


def test_relative_dates_resolve_against_the_session():
    text = (
        "Session 2: 8 May 2023\nAlice: hello Carol, how was the move?\n\n"
        "Carol: I moved to Berlin last week and start the new job next Friday."
    )
    r = compress(text, chunk_size=80, chunk_overlap=0)
    assert len(r.zettels) == 2
    assert r.zettels[0].resolved_date == "2023-05-08"  # the header is in the chunk
    assert r.zettels[1].resolved_date == "2023-05-01"  # first relative expression, anchored on the session
    r = compress("We shipped it yesterday.", date="2023-03-01")
    assert r.zettels[0].resolved_date == "2023-02-28"
    r = compress("We shipped it on a sunny day.", date="2023-03-01")
    assert r.zettels[0].resolved_date == "2023-03-01"
    r = compress("The launch happened on 8 May 2023 after months of work.")
    assert r.zettels[0].resolved_date == "2023-05-08"
    assert compress("No dates here at all, just words.").zettels[0].resolved_date is None


def test_dedupe_merges_repeats():
    block = "We decided to rotate the API keys every month because of the audit findings."
    text = "\n\n".join([block, "Something else entirely about lunch plans and pizza toppings.", block, block])
    plain = compress(text, chunk_size=90, chunk_overlap=0)
    merged = compress(text, chunk_size=90, chunk_overlap=0, dedupe=True)
    assert len(plain.zettels) == 4
    assert len(merged.zettels) == 2
    assert merged.zettels[0].quote == block


def test_verbose_labels_use_names():
    text = "\n\n".join(["Alice and Bob reviewed the Kafka cluster."] * 2 + ["Alice and Bob fixed the Kafka lag."])
    short = compress(text, chunk_size=50, chunk_overlap=0)
    verbose = compress(text, chunk_size=50, chunk_overlap=0, verbose_labels=True)
    assert short.tunnels and verbose.tunnels
    assert "Alice" in verbose.tunnels[0].label and "Alice" not in short.tunnels[0].label


def test_tunnel_options():
    text = "\n\n".join(f"Alice and Bob discussed the Kafka consumer lag, round {i}." for i in range(12))
    none = compress(text, chunk_size=60, chunk_overlap=0, tunnel_top_k=0)
    assert none.tunnels == []
    capped = compress(text, chunk_size=60, chunk_overlap=0, tunnel_top_k=2)
    degree: dict[str, int] = {}
    for t in capped.tunnels:
        degree[t.from_id] = degree.get(t.from_id, 0) + 1
        degree[t.to_id] = degree.get(t.to_id, 0) + 1
    assert capped.tunnels and max(degree.values()) <= 2
    loose = compress(text, chunk_size=60, chunk_overlap=0)
    varied = "\n\n".join(f"Person{i} and Person{i + 1} discussed the Kafka lag." for i in range(12))
    assert compress(varied, chunk_size=60, chunk_overlap=0).tunnels  # some overlap...
    assert compress(varied, chunk_size=60, chunk_overlap=0, tunnel_threshold=1.0).tunnels == []  # ...none total
    assert len(compress(text, chunk_size=60, chunk_overlap=0, tunnel_threshold=1.0).tunnels) <= len(loose.tunnels)


def test_compress_many_and_merge_results():
    a, b = compress_many([PROSE, "Zed founded the Zeta guild. We decided to meet weekly."])
    merged = merge_results([a, b])
    assert len(merged.zettels) == len(a.zettels) + len(b.zettels)
    assert len({z.id for z in merged.zettels}) == len(merged.zettels)
    assert all(z.source_start is None and z.source_end is None for z in merged.zettels)
    assert merged.meta["input_length"] == a.meta["input_length"] + b.meta["input_length"]
    weights = [z.weight for z in merged.zettels]
    assert max(weights) == 1.0 and min(weights) == 0.0  # one scale
    names = set(a.entity_index.name_to_code) | set(b.entity_index.name_to_code)
    assert set(merged.entity_index.name_to_code) == names
    assert merge_results([]).zettels == []
    with pytest.raises(ValidationError):
        merge_results([a, "b"])  # type: ignore[list-item]
    with pytest.raises(ValidationError):
        merge_results([a], chunk_size=3)


def test_top_zettels_and_normalize_weights():
    r = compress(PROSE, chunk_size=150, chunk_overlap=0)
    top = top_zettels(r, 2)
    assert len(top) == 2 and top[0].weight >= top[1].weight
    assert top_zettels(r, 0) == []
    with pytest.raises(ValidationError):
        top_zettels(r, -1)
    zs = [Zettel(id=str(i), weight=w) for i, w in enumerate([0.5, 0.1, 0.5, 0.9, 0.1])]
    normalize_weights(zs)
    w = [z.weight for z in zs]
    assert w[0] == w[2] and w[1] == w[4]  # equal raw scores -> equal weights
    assert w[3] == 1.0 and w[1] == 0.0 and 0.0 < w[0] < 1.0
    reordered = [Zettel(id=str(i), weight=x) for i, x in enumerate([0.1, 0.9, 0.5, 0.1, 0.5])]
    normalize_weights(reordered)
    assert sorted(z.weight for z in reordered) == sorted(w)  # input order never matters


def test_errors_are_engram_errors():
    with pytest.raises(EngramError):
        compress(PROSE, bogus=1)


_DIGEST = r"""
import hashlib, sys
from engramdb.compress import compress, result_to_json

for path in sys.argv[1:]:
    text = open(path, encoding="utf-8").read()
    print(hashlib.sha256(result_to_json(compress(text)).encode("utf-8")).hexdigest())
"""


@pytest.mark.skipif(not NOVEL.exists(), reason="shared gutenberg data not mounted")
def test_books_are_byte_identical_across_processes_and_hash_seeds():
    digests = []
    for seed in ("0", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(ROOT))
        out = subprocess.run(
            [sys.executable, "-c", _DIGEST, str(NOVEL), str(SCIENCE)],
            env=env, capture_output=True, text=True, check=True, timeout=300,
        )
        digests.append(out.stdout.split())
    assert len(digests[0]) == 2
    assert digests[0] == digests[1]


def test_result_to_json_is_canonical():
    a = result_to_json(compress(PROSE))
    b = result_to_json(compress(PROSE))
    assert a == b and hashlib.sha256(a.encode()).hexdigest()
    with pytest.raises(ValidationError):
        result_to_json("nope")  # type: ignore[arg-type]


def test_public_helpers_validate_input():
    with pytest.raises(ValidationError):
        normalize_weights([Zettel(id="1", weight=0.2)], temperature=0)
    with pytest.raises(ValidationError):
        normalize_weights(["not a zettel"])  # type: ignore[list-item]
    with pytest.raises(ValidationError):
        top_zettels("nope", 3)  # type: ignore[arg-type]


def test_min_entity_frequency():
    text = "Alice met Bob. Alice waved at Carol and Alice smiled."
    assert compress(text).zettels[0].entities == ["Alice", "Bob", "Carol"]
    assert compress(text, min_entity_frequency=2).zettels[0].entities == ["Alice"]


def test_stop_words_option_removes_topics():
    text = "The kafka consumer lag grew while the kafka brokers restarted twice."
    assert any("kafka" in t for t in compress(text).zettels[0].topics)
    assert not any("kafka" in t for t in compress(text, stop_words=["Kafka"]).zettels[0].topics)


def test_quote_avoids_fragments_of_cut_sentences():
    from engramdb.compress.quote import select_quote

    text = ("excited before, how many years longer Mr. Bennet was likely to live; and Sir William gave it "
            "as his decided opinion. She smiled at the thought of the ball next week and went home.")
    assert select_quote(text).startswith("She smiled")
    chat = "hey so i was thinking\nwe decided on the db today\nmaybe postgres is fine"
    assert select_quote(chat) == "we decided on the db today"  # all lowercase: no penalty


def test_small_chunk_size_with_default_overlap():
    r = compress_refined(PROSE, chunk_size=60)  # the default overlap shrinks instead of failing
    assert len(r.zettels) > 4
    with pytest.raises(ValidationError):
        compress_refined(PROSE, chunk_size=60, chunk_overlap=60)


def _many_paragraphs(n: int) -> str:
    names = ["Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi", "Ivan", "Judy"]
    topics = ["kafka consumer lag", "postgres migration", "billing service", "redis cache", "terraform plan",
              "security audit", "release notes", "load balancer", "search index", "vector store"]
    paras = []
    for i in range(n):
        a, b = names[i % 10], names[(i * 3 + 1) % 10]
        paras.append(f"{a} and {b} reviewed the {topics[i % 10]} and the {topics[(i * 7) % 10]} on day {i}.")
    return "\n\n".join(paras)


def test_tunnels_above_500_zettels_match_the_exact_path(monkeypatch):
    from engramdb.compress import links  # (engramdb.compress the attribute is the function)

    text = _many_paragraphs(700)
    lsh = compress(text, chunk_size=60, chunk_overlap=0)
    assert len(lsh.zettels) > 500
    monkeypatch.setattr(links, "LSH_MIN_ITEMS", 10**9)
    exact = compress(text, chunk_size=60, chunk_overlap=0)
    pairs = lambda r: {(t.from_id, t.to_id) for t in r.tunnels}  # noqa: E731
    assert len(pairs(exact)) > 300
    assert len(pairs(lsh) & pairs(exact)) >= 0.9 * len(pairs(exact))


def test_dedupe_above_500_zettels():
    block = "We decided to rotate the Vault keys every month after the audit."
    text = "\n\n".join([block] * 300 + [f"Unrelated note number {i} about lunch {i}." for i in range(300)])
    r = compress(text, chunk_size=70, chunk_overlap=0, dedupe=True)
    assert sum(1 for z in r.zettels if z.quote == block) == 1
    assert len(r.zettels) <= 301
