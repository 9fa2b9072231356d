"""Txn.repack and Txn.rekey rewrite a whole table inside one transaction in bounded
memory (through a scratch table that never outlives the transaction): the same entries,
digests and answers as before, a memory peak of about one chunk, however large the table."""
from __future__ import annotations

import os
import tracemalloc

import pytest

import engramdb.store as store_mod
from engramdb.crypto import Sealer
from engramdb.errors import CorruptFileError
from engramdb.store import Store


def _fill(store, n: int, size: int) -> None:
    def put(txn):
        txn.insert_many("sources", [(b"k%06d" % i, bytes([i % 251]) * size) for i in range(n)])

    store.write(put)


def _plain(store, table="sources") -> list[tuple[bytes, bytes]]:
    with store.read() as txn:
        return [(key, txn.get(table, key)) for key in txn.keys(table)]


def _no_scratch(store) -> bool:
    with store._env.env.begin() as ltxn:
        return ltxn.get(store_mod._SCRATCH_TABLE) is None


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_repack_streams_and_keeps_every_envelope(store, monkeypatch):
    monkeypatch.setattr(store_mod, "_REWRITE_CHUNK_BYTES", 256 << 10)
    _fill(store, 3000, 4000)  # 12 MB of values
    with store.read() as txn:
        raw = list(txn.raw_items("sources"))
        state = txn.state.digests["sources"][:]
    peak = _peak(lambda: store.write(lambda txn: txn.repack("sources")))
    assert peak < 4 << 20, peak  # a few chunks of 256 KB, never the 12 MB table
    with store.read() as txn:
        assert list(txn.raw_items("sources")) == raw
        assert txn.state.digests["sources"] == state
    assert _no_scratch(store)


def test_rekey_streams_moves_every_entry_and_updates_the_digest(store, monkeypatch):
    monkeypatch.setattr(store_mod, "_REWRITE_CHUNK_BYTES", 256 << 10)
    _fill(store, 3000, 4000)
    before = _plain(store)
    peak = _peak(lambda: store.write(lambda txn: txn.rekey("sources", lambda key: key[::-1])))
    assert peak < 6 << 20, peak
    after = _plain(store)
    assert sorted((key[::-1], value) for key, value in before) == sorted(after)
    assert [key for key, _ in after] == sorted(key for key, _ in after)
    # the digest now describes the moved entries: a reference store written directly agrees
    with store.read() as txn:
        digest = txn.state.digests["sources"]
    other = Store.open(os.path.join(os.path.dirname(store.path), "ref.engram"))
    other.sealer = Sealer(b"\x05" * 32)
    try:
        other.write(lambda txn: txn.insert_many("sources", sorted(after)))
        with other.read() as txn:
            assert txn.state.digests["sources"][0] == digest[0]
    finally:
        other.close()
    assert _no_scratch(store)


def test_rekey_to_one_key_is_refused_and_changes_nothing(store):
    _fill(store, 20, 10)
    before = _plain(store)
    with pytest.raises(CorruptFileError):
        store.write(lambda txn: txn.rekey("sources", lambda key: b"same"))
    assert _plain(store) == before
    assert _no_scratch(store)
    store.write(lambda txn: txn.repack("sources"))  # the scratch table opens again after an abort
    assert _plain(store) == before


def test_a_map_growth_during_a_rewrite_reruns_the_transaction(tmp_path, monkeypatch):
    """The rewrite keeps no replay log: when the map must grow, Store.write runs it again."""
    s = Store.open(tmp_path / "grow.engram")
    s.sealer = Sealer(b"\x05" * 32)
    try:
        _fill(s, 2000, 3000)
        before = _plain(s)
        runs = []

        def rewrite(txn):
            runs.append(1)
            txn.rekey("sources", lambda key: b"x" + key)

        s._env.env.set_mapsize(s._env.env.info()["last_pgno"] * 4096 + (1 << 20))  # nearly full
        s.write(rewrite)
        assert sorted((b"x" + key, value) for key, value in before) == _plain(s)
        assert len(runs) == 2  # the first run hit the end of the map
        assert _no_scratch(s)
    finally:
        s.close()


def test_repack_below_a_fill_rewrites_only_part_empty_tables(store):
    """Rows written in key order fill their pages; rows put one by one in random order, or
    most of them deleted, leave them part empty: only those are rewritten."""
    import random

    _fill(store, 2000, 300)
    with store.read() as txn:
        assert txn.packed_fraction("sources") > 0.8  # written in key order
    assert store.write(lambda txn: txn.repack("sources", below=0.8)) is False  # not below 0.8
    keys = [b"r%06d" % i for i in range(2000)]
    random.Random(1).shuffle(keys)

    def one_by_one(txn):
        for key in keys:
            txn.put("procedures", key, b"x" * 300)

    store.write(one_by_one)
    with store.read() as txn:
        sparse = txn.packed_fraction("procedures")
        before = [(key, txn.get("procedures", key)) for key in txn.keys("procedures")]
        pages = txn.table_bytes("procedures")
    assert sparse < 0.8
    assert store.write(lambda txn: txn.repack("procedures", below=0.8)) is True
    with store.read() as txn:
        assert txn.packed_fraction("procedures") == 1.0
        assert txn.table_bytes("procedures") < pages
        assert [(key, txn.get("procedures", key)) for key in txn.keys("procedures")] == before
    with store.read() as txn:
        assert txn.packed_fraction("ids") == 1.0  # empty
