"""Packed small segments (directory version 4, spec/bm25.md "segments"): a segment of at most
SMALL_SEGMENT_DOCS documents is one sealed record (its sorted blinds, offsets and blocks), so
a commit seals a handful of records and a merge of small segments reads one per segment.
Files holding only per-term segments (version 3, what engramdb wrote before) read, take new
packed segments, merge both layouts together and answer the same."""
from __future__ import annotations

import os
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import rebuilt_answers, unpack_segments
from engramdb.errors import CorruptFileError
from engramdb.index import bm25 as bm
from engramdb.index.bm25 import SegmentedBM25

WORDS = [f"w{i}" for i in range(60)]
QUERIES = [[w, WORDS[(i * 7) % len(WORDS)]] for i, w in enumerate(WORDS)]


def _docs(n: int, seed: int, first: int) -> list[tuple[int, list[str]]]:
    rng = random.Random(seed)
    return [(first + i, [WORDS[min(int(rng.expovariate(0.12)), len(WORDS) - 1)] for _ in range(rng.randint(1, 12))])
            for i in range(n)]


def _answers(store, idx) -> list:
    with store.read() as txn:
        return [idx.search(txn, q, 25) for q in QUERIES] + [idx.stats(txn)]


def _records(store) -> dict[tuple[str, bytes], bytes]:
    with store.read() as txn:
        return {(table, k): v for table in ("postings", "segments") for k, v in txn.items(table)}


def _dir(store) -> bm._Dir:
    with store.read() as txn:
        return bm._Dir.decode(txn.get("segments", bm.DIR_KEY))


def test_a_commit_writes_one_postings_record_and_a_small_merge_rewrites_records_not_terms(store):
    idx = SegmentedBM25(store.blind, store.last_txnid)
    for k in range(8):
        store.write(lambda txn, k=k: idx.apply(txn, _docs(3, k, 1 + 3 * k), []))
    before = set(_records(store))
    store.write(lambda txn: idx.apply(txn, _docs(1, 99, 100), []))  # 12 distinct terms at most
    new = set(_records(store)) - before
    assert not any(table == "postings" for table, _ in new)
    assert sorted(k[:1] for _, k in new) == [b"p", b"s"]  # the directory is replaced, not new
    d = _dir(store)
    assert d.packed == set(d.segs) and len(d.segs) == 9  # tier 0 (under 10 documents each)
    store.write(lambda txn: idx.apply(txn, _docs(1, 98, 101), []))  # the tenth of tier 0: they merge
    d = _dir(store)
    with store.read() as txn:
        assert list(txn.keys("postings")) == []
        assert list(txn.keys("segments", b"v")) == []
    assert d.packed == set(d.segs) and len(d.segs) == 1


@pytest.mark.parametrize("pure_old", [True, False])
def test_old_layout_reads_writes_and_merges_with_packed_segments(store, monkeypatch, pure_old):
    """A version-3 file (written with packing off, or packed then unpacked: the same records)
    answers the same before and after new packed segments join it and merges mix layouts."""
    idx = SegmentedBM25(store.blind, store.last_txnid)
    batches = [_docs(n, k, 1 + 40 * k) for k, n in enumerate([30, 5, 12, 1, 1, 7])]
    if pure_old:
        monkeypatch.setattr(bm, "PACK_SMALL", False)
    for docs in batches:
        store.write(lambda txn, docs=docs: idx.apply(txn, docs, []))
    store.write(lambda txn: idx.apply(txn, [], [3, 45, 46, 121]))
    if not pure_old:
        store.write(unpack_segments)
    monkeypatch.setattr(bm, "PACK_SMALL", True)
    d = _dir(store)
    assert d.packed == set() and d.version == 3
    old = _answers(store, idx)
    fresh = SegmentedBM25(store.blind, store.last_txnid)
    assert _answers(store, fresh) == old
    with store.read() as txn:
        assert fresh.verify(txn, _live(batches, {3, 45, 46, 121})) == []
    extra = _docs(4, 77, 1000)
    store.write(lambda txn: idx.apply(txn, extra, [2, 47]))
    d = _dir(store)
    assert d.version == bm.PACKED_VERSION and d.packed and set(d.segs) - d.packed
    dead = {3, 45, 46, 121, 2, 47}
    live = _live(batches, dead) + extra
    for handle in (idx, SegmentedBM25(store.blind, store.last_txnid)):
        assert _answers(store, handle) == _rebuilt(store, live)
    store.write(lambda txn: idx.merge(txn, 5, force=True))  # per-term and packed into one
    d = _dir(store)
    assert len(d.segs) == 1 and d.packed == set(d.segs)
    for handle in (idx, SegmentedBM25(store.blind, store.last_txnid)):
        assert _answers(store, handle) == _rebuilt(store, live)
        with store.read() as txn:
            assert handle.verify(txn, live) == []
    with store.read() as txn:
        assert list(txn.keys("postings")) == []


def _live(batches, dead) -> list[tuple[int, list[str]]]:
    return [(d, t) for docs in batches for d, t in docs if d not in dead]


def _rebuilt(store, live) -> list:
    return rebuilt_answers(store, live, QUERIES)


def test_packing_off_writes_what_unpacking_a_packed_file_gives(tmp_path):
    """The two ways tests make a version-3 file agree record for record (the blocks are the
    same bytes in either layout); a merge into a large segment writes per-term records."""
    from engramdb.crypto import Sealer
    from engramdb.store import Store

    def build(path, pack):
        s = Store.open(path)
        s.sealer = Sealer(b"\x07" * 32)
        idx = SegmentedBM25(s.blind, s.last_txnid)
        saved = bm.PACK_SMALL
        bm.PACK_SMALL = pack
        try:
            for k in range(23):
                s.write(lambda txn, k=k: idx.apply(txn, _docs(2 + k % 4, k, 1 + 10 * k), [10 * k - 9] if k else []))
        finally:
            bm.PACK_SMALL = saved
        if pack:
            s.write(unpack_segments)
        out = _records(s)
        s.close()
        return out

    assert build(tmp_path / "a.engram", False) == build(tmp_path / "b.engram", True)


def test_a_large_merge_writes_per_term_records(store, monkeypatch):
    monkeypatch.setattr(bm, "SMALL_SEGMENT_DOCS", 20)
    idx = SegmentedBM25(store.blind, store.last_txnid)
    live = []
    for k in range(3):
        docs = _docs(10, k, 1 + 10 * k)
        live += docs
        store.write(lambda txn, docs=docs: idx.apply(txn, docs, []))
    assert _dir(store).packed == set(_dir(store).segs)
    store.write(lambda txn: idx.merge(txn, 1, force=True))
    d = _dir(store)
    assert len(d.segs) == 1 and not d.packed and d.version == 3  # readable by engramdb before packing
    with store.read() as txn:
        assert list(txn.keys("postings")) and idx.verify(txn, live) == []
        assert list(txn.keys("segments", bm.PACKED_PREFIX)) == []
    assert _answers(store, idx) == _rebuilt(store, live)


def test_an_older_reader_refuses_a_file_with_packed_segments(store):
    """engramdb before 2026-12-01 accepted directory versions 1 to 3 and reported any other
    as "unknown version" with the hint to upgrade: a file holding a packed segment is version 4."""
    idx = SegmentedBM25(store.blind, store.last_txnid)
    store.write(lambda txn: idx.apply(txn, _docs(3, 1, 1), []))
    with store.read() as txn:
        raw = bm._unpack(txn.get("segments", bm.DIR_KEY))
    assert raw["v"] == 4 and raw["v"] not in (1, 2, 3)
    assert [len(entry) for entry in raw["segs"]] == [4] and raw["segs"][0][3] == 1
    bad = dict(raw, segs=[[*raw["segs"][0][:3], 2]])  # an unknown layout
    with pytest.raises(CorruptFileError):
        bm._Dir.decode(bm._pack(bad))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blocks=st.dictionaries(st.binary(min_size=16, max_size=16),
                              st.lists(st.integers(1, 1 << 40), min_size=1, max_size=20, unique=True), max_size=30))
def test_packed_record_round_trips(blocks):
    blinds = list(blocks)
    datas = [bm.encode_block(np.array(sorted(v), dtype=np.uint64), np.arange(1, len(v) + 1)) for v in blocks.values()]
    p = bm._Packed(bm.encode_packed(blinds, datas))
    assert p.blinds() == sorted(blinds)
    for blind, data in zip(blinds, datas):
        assert p.block(blind) == data
    assert p.block(b"\xff" * 17) is None


def test_a_damaged_packed_record_is_a_clean_error():
    blinds = [bytes([i]) * 16 for i in (3, 1, 2)]
    datas = [bm.encode_block(np.array([i + 1]), np.array([1])) for i in range(3)]
    good = bm.encode_packed(blinds, datas)
    n = 3
    swapped = good[:4] + good[20:36] + good[4:20] + good[36:]  # blinds out of order
    offsets = 4 + 16 * n
    bad_offset = good[:offsets] + (1).to_bytes(4, "little") + good[offsets + 4:]
    for data in (b"", b"\x01", good[:-1], good + b"\x00", swapped, bad_offset, (10**6).to_bytes(4, "little") + good[4:]):
        with pytest.raises(CorruptFileError):
            bm._Packed(data)


@settings(max_examples=60, deadline=None)
@given(blocks=st.lists(st.tuples(st.lists(st.integers(1, 1 << 62), max_size=40, unique=True),
                                 st.sampled_from([3, 300, 70_000, 1 << 40])), min_size=16, max_size=80))
def test_decode_blocks_of_many_small_blocks_equals_decode_block(blocks):
    """The vectorised decode of many raw blocks (a merge of small segments) gives what
    :func:`decode_block` gives block by block; compressed blocks fall back to it."""
    datas = [bm.encode_block(np.array(sorted(d), dtype=np.uint64), np.arange(1, len(d) + 1) % top + 1)
             for d, top in blocks]
    docnos, values, counts = bm.decode_blocks(datas)
    one = [bm.decode_block(data) for data in datas]
    assert counts.tolist() == [len(d) for d, _ in one]
    assert docnos.tolist() == [x for d, _ in one for x in d.tolist()]
    assert values.tolist() == [x for _, v in one for x in v.tolist()]
    assert docnos.dtype == np.uint64 and values.dtype == np.int64


def test_decode_blocks_of_many_small_blocks_rejects_damage():
    datas = [bm.encode_block(np.array([1, 5]), np.array([1, 2])) for _ in range(20)]
    assert bm._decode_raw_blocks(datas) is not None  # the vectorised path, not the fallback
    flat = bytearray(datas[7])
    flat[7 + 1] = 0  # the second delta 0: docnos not increasing
    with pytest.raises(CorruptFileError, match="not increasing"):
        bm.decode_blocks(datas[:7] + [bytes(flat)] + datas[8:])
    for bad in (datas[3][:-1], b"\x09" + datas[3][1:], datas[3][:5] + b"\x03" + datas[3][6:]):
        with pytest.raises(CorruptFileError):  # truncated, unknown kind, bad width: the precise error
            bm.decode_blocks(datas[:3] + [bad] + datas[4:])


def test_single_adds_never_leave_the_file_shorter_than_its_last_page(make_db):
    """Regression: a commit's new packed segment, merged away by the same commit (the tenth
    small one), was stored and deleted in one LMDB transaction; its overflow pages were then
    allocated past the end of the file but never written, and a reopen in that state
    reported the file truncated (store.py's check). Records of segments a write creates are
    now stored with the directory, and only when they survive it."""
    db = make_db()
    rng = random.Random(5)
    vocab = [f"w{i}x" for i in range(4000)]
    env = db._store._env
    for i in range(400):
        db.add(" ".join(rng.choice(vocab) for _ in range(60)), id=f"a{i}", now=0.0)
        # the file reaches its last page (store.check_file_end would accept the other state
        # now, but a commit that writes pages it frees again is still waste)
        assert (env.env.info()["last_pgno"] + 1) * env.env.stat()["psize"] <= os.path.getsize(env.path)
    assert db.verify() == []
