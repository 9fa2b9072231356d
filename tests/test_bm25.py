"""Segmented BM25: block codec, scoring against bm25s (the oracle), merges, tombstones, caches."""
from __future__ import annotations

import contextlib
import math
import os
import random
from collections import Counter

import bm25s
import numpy as np
import zstandard
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import unpack_segments
from engramdb.crypto import Sealer
from engramdb.errors import CorruptFileError, ValidationError
from engramdb.index import bm25 as bm
from engramdb.index.bm25 import (
    SegmentedBM25, count_postings, decode_block, encode_block, encode_blocks, plan_merge, top_k,
)
from engramdb.index.tokenize import Tokenizer
from engramdb.store import Store

# A small vendored corpus (written for this test; no external data).
CORPUS = """\
Caroline went to the LGBTQ support group on Tuesday and felt welcomed.
Melanie painted a sunrise over the lake last summer.
The support group meets every week in the community center downtown.
Caroline is researching adoption agencies because she wants to build a family.
Melanie ran a charity race for mental health awareness.
The lake was calm and the sunrise was orange and pink.
Caroline moved from Sweden four years ago to start a new life.
A counseling career interests Caroline; she wants to help trans youth.
Melanie's kids love camping in the mountains near the lake.
They roasted marshmallows and told stories around the campfire.
Caroline gave a talk at a school about her transition journey.
Melanie signed up for a pottery class and made a black and white bowl.
The pottery class is on Saturday mornings at the art studio.
Caroline's grandmother gave her a necklace from Sweden.
The necklace reminds Caroline of her roots and her family's love.
Melanie and her husband celebrated their anniversary with a dinner.
The dinner was at a small Italian restaurant near the harbor.
Caroline attended a pride parade with friends from the support group.
Melanie read a book about resilience that Caroline recommended.
The book club discussed the novel over coffee and cake.
Caroline plays the guitar and writes songs about acceptance.
Melanie plays the violin in a community orchestra.
The orchestra performed a concert in the park in July.
Caroline volunteered at a homeless shelter during the holidays.
Melanie took her children to the museum to see the dinosaur exhibit.
The museum trip ended with ice cream and a walk by the river.
Caroline's friends threw her a surprise birthday party.
Melanie baked a chocolate cake for the birthday party.
The party had music, dancing and a slideshow of old photos.
Caroline is applying to a master's program in counseling psychology.
Melanie started running every morning before work.
Running helps Melanie clear her mind and manage stress.
Caroline adopted a puppy named Oscar from the animal shelter.
Oscar the puppy loves chasing tennis balls in the backyard.
Melanie's daughter won a prize at the school science fair.
The science fair project was about solar energy and sunlight.
Caroline went hiking with friends and saw a waterfall.
The waterfall trail was steep but the view was worth it.
Melanie planted tomatoes and sunflowers in her garden this spring.
The garden attracts bees and butterflies all summer long.
Caroline joined a mentorship program for transgender teens.
Melanie painted a portrait of her family for the living room.
The painting of the lake won an award at the local art fair.
Caroline traveled to New York City for a counseling conference.
Melanie and Caroline talked about their plans for the summer.
The weather was rainy so they stayed inside and watched movies.
Caroline felt proud after finishing her first marathon.
Melanie's son learned to ride a bike without training wheels.
The bike ride along the beach was the highlight of the trip.
Caroline and Melanie promised to meet again next month.
""".splitlines()

TOKENIZE = Tokenizer(stemmer="english")


def _bm25s_scores(docs_tokens: list[list[str]], query: list[str]) -> np.ndarray:
    if not any(docs_tokens):  # bm25s cannot index a corpus without a single token
        return np.zeros(len(docs_tokens))
    retriever = bm25s.BM25(k1=1.2, b=0.75, method="lucene", dtype="float64")
    retriever.index(docs_tokens, show_progress=False)
    vocab = retriever.vocab_dict
    known = [t for t in query if t in vocab]
    if not known:
        return np.zeros(len(docs_tokens))
    return np.asarray(retriever.get_scores(known), dtype=np.float64)


def _index(store, docs: list[tuple[int, list[str]]], batches: list[int], deletes=()) -> SegmentedBM25:
    idx = SegmentedBM25(store.blind, store.last_txnid)
    pos = 0
    for n in batches:
        chunk = docs[pos:pos + n]
        pos += n
        store.write(lambda txn, chunk=chunk: idx.apply(txn, chunk, []))
    if deletes:
        store.write(lambda txn: idx.apply(txn, [], list(deletes)))
    return idx


def _check_oracle(store, idx, live: list[tuple[int, list[str]]], queries: list[list[str]], k: int = 10) -> None:
    docnos = np.asarray([d for d, _ in live], dtype=np.uint64)
    for query in queries:
        expected = _bm25s_scores([t for _, t in live], query)
        with store.read() as txn:
            got_docs, got_scores = idx.scores(txn, query)
            hits = idx.search(txn, query, k)
        full = np.zeros(len(live))
        pos = np.searchsorted(docnos, got_docs)
        full[pos] = got_scores
        assert np.max(np.abs(full - expected), initial=0.0) < 1e-6
        matched = expected > 0
        assert set(got_docs.tolist()) == set(docnos[matched].tolist())
        # The same top k as bm25s: scores that differ only by float summation order (1e-9)
        # are ties, which engramdb breaks by docno.
        want = sorted(((round(float(expected[i]), 9), -int(docnos[i])) for i in range(len(live)) if matched[i]),
                      reverse=True)[:k]
        assert [d for d, _ in hits] == [-d for _, d in want]


def test_vendored_corpus_matches_bm25s(store):
    docs = [(i + 1, TOKENIZE(text)) for i, text in enumerate(CORPUS)]
    idx = _index(store, docs, [1, 1, 7, 13, 28])
    queries = [TOKENIZE(q) for q in (
        "Caroline support group", "sunrise over the lake", "pottery class Saturday", "birthday party cake",
        "running running marathon", "counseling career", "nothing matches zebra", "the a of",
    )]
    _check_oracle(store, idx, docs, queries)
    with store.read() as txn:
        assert idx.verify(txn, docs) == []


def test_pinned_scores_on_the_vendored_corpus(store):
    """Scores written down once (bm25s 0.3, lucene, k1=1.2, b=0.75, float64) so a change in
    the scoring shows up even if the oracle library changes."""
    docs = [(i + 1, TOKENIZE(text)) for i, text in enumerate(CORPUS)]
    idx = _index(store, docs, [50])
    with store.read() as txn:
        hits = idx.search(txn, TOKENIZE("sunrise over the lake"), 3)
    assert [d for d, _ in hits] == [2, 6, 20]
    pinned = [3.8449172898401787, 2.8016898498226146, 1.370697682204623]
    assert np.allclose([s for _, s in hits], pinned, rtol=0, atol=1e-9)


def test_deletes_and_updates_are_tombstones_applied_at_query_time(store):
    docs = [(i + 1, TOKENIZE(text)) for i, text in enumerate(CORPUS)]
    idx = _index(store, docs, [10, 10, 30], deletes=[2, 6, 43, 44])
    live = [(d, t) for d, t in docs if d not in (2, 6, 43, 44)]
    # an update: same docno, new text, in a later segment
    new_text = TOKENIZE("Melanie painted the lake at sunrise again")
    store.write(lambda txn: idx.apply(txn, [(7, new_text)], [7]))
    live = [(d, new_text if d == 7 else t) for d, t in live]
    _check_oracle(store, idx, live, [TOKENIZE("sunrise lake"), TOKENIZE("Caroline Sweden")])
    with store.read() as txn:
        assert idx.doc_count(txn) == len(live)
        assert idx.verify(txn, live) == []
        found = {d for d, _ in idx.search(txn, TOKENIZE("sunrise lake painting new york"), 100)}
    assert not found & {2, 6, 43, 44}


def test_merges_drop_tombstones_and_keep_scores(store):
    docs = [(i + 1, TOKENIZE(text)) for i, text in enumerate(CORPUS)]
    idx = SegmentedBM25(store.blind, store.last_txnid)
    for d in docs:  # one segment per transaction, no automatic merging
        store.write(lambda txn, d=d: idx.apply(txn, [d], [], auto_merge=False))
    store.write(lambda txn: idx.apply(txn, [], [3, 4, 5], auto_merge=False))
    live = [(d, t) for d, t in docs if d not in (3, 4, 5)]
    queries = [TOKENIZE("support group"), TOKENIZE("lake sunrise painting"), TOKENIZE("party cake")]
    with store.read() as txn:
        before = [idx.search(txn, q, 10) for q in queries]
    steps = store.write(lambda txn: idx.merge(txn, 100))
    assert steps >= 5  # 50 one-doc segments: tier-0 groups of 10, then the dead ones
    with store.read() as txn:
        assert [idx.search(txn, q, 10) for q in queries] == before
        assert idx.verify(txn, live) == []
    store.write(lambda txn: idx.merge(txn, 10, force=True))
    with store.read() as txn:
        d = bm._Dir.decode(txn.get("segments", bm.DIR_KEY))
        assert len(d.segs) == 1 and not d.dead_counts() and not d.runs
        assert [idx.search(txn, q, 10) for q in queries] == before
        assert idx.verify(txn, live) == []
    _check_oracle(store, idx, live, queries)


def test_auto_merge_keeps_segment_count_logarithmic(store):
    idx = SegmentedBM25(store.blind, store.last_txnid)
    for i in range(250):
        store.write(lambda txn, i=i: idx.apply(txn, [(i + 1, [f"w{i % 7}", "common"])], []))
    with store.read() as txn:
        d = bm._Dir.decode(txn.get("segments", bm.DIR_KEY))
        assert len(d.segs) < 3 * bm.MERGE_FACTOR
        assert idx.doc_count(txn) == 250
        assert len(idx.search(txn, ["common"], 1000)) == 250


vocab = st.sampled_from([f"t{i}" for i in range(25)])
corpora = st.lists(st.lists(vocab, max_size=12), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(corpus=corpora, seed=st.integers(0, 2**32 - 1), query=st.lists(vocab, min_size=1, max_size=5))
def test_generated_corpora_match_bm25s(tmp_path_factory, corpus, seed, query):
    path = tmp_path_factory.mktemp("gen") / "g.engram"
    store = Store.open(path)
    store.sealer = Sealer(os.urandom(32))
    try:
        rng = random.Random(seed)
        docnos = sorted(rng.sample(range(1, 10 * len(corpus) + 1), len(corpus)))
        docs = list(zip(docnos, corpus))
        batches, left = [], len(docs)
        while left:
            n = rng.randint(1, left)
            batches.append(n)
            left -= n
        deletes = [d for d in docnos if rng.random() < 0.2]
        idx = _index(store, docs, batches, deletes)
        live = [(d, t) for d, t in docs if d not in deletes]
        if rng.random() < 0.5:
            store.write(lambda txn: idx.merge(txn, 5, force=True))
        if live:
            _check_oracle(store, idx, live, [query])
        with store.read() as txn:
            assert idx.verify(txn, live) == []
    finally:
        store.close()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 2**63), max_size=60, unique=True).map(sorted),
       st.data())
def test_block_round_trip(docnos, data):
    tfs = data.draw(st.lists(st.integers(1, 2**40), min_size=len(docnos), max_size=len(docnos)))
    blob = encode_block(np.asarray(docnos, dtype=np.uint64), np.asarray(tfs, dtype=np.uint64))
    got_docs, got_tfs = decode_block(blob)
    assert got_docs.tolist() == docnos and got_tfs.tolist() == tfs


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=80))
def test_garbage_blocks_raise_corrupt_file_error_only(blob):
    try:
        docnos, tfs = decode_block(blob)
    except CorruptFileError:
        return
    assert docnos.size == tfs.size


def test_block_codec_rejects_bad_input():
    with pytest.raises(ValidationError):
        encode_block(np.asarray([3, 2], dtype=np.uint64), np.asarray([1, 1]))
    with pytest.raises(ValidationError):
        encode_block(np.asarray([1, 2], dtype=np.uint64), np.asarray([1]))
    good = encode_block(np.arange(1, 200, dtype=np.uint64), np.ones(199, dtype=np.uint64))
    assert good[0] == bm.BLOCK_ZSTD
    for bad in (good[:3], bytes([9]) + good[1:], good[:-2], good[:1] + b"\xff" + good[2:]):
        with pytest.raises(CorruptFileError):
            decode_block(bad)


def test_blocks_below_256_bytes_stay_raw_and_old_small_zstd_blocks_still_read():
    """Writers compress a block's body from 256 bytes (96 before session 5: those small
    zstd blocks are in older files and must still decode)."""
    docnos, tfs = np.arange(1, 101, dtype=np.uint64), np.ones(100, dtype=np.uint64)  # a 200-byte body
    raw = encode_block(docnos, tfs)
    assert raw[0] == bm.BLOCK_RAW
    body = raw[bm._HEAD.size:]
    old = bytes([bm.BLOCK_ZSTD]) + raw[1:bm._HEAD.size] + zstandard.ZstdCompressor(level=1).compress(body)
    for block in (raw, old):
        got_d, got_v = decode_block(block)
        assert got_d.tolist() == docnos.tolist() and got_v.tolist() == tfs.tolist()
    assert encode_block(np.arange(1, 129, dtype=np.uint64), np.ones(128, dtype=np.uint64))[0] == bm.BLOCK_ZSTD


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.sampled_from([0.5, 1.0, 2.0, 3.0])), max_size=40, unique_by=lambda x: x[0]),
       st.integers(0, 12))
def test_top_k_is_exact_with_ties(pairs, k):
    docnos = np.asarray([p[0] for p in pairs], dtype=np.uint64)
    scores = np.asarray([p[1] for p in pairs], dtype=np.float64)
    got_d, got_s = top_k(docnos, scores, k)
    want = sorted(pairs, key=lambda p: (-p[1], p[0]))[:k]
    assert got_d.tolist() == [p[0] for p in want]
    assert got_s.tolist() == [p[1] for p in want]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(vocab, max_size=8), max_size=20))
def test_count_postings_inverts_documents(corpus):
    docs = [(100 - i, toks) for i, toks in enumerate(corpus)]  # docnos given in descending order
    words, docnos, tfs, bounds = count_postings(docs)
    assert words == sorted({t for toks in corpus for t in toks})
    assert len(bounds) == len(words) + 1 and bounds[-1] == docnos.size
    blocks = encode_blocks(docnos, tfs, bounds)
    for j, w in enumerate(words):
        want = sorted((d, Counter(toks)[w]) for d, toks in docs if w in toks)
        a, b = bounds[j], bounds[j + 1]
        assert list(zip(docnos[a:b].tolist(), tfs[a:b].tolist())) == want
        got_d, got_t = decode_block(blocks[j])
        assert list(zip(got_d.tolist(), got_t.tolist())) == want


def test_plan_merge_policy():
    segs = {i: [1, 5] for i in range(1, 10)}
    assert plan_merge(segs, {}) is None
    segs[10] = [1, 5]
    assert plan_merge(segs, {}) == list(range(1, 11))
    big = {1: [100, 500], 2: [4, 20]}
    assert plan_merge(big, {1: np.arange(60, dtype=np.uint64)}) == [1]  # mostly dead: rewrite alone


def test_query_weights_and_errors(store):
    docs = [(i + 1, TOKENIZE(text)) for i, text in enumerate(CORPUS)]
    idx = _index(store, docs, [50])
    with store.read() as txn:
        doubled = idx.search(txn, {"lake": 2.0, "sunris": 1.0}, 5)
        repeated = idx.search(txn, ["lake", "lake", "sunris"], 5)
        assert doubled == repeated
        for bad in (0, -1.0, float("nan"), True):
            with pytest.raises(ValidationError):
                idx.scores(txn, {"lake": bad})
        assert idx.search(txn, [], 5) == []
        assert idx.search(txn, ["lake"], 0) == []


def test_a_second_handle_sees_commits_and_drops_stale_cache(store, tmp_path):
    other = Store.open(tmp_path / "raw.engram")  # shares the environment, has its own caches
    other.sealer = store.sealer
    try:
        writer = SegmentedBM25(store.blind, store.last_txnid)
        reader = SegmentedBM25(other.blind, other.last_txnid)
        store.write(lambda txn: writer.apply(txn, [(1, ["apple"]), (2, ["pear"])], []))
        with other.read() as txn:
            assert [d for d, _ in reader.search(txn, ["apple"], 5)] == [1]
        store.write(lambda txn: writer.apply(txn, [(3, ["apple", "apple"])], [1]))
        with other.read() as txn:
            assert [d for d, _ in reader.search(txn, ["apple"], 5)] == [3]
        store.write(lambda txn: writer.rebuild(txn, [(5, ["apple"])]))
        with other.read() as txn:
            assert [d for d, _ in reader.search(txn, ["apple"], 5)] == [5]
    finally:
        other.close()


@pytest.mark.parametrize("packed", [True, False])
def test_verify_reports_damage_and_rebuild_repairs(store, packed):
    docs = [(i + 1, TOKENIZE(text)) for i, text in enumerate(CORPUS[:10])]
    _index(store, docs, [5, 5])
    if packed:  # a packed segment's record loses its last block's last byte
        with store.read() as txn:
            key = next(iter(txn.keys("segments", bm.PACKED_PREFIX)))
            data = txn.get("segments", key)
        store.write(lambda txn: txn.put("segments", key, data[:-1]))
    else:  # the layout engramdb wrote before 2026-12-01: a term's block goes missing
        store.write(unpack_segments)
        with store.read() as txn:
            key = next(iter(txn.keys("postings")))
        store.write(lambda txn: txn.delete("postings", key))
    fresh = SegmentedBM25(store.blind, store.last_txnid)
    with store.read() as txn:
        problems = fresh.verify(txn, docs)
    assert problems and all(p.startswith("bm25:") for p in problems)
    store.write(lambda txn: fresh.rebuild(txn, docs))
    with store.read() as txn:
        assert fresh.verify(txn, docs) == []
        assert fresh.verify(txn, docs[:-1])  # a missing record is reported too
    _check_oracle(store, fresh, docs, [TOKENIZE("Caroline support")])


def test_corrupt_directory_is_a_clean_error(store):
    idx = SegmentedBM25(store.blind, store.last_txnid)
    store.write(lambda txn: txn.put("segments", bm.DIR_KEY, b"\xc1garbage"))
    with store.read() as txn:
        with pytest.raises(CorruptFileError):
            idx.search(txn, ["x"], 3)
        assert idx.verify(txn, [])[0].startswith("bm25:")
    store.write(lambda txn: idx.rebuild(txn, [(1, ["x"])]))
    with store.read() as txn:
        assert idx.search(txn, ["x"], 3)[0][0] == 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(corpus=st.lists(st.lists(st.sampled_from(["a1", "b2", "c3", "d4", "e5"]), max_size=6), min_size=1, max_size=30),
       query=st.dictionaries(st.sampled_from(["a1", "b2", "c3", "d4", "e5", "zz"]),
                             st.sampled_from([0.4, 1.0, 2.0]), min_size=1),
       k=st.integers(1, 12), split=st.integers(1, 30))
def test_fast_top_equals_full_scores_with_ties(tmp_path_factory, corpus, query, k, split):
    """Few distinct terms make many exact ties: top() must break them exactly like top_k."""
    store = Store.open(tmp_path_factory.mktemp("top") / "t.engram")
    store.sealer = Sealer(os.urandom(32))
    try:
        idx = _index(store, [(5 + 3 * i, toks) for i, toks in enumerate(corpus)],
                     [min(split, len(corpus)), max(0, len(corpus) - split)])
        with store.read() as txn:
            full_d, full_s = top_k(*idx.scores(txn, query), k)
            for ratio in (0.0, bm.LOOKUP_RATIO, math.inf):  # always / sometimes / never probe the longest list
                with _lookup_ratio(ratio):
                    fast_d, fast_s = idx.top(txn, query, k)
                assert fast_d.tolist() == full_d.tolist()
                assert fast_s.tolist() == full_s.tolist()  # bit-identical sums
    finally:
        store.close()


@contextlib.contextmanager
def _lookup_ratio(ratio):
    saved = bm.LOOKUP_RATIO
    bm.LOOKUP_RATIO = ratio
    try:
        yield
    finally:
        bm.LOOKUP_RATIO = saved


def test_cached_term_ranking_serves_any_depth(tmp_path):
    """A term's best documents are cached TERM_TOP_CACHED deep; a deeper top() recomputes them."""
    store = Store.open(tmp_path / "deep.engram")
    store.sealer = Sealer(os.urandom(32))
    try:
        n = bm.TERM_TOP_CACHED * 3
        docs = [(i + 1, ["common"] * (1 + i % 4) + ["filler"] * (i % 7) + (["rare"] if i % 5 == 0 else []))
                for i in range(n)]
        idx = _index(store, docs, [n // 2, n - n // 2])
        with store.read() as txn:
            for query in (["common"], ["common", "rare"], {"common": 0.5}):
                for k in (3, bm.TERM_TOP_CACHED + 5, n + 10, 7):
                    fast_d, fast_s = idx.top(txn, query, k)
                    full_d, full_s = top_k(*idx.scores(txn, query), k)
                    assert fast_d.tolist() == full_d.tolist()
                    assert fast_s.tolist() == full_s.tolist()
    finally:
        store.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(corpus=st.lists(st.lists(st.sampled_from(["a1", "b2", "c3", "d4", "e5"]), max_size=6), min_size=1, max_size=30),
       query=st.dictionaries(st.sampled_from(["a1", "b2", "c3", "d4", "e5", "zz"]),
                             st.sampled_from([0.4, 1.0, 2.0]), min_size=1),
       split=st.integers(1, 30), deletes=st.sets(st.integers(0, 29), max_size=8),
       probe=st.lists(st.integers(0, 100), max_size=20).map(sorted))
def test_coverage_with_and_without_masses_matches_a_reference(tmp_path_factory, corpus, query, split, deletes, probe):
    """coverage() and ceiling() from idf_mass() passed as masses= equal the plain calls bit for
    bit, and coverage equals sum w * idf over the terms each probed live docno holds (docnos
    below, between and beyond the postings; base and delta runs; tombstones)."""
    store = Store.open(tmp_path_factory.mktemp("cov") / "t.engram")
    store.sealer = Sealer(os.urandom(32))
    # the second commit's segment is small (a delta run), the first one's large (base) when it holds more
    split = min(split, len(corpus))
    saved, bm.SMALL_SEGMENT_DOCS = bm.SMALL_SEGMENT_DOCS, len(corpus) - split
    try:
        docs = [(5 + 3 * i, toks) for i, toks in enumerate(corpus)]
        dead = sorted(5 + 3 * i for i in deletes if i < split)  # of the first commit
        idx = _index(store, docs[:split], [split])
        with store.read() as txn:  # caches the first segments' postings: later ones become delta runs
            idx.coverage(txn, query, probe)
        store.write(lambda txn: idx.apply(txn, docs[split:], dead))
        live = {d: set(toks) for d, toks in docs if d not in dead}
        with store.read() as txn:
            masses = idx.idf_mass(txn, query)
            n = idx.doc_count(txn)
            assert idx.ceiling(txn, query, masses=masses) == idx.ceiling(txn, query)
            got = idx.coverage(txn, query, probe, masses=masses).tolist()
            assert got == idx.coverage(txn, query, probe).tolist()
        if n:
            df = {t: sum(t in toks for toks in live.values()) for t in query}
            assert {t: m for t, (m, _) in masses.items()} == {t: query[t] * bm._idf(n, df[t]) for t in sorted(query)}
        want = [0.0] * len(probe)
        for t in sorted(query):
            for i, d in enumerate(probe):
                if t in live.get(d, ()):
                    want[i] += masses[t][0]
        assert got == want
    finally:
        bm.SMALL_SEGMENT_DOCS = saved
        store.close()
