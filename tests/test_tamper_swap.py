"""Envelopes moved between keys, tables and stores (reliability test plan T4.5): the
associated data binds every sealed value to its table and key, and the data key is the
store's own, so a value opened anywhere but where it was sealed fails authentication:
1,000 random moves over every table of a populated file, 100 % DecryptionError."""
from __future__ import annotations

import random

import pytest
from conftest import PASSPHRASE, TEST_KDF

import engramdb.engram as engram
from engramdb.errors import DecryptionError
from engramdb.store import HEADER_KEYS, TABLES


def _populated(path):
    db = engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF)
    db.add_space("v", dims=4)
    db.add_many([{"id": f"n{i}", "content": f"alpha beta {i} gamma", "tags": ["t"],
                  "embeddings": {"v": [1.0, float(i), 0.5, -1.0]}} for i in range(60)], now=1.0)
    for i in range(0, 50, 5):
        db.link(f"n{i}", f"n{i + 1}")
    db.archive("n3")
    db.delete("n4")
    return db


def _sealed_entries(db) -> list[tuple[str, bytes, bytes]]:
    with db._store.read() as txn:
        return [(table, key, envelope) for table in TABLES for key, envelope in txn.raw_items(table)
                if not (table == "meta" and key in HEADER_KEYS)]


@pytest.fixture(scope="module")
def two_stores(tmp_path_factory):
    base = tmp_path_factory.mktemp("swap")
    a, b = _populated(base / "a.engram"), _populated(base / "b.engram")
    yield a, b
    a.close()
    b.close()


def test_every_sealed_value_opens_where_it_was_sealed(two_stores):
    db, _ = two_stores
    entries = _sealed_entries(db)
    assert {t for t, _, _ in entries} >= {"meta", "nodes", "ids", "segments", "vectors", "edges", "archive"}
    for table, key, envelope in entries:
        db._store.sealer.open(table.encode(), key, envelope)


def test_envelopes_moved_to_another_key_or_table_never_open(two_stores):
    db, _ = two_stores
    sealer, entries = db._store.sealer, _sealed_entries(db)
    places = sorted({(table, key) for table, key, _ in entries})
    rnd = random.Random(20261201)
    moves = 0
    while moves < 1000:
        table, key, envelope = rnd.choice(entries)
        if rnd.random() < 0.5:
            place = rnd.choice(places)  # another key, of this table or another
        else:
            place = (rnd.choice([t for t in TABLES if t != table]), key)  # the same key in another table
        if place == (table, key):
            continue
        with pytest.raises(DecryptionError):
            sealer.open(place[0].encode(), place[1], envelope)
        moves += 1


def test_envelopes_of_another_store_never_open_even_at_the_same_key(two_stores):
    a, b = two_stores
    b_entries = {(t, k): e for t, k, e in _sealed_entries(b)}
    same_place = [(t, k, e) for t, k, e in _sealed_entries(a) if (t, k) in b_entries]
    assert len(same_place) > 100  # docnos, segment and meta keys coincide between the two files
    for table, key, envelope in same_place:
        with pytest.raises(DecryptionError):
            b._store.sealer.open(table.encode(), key, envelope)


@pytest.mark.parametrize("native", [True, False], ids=["native", "pure"])
def test_every_seal_takes_its_nonce_from_os_urandom_and_none_repeats(monkeypatch, native):
    """Nonce uniqueness (T6.3, at 200,000 seals) on both the C extension's batch path and
    pure Python; every nonce is the next 12 bytes os.urandom gave (never a counter)."""
    import os

    from engramdb import crypto

    sealer = crypto.Sealer(b"\x05" * 32)
    if not native:
        sealer._native = None
    elif sealer._native is None:
        pytest.fail("the C extension is not built: rebuild it (setup.py build_ext --inplace)")
    drawn, real = bytearray(), os.urandom

    def urandom(n: int) -> bytes:
        out = real(n)
        drawn.extend(out)
        return out

    monkeypatch.setattr(crypto.os, "urandom", urandom)
    envelopes = []
    for start in range(0, 200_000, 5_000):
        envelopes += sealer.seal_many(b"nodes", [(b"k%d" % i, b"same") for i in range(start, start + 5_000)], 0)
    envelopes.append(sealer.seal(b"nodes", b"k", b"same", 0))
    nonces = [e[5:17] for e in envelopes]
    assert b"".join(nonces) == bytes(drawn)
    assert len(set(nonces)) == len(nonces)
