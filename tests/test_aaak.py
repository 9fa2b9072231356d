"""AAAK result documents: encode/decode round trips, v1/v2 compatibility, strict and lenient errors."""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engramdb.aaak import decode, encode, tjson_dumps, tjson_loads
from engramdb.errors import AAAKParseError, DumpIntegrityError, ValidationError
from engramdb.records import ALL_EMOTIONS, ALL_FLAGS, CompressResult, EntityIndex, Tunnel, Zettel

# Every delimiter and escape character of the grammar, plus unicode, controls and lone surrogates.
SPECIALS = list('|"\\\n\r\t:;=,+<>@~_ -') + ["\x00", "\x7f", "\u2028", "\ufeff", "\ud800", "é", "日", "🎉"]
TEXT = st.text(st.one_of(st.sampled_from(SPECIALS), st.characters(exclude_categories=())), max_size=40)
FLOATS = st.floats(allow_nan=False)  # every magnitude, subnormals, -0.0 and infinities


@st.composite
def results(draw) -> CompressResult:
    codes = draw(st.dictionaries(TEXT, TEXT, max_size=4))
    if draw(st.booleans()):
        name_to_code = {}
        for code in sorted(codes):
            name_to_code[codes[code]] = code
    else:
        name_to_code = draw(st.dictionaries(TEXT, TEXT, max_size=3))
    names = list(codes.values()) + list(codes) + ["Alice", ""]
    zettels = []
    for i in range(draw(st.integers(0, 4))):
        start = draw(st.none() | st.integers(-5, 10**12))
        zettels.append(Zettel(
            id=draw(st.sampled_from(["E", "T", "FILE", "@x", "", f"{i:03d}"]) | TEXT),
            entities=draw(st.lists(st.sampled_from(names) | TEXT, max_size=4)),
            topics=draw(st.lists(TEXT, max_size=3)),
            quote=draw(TEXT),
            weight=draw(FLOATS),
            emotions=draw(st.lists(st.sampled_from(ALL_EMOTIONS), max_size=3)),
            flags=draw(st.lists(st.sampled_from(ALL_FLAGS), max_size=2)),
            source_start=start,
            source_end=draw(st.none() | st.integers(0, 10**12)),
            resolved_date=draw(st.none() | TEXT),
        ))
    tunnels = draw(st.lists(st.builds(Tunnel, TEXT, TEXT, TEXT), max_size=3))
    meta = draw(st.dictionaries(
        st.sampled_from(["date", "title", "input_length", "chunk_count", "source", "x"]) | TEXT,
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | TEXT
        | st.binary(max_size=8) | st.lists(st.integers(), max_size=3),
        max_size=4,
    ))
    return CompressResult(zettels, tunnels, EntityIndex(name_to_code, codes), meta)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(results())
def test_encode_decode_round_trip_is_exact(result):
    text = encode(result)
    back = decode(text, strict=True)
    assert back.zettels == result.zettels
    assert back.tunnels == result.tunnels
    assert back.entity_index == result.entity_index
    assert back.meta == result.meta
    assert "warnings" not in back.meta
    # canonical: a second trip gives the same bytes, and the text is valid UTF-8
    assert encode(back) == text
    text.encode("utf-8")


@settings(max_examples=50, deadline=None)
@given(results())
def test_one_record_per_line(result):
    text = encode(result)
    lines = text.split("\n")
    assert lines[-1] == ""
    # header + meta + optional E:/@names + zettels + tunnels + trailer
    assert len(lines) - 1 >= 2 + len(result.zettels) + len(result.tunnels)
    assert not any(ch in text for ch in "\r\x00\u2028")


def test_weights_keep_every_digit():
    z = Zettel("001", weight=0.1 + 0.2)
    back = decode(encode(CompressResult(zettels=[z])), strict=True)
    assert back.zettels[0].weight == 0.30000000000000004
    for w in (5e-324, 1.7976931348623157e308, -0.0, math.inf):
        back = decode(encode(CompressResult(zettels=[Zettel("1", weight=w)])), strict=True)
        assert repr(back.zettels[0].weight) == repr(w)


def test_huge_fields_round_trip():
    quote = ("a|b\"c\\d\ne" * 200_000)
    z = Zettel("001", quote=quote, topics=["t" * 100_000])
    back = decode(encode(CompressResult(zettels=[z])), strict=True)
    assert back.zettels[0] == z


def test_empty_result_and_empty_items_are_distinguished():
    empty = CompressResult()
    assert decode(encode(empty), strict=True) == empty
    for topics in ([], [""], ["", ""], ["a", ""]):
        r = CompressResult(zettels=[Zettel("1", topics=topics, entities=topics)])
        assert decode(encode(r), strict=True).zettels[0].topics == topics
        assert decode(encode(r), strict=True).zettels[0].entities == topics


def test_entity_literal_when_a_name_collides_with_a_code():
    index = EntityIndex({"Alice": "ALC", "ALC": "X1"}, {"ALC": "Alice", "BOB": "Bob"})
    z = Zettel("001", entities=["Alice", "ALC", "BOB", "Bob", "Carol"])
    r = CompressResult(zettels=[z], entity_index=index)
    text = encode(r)
    assert "001:ALC+=ALC+" in text
    assert decode(text, strict=True) == r


# --- v1 / v2 compatibility --------------------------------------------------------

V2_SAMPLE = (
    "FILE:002|ALC+BOB|2026-06-12|Auth Design|v2\n"
    "E:ALC=Alice;BOB=Bob\n"
    '001:ALC+BOB|authentication,security|"We decided to use JWT tokens."|0.91|conviction|DECISION+TECHNICAL\n'
    '002:ALC|security,deploy\\_plan|"She said \\"ship\\" \\| now\\nok"|0.55|fear|TECHNICAL|10-42\n'
    "T:001<->002|ALC+BOB\n"
)

V1_SAMPLE = (
    "FILE:002|ALC+BOB|2026-06-10|Auth Design\n"
    '001:ALC+BOB|authentication_security|"We decided to use JWT tokens for authentication."|0.91|conviction|DECISION+TECHNICAL\n'
    '002:ALC|security_deployment|"Alice was afraid | the system would fail."|0.55|fear|TECHNICAL\n'
    "T:001<->002|ALC\n"
)


def test_decode_v2_fixture():
    r = decode(V2_SAMPLE, strict=True)
    assert r.entity_index.code_to_name == {"ALC": "Alice", "BOB": "Bob"}
    assert r.entity_index.name_to_code == {"Alice": "ALC", "Bob": "BOB"}
    z1, z2 = r.zettels
    assert z1 == Zettel("001", ["Alice", "Bob"], ["authentication", "security"], "We decided to use JWT tokens.",
                        0.91, ["conviction"], ["DECISION", "TECHNICAL"])
    assert z2.topics == ["security", "deploy plan"]
    assert z2.quote == 'She said "ship" | now\nok'
    assert (z2.source_start, z2.source_end) == (10, 42)
    assert r.tunnels == [Tunnel("001", "002", "ALC+BOB")]
    assert r.meta == {"input_length": len(z1.quote) + len(z2.quote), "chunk_count": 2,
                      "date": "2026-06-12", "title": "Auth Design"}
    # upgrading a v2 document to v3 keeps everything
    assert decode(encode(r), strict=True) == r


def test_decode_v1_fixture():
    r = decode(V1_SAMPLE, strict=True)
    assert [z.id for z in r.zettels] == ["001", "002"]
    assert r.zettels[0].topics == ["authentication", "security"]
    assert r.zettels[0].entities == ["ALC", "BOB"]  # v1 has no E: line: codes stand for themselves
    assert r.zettels[1].quote == "Alice was afraid | the system would fail."
    assert r.tunnels == [Tunnel("001", "002", "ALC")]
    assert r.meta["date"] == "2026-06-10"
    assert "warnings" not in r.meta


def test_lenient_mode_collects_warnings():
    text = V2_SAMPLE.replace("FILE:002", "FILE:005").replace("conviction", "conviction+bliss")
    text += "garbage line without structure\n"
    r = decode(text)
    warnings = r.meta["warnings"]
    assert any("declares 5 zettels but 2" in w for w in warnings)
    assert any("unknown emotion 'bliss'" in w for w in warnings)
    assert any(w.startswith("line 6:") for w in warnings)
    assert r.zettels[0].emotions == ["conviction"]
    with pytest.raises(AAAKParseError):
        decode(text, strict=True)


@pytest.mark.parametrize(
    ("mutate", "line", "column"),
    [
        (lambda t: t.replace("|0.91|", "|0.910|"), 5, 69),
        (lambda t: t.replace("|0.91|", "|zz|"), 5, 69),
        (lambda t: t.replace('"We decided', "We decided"), 5, 37),
        (lambda t: t.replace("E:ALC=Alice", "E:ALC\\q=Alice"), 4, 6),
        (lambda t: t.replace("T:001<->", "T:001<-"), 7, 3),
        (lambda t: t.replace("@meta chunk_count", "@meta zz"), 3, 7),  # keys out of order
        (lambda t: t.replace("conviction", "bliss"), 8, 8),  # caught by the trailer first
    ],
)
def test_strict_errors_carry_line_and_column(mutate, line, column):
    # v3 text of the v2 sample: line 1 header, 2-3 @meta, 4 E:, 5-6 zettels, 7 T:, 8 @end
    r = decode(V2_SAMPLE, strict=True)
    text = mutate(encode(r))
    assert text != encode(r)
    with pytest.raises(AAAKParseError) as info:
        decode(text, strict=True)
    assert (info.value.line, info.value.column) == (line, column), str(info.value)
    assert f"line {line}, column {column}" in str(info.value)


def test_v3_trailer_detects_edits_and_truncation():
    text = encode(decode(V2_SAMPLE, strict=True))
    edited = text.replace("We decided", "We refused")
    with pytest.raises(DumpIntegrityError):
        decode(edited, strict=True)
    assert any("SHA-256" in w for w in decode(edited).meta["warnings"])
    cut = text[: text.rindex("@end")]
    with pytest.raises(DumpIntegrityError):
        decode(cut, strict=True)
    # Once the v3 header is complete, every prefix must fail. (Shorter cuts such as
    # "FILE:0" are valid, empty v1 documents.)
    for n in range(text.index("|v3") + 3, len(text)):
        with pytest.raises(AAAKParseError):
            decode(text[:n], strict=True)


def test_decode_rejects_dumps_and_non_text():
    with pytest.raises(AAAKParseError, match="store dump"):
        decode("FILE:||||v3|dump\n@end 0 " + "0" * 64 + "\n")
    with pytest.raises(AAAKParseError):
        decode(b"\xff\xfe")
    with pytest.raises(AAAKParseError):
        decode(42)  # type: ignore[arg-type]
    with pytest.raises(AAAKParseError, match="unsupported AAAK version v9"):
        decode("FILE:000||||v9\n")
    assert decode("") == CompressResult(meta={"input_length": 0, "chunk_count": 0})


def test_encode_rejects_bad_input_with_validation_error():
    with pytest.raises(ValidationError):
        encode("not a result")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        encode(CompressResult(zettels=[Zettel("1", quote=3)]))  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        encode(CompressResult(meta={"x": object()}))
    with pytest.raises(ValidationError):
        encode(CompressResult(meta={"x": math.nan}))


# --- tjson --------------------------------------------------------------------------

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | TEXT
    | st.binary(max_size=16),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(["$bytes", "$map", "$$", "$", "a"]) | TEXT, inner, max_size=4)
    | st.dictionaries(st.integers() | st.binary(max_size=4), inner, max_size=3),
    max_leaves=20,
)


@settings(max_examples=100, deadline=None)
@given(JSONISH)
def test_tjson_round_trip_keeps_types(value):
    text = tjson_dumps(value)
    back = tjson_loads(text)
    assert back == value
    assert _types(back) == _types(value)
    assert tjson_dumps(back) == text
    text.encode("utf-8")
    assert "\n" not in text


def _types(value):
    if isinstance(value, dict):
        return {repr(k): _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value).__name__


@pytest.mark.parametrize("text", [
    '{"a":1,"a":2}', '{"b":1,"a":2}', '{"a": 1}', "1E5", "NaN", '{"$x":1}', '{"$bytes":"AAE"}',
    '{"$map":[["a",1]]}', "[" * 100_000 + "]" * 100_000, '"\\ud800"x',
])
def test_tjson_rejects_non_canonical_and_hostile_text(text):
    with pytest.raises(AAAKParseError):
        tjson_loads(text)
