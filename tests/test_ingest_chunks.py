"""Bulk ingest in bounded chunks: add_many writes one BM25 segment per INGEST_CHUNK
memories (its memory is a chunk's), answers exactly as one segment would, and a
transaction whose bulk writes outgrew the replay log is re-run after map growth instead
of replayed from a log holding every envelope."""
from __future__ import annotations

import random

import pytest
from conftest import PASSPHRASE, TEST_KDF

import engramdb.engram as engram
from engramdb import bulk
from engramdb import store as store_mod
from engramdb.errors import DuplicateIdError

WORDS = ["lake", "sunrise", "career", "york", "wedding", "painting", "group", "sweden", "guitar", "puppy"]


def _items(n: int, seed: int = 1, prefix: str = "m") -> list[dict]:
    rnd = random.Random(seed)
    return [{"id": f"{prefix}{i}", "content": " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(1, 9)))}
            for i in range(n)]


def _search(db):
    with db._store.read() as txn:
        return [db.indexes.bm25.search(txn, [w, WORDS[(i + 3) % len(WORDS)]], 25) for i, w in enumerate(WORDS)]


def test_chunks_make_one_segment_each_and_answer_alike(tmp_path, monkeypatch):
    items = _items(1000)
    with engram.open(tmp_path / "one.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) as one:
        one.add_many(items, now=1.0)
        expected = _search(one)
        with one._store.read() as txn:
            assert one.indexes.bm25.layout(txn)["segments"] == 1
    monkeypatch.setattr(bulk, "INGEST_CHUNK", 150)
    with engram.open(tmp_path / "chunked.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        assert db.add_many(iter(items), now=1.0) == [item["id"] for item in items]  # an iterator too
        with db._store.read() as txn:
            layout = db.indexes.bm25.layout(txn)
        assert layout["live_docs"] == 1000 and 1 < layout["segments"] <= 7  # 7 chunks, small ones merged
        assert _search(db) == expected
        assert db.verify() == []
        with pytest.raises(DuplicateIdError):
            db.add_many(_items(300, prefix="x") + [items[0]], now=1.0)  # the repeat is in the third chunk
        assert len(db) == 1000 and "x0" not in db


def test_growth_after_the_replay_log_limit_reruns_the_transaction(tmp_path, monkeypatch):
    monkeypatch.setattr(store_mod, "_REPLAY_LOG_LIMIT", 64 * 1024)
    reruns = []
    replay = store_mod.Txn._regrow_and_replay

    def counting(self):
        reruns.append(self._unlogged)
        return replay(self)

    monkeypatch.setattr(store_mod.Txn, "_regrow_and_replay", counting)
    rnd = random.Random(3)
    items = [{"id": f"b{i}", "metadata": {"blob": rnd.randbytes(4000)}} for i in range(3000)]  # 12 MB
    with engram.open(tmp_path / "g.engram", passphrase=PASSPHRASE, kdf=TEST_KDF, map_size=1 << 20) as db:
        db.add("before", id="before")
        db.add_many(items, now=1.0)
        assert len(db) == 3001
        assert db.get("b2999").metadata == items[-1]["metadata"]
        assert db.verify() == []
        assert True in reruns  # the map grew after the log limit: the transaction ran again
