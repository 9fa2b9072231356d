"""AAAK v2 as zettel-compress 1.0.0 writes it: ``encode(result, version=2)`` and the line encoders.

The oracle is ../shared/data/zettel-compress/: seven ``.aaak`` files written by zettel-compress's own
``encode`` and the ``compress()`` results they came from.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engramdb
from engramdb import aaak
from engramdb.errors import ValidationError
from engramdb.records import (
    ALL_EMOTIONS,
    ALL_FLAGS,
    CompressResult,
    EntityIndex,
    Tunnel,
    Zettel,
)

ORACLE = Path(__file__).resolve().parents[2] / "shared" / "data" / "zettel-compress"
NAMES = [
    "locomo-conv-26", "locomo-conv-30", "locomo-conv-41", "locomo-conv-42", "locomo-conv-43",
    "origin_of_species_pg1228", "pride_and_prejudice_pg1342",
]


def _oracle(name: str, suffix: str) -> Path:
    path = ORACLE / f"{name}{suffix}"
    if not path.exists():
        pytest.skip(f"the zettel-compress reference outputs {ORACLE} are not beside this checkout")
    return path


def result_from_reference_json(data: dict) -> CompressResult:
    """A zettel-compress ``compress()`` result (camelCase JSON) as a CompressResult."""
    zettels = [
        Zettel(id=z["id"], entities=z["entities"], topics=z["topics"], quote=z["quote"], weight=z["weight"],
               emotions=z["emotions"], flags=z["flags"], source_start=z.get("sourceStart"),
               source_end=z.get("sourceEnd"), resolved_date=z.get("resolvedDate"))
        for z in data["zettels"]
    ]
    tunnels = [Tunnel(t["from"], t["to"], t["label"]) for t in data["tunnels"]]
    index = EntityIndex(dict(data["entityIndex"]["nameToCode"]), dict(data["entityIndex"]["codeToName"]))
    return CompressResult(zettels, tunnels, index, dict(data["meta"]))


@pytest.mark.parametrize("name", NAMES)
def test_reencode_of_each_reference_file_is_byte_identical(name):
    raw = _oracle(name, ".aaak").read_bytes()
    result = engramdb.decode(raw.decode("utf-8"), strict=True)
    assert "warnings" not in result.meta
    assert engramdb.encode(result, version=2).encode("utf-8") == raw


@pytest.mark.parametrize("name", NAMES)
def test_v2_of_the_reference_compress_result_is_what_zettel_compress_wrote(name):
    data = json.loads(_oracle(name, ".compress.json").read_text(encoding="utf-8"))
    raw = _oracle(name, ".aaak").read_bytes()
    assert aaak.encode(result_from_reference_json(data), version=2).encode("utf-8") == raw


def test_js_to_fixed_rounds_half_away_from_zero_on_the_binary_value():
    f = aaak._js_fixed2
    assert f(0.125) == "0.13"  # exactly representable tie: JavaScript takes the larger n
    assert f(-0.125) == "-0.13"
    assert f(1.005) == "1.00"  # 1.005 is 1.00499999... in binary
    assert f(0.5) == "0.50"
    assert f(-0.0) == "0.00" and f(-0.001) == "-0.00"
    assert f(float("nan")) == "NaN" and f(float("inf")) == "Infinity" and f(float("-inf")) == "-Infinity"
    assert f(1e21) == "1e+21" and f(123.456) == "123.46"


def test_line_encoders_v2_match_the_seed_shapes():
    index = EntityIndex({"Alice": "ALC"}, {"ALC": "Alice"})
    z = Zettel(id="001", entities=["Alice", "Bob"], topics=["auth tokens", "a,b"], quote='she said "hi"\nok',
               weight=0.905, emotions=["joy"], flags=["DECISION"], source_start=3, source_end=9,
               resolved_date="2024-01-01")
    assert engramdb.encode_zettel_line(z, index, version=2) == \
        '001:ALC+BOB|auth\\_tokens,a\\,b|"she said \\"hi\\"\\nok"|0.91|joy|DECISION|3-9'
    assert engramdb.encode_tunnel_line(Tunnel("001", "002", "ALC+B|X"), version=2) == "T:001<->002|ALC+B|X"
    # v3 lines are the ones encode() writes
    doc = engramdb.encode(CompressResult([z], [Tunnel("001", "001", "x|y")], index, {}))
    assert engramdb.encode_zettel_line(z, index) in doc.split("\n")
    assert engramdb.encode_tunnel_line(Tunnel("001", "001", "x|y")) in doc.split("\n")
    with pytest.raises(ValidationError):
        engramdb.encode_zettel_line(z, index, version=4)
    with pytest.raises(ValidationError):
        engramdb.encode(CompressResult(), version=1)


def test_v2_header_carries_date_and_title_escaped_and_drops_other_meta():
    r = CompressResult([], [], EntityIndex(), {"date": "8 May|2023", "title": "a\\b", "source": "x", "n": 1})
    assert aaak.encode(r, version=2) == "FILE:000||8 May\\|2023|a\\\\b|v2"
    back = aaak.decode(aaak.encode(r, version=2), strict=True)
    assert back.meta["date"] == "8 May|2023" and back.meta["title"] == "a\\b"
    with pytest.raises(ValidationError):
        aaak.encode(CompressResult(meta={"date": 2023}), version=2)


def test_a_name_without_a_code_is_written_as_its_first_three_utf16_units_uppercased():
    r = CompressResult([Zettel(id="1", entities=["alice", "\U0001F600x"], quote="q")], [], EntityIndex(), {})
    text = aaak.encode(r, version=2)
    assert text.split("\n")[1].startswith("1:ALI+\U0001F600X|")


_text = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=12)
_plain = st.text(st.characters(whitelist_categories=("Lu", "Ll", "Nd")), min_size=1, max_size=8)


@st.composite
def _v2_results(draw):
    """Results whose every field AAAK v2 can carry (digit ids, 2-decimal weights, names with codes)."""
    names = draw(st.lists(_plain, max_size=5, unique=True))
    index = EntityIndex({n: f"C{i}" for i, n in enumerate(names)}, {f"C{i}": n for i, n in enumerate(names)})
    zettels = []
    for i in range(draw(st.integers(0, 5))):
        both = draw(st.booleans())
        start = draw(st.integers(0, 10**6)) if both else None
        zettels.append(Zettel(
            id=f"{i + 1:03d}", entities=draw(st.lists(st.sampled_from(names), max_size=3)) if names else [],
            topics=draw(st.lists(_text.filter(bool), max_size=3)), quote=draw(_text),
            weight=draw(st.integers(0, 100)) / 100, emotions=draw(st.lists(st.sampled_from(ALL_EMOTIONS), max_size=2)),
            flags=draw(st.lists(st.sampled_from(ALL_FLAGS), max_size=2)),
            source_start=start, source_end=start + draw(st.integers(0, 99)) if both else None,
        ))
    meta = {}
    for key in ("date", "title"):
        value = draw(_text)
        if value.strip():
            meta[key] = value
    return CompressResult(zettels, [], index, meta)


@settings(max_examples=150, deadline=None)
@given(_v2_results())
def test_v2_round_trips_what_v2_carries_and_decodes_strictly(result):
    text = aaak.encode(result, version=2)
    back = aaak.decode(text, strict=True)
    assert [z.id for z in back.zettels] == [z.id for z in result.zettels]
    for a, b in zip(back.zettels, result.zettels):
        assert (a.entities, a.quote, a.weight, a.emotions, a.flags) == (b.entities, b.quote, b.weight, b.emotions,
                                                                         b.flags)
        assert a.topics == b.topics
        assert (a.source_start, a.source_end) == (b.source_start, b.source_end)
    assert dict(back.entity_index.code_to_name) == dict(result.entity_index.code_to_name)
    for key in ("date", "title"):
        assert back.meta.get(key) == result.meta.get(key)
    assert aaak.encode(back, version=2) == text


def test_strict_v2_refuses_an_entity_code_missing_from_the_index_as_zettel_compress_does():
    from engramdb.errors import AAAKParseError

    doc = 'FILE:001|ALC|||v2\nE:ALC=Alice\n001:ALC+BOB||"q"|0.50||'
    lenient = aaak.decode(doc)
    assert lenient.zettels[0].entities == ["Alice", "BOB"]
    assert lenient.meta["warnings"] == ["line 3: entity code 'BOB' is missing from the E: index"]
    with pytest.raises(AAAKParseError, match="BOB"):
        aaak.decode(doc, strict=True)
    assert "warnings" not in aaak.decode('FILE:001|BOB|||\n001:BOB||"q"|0.50||').meta  # v1 has no index
