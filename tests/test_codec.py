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
