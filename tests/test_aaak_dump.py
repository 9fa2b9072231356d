"""AAAK v3 store dumps: lossless round trips, canonical bytes, and rejection of every damaged dump."""
from __future__ import annotations

import dataclasses
import io
import os
import random
import warnings
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engramdb.aaak import (
    DUMP_HEADER,
    ArchiveRow,
    DumpHeader,
    ProcedureRow,
    edge_sort_key,
    read_dump,
    tjson_dumps,
    verify_dump,
    write_dump,
)
from engramdb.errors import AAAKParseError, DumpIntegrityError, EmbeddingError, EngramError, ValidationError
from engramdb.records import ALL_EMOTIONS, ALL_FLAGS, EDGE_KINDS, TIERS, Edge, Node

SPECIALS = list('|"\\\n\r\t:;=,+<>@~_ -') + ["\x00", "\x7f", "\u2028", "\ufeff", "\ud800", "é", "日", "🎉"]
TEXT = st.text(st.one_of(st.sampled_from(SPECIALS), st.characters(exclude_categories=())), max_size=30)
ID = st.one_of(st.sampled_from(["E", "T", "FILE", "@n", "a:b", "x|y"]), TEXT.filter(bool))
FINITE = st.floats(allow_nan=False, allow_infinity=False)
F32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
SCALAR = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | FINITE | TEXT | st.binary(max_size=12)
METADATA = st.recursive(
    SCALAR,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(["$bytes", "$map", "$", "k"]) | TEXT, inner, max_size=3),
    max_leaves=10,
)
SPACES = [
    {"name": "minilm", "model": "all-MiniLM-L6-v2", "dims": 3, "dtype": "float32", "normalized": True},
    {"name": "x|y", "model": "m\nodel", "dims": 1, "dtype": "float16", "normalized": False, "metric": "cosine"},
]


@st.composite
def nodes(draw, node_id: str, spaces: list[dict]) -> Node:
    embeddings = {}
    for space in spaces:
        if draw(st.booleans()):
            embeddings[space["name"]] = draw(st.lists(F32, min_size=space["dims"], max_size=space["dims"]))
    return Node(
        id=node_id,
        content=draw(TEXT),
        entities=draw(st.lists(TEXT, max_size=3)),
        topics=draw(st.lists(TEXT, max_size=3)),
        quote=draw(TEXT),
        weight=draw(FINITE),
        flags=draw(st.lists(st.sampled_from(ALL_FLAGS), max_size=2)),
        emotions=draw(st.lists(st.sampled_from(ALL_EMOTIONS), max_size=2)),
        source_start=draw(st.none() | st.integers(0, 10**30)),
        source_end=draw(st.none() | st.integers(0, 10**6)),
        resolved_date=draw(st.none() | TEXT),
        tier=draw(st.sampled_from(TIERS)),
        importance=draw(st.floats(0, 1)),
        created_at=draw(FINITE),
        last_accessed=draw(FINITE),
        access_count=draw(st.integers(0, 2**70)),
        pinned=draw(st.booleans()),
        tags=draw(st.lists(TEXT, max_size=3)),
        source=draw(TEXT),
        metadata=draw(st.dictionaries(TEXT, METADATA, max_size=3)),
        embeddings=embeddings,
    )


@st.composite
def stores(draw) -> dict:
    spaces = draw(st.sampled_from([[], SPACES[:1], SPACES]))
    ids = sorted(draw(st.sets(ID, max_size=5)))
    node_list = [draw(nodes(i, spaces)) for i in ids]
    edges = draw(st.lists(st.builds(
        Edge, ID, ID, st.sampled_from(EDGE_KINDS), FINITE, TEXT, FINITE, st.none() | FINITE, st.none() | FINITE,
    ), max_size=4, unique_by=edge_sort_key))
    archive = sorted(draw(st.dictionaries(ID, TEXT, max_size=3)).items())
    procedures = draw(st.lists(
        st.dictionaries(TEXT | st.integers(), METADATA, max_size=3), max_size=3))
    return {
        "settings": draw(st.dictionaries(TEXT, METADATA, max_size=3)),
        "meta": draw(st.dictionaries(TEXT, METADATA, max_size=2)),
        "spaces": spaces, "nodes": node_list, "edges": edges, "archive": archive, "procedures": procedures,
    }


def dump_text(store: dict) -> str:
    buf = io.StringIO()
    write_dump(buf, **store)
    return buf.getvalue()


def load(text, **kw) -> dict:
    items = list(read_dump(text, **kw))
    header = items[0]
    assert isinstance(header, DumpHeader)
    return {
        "settings": header.settings, "meta": header.meta, "spaces": list(header.spaces),
        "nodes": [x for x in items if isinstance(x, Node)],
        "edges": [x for x in items if isinstance(x, Edge)],
        "archive": [tuple(x) for x in items if isinstance(x, ArchiveRow)],
        "procedures": [x.data for x in items if isinstance(x, ProcedureRow)],
    }


def same_store(a: dict, b: dict) -> None:
    assert a["settings"] == b["settings"]
    assert a["meta"] == b["meta"]
    assert sorted(a["spaces"], key=lambda s: s["name"]) == sorted(b["spaces"], key=lambda s: s["name"])
    assert a["nodes"] == b["nodes"]
    for x, y in zip(a["nodes"], b["nodes"]):  # field for field, including float bit patterns
        for f in dataclasses.fields(Node):
            if f.name == "metadata":  # canonical text pins types and float bits
                assert tjson_dumps(x.metadata) == tjson_dumps(y.metadata)
            elif f.name == "embeddings":  # float32 arrays, bit for bit
                assert {k: (v.dtype, v.tobytes()) for k, v in x.embeddings.items()} == \
                    {k: (v.dtype, v.tobytes()) for k, v in y.embeddings.items()}
            else:
                assert repr(getattr(x, f.name)) == repr(getattr(y, f.name)), f.name
    assert sorted(a["edges"], key=edge_sort_key) == sorted(b["edges"], key=edge_sort_key)
    assert a["archive"] == b["archive"]
    assert sorted(map(tjson_dumps, a["procedures"])) == sorted(map(tjson_dumps, b["procedures"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(stores())
def test_dump_round_trip_is_lossless_and_canonical(store):
    text = dump_text(store)
    back = load(text)
    same_store(store, back)
    assert dump_text(back) == text  # write(read(write(x))) == write(x), byte for byte
    text.encode("utf-8")  # lone surrogates are escaped: the dump is valid UTF-8
    assert "\r" not in text and "\x00" not in text


def test_every_node_field_is_written():
    """Adding a field to Node must come with a line for it here (and in spec/aaak.md)."""
    covered = {
        "id", "entities", "topics", "quote", "weight", "emotions", "flags", "source_start", "source_end",
        "resolved_date",  # zettel line
        "tier", "importance", "created_at", "last_accessed", "access_count", "pinned", "tags", "source",  # @n
        "content", "metadata", "embeddings",  # @c, @m, @v
    }
    assert {f.name for f in dataclasses.fields(Node)} == covered


def example_store() -> dict:
    rng = random.Random(5)
    node_list = []
    for i in range(6):
        node_list.append(Node(
            id=f"n{i:02d}", content=f"content {i} | with \"quotes\" \\ and\nnewlines é 🎉", entities=["Alice", "Bob"],
            topics=["auth", "jwt tokens"], quote=f"quote {i}", weight=rng.random(), flags=["DECISION"],
            emotions=["joy"], source_start=i * 10, source_end=i * 10 + 9, resolved_date="2026-06-12",
            tier=TIERS[i % 4], importance=rng.random(), created_at=1_700_000_000.0 + i, last_accessed=1.5e9,
            access_count=i, pinned=i % 2 == 0, tags=["t1", "t 2"], source="chat",
            metadata={"k": [1, 2.5, b"\x00\xff", None, True], "nested": {"$x": "y"}} if i % 2 else {},
            embeddings={"minilm": [rng.uniform(-1, 1) for _ in range(3)]} if i != 3 else {},
        ))
    edges = [Edge(f"n{i:02d}", f"n{i + 1:02d}", EDGE_KINDS[i % len(EDGE_KINDS)], 0.5 + i, f"label {i}",
                  1.0 * i, None if i % 2 else 2.0, None) for i in range(5)]
    return {
        "settings": {"tokenizer": {"lowercase": True, "stem": "english", "stopwords": ["a", "the"]}},
        "meta": {"store_id": "0123abcd", "seq": 42},
        "spaces": SPACES[:1], "nodes": node_list, "edges": edges,
        "archive": [("n00", "original long content"), ("n04", "other")],
        "procedures": [{"name": "deploy", "steps": ["build", "test"], 7: b"\x01"}, {"name": "a"}],
    }


@pytest.fixture(scope="module")
def dump() -> str:
    return dump_text(example_store())


def test_example_dump_round_trip(dump):
    same_store(example_store(), load(dump))
    summary = verify_dump(dump)
    assert (summary.nodes, summary.edges, summary.archive, summary.procedures) == (6, 5, 2, 2)
    assert summary.records == dump.count("\n") - 2
    assert dump.startswith(DUMP_HEADER + "\n")


def test_every_prefix_is_rejected(dump):
    for n in range(len(dump)):
        with pytest.raises(AAAKParseError):
            list(read_dump(dump[:n]))
        if n == len(dump) - 1:  # only the final LF is gone: --allow-edited accepts it, with a warning
            with pytest.warns(UserWarning, match="final LF"):
                list(read_dump(dump[:n], allow_edited=True))
            continue
        with pytest.raises(AAAKParseError):
            list(read_dump(dump[:n], allow_edited=True))


def test_flipped_bits_are_rejected(dump):
    data = dump.encode("utf-8")
    rng = random.Random(1)
    positions = range(len(data)) if len(data) < 4000 else rng.sample(range(len(data)), 4000)
    for pos in positions:
        bit = 1 << rng.randrange(8)
        bad = bytearray(data)
        bad[pos] ^= bit
        with pytest.raises(AAAKParseError):
            list(read_dump(io.BytesIO(bytes(bad))))


def _lines(dump: str) -> list[str]:
    return dump.splitlines(keepends=True)


@pytest.mark.parametrize("allow_edited", [False, True])
def test_deleted_duplicated_and_swapped_lines_are_rejected(dump, allow_edited):
    lines = _lines(dump)
    for i in range(len(lines)):
        deleted = lines[:i] + lines[i + 1:]
        duplicated = lines[:i + 1] + lines[i:]
        if i + 1 < len(lines) and lines[i] != lines[i + 1]:
            swapped = lines[:i] + [lines[i + 1], lines[i]] + lines[i + 2:]
            with pytest.raises(AAAKParseError):
                list(read_dump("".join(swapped), allow_edited=allow_edited))
        for variant in (deleted, duplicated):
            if not allow_edited:
                with pytest.raises(AAAKParseError):
                    list(read_dump("".join(variant)))
                continue
            # --allow-edited accepts a grammatical edit (a whole record deleted, a repeatable
            # line repeated; issue 12, bug 6), and says so; an edit that breaks the grammar
            # (half a node, a duplicate id, the header) still fails
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    list(read_dump("".join(variant), allow_edited=True))
                except AAAKParseError:
                    continue
            assert any("edited dump" in str(w.message) for w in caught), i


def test_allow_edited_accepts_a_deliberate_grammatical_edit(dump):
    edited = dump.replace("@c n02|content 2", "@c n02|CONTENT 2")
    assert edited != dump
    with pytest.raises(DumpIntegrityError, match="SHA-256"):
        list(read_dump(edited))
    nodes = [x for x in read_dump(edited, allow_edited=True) if isinstance(x, Node)]
    assert nodes[2].content.startswith("CONTENT 2 | with")
    # grammar is still enforced
    with pytest.raises(AAAKParseError):
        list(read_dump(dump.replace("|hot|", "|lukewarm|"), allow_edited=True))


@pytest.mark.parametrize(("old", "new", "message"), [
    ("@c n01|", "@c n02|", "names node 'n02' inside node 'n01'"),
    ("@space minilm|all-MiniLM-L6-v2|3|", "@space minilm|all-MiniLM-L6-v2|4|", "dims"),
    ("|0.5|0.0|", "|0.50|0.0|", "canonical"),
    ("@set tokenizer|{", "@set tokenizer|{ ", "JSON"),
    ("\n@meta seq", "\n@zz seq", "unknown line kind"),
    ("\n@e n00|n01|tunnel|", "\n@e n00|n01|teleport|", "edge kind"),
])
def test_grammar_errors_name_the_problem(dump, old, new, message):
    assert old in dump
    bad = dump.replace(old, new, 1)
    with pytest.raises(AAAKParseError, match=message) as info:
        list(read_dump(bad, allow_edited=True))
    assert info.value.line > 0 and info.value.column > 0


def test_caps_bound_memory():
    huge_line = DUMP_HEADER + "\n@c " + "x" * 100_000 + "\n"
    with pytest.raises(AAAKParseError, match="longer than 1000"):
        list(read_dump(huge_line, max_line_chars=1000))
    text = dump_text(example_store())
    with pytest.raises(AAAKParseError, match="more than 5 records"):
        list(read_dump(text, max_records=5))
    many_settings = DUMP_HEADER + "\n" + "".join(f'@set k{i:04d}|"{"x" * 900}"\n' for i in range(20))
    with pytest.raises(AAAKParseError, match="lines hold more than 10000 characters"):
        list(read_dump(many_settings, max_line_chars=10_000))
    fat_node = DUMP_HEADER + '\nn:||""|0.0||\n@n n|hot|0.5|0.0|0.0|0|0||\n@c n|' + "x" * 6000 + "\n@m n|{" + \
        ",".join(f'"k{i:04d}":1' for i in range(600)) + "}\n"
    with pytest.raises(AAAKParseError, match="node 'n' holds more than 10000"):
        list(read_dump(fat_node, max_line_chars=10_000))


def test_the_caps_hold_every_node_a_store_can_hold():
    # A store took a 16 Mi-character content of control characters plus a 2 Mi-character
    # quote and metadata; its dump had a 120 Mi-character node, which restore refused
    # ("holds more than 104857600 characters"): a backup that did not restore. A record
    # holds codec.MAX_RECORD_BYTES at most, each byte at most 6 characters in a dump (a
    # control byte is \u0001; measured here on the worst character in every field), plus its
    # id on each of its lines (5 and a vector line per space, an id at most 6 KiB escaped).
    from engramdb import aaak, codec
    from engramdb.records import MAX_ID_BYTES

    worst = "\x01" * 300
    node = Node(id="n", content=worst, quote=worst, metadata={worst: [worst, {worst: worst}]},
                tags=[worst], entities=[worst], topics=[worst], source=worst, resolved_date=worst)
    record = len(codec.pack(codec._compact_node(node.__dict__, [])))
    lines = dump_text({"settings": {}, "meta": {}, "spaces": [], "nodes": [node]}).split("\n")[1:-2]
    assert sum(len(line) + 1 for line in lines) <= 6 * record
    ids = (5 + aaak.MAX_DUMP_SPACES) * 6 * MAX_ID_BYTES
    vectors = aaak.MAX_DUMP_SPACES * (1024 + (4 * aaak.MAX_DUMP_DIMS + 2) // 3 * 4)
    assert 6 * codec.MAX_RECORD_BYTES + ids + vectors <= aaak.MAX_LINE_CHARS


def test_streams_text_binary_and_bytes(dump, tmp_path):
    path = tmp_path / "d.aaak"
    with open(path, "wb") as fp:
        write_dump(fp, **example_store())
    assert path.read_bytes() == dump.encode("utf-8")
    with open(path, "rb") as fp:
        same_store(example_store(), load(fp))
    with open(path, encoding="utf-8", newline="") as fp:
        same_store(example_store(), load(fp))
    same_store(example_store(), load(dump.encode("utf-8")))
    with pytest.raises(AAAKParseError, match="UTF-8"):
        list(read_dump(dump.encode("utf-8") + b"\xff"))


def test_two_pass_restore_on_one_open_file(dump, tmp_path):
    """verify_dump, seek(0), read_dump: the caller's file stays open between the passes."""
    path = tmp_path / "d.aaak"
    path.write_text(dump, encoding="utf-8", newline="")
    with open(path, "rb") as fp:
        summary = verify_dump(fp)
        assert not fp.closed
        fp.seek(0)
        nodes = [x for x in read_dump(fp) if isinstance(x, Node)]
        assert not fp.closed
    assert len(nodes) == summary.nodes == 6


def test_crlf_and_indented_documents_are_refused_clearly(dump):
    with pytest.raises(AAAKParseError, match="LF line endings"):
        list(read_dump(dump.replace("\n", "\r\n").encode("utf-8")))
    from engramdb.aaak import decode, encode
    from engramdb.records import CompressResult, Zettel
    text = encode(CompressResult(zettels=[Zettel("1")]))
    for bad in (text.replace("\n", "\r\n"), "\n" + text, "  " + text):
        with pytest.raises(AAAKParseError, match="LF line endings"):
            decode(bad)


def test_writer_refuses_bad_input():
    base = example_store()
    cases = [
        dict(base, nodes=list(reversed(base["nodes"]))),
        dict(base, nodes=base["nodes"] + base["nodes"][-1:]),
        dict(base, edges=base["edges"] + base["edges"][:1]),
        dict(base, archive=list(reversed(base["archive"]))),
        dict(base, spaces=[]),
        dict(base, spaces=[dict(SPACES[0], dims=4)]),
        dict(base, spaces=[{"name": "x"}]),
        dict(base, nodes=["not a node"]),
        dict(base, procedures=[["not", "a", "dict"]]),
        dict(base, settings={"x": object()}),
    ]
    for store in cases:
        with pytest.raises(EngramError) as info:
            write_dump(io.StringIO(), **store)
        assert isinstance(info.value, (ValidationError, EmbeddingError))


def test_edges_are_sorted_by_the_writer(dump):
    store = example_store()
    store["edges"] = list(reversed(store["edges"]))
    assert dump_text(store) == dump


def test_bytes_identical_across_hash_seeds(tmp_path):
    script = textwrap.dedent("""
        import io, sys
        sys.path.insert(0, sys.argv[1])
        from test_aaak_dump import example_store, dump_text
        store = example_store()
        store["procedures"] = [{str(i): set_like for i, set_like in enumerate("abc")}] + store["procedures"]
        sys.stdout.write(dump_text(store))
    """)
    outputs = []
    for seed in ("0", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        proc = subprocess.run([sys.executable, "-c", script, os.path.dirname(__file__)], env=env,
                              capture_output=True, check=True)
        outputs.append(proc.stdout)
    assert outputs[0] == outputs[1]
    assert outputs[0].startswith(DUMP_HEADER.encode())


def test_huge_content_round_trip():
    content = "\x01 control and text | " * 50_000
    store = {"settings": {}, "spaces": [], "nodes": [Node("big", content=content)]}
    text = dump_text(store)
    assert load(text)["nodes"][0].content == content


def test_a_dump_cut_at_a_line_end_does_not_suggest_allow_edited(dump):
    # its hint said "pass --allow-edited", also to a user who had passed it: that option
    # never accepts a dump without its @end line
    cut = dump[: dump.index("\n@end") + 1]
    for allow_edited in (False, True):
        with pytest.raises(DumpIntegrityError) as exc:
            list(read_dump(cut, allow_edited=allow_edited))
        assert "@end trailer is missing" in exc.value.message and "--allow-edited does not" in exc.value.hint
