"""The bulk-ingest fast paths equal the one-at-a-time paths they replace: batch tokenizing,
the precomputed-pad HMAC, batch sealing, batch puts with their state digests, add_many."""
from __future__ import annotations

import hmac
import os
import random

import numpy as np
import pytest
from conftest import NOW, nodes
from hypothesis import given, settings
from hypothesis import strategies as st

from engramdb import codec
from engramdb.crypto import HmacSha256, Sealer
from engramdb.errors import DuplicateIdError, ValidationError
from engramdb.index.bm25 import TermDocs, count_postings
from engramdb.index import tokenize as tk
from engramdb.index.tokenize import Tokenizer
from engramdb.records import NODE_FIELDS, Node

WORDS = ["Running", "runs", "the", "Café", "naïve", "ÉCOLE", "東京", "x", "42", "it's", "New-York", "and",
         "ＦＵＬＬ", "ﬁle", "über", "MOVED", "a", "I", "dog_s", "\x00", "ab\x00cd", "\t\n", "Ⅻ", "ǅ", "İstanbul"]
texts = st.lists(st.sampled_from(WORDS) | st.text(max_size=12), max_size=12).map(" ".join)
TOKENIZERS = [Tokenizer(stemmer="english"), Tokenizer(stemmer=None), Tokenizer(stemmer=None, stopwords="none"),
              Tokenizer(stemmer="english", normalize=None)]


@settings(max_examples=100, deadline=None)
@given(st.lists(texts, max_size=6), st.sampled_from(range(len(TOKENIZERS))), st.sampled_from([1, 2, 1024]))
def test_encode_many_equals_tokenizing_each_text(batch, which, chunk):
    tok = TOKENIZERS[which]
    saved, tk._CHUNK_DOCS = tk._CHUNK_DOCS, chunk  # also across chunk boundaries
    try:
        terms, term_ids, lengths = tok.encode_many(batch)
    finally:
        tk._CHUNK_DOCS = saved
    want = [tok(text) for text in batch]
    assert terms == sorted({t for doc in want for t in doc})
    assert lengths.tolist() == [len(doc) for doc in want]
    assert [terms[i] for i in term_ids.tolist()] == [t for doc in want for t in doc]


def test_encode_many_checks_types_and_handles_empty():
    tok = Tokenizer()
    assert tok.encode_many([])[0] == []
    terms, ids, lengths = tok.encode_many(["", "the a"])
    assert terms == [] and ids.size == 0 and lengths.tolist() == [0, 0]
    with pytest.raises(Exception, match="can only tokenize strings"):
        tok.encode_many(["ok", 3])


@settings(max_examples=50, deadline=None)
@given(st.lists(texts, max_size=8))
def test_term_docs_from_tokenizer_invert_like_pairs(batch):
    tok = Tokenizer()
    docnos = [100 - 3 * i for i in range(len(batch))]  # descending docnos
    flat = count_postings(TermDocs(docnos, *tok.encode_many(batch)))
    pairs = count_postings([(d, tok(t)) for d, t in zip(docnos, batch)])
    assert flat[0] == pairs[0]
    for a, b in zip(flat[1:], pairs[1:]):
        assert a.tolist() == b.tolist()


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=0, max_size=100), st.binary(max_size=200))
def test_hmac_sha256_equals_hmac_digest(key, msg):
    mac = HmacSha256(key)
    assert mac.digest(msg) == hmac.digest(key, msg, "sha256")
    assert mac.digests([msg, b"", msg + b"x"]) == [hmac.digest(key, m, "sha256") for m in (msg, b"", msg + b"x")]


def test_blind_many_and_state_terms_equal_one_at_a_time():
    sealer = Sealer(os.urandom(32))
    values = [b"", b"a", os.urandom(40)]
    assert sealer.blind_many(b"id", values) == [sealer.blind(b"id", v) for v in values]
    pairs = [(b"k%d" % i, os.urandom(30 + i)) for i in range(5)]
    assert sealer.state_terms(b"ids", pairs) == sum(sealer.state_term(b"ids", k, e) for k, e in pairs) % 2**256
    assert sealer.state_term(b"ids", b"k", b"e") == int.from_bytes(
        hmac.digest(sealer.state_key, b"ids\x00k" + __import__("hashlib").sha256(b"e").digest(), "sha256"), "big")


@pytest.mark.parametrize("encrypted", [True, False])
def test_seal_many_envelopes_open(encrypted):
    sealer = Sealer(os.urandom(32)) if encrypted else Sealer(None, plain_blind_key=os.urandom(32))
    items = [(b"k%d" % i, os.urandom(i)) for i in range(20)]
    envelopes = sealer.seal_many(b"nodes", items, 3)
    assert [sealer.open(b"nodes", k, e) for (k, _), e in zip(items, envelopes)] == [v for _, v in items]
    if encrypted:
        assert len({e[5:17] for e in envelopes}) == len(items)  # a fresh nonce each
        assert sealer.seal_many(b"nodes", [], 0) == []


def test_put_many_keeps_digests_and_epochs(tmp_engram):
    store = tmp_engram._store
    store.epoch_limit = 7  # roll the sealing epoch in the middle of a batch
    items = [(b"a%02d" % i, b"v%d" % i) for i in range(20)]
    store.write(lambda txn: txn.put_many("sources", items))
    # overwrites, a key repeated inside one batch, and new keys, mixed
    again = [(b"a03", b"x"), (b"b1", b"y"), (b"a03", b"z"), (b"a19", b"w")]
    store.write(lambda txn: txn.put_many("sources", again))
    with store.read() as txn:
        assert txn.get("sources", b"a03") == b"z" and txn.get("sources", b"b1") == b"y"
        assert txn.count("sources") == 21
        assert txn.state.epoch >= 3
    assert tmp_engram.verify() == []  # the sealed per-table digests match the entries


def test_add_many_refuses_duplicates_before_writing(tmp_engram):
    tmp_engram.add_many(["first"], now=NOW)
    first = tmp_engram.ids()
    for batch in ([{"id": "x", "content": "a"}, {"id": "x", "content": "b"}],
                  [{"id": "y", "content": "a"}, {"id": first[0], "content": "b"}]):
        with pytest.raises(DuplicateIdError), tmp_engram.transaction():
            tmp_engram.add_many(batch, now=NOW)
        # a caught error inside a transaction leaves nothing behind
        with tmp_engram.transaction(), pytest.raises(DuplicateIdError):
            tmp_engram.add_many(batch, now=NOW)
        assert tmp_engram.ids() == first
    ids = tmp_engram.add_many([{"id": f"n{i}", "content": f"note {i}"} for i in range(50)], now=NOW)
    assert ids == [f"n{i}" for i in range(50)]
    assert tmp_engram.get("n7").content == "note 7"
    assert [n.id for n, _ in [(tmp_engram.get(i), 0) for i in ids]] == ids
    with tmp_engram._store.read() as txn:
        assert codec.from_u64(txn.get("ids", tmp_engram._id_key("n0"))) == 2  # docnos follow the batch order


def test_insert_many_refuses_an_existing_key(tmp_engram):
    from engramdb.errors import CorruptFileError

    store = tmp_engram._store
    store.write(lambda txn: txn.insert_many("sources", [(b"k1", b"a"), (b"k2", b"b")]))
    with pytest.raises(CorruptFileError):
        store.write(lambda txn: txn.insert_many("sources", [(b"k3", b"c"), (b"k2", b"d")]))
    with store.read() as txn:
        assert [k for k, _ in txn.items("sources")] == [b"k1", b"k2"]


def test_add_many_refuses_an_id_stored_by_an_earlier_batch(tmp_engram):
    tmp_engram.add_many([{"id": f"n{i}", "content": f"note {i}"} for i in range(5)], now=NOW)
    with pytest.raises(DuplicateIdError, match="n3"):
        tmp_engram.add_many([{"id": f"m{i}", "content": "x"} for i in range(9)] + [{"id": "n3", "content": "y"}], now=NOW)
    assert len(tmp_engram) == 5


def test_add_many_through_map_growth_replays_batches(make_db):
    db = make_db("grow.engram", map_size=1 << 20)  # 1 MiB: the batch outgrows it several times
    before = db._store.env_info()["map_size"]
    # unique words enough that the nodes and ids alone outgrow the map (small segments' postings
    # are one packed record each, much smaller than a record per term)
    texts = [f"memory number {i} about topic {i % 97} and more words {i * 7} {i * 11} {i * 13} {i * 17} {i * 19}"
             for i in range(3000)]
    with db.transaction():  # no up-front reserve here: the map grows mid-transaction, replaying batches
        ids = db.add_many([{"id": f"m{i}", "content": t} for i, t in enumerate(texts[:1500])], now=NOW)
        ids += db.add_many([{"id": f"m{i}", "content": t} for i, t in enumerate(texts) if i >= 1500], now=NOW)
    assert db._store.env_info()["map_size"] > before
    grown = db._store.env_info()["map_size"]
    db.add_many([f"more {i}" for i in range(5000)], now=NOW)  # reserved up front
    assert db._store.env_info()["map_size"] > grown and len(db) == 8000
    assert db.get(ids[2999]).content == texts[2999]
    assert db.verify() == []


@settings(max_examples=100, deadline=None)
@given(nodes())
def test_node_from_fields_equals_the_constructor(node):
    data = {name: getattr(node, name) for name in NODE_FIELDS}
    built = Node.from_fields(data)
    assert built == Node(**data) and list(vars(built)) == list(vars(node))
    assert Node.from_fields({"id": "a"}) == Node(id="a")
    with pytest.raises(ValidationError):
        Node.from_fields({"content": "no id"})
    with pytest.raises(ValidationError):
        Node.from_fields({"id": "a", "colour": "red"})


def test_add_many_restores_the_garbage_collector_state(tmp_engram):
    import gc

    assert gc.isenabled()
    tmp_engram.add_many(["one", "two"], now=NOW)
    assert gc.isenabled()
    with pytest.raises(DuplicateIdError):
        tmp_engram.add_many([{"id": "z", "content": "a"}, {"id": "z", "content": "b"}], now=NOW)
    assert gc.isenabled()
    gc.disable()
    try:
        tmp_engram.add_many(["three"], now=NOW)
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()


def test_pop_many_returns_and_removes_with_digests(tmp_engram):
    store = tmp_engram._store
    store.write(lambda txn: txn.insert_many("sources", [(b"k%d" % i, b"v%d" % i) for i in range(6)]))
    got = store.write(lambda txn: txn.pop_many("sources", [b"k1", b"nope", b"k4", b"k1"]))
    assert got == [b"v1", None, b"v4", b"v1"]  # a repeated key: read before anything is removed
    assert store.write(lambda txn: txn.pop("sources", b"k2")) == b"v2"
    with store.read() as txn:
        assert [k for k, _ in txn.items("sources")] == [b"k0", b"k3", b"k5"]
    assert tmp_engram.verify() == []


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(1, 2**40), st.integers(1, 2**33)), max_size=40), max_size=8))
def test_decode_blocks_equals_decode_block(raw_blocks):
    from engramdb.index.bm25 import decode_block, decode_blocks, encode_block

    blocks = []
    for rows in raw_blocks:
        rows = sorted(dict(rows).items())  # strictly increasing docnos
        blocks.append(encode_block(np.asarray([r[0] for r in rows], np.uint64), np.asarray([r[1] for r in rows])))
    docnos, values, counts = decode_blocks(blocks)
    want = [decode_block(b) for b in blocks]
    assert counts.tolist() == [w[0].size for w in want]
    assert docnos.tolist() == [x for w in want for x in w[0].tolist()]
    assert values.tolist() == [x for w in want for x in w[1].tolist()]


def test_decode_blocks_rejects_what_decode_block_rejects():
    from engramdb.errors import CorruptFileError
    from engramdb.index.bm25 import decode_blocks, encode_block

    good = encode_block(np.asarray([3, 9], np.uint64), np.asarray([1, 2]))
    repeated = bytes([1]) + (2).to_bytes(4, "little") + bytes([1, 1, 3, 0, 1, 1])  # docno deltas 3, 0
    for bad in (good[:3], good[:-1], b"\x09" + good[1:], good[:6] + b"\x00" + good[7:], repeated):
        with pytest.raises(CorruptFileError):
            decode_blocks([good, bad])



@pytest.mark.parametrize("n", [0, 1, 255, 256, 3000])
def test_sorted_id_rows_equals_sorting_the_pairs(n):
    rng = random.Random(n)
    # random keys, and keys that share their first 8 bytes (the sort's second column decides)
    keys = {rng.randbytes(16) if i % 3 else rng.choice([bytes(8), b"\xff" * 8]) + rng.randbytes(8) for i in range(n)}
    id_keys = sorted(keys)
    rng.shuffle(id_keys)
    for first in (0, 2**40):
        docnos = range(first, first + len(id_keys))
        assert codec.sorted_id_rows(id_keys, docnos) == sorted(zip(id_keys, map(codec.u64, docnos)))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.binary(min_size=16, max_size=16), unique=True, max_size=300))
def test_blind_order_is_the_sorted_order(blinds):
    from engramdb.index.bm25 import _blind_order

    assert [blinds[i] for i in _blind_order(blinds)] == sorted(blinds)


def test_blind_all_is_blind_of_each(tmp_engram):
    bm25 = tmp_engram.indexes.bm25
    terms = ["alpha", "beta", "über", "alpha", "x" * 40]
    want = [tmp_engram._store.blind(b"term", t.encode("utf-8", "surrogatepass")) for t in terms]
    bm25.blind("beta")  # one memoised already
    assert bm25.blind_all(terms) == want
    assert bm25.blind_all([]) == []


def test_stemming_a_batch_is_stemming_each_word():
    tok, ref = Tokenizer(stemmer="english"), Tokenizer(stemmer="english")
    words = ["running", "rivers", "caresses", "ponies", "running", "generously", "naïve"]
    tok.stem("rivers")  # one in the memo already
    assert tok._stem_all(words) == {w: ref.stem(w) for w in words}
    saved, tk._STEM_CACHE_MAX = tk._STEM_CACHE_MAX, 3  # a full memo is cleared, results unchanged
    try:
        assert tok._stem_all(words) == {w: ref.stem(w) for w in words}
        assert len(tok._memo) <= 3
    finally:
        tk._STEM_CACHE_MAX = saved


@settings(max_examples=40, deadline=None)
@given(stored=st.sets(st.integers(0, 60), max_size=20), batch=st.sets(st.integers(0, 60), min_size=1, max_size=30),
       chunk=st.sampled_from([1, 3, 1024]))
def test_insert_new_inserts_all_or_returns_the_stored_keys_and_writes_nothing(tmp_path_factory, stored, batch, chunk):
    """Txn.insert_new (add_many's duplicate-id check folded into the ids insert): either
    every key is new and all are written, or it returns exactly the stored ones and the
    table, its state digest and the docno counter are as before (also across chunks)."""
    from engramdb import store as store_mod

    store = store_mod.Store.open(tmp_path_factory.mktemp("insnew") / "raw.engram")
    store.sealer = Sealer(b"\x07" * 32)
    try:
        key = lambda i: i.to_bytes(16, "big")  # noqa: E731
        if stored:
            store.write(lambda txn: txn.insert_many("ids", [(key(i), codec.u64(i)) for i in sorted(stored)]))
        with store.read() as txn:
            before = (list(txn.items("ids")), {t: list(v) for t, v in txn.state.digests.items()}, txn.state.next_docno)
        old = store_mod._INSERT_CHUNK
        store_mod._INSERT_CHUNK = chunk
        try:
            def run(txn):
                docnos = txn.allocate_docnos(len(batch))
                taken = txn.insert_new("ids", [(key(i), codec.u64(i)) for i in sorted(batch)])
                if taken:
                    txn.release_docnos(docnos)
                return taken
            taken = store.write(run)
        finally:
            store_mod._INSERT_CHUNK = old
        both = {key(i) for i in batch & stored}
        assert bool(taken) == bool(both) and set(taken) <= both
        with store.read() as txn:
            after = (list(txn.items("ids")), {t: list(v) for t, v in txn.state.digests.items()}, txn.state.next_docno)
        if taken:
            assert after == before
        else:
            assert [(k, codec.from_u64(v)) for k, v in after[0]] == [(key(i), i) for i in sorted(stored | batch)]
            assert after[1]["ids"][0] == len(stored | batch) and after[2] == before[2] + len(batch)
    finally:
        store.close()


def test_a_caught_duplicate_leaves_the_counters_and_digests_as_before(tmp_engram):
    tmp_engram.add_many([{"id": f"n{i}", "content": f"note {i}"} for i in range(3)], now=NOW)
    with tmp_engram.transaction():
        with pytest.raises(DuplicateIdError, match="n1"):
            tmp_engram.add_many([{"id": "m0", "content": "x"}, {"id": "n1", "content": "y"}], now=NOW)
        tmp_engram.add_many([{"id": "m1", "content": "z"}], now=NOW)
    with tmp_engram._store.read() as txn:
        assert codec.from_u64(txn.get("ids", tmp_engram._id_key("m1"))) == 4  # the failed batch's docnos given back
        assert txn.get("ids", tmp_engram._id_key("m0")) is None
    assert tmp_engram.verify() == []
    assert sorted(tmp_engram.ids()) == ["m1", "n0", "n1", "n2"]
