"""A cached term's small-segment postings (its delta) follow the merges its handle committed
(spec/bm25.md, "Caches"): when a merge only moved the postings a delta holds, the delta is
relabelled (the same arrays), not rebuilt; whenever that is not shown (tombstones the entry
did not see, an update that re-added a docno, a new posting merged in, another handle's
merge, an older snapshot) it is rebuilt, and every answer equals a fresh handle's."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

from engramdb.index import bm25
from engramdb.index.bm25 import SegmentedBM25


WRITER = 0.25


def _fresh(store) -> SegmentedBM25:
    return SegmentedBM25(store.blind, store.last_txnid)


def _write(store, handle: SegmentedBM25, docs, removed=()) -> None:
    store.write(lambda txn: handle.apply(txn, docs, list(removed)))


def _entry(idx: SegmentedBM25, term: str):
    return idx.cache.get(("t", idx.blind(term)))


def _same_as_fresh(store, idx: SegmentedBM25, query, k: int = 30) -> list[tuple[int, float]]:
    with store.read() as txn:
        got = idx.search(txn, query, k)
        assert got == _fresh(store).search(txn, query, k)
    return got


def _segments(store, idx: SegmentedBM25) -> int:
    with store.read() as txn:
        return idx.layout(txn)["segments"]


def test_own_merge_relabels_the_deltas_it_only_moved(store):
    """Nine one-document commits, a query, then the tenth commit: the automatic merge moves
    the nine segments (and the new one) into one. The query terms' deltas are the same
    postings, relabelled: the same arrays, nothing rebuilt."""
    idx = _fresh(store)
    for n in range(1, 10):
        _write(store, idx, [(n, ["a", "b"] if n % 2 else ["a", "c"])])
    query = ["a", "b", "c"]
    _same_as_fresh(store, idx, query)
    olds = {t: _entry(idx, t) for t in query}
    _write(store, idx, [(10, ["z"])])
    assert _segments(store, idx) == 1  # the merge ran
    moved, built = idx.deltas_moved, idx.deltas_built
    _same_as_fresh(store, idx, query)
    assert idx.deltas_moved == moved + 3 and idx.deltas_built == built
    for t in query:
        assert _entry(idx, t).delta.docnos is olds[t].delta.docnos


def test_a_posting_merged_in_with_the_moved_ones_rebuilds_the_delta(store):
    """The tenth document holds the term too and is merged with the nine in the same commit:
    the merged segment holds one posting more than the delta, so it is rebuilt (the new
    document is found); the other term's delta is only moved."""
    idx = _fresh(store)
    for n in range(1, 10):
        _write(store, idx, [(n, ["a", "b"])])
    _same_as_fresh(store, idx, ["a", "b"])
    _write(store, idx, [(10, ["a", "a", "zz"])])
    assert _segments(store, idx) == 1
    moved, built = idx.deltas_moved, idx.deltas_built
    got = _same_as_fresh(store, idx, ["a", "b"])
    assert 10 in [docno for docno, _ in got]
    assert idx.deltas_moved == moved + 1 and idx.deltas_built == built + 1


def _three_doc_segments(store, idx: SegmentedBM25, n_segments: int = 9) -> None:
    for s in range(n_segments):  # three documents each: one tombstone leaves a segment mostly live
        _write(store, idx, [(3 * s + i, ["a", "b"]) for i in (1, 2, 3)])


def test_an_update_merged_away_with_its_tombstone_is_not_relabelled(store):
    """An update of document 5 (tf 1 -> 3) tombstones it in its segment and adds it again in
    a new one, and the automatic merge of the same commit takes both: the merged segment
    holds as many postings of the term as the cached delta, but the tombstone vanished into
    the merge, which the entry did not see: it is rebuilt, and document 5 scores with its
    new tf (relabelling would have kept the old one)."""
    idx = _fresh(store)
    _three_doc_segments(store, idx)
    before = dict(_same_as_fresh(store, idx, ["a"]))
    moved = idx.deltas_moved
    _write(store, idx, [(5, ["a", "a", "a", "b"])], [5])
    assert _segments(store, idx) == 1
    after = dict(_same_as_fresh(store, idx, ["a"]))
    assert after[5] != before[5] and idx.deltas_moved == moved


def test_a_tombstone_the_entry_saw_moves_with_the_merge(store):
    """A delete the cached entry already saw (its segment's tombstone count then equals the
    one the merge filtered) does not stop the relabelling; a delete it did not see does."""
    idx = _fresh(store)
    _three_doc_segments(store, idx)
    _write(store, idx, [], [5])  # no merge: the segment is two thirds live
    _same_as_fresh(store, idx, ["a", "b"])
    olds = {t: _entry(idx, t) for t in "ab"}
    _write(store, idx, [(100, ["z"])])  # the tenth segment: all merged, document 5 dropped
    assert _segments(store, idx) == 1
    moved, built = idx.deltas_moved, idx.deltas_built
    got = _same_as_fresh(store, idx, ["a", "b"])
    assert 5 not in [docno for docno, _ in got]
    assert idx.deltas_moved == moved + 2 and idx.deltas_built == built
    assert all(_entry(idx, t).delta.docnos is olds[t].delta.docnos for t in "ab")
    # the same, but the delete comes with the merging commit: the entries never saw it
    for n in range(200, 209):
        _write(store, idx, [(n, ["a"])])
    _same_as_fresh(store, idx, ["a", "b"])
    moved, built = idx.deltas_moved, idx.deltas_built
    _write(store, idx, [(300, ["z"])], [201])
    got = _same_as_fresh(store, idx, ["a", "b"])
    assert 201 not in [docno for docno, _ in got]
    assert idx.deltas_built == built + 1  # "a": its postings in 201's segment are one fewer


def test_a_merged_segment_merged_again_with_a_tombstone_is_not_followed(store):
    """The entry saw a delete in segment 1; the automatic merge moved segment 1 into M1 (the
    tombstone the entry saw: followed); then a delete in M1 and a forced merge of M1 with a
    new document holding the term into M2. M2 holds as many postings of the term as the
    entry (one gone, one new), but M1's tombstone was not the entry's: rebuilt."""
    idx = _fresh(store)
    for s in range(9):
        _write(store, idx, [(3 * s + i, ["a", "b"] if s == 0 else ["b"]) for i in (1, 2, 3)])
    _write(store, idx, [], [2])
    assert [d for d, _ in _same_as_fresh(store, idx, ["a"])] == [1, 3]
    _write(store, idx, [(100, ["z"])])  # ten segments: merged into M1 (the entry's tombstone)
    _write(store, idx, [], [1])  # M1's tombstone
    _write(store, idx, [(101, ["a"])])
    store.write(lambda txn: idx.merge(txn, 1, force=True))  # M1 and the new one: M2
    assert _segments(store, idx) == 1
    moved = idx.deltas_moved
    assert sorted(d for d, _ in _same_as_fresh(store, idx, ["a"])) == [3, 101]  # not 1, which relabelling kept
    assert idx.deltas_moved == moved


def test_a_merge_by_another_handle_is_not_followed(store):
    """The reading handle knows only its own merges: another handle's merge of the same
    segments makes it rebuild (and answer as a fresh handle does); a later merge of its
    own is followed again."""
    idx, writer = _fresh(store), _fresh(store)
    for n in range(1, 10):
        _write(store, idx, [(n, ["a", "b"])])
    _same_as_fresh(store, idx, ["a", "b"])
    _write(store, writer, [(10, ["z"])])  # the writer's merge
    assert _segments(store, idx) == 1
    moved, built = idx.deltas_moved, idx.deltas_built
    _same_as_fresh(store, idx, ["a", "b"])
    assert idx.deltas_moved == moved and idx.deltas_built == built + 2
    for n in range(11, 20):
        _write(store, idx, [(n, ["a"])])
    _same_as_fresh(store, idx, ["a", "b"])
    moved = idx.deltas_moved
    _write(store, idx, [(20, ["z"])])  # its own merge of the nine (and the new one)
    _same_as_fresh(store, idx, ["a", "b"])
    assert idx.deltas_moved == moved + 1  # "a"; "b" is in none of the merged segments


@pytest.mark.parametrize("seed", range(4))
def test_catch_up_through_merges_answers_as_a_fresh_handle_in_every_snapshot(store, seed):
    """A random history of small commits (adds, deletes, updates re-adding a docno), by the
    querying handle (whose merges it follows) and by another one, with explicit merges and
    purges; read transactions kept open on older states are queried after newer ones.
    Every answer equals a fresh handle's in the same snapshot, and relabelling through the
    handle's own merges did happen."""
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(30)]
    idx, writer = _fresh(store), _fresh(store)
    queries = [["w0"], ["w1", "w2"], ["w0", "w3", "w5"], {"w4": 2.0, "w1": 0.5}]
    live: set[int] = set()
    nxt = 1

    def doc() -> list[str]:
        return [words[int(i)] for i in rng.integers(0, len(words), size=int(rng.integers(1, 5)))]

    with contextlib.ExitStack() as stack:
        held: list[tuple[object, list]] = []
        for step in range(70):
            handle = writer if rng.random() < WRITER else idx
            op = rng.random()
            if op < 0.6 or not live:
                k = int(rng.integers(1, 3))
                _write(store, handle, [(nxt + i, doc()) for i in range(k)])
                live.update(range(nxt, nxt + k))
                nxt += k
            elif op < 0.75:
                victim = int(rng.choice(sorted(live)))
                _write(store, handle, [], [victim])
                live.discard(victim)
            elif op < 0.9:
                victim = int(rng.choice(sorted(live)))
                _write(store, handle, [(victim, doc())], [victim])  # an update: same docno, new segment
            elif op < 0.95:
                store.write(lambda txn, h=handle: h.merge(txn, 2))
            else:
                store.write(lambda txn, h=handle: h.purge(txn, 1))
            if step % 3 == 0:
                txn = stack.enter_context(store.read())
                fresh = _fresh(store)
                held.append((txn, [fresh.search(txn, q, 8) for q in queries]))
            with store.read() as txn:
                fresh = _fresh(store)
                for q in queries:
                    assert idx.search(txn, q, 8) == fresh.search(txn, q, 8), (step, q)
            for txn, want in held[-4:][::-1] if step % 4 == 0 else ():  # older snapshots, after the newer state
                for q, expect in zip(queries, want):
                    assert idx.search(txn, q, 8) == expect, (step, q)
    assert idx.deltas_moved > 0


class _Abort(Exception):
    pass


def test_a_merge_in_a_rolled_back_write_is_not_followed(store):
    """A merge recorded by a write transaction that rolls back never happened: its output's
    segment number is given to the next segment written (here another handle's document
    holding the term), and the segment it would have merged away is later merged elsewhere. Following the
    rolled-back record would relabel the entry's deleted posting as the new document's
    (records are kept only once the write commits: _Written, _adopt)."""
    idx, writer = _fresh(store), _fresh(store)
    _write(store, idx, [(1, ["a", "b"]), (2, ["b"])])  # segment X
    _write(store, idx, [(3, ["c"])])
    assert [d for d, _ in _same_as_fresh(store, idx, ["a"])] == [1]

    def merge_then_fail(txn):
        assert idx.merge_small(txn) == 1
        raise _Abort

    with pytest.raises(_Abort):
        store.write(merge_then_fail)
    _write(store, writer, [(9, ["a"])])  # takes the rolled-back merge's output number
    _write(store, writer, [], [1])  # X, half dead, is merged on its own into a segment without "a"
    with store.read() as txn:
        assert idx.layout(txn)["segments"] == 3
    assert [d for d, _ in _same_as_fresh(store, idx, ["a"])] == [9]


def test_the_merge_record_keeps_only_the_latest_merges(store, monkeypatch):
    """The handle's record of its merges is bounded (bm25._MERGES_KEPT, here 24 segments;
    the oldest are dropped): it never holds more, the latest merge is still followed once
    older ones were dropped, and every answer stays a fresh handle's."""
    monkeypatch.setattr(bm25, "_MERGES_KEPT", 24)
    idx = _fresh(store)
    for r in range(6):
        for n in range(1, 10):
            _write(store, idx, [(100 * r + n, ["a", "b"] if n % 3 else ["a", "c"])])
        _same_as_fresh(store, idx, ["a", "b", "c"])
        moved = idx.deltas_moved
        _write(store, idx, [(100 * r + 10, ["z"])])  # ten segments: merged into one
        assert len(idx._merged) <= 24
        _same_as_fresh(store, idx, ["a", "b", "c"])
        assert idx.deltas_moved == moved + 3
    assert len(idx._merged) < 6 * 10


@pytest.mark.parametrize("seed", range(3))
def test_small_segments_rolled_back_writes_and_rebuilds_answer_as_a_fresh_handle(store, monkeypatch, seed):
    """A random history with segments of at most four documents (tiers of them merged into
    larger ones), writes by another handle, writes that roll back after a merge, forced
    and small-segment merges, purges, rebuilds (a new epoch), a merge record of 3 segments;
    queries for k from 0 to past every posting, also on older snapshots after newer ones.
    Every answer equals a fresh handle's in the same snapshot."""
    monkeypatch.setattr(bm25, "SMALL_SEGMENT_DOCS", 4)
    monkeypatch.setattr(bm25, "AUTO_MERGE_MAX_DOCS", 4 * bm25.MERGE_FACTOR)
    monkeypatch.setattr(bm25, "_MERGES_KEPT", 3)
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(12)]
    idx, writer = _fresh(store), _fresh(store)
    queries = [["w0"], ["w1", "w2"], ["w0", "w3", "w5"], {"w4": 2.0, "w1": 0.5}]
    ks = (0, 1, 8, 70, 300)
    live: set[int] = set()
    nxt = 1

    def doc() -> list[str]:
        return [words[int(i)] for i in rng.integers(0, len(words), size=int(rng.integers(1, 5)))]

    def step_write(txn, handle: SegmentedBM25, op: float, abort: bool) -> None:
        nonlocal nxt
        if op < 0.55 or not live:
            k = int(rng.integers(1, 4))
            handle.apply(txn, [(nxt + i, doc()) for i in range(k)], [])
            if not abort:
                live.update(range(nxt, nxt + k))
                nxt += k
        elif op < 0.7:
            victim = int(rng.choice(sorted(live)))
            handle.apply(txn, [], [victim])
            if not abort:
                live.discard(victim)
        elif op < 0.85:
            victim = int(rng.choice(sorted(live)))
            handle.apply(txn, [(victim, doc())], [victim])  # an update: same docno, new segment
        elif op < 0.9:
            handle.merge(txn, 2)
        elif op < 0.93:
            handle.merge(txn, 1, force=True)
        elif op < 0.95:
            handle.merge_small(txn)
        elif op < 0.97:
            handle.rebuild(txn, [(v, ["w0", f"w{v % len(words)}"]) for v in sorted(live)])
        else:
            handle.purge(txn, 1)
        if abort:
            handle.merge(txn, 1, force=True)
            raise _Abort

    with contextlib.ExitStack() as stack:
        held: list[tuple[object, list]] = []
        for step in range(70):
            handle = writer if rng.random() < WRITER else idx
            op, abort = float(rng.random()), bool(rng.random() < 0.15)
            with contextlib.suppress(_Abort):
                store.write(lambda txn, h=handle, o=op, a=abort: step_write(txn, h, o, a))
            if step % 3 == 0:
                txn = stack.enter_context(store.read())
                fresh = _fresh(store)
                held.append((txn, [fresh.search(txn, q, k) for q in queries for k in ks]))
            with store.read() as txn:
                fresh = _fresh(store)
                for q in queries:
                    for k in ks:
                        assert idx.search(txn, q, k) == fresh.search(txn, q, k), (step, q, k)
            for txn, want in held[-3:][::-1] if step % 4 == 0 else ():
                assert [idx.search(txn, q, k) for q in queries for k in ks] == want, step
