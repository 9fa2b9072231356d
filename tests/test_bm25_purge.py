"""Purging deleted documents from BM25 segments (spec/bm25.md, "Writes, tombstones,
merges"): a purge rewrites only the segments that hold tombstones, streams their postings
in bounded chunks, and leaves scores, statistics and rankings exactly those of an index
rebuilt from the live documents; ``compact()`` uses it instead of merging every segment."""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engramdb.engram as engram_mod
from conftest import rebuilt_answers, unpack_segments
from engramdb.crypto import KDFParams
from engramdb.errors import CorruptFileError
from engramdb.index import bm25 as bm
from engramdb.index.bm25 import SegmentedBM25

WORDS = [f"w{i}" for i in range(40)]


def _docs(n: int, seed: int, first: int) -> list[tuple[int, list[str]]]:
    rng = random.Random(seed)
    # a skewed vocabulary: a few terms in most documents, most in a few
    return [(first + i, [WORDS[min(int(rng.expovariate(0.15)), len(WORDS) - 1)] for _ in range(rng.randint(1, 9))])
            for i in range(n)]


QUERIES = [[w, WORDS[(i * 7) % len(WORDS)]] for i, w in enumerate(WORDS)]


def _answers(store, idx) -> list:
    with store.read() as txn:
        return [idx.search(txn, q, 25) for q in QUERIES] + [idx.stats(txn)]


def _rebuilt(store, live) -> list:
    return rebuilt_answers(store, live, QUERIES)


def _segments(store, idx) -> dict[int, list[int]]:
    with store.read() as txn:
        return dict(bm._Dir.decode(txn.get("segments", bm.DIR_KEY)).segs)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(1, 60), min_size=1, max_size=6), data=st.data(),
       chunk=st.sampled_from([1, 7, 64, 1 << 20]))
def test_purge_equals_a_rebuild_and_touches_only_segments_with_tombstones(store, monkeypatch, sizes, data, chunk):
    monkeypatch.setattr(bm, "MERGE_CHUNK_POSTINGS", chunk)
    idx = SegmentedBM25(store.blind, store.last_txnid)
    store.write(lambda txn: idx.rebuild(txn, []))
    live: dict[int, list[str]] = {}
    first = 1
    for k, n in enumerate(sizes):  # one segment per write (no automatic merge: fewer than 10)
        docs = _docs(n, k, first)
        first += n
        store.write(lambda txn, docs=docs: idx.apply(txn, docs, [], auto_merge=False))
        live.update(docs)
    # deletes and updates spread over the segments, in a few transactions
    for _ in range(data.draw(st.integers(1, 3))):
        if not live:
            break
        victims = data.draw(st.lists(st.sampled_from(sorted(live)), max_size=max(1, len(live) // 3), unique=True))
        updated = victims[: len(victims) // 3]
        new = [(docno, _docs(1, docno, docno)[0][1][::-1]) for docno in updated]
        store.write(lambda txn, v=victims, u=new: idx.apply(txn, u, v, auto_merge=False))
        for docno in victims:
            del live[docno]
        live.update(new)
    before = _segments(store, idx)
    with store.read() as txn:
        dead = bm._Dir.decode(txn.get("segments", bm.DIR_KEY)).dead_counts()
    expected = _rebuilt(store, sorted(live.items()))
    assert _answers(store, idx) == expected
    steps = 0
    while store.write(lambda txn: idx.purge(txn, 1)):
        steps += 1
        assert _answers(store, idx) == expected  # after every step, bit for bit
    after = _segments(store, idx)
    purged = set(dead)
    # the segments without tombstones are untouched, the others gone
    assert {s: v for s, v in before.items() if s not in purged} == {s: v for s, v in after.items() if s in before}
    assert not purged & set(after)
    assert steps <= len(purged) and len(after) <= len(before)
    with store.read() as txn:
        d = bm._Dir.decode(txn.get("segments", bm.DIR_KEY))
        assert not set(d.dead_counts()) & (set(after) - set(before))  # new segments hold no dead document
        assert idx.verify(txn, sorted(live.items())) == []
    if chunk < 1 << 20:  # a chunk closes at the first term boundary past the limit
        max_df = max((sum(1 for terms in live.values() if w in terms) for w in WORDS), default=0)
        assert idx.merge_chunk_postings < chunk + max_df + sum(dead.values())


def test_purge_streams_in_bounded_chunks(store, monkeypatch):
    """A purge of a 3,000-document segment holds at most about one chunk of postings at a
    time (counted), however large the segment, and writes the same blocks as one chunk."""
    idx = SegmentedBM25(store.blind, store.last_txnid)
    docs = [(i + 1, [f"t{(i * j) % 997}" for j in range(1, 12)]) for i in range(3000)]
    store.write(lambda txn: idx.rebuild(txn, docs))
    store.write(lambda txn: idx.apply(txn, [], list(range(1, 3001, 10))))
    expected = _rebuilt(store, [doc for doc in docs if (doc[0] - 1) % 10])
    monkeypatch.setattr(bm, "MERGE_CHUNK_POSTINGS", 500)
    assert store.write(lambda txn: idx.purge(txn, 5)) == 1
    with store.read() as txn:
        max_df = max(int(bm.decode_block(txn.get("postings", key))[0].size) for key in txn.keys("postings"))
    assert 500 <= idx.merge_chunk_postings < 500 + max_df  # about 30,000 postings in all
    assert _answers(store, idx) == expected
    assert store.write(lambda txn: idx.purge(txn, 5)) == 0  # nothing left


def test_purge_of_fully_dead_segments_deletes_them(store):
    idx = SegmentedBM25(store.blind, store.last_txnid)
    store.write(lambda txn: idx.rebuild(txn, _docs(20, 1, 1)))
    store.write(lambda txn: idx.apply(txn, _docs(20, 2, 21), [], auto_merge=False))
    store.write(lambda txn: idx.apply(txn, [], list(range(1, 21)), auto_merge=False))
    assert store.write(lambda txn: idx.purge(txn, 10)) == 1
    with store.read() as txn:
        d = bm._Dir.decode(txn.get("segments", bm.DIR_KEY))
        assert len(d.segs) == 1 and not d.dead_counts()
        keys = list(txn.keys("postings"))
    assert all(bm._SEG.unpack(key[:4])[0] in d.segs for key in keys)
    assert _answers(store, idx) == _rebuilt(store, _docs(20, 2, 21))


@pytest.mark.parametrize("packed", [True, False])
def test_purge_refuses_a_posting_outside_its_segment(store, packed):
    idx = SegmentedBM25(store.blind, store.last_txnid)
    store.write(lambda txn: idx.rebuild(txn, [(5, ["a", "b"]), (6, ["a"]), (7, ["b"])]))
    store.write(lambda txn: idx.apply(txn, [], [6]))
    if not packed:
        store.write(unpack_segments)

    def damage(txn):
        d = bm._Dir.decode(txn.get("segments", bm.DIR_KEY))
        segno = next(iter(d.segs))
        bad = bm.encode_block(np.array([5, 900]), np.array([1, 1]))
        if packed:
            key = bm._seg_key(bm.PACKED_PREFIX, segno)
            p = bm._Packed(txn.get("segments", key))
            blocks = [bad if b == idx.blind("a") else p.block(b) for b in p.blinds()]
            txn.put("segments", key, bm.encode_packed(p.blinds(), blocks))
        else:
            txn.put("postings", d.posting_key(idx.blind("a"), segno), bad)

    store.write(damage)
    with pytest.raises(CorruptFileError):
        store.write(lambda txn: idx.purge(txn, 1))


@settings(max_examples=40, deadline=None)
@given(blocks=st.lists(st.lists(st.integers(1, 1 << 40), min_size=0, max_size=30, unique=True), max_size=12))
def test_decode_blocks_equals_decode_block(blocks):
    datas = [bm.encode_block(np.array(sorted(b), dtype=np.uint64), np.arange(1, len(b) + 1)) for b in blocks]
    docnos, values, counts = bm.decode_blocks(datas)
    assert counts.tolist() == [len(b) for b in blocks]
    one = [bm.decode_block(data) for data in datas]
    assert docnos.tolist() == [x for d, _ in one for x in d.tolist()]
    assert values.tolist() == [x for _, v in one for x in v.tolist()]


def test_compact_after_a_big_delete_purges_without_a_global_merge(tmp_path, monkeypatch):
    """compact() after deleting 10 %: every deleted document leaves the postings, the
    segments are rewritten by tier (not all into one), and BM25 answers as a rebuild."""
    monkeypatch.setattr(bm, "SMALL_SEGMENT_DOCS", 20)  # segments of 30 and more are not small
    db = engram_mod.open(tmp_path / "a.engram", passphrase="pw", kdf=KDFParams.for_tests())
    try:
        rng = random.Random(3)
        for batch in range(12):  # 12 segments of 30: tier 1, ten of them merged by the policy
            db.add_many([{"id": f"m{batch}-{i}", "content": " ".join(rng.choice(WORDS) for _ in range(6))}
                         for i in range(30)], now=1.7e9)
        db.merge_indexes(0)
        with db._store.read() as txn:
            assert db.indexes.bm25.layout(txn)["segments"] >= 2
        victims = rng.sample(sorted(db.ids()), len(db) // 10)
        db.delete_many(victims)
        db.compact()
        with db._store.read() as txn:
            layout = db.indexes.bm25.layout(txn)
            answers = [db.indexes.bm25.search(txn, q, 25) for q in QUERIES]
        assert layout["dead_docs"] == 0 and layout["tombstone_runs"] == 0
        assert layout["segments"] >= 2  # purged by tier, not merged into one
        assert layout["live_docs"] == len(db) == 360 - len(victims)
        assert [str(p) for p in db.verify()] == []

        class _Done(Exception):
            pass

        def rebuild(txn):
            db.indexes.rebuild(txn)
            raise _Done([db.indexes.bm25.search(txn, q, 25) for q in QUERIES])

        with pytest.raises(_Done) as done:
            db._store.write(rebuild)
        assert answers == done.value.args[0]
    finally:
        db.close()


def test_merge_small_merges_only_the_small_segments(store, monkeypatch):
    """Compaction merges the small segments (at most SMALL_SEGMENT_DOCS documents) into one
    and leaves the large ones as they are; answers do not change."""
    monkeypatch.setattr(bm, "SMALL_SEGMENT_DOCS", 30)
    idx = SegmentedBM25(store.blind, store.last_txnid)
    store.write(lambda txn: idx.rebuild(txn, _docs(50, 0, 1)))
    first = 51
    for k, n in enumerate([5, 30, 12]):
        docs = _docs(n, k + 1, first)
        first += n
        store.write(lambda txn, docs=docs: idx.apply(txn, docs, [], auto_merge=False))
    store.write(lambda txn: idx.apply(txn, [], [3, 52, 60], auto_merge=False))
    live = [doc for doc in _docs(50, 0, 1) if doc[0] != 3]
    first = 51
    for k, n in enumerate([5, 30, 12]):
        live += [doc for doc in _docs(n, k + 1, first) if doc[0] not in (52, 60)]
        first += n
    expected = _rebuilt(store, live)
    before = _segments(store, idx)
    assert store.write(idx.merge_small) == 1
    after = _segments(store, idx)
    large = min(before)
    assert set(after) - {large} and after[large] == before[large] and len(after) == 2
    assert _answers(store, idx) == expected
    assert store.write(idx.merge_small) == 0  # one small segment left
