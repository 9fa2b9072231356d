"""Engram.import_many (issue 15, "Bounded memory"): a bulk import that commits chunk by chunk,
holds a chunk at a time, skips ids already stored, and completes after a crash when run again."""
from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import os
import random
import signal
import time
import tracemalloc

import pytest
from conftest import PASSPHRASE, TEST_KDF

import engramdb.engram as engram_mod
from engramdb.index import bm25 as bm25_mod
from engramdb.errors import ValidationError

WORDS = [f"w{i}" for i in range(300)]
QUERIES = [["w1"], ["w2", "w3"], ["w10", "w200", "w299"], ["w7", "w7", "w150"]]


def _items(n: int, seed: int = 1, prefix: str = "m") -> list[dict]:
    rnd = random.Random(seed)
    return [{"id": f"{prefix}{i}", "content": " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(5, 30)))}
            for i in range(n)]


def _open(path, **kw):
    return engram_mod.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF, **kw)


def _snapshot(db) -> tuple:
    """Every memory (id, content, timestamps) and the BM25 answers (docnos, exact scores)."""
    nodes = sorted((n.id, n.content, n.created_at, n.last_accessed) for n in db.scan())
    answers = []
    with db._store.read() as txn:
        for terms in QUERIES:
            hits = db.indexes.bm25.search(txn, terms, 10)
            answers.append(hits)  # (docno, score): the same numbering too
    return nodes, answers


def test_import_many_equals_add_many_and_commits_per_chunk(tmp_path):
    items = _items(1000)
    with _open(tmp_path / "a.engram") as db:
        db.add_many(items, now=5.0)
        expected = _snapshot(db)
    seen = []
    with _open(tmp_path / "b.engram") as db:
        txnid = db._store.last_txnid
        before = txnid()
        assert db.import_many(iter(items), now=5.0, chunk=300, progress=lambda a, s: seen.append((a, s))) == (1000, 0)
        assert seen == [(300, 0), (600, 0), (900, 0), (1000, 0)]
        assert txnid() - before == 4  # one transaction per chunk
        assert _snapshot(db) == expected
        assert db.verify() == []


def test_import_many_skips_stored_and_repeated_ids(tmp_path):
    items = _items(500)
    with _open(tmp_path / "s.engram") as db:
        db.add_many(items[100:200], now=1.0)
        changed = dict(items[150], content="a different text under a stored id")
        source = items[:150] + [changed] + items[151:] + items[:10]  # a stored id with other text; repeats
        assert db.import_many(source, now=1.0, chunk=64) == (400, 110)
        assert len(db) == 500
        assert db.get(items[150]["id"]).content == items[150]["content"]  # skipped: the stored one stays
        assert db.import_many(source, now=1.0, chunk=64) == (0, 510)  # idempotent
        assert db.import_many(["no id", "no id either"], now=1.0) == (2, 0)  # fresh ids each
        assert len(db) == 502
        assert db.verify() == []


@pytest.mark.parametrize("chunk", [0, -1, 2.5, True, "10"])
def test_import_many_refuses_a_bad_chunk(tmp_path, chunk):
    from engramdb.backup import import_resumable

    with _open(tmp_path / "c.engram") as db:
        with pytest.raises(ValidationError) as raised:
            db.import_many(_items(3), chunk=chunk)
        with pytest.raises(ValidationError) as resumable:  # `engramdb import --resume`'s path, the same check
            import_resumable(db, iter([]), chunk=chunk)
        assert len(db) == 0
    # the default is read from bulk: setting engramdb.engram's re-exported copy changes nothing
    assert raised.value.hint == resumable.value.hint == "leave it out for the default, engramdb.bulk.INGEST_CHUNK"


def test_import_many_stops_at_a_bad_item_after_the_chunks_before_it(tmp_path):
    items = _items(250)
    items[200] = {"id": "bad", "content": "x", "no_such_field": 1}
    with _open(tmp_path / "e.engram") as db:
        with pytest.raises(ValidationError):
            db.import_many(items, chunk=100)
        assert len(db) == 200  # the two chunks before the bad one are committed
        items[200] = {"id": "good", "content": "y"}
        assert db.import_many(items, chunk=100) == (50, 200)


def test_import_many_holds_a_chunk_not_the_source(tmp_path, monkeypatch):
    """A generator source is read a chunk at a time: what the import holds does not grow
    with the number of memories (the items themselves included)."""
    # chunks of 400 stand for INGEST_CHUNK's 32,768: large segments, which the handle does
    # not adopt into its postings cache as written (small ones it does, up to cache_mb)
    monkeypatch.setattr(bm25_mod, "SMALL_SEGMENT_DOCS", 100)
    def source(n):
        rnd = random.Random(3)
        for i in range(n):
            yield {"id": f"g{i}", "content": " ".join(rnd.choice(WORDS) for _ in range(30))}

    def peak(path, n):
        with _open(path) as db:
            tracemalloc.start()
            try:
                base = tracemalloc.get_traced_memory()[0]
                db.import_many(source(n), now=1.0, chunk=400)
                return tracemalloc.get_traced_memory()[1] - base
            finally:
                tracemalloc.stop()

    peak(tmp_path / "warm.engram", 3200)  # one-time costs (imports, the map's first release) out of the way
    one = peak(tmp_path / "one.engram", 400)
    eight = peak(tmp_path / "eight.engram", 3200)
    assert eight < 1.5 * one, (one, eight)


# --- SIGKILL mid-import ------------------------------------------------------------------

N, CHUNK = 1200, 100


def _child(path: str, kill_on: int, committed: multiprocessing.synchronize.Event | None = None) -> None:
    """Import, and with ``kill_on`` > 0 kill this process inside that chunk's transaction,
    after its records and postings are written and before its commit; ``committed`` is set
    after the first chunk's commit."""
    calls = 0
    original = engram_mod.Transaction._put_checked

    def put_checked(self, nodes, id_keys):
        nonlocal calls
        original(self, nodes, id_keys)
        calls += 1
        if calls == kill_on:
            self._index_batch.flush()  # the chunk's BM25 segment too
            os.kill(os.getpid(), signal.SIGKILL)

    engram_mod.Transaction._put_checked = put_checked
    with _open(path) as db:
        db.import_many(_items(N, 9), now=2.0, chunk=CHUNK,
                       progress=lambda added, skipped: committed is not None and committed.set())
    os._exit(0)


@pytest.fixture(scope="module")
def expected(tmp_path_factory):
    with _open(tmp_path_factory.mktemp("ref") / "ref.engram") as db:
        db.import_many(_items(N, 9), now=2.0, chunk=CHUNK)
        return _snapshot(db)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
@pytest.mark.parametrize("how", ["commit-4", "commit-1", "timed-0", "timed-1", "timed-2"])
def test_sigkill_mid_import_loses_nothing_and_a_rerun_completes_it(tmp_path, expected, how):
    path = tmp_path / "k.engram"
    ctx = multiprocessing.get_context("fork")
    kind, _, arg = how.partition("-")
    if kind == "commit":
        proc = ctx.Process(target=_child, args=(str(path), int(arg)))
        proc.start()
    else:  # at a random instant: inside a chunk's build, its writes or its commit
        committed = ctx.Event()
        proc = ctx.Process(target=_child, args=(str(path), 0, committed))
        proc.start()
        assert committed.wait(60)
        time.sleep(random.Random(int(arg)).uniform(0.0, 0.3))
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    if kind == "commit":
        assert proc.exitcode == -signal.SIGKILL
    with _open(path) as db:
        assert db.verify() == []
        done = len(db)
        assert done % CHUNK == 0 or done == N  # whole chunks only
        if kind == "commit":
            assert done == (int(arg) - 1) * CHUNK  # the killed chunk left nothing
        assert db.import_many(_items(N, 9), now=2.0, chunk=CHUNK) == (N - done, done)
        assert db.verify() == []
        assert _snapshot(db) == expected
