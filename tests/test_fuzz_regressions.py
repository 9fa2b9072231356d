"""Regression tests for the fuzz targets of the importers, the record decoder and the header.

One test per finding, with the input as a literal (or built in a line from a valid file)
and a docstring saying where it was found and what went wrong; plus a replay of the seed
corpora of fuzz/fuzz_importers.py, fuzz/fuzz_records.py, fuzz/fuzz_header.py, fuzz/fuzz_tokenize.py and fuzz/fuzz_compress.py through
the same oracles (no atheris needed). See fuzz/README.md.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import pathlib
import struct

import msgpack
import pytest

from engramdb import codec, crypto, importers
from engramdb.errors import CorruptFileError, DecryptionError, ImportFormatError, WeakKDFError
from engramdb.records import Node

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"
# Node() converts embeddings with numpy, which warns before Node refuses the resulting inf.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")


def _target(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "fuzz" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


IMPORTERS = _target("fuzz_importers")
RECORDS = _target("fuzz_records")
HEADER = _target("fuzz_header")
TOKENIZE = _target("fuzz_tokenize")
TRANSCRIPT = _target("fuzz_transcript")
COMPRESS = _target("fuzz_compress")
VECTORS = _target("fuzz_vectors")
CHANGES = _target("fuzz_changes")


# --- the corpus replay ---------------------------------------------------------------

@pytest.mark.parametrize("name, target, minimum", [
    ("importers", IMPORTERS, 60), ("records", RECORDS, 30), ("header", HEADER, 40), ("tokenize", TOKENIZE, 30),
    ("transcript", TRANSCRIPT, 25), ("compress", COMPRESS, 40), ("vectors", VECTORS, 30),
    ("changes", CHANGES, 20),
])
def test_fuzz_corpus_replays_without_crashing(name, target, minimum):
    """Every seed (valid and invalid) goes through its target's oracle, as the fuzzer runs it."""
    seeds = sorted((CORPUS / name).iterdir())
    assert len(seeds) >= minimum
    with getattr(target, "cheap_kdf", contextlib.nullcontext)():
        for path in seeds:
            target.TestOneInput(path.read_bytes())


def test_the_oracles_can_fail(monkeypatch):
    """The oracles are not vacuous: a re-encoding that changes a node, a KDF run above the cap and a batch
    tokenization that differs from the one-text path are reported."""
    real_encode = codec.encode_node
    monkeypatch.setattr(codec, "encode_node", lambda node: real_encode(node.replace(content=node.content + "!")))
    with pytest.raises(AssertionError, match="!= node"):
        RECORDS.check_node(real_encode(Node("n", content="x")))
    import argon2.low_level

    with HEADER.cheap_kdf(), pytest.raises(AssertionError, match="above the cap"):
        argon2.low_level.hash_secret_raw(secret=b"x", salt=b"s" * 8, time_cost=5, memory_cost=8, parallelism=1,
                                         hash_len=32, type=argon2.low_level.Type.ID)
    assert crypto.KDFParams.CAP == (10, 1024 * 1024, 16)  # cheap_kdf() restores the real cap
    tokenizer = TOKENIZE.TOKENIZERS[0]
    real_encode_many = tokenizer.encode_many
    monkeypatch.setattr(tokenizer, "encode_many", lambda texts: real_encode_many([t + " extra" for t in texts]))
    with pytest.raises(AssertionError):
        TOKENIZE.TestOneInput(b"\x00plain words")


# --- helpers ------------------------------------------------------------------------

def _terronex(body: dict, security: dict | None = None) -> bytes:
    payload = msgpack.packb(body, use_bin_type=True)
    security = dict(security or {"encrypted": False})
    security.setdefault("integrity", hashlib.sha256(payload).digest())
    header = msgpack.packb({"version": [1, 0], "security": security}, use_bin_type=True)
    return b"ENGRAM\x01\x00" + struct.pack("<I", len(header)) + header + payload


def _import(data: bytes, **kwargs) -> list:
    return list(importers.iter_import(io.BytesIO(data), now=0.0, **kwargs))


NODE = {"id": "a", "content": {"type": "text", "data": "x"}}


# --- importers ------------------------------------------------------------------------

@pytest.mark.parametrize("body", [
    {"nodes": [NODE], "entities": 5},
    {"nodes": [NODE], "links": 5},
    {"nodes": [NODE], "links": True},
])
def test_terronex_entities_or_links_not_a_list(body):
    """Development review for fuzz_importers, 2026-11-30: ``entities: 5`` or ``links: 5`` in the
    payload raised TypeError ('int' object is not iterable)."""
    with pytest.raises(ImportFormatError, match="is not a list"):
        _import(_terronex(body))


def test_terronex_entity_mentions_not_a_list_are_ignored():
    """Development review for fuzz_importers, 2026-11-30: ``mentions: 5`` raised TypeError; an entity
    without a mention list names no node, like one without mentions."""
    items = _import(_terronex({"nodes": [NODE], "entities": [{"name": "Alice", "mentions": 5}]}))
    assert [n.entities for n in items] == [()]


def test_terronex_link_type_not_a_string():
    """Seed corpus of fuzz_importers, 2026-11-30: a link whose type is a list raised
    TypeError (unhashable type: 'list') from the link-kind table."""
    link = {"sourceId": "a", "targetId": "b", "type": ["list"]}
    with pytest.raises(ImportFormatError, match="link #0: a link type must be a string"):
        _import(_terronex({"nodes": [NODE], "links": [link]}))


def test_terronex_argon2_salt_shorter_than_8_bytes():
    """Development review for fuzz_importers, 2026-11-30: an encrypted file with kdf argon2id and a
    3-byte salt let argon2's HashingError ('Salt is too short') escape."""
    data = _terronex({"nodes": []}, {"encrypted": True, "kdf": "argon2id", "salt": b"abc", "nonce": b"n" * 12})
    with pytest.raises(ImportFormatError, match="salt shorter than 8 bytes"):
        _import(data, passphrase="pw")


@pytest.mark.parametrize("line", [
    b'{"id":"x","importance":' + b"9" * 400 + b"}",
    b'{"id":"x","createdAt":' + b"9" * 400 + b"}",
    b'{"id":"x","embedding":[' + b"9" * 400 + b"]}",
    b'{"id":"x","engramdb":{"v":1,"node":{"id":"y","weight":' + b"9" * 400 + b"}}}",
])
def test_jsonl_integer_beyond_float_range(line):
    """Seed corpus of fuzz_importers, 2026-11-30: a JSON integer of 400 digits (JSON has no size
    limit) raised OverflowError ('int too large to convert to float')."""
    with pytest.raises(ImportFormatError, match="line 1"):
        _import(line)


# --- records ------------------------------------------------------------------------

def _zstd_frame_declaring(size: int) -> bytes:
    """A zstd frame header (single segment, 8-byte content size) followed by a raw block."""
    return b"\x28\xb5\x2f\xfd\xe0" + struct.pack("<Q", size) + b"\x01\x00\x00"


@pytest.mark.parametrize("size", [2**62 + 5, codec.MAX_RECORD_BYTES + 1])
def test_zstd_record_declaring_a_huge_size(size):
    """fuzz_records, 2026-11-30 (crash-dac5da19): a zstd record whose frame declares a content size
    of 4.7e18 bytes raised MemoryError: python-zstandard allocates the declared size before it
    looks at max_output_size; a declared size in the terabytes would have been allocated."""
    # refused from the frame header, before anything is allocated (an allocation of the
    # declared size would raise MemoryError or take the size in memory, not this error)
    with pytest.raises(CorruptFileError, match="beyond the"):
        codec.decode_node(bytes((codec.CODEC_ZSTD,)) + _zstd_frame_declaring(size))
    with pytest.raises(CorruptFileError, match="beyond the"):
        codec.unpack_archive(_zstd_frame_declaring(size))


def test_fuzz_crash_dac5da19_replays():
    """fuzz_records, 2026-11-30: the minimised-by-hand form of the crash above, as the fuzzer found it
    (a seed record recompressed into a frame header that declares 0x41ba... bytes)."""
    data = bytes.fromhex("0002" "28b52ffdc20001dc001601a26e31ba416c696365206c6561647320") + b"Project Atlas."
    RECORDS.TestOneInput(data)
    with pytest.raises(CorruptFileError):
        codec.decode_node(data[1:])


def test_damaged_envelopes_do_not_grow_the_cipher_cache():
    """Review of fuzz_records' memory, 2026-11-30: Sealer.open cached one AES-GCM cipher per epoch
    read from the (not yet authenticated) envelope, so 100,000 damaged values with distinct epochs
    kept 100,000 ciphers (~13 MB); a damaged file could grow it without bound."""
    sealer = crypto.Sealer(RECORDS.DEK)
    for epoch in range(2000):
        with pytest.raises(DecryptionError):
            sealer.open(b"nodes", b"k", struct.pack(">BI", 1, epoch) + bytes(28))
    assert sealer._ciphers == {}
    envelope = sealer.seal(b"nodes", b"k", b"value", 7)
    assert crypto.Sealer(RECORDS.DEK).open(b"nodes", b"k", envelope) == b"value"
    assert sealer.open(b"nodes", b"k", envelope) == b"value" and list(sealer._ciphers) == [7]


# --- header ---------------------------------------------------------------------------

def _seed_header() -> dict:
    """The passphrase-protected header of the seed corpus (written by engramdb.open)."""
    for path in sorted((CORPUS / "header").iterdir()):
        data = path.read_bytes()
        if data[:1] == b"\x00":
            try:
                header = msgpack.unpackb(data[1:], raw=False)
            except Exception:  # the corpus holds damaged headers too
                continue
            if isinstance(header, dict) and any(isinstance(s, dict) and s.get("kind") == "passphrase"
                                                for s in header.get("slots") or []):
                return header
    raise AssertionError("the header corpus holds no passphrase header")


def test_many_passphrase_slots_refused_before_any_kdf_run(monkeypatch):
    """Review of fuzz_header, 2026-11-30: _unlock (now header.unlock) ran the KDF once per passphrase slot, and the
    number of slots is not bounded; at the cap (t=20, m=4 GiB, p=16) one run would take about 75 s
    on the 2-core build VM (1.2 s measured at m=64 MiB, times 64), so a header listing 1,000
    slots would make open() run for most of a day."""
    from engramdb import header as engram_header

    header = _seed_header()
    slot = next(s for s in header["slots"] if s["kind"] == "passphrase")
    header = dict(header, slots=[dict(slot, salt=i.to_bytes(16, "big")) for i in range(1000)])
    runs = []
    monkeypatch.setattr(crypto, "derive_kek", lambda *args: runs.append(args) or bytes(32))
    with pytest.raises(CorruptFileError, match="1000 passphrase slots"):
        engram_header.unlock(header, passphrase=HEADER.PASSPHRASE, raw_key=None)
    assert runs == []


@pytest.mark.parametrize("kdf", [
    {"alg": "argon2id", "v": 19, "t": 10**9, "m": 8, "p": 1},
    {"alg": "argon2id", "v": 19, "t": 1, "m": 2**40, "p": 1},
    {"alg": "argon2id", "v": 19, "t": 1, "m": 8, "p": 2**20},
    {"alg": "argon2id", "v": 19, "t": 1, "m": 8, "p": 2},
    "argon2id", None, {"alg": "argon2id", "v": 19},
])
def test_hostile_kdf_in_a_header_refused_before_the_kdf_runs(kdf, monkeypatch):
    """fuzz_header oracle, 2026-11-30: the KDF guard of cheap_kdf() never fired; this pins the order
    (parameters checked, then argon2 run) with the real cap and without the test switch."""
    from engramdb import header as engram_header

    header = _seed_header()
    header = dict(header, slots=[dict(s, kdf=kdf) if s["kind"] == "passphrase" else s for s in header["slots"]])
    import argon2.low_level

    runs = []
    monkeypatch.setattr(argon2.low_level, "hash_secret_raw", lambda *a, **k: runs.append(k) or bytes(32))
    with pytest.raises(WeakKDFError):
        engram_header.unlock(header, passphrase=HEADER.PASSPHRASE, raw_key=None)
    assert runs == []


def test_the_transcript_oracle_can_fail(monkeypatch):
    """fuzz_transcript's consistency checks are not vacuous: a serializer whose tool sequence
    disagrees with its turns is reported."""
    real = TRANSCRIPT.serialize_conversation

    def broken(document):
        conv = real(document)
        conv.tool_sequence = conv.tool_sequence + ["ghost"]
        return conv

    monkeypatch.setattr(TRANSCRIPT, "serialize_conversation", broken)
    with pytest.raises(AssertionError):
        TRANSCRIPT.TestOneInput(b'[{"role": "user", "content": "hi"}]')


def test_the_compress_oracle_can_fail(monkeypatch):
    """fuzz_compress's oracle catches a zettel whose offsets do not index its chunk."""
    real = COMPRESS.compress

    def shifted(text, **options):
        result = real(text, **options)
        for z in result.zettels:
            z.source_start -= 1
        return result

    seed = b"\x00" + b"Alice met Bob in Paris. They decided to stay.\n\nThen they left."
    COMPRESS.TestOneInput(seed)
    monkeypatch.setattr(COMPRESS, "compress", shifted)
    with pytest.raises(AssertionError):
        COMPRESS.TestOneInput(seed)


# --- campaign 2026-12-02 ------------------------------------------------------------------

@pytest.mark.parametrize("document", [1, None, {"role": "user", "content": "a lone message"}, "text", b"text"])
def test_messages_to_text_refuses_what_is_not_a_list_of_messages(document):
    """fuzz_transcript, campaign 2026-12-02 (crash-356a192b, the JSON document ``1``): messages_to_text
    raised TypeError ('int' object is not iterable); a lone message dict was read as its keys
    ('role\\ncontent') and a string as its characters, where ingest() and the agent serializer refuse them."""
    from engramdb.errors import ValidationError
    from engramdb.ingest import messages_to_text

    with pytest.raises(ValidationError, match="list of messages") as info:
        messages_to_text(document)
    assert "[message]" in info.value.hint
    assert messages_to_text([{"role": "user", "content": "hi"}]) == "user: hi"
    assert messages_to_text(iter(["plain"])) == "plain"  # any iterable of messages still works


def test_compress_chunk_repeated_by_the_next_one_is_not_a_finding():
    """fuzz_compress, campaign 2026-12-02 (crash-e477aea8): a first chunk shorter than the overlap
    ("(1:56 pm p.", 11 of 30 units) is repeated whole by the next chunk, which starts where it starts:
    the zettel-compress 1.0.0 overlap rule, which the oracle's strictly increasing starts did not
    allow. The oracle now wants starts that never go back and ends that always move on; it still
    reports a chunk that goes back."""
    seed = b"\x01(1:56 pm p.\n\n(1:58 pm on 8 May, 2023) Melanie: " + b"Wow, Caroline! " * 8
    from engramdb.compress import compress

    options = COMPRESS.options_of(seed[0])
    starts = [z.source_start for z in compress(seed[1:].decode(), **options).zettels]
    assert starts[:2] == [0, 0]
    COMPRESS.TestOneInput(seed)
    real = COMPRESS.compress

    def backwards(text, **kwargs):
        result = real(text, **kwargs)
        result.zettels.reverse()
        return result

    COMPRESS.compress = backwards
    try:
        with pytest.raises(AssertionError, match="out of order"):
            COMPRESS.TestOneInput(seed)
    finally:
        COMPRESS.compress = real


KEYFILE = _target("fuzz_keyfile")


def test_keyfile_corpus_replays_and_its_oracle_can_fail(monkeypatch):
    """fuzz_keyfile (campaign 2026-12-02): every seed goes through the oracle; a reader that hands
    back a key other than the file's is reported."""
    seeds = sorted((CORPUS / "keyfile").iterdir())
    assert len(seeds) >= 15
    for path in seeds:
        KEYFILE.TestOneInput(path.read_bytes())
    from engramdb import header

    real = header.read_key_file
    monkeypatch.setattr(header, "read_key_file", lambda path: bytes(32) if real(path) else None)
    with pytest.raises(AssertionError, match="not the file's"):
        KEYFILE.TestOneInput(bytes(range(32)))


def test_key_file_with_a_byte_order_mark(tmp_path):
    """fuzz_keyfile seeds, campaign 2026-12-02: a recovery key saved by an editor that writes a UTF-8
    byte-order mark (Windows Notepad) was refused as 'neither a 32-byte raw key nor a recovery key'."""
    from engramdb import header

    text = header.format_recovery_key(bytes(range(32)))
    path = tmp_path / "key.txt"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode() + b"\r\n")
    assert header.parse_raw_key(header.read_key_file(path)) == bytes(range(32))


def test_mcp_corpus_replays_and_its_oracle_can_fail(monkeypatch):
    """fuzz_mcp (campaign 2026-12-02): every seed goes through the SDK's call_tool and the oracle; a
    tool that raises something other than an EngramError is reported, and so is a remember that
    stores another text."""
    pytest.importorskip("mcp", reason="the MCP SDK (engramdb[mcp]) is not installed")
    mcp_target = _target("fuzz_mcp")
    seeds = sorted((CORPUS / "mcp").iterdir())
    assert len(seeds) >= 25
    try:
        for path in seeds:
            mcp_target.TestOneInput(path.read_bytes())
        db, _ = mcp_target.SERVER.get()
        monkeypatch.setattr(db, "recall", lambda *a, **k: [][0])
        with pytest.raises(IndexError):
            mcp_target.TestOneInput(b"\x01" + b'{"query": "x"}')
        real_remember = db.remember
        monkeypatch.setattr(db, "remember", lambda text, **k: real_remember(text + "!", **k))
        with pytest.raises(AssertionError):
            mcp_target.TestOneInput(b"\x00" + b'"hello"')
    finally:
        mcp_target.SERVER.close()


def test_the_filters_oracle_can_fail(monkeypatch):
    """fuzz_filters' bound check (campaign 2026-12-02) is not vacuous: a filter that keeps a memory
    created just before its after= bound is reported."""
    from engramdb import filters

    FILTERS = _target("fuzz_filters")
    FILTERS.TestOneInput(b"2023-05-01")
    real_parse = filters.parse_time
    monkeypatch.setattr(filters, "parse_time", lambda value, name="time": None if value is None else
                        real_parse(value, name) - (1.0 if name == "after" and isinstance(value, str) else 0.0))
    with pytest.raises(AssertionError, match="after="):
        FILTERS.TestOneInput(b"2023-05-01")


# --- campaign 2026-12-02: quadratic paths in compress's default method (zc) ----------------------
# Found by a scaling probe run beside the fuzzer (its inputs stop at 4 KB): each of these took
# time quadratic in the text (a 100 KB text of ISO dates 5.1 s, 1 MB about 8 minutes). The
# tests count the work (calls, characters scanned, comparisons), never the time.

def _zc_steps(fn, *args):
    """(fn(*args), the Python steps it ran in engramdb/compress/zc.py: lines and generator resumptions)."""
    import sys

    from engramdb.compress import zc

    steps = [0]

    def tracer(frame, event, arg):
        if frame.f_code.co_filename != zc.__file__:
            return None
        steps[0] += 1
        return tracer

    sys.settrace(tracer)
    try:
        result = fn(*args)
    finally:
        sys.settrace(None)
    return result, steps[0]


def test_zc_date_overlap_check_is_linear():
    """zc._extract_absolutes compared each date with every date kept before it: n dates made n^2
    steps (2,000 ISO dates and 2,000 months: 8 million); the furthest end kept per specificity
    answers the same question in a bounded number of steps per date, with the same hits."""
    from engramdb.compress import zc

    text = "2023-05-01 in May 2023, " * 2000
    hits, steps = _zc_steps(zc._extract_absolutes, text)
    assert len(hits) == 4000 and [h.date for h in hits[:2]] == [(2023, 5, 1), (2023, 5, None)]
    assert steps <= 60 * len(hits), steps


_COMPARED = [0]
_SCANNED = [0]


class _CountingStr(str):
    """A name that counts the equality tests made on it (a list scan makes one per element)."""

    def __eq__(self, other):
        _COMPARED[0] += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_zc_coreference_recency_is_linear():
    """zc.resolve_coreferences kept the names last seen in a list (``in`` and ``remove`` scan it):
    a chunk naming n people cost n^2 comparisons; a dict keeps the same order."""
    from engramdb.compress import zc

    names = [_CountingStr(f"Name{i:05d}") for i in range(3000)]
    chunk = zc.Chunk(" ".join(names), 0, 0)
    _COMPARED[0] = 0
    out = zc.resolve_coreferences([chunk, zc.Chunk("they left", 0, 0)], [list(names), []])
    assert out[1] == sorted(names[-2:])
    assert _COMPARED[0] <= 20 * len(names), _COMPARED[0]


def test_zc_entity_codes_of_colliding_names_are_linear():
    """zc.build_entity_index scanned XY1, XY2, ... from 1 for every name whose code was taken:
    n names with one code made n^2 set lookups (the same codes now, from a count per prefix)."""
    from engramdb.compress import zc

    names = [f"B{v}{w}{x}{y}" for v in "aeiou" for w in "aeiou" for x in "aeiou" for y in "aeiou"]  # all BAA..BUU
    index, steps = _zc_steps(zc.build_entity_index, names)
    assert steps <= 100 * len(names), steps  # the scan from XY1 took ~215 per name here
    assert index.name_to_code["Baaaa"] == "BAA" and index.name_to_code["Baaae"] == "BA1"
    assert len(set(index.code_to_name)) == len(names) == 625


class _ScanCountingStr(str):
    """A text that adds up the characters each rfind may scan."""

    def rfind(self, sub, start=0, end=None):
        end = len(self) if end is None else end
        _SCANNED[0] += max(0, end - start)
        return str.rfind(self, sub, start, end)


def test_zc_negation_window_scans_only_the_window():
    """zc._negated looked for "rather than"-style negators with rfind from the start of the text
    to the keyword, though only one within 50 characters counts: n keywords cost n^2."""
    from engramdb.compress import zc

    lower = _ScanCountingStr("we decided to go " * 3000)
    _SCANNED[0] = 0
    ats = range(3, len(lower), 17)
    results = [zc._negated(lower, at) for at in ats]
    assert not any(results)
    assert _SCANNED[0] <= 200 * len(zc._IMPLICIT_NEGATORS) * len(results)


def test_zc_decision_sentence_bounds_found_once(monkeypatch):
    """zc._records_decision searched from every decision keyword for the next sentence end (and back
    for the previous one): a long text without one cost n^2; the sentence ends are found once."""
    from engramdb.compress import zc

    text = "I'm going to decide and I'm going to commit, " * 2000 + "done?"
    expected = zc.precise_decision(text)
    scanned = [0]
    real = zc._SENTENCE_END

    class Counting:
        def search(self, s, pos=0):
            scanned[0] += len(s) - pos
            return real.search(s, pos)

        def finditer(self, s, pos=0):
            scanned[0] += len(s) - pos
            return real.finditer(s, pos)

    monkeypatch.setattr(zc, "_SENTENCE_END", Counting())
    assert zc.precise_decision(text) == expected
    assert scanned[0] <= 2 * len(text), scanned[0]
