"""The decoded-postings cache (spec/bm25.md, "Caches"): it survives commits (a commit that
adds a segment decodes only that segment's blocks), it stays within its byte limit, and
cached answers always equal a fresh handle's, also when another process commits."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import engramdb
from conftest import RAW_KEY
from engramdb.cache import ENTRY_OVERHEAD, LRUCache, mb_to_bytes
from engramdb.crypto import Sealer
from engramdb.errors import ValidationError
from engramdb.index.bm25 import SMALL_SEGMENT_DOCS, SegmentedBM25
from engramdb.store import Store

KEY = RAW_KEY  # conftest's `store` fixture seals with it: the writer process must too
WORDS = [f"w{i}" for i in range(40)]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _doc(rng: np.random.Generator, n: int = 12) -> list[str]:
    return [WORDS[int(i)] for i in rng.zipf(1.3, size=n) % len(WORDS)]


def _answer(idx: SegmentedBM25, txn, query) -> list[tuple[int, float]]:
    return idx.search(txn, query, 7)


def _fresh(store) -> SegmentedBM25:
    return SegmentedBM25(store.blind, store.last_txnid)


# --- the LRU itself ----------------------------------------------------------------------


def test_lru_evicts_least_recently_used_and_stays_within_its_limit():
    cache = LRUCache(3 * (100 + ENTRY_OVERHEAD))
    for key in "abc":
        cache.put(key, key.upper(), 100)
    assert cache.get("a") == "A"  # a is now the most recently used
    cache.put("d", "D", 100)
    assert "b" not in cache and cache.keys() == ["c", "a", "d"]
    assert cache.nbytes == 3 * (100 + ENTRY_OVERHEAD) and cache.evictions == 1
    cache.put("huge", "X", 10_000)  # larger than the whole limit: not kept, nothing evicted
    assert "huge" not in cache and len(cache) == 3
    cache.put("a", "A2", 50)  # replacing re-charges
    assert cache.get("a") == "A2" and cache.nbytes == 2 * (100 + ENTRY_OVERHEAD) + 50 + ENTRY_OVERHEAD
    assert cache.pop("a") == "A2" and cache.pop("a", 7) == 7
    cache.clear()
    assert cache.nbytes == 0 and len(cache) == 0
    assert LRUCache(0).max_bytes == 0 and mb_to_bytes(None, 2) == 2 << 20 and mb_to_bytes(-1, 2) == 0


def test_open_checks_cache_mb(tmp_path):
    with pytest.raises(ValidationError) as err:
        engramdb.open(tmp_path / "x.engram", encrypted=False, cache_mb=-1)
    assert "cache_mb" in str(err.value) and err.value.hint
    with pytest.raises(ValidationError):
        engramdb.open(tmp_path / "x.engram", encrypted=False, cache_mb="64")
    with engramdb.open(tmp_path / "x.engram", encrypted=False, cache_mb=0.25) as db:
        assert db.indexes.bm25.cache.max_bytes == 1 << 18
        assert db.indexes.cache_mb == 0.25
    with engramdb.open(tmp_path / "x.engram", encrypted=False) as db:
        assert db.indexes.bm25.cache.max_bytes == 64 << 20


# --- work after a commit -----------------------------------------------------------------


def test_a_commit_decodes_only_the_new_segments_blocks(store):
    """A reader (not the handle that wrote) decodes the new segment's blocks of the query
    terms and nothing else; the writing handle decodes nothing at all: it keeps the small
    segments it committed as it wrote them, and the directory too."""
    rng = np.random.default_rng(3)
    idx, writer = _fresh(store), _fresh(store)
    big = [(i + 1, _doc(rng)) for i in range(SMALL_SEGMENT_DOCS + 50)]  # one large segment
    store.write(lambda txn: writer.apply(txn, big, []))
    small = [(len(big) + 1 + i, _doc(rng)) for i in range(5)]
    for doc in small:  # five small segments
        store.write(lambda txn, doc=doc: writer.apply(txn, [doc], []))
    query = ["w0", "w1", "w5", "w9"]
    with store.read() as txn:
        idx.search(txn, query, 10)
        writer.search(txn, query, 10)
    before, wrote = idx.blocks_decoded, writer.blocks_decoded
    with store.read() as txn:
        idx.search(txn, query, 10)
    assert idx.blocks_decoded == before  # warm: nothing decoded
    nxt = len(big) + len(small) + 1
    store.write(lambda txn: writer.apply(txn, [(nxt, ["w0", "w5", "zz"])], []))  # one new segment, 2 query terms
    with store.read() as txn:
        got = idx.search(txn, query, 10)
        assert idx.blocks_decoded - before == 2  # the new segment's blocks of w0 and w5, nothing else
        assert got == _fresh(store).search(txn, query, 10)
        assert writer.search(txn, query, 10) == got
        assert writer.blocks_decoded == wrote  # its own commit: nothing read back
        assert writer._dir is not None and writer._txnid == txn.snapshot_id  # the directory adopted
    # a commit holding none of the query terms decodes nothing
    before = idx.blocks_decoded
    store.write(lambda txn: writer.apply(txn, [(nxt + 1, ["zz", "yy"])], []))
    with store.read() as txn:
        assert idx.search(txn, query, 10) == _fresh(store).search(txn, query, 10)
    assert idx.blocks_decoded == before


def test_an_aborted_write_leaves_nothing_to_adopt(store):
    """Only a commit hands the written segment and directory to the read path: a write
    that rolls back leaves the handle reading the file (the next commit reuses the segment
    number with other postings)."""
    idx = _fresh(store)
    store.write(lambda txn: idx.apply(txn, [(1, ["w0", "w1"]), (2, ["w1"])], []))

    def fail(txn):
        idx.apply(txn, [(3, ["w0", "w0", "w0"])], [])
        raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        store.write(fail)
    store.write(lambda txn: idx.apply(txn, [(3, ["w1", "w2"])], []))
    with store.read() as txn:
        for q in (["w0"], ["w1"], ["w2"], ["w0", "w1", "w2"]):
            assert idx.search(txn, q, 5) == _fresh(store).search(txn, q, 5)


def test_merges_of_small_segments_never_reread_the_large_ones(store):
    """Ten one-document commits trigger an automatic merge of the small segments: the
    term's large segment is not decoded again (only the merged segment's block is)."""
    rng = np.random.default_rng(4)
    idx = _fresh(store)
    big = [(i + 1, _doc(rng) + ["w0"]) for i in range(SMALL_SEGMENT_DOCS + 10)]
    store.write(lambda txn: idx.apply(txn, big, []))
    with store.read() as txn:
        idx.search(txn, ["w0"], 10)
    start = idx.blocks_decoded
    for i in range(25):
        store.write(lambda txn, i=i: idx.apply(txn, [(len(big) + 1 + i, ["w0", "w3"])], []))
        with store.read() as txn:
            assert idx.search(txn, ["w0", "w3"], 10) == _fresh(store).search(txn, ["w0", "w3"], 10)
    with store.read() as txn:
        assert idx.layout(txn)["segments"] < 25  # merges did run
    # w0: one block per new or merged small segment; w3 read once in full, then the same
    assert idx.blocks_decoded - start < 3 * 25


def test_catching_up_relabels_what_did_not_change_however_old_the_entry(store):
    """After commits and automatic merges of small segments, a term's cached postings are
    brought to the new state without rebuilding what did not change, however many states
    old the entry is: the large segments' run is kept as it is (the same object), and a
    term in none of the new segments keeps its entry as it is (no copy, no relabelling);
    only a term the new segments hold gets a new delta. Counts work (objects built), not
    time."""
    rng = np.random.default_rng(11)
    idx = _fresh(store)
    big = [(i + 1, _doc(rng) + ["w0", "w1"]) for i in range(SMALL_SEGMENT_DOCS + 10)]
    store.write(lambda txn: idx.apply(txn, big, []))
    query = ["w0", "w1", "w2"]
    with store.read() as txn:
        idx.search(txn, query, 10)
    start = idx.blocks_decoded

    def entry(term):
        return idx.cache.get(("t", idx.blind(term)))

    nxt = len(big) + 1
    for rounds in range(1, 25):  # merges run every MERGE_FACTOR commits; entries get older by `rounds` states
        olds = {t: entry(t) for t in query}
        runs, deltas = idx.runs_built, idx.deltas_built
        for _ in range(rounds % 3 + 1):  # one to three commits between two queries
            store.write(lambda txn, n=nxt: idx.apply(txn, [(n, ["w0", "zz"])], []))
            nxt += 1
        with store.read() as txn:
            assert idx.search(txn, query, 10) == _fresh(store).search(txn, query, 10)
        assert idx.runs_built == runs  # no large segment came or changed
        assert all(entry(t).base is olds[t].base for t in query)
        assert entry("w1") is olds["w1"] and entry("w2") is olds["w2"]  # served as they are
        assert entry("w0").delta is not olds["w0"].delta and idx.deltas_built == deltas + 1  # w0's only
    with store.read() as txn:
        assert idx.layout(txn)["segments"] < 25  # merges did run
    assert idx.blocks_decoded == start  # its own commits and merges: nothing read back
    # a tombstone in the large segment: the base is brought up to date (not read again), and
    # the answers still equal a fresh handle's
    store.write(lambda txn: idx.apply(txn, [], [3]))
    before = idx.blocks_decoded
    with store.read() as txn:
        assert idx.search(txn, query, 10) == _fresh(store).search(txn, query, 10)
        assert 3 not in [docno for docno, _ in idx.search(txn, ["w0"], 10_000)]
    assert idx.blocks_decoded == before


def test_own_commit_prepares_the_next_states_view_from_memory(store):
    """The handle that commits makes the new state's catch-up view (small segments with
    their term sets, tombstones) in the commit's hook when all of it is in memory, so the
    next query does not; when a tombstone run it wrote is not decoded yet, the first query
    makes it. Answers equal a fresh handle's either way."""
    rng = np.random.default_rng(12)
    idx = _fresh(store)
    docs = [(i + 1, _doc(rng)) for i in range(SMALL_SEGMENT_DOCS + 10)]
    store.write(lambda txn: idx.apply(txn, docs, []))
    query = ["w0", "w1", "w4"]
    with store.read() as txn:
        idx.search(txn, query, 10)
    nxt = len(docs) + 1
    store.write(lambda txn: idx.apply(txn, [(nxt, ["w0", "w4"])], []))
    view = idx._dir.view
    assert view is not None and [s for s, _ in view.small] == [s for s in sorted(idx._dir.segs)
                                                                 if idx._dir.segs[s][0] <= SMALL_SEGMENT_DOCS]
    with store.read() as txn:
        assert idx.search(txn, query, 10) == _fresh(store).search(txn, query, 10)
        assert idx._dir.view is view  # the query used it
    store.write(lambda txn: idx.apply(txn, [(nxt + 1, ["w1"])], [5, nxt]))  # its tombstone runs: not decoded yet
    assert idx._dir.view is None
    with store.read() as txn:
        assert idx.search(txn, query, 10) == _fresh(store).search(txn, query, 10)
        assert idx._dir.view is not None and set(idx._dir.view.dead) == {s for s in idx._dir.segs
                                                                         if idx._dir.dead_count(s)}
    store.write(lambda txn: idx.apply(txn, [(nxt + 2, ["w1", "w4"])], []))  # the runs are decoded now
    assert idx._dir.view is not None
    with store.read() as txn:
        assert idx.search(txn, query, 10) == _fresh(store).search(txn, query, 10)


def test_tombstones_and_updates_after_caching(store):
    rng = np.random.default_rng(5)
    idx = _fresh(store)
    docs = [(i + 1, _doc(rng)) for i in range(SMALL_SEGMENT_DOCS + 20)]
    store.write(lambda txn: idx.apply(txn, docs, []))
    queries = [["w0"], ["w1", "w2"], ["w3", "w0", "w7"]]
    for _ in range(6):
        with store.read() as txn:
            for q in queries:
                assert _answer(idx, txn, q) == _answer(_fresh(store), txn, q)
        victims = [int(x) for x in rng.choice(len(docs), size=5, replace=False) + 1]
        updated = [(v, _doc(rng)) for v in victims[:2]]  # an update: same docno, new segment
        store.write(lambda txn, v=victims, u=updated: idx.apply(txn, u, v))
    store.write(lambda txn: idx.merge(txn, 5, force=True))
    with store.read() as txn:
        for q in queries:
            assert _answer(idx, txn, q) == _answer(_fresh(store), txn, q)


@pytest.mark.parametrize("small", [None, 1])
def test_an_older_snapshot_queried_after_a_newer_one_answers_for_its_own_state(store, monkeypatch, small):
    """A read transaction still on an older snapshot, queried after a newer state cached
    the term, must not be served the newer entry: a delete the old snapshot does not see
    once dropped a live document there and changed the other one's score (the cached
    entry was served as it was whenever the old state had no tombstones at all). Each
    step keeps its read transaction open; every one is queried again after the newer ones,
    newest first and oldest first, and answers as a fresh handle does. ``small``: the
    small-segment threshold (1: every segment of two or more documents is large)."""
    import engramdb.index.bm25 as bm25

    if small is not None:
        monkeypatch.setattr(bm25, "SMALL_SEGMENT_DOCS", small)
    idx, writer = _fresh(store), _fresh(store)
    store.write(lambda txn: writer.apply(txn, [(1, ["a", "a", "b"]), (2, ["a", "c", "d", "e"]), (3, ["x"])], []))
    steps = [
        lambda txn: writer.apply(txn, [], [1]),  # the reported case: doc 1 deleted
        lambda txn: writer.apply(txn, [(4, ["a", "b"])], []),  # a new segment holding the term
        lambda txn: writer.apply(txn, [(2, ["a", "a"])], [2]),  # an update: a tombstone and a segment
        lambda txn: idx.apply(txn, [], [4]),  # the querying handle's own commit
        lambda txn: writer.merge(txn, 5, force=True),
        lambda txn: writer.apply(txn, [], [3]),
    ]
    queries = [["a"], ["a", "b"], ["b", "x"], {"a": 2.0, "e": 0.5}]
    with contextlib.ExitStack() as stack:
        txns = [stack.enter_context(store.read())]
        want = [{str(q): _fresh(store).search(txns[0], q, 5) for q in queries}]
        for step in steps:
            store.write(step)
            txns.append(stack.enter_context(store.read()))
            want.append({str(q): _fresh(store).search(txns[-1], q, 5) for q in queries})
            for at in [len(txns) - 1, *range(len(txns) - 1)]:  # the new state first, then each older one
                for q in queries:
                    assert idx.search(txns[at], q, 5) == want[at][str(q)], (at, q)
        for order in (reversed(range(len(txns))), range(len(txns))):
            for at in order:
                for q in queries:
                    assert idx.search(txns[at], q, 5) == want[at][str(q)], (at, q)
    assert want[0][str(["a"])] != want[1][str(["a"])]  # the delete changed the answer


def test_a_tombstone_in_a_small_segment_reuses_its_decoded_blocks(store):
    """The small segments' blocks are decoded once per handle: a delete or an update that
    tombstones a document of a small segment rebuilds the term's small-segment postings
    from the cached blocks (no block decoded again), and the answer equals a fresh handle's."""
    rng = np.random.default_rng(8)
    idx, writer = _fresh(store), _fresh(store)  # the writer reads nothing back (its own commits)
    big = [(i + 1, _doc(rng)) for i in range(SMALL_SEGMENT_DOCS + 5)]
    store.write(lambda txn: writer.apply(txn, big, []))
    small = [(len(big) + 1 + i, ["w0", "w1"] + _doc(rng, 3)) for i in range(12)]
    for at in range(0, len(small), 4):  # three small segments of 4 documents (one dead: under half)
        store.write(lambda txn, at=at: writer.apply(txn, small[at:at + 4], []))
    query = ["w0", "w1"]
    with store.read() as txn:
        first = idx.search(txn, query, 10)
    before = idx.blocks_decoded
    store.write(lambda txn: writer.apply(txn, [], [small[1][0]]))  # a delete in a small segment
    with store.read() as txn:
        assert idx.layout(txn) == {"segments": 4, "live_docs": len(big) + 11, "dead_docs": 1, "tombstone_runs": 1}
    with store.read() as txn:
        got = idx.search(txn, query, 10)
        assert got == _fresh(store).search(txn, query, 10) and got != first
        assert small[1][0] not in [docno for docno, _ in idx.search(txn, query, 50)]
    assert idx.blocks_decoded == before
    # an update of a small segment's document: its old posting goes, the new one (another
    # segment, same docno) comes; only the new segment's blocks are decoded
    store.write(lambda txn: writer.apply(txn, [(small[6][0], ["w1", "w1", "w1"])], [small[6][0]]))
    with store.read() as txn:
        got = idx.search(txn, query, 10)
        assert got == _fresh(store).search(txn, query, 10)
    assert idx.blocks_decoded - before == 1  # w1 in the new segment; w0's old posting dropped from cache


# --- bounds ------------------------------------------------------------------------------


def test_the_cache_stays_within_its_limit_and_a_tiny_one_answers_the_same(store):
    rng = np.random.default_rng(6)
    vocab = [f"t{i}" for i in range(600)]
    docs = [(i + 1, [vocab[int(j)] for j in rng.integers(0, len(vocab), 20)] + _doc(rng, 4)) for i in range(3000)]
    writer = _fresh(store)
    for start in range(0, len(docs), 1000):
        store.write(lambda txn, s=start: writer.apply(txn, docs[s:s + 1000], []))
    tiny = SegmentedBM25(store.blind, store.last_txnid, cache_mb=0.05)
    roomy = _fresh(store)
    limit = tiny.cache.max_bytes
    with store.read() as txn:
        for i in range(0, len(vocab), 3):  # far more terms than the tiny cache holds
            q = vocab[i:i + 3] + ["w0"]
            assert tiny.search(txn, q, 10) == roomy.search(txn, q, 10)
            assert tiny.cache.nbytes <= limit
    assert tiny.cache.evictions > 0
    assert roomy.cache.nbytes > limit  # the same work does not fit in the tiny one
    zero = SegmentedBM25(store.blind, store.last_txnid, cache_mb=0)
    with store.read() as txn:
        assert zero.search(txn, ["t1", "t2"], 5) == roomy.search(txn, ["t1", "t2"], 5)
    assert zero.cache.nbytes == 0


def _reference(docs: list[tuple[int, list[str]]], query: list[str], k: int) -> list[tuple[int, float]]:
    """Lucene BM25 (bm25s's "lucene" method) in plain numpy, independent of the index."""
    n = len(docs)
    avgdl = sum(len(t) for _, t in docs) / n
    scores: dict[int, float] = {}
    for term in sorted(set(query)):
        w = query.count(term)
        holders = [(docno, toks.count(term), len(toks)) for docno, toks in docs if term in toks]
        if not holders:
            continue
        fdf = float(len(holders))
        idf = float(np.log1p((n - fdf + 0.5) / (fdf + 0.5)))
        for docno, tf, dl in holders:
            part = float(tf / (1.2 * ((1 - 0.75) + 0.75 * np.float64(dl) / avgdl) + tf)) * idf
            scores[docno] = scores.get(docno, 0.0) + (part * w if w != 1 else part)
    return sorted(scores.items(), key=lambda x: (-x[1], x[0]))[:k]


def test_long_runs_are_cached_in_narrow_dtypes_and_score_the_same(store):
    """A term with thousands of postings in the large segments is cached at ~5 bytes per
    posting (uint32 docnos, uint8 pair codes, a count per pair; issue 15: the common terms
    of 1M documents fit the default cache) and its rankings equal an independent
    computation, through the per-pair ranking (one term) and the accumulator (several)."""
    rng = np.random.default_rng(9)
    n = 2 * SMALL_SEGMENT_DOCS + 600
    docs = [(i + 1, _doc(rng, int(rng.integers(5, 30))) + ["common"] * int(rng.integers(1, 4))) for i in range(n)]
    writer = _fresh(store)
    store.write(lambda txn: writer.apply(txn, docs[:SMALL_SEGMENT_DOCS + 300], []))
    store.write(lambda txn: writer.apply(txn, docs[SMALL_SEGMENT_DOCS + 300:], []))
    reader = _fresh(store)
    with store.read() as txn:
        for query in (["common"], ["common", "w3"], ["common", "common", "w1", "w7"], ["w0", "w2"]):
            got = reader.search(txn, query, 10)
            assert got == _reference(docs, query, 10), query
        entry = reader.cache.get(("t", reader.blind("common")))
        base = entry.base
        assert base.docnos.size == n and base.docnos.dtype == np.uint32 and base.codes.dtype == np.uint8
        # plus its frontier's pairs and docnos (tests/test_bm25_best.py): at most a quarter of the run
        frontier = [a for a in (base.front, base.front_sizes, base.front_starts, base.front_docnos, base.rest) if a is not None]
        assert base.front_docnos is None or base.front_docnos.nbytes <= n
        assert base.nbytes == 5 * n + base.counts.nbytes + sum(a.nbytes for a in frontier)
        assert base.counts.size == len(entry.pairs.index)
        seg = reader.cache.get(("s", min(entry.live)))
        assert seg.docnos.dtype == np.uint32 and seg.lens.dtype == np.uint8


# --- another process commits -------------------------------------------------------------

WRITER = textwrap.dedent("""
    import json, sys
    from engramdb.crypto import Sealer
    from engramdb.index.bm25 import SegmentedBM25
    from engramdb.store import Store
    store = Store.open(sys.argv[1])
    store.sealer = Sealer(bytes.fromhex(sys.argv[2]))
    idx = SegmentedBM25(store.blind, store.last_txnid)
    for line in sys.stdin:
        op = json.loads(line)
        if op["op"] == "apply":
            store.write(lambda txn: idx.apply(txn, [(d, t) for d, t in op["add"]], op["remove"]))
        elif op["op"] == "merge":
            store.write(lambda txn: idx.merge(txn, op["steps"], force=op["force"]))
        elif op["op"] == "purge":
            store.write(lambda txn: idx.purge(txn, op["steps"]))
        print("ok", flush=True)
    store.close()
""")


class _Writer:
    """A second process applying index changes to the same file, one command at a time."""

    def __init__(self, path) -> None:
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), KEY.hex()], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)

    def send(self, **op) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(op) + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok"

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def test_a_reader_sees_another_process_commits(store, tmp_path):
    writer = _Writer(tmp_path / "raw.engram")
    try:
        reader = _fresh(store)
        writer.send(op="apply", add=[[1, ["apple"]], [2, ["pear"]]], remove=[])
        with store.read() as txn:
            assert [d for d, _ in reader.search(txn, ["apple", "pear"], 5)] == [1, 2]
        writer.send(op="apply", add=[[3, ["apple", "apple"]]], remove=[1])
        with store.read() as txn:
            assert [d for d, _ in reader.search(txn, ["apple"], 5)] == [3]
            assert reader.search(txn, ["apple", "pear"], 5) == _fresh(store).search(txn, ["apple", "pear"], 5)
        writer.send(op="merge", steps=3, force=True)
        with store.read() as txn:
            assert reader.search(txn, ["apple", "pear"], 5) == _fresh(store).search(txn, ["apple", "pear"], 5)
    finally:
        writer.close()


QUERIES = [["w0"], ["w1", "w2"], ["w0", "w3", "w3"], ["w5", "w9", "w12", "w0"], {"w2": 0.5, "w4": 2.0}, ["zz"]]


class CachedEqualsFresh(RuleBasedStateMachine):
    """Commits from a second process interleaved with queries in long-lived handles (a
    default cache and a tiny one): every answer equals a fresh handle's, bit for bit, and
    equals full scoring."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="engram-cache-")
        self.path = os.path.join(self.dir, "raw.engram")
        self.store = Store.open(self.path)
        self.store.sealer = Sealer(KEY)
        self.writer = _Writer(self.path)
        self.cached = SegmentedBM25(self.store.blind, self.store.last_txnid)
        self.tiny = SegmentedBM25(self.store.blind, self.store.last_txnid, cache_mb=0.002)
        self.live: set[int] = set()
        self.next = 1
        # read transactions kept open on older snapshots, with a fresh handle's answers there
        self.held: list[tuple[contextlib.AbstractContextManager, object, list]] = []

    @initialize(n=st.integers(0, 60), seed=st.integers(0, 2**16))
    def start(self, n, seed):
        rng = np.random.default_rng(seed)
        docs = [[self.next + i, _doc(rng)] for i in range(n)]
        if docs:
            self.writer.send(op="apply", add=docs, remove=[])
        self.live.update(d for d, _ in docs)
        self.next += n

    @rule(k=st.integers(1, 4), seed=st.integers(0, 2**16))
    def add(self, k, seed):
        rng = np.random.default_rng(seed)
        docs = [[self.next + i, _doc(rng, int(rng.integers(0, 8)))] for i in range(k)]
        self.writer.send(op="apply", add=docs, remove=[])
        self.live.update(d for d, _ in docs)
        self.next += k

    @precondition(lambda self: self.live)
    @rule(data=st.data(), update=st.booleans())
    def delete_or_update(self, data, update):
        victims = data.draw(st.lists(st.sampled_from(sorted(self.live)), min_size=1, max_size=3, unique=True))
        rng = np.random.default_rng(len(victims))
        add = [[v, _doc(rng)] for v in victims] if update else []
        self.writer.send(op="apply", add=add, remove=victims)
        if not update:
            self.live.difference_update(victims)

    @rule(steps=st.integers(1, 3), force=st.booleans())
    def merge(self, steps, force):
        self.writer.send(op="merge", steps=steps, force=force)

    # the long-lived handles write too: each then reads its own commits back from what it
    # wrote (the directory and the small segments it keeps), never from the file

    @rule(k=st.integers(0, 3), seed=st.integers(0, 2**16), tiny=st.booleans(), data=st.data())
    def write_here(self, k, seed, tiny, data):
        rng = np.random.default_rng(seed)
        docs = [(self.next + i, _doc(rng, int(rng.integers(0, 8)))) for i in range(k)]
        victims = data.draw(st.lists(st.sampled_from(sorted(self.live)), max_size=2, unique=True)) if self.live else []
        updated = victims[:1] if data.draw(st.booleans()) else []
        docs += [(v, _doc(rng)) for v in updated]
        handle = self.tiny if tiny else self.cached
        self.store.write(lambda txn: handle.apply(txn, docs, victims))
        self.live.update(d for d, _ in docs)
        self.live.difference_update(set(victims) - set(updated))
        self.next += k

    @rule(steps=st.integers(1, 3), force=st.booleans(), tiny=st.booleans())
    def merge_here(self, steps, force, tiny):
        handle = self.tiny if tiny else self.cached
        self.store.write(lambda txn: handle.merge(txn, steps, force=force))

    @rule(steps=st.integers(1, 2))
    def purge(self, steps):
        """Segments holding tombstones rewritten without them (what compact() does)."""
        self.writer.send(op="purge", steps=steps)

    @rule(steps=st.integers(1, 2), tiny=st.booleans())
    def purge_here(self, steps, tiny):
        handle = self.tiny if tiny else self.cached
        self.store.write(lambda txn: handle.purge(txn, steps))

    @rule()
    def hold_a_snapshot(self):
        """Keep a read transaction open on the current state (at most three; the oldest goes)."""
        if len(self.held) == 3:
            self.held.pop(0)[0].__exit__(None, None, None)
        ctx = self.store.read()
        txn = ctx.__enter__()
        fresh = SegmentedBM25(self.store.blind, self.store.last_txnid)
        self.held.append((ctx, txn, [fresh.search(txn, q, 6) for q in QUERIES]))

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def query_a_held_snapshot(self, data):
        """An older snapshot queried after newer ones (the invariant queries the newest
        state after every step): it answers for its own state, as a fresh handle did."""
        _, txn, want = data.draw(st.sampled_from(self.held))
        for q, expect in zip(QUERIES, want):
            assert self.cached.search(txn, q, 6) == expect
            assert self.tiny.search(txn, q, 6) == expect

    @invariant()
    def answers_equal_a_fresh_handle(self):
        fresh = SegmentedBM25(self.store.blind, self.store.last_txnid)
        with self.store.read() as txn:
            for q in QUERIES:
                want = fresh.search(txn, q, 6)
                assert self.cached.search(txn, q, 6) == want
                assert self.tiny.search(txn, q, 6) == want
                docs, scores = fresh.scores(txn, q)
                order = np.lexsort((docs, -scores))[:6]
                assert want == [(int(docs[i]), float(scores[i])) for i in order]
        assert self.tiny.cache.nbytes <= self.tiny.cache.max_bytes

    def teardown(self) -> None:
        import shutil

        for ctx, _, _ in self.held:
            ctx.__exit__(None, None, None)
        self.writer.close()
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


TestCachedEqualsFresh = CachedEqualsFresh.TestCase
TestCachedEqualsFresh.settings = settings(max_examples=8, stateful_step_count=14, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])


class CachedEqualsFreshWithLargeSegments(CachedEqualsFresh):
    """The same, with the reader's small-segment threshold at 6 documents, so segments of
    both kinds (the large ones' postings coded by (tf, dl) pair, the small ones' kept per
    segment) hold the terms, merges turn small segments into large ones, and tombstones
    and updates hit both."""

    SMALL = 6

    def __init__(self) -> None:
        import engramdb.index.bm25 as bm25

        self._saved = bm25.SMALL_SEGMENT_DOCS
        bm25.SMALL_SEGMENT_DOCS = self.SMALL
        super().__init__()

    def teardown(self) -> None:
        import engramdb.index.bm25 as bm25

        bm25.SMALL_SEGMENT_DOCS = self._saved
        super().teardown()


TestCachedEqualsFreshWithLargeSegments = CachedEqualsFreshWithLargeSegments.TestCase
TestCachedEqualsFreshWithLargeSegments.settings = settings(max_examples=5, stateful_step_count=12, deadline=None,
                                                           suppress_health_check=[HealthCheck.too_slow])


def test_a_packed_segment_the_write_created_is_decoded_once_in_that_write(store, monkeypatch):
    """Inside the write that created a packed segment (its record not stored yet), each
    term's block read from it decodes the record once, not once per term."""
    import engramdb.index.bm25 as bm25

    made: list[bytes] = []

    class Counting(bm25._Packed):
        __slots__ = ()

        def __init__(self, data: bytes) -> None:
            made.append(data)
            super().__init__(data)

    monkeypatch.setattr(bm25, "_Packed", Counting)
    idx = _fresh(store)
    store.write(lambda txn: idx.apply(txn, [(1, ["w0", "w1"])], []))
    seen: dict[str, object] = {}
    put = idx._put_directory

    def read_then_put(txn, d):
        segno = max(d.unwritten)
        seen["blocks"] = [idx._raw_block(txn, d, idx.blind(t), segno) for t in ["w0", "w1", "w2", "w0", "w3"]]
        seen["made"] = len(made)
        put(txn, d)

    monkeypatch.setattr(idx, "_put_directory", read_then_put)
    store.write(lambda txn: idx.apply(txn, [(2, ["w0", "w2", "w2"]), (3, ["w3"])], [], auto_merge=False))
    assert seen["made"] == 1 and [b is None for b in seen["blocks"]] == [False, True, False, False, False]
    monkeypatch.undo()
    with store.read() as txn:
        assert idx.search(txn, ["w0", "w2"], 5) == _fresh(store).search(txn, ["w0", "w2"], 5)
