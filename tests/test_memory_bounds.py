"""Bounded memory (issue 15): what a query process and a bulk ingest hold does not grow
with the work done. The caches' own bounds are in tests/test_bm25_cache.py and
tests/test_nodecache.py; these check the rest that engramdb controls: the per-thread score
accumulator, and add_many's working set per chunk (the Python and numpy objects it holds;
LMDB's page buffers are outside tracemalloc and are bounded by LMDB, README "Memory")."""
from __future__ import annotations

import os
import random
import threading
import tracemalloc

import pytest
from conftest import PASSPHRASE, TEST_KDF

import engramdb.engram as engram
from engramdb import bulk
from engramdb import store as store_mod
from engramdb import verify as verify_mod
from engramdb.index import bm25 as bm25_mod

WORDS = [f"w{i}" for i in range(300)]


def _items(n: int, seed: int, prefix: str = "m") -> list[dict]:
    rnd = random.Random(seed)
    return [{"id": f"{prefix}{i}", "content": " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(20, 40)))}
            for i in range(n)]


def _top(db, terms):
    with db._store.read() as txn:
        return db.indexes.bm25.search(txn, terms, 10)


def test_the_accumulator_is_sized_to_the_documents_not_doubled(tmp_path):
    with engram.open(tmp_path / "a.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add_many(_items(3000, 1), now=1.0)
        bm25 = db.indexes.bm25
        expected = _top(db, ["w1", "w2", "w3"])
        assert len(expected) == 10
        acc = bm25._local.acc
        slots = 3000 + int(3000 * bm25_mod._ACC_HEADROOM)
        assert acc.size <= max(slots + 8, 1024)  # docnos start near 0: the largest is ~3000
        assert not acc.any()  # left zeroed for the next query
        db.add_many(_items(50, 2, "n"), now=1.0)  # within the headroom: no new array
        _top(db, ["w1", "w2", "w3"])
        assert bm25._local.acc is acc
        db.add_many(_items(2000, 3, "o"), now=1.0)  # past it: one array for the new size
        _top(db, ["w1", "w2", "w3"])
        assert bm25._local.acc.size <= max(int(5050 * (1 + bm25_mod._ACC_HEADROOM)) + 8, 1024)
        # the answers do not depend on the accumulator's size
        bm25._local.acc = None
        db.delete_many([f"o{i}" for i in range(2000)] + [f"n{i}" for i in range(50)])
        assert _top(db, ["w1", "w2", "w3"]) == expected


def test_each_thread_has_its_own_accumulator(tmp_path):
    with engram.open(tmp_path / "t.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add_many(_items(1500, 4), now=1.0)
        main = _top(db, ["w5", "w6"])
        seen = []
        thread = threading.Thread(target=lambda: seen.append((_top(db, ["w5", "w6"]), db.indexes.bm25._local.acc)))
        thread.start()
        thread.join()
        assert seen[0][0] == main
        assert seen[0][1] is not db.indexes.bm25._local.acc


def _ingest_peak(path, items, chunk, monkeypatch) -> int:
    monkeypatch.setattr(bulk, "INGEST_CHUNK", chunk)
    # chunks of a few hundred stand for INGEST_CHUNK's 32,768: large segments, which a handle
    # does not keep as written (it keeps small ones, a commit's, for its next queries)
    monkeypatch.setattr(bm25_mod, "SMALL_SEGMENT_DOCS", chunk // 4)
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            db.add_many(items, now=1.0)
            return tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()


def test_add_many_holds_a_chunk_not_the_batch(tmp_path, monkeypatch):
    """Eight chunks' ingest peaks within a small factor of one chunk's: the working set
    (nodes, encoded records, tokens, the segment being built) is freed chunk by chunk.
    Before add_many worked in chunks, the peak grew with the batch (8x here)."""
    one = _ingest_peak(tmp_path / "one.engram", _items(400, 5), 400, monkeypatch)
    items = _items(3200, 5)
    eight = _ingest_peak(tmp_path / "eight.engram", items, 400, monkeypatch)
    whole = _ingest_peak(tmp_path / "whole.engram", items, 3200, monkeypatch)
    assert whole > 3 * one, (one, whole)  # the measure sees a batch held at once
    # what eight chunks hold beyond one chunk's working set (the replay log's records, the
    # ids) is a fraction of what the whole batch adds; a ratio to one chunk's peak alone
    # would depend on how lean that working set is (the C extension's is half the numpy's)
    assert eight - one < (whole - one) / 2, (one, eight, whole)


def _resident_map_bytes(path) -> int:
    real, total, inside = os.path.realpath(path), 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):
                inside = line.rstrip("\n").endswith(" " + real)
            elif inside and head == "Rss:":
                total += int(line.split()[1]) * 1024
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="/proc/self/smaps (Linux) is not available")
def test_released_map_pages_leave_the_resident_set_and_answers_unchanged(tmp_path):
    path = tmp_path / "m.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add_many(_items(3000, 6), now=1.0)
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF, readonly=True) as db:
        expected = [_top(db, [w, "w7"]) for w in WORDS[:40]]
        assert _resident_map_bytes(path) > 0
        if store_mod.release_mapped_pages(str(path)) == 0:
            pytest.skip("madvise is not available here")
        assert _resident_map_bytes(path) < 64 * 1024  # what the kernel left (none, here)
        db.indexes.bm25.cache.clear()  # read everything again, through the map
        assert [_top(db, [w, "w7"]) for w in WORDS[:40]] == expected


def test_reads_release_the_map_when_its_resident_pages_grow(tmp_path, monkeypatch):
    calls = []
    real = store_mod.release_mapped_pages
    monkeypatch.setattr(store_mod, "RELEASE_CHECK_EVERY", 8)
    monkeypatch.setattr(store_mod, "release_mapped_pages", lambda path: calls.append(path) or real(path))
    path = tmp_path / "r.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add_many(_items(3000, 7), now=1.0)
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF, readonly=True) as db:
        env = db._store._env
        if env.file_base is None:
            pytest.skip("/proc/self/statm is not available")
        monkeypatch.setattr(store_mod, "RELEASE_MAP_ABOVE", 1 << 40)  # never grown that much: nothing released
        expected = [_top(db, [w, "w7"]) for w in WORDS[:40]]
        assert not calls
        monkeypatch.setattr(store_mod, "RELEASE_MAP_ABOVE", 0)  # any growth: released at the next look
        db.indexes.bm25.cache.clear()
        assert [_top(db, [w, "w7"]) for w in WORDS[:40]] == expected
        assert calls and all(c == env.path for c in calls)


def test_the_packed_fraction_scan_releases_the_map(tmp_path, monkeypatch):
    """compact()'s packed_fraction reads every entry of a table through the map: it releases
    the map's pages as they pile up, as the other scans do (review: it never called used_map,
    so a whole table stayed resident until the next release)."""
    calls = []
    real = store_mod.release_mapped_pages
    monkeypatch.setattr(store_mod, "RELEASE_CHECK_EVERY", 8)
    monkeypatch.setattr(store_mod, "release_mapped_pages", lambda path: calls.append(path) or real(path))
    path = tmp_path / "p.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add_many(_items(500, 9), now=1.0)
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF, readonly=True) as db:
        if db._store._env.file_base is None:
            pytest.skip("/proc/self/statm is not available")
        monkeypatch.setattr(store_mod, "RELEASE_MAP_ABOVE", 0)  # any growth: released at the next look
        calls.clear()
        with db._store.read() as txn:
            fraction = txn.packed_fraction("nodes")
        assert 0 < fraction <= 1.0 and len(calls) >= 500 // 8 - 1


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="/proc/self/smaps (Linux) is not available")
def test_a_bulk_import_releases_the_map_as_it_writes(tmp_path, monkeypatch):
    """import_many's inserts into the ids B-tree (random keys) read old pages through the map
    in every chunk after the first: with the release they do not stay resident."""
    def resident_after_import(name: str, above: int) -> int:
        monkeypatch.setattr(store_mod, "RELEASE_MAP_ABOVE", above)
        path = tmp_path / name
        with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
            if db._store._env.file_base is None:
                pytest.skip("/proc/self/statm is not available")
            db.import_many(_items(4000, 8), now=1.0, chunk=500)
            seen = _resident_map_bytes(path)
            assert db.verify() == []
            return seen

    monkeypatch.setattr(store_mod, "RELEASE_CHECK_EVERY", 16)
    kept = resident_after_import("kept.engram", 1 << 40)
    released = resident_after_import("released.engram", 0)
    assert kept > 256 * 1024, kept  # the measure sees the map's pages
    assert released < kept / 4, (released, kept)


def _verify_peak(path, n: int, monkeypatch) -> int:
    """tracemalloc's peak during a clean verify of ``n`` memories (with a few edges)."""
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add_many(_items(n, 7), now=1.0)
        for i in range(0, n - 1, 97):
            db.link(f"m{i}", f"m{i + 1}", kind="related")
        assert db.verify() == []  # warms what a handle caches (bounded by cache_mb), outside the measure
        # smaller chunks than the default, so that both sizes below span many of them
        monkeypatch.setattr(bm25_mod, "VERIFY_CHUNK_DOCS", 128)
        monkeypatch.setattr(verify_mod, "_CHUNK", 128)
        tracemalloc.start()
        try:
            assert db.verify() == []
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            monkeypatch.undo()


def test_verify_holds_a_chunk_and_a_few_bytes_per_memory(tmp_path, monkeypatch):
    """verify (and restore, which runs it) streams the records: 4x the memories adds a few
    dozen bytes per memory to its peak (flat arrays of docnos, digests and id keys), not
    their terms. Before, BM25's check held every document's term counts twice and the
    records were all decoded at once: ~2.4 KB per memory, 2-3 GB for a 1M-memory restore."""
    small = _verify_peak(tmp_path / "small.engram", 1000, monkeypatch)
    large = _verify_peak(tmp_path / "large.engram", 4000, monkeypatch)
    per_memory = (large - small) / 3000
    assert per_memory < 400, (small, large, per_memory)
