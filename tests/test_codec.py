"""The record codec: hypothesis round trips and size-capped, typed failure on bad bytes."""
from __future__ import annotations

import msgpack
import numpy as np
import pytest
from conftest import nodes
from hypothesis import given, settings
from hypothesis import strategies as st

from engramdb import codec
from engramdb.errors import CorruptFileError, ValidationError
from engramdb.records import STORED, Node


@settings(max_examples=100, deadline=None)
@given(nodes())
def test_node_round_trip(node):
    data = codec.encode_node(node)
    # the record names the node's vector spaces; the vectors themselves live in the vector blocks
    asked = []
    got = codec.decode_node(data, fetch=lambda names: asked.append(names) or {n: node.embeddings[n] for n in names})
    assert got == node
    assert asked == ([sorted(node.embeddings)] if node.embeddings else [])
    placeholders = codec.decode_node(data)  # without the blocks: each vector is STORED
    assert dict(placeholders.embeddings) == dict.fromkeys(node.embeddings, STORED)
    assert codec.encode_node(placeholders) == data  # canonical: re-encoding is byte-identical
    assert codec.encode_node(got) == data


def test_first_layout_records_still_decode_with_their_vectors():
    """A record written before vectors moved to the blocks (schema 1 with float32 bytes)."""
    body = msgpack.packb([1, "old", "text", [], [], "", 0.0, [], [], None, None, None, "hot", 0.5, 0.0, 0.0, 0,
                          False, [], "", {}, {"s": np.asarray([0.5, -1.25], "<f4").tobytes()}], use_bin_type=True)
    node = codec.decode_node(bytes([codec.CODEC_MSGPACK]) + body)
    vec = node.embeddings["s"]
    assert vec.dtype == np.float32 and vec.tolist() == [0.5, -1.25] and not vec.flags.writeable
    assert codec.decode_node(bytes([codec.CODEC_MSGPACK]) + body, vectors=False).embeddings == {}


def test_large_records_are_compressed_and_small_ones_are_not():
    small = codec.encode_node(Node(id="a", content="short"))
    large = codec.encode_node(Node(id="b", content="word " * 10_000))
    assert small[0] == codec.CODEC_MSGPACK
    assert large[0] == codec.CODEC_ZSTD
    assert len(large) < 2_000
    assert codec.decode_node(large).content == "word " * 10_000


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_decode_or_raise_corrupt(data):
    try:
        node = codec.decode_node(data)
    except CorruptFileError:
        return
    assert isinstance(node, Node)


@pytest.mark.parametrize("data", [
    b"",
    b"\x09" + msgpack.packb([1]),  # unknown codec byte
    b"\x01" + msgpack.packb([2] + [None] * 21),  # future schema
    b"\x01" + msgpack.packb([1, "id"]),  # too short
    b"\x01" + msgpack.packb({"a": 1}),  # not an array
    b"\x02" + b"not zstd at all",
    b"\x01\xc1",  # msgpack's reserved byte
    b"\x01" + msgpack.packb([1, "", "c"] + [None] * 19),  # empty id fails validation
    b"\x01" + msgpack.packb([1, "i", "c", [], [], "", 0.0, [], [], None, None, None, "lukewarm", 0.5,
                             0.0, 0.0, 0, False, [], "", {}, {}]),  # bad tier
    b"\x01" + msgpack.packb([1, "i", "c", [], [], "", 0.0, [], [], None, None, None, "hot", 0.5,
                             0.0, 0.0, 0, False, [], "", {}, {"e": b"abc"}]),  # embedding length % 4
    b"\x01" + msgpack.packb([1, "i", "c", [], [], "", 0.0, [], [], None, None, None, "hot", 0.5,
                             0.0, 0.0, 0, False, [], "", {}, []]),  # embeddings not a map
])
def test_malformed_records_raise_corrupt(data):
    with pytest.raises(CorruptFileError):
        codec.decode_node(data)


def test_decompression_bomb_is_capped(monkeypatch):
    monkeypatch.setattr(codec, "MAX_RECORD_BYTES", 1024)
    bomb = bytes((codec.CODEC_ZSTD,)) + codec._compressor.compress(msgpack.packb([1, "x" * 100_000]))
    with pytest.raises(CorruptFileError):
        codec.decode_node(bomb)


def test_unpack_caps_and_maps_errors():
    with pytest.raises(CorruptFileError):
        codec.unpack(b"\x92\x01")  # truncated array
    with pytest.raises(CorruptFileError):
        codec.unpack(msgpack.packb(1) + b"extra")
    with pytest.raises(CorruptFileError):
        codec.unpack(msgpack.packb({1: "int key"}))


def test_pack_refuses_unencodable_values():
    with pytest.raises(ValidationError):
        codec.pack({"x": object()})
    with pytest.raises(ValidationError):
        codec.pack(2**70)


@given(st.integers(0, 2**64 - 1))
def test_u64_round_trip_and_order(n):
    assert codec.from_u64(codec.u64(n)) == n
    if n:
        assert codec.u64(n - 1) < codec.u64(n)


def test_from_u64_wrong_length():
    with pytest.raises(CorruptFileError):
        codec.from_u64(b"\x00" * 7)


@settings(max_examples=60, deadline=None)
@given(content=st.text(max_size=3000), tags=st.lists(st.text(max_size=8), max_size=4),
       tier=st.sampled_from(["hot", "warm", "cold", "archive"]), count=st.integers(0, 10**6),
       last=st.floats(0, 4e9, allow_nan=False), emb=st.lists(st.floats(-1, 1, width=32), min_size=1, max_size=8),
       which=st.sets(st.sampled_from(["tier", "tags", "access_count", "last_accessed", "pinned", "importance"])))
def test_patch_node_gives_the_bytes_of_encode_after_replace(content, tags, tier, count, last, emb, which):
    from engramdb.records import Node

    node = Node(id="x", content=content, tags=("a",), embeddings={"e": tuple(emb)}, metadata={"k": [1, "v"]})
    values = {"tier": tier, "tags": tags, "access_count": count, "last_accessed": last, "pinned": True,
              "importance": 0.25}
    changes = {k: values[k] for k in which}
    raw = codec.encode_node(node)
    assert codec.patch_node(raw, changes) == codec.encode_node(node.replace(**changes))


def test_patch_node_refuses_indexed_fields_and_bad_values():
    from engramdb.records import Node

    raw = codec.encode_node(Node(id="x", content="text"))
    with pytest.raises(ValidationError):
        codec.patch_node(raw, {"content": "other"})
    with pytest.raises(ValidationError):
        codec.patch_node(raw, {"tier": "lukewarm"})
    with pytest.raises(CorruptFileError):
        codec.patch_node(b"\x07junk", {"tier": "hot"})


# --- schema 3: the fields at their default are left out ------------------------------

_LEGACY_DEFAULTS = ["", [], [], "", 0.0, [], [], None, None, None, "hot", 0.5]


def _legacy(schema: int, node: Node, vectors) -> bytes:
    """The schema-1/2 record engramdb wrote before schema 3 (every field, in order)."""
    fields = [schema, node.id, node.content, list(node.entities), list(node.topics), node.quote, node.weight,
              list(node.flags), list(node.emotions), node.source_start, node.source_end, node.resolved_date, node.tier,
              node.importance, node.created_at, node.last_accessed, node.access_count, node.pinned, list(node.tags),
              node.source, dict(node.metadata), vectors]
    return bytes([codec.CODEC_MSGPACK]) + msgpack.packb(fields, use_bin_type=True)


@st.composite
def sparse_nodes(draw) -> Node:
    """Nodes whose fields are mostly at their defaults, or at values equal to a default in
    Python but not the same (-0.0 for 0.0, last_accessed == created_at or not)."""
    full = draw(nodes())
    keep = draw(st.sets(st.sampled_from(sorted(set(Node.__dataclass_fields__) - {"id"}))))
    node = Node(id=full.id, **{name: getattr(full, name) for name in keep})
    tweak = draw(st.sampled_from(["none", "neg-zero-weight", "neg-zero-created", "same-times"]))
    if tweak == "neg-zero-weight":
        node = node.replace(weight=-0.0)
    elif tweak == "neg-zero-created":
        node = node.replace(created_at=-0.0, last_accessed=0.0)
    elif tweak == "same-times":
        node = node.replace(last_accessed=node.created_at)
    return node


@settings(max_examples=200, deadline=None)
@given(sparse_nodes())
def test_compact_records_round_trip_bit_for_bit(node):
    data = codec.encode_node(node)
    got = codec.decode_node(data, fetch=lambda names: {n: node.embeddings[n] for n in names})
    assert got == node
    for name in ("weight", "created_at", "last_accessed", "importance"):  # the sign of a zero too
        assert repr(getattr(got, name)) == repr(getattr(node, name))
    assert codec.encode_node(got) == data
    # a record of the older schemas (what files written before hold) is the same memory
    old = _legacy(2, node, sorted(node.embeddings)) if node.embeddings else _legacy(1, node, {})
    assert codec.decode_node(old, fetch=lambda names: {n: node.embeddings[n] for n in names}) == node
    assert codec.record_fields(old) == codec.record_fields(data)
    assert codec.encode_node(codec.decode_node(old)) == data  # rewritten, it becomes schema 3


def test_the_usual_memory_record_is_small():
    """A memory added with a text and one vector: its id, time, text and space only
    (schema 2 took 75 bytes for this one)."""
    node = Node.from_fields({"id": "v12345", "content": "v12345", "embeddings": {"s": np.ones(4, np.float32)},
                             "created_at": 1.7e9, "last_accessed": 1.7e9})
    data = codec.encode_node(node)
    assert len(data) == 30
    assert msgpack.unpackb(data[1:])[:2] == [codec.NODE_SCHEMA_COMPACT, 0b11]  # content and spaces present


def test_patch_node_of_an_older_record_writes_schema_3():
    node = Node(id="x", content="text", embeddings={"s": (1.0, 2.0)}, created_at=5.0, last_accessed=5.0)
    old = _legacy(2, node, ["s"])
    assert codec.patch_node(old, {"access_count": 3}) == codec.encode_node(node.replace(access_count=3))
    first_layout = _legacy(1, node, {"s": np.asarray([1.0, 2.0], "<f4").tobytes()})
    patched = codec.patch_node(first_layout, {"access_count": 3})  # its vectors stay in the record
    assert msgpack.unpackb(patched[1:])[0] == codec.NODE_SCHEMA
    assert codec.decode_node(patched).embeddings["s"].tolist() == [1.0, 2.0]


@pytest.mark.parametrize("fields", [
    [3],  # no mask
    [3, 1, "id"],  # no created_at
    [3, 0b1, "id", 1.0],  # a bit set, no value
    [3, 0, "id", 1.0, "extra"],  # a value without its bit
    [3, 1 << 19, "id", 1.0, "x"],  # a bit past the last field
    [3, -1, "id", 1.0],
    [3, "1", "id", 1.0],
    [3, 0b10, "id", 1.0, []],  # spaces present but empty
    [3, 0b10, "id", 1.0, ["b", "a"]],  # spaces not sorted
    [3, 0b10, "id", 1.0, {"s": b"1234"}],  # spaces of the wrong type
    [3, 0, 5, 1.0],  # an id that is not a string
    [3, 0b1, "id", 1.0, 7],  # content that is not a string
])
def test_malformed_compact_records_are_corrupt(fields):
    with pytest.raises(CorruptFileError):
        codec.decode_node(bytes([codec.CODEC_MSGPACK]) + msgpack.packb(fields, use_bin_type=True))


def test_a_lone_surrogate_is_named_with_a_hint_that_says_how_to_repair_it(tmp_path):
    """`db.add` / `db.ingest` of text holding a lone surrogate (a string cut between the
    two halves of a UTF-16 pair) was refused with msgpack's "surrogates not allowed" and
    the generic hint "help(engramdb.Node) for fields", which says nothing of what to do."""
    import engramdb

    with engramdb.open(tmp_path / "s.engram", encrypted=False) as db:
        calls = [lambda: db.add("hello \ud83d world"),
                 lambda: db.ingest("A first sentence here. Then \ud800 a second one, long enough to keep.")]
        for call in calls:
            with pytest.raises(ValidationError) as err:
                call()
            assert "lone surrogate" in str(err.value)
            assert "encode('utf-8', 'replace')" in err.value.hint
        assert len(db) == 0  # nothing half-stored
    with pytest.raises(ValidationError, match="lone surrogate '\\\\udc80' at position 2"):
        codec.pack({"t": "ab\udc80"})


def test_a_record_too_large_to_read_back_is_refused_when_written(make_db):
    # A 72 MiB quote (or metadata, or tags) was stored, and every read of it raised
    # CorruptFileError ("declares a size beyond the cap"): the memory was lost and the store
    # no longer dumped or verified. Now the write is refused and nothing is stored.
    db = make_db()
    with pytest.raises(ValidationError, match="too large"):
        db.add(Node(id="big", content="x", quote="a b " * (18 * 1024 * 1024)))
    with pytest.raises(ValidationError, match="too large"):
        db.add_many([{"id": "ok", "content": "fine"}, {"id": "big", "metadata": {"k": "a b " * (18 * 1024 * 1024)}}])
    assert len(db) == 0


def test_the_largest_content_reads_back():
    # 16 Mi characters of 4 UTF-8 bytes each fill the record cap with the content alone;
    # with its id and fields the record was past the cap and did not decode.
    node = Node(id="n" * 300, content="\U0001F600" * (16 * 1024 * 1024), created_at=1.0, last_accessed=1.0)
    assert codec.decode_node(codec.encode_node(node)).content == node.content


def test_a_record_of_many_small_items_reads_back():
    # a list of 9 million zeros is 9 MB of msgpack, within the byte cap, but the element
    # cap (bytes / 8) refused it: the memory that held it could not be read
    body = msgpack.packb([0] * 9_000_000, use_bin_type=True)
    assert len(codec.unpack(body)) == 9_000_000
    entries = 4_500_000  # a map header past the old cap (bytes / 16); repeated keys keep it cheap
    assert codec.unpack(b"\xdf" + entries.to_bytes(4, "big") + b"\xa1a\x00" * entries) == {"a": 0}
