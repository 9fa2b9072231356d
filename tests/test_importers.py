"""Importers: AAAK v1/v2, Trace-Lite JSONL and Terronex .engram v1 (fixtures built here), and JSONL export."""
from __future__ import annotations

import hashlib
import io
import json
import os
import pathlib
import struct

import msgpack
import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engramdb.aaak import encode
from engramdb.errors import ImportFormatError, ModeMismatchError, WrongPassphraseError
from engramdb.importers import detect_format, export_jsonl, iter_aaak, iter_import, iter_jsonl, iter_terronex
from engramdb.records import ALL_EMOTIONS, ALL_FLAGS, TIERS, CompressResult, Edge, Node, Zettel

GOLDEN = pathlib.Path(__file__).parent / "golden"
NOW = 1_700_000_000.0


# --- a Terronex v1 writer, written from the layout in ref/anchors.md, independent of the reader ---

def terronex_file(nodes, links=(), entities=(), *, passphrase=None, kdf="pbkdf2", major=1) -> bytes:
    payload = msgpack.packb({"nodes": list(nodes), "entities": list(entities), "links": list(links), "deltas": []},
                            use_bin_type=True)
    security = {"encrypted": False, "algorithm": "none", "kdf": "none"}
    if passphrase is not None:
        salt, nonce = os.urandom(32), os.urandom(12)
        if kdf == "argon2id":
            from argon2.low_level import Type, hash_secret_raw
            key = hash_secret_raw(passphrase.encode(), salt, time_cost=3, memory_cost=65536, parallelism=1,
                                  hash_len=32, type=Type.ID)
        else:
            key = hashlib.pbkdf2_hmac("sha256", passphrase.encode(), salt, 100_000, 32)
        payload = AESGCM(key).encrypt(nonce, payload, None)  # ciphertext || 16-byte tag
        security = {"encrypted": True, "algorithm": "aes-256-gcm", "kdf": kdf, "salt": salt, "nonce": nonce}
    security["integrity"] = hashlib.sha256(payload).digest()
    header = {
        "version": [major, 0], "created": 1_780_000_000_000, "modified": 1_780_000_000_500,
        "security": security, "metadata": {"source": "test", "tags": ["t"]},
        "schema": {"embeddingModel": "all-MiniLM-L6-v2", "embeddingDims": 3, "chunkStrategy": "paragraph",
                   "modalities": ["text"]},
        "stats": {"totalChunks": len(nodes), "totalTokens": 0, "rootNodes": 1, "maxDepth": 1, "entityCount": 0,
                  "linkCount": len(links)},
    }
    hb = msgpack.packb(header, use_bin_type=True)
    return b"ENGRAM" + bytes([major, 0]) + struct.pack("<I", len(hb)) + hb + payload


def tx_node(nid, text, *, embedding=None, parent=None, tier="warm", tags=("a",), score=0.8):
    node = {
        "id": nid, "parentId": parent, "children": [], "depth": 1 if parent else 0, "path": f"/{nid}",
        "content": {"type": "text", "data": text, "tokens": 3},
        "temporal": {"created": 1_780_000_000_123, "modified": 1_780_000_001_000, "accessed": 1_780_000_002_000,
                     "decayTier": tier},
        "quality": {"score": score, "confidence": 0.9, "source": "direct"},
        "metadata": {"tags": list(tags), "sourceFile": "notes.md", "sourceLine": 7, "custom": {"k": 1}},
    }
    if embedding is not None:
        node["embedding"] = embedding
        node["embeddingModel"] = "all-MiniLM-L6-v2"
    return node


VEC = np.array([0.25, -1.5, 3.0], dtype="<f4")
TX_NODES = [
    tx_node("root", "Project root", embedding=VEC.tobytes()),  # msgpackr default: Float32Array -> bin
    tx_node("c1", "We decided | to \"rotate\" keys\nhourly", parent="root", embedding=[0.25, -1.5, 3.0]),
    tx_node("c2", "Typed array ext", parent="root", tier="cold",
            embedding=msgpack.ExtType(0x74, bytes([7]) + VEC.tobytes())),
    dict(tx_node("img", ""), content={"type": "image", "data": b"\x89PNG", "mimeType": "image/png"}),
]
TX_LINKS = [
    {"id": "l1", "sourceId": "c1", "targetId": "c2", "type": "contradicts", "confidence": 0.7,
     "bidirectional": False, "created": 1_780_000_003_000, "createdBy": "agent"},
    {"id": "l2", "sourceId": "c2", "targetId": "c1", "type": "follows", "confidence": 1.0,
     "bidirectional": False, "created": 1_780_000_004_000, "createdBy": "user"},
    {"id": "l3", "sourceId": "root", "targetId": "img", "type": "causes", "confidence": 0.5,
     "bidirectional": True, "created": 1_780_000_005_000, "createdBy": "system"},
]
TX_ENTITIES = [{"id": "e1", "type": "person", "name": "Alice", "properties": {}, "relationships": [],
                "mentions": [{"nodeId": "c1", "span": [0, 5], "confidence": 1.0}]}]


def test_terronex_plain_file():
    data = terronex_file(TX_NODES, TX_LINKS, TX_ENTITIES)
    items = list(iter_terronex(io.BytesIO(data), space="minilm"))
    nodes = [x for x in items if isinstance(x, Node)]
    edges = [x for x in items if isinstance(x, Edge)]
    assert [n.id for n in nodes] == ["root", "c1", "c2", "img"]
    root, c1, c2, img = nodes
    for n in (root, c1, c2):
        assert n.embeddings["minilm"].tolist() == [0.25, -1.5, 3.0]
    assert c1.content == "We decided | to \"rotate\" keys\nhourly"
    assert c1.entities == ("Alice",)
    assert (c1.tier, c2.tier, c1.importance, c1.tags, c1.source) == ("warm", "cold", 0.8, ("a",), "notes.md")
    assert c1.created_at == 1_780_000_000.123 and c1.last_accessed == 1_780_000_002.0
    assert c1.metadata["custom"] == {"k": 1}
    assert c1.metadata["terronex"]["parent_id"] == "root"
    assert img.content == "" and img.metadata["terronex"]["data"] == b"\x89PNG"
    kinds = {(e.src, e.dst, e.kind, e.label) for e in edges}
    assert kinds == {
        ("c1", "root", "part_of", ""), ("c2", "root", "part_of", ""),
        ("c1", "c2", "contradicts", ""), ("c1", "c2", "precedes", ""),
        ("root", "img", "related", "causes"), ("img", "root", "related", "causes"),
    }


def test_terronex_encrypted_pbkdf2_and_argon2id():
    for kdf in ("pbkdf2", "argon2id"):
        data = terronex_file(TX_NODES[:2], passphrase="hunter2 é", kdf=kdf)
        nodes = list(iter_terronex(data, passphrase="hunter2 é"))
        assert [n.id for n in nodes if isinstance(n, Node)] == ["root", "c1"]
        with pytest.raises(WrongPassphraseError):
            list(iter_terronex(data, passphrase="wrong"))
        with pytest.raises(ModeMismatchError):
            list(iter_terronex(data))


def test_terronex_damaged_files_are_refused():
    data = terronex_file(TX_NODES, TX_LINKS)
    flipped = bytearray(data)
    flipped[-3] ^= 0x40
    cases = [bytes(flipped), data[:5], data[:11], data[:40], b"NOTENGRAM" + data[9:],
             terronex_file(TX_NODES, major=3), b"ENGRAM\x01\x00" + struct.pack("<I", 3) + b"\xc1\xc1\xc1",
             terronex_file([{"id": 5}]), terronex_file([tx_node("x", "y", embedding=b"\x00\x01\x02")])]
    for bad in cases:
        with pytest.raises(ImportFormatError):
            list(iter_terronex(bad))


# --- Trace-Lite JSONL ---------------------------------------------------------------

TRACE_LITE = "\n".join([
    json.dumps({"id": "m1", "content": "Alice prefers tea", "embedding": {"0": 0.5, "1": -0.25},
                "tags": ["prefs"], "importance": 0.9, "tier": "hot", "createdAt": "2026-06-12T10:00:00.000Z",
                "lastAccessed": "2026-06-13T10:00:00.500Z", "accessCount": 3, "source": "chat",
                "metadata": {"speaker": "Alice", "n": [1, 2]}}),
    "",
    json.dumps({"id": "m2", "content": "no embedding", "embedding": None, "tags": [], "importance": 0.1,
                "tier": "archive", "createdAt": 1781258400000, "lastAccessed": "2026-06-12T10:00:00",
                "accessCount": 0}),
]) + "\n"


def test_trace_lite_jsonl():
    nodes = list(iter_jsonl(TRACE_LITE, space="minilm", now=NOW))
    m1, m2 = nodes
    assert {k: v.tolist() for k, v in m1.embeddings.items()} == {"minilm": [0.5, -0.25]}
    assert m1.created_at == 1_781_258_400.0 and m1.last_accessed == 1_781_344_800.5
    assert (m1.tags, m1.importance, m1.tier, m1.access_count, m1.source) == (("prefs",), 0.9, "hot", 3, "chat")
    assert m1.metadata == {"speaker": "Alice", "n": [1, 2]}
    assert m2.embeddings == {} and m2.created_at == 1_781_258_400.0 and m2.tier == "archive"
    assert next(iter(iter_jsonl(io.BytesIO(TRACE_LITE.encode()), now=NOW))).id == "m1"


@pytest.mark.parametrize(("line", "message"), [
    ("not json", "line 2"),
    ('{"content": "no id"}', "id"),
    ('{"id": "x", "tier": "lukewarm"}', "tier"),
    ('{"id": "x", "createdAt": "yesterday"}', "ISO 8601"),
    ('{"id": "x", "embedding": [1, "a"]}', "numbers"),
    ("[1, 2]", "object"),
    ('{"id": "x", "engramdb": {"v": 1, "node": {"id": "x"}}, "metadata": {"$bad": 1}}', "tagged"),
])
def test_jsonl_errors_name_the_line(line, message):
    text = TRACE_LITE.splitlines()[0] + "\n" + line + "\n"
    with pytest.raises(ImportFormatError, match=message):
        list(iter_jsonl(text, now=NOW))


@pytest.mark.parametrize(("text", "message"), [
    ('{"now": "2026-06-01", "memories": [{"id": "m1"}]}\n', "one JSON document holding a list of memories"),
    ('{"zettels": [], "tunnels": [], "entityIndex": {}}\n', "zettel-compress compress\\(\\) result"),
    ('{\n  "id": "m1",\n  "content": "x"\n}\n', "one JSON document over many lines"),
    ('[{"id": "m1"}]\n', "JSON array, not JSON Lines"),
])
def test_a_json_document_is_told_from_json_lines(text, message):
    # Trace-Lite's {"now", "memories"} file, a zettel-compress compress() result or a
    # pretty-printed memory was "line 1: a Memory needs a non-empty string id" (or a JSON
    # syntax error): it did not say that the file is one JSON document, or how to convert it
    with pytest.raises(ImportFormatError, match=message) as info:
        list(iter_import(io.BytesIO(text.encode()), now=NOW))
    assert "jq -c" in info.value.hint or "AAAK" in info.value.hint


@pytest.mark.parametrize("as_bytes", [True, False])
def test_jsonl_with_a_utf8_bom_is_read(as_bytes):
    """detect_format looks past a BOM (Notepad, PowerShell write one) and calls it JSONL, but
    the reader then failed on line 1: "Unexpected UTF-8 BOM"."""
    text = "\ufeff" + TRACE_LITE
    source = io.BytesIO(text.encode("utf-8")) if as_bytes else text
    assert detect_format(text.encode("utf-8")) == "jsonl"
    assert [n.id for n in iter_jsonl(source, now=NOW)] == ["m1", "m2"]
    assert [n.id for n in iter_import(io.BytesIO(text.encode("utf-8")), now=NOW)] == ["m1", "m2"]


@pytest.mark.parametrize("head", [b"", b"\n\n", b"\xef\xbb\xbf  \r\n"])
def test_an_empty_source_is_named_as_such(head):
    """An empty file (a failed export, a wrong path to a fresh file) was "unrecognized file
    format (expected AAAK, JSONL memories or a Terronex .engram file)"."""
    with pytest.raises(ImportFormatError, match="empty"):
        detect_format(head)


TEXT = st.text(st.characters(exclude_categories=()), max_size=20)
META = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False,
                    allow_infinity=False) | TEXT | st.binary(max_size=6),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                    max_leaves=8)


@st.composite
def export_nodes(draw):
    ids = sorted(draw(st.sets(TEXT.filter(bool), max_size=4)))
    out = []
    for nid in ids:
        out.append(Node(
            id=nid, content=draw(TEXT), entities=draw(st.lists(TEXT, max_size=2)), topics=draw(st.lists(TEXT, max_size=2)),
            quote=draw(TEXT), weight=draw(st.floats(allow_nan=False, allow_infinity=False)),
            flags=draw(st.lists(st.sampled_from(ALL_FLAGS), max_size=2)),
            emotions=draw(st.lists(st.sampled_from(ALL_EMOTIONS), max_size=2)),
            source_start=draw(st.none() | st.integers(0, 99)), resolved_date=draw(st.none() | TEXT),
            tier=draw(st.sampled_from(TIERS)), importance=draw(st.floats(0, 1)),
            created_at=draw(st.floats(allow_nan=False, allow_infinity=False)),
            last_accessed=draw(st.floats(-1e10, 1e10)), access_count=draw(st.integers(0, 10**6)),
            pinned=draw(st.booleans()), source=draw(TEXT),
            # not blank: the import leaves those out (test_write_checks)
            tags=draw(st.lists(TEXT.filter(str.strip), max_size=2)),
            metadata=draw(st.dictionaries(st.sampled_from(["$x", "$bytes", "k"]) | TEXT, META, max_size=3)),
            embeddings=draw(st.dictionaries(st.sampled_from(["a", "b"]),
                                            st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False),
                                                     min_size=2, max_size=2), max_size=2)),
        ))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(export_nodes())
def test_export_jsonl_round_trips_exactly(nodes):
    buf = io.StringIO()
    assert export_jsonl(nodes, buf) == len(nodes)
    back = list(iter_jsonl(buf.getvalue(), now=NOW))
    assert back == nodes
    for line in buf.getvalue().splitlines():
        obj = json.loads(line)  # plain JSON a Trace-Lite app can read
        assert {"id", "content", "embedding", "tags", "importance", "tier", "createdAt", "lastAccessed",
                "accessCount", "source", "metadata"} <= set(obj)


def test_export_jsonl_is_trace_lite_shaped():
    node = Node("n1", content="hi", tags=["t"], importance=0.7, tier="warm", created_at=1_781_258_400.25,
                last_accessed=1_781_258_401.0, access_count=2, embeddings={"minilm": [0.5, 1.0]})
    buf = io.BytesIO()
    export_jsonl([node], buf)
    obj = json.loads(buf.getvalue())
    assert obj["createdAt"] == "2026-06-12T10:00:00.250Z"
    assert obj["embedding"] == [0.5, 1.0]
    assert (obj["tier"], obj["accessCount"], obj["importance"]) == ("warm", 2, 0.7)
    foreign = {k: v for k, v in obj.items() if k != "engramdb"}  # as a Trace-Lite app would write it back
    again = next(iter(iter_jsonl(json.dumps(foreign), space="minilm", now=NOW)))
    assert (again.content, again.created_at) == ("hi", 1_781_258_400.25)
    assert again.embeddings["minilm"].tobytes() == node.embeddings["minilm"].tobytes()


# --- AAAK v1/v2 ------------------------------------------------------------------


def test_aaak_v2_import():
    items = list(iter_aaak((GOLDEN / "zettel_v2.aaak").read_bytes(), now=NOW, id_prefix="s1/"))
    nodes = [x for x in items if isinstance(x, Node)]
    edges = [x for x in items if isinstance(x, Edge)]
    assert [n.id for n in nodes] == ["s1/001", "s1/002"]
    n2 = nodes[1]
    assert n2.entities == ("Alice", "Jean;Luc = Picard")
    assert n2.content == n2.quote == 'She said "rotate hourly"\nthen left | for lunch \\ ok'
    assert (n2.source_start, n2.source_end, n2.created_at, n2.source) == (120, 480, NOW, "import:aaak")
    assert n2.metadata == {"aaak": {"date": "2026-06-12", "title": "Auth Design"}}
    assert edges == [Edge("s1/001", "s1/002", "tunnel", label="ALC+BOB", created_at=NOW)]


def test_aaak_v1_import_and_source_passages():
    nodes = [x for x in iter_aaak(io.StringIO((GOLDEN / "zettel_v1.aaak").read_text()), now=NOW)
             if isinstance(x, Node)]
    assert [n.topics for n in nodes] == [("authentication", "security"), ("security", "deployment")]
    source = "Alpha beta. Gamma delta epsilon."
    result = CompressResult(zettels=[Zettel("001", quote="Gamma", source_start=12, source_end=32)],
                            meta={"source": source})
    node = next(iter_aaak(encode(result), now=NOW))
    assert node.content == "Gamma delta epsilon."


def test_aaak_import_refuses_bad_input():
    with pytest.raises(ImportFormatError):
        list(iter_aaak("FILE:||||v3|dump\n@end 0 " + "0" * 64 + "\n"))
    with pytest.raises(ImportFormatError):
        list(iter_aaak('001:A|t|"q"|inf||\n'.replace("001", "001"), strict=True))
    bad_weight = encode(CompressResult(zettels=[Zettel("1", weight=float("inf"))]))
    with pytest.raises(ImportFormatError, match="weight"):
        list(iter_aaak(bad_weight))


def test_detect_format_and_dispatch():
    tx = terronex_file(TX_NODES[:1])
    assert detect_format(tx[:16]) == "terronex"
    assert detect_format(b"FILE:002|ALC|") == "aaak"
    assert detect_format(b'{"id": "m1"') == "jsonl"
    assert detect_format(b"FILE:||||v3|dump\n") == "aaak-dump"
    assert detect_format(b"AAAK-ENC\x01") == "aaak-encrypted"
    with pytest.raises(ImportFormatError):
        detect_format(b"\x00\x01garbage")
    assert [n.id for n in iter_import(io.BytesIO(tx))] == ["root"]
    assert [n.id for n in iter_import(io.BytesIO(TRACE_LITE.encode()), now=NOW)] == ["m1", "m2"]
    v2 = io.BytesIO((GOLDEN / "zettel_v2.aaak").read_bytes())
    assert sum(isinstance(x, Node) for x in iter_import(v2, now=NOW)) == 2
    with pytest.raises(ImportFormatError, match="dump"):
        iter_import(io.BytesIO(b"FILE:||||v3|dump\n"))


def _with_payload(payload: bytes) -> bytes:
    """A plain Terronex 1.x file whose payload is ``payload`` (integrity hash matching)."""
    header = msgpack.packb({"version": [1, 0], "security": {"encrypted": False, "kdf": "none",
                                                            "integrity": hashlib.sha256(payload).digest()}})
    return b"ENGRAM\x01\x00" + struct.pack("<I", len(header)) + header + payload


@pytest.mark.parametrize("bomb", [
    # issue 16 finding 8: a 50 MB file of empty maps (1 byte each, 64 in Python) took 3.5 GB
    b"\x81\xa5nodes\xdd" + struct.pack(">I", 200_000) + b"\x80" * 200_000,
    b"\x81\xa5nodes\xdd" + struct.pack(">I", 200_000) + b"\x90" * 200_000,  # empty arrays
    b"\x81\xa5nodes\xdd" + struct.pack(">I", 200_000) + b"\xc0" * 200_000,  # more elements than 2 bytes each
    b"\x81\xa5nodes\xdd" + struct.pack(">I", 2**31) + b"\xc0" * 64,  # a length beyond the input
    b"\x81\xa5nodes\xdd" + struct.pack(">I", 70_000) + b"\x81\xa0\x80" * 70_000,  # [{"": {}}, ...]: 2 per 3 bytes
])
def test_terronex_msgpack_bomb_is_refused(bomb):
    with pytest.raises(ImportFormatError, match=r"too large|more than") as info:
        list(iter_terronex(_with_payload(bomb)))
    assert "Limits on hostile input" in info.value.hint


def test_terronex_header_bomb_is_refused():
    header = b"\xdd" + struct.pack(">I", 50_000) + b"\x80" * 50_000
    data = b"ENGRAM\x01\x00" + struct.pack("<I", len(header)) + header
    with pytest.raises(ImportFormatError, match=r"header .*too large") as info:
        list(iter_terronex(data))
    assert "Limits on hostile input" in info.value.hint


def test_terronex_many_honest_nodes_fit_the_limits():
    nodes = [{"id": f"n{i}", "content": "", "embedding": None} for i in range(2_000)]
    assert len([x for x in iter_terronex(terronex_file(nodes)) if isinstance(x, Node)]) == 2_000


@pytest.mark.parametrize("line, hint", [
    ('{"id": "a", "content": "x", "created_at": 1.0, "comment": 5}', "one shape a line"),
    ('{"id": "a", "content": "x", "pinned": true, "archived": true}', "engramdb export"),
])
def test_a_refused_jsonl_line_keeps_the_hint_of_its_check(line, hint):
    """iter_jsonl re-raised a line's ValidationError as an ImportFormatError with only the
    generic hint ("supported sources: ..."), so the hints 6d7900b wrote for an engramdb-shaped
    line (use one shape a line; export archived memories whole) never reached the user."""
    with pytest.raises(ImportFormatError) as info:
        list(iter_jsonl(io.StringIO(line + "\n"), space="s"))
    assert hint in info.value.hint


def test_jsonl_embedding_of_another_length_names_its_line():
    # It failed at insert time: "space 'default' has 3 dims, got a vector of 2", no line named.
    src = ('{"id":"a","content":"a","embedding":[1,2,3]}\n\n'
           '{"id":"b","content":"b","embedding":[1,2]}\n')
    expected = r"line 3: an embedding of 2 values, but space 'default' has 3 dims \(set by line 1\)"
    with pytest.raises(ImportFormatError, match=expected) as info:
        list(iter_jsonl(io.StringIO(src)))
    assert "same length" in info.value.hint and "line 3" in info.value.hint


@pytest.mark.parametrize("field", ['"embedding":[1,2,1%s]', '"createdAt":1%s'])
def test_jsonl_huge_integer_names_its_line_and_says_what_to_do(field):
    # It said "line 1: int too large to convert to float" under the generic "supported sources" hint.
    line = '{"id":"a","content":"a",' + field % ("0" * 400) + "}"
    with pytest.raises(ImportFormatError, match=r"^line 2: a number is too large") as info:
        list(iter_jsonl(io.StringIO('{"id":"z","content":"z"}\n' + line + "\n")))
    assert "1.8e308" in info.value.hint and "supported sources" not in info.value.hint
