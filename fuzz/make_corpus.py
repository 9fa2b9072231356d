"""Write the seed corpus of fuzz_aaak.py into fuzz/corpus/aaak/ (deterministic).

Seeds: the golden dump and result, the zettel-compress v1/v2 fixtures, and invalid
variants of each (truncated, a flipped byte, a deleted / duplicated / swapped line,
a bad trailer), each prefixed with the target byte that fuzz_aaak.py dispatches on.

It also writes fuzz/corpus/{importers,records,header}/ for fuzz_importers.py,
fuzz_records.py and fuzz_header.py: files from the real writers (export_jsonl, the AAAK
golden files, Terronex files built as tests/test_importers.py does, encode_node and
Sealer envelopes under the targets' test key, headers of stores made by engramdb.open
with os.urandom seeded) and invalid variants, hostile lengths, deep nesting and hostile
KDF parameters.

    python fuzz/make_corpus.py
"""
from __future__ import annotations

import hashlib
import pathlib
import struct

ROOT = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
OUT = ROOT / "fuzz" / "corpus" / "aaak"


def variants(data: bytes) -> list[bytes]:
    lines = data.splitlines(keepends=True)
    out = [data, data[: len(data) // 2], data[:-1]]
    flipped = bytearray(data)
    flipped[len(data) // 3] ^= 0x20
    out.append(bytes(flipped))
    if len(lines) > 3:
        out.append(b"".join(lines[:2] + lines[3:]))  # deleted line
        out.append(b"".join(lines[:3] + lines[2:]))  # duplicated line
        out.append(b"".join(lines[:1] + [lines[2], lines[1]] + lines[3:]))  # swapped lines
    return out


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    seeds: list[bytes] = []
    for name, modes in (("small.aaak", (2, 3)), ("small_result.aaak", (0, 1)), ("zettel_v2.aaak", (0, 1)),
                        ("zettel_v1.aaak", (0, 1))):
        for variant in variants((GOLDEN / name).read_bytes()):
            seeds.extend(bytes([mode]) + variant for mode in modes)
    seeds.append(b"\x03FILE:||||v3|dump\n@end 0 " + hashlib.sha256(b"FILE:||||v3|dump\n").hexdigest().encode() + b"\n")
    seeds.append(b"\x02FILE:||||v3|dump\n@set k|{\"a\":[1,2.5,{\"$bytes\":\"AA==\"}]}\n@end 1 " + b"0" * 64 + b"\n")
    seeds.append(b"\x00FILE:001||||v3\n\\u0045:\\~+=A|\\~|\"q\\\"\"|1e-300|||-5-|\n@end 1 " + b"0" * 64 + b"\n")
    for seed in seeds:
        (OUT / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
    print(f"{len(seeds)} seeds in {OUT}")




# --- importers, records, header (fuzz_importers.py, fuzz_records.py, fuzz_header.py) ------------------


def _write_seeds(name: str, seeds: list[bytes]) -> None:
    out = ROOT / "fuzz" / "corpus" / name
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():  # regenerate from scratch: a seed whose recipe changed must not linger
        old.unlink()
    for seed in seeds:
        (out / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
    print(f"{len(set(seeds))} seeds in {out}")


def _load_target(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "fuzz" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _seed_nodes() -> list:
    """A few nodes that cover every field kind (embeddings, metadata bytes, offsets, flags)."""
    from engramdb.records import Node

    return [
        Node("n1", content="Alice leads Project Atlas.", entities=["Alice"], topics=["atlas"], quote="Alice leads",
             weight=0.75, flags=["DECISION"], emotions=["trust"], source_start=0, source_end=11,
             resolved_date="2026-01-01", tier="warm", importance=0.25, created_at=1_767_225_600.0,
             last_accessed=1_767_225_601.5, access_count=3, pinned=True, tags=["people"], source="notes.md",
             metadata={"n": 1, "f": 0.1, "raw": b"\x00\xff", "list": [None, True], "big": 2**64 - 1},
             embeddings={"hashed": [0.5, -0.25, 1e-30], "user": [1.0]}),
        Node("n2", content="tea \u00e9\u4e2d\U0001f600 | \"quoted\"\n", tags=["a", "b"]),
        Node("n3", content="long " * 600, importance=1.0, created_at=-1.5),  # > 2048 bytes: zstd record
    ]


def _tx_file(nodes, links=(), entities=(), *, passphrase=None, kdf="pbkdf2", major=1, minor=0,
             cheap=None, integrity=True, header_extra=None) -> bytes:
    """A Terronex .engram 1.x/2.x file, built as tests/test_importers.py::terronex_file does."""
    import msgpack
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    payload = msgpack.packb({"nodes": nodes, "entities": entities, "links": links, "deltas": []},
                            use_bin_type=True)
    security = {"encrypted": False, "algorithm": "none", "kdf": "none"}
    if passphrase is not None:
        salt, nonce = bytes(range(32)), bytes(range(12))
        if kdf == "argon2id":
            from argon2.low_level import Type, hash_secret_raw

            key = hash_secret_raw(passphrase.encode(), salt, hash_len=32, type=Type.ID, **cheap.CHEAP_ARGON2)
        else:
            key = hashlib.pbkdf2_hmac("sha256", passphrase.encode(), salt, cheap.CHEAP_PBKDF2_ITERATIONS, 32)
        payload = AESGCM(key).encrypt(nonce, payload, None)
        security = {"encrypted": True, "algorithm": "aes-256-gcm", "kdf": kdf, "salt": salt, "nonce": nonce}
    if integrity:
        security["integrity"] = hashlib.sha256(payload).digest()
    header = {"version": [major, minor], "created": 1_780_000_000_000, "security": security,
              "metadata": {"source": "fuzz"}, "schema": {"embeddingDims": 3}, **(header_extra or {})}
    hb = msgpack.packb(header, use_bin_type=True)
    return b"ENGRAM" + bytes([major, minor]) + struct.pack("<I", len(hb)) + hb + payload


def _tx_node(nid, text, *, embedding=None, parent=None, tier="warm"):
    node = {"id": nid, "parentId": parent, "children": [], "depth": 1 if parent else 0, "path": f"/{nid}",
            "content": {"type": "text", "data": text, "tokens": 3},
            "temporal": {"created": 1_780_000_000_123, "accessed": 1_780_000_002_000, "decayTier": tier},
            "quality": {"score": 0.8, "confidence": 0.9},
            "metadata": {"tags": ["t"], "sourceFile": "notes.md", "custom": {"k": 1}}}
    if embedding is not None:
        node["embedding"] = embedding
    return node


def importer_seeds() -> list[bytes]:
    import io

    import msgpack

    from engramdb.importers import export_jsonl

    target = _load_target("fuzz_importers")
    seeds: list[bytes] = []
    # AAAK v1/v2/v3 result documents: detected (0) and forced (3)
    for name in ("zettel_v1.aaak", "zettel_v2.aaak", "small_result.aaak"):
        for variant in variants((GOLDEN / name).read_bytes()):
            seeds.extend(bytes([mode]) + variant for mode in (0, 3))
    seeds.append(b"\x00" + (GOLDEN / "small.aaak").read_bytes()[:400])  # a dump: refused, restore it instead
    # JSONL: lines written by export_jsonl (exact restore) and plain Trace-Lite Memory lines
    buf = io.StringIO()
    export_jsonl(_seed_nodes(), buf)
    exported = buf.getvalue().encode()
    trace_lite = (
        b'{"id":"m1","content":"hello","embedding":[0.1,0.2,0.3],"tags":["x"],"importance":0.9,"tier":"WARM",'
        b'"createdAt":"2026-01-01T00:00:00Z","lastAccessed":"2026-01-02T00:00:00+02:00","accessCount":2,'
        b'"source":"chat","metadata":{"k":[1,2]}}\n'
        b'{"id":7,"content":"ms times","embedding":{"0":1.5,"1":-2},"createdAt":1767225600000}\n\n'
    )
    for doc in (exported, trace_lite):
        for variant in variants(doc):
            seeds.extend(bytes([mode]) + variant for mode in (0, 2))
    seeds += [b"\x02" + line for line in (
        b'[' * 5000 + b']' * 5000,  # deep nesting
        b'{"id":"x","importance":' + b"9" * 400 + b"}",  # an integer beyond float range
        b'{"id":"x","content":"\\ud800"}',  # a lone surrogate
        b'{"id":"x","embedding":{"0":1,"2":2}}',  # a gap in a Float32Array object
        b'{"id":"x","engramdb":{"v":1,"node":{"id":"y","bogus":1}}}',
        b'{"id":"x","engramdb":{"v":1,"node":{"id":"y","embeddings":{"s":[1e39]}}}}',
        b'{"id":"x","metadata":{"$bytes":"!!"},"engramdb":{}}',
        b"\xff\xfe{}",
    )]
    # Terronex: plain, encrypted (PBKDF2 and argon2id, cheap costs), every embedding encoding and link type
    emb_f32 = struct.pack("<3f", 0.1, 0.2, 0.3)
    nodes = [
        _tx_node("root", "Root text", embedding=emb_f32),
        _tx_node("c1", "Child one", embedding=[0.5, 0.25, 1], parent="root", tier="cold"),
        _tx_node("c2", "Child two", embedding={"0": 1.0, "1": 2.0, "2": 3.0}, parent="root"),
        _tx_node("c3", "typed array", embedding=msgpack.ExtType(0x74, b"\x07" + emb_f32)),
        {"id": "bin", "content": {"type": "image", "data": b"\x89PNG"}, "temporal": {"created": 5}},
    ]
    links = [{"sourceId": "c1", "targetId": "c2", "type": kind, "confidence": 0.5, "created": 1_780_000_000_000,
              "bidirectional": kind == "related"}
             for kind in ("related", "contradicts", "elaborates", "follows", "causes", "custom-kind")]
    entities = [{"name": "Alice", "type": "person", "mentions": [{"nodeId": "c1"}, {"nodeId": "c2"}]}]
    plain = _tx_file(nodes, links, entities)
    # Without the optional integrity hash a mutated payload still reaches the node and link readers.
    for unhashed in (_tx_file(nodes, links, entities, integrity=False), _tx_file(nodes[3:4], integrity=False),
                     _tx_file(nodes[:2], links[3:4], entities, integrity=False)):
        seeds.extend(bytes([mode]) + unhashed for mode in (0, 1))
    for variant in (plain, plain[:len(plain) // 2], plain[:-1], plain[:12], plain[:20]):
        seeds.extend(bytes([mode]) + variant for mode in (0, 1))
    flipped = bytearray(plain)
    flipped[-5] ^= 0x01
    seeds.append(b"\x00" + bytes(flipped))  # integrity mismatch
    seeds.append(b"\x00" + plain[:8] + b"\xff\xff\xff\xff" + plain[12:])  # header length beyond the end
    seeds.append(b"\x00" + _tx_file(nodes[:1], major=2))
    seeds.append(b"\x01" + _tx_file(nodes[:2], links[:1], entities, passphrase=target.PASSPHRASE, cheap=target))
    seeds.append(b"\x01" + _tx_file(nodes[:2], links[:1], passphrase=target.PASSPHRASE, kdf="argon2id",
                                     cheap=target))
    seeds.append(b"\x00" + _tx_file(nodes[:1], passphrase=target.PASSPHRASE, cheap=target))  # no passphrase
    seeds.append(b"\x00" + _tx_file([{"id": "x", "content": {"data": [[[[[[1]]]]]]}}],
                                     [{"sourceId": "a", "targetId": "b", "type": ["list"]}]))
    # Terronex format 2.x: the header's embedding config, node position/confidence, the 2.x link
    # types, minor versions, encryption, and embeddings that must be reported (wrong dimensions,
    # NaN, float32 bytes msgpackr damaged); mode 1 imports them with skip_bad_embeddings=True
    v2_header = {"embedding": {"model": "m", "dimensions": 3, "provider": "local"}}
    v2_nodes = [dict(nodes[1], position={"x": 1.5, "y": -2, "z": 0.5, "pinned": True}, confidence=0.85),
                dict(nodes[2], confidence=1)]
    v2_links = [dict(links[0], type=kind) for kind in ("supports", "derived_from", "similar_to")]
    for minor in (0, 1):
        v2 = _tx_file(v2_nodes, v2_links, entities, major=2, minor=minor, header_extra=v2_header)
        seeds.extend(bytes([mode]) + v2 for mode in (0, 1))
    seeds.append(b"\x01" + _tx_file(v2_nodes, v2_links, major=2, header_extra=v2_header,
                                     passphrase=target.PASSPHRASE, cheap=target))
    seeds.append(b"\x01" + _tx_file(v2_nodes, v2_links, major=2, header_extra=v2_header,
                                     passphrase=target.PASSPHRASE, kdf="argon2id", cheap=target))
    bad = [_tx_node("dims", "x", embedding=[1.0, 2.0]), _tx_node("nan", "x", embedding=[float("nan"), 1.0, 0.0]),
           _tx_node("damaged", "x", embedding=struct.pack("<3f", 1e-44, 7e31, 0.0)),
           _tx_node("zero", "x", embedding=bytes(12)), _tx_node("ext", "x", embedding=msgpack.ExtType(0x74, b"\x09"))]
    for mode in (0, 1):
        seeds.append(bytes([mode]) + _tx_file(bad, major=2, header_extra=v2_header))
        seeds.append(bytes([mode]) + _tx_file(bad[:3], major=2, header_extra={"embedding": {"dimensions": 2.0}}))
    for name in ("v2_plain.engram", "v2_bad_embeddings.engram"):
        seeds.append(b"\x00" + (ROOT / "tests" / "fixtures" / "terronex" / name).read_bytes())
    seeds.append(b"\x00" + _tx_file(nodes[:1], major=3))  # an unknown major version
    # the findings of tests/test_fuzz_regressions.py, so the fuzzer keeps exercising them
    seeds.append(b"\x00" + _tx_file(nodes[:1], 5, 5))
    seeds.append(b"\x00" + _tx_file(nodes[:1], [], [{"name": "A", "mentions": 5}]))
    short_salt = {"encrypted": True, "kdf": "argon2id", "salt": b"abc", "nonce": bytes(12), "integrity": b""}
    header = msgpack.packb({"version": [1, 0], "security": short_salt}, use_bin_type=True)
    seeds.append(b"\x01ENGRAM\x01\x00" + struct.pack("<I", len(header)) + header + bytes(32))
    return seeds


def record_seeds() -> list[bytes]:
    from engramdb import codec

    target = _load_target("fuzz_records")
    records = [codec.encode_node(node) for node in _seed_nodes()]
    # records of the schemas written before schema 3 (every field, in order), still read
    legacy = ["old", "text", [], [], "", 0.0, [], [], None, None, None, "hot", 0.5, 1.0, 1.0, 0, False, [], "", {}]
    records += [bytes([codec.CODEC_MSGPACK]) + codec.pack([1, *legacy, {}]),
                bytes([codec.CODEC_MSGPACK]) + codec.pack([2, *legacy, ["s"]]),
                bytes([codec.CODEC_MSGPACK]) + codec.pack([1, *legacy, {"s": b"\x00\x00\x80?"}])]
    seeds: list[bytes] = []
    for record in records:
        seeds.append(b"\x00" + record)
        seeds.append(b"\x00" + record[: len(record) // 2])
        flipped = bytearray(record)
        flipped[len(record) // 3] ^= 0x01
        seeds.append(b"\x00" + bytes(flipped))
    seeds += [b"\x00" + bad for bad in (
        b"", b"\x03" + records[0][1:],  # unknown codec
        b"\x01\x92\x02\xa1x",  # unknown schema
        b"\x01\x91\x01",  # too few fields
        b"\x02" + b"\x28\xb5\x2f\xfd\xa0" + struct.pack("<I", 60_000_000) + b"\x01\x00\x00",  # a zstd bomb header
        b"\x02" + b"\x28\xb5\x2f\xfd\xe0" + struct.pack("<Q", 2**62) + b"\x01\x00\x00",  # finding: MemoryError
        b"\x01" + b"\x91" * 2000 + b"\x90",  # deep nesting
        b"\x01\xdd\xff\xff\xff\xff",  # an array claiming 4 billion items
        b"\x01\xdc\x00\x16\x01\xa1x" + b"\xc0" * 20,  # 22 fields, all nil
    )]
    for i, record in enumerate(records[:3]):  # sealed: the first three
        table, key = (b"nodes", b"archive", b"meta")[i], codec.u64(i + 1)
        sealed = target.SEALER._seal_with_nonce(table, key, record, i, bytes(range(i, i + 12)))
        for mode in (1, 3):
            seeds.append(bytes([mode]) + target.join_envelope(table, key, sealed))
        seeds.append(b"\x01" + target.join_envelope(table, key + b"x", sealed))  # moved to another key
        seeds.append(b"\x01" + target.join_envelope(table, key, sealed[:-1]))
        seeds.append(b"\x01" + target.join_envelope(table, key, b"\x02" + sealed[1:]))  # unknown version
        seeds.append(b"\x02" + target.join_envelope(table, key, target.PLAIN_SEALER.seal(table, key, record, 0)))
    seeds.append(b"\x02" + target.join_envelope(b"nodes", b"k", b"\x01abc"))
    seeds.append(b"\x01" + target.join_envelope(b"", b"", b""))
    return seeds


def header_seeds() -> list[bytes]:
    import os
    import random
    import tempfile

    import msgpack

    import engramdb
    from engramdb import crypto

    target = _load_target("fuzz_header")
    rng = random.Random(20261130)
    real_urandom = os.urandom
    os.urandom = rng.randbytes  # salts, store ids, DEKs and nonces: the same seeds on every run
    headers: dict[str, bytes] = {}
    try:
        with target.cheap_kdf(), tempfile.TemporaryDirectory() as tmp:
            weak = crypto.KDFParams.for_tests()
            for name, kwargs in (("passphrase", {"passphrase": target.PASSPHRASE, "kdf": weak}),
                                 ("key", {"key": target.RAW_KEY}), ("plain", {"encrypted": False})):
                with engramdb.open(os.path.join(tmp, name), **kwargs) as db:
                    if name == "passphrase":
                        db.add_recovery_key()  # a second slot, of kind "key"
                    with db._store.read() as txn:
                        headers[name] = txn.get_header(b"header")
    finally:
        os.urandom = real_urandom
    seeds: list[bytes] = []
    for data in headers.values():
        seeds.extend(bytes([mode]) + data for mode in range(8))
        seeds.append(b"\x00" + data[: len(data) // 2])
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 0x01
        seeds.append(b"\x00" + bytes(flipped))
    header = msgpack.unpackb(headers["passphrase"], raw=False)
    hostile = [
        {"alg": "argon2id", "v": 19, "t": 10**9, "m": 8, "p": 1},
        {"alg": "argon2id", "v": 19, "t": 1, "m": 2**32, "p": 1},
        {"alg": "argon2id", "v": 19, "t": 1, "m": 8, "p": 255},
        {"alg": "argon2id", "v": 19, "t": 20, "m": 4 * 1024 * 1024, "p": 16},  # at the real cap
        {"alg": "argon2id", "v": 19, "t": True, "m": 8.5, "p": None},
        {"alg": "argon2id", "v": 19, "t": 1, "m": 8, "p": float("nan")},  # NaN: not equal to itself
        {"alg": "scrypt", "v": 19}, "argon2id", None,
    ]
    for kdf in hostile:
        bad = dict(header, slots=[dict(header["slots"][0], kdf=kdf)])
        seeds.append(b"\x00" + msgpack.packb(bad, use_bin_type=True))
    for change in ({"version": [2, 0]}, {"version": [1]}, {"format": "other"}, {"slots": None}, {"slots": [1, "x"]},
                   {"slots": [dict(header["slots"][0], salt=b"short")]}, {"store_id": None},
                   {"slots": header["slots"][:1] * 3}):  # more passphrase slots than engramdb writes
        seeds.append(b"\x00" + msgpack.packb(dict(header, **change), use_bin_type=True))
    seeds.append(b"\x00" + msgpack.packb([1, 2, 3]))
    seeds.append(b"\x00" + b"\x91" * 3000)
    return seeds


def tokenize_seeds() -> list[bytes]:
    """Texts for fuzz_tokenize.py (split on \\x1e), each under all four tokenizers."""
    texts = [
        "It is a truth universally acknowledged, that a single man in possession of a good fortune,"
        " must be in want of a wife.",
        "The THE the; And/OR but_not x1 y2 __init__ 3.14 1,000,000 e-mail o'clock",
        " ".join("w" * n for n in range(1, 21)),  # word lengths around the 8- and 16-byte keys
        " ".join("ab" * n for n in range(1, 12)) + " " + "x" * 40 + " " + "Y" * 17,
        "Café naïve straße Æsir ﬁnance ½ Ⅻ İstanbul ΣΊΣΥΦΟΣ 東京タワー 🙂 e\u0301",
        "ab\x00cd\x01ef\tgh\nij\rkl\x7fmn",
        "\x1e\x1e only separators and \x1e\x1e empty texts \x1e",
        "running runs ran runner easily fairly, generous generously",
    ]
    seeds = [bytes([mode]) + text.encode("utf-8") for text in texts for mode in range(4)]
    seeds.append(b"\x00" + "lone \ud800 surrogate \udfff".encode("utf-8", "surrogatepass"))
    seeds.append(b"\x01invalid \xff\xfe utf-8 \xc3")
    seeds.append(b"\x02" + "\x1e".join(texts).encode("utf-8"))
    return seeds


def transcript_seeds() -> list[bytes]:
    """Transcripts for fuzz_transcript.py: the agent fixtures, cut and mutated, plus edge cases."""
    import json

    seeds: list[bytes] = []
    for path in sorted((ROOT / "tests" / "fixtures" / "agent").glob("*.json")):
        data = path.read_bytes()
        seeds += [data, data[: len(data) // 2], data.replace(b'"tool_use_id": "toolu_', b'"tool_use_id": "x')]
        messages = json.loads(data)
        seeds.append(json.dumps(messages[::-1]).encode())  # results before their calls
        seeds.append(json.dumps(messages + messages).encode())  # repeated call ids
    seeds += [json.dumps(doc).encode() for doc in (
        [], {}, "text", [None], [{"content": "no role"}], [{"role": "user", "content": 5}],
        [{"role": "assistant", "content": [{"type": "video"}]}],
        [{"role": "assistant", "tool_calls": "x"}, {"role": "tool", "tool_call_id": 1}],
        [{"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{"}}]},
         {"role": "tool", "tool_call_id": "a", "content": [{"type": "text", "text": "Traceback (most recent"
                                                                                  " call last)"}]}],
        [{"role": "assistant", "function_call": {"name": "g", "arguments": None}},
         {"role": "function", "name": "g", "content": "exit code 2"}],
        [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "is_error": "yes"}]}],
        [{"role": "assistant", "content": [{"type": "thinking"}, {"type": "redacted_thinking"}]}],
        [{"speaker": "Alice", "text": "hi", "date": "2024-05-02"}, "plain text"],
        1, {"role": "user", "content": "a lone message"},  # campaign 2026-12-02: TypeError / read as its keys
    )]
    seeds.append(b"[" * 3000 + b"]" * 3000)
    return seeds


def compress_seeds() -> list[bytes]:
    """Texts for fuzz_compress.py, each under every option mode that matters."""
    texts = [
        "(1:56 pm on 8 May, 2023) Caroline: Hey Mel! I decided to go to the LGBTQ support group.\n\n"
        "(1:58 pm on 8 May, 2023) Melanie: Wow, Caroline! I love that you chose that. Next month?\n\n"
        "(2:01 pm on 8 May, 2023) Caroline: Yes, and last Friday I went 3 days ago. She said it led to "
        "a breakthrough.",
        "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
        "must be in want of a wife.\r\n\r\nMr. Bennet replied that he had not. \u201cBut it is,\u201d "
        "returned she; \u201cfor Mrs. Long has just been here.\u201d",
        "\ufeffTitle\u00a0\n\n\n  \u2028 \n\nIn 2019 and in May 2020, on 2023-02-30 and June 31 2021 (x 8th May, 1850 y)",
        "\U0001f389" * 30 + "\n\n" + "Z\u00f6e met \u00c9mile in Z\u00fcrich; they will do it. " * 6,
        "Alice: a\nBob: b\nAlice: c\nBob: d\nAlice: e\nBob: f\n\n" * 5,
        "word " * 400,
        "A. B. C. e.g. i.e. Dr. Smith vs. Jones etc. U.S. policy! Really? Yes.\n\nthe end",
        "",
        "   \n\n\t\n",
    ]
    seeds = [bytes([mode]) + text.encode("utf-8") for text in texts for mode in (0, 1, 2, 3, 7)]
    seeds.append(b"\x00invalid \xff\xfe utf-8 \xc3")
    # campaign 2026-12-02: a chunk shorter than the overlap is repeated whole by the next one
    seeds.append(b"\x01(1:56 pm p.\n\n(1:58 pm on 8 May, 2023) Melanie: " + b"Wow, Caroline! " * 8)
    return seeds


def vector_seeds() -> list[bytes]:
    """fuzz_vectors.py: real blocks (full, sparse, empty bitmap, one row) and directories of
    both layouts, each also cut, extended and with a flipped byte."""
    import msgpack
    import numpy as np

    from engramdb.index import vectors

    rng = np.random.default_rng(7)
    blocks = [
        vectors.encode_vector_block(np.arange(37), rng.standard_normal((37, 8)).astype(np.float32), 37),
        vectors.encode_vector_block(np.asarray([0, 5, 9]), rng.standard_normal((3, 3)).astype(np.float32), 10),
        vectors.encode_vector_block(np.asarray([3]), np.asarray([[0.5, -0.0, 1e-40]], np.float32), 4),
        vectors.encode_vector_block(np.zeros(0, np.int64), np.zeros((0, 2), np.float32), 16),
    ]
    dirs = [
        vectors._Dir(37, 384, 1000, 12).encode(),
        msgpack.packb({"next": 3, "blocks": [[1, 2], [2, 1]], "dead_docs": np.asarray([4], "<u8").tobytes(),
                       "dead_before": np.asarray([2], "<u4").tobytes()}, use_bin_type=True),
        msgpack.packb({"layout": 3, "rows": 1, "dims": 1, "count": 0, "seq": 0}, use_bin_type=True),
        msgpack.packb({"layout": 2, "rows": 0, "dims": 1, "count": 0, "seq": 0}, use_bin_type=True),
    ]
    seeds = []
    for mode, values in ((0, blocks), (1, dirs)):
        for value in values:
            flipped = value[:len(value) // 2] + bytes([value[len(value) // 2] ^ 0x10]) + value[len(value) // 2 + 1:]
            seeds += [bytes([mode]) + v for v in (value, value[:-1], value + b"\x00", value[:7], flipped)]
    return seeds


def main_parsers() -> None:
    _write_seeds("importers", importer_seeds())
    _write_seeds("records", record_seeds())
    _write_seeds("header", header_seeds())
    _write_seeds("tokenize", tokenize_seeds())
    _write_seeds("transcript", transcript_seeds())
    _write_seeds("compress", compress_seeds())
    _write_seeds("vectors", vector_seeds())


if __name__ == "__main__":
    main()
    main_parsers()
