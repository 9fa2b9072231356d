"""The optional C extension (engramdb/_native.c) against the pure-Python path: the same
envelopes, blind keys, state digests, tokens, node objects, node records and posting
blocks on generated inputs, and the same stored records and rankings for generated
corpora written both ways (spec/encryption.md, "The C
extension").

The tests run both paths whatever ``ENGRAMDB_PURE_PYTHON`` says (they load the extension
directly). They skip when the extension is not built, unless ``ENGRAMDB_REQUIRE_NATIVE=1``
(CI sets it), which makes a missing build a failure.
"""
from __future__ import annotations

import hashlib
import hmac
import math
import os
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engramdb.engram as engram_mod
from engramdb import _accel, codec
from engramdb.errors import ValidationError
from engramdb.index import bm25
from engramdb.index.bm25 import TermDocs, count_postings, decode_block, encode_blocks
from engramdb.records import Node
from engramdb.index import tokenize
from engramdb.index.tokenize import Tokenizer
from engramdb.crypto import _ENV_HEADER, ENVELOPE_VERSION, NONCE_BYTES, Sealer, _aad_prefix
from engramdb.store import TABLES, Store

from conftest import PASSPHRASE, TEST_KDF, nodes

NATIVE = _accel.load({})
if NATIVE is None and os.environ.get("ENGRAMDB_REQUIRE_NATIVE") == "1":
    raise RuntimeError("ENGRAMDB_REQUIRE_NATIVE=1 but engramdb._native is not built (pip install . with a C compiler "
                       "and OpenSSL's headers)")
needs_native = pytest.mark.skipif(NATIVE is None, reason="engramdb._native is not built")

keys = st.binary(max_size=40)
values = st.binary(max_size=700)


def sealers(dek: bytes) -> tuple[Sealer, Sealer]:
    """Two sealers over one key: the extension's and the pure-Python path's."""
    native, pure = Sealer(dek), Sealer(dek)
    native._native, pure._native = NATIVE, None
    return native, pure


def both_ways(fn):
    """``[fn() with the extension, fn() on the pure-Python path]``."""
    out = []
    for native in (NATIVE, None):
        saved, _accel.NATIVE = _accel.NATIVE, native
        try:
            out.append(fn())
        finally:
            _accel.NATIVE = saved
    return out


def test_pure_python_switch() -> None:
    assert _accel.load({_accel.PURE_ENV: "1"}) is None
    assert _accel.load({_accel.PURE_ENV: "yes"}) is None
    assert _accel.load({_accel.PURE_ENV: "0"}) == NATIVE
    assert _accel.load({}) == NATIVE
    if os.environ.get(_accel.PURE_ENV, "").strip() not in ("", "0"):
        assert _accel.NATIVE is None


@needs_native
@settings(max_examples=150, deadline=None)
@given(dek=st.binary(min_size=32, max_size=32), table=st.sampled_from([t.encode() for t in TABLES]),
       items=st.lists(st.tuples(keys, values), max_size=20), epoch=st.integers(0, 2**32 - 1), data=st.data())
def test_seal_many_matches_the_pure_path(dek, table, items, epoch, data) -> None:
    native, pure = sealers(dek)
    nonces = data.draw(st.binary(min_size=NONCE_BYTES * len(items), max_size=NONCE_BYTES * len(items)))
    header = _ENV_HEADER.pack(ENVELOPE_VERSION, epoch)
    got = native._seal_many_with_nonces(_aad_prefix(table), header, items, epoch, nonces)
    assert got == pure._seal_many_with_nonces(_aad_prefix(table), header, items, epoch, nonces)
    # and each is the one-value path's envelope, which opens to the plaintext
    for i, ((key, plaintext), envelope) in enumerate(zip(items, got)):
        assert envelope == pure._seal_with_nonce(table, key, plaintext, epoch, nonces[i * NONCE_BYTES:(i + 1) * NONCE_BYTES])
        assert pure.open(table, key, envelope) == plaintext


@needs_native
@settings(max_examples=150, deadline=None)
@given(dek=st.binary(min_size=32, max_size=32), purpose=st.binary(max_size=12), values=st.lists(values, max_size=20))
def test_blind_many_matches_the_pure_path(dek, purpose, values) -> None:
    native, pure = sealers(dek)
    assert native.blind_many(purpose, values) == pure.blind_many(purpose, values) \
        == [pure.blind(purpose, v) for v in values]


@needs_native
@settings(max_examples=100, deadline=None)
@given(key=st.binary(max_size=200), head=st.binary(max_size=20), values=st.lists(values, max_size=8),
       size=st.integers(0, 32))
def test_hmac_many_is_hmac_sha256(key, head, values, size) -> None:
    assert NATIVE.hmac_many(key, head, values, size) == [hmac.digest(key, head + v, "sha256")[:size] for v in values]


@needs_native
@settings(max_examples=150, deadline=None)
@given(dek=st.binary(min_size=32, max_size=32), table=st.sampled_from([t.encode() for t in TABLES]),
       pairs=st.lists(st.tuples(keys, values), max_size=30))
def test_state_terms_match_the_pure_path(dek, table, pairs) -> None:
    native, pure = sealers(dek)
    assert native.state_terms(table, pairs) == pure.state_terms(table, pairs) \
        == sum(pure.state_term(table, k, e) for k, e in pairs) % 2**256


@needs_native
def test_state_sum_carries_across_limbs() -> None:
    # many terms near 2**256: the 64-bit limbs' carries must propagate, and the sum wrap
    dek = bytes(range(32))
    native, pure = sealers(dek)
    pairs = [(i.to_bytes(4, "big"), hashlib.sha256(i.to_bytes(4, "big")).digest()) for i in range(5000)]
    assert native.state_terms(b"nodes", pairs) == pure.state_terms(b"nodes", pairs)


@needs_native
def test_native_refuses_bad_input() -> None:
    with pytest.raises(TypeError):
        NATIVE.seal_many(bytes(32), b"h", b"p", bytes(12), [(b"k", "text")])
    with pytest.raises(TypeError):
        NATIVE.state_sum(b"k", b"p", [b"not a pair"])
    with pytest.raises(ValueError):
        NATIVE.seal_many(bytes(31), b"h", b"p", b"", [])
    with pytest.raises(ValueError):
        NATIVE.seal_many(bytes(32), b"h", b"p", bytes(11), [(b"k", b"v")])
    with pytest.raises(ValueError):
        NATIVE.hmac_many(b"k", b"", [b"v"], 33)


def _written(tmp_path, name: str, native: _accel.Native | None, docs: list[str], monkeypatch) -> tuple[dict, list]:
    """Every table's stored (key, envelope) pairs and a few rankings, for ``docs`` added
    with ``native`` (None: the pure-Python path). Randomness (salt, keys, nonces) is seeded,
    so both paths see the same random bytes."""
    rng = random.Random(1234)
    monkeypatch.setattr(os, "urandom", lambda n: rng.randbytes(n))
    monkeypatch.setattr(_accel, "NATIVE", native)
    with engram_mod.open(tmp_path / name, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add_many([{"id": f"d{i}", "content": text, "created_at": 0.0, "last_accessed": 0.0}
                     for i, text in enumerate(docs)])
        db.add(docs[0] + " again", id="single", now=1.0)  # the one-record path after a bulk one
        with db._store.read() as txn:
            tables = {table: list(txn.raw_items(table)) for table in TABLES}
        words = sorted({w for text in docs for w in text.split()})
        rankings = [[(h.id, h.score) for h in db.recall(" ".join(words[i:i + 3]), top_k=10, now=2.0)] for i in range(0, 30, 3)]
    monkeypatch.undo()
    return tables, rankings


@needs_native
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=st.lists(st.lists(st.sampled_from(
    "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega rivers running ran über café naïve 42 x"
    .split()), min_size=1, max_size=30).map(" ".join), min_size=1, max_size=60))
def test_files_written_both_ways_are_identical(tmp_path_factory, monkeypatch, docs) -> None:
    tmp_path = tmp_path_factory.mktemp("diff")
    native_tables, native_rank = _written(tmp_path, "native.engram", NATIVE, docs, monkeypatch)
    pure_tables, pure_rank = _written(tmp_path, "pure.engram", None, docs, monkeypatch)
    assert native_tables == pure_tables
    assert native_rank == pure_rank


@needs_native
@settings(max_examples=200, deadline=None)
@given(texts=st.lists(st.one_of(
    st.text(max_size=80),
    st.text(alphabet="abcXYZ _-.'0123\u00e9\u00fc\u2460\ufb01 ", max_size=60),
    st.lists(st.sampled_from(["the", "a", "of", "running", "Rivers", "x" * 17, "y" * 16, "z" * 9, "I", "ab", "\u00e9t\u00e9"]),
             max_size=12).map(" ".join)), max_size=30))
def test_word_scan_matches_the_numpy_scan(texts) -> None:
    results = both_ways(lambda: Tokenizer().encode_many(texts))
    (terms_a, ids_a, lens_a), (terms_b, ids_b, lens_b) = results
    assert terms_a == terms_b
    assert np.array_equal(ids_a, ids_b) and np.array_equal(lens_a, lens_b)
    reference = Tokenizer()
    pos = 0
    for text, n in zip(texts, lens_a.tolist()):
        assert [terms_a[i] for i in ids_a[pos:pos + n]] == reference(text)
        pos += n


@needs_native
def test_word_scan_at_chunk_scale() -> None:
    # thousands of distinct words: the scan's hash table grows several times
    rng = random.Random(5)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 20))) for _ in range(20000)]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 40))) for _ in range(5000)]
    results = both_ways(lambda: Tokenizer().encode_many(texts))
    assert results[0][0] == results[1][0]
    assert all(np.array_equal(a, b) for a, b in zip(results[0][1:], results[1][1:]))


def _plain_nodes() -> st.SearchStrategy[Node]:
    """Nodes a bulk load makes (the C encoder's common shape), and near misses of it."""
    zeros = st.sampled_from([0.0, -0.0, 1.5, -2.0, 1e300])
    return st.builds(
        lambda id_, content, created, last, same, spaces, extra: Node(
            id=id_, content=content, created_at=created, last_accessed=created if same else last,
            embeddings={name: np.ones(2, np.float32) for name in spaces}, **extra),
        st.text(min_size=1, max_size=40), st.one_of(st.text(max_size=60), st.text(min_size=2000, max_size=2100)),
        zeros, zeros, st.booleans(), st.lists(st.text(min_size=1, max_size=5), max_size=3, unique=True),
        st.sampled_from([{}, {}, {}, {"tags": ("t",)}, {"weight": -0.0}, {"tier": "warm"}, {"metadata": {"k": 1}},
                         {"importance": 0.5}, {"pinned": False}]))


@needs_native
@settings(max_examples=150, deadline=None)
@given(batch=st.lists(st.one_of(_plain_nodes(), nodes()), max_size=8))
def test_node_records_match_the_pure_path(batch) -> None:
    native, pure = both_ways(lambda: codec.encode_nodes(batch))
    assert native == pure
    assert [codec.decode_node(record, vectors=False).id for record in native] == [node.id for node in batch]


@needs_native
def test_node_records_of_a_text_msgpack_refuses() -> None:
    node = Node.from_fields({"id": "a", "content": "ok"})
    node.__dict__["content"] = "\ud800"  # a lone surrogate: msgpack cannot encode it, both paths say so
    for fn in both_ways(lambda: lambda: codec.encode_nodes([node])):
        with pytest.raises(ValidationError):
            fn()
    assert NATIVE.plain_records([node.__dict__], codec._PLAIN_NAMES, codec._PLAIN_DEFAULTS, 2048) == [None]


@needs_native
@settings(max_examples=100, deadline=None)
@given(rows=st.lists(st.fixed_dictionaries({
    "id": st.text(min_size=1, max_size=20), "content": st.text(max_size=30),
    "created_at": st.floats(allow_nan=False, allow_infinity=False),
    "last_accessed": st.floats(allow_nan=False, allow_infinity=False)}), min_size=1, max_size=10),
    vectors=st.booleans())
def test_new_nodes_match_the_pure_path(rows, vectors) -> None:
    if vectors:
        rows = [dict(row, embeddings={"s": np.full(3, i, np.float32)}) for i, row in enumerate(rows)]
    native, pure = both_ways(lambda: Node.from_fields_many(rows))
    assert native == pure
    assert [list(node.__dict__) for node in native] == [list(node.__dict__) for node in pure]
    assert all(type(node) is Node for node in native)
    # each node has its own metadata and embeddings dicts
    assert len({id(node.metadata) for node in native}) == len({id(node.embeddings) for node in native}) == len(native)


class _Str(str):
    pass


class _Float(float):
    pass


_column_values = st.one_of(
    st.text(max_size=3), st.sampled_from(["", "x" * 256, "x" * 257, _Str("s")]),
    st.floats(), st.sampled_from([0.0, 1.0, -0.0, 1.5, -1e-9, _Float(0.5), True]), st.integers(-2, 2), st.none())
_column_names = st.sampled_from(["id", "content", "quote", "source", "weight", "importance", "created_at",
                                 "last_accessed", "embeddings", "tags"])


_valid_values = {"id": st.text(min_size=1, max_size=5), "content": st.text(max_size=5), "quote": st.text(max_size=3),
                 "source": st.text(max_size=3), "importance": st.floats(0.0, 1.0), "embeddings": st.just({})}


@needs_native
@settings(max_examples=400, deadline=None)
@given(names=st.lists(_column_names, min_size=1, max_size=5, unique=True), nrows=st.integers(1, 6),
       change=st.sampled_from(["none", "value", "keys", "type"]), vectors_checked=st.booleans(), data=st.data())
def test_column_checks_match_the_pure_path(names, nrows, change, vectors_checked, data) -> None:
    """records._columns_pass gives the same verdict in C (one pass) and in Python: rows of
    valid values with one cell, one row's keys or one row's type changed (exact and
    subclassed types, empty and over-long ids, non-finite and out-of-range numbers)."""
    from collections import OrderedDict

    from engramdb import records
    rows = [{name: data.draw(_valid_values.get(name, st.floats(-1e9, 1e9))) for name in names} for _ in range(nrows)]
    i = data.draw(st.integers(0, nrows - 1))
    if change == "value":
        rows[i][data.draw(st.sampled_from(names))] = data.draw(_column_values)
    elif change == "keys":
        rows[i] = {name: data.draw(_column_values) for name in data.draw(st.lists(_column_names, max_size=5))}
    elif change == "type":
        rows[i] = OrderedDict(rows[i])
    native, pure = both_ways(lambda: records._columns_pass(rows, vectors_checked))
    assert native == pure


_BOUNDARY_VALUES = ["", "x", "x" * 256, "x" * 257, _Str("s"), 0.0, -0.0, 1.0, 1.0000001, -1e-300, 0.5, 2.0,
                    float("nan"), float("inf"), float("-inf"), _Float(0.5), True, 1, None, b"x"]


@needs_native
def test_column_checks_at_every_boundary() -> None:
    """Each field's column check in C and in Python, for each boundary value in one row of
    an otherwise valid bulk load (and the load itself, which passes)."""
    from engramdb import records
    base = {"id": "d", "content": "text", "quote": "q", "source": "s", "weight": 1.0, "importance": 0.5,
            "created_at": 0.0, "last_accessed": 0.0}
    rows = [dict(base, id=f"d{i}") for i in range(5)]
    assert both_ways(lambda: records._columns_pass(rows)) == [True, True]
    verdicts = set()
    for name in base:
        for value in _BOUNDARY_VALUES:
            changed = [dict(row) for row in rows]
            changed[3][name] = value
            native, pure = both_ways(lambda rows=changed: records._columns_pass(rows))
            assert native == pure, (name, value)
            verdicts.add(native)
    assert verdicts == {True, False}


@needs_native
@settings(max_examples=200, deadline=None)
@given(blocks=st.lists(st.tuples(st.integers(0, 40), st.sampled_from([2, 300, 70_000, 2**33]),
                                 st.sampled_from([3, 300, 70_000, 2**40])), max_size=12), seed=st.integers(0, 2**32 - 1))
def test_posting_blocks_match_the_pure_path(blocks, seed) -> None:
    rng = np.random.default_rng(seed)
    docnos = [np.cumsum(rng.integers(1, gap, size)).astype(np.uint64) for size, gap, _ in blocks]
    values = [rng.integers(1, top, size) for size, _, top in blocks]
    bounds = np.concatenate([[0], np.cumsum([size for size, _, _ in blocks], dtype=np.int64)]).astype(np.int64)
    flat_d = np.concatenate(docnos) if blocks else np.zeros(0, np.uint64)
    flat_v = np.concatenate(values) if blocks else np.zeros(0, np.int64)
    native, pure = both_ways(lambda: encode_blocks(flat_d, flat_v, bounds))
    assert native == pure
    for block, d, v in zip(native, docnos, values):
        got_d, got_v = decode_block(block)
        assert got_d.tolist() == d.tolist() and got_v.tolist() == v.tolist()


@needs_native
def test_posting_blocks_refuse_docnos_out_of_order() -> None:
    for fn in both_ways(lambda: lambda: encode_blocks(np.array([1, 5, 5], np.uint64), np.ones(3), np.array([0, 3]))):
        with pytest.raises(ValidationError, match="strictly increasing"):
            fn()
    assert NATIVE.posting_blocks(np.array([4, 2], np.uint64), np.ones(2, np.uint64), np.array([0, 2]), 96) is None


@needs_native
def test_word_scan_tells_apart_words_sharing_their_first_eight_bytes() -> None:
    words = ["abcdefgh", "abcdefghi", "abcdefghj", "abcdefghij", "abcdefgh" * 3, "abcdefgh" * 3 + "k", "ab", "abcdefg"]
    texts = [" ".join(words), " ".join(reversed(words)), "ABCDEFGHI abcdefghi"]
    found, inverse, firsts = NATIVE.scan_texts(texts, tokenize._BATCH_TABLE)
    assert found == words
    assert np.frombuffer(inverse, "=i8").tolist() == [*range(8), *reversed(range(8)), 1, 1]
    assert np.frombuffer(firsts, "=i8").tolist() == [0, 8, 16]


@needs_native
@settings(max_examples=150, deadline=None)
@given(docs=st.lists(st.lists(st.sampled_from("abcdefgh"), max_size=12), min_size=1, max_size=20),
       seed=st.integers(0, 2**32 - 1))
def test_count_postings_matches_the_pure_path(docs, seed) -> None:
    rng = random.Random(seed)
    docnos = rng.sample(range(1, 10 * len(docs) + 1), len(docs))  # any order, as a segment's documents come
    pairs = list(zip(docnos, docs))
    native, pure = both_ways(lambda: count_postings(TermDocs.from_pairs(pairs)))
    assert native[0] == pure[0]
    for a, b in zip(native[1:], pure[1:]):
        assert a.dtype == b.dtype and a.tolist() == b.tolist()


@needs_native
def test_count_postings_refuses_inconsistent_columns() -> None:
    ok = (np.array([0, 1, 0]), np.array([2, 1]), np.array([0, 1]), np.array([5, 7], np.uint64))
    assert NATIVE.count_postings(*ok, 2)[2] == np.array([0, 2, 3], np.int64).tobytes()
    with pytest.raises(ValueError):
        NATIVE.count_postings(ok[0], np.array([2, 2]), *ok[2:], 2)  # lengths beyond the tokens
    with pytest.raises(ValueError):
        NATIVE.count_postings(*ok, 1)  # a term id out of range
    with pytest.raises(ValueError):
        NATIVE.count_postings(ok[0], ok[1], np.array([0, 2]), ok[3], 2)  # not a permutation


# --- BM25 top()'s accumulate -------------------------------------------------------------

INDEX_DTYPES = [np.uint8, np.uint16, np.uint32, np.uint64, np.int32, np.int64]


@needs_native
@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(0, 300), extra=st.integers(0, 50), doc_dtype=st.sampled_from(INDEX_DTYPES),
       code_dtype=st.sampled_from([None] + INDEX_DTYPES), seed=st.integers(0, 2 ** 32 - 1))
def test_accumulate_equals_numpys_fancy_add_bit_for_bit(data, n, extra, doc_dtype, code_dtype, seed) -> None:
    """acc[docnos] += values[codes] (distinct docnos, as in one posting run), every dtype."""
    rng = np.random.default_rng(seed)
    size = n + extra + 1
    if doc_dtype == np.uint8:
        n, size = min(n, 256), min(size, 256)
    docnos = rng.choice(size, size=n, replace=False).astype(doc_dtype)
    if data.draw(st.booleans()):
        docnos.sort()
    nvalues = n if code_dtype is None else data.draw(st.integers(max(1, 0), 255))
    values = rng.standard_normal(nvalues) * 10.0 ** rng.integers(-8, 8, nvalues)
    codes = None if code_dtype is None else rng.integers(0, nvalues, n).astype(code_dtype)
    base = rng.standard_normal(size)
    expect, got = base.copy(), base.copy()
    expect[docnos] += values if codes is None else values[codes]
    assert NATIVE.accumulate(got, docnos, values, codes) is None
    assert got.tobytes() == expect.tobytes()


@needs_native
def test_accumulate_refuses_bad_input() -> None:
    acc, one = np.zeros(4), np.ones(1)
    bad = [
        ((acc, np.array([4], np.uint32), one, None), ValueError, "beyond the accumulator"),
        ((acc, np.array([-1]), one, None), ValueError, "negative"),
        ((acc, np.array([1]), np.ones(3), np.array([3], np.uint8)), ValueError, "beyond the values"),
        ((acc, np.array([1]), one, np.array([-2], np.int64)), ValueError, "negative"),
        ((acc, np.array([1, 2]), one, None), ValueError, "one value per docno"),
        ((acc, np.array([1, 2]), one, np.array([0], np.uint8)), ValueError, "one code per docno"),
        ((acc.astype(np.float32), np.array([1]), one, None), TypeError, "unsupported dtype"),
        ((acc, np.array([1]), one.astype(np.float32), None), TypeError, "unsupported dtype"),
        ((acc, np.array([1.0]), one, None), TypeError, "integer"),
        ((acc, np.array([True]), one, None), TypeError, "unsupported dtype"),
        ((acc, np.array([1]), one, [0]), TypeError, "codes must be a C-contiguous array"),
        ((np.zeros(8)[::2], np.array([1]), one, None), TypeError, "writable"),
        ((acc.reshape(2, 2), np.array([1]), one, None), TypeError, "1-d"),
        ((acc.astype(">f8"), np.array([1]), one, None), TypeError, "native"),
        ((bytes(32), np.array([1]), one, None), TypeError, "writable"),
    ]
    for args, error, message in bad:
        before = acc.copy()
        with pytest.raises(error, match=message):
            NATIVE.accumulate(*args)
        assert acc.tobytes() == before.tobytes()  # nothing added before the checks


@needs_native
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(corpus=st.lists(st.lists(st.sampled_from(["a1", "b2", "c3", "d4", "e5", "f6"]), max_size=8),
                       min_size=1, max_size=120),
       query=st.lists(st.sampled_from(["a1", "b2", "c3", "d4", "e5", "zz"]), min_size=2, max_size=4, unique=True),
       k=st.integers(1, 15), split=st.integers(1, 120), compact=st.booleans())
def test_top_ranks_identically_with_and_without_the_extension(tmp_path_factory, monkeypatch, corpus, query, k, split,
                                                               compact) -> None:
    """SegmentedBM25.top() through the extension's accumulate and through numpy: the same
    docnos and bit-identical scores (with small thresholds, runs also carry uint32 docnos
    and pair codes, as the long runs of a big file do)."""
    if compact:  # large segments (pair codes) and narrow docnos at test sizes
        monkeypatch.setattr(bm25, "SMALL_SEGMENT_DOCS", 8)
        monkeypatch.setattr(bm25, "_COMPACT_MIN", 4)
        monkeypatch.setattr(bm25, "_GROUPED_MIN", 4)
    store = Store.open(tmp_path_factory.mktemp("top") / "t.engram")
    store.sealer = Sealer(os.urandom(32))
    try:
        idx = bm25.SegmentedBM25(store.blind, store.last_txnid)
        docs = [(5 + 3 * i, toks) for i, toks in enumerate(corpus)]
        for chunk in (docs[:split], docs[split:]):
            if chunk:
                store.write(lambda txn, chunk=chunk: idx.apply(txn, chunk, []))
        with store.read() as txn:
            for ratio in (0.0, math.inf):  # with and without the lookup of the longest list
                monkeypatch.setattr(bm25, "LOOKUP_RATIO", ratio)
                (native_d, native_s), (pure_d, pure_s) = both_ways(lambda: idx.top(txn, query, k))
                assert native_d.tolist() == pure_d.tolist()
                assert native_s.tobytes() == pure_s.tobytes()
                full_d, full_s = bm25.top_k(*idx.scores(txn, query), k)
                assert native_d.tolist() == full_d.tolist() and native_s.tobytes() == full_s.tobytes()
    finally:
        store.close()
