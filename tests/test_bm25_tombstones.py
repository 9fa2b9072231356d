"""BM25 tombstones as runs (spec/bm25.md, "Writes, tombstones, merges"): the directory's
round trip, the migration of version-1 directories, counts of the work a delete does,
and that caches never serve a run from an aborted transaction."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import unpack_segments
from engramdb.crypto import Sealer
from engramdb.errors import CorruptFileError
from engramdb.index import bm25 as bm
from engramdb.index.bm25 import SegmentedBM25, encode_block
from engramdb.store import Store

WORDS = [f"w{i}" for i in range(30)]


def _docs(n: int, seed: int = 0, first: int = 1) -> list[tuple[int, list[str]]]:
    rng = random.Random(seed)
    return [(first + i, [rng.choice(WORDS) for _ in range(rng.randint(1, 8))]) for i in range(n)]


def _answers(store, idx) -> list:
    with store.read() as txn:
        return [idx.search(txn, [w, WORDS[(i * 7) % len(WORDS)]], 20) for i, w in enumerate(WORDS)]


def _rebuilt_answers(store, live) -> list:
    """The answers of an index built from scratch on the live documents, in the same file
    (the write is rolled back on purpose)."""
    fresh = SegmentedBM25(store.blind, store.last_txnid)

    class _Done(Exception):
        pass

    out = []

    def rebuild(txn):
        fresh.rebuild(txn, live)
        out.append([fresh.search(txn, [w, WORDS[(i * 7) % len(WORDS)]], 20) for i, w in enumerate(WORDS)])
        raise _Done

    with pytest.raises(_Done):
        store.write(rebuild)
    return out[0]


runs_strategy = st.dictionaries(
    st.integers(1, 50), st.lists(st.integers(1, 10_000), min_size=1, max_size=5), max_size=6)


@settings(max_examples=100, deadline=None)
@given(segs=st.dictionaries(st.integers(1, 50), st.tuples(st.integers(1, 10**6), st.integers(0, 10**8)), max_size=8),
       runs=runs_strategy, epoch=st.integers(0, 100), n=st.integers(0, 10**6), length=st.integers(0, 10**9))
def test_directory_round_trip(segs, runs, epoch, n, length):
    d = bm._Dir(epoch, 1000)
    d.n_docs, d.total_len = n, length
    d.segs = {s: [a, b] for s, (a, b) in segs.items()}
    numbers = iter(range(100, 1000))
    d.runs = {s: [[next(numbers), c] for c in counts] for s, counts in runs.items() if s in d.segs}
    back = bm._Dir.decode(d.encode())
    assert (back.epoch, back.next, back.n_docs, back.total_len) == (epoch, 1000, n, length)
    assert back.segs == d.segs
    assert back.runs == d.runs
    assert back.dead_counts() == {s: sum(c for _, c in r) for s, r in d.runs.items() if r}
    assert back.encode() == d.encode()


@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=64))
def test_garbage_directory_is_a_corrupt_file_error(data):
    try:
        bm._Dir.decode(bm._pack({"v": 2, "epoch": 0, "next": 5, "n": 0, "len": 0, "segs": [[1, 3, 3]],
                                 "runs": [[1, 9, 1]]}))  # a run numbered past `next`
    except CorruptFileError:
        pass
    else:
        raise AssertionError("a run numbered past next must be refused")
    try:
        bm._Dir.decode(data)
    except CorruptFileError:
        pass


def _v1_directory(d: bm._Dir, dead: dict[int, np.ndarray]) -> bytes:
    """What a version-1 writer stored: the tombstones inline."""
    return bm._pack({"v": 1, "epoch": d.epoch, "next": d.next, "n": d.n_docs, "len": d.total_len,
                     "segs": [[s, a, b] for s, (a, b) in sorted(d.segs.items())],
                     "dead": [[s, a.astype("<u8").tobytes()] for s, a in sorted(dead.items()) if a.size]})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31), kill=st.sets(st.integers(1, 60), max_size=30))
def test_version_1_directory_reads_and_migrates(tmp_path_factory, seed, kill):
    """A file written with inline tombstones (directory version 1) answers the same, and the
    next write stores them as runs (version 2) without changing an answer."""
    s = Store.open(tmp_path_factory.mktemp("v1") / "v1.engram")
    s.sealer = Sealer(b"\x07" * 32)
    try:
        docs = _docs(60, seed)
        idx = SegmentedBM25(s.blind, s.last_txnid)
        for start in (0, 20, 40):
            s.write(lambda txn, start=start: idx.apply(txn, docs[start:start + 20], [], auto_merge=False))
        s.write(lambda txn: idx.apply(txn, [], sorted(kill), auto_merge=False))
        expected = _answers(s, idx)

        def to_v1(txn):  # rewrite the directory as version 1, dropping the run records
            unpack_segments(txn)  # version 1 knew no packed segments
            d = bm._Dir.decode(txn.get("segments", bm.DIR_KEY))
            txn.rekey("postings", lambda key: key[4:] + key[:4])  # version 1 keyed postings term first
            dead = {}
            for segno, runs in d.runs.items():
                dead[segno] = np.sort(np.concatenate([bm.decode_block(txn.get("segments", bm._seg_key(b"d", r)))[0]
                                                      for r, _ in runs]))
                for r, _ in runs:
                    txn.delete("segments", bm._seg_key(b"d", r))
            txn.put("segments", bm.DIR_KEY, _v1_directory(d, dead))

        s.write(to_v1)
        for handle in (idx, SegmentedBM25(s.blind, s.last_txnid)):
            assert _answers(s, handle) == expected
        live = [(d, t) for d, t in docs if d not in kill]
        with s.read() as txn:
            assert idx.verify(txn, live) == []
        s.write(lambda txn: idx.merge(txn, 0))  # any write migrates, even one that merges nothing
        with s.read() as txn:
            raw = bm._unpack(txn.get("segments", bm.DIR_KEY))
            assert raw["v"] == 2 and "dead" not in raw
            assert idx.layout(txn)["dead_docs"] == len(kill)
        assert s.write(idx.migrate)  # a writable open converts the postings keys (version 3)
        with s.read() as txn:
            assert bm._unpack(txn.get("segments", bm.DIR_KEY))["v"] == 3
            assert idx.verify(txn, live) == []
        assert _answers(s, idx) == _answers(s, SegmentedBM25(s.blind, s.last_txnid)) == expected
        assert expected == _rebuilt_answers(s, live)
    finally:
        s.close()


def test_single_deletes_rewrite_logarithmically_many_tombstones(store):
    """Deleting one document per transaction: each tombstone is rewritten O(log dead)
    times in all (the old array rewrote every earlier tombstone on every delete), the
    segment keeps O(log dead) runs, and the directory record does not grow."""
    n, deletes = 3000, 1024
    idx = SegmentedBM25(store.blind, store.last_txnid)
    docs = _docs(n)
    store.write(lambda txn: idx.apply(txn, docs, []))
    victims = random.Random(5).sample(range(1, n + 1), deletes)
    sizes = []
    for i, docno in enumerate(victims):
        store.write(lambda txn, docno=docno: idx.apply(txn, [], [docno], auto_merge=False))
        with store.read() as txn:
            layout = idx.layout(txn)
            assert layout["dead_docs"] == i + 1
            assert layout["tombstone_runs"] <= math.log2(i + 1) + 1
            sizes.append(len(txn.get("segments", bm.DIR_KEY)))
    assert idx.runs_written == deletes
    # a binary counter: 1024 single tombstones are rewritten 1024 * (1 + log2(1024) / 2) times
    assert idx.tombstones_written <= deletes * (math.log2(deletes) / 2 + 1)
    assert max(sizes) <= min(sizes) + 16 * 11  # a few bytes per run listed, never per tombstone
    live = [(d, t) for d, t in docs if d not in set(victims)]
    with store.read() as txn:
        assert idx.verify(txn, live) == []
    assert _answers(store, idx) == _rebuilt_answers(store, live)


def test_bulk_delete_writes_each_tombstone_once(store):
    idx = SegmentedBM25(store.blind, store.last_txnid)
    docs = _docs(2000)
    store.write(lambda txn: idx.apply(txn, docs[:1000], []))
    store.write(lambda txn: idx.apply(txn, docs[1000:], []))
    victims = sorted(random.Random(2).sample(range(1, 2001), 200))
    store.write(lambda txn: idx.apply(txn, [], victims, auto_merge=False))
    assert idx.tombstones_written == 200  # one run per segment, nothing else rewritten
    assert idx.runs_written == 2
    live = [(d, t) for d, t in docs if d not in set(victims)]
    assert _answers(store, idx) == _rebuilt_answers(store, live)
    # deleting them again, or documents never indexed, marks nothing
    store.write(lambda txn: idx.apply(txn, [], victims + [5000], auto_merge=False))
    with store.read() as txn:
        assert idx.doc_count(txn) == 1800 and idx.layout(txn)["dead_docs"] == 200
        assert idx.verify(txn, live) == []


def test_aborted_tombstones_never_reach_a_cache(store):
    """A run written by a transaction that aborts is never cached: the next transaction
    reuses its number for other tombstones, and every handle answers as a fresh one."""
    idx = SegmentedBM25(store.blind, store.last_txnid)
    docs = _docs(200)
    store.write(lambda txn: idx.apply(txn, docs, []))
    store.write(lambda txn: idx.apply(txn, [], [1, 2, 3], auto_merge=False))
    _answers(store, idx)  # warm the read caches

    class _Abort(Exception):
        pass

    def doomed(txn):
        idx.apply(txn, [], list(range(10, 60)), auto_merge=False)
        idx.apply(txn, [(500, ["w1", "w2"])], [60, 61], auto_merge=False)  # reads its own runs back
        idx.merge(txn, 1)
        raise _Abort

    with pytest.raises(_Abort):
        store.write(doomed)
    store.write(lambda txn: idx.apply(txn, [], [100, 101], auto_merge=False))
    live = [(d, t) for d, t in docs if d not in {1, 2, 3, 100, 101}]
    assert _answers(store, idx) == _answers(store, SegmentedBM25(store.blind, store.last_txnid))
    assert _answers(store, idx) == _rebuilt_answers(store, live)
    with store.read() as txn:
        assert idx.verify(txn, live) == []


def test_verify_reports_a_damaged_run(store):
    idx = SegmentedBM25(store.blind, store.last_txnid)
    docs = _docs(50)
    store.write(lambda txn: idx.apply(txn, docs, []))
    store.write(lambda txn: idx.apply(txn, [], [4, 5], auto_merge=False))
    live = [(d, t) for d, t in docs if d not in (4, 5)]
    with store.read() as txn:
        (run, _), = bm._Dir.decode(txn.get("segments", bm.DIR_KEY)).runs[1]
    store.write(lambda txn: txn.put("segments", bm._seg_key(b"d", run), encode_block(np.asarray([4]), np.ones(1))))
    with store.read() as txn:
        assert any("tombstone run" in p for p in SegmentedBM25(store.blind, store.last_txnid).verify(txn, live))
