"""Vectors stored once, as numbers (issue 15): the docno-range blocks, NumPy input, the first
layout still read and converted, tampered blocks, and the bounded matrix cache."""
from __future__ import annotations

import io
import itertools

import lmdb
import msgpack
import numpy as np
import pytest
from conftest import GOLDEN, PASSPHRASE, TEST_KDF, golden_copy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engramdb
from engramdb import codec
from engramdb.errors import DecryptionError, EmbeddingError
from engramdb.index import vectors as vec_mod
from engramdb.records import Node

DIMS = 1536  # rows_per_block(1536) == 9: a few dozen memories span several blocks
_FILES = itertools.count()  # a new file for every hypothesis example


def _raw_env(path):
    return lmdb.open(str(path), subdir=False, max_dbs=32, readonly=True, lock=False)


def _record_schemas(path) -> list[int]:
    """The schema version of every node record, read without engramdb's decoder (plaintext file)."""
    env = _raw_env(path)
    out = []
    with env.begin() as txn:
        for _, value in txn.cursor(db=env.open_db(b"t1", txn=txn, create=False)):
            body = value[1:]  # the plaintext envelope's version byte
            data = body[1:] if body[0] == codec.CODEC_MSGPACK else codec._decompress(body[1:], "record")
            out.append(msgpack.unpackb(data, raw=False)[0])
    env.close()
    return out


def _vector_values(path) -> list[bytes]:
    env = _raw_env(path)
    with env.begin() as txn:
        values = [bytes(v) for _, v in txn.cursor(db=env.open_db(b"t5", txn=txn, create=False))]
    env.close()
    return values


# --- NumPy input ---------------------------------------------------------------------------------

def test_numpy_input_is_kept_as_float32_without_python_floats(make_db):
    frozen = np.arange(4, dtype=np.float32)
    frozen.flags.writeable = False
    assert Node(id="a", embeddings={"s": frozen}).embeddings["s"] is frozen  # not even copied
    mine = np.asarray([0.1, 0.2, 0.3, 0.4], dtype=np.float32)
    node = Node(id="b", embeddings={"s": mine})
    got = node.embeddings["s"]
    assert type(got) is np.ndarray and got.dtype == np.float32 and not got.flags.writeable
    assert got.tobytes() == mine.tobytes() and not np.shares_memory(got, mine)  # a frozen copy
    mine[0] = 9.0
    assert got[0] == np.float32(0.1)  # the node does not change with the caller's array

    db = make_db(encrypted=False, passphrase=None)
    db.add_space("s", dims=4, model="m", normalize=False)
    db.add("numpy", id="np", embeddings={"s": np.asarray([0.1, 0.2, 0.3, 0.4], dtype=np.float32)})
    db.add_many([{"id": f"m{i}", "content": "x", "embeddings": {"s": row}}
                 for i, row in enumerate(np.eye(4, dtype=np.float32))])
    back = db.get("np").embeddings["s"]
    assert back.dtype == np.float32 and back.tobytes() == np.asarray([0.1, 0.2, 0.3, 0.4], np.float32).tobytes()
    assert db.get("m2").embeddings["s"].tolist() == [0.0, 0.0, 1.0, 0.0]


def test_numpy_and_list_inputs_give_identical_stored_bytes(tmp_path):
    values = [0.1, -2.5, 3.25, 1e-7]
    paths = []
    for name, vec in (("list", values), ("tuple", tuple(values)), ("numpy", np.asarray(values, np.float32)),
                      ("float64", np.asarray(values, np.float64))):
        path = tmp_path / f"{name}.engram"
        with engramdb.open(path, encrypted=False) as db:
            db.add_space("s", dims=4, model="m", normalize=False)
            db.add("same text", id="same", embeddings={"s": vec}, now=1.0)
        paths.append(path)
    first = _vector_values(paths[0])
    assert len(first) == 2  # the directory and one block
    for path in paths[1:]:
        assert _vector_values(path) == first


def test_dimension_and_dtype_mismatches_are_clear_errors(make_db):
    db = make_db()
    db.add_space("s", dims=3, model="m", normalize=False)
    with pytest.raises(EmbeddingError, match="3 dims"):
        db.add("x", embeddings={"s": np.zeros(4, np.float32)})
    with pytest.raises(engramdb.ValidationError, match="numbers"):
        db.add("x", embeddings={"s": np.asarray(["a", "b", "c"])})
    with pytest.raises(engramdb.ValidationError, match="1-D"):
        db.add("x", embeddings={"s": np.zeros((1, 3), np.float32)})
    with pytest.raises(engramdb.ValidationError, match="NaN"):
        db.add("x", embeddings={"s": np.asarray([1.0, np.nan, 0.0], np.float32)})
    assert len(db) == 0


# --- one copy, in blocks ------------------------------------------------------------------------

def test_a_vector_is_stored_once_in_a_block_not_in_its_record(tmp_path):
    path = tmp_path / "once.engram"
    vec = np.linspace(-1, 1, DIMS, dtype=np.float32)
    with engramdb.open(path, encrypted=False) as db:
        db.add_space("s", dims=DIMS, model="m", normalize=False)
        db.add("with a vector", id="v", embeddings={"s": vec})
        db.add("without one", id="w")
    # schema 3 (compact) records; read, the one with a vector names its space as schema 2 did
    assert _record_schemas(path) == [codec.NODE_SCHEMA_COMPACT] * 2
    env = _raw_env(path)
    with env.begin() as txn:
        expanded = [codec.record_fields(bytes(v)[1:]) for _, v in txn.cursor(db=env.open_db(b"t1", txn=txn, create=False))]
    env.close()
    assert sorted((f[0], f[-1] or None) for f in expanded) == [(codec.NODE_SCHEMA, None), (codec.NODE_SCHEMA_VECTORS, ["s"])]
    raw = b"".join(_vector_values(path))
    assert raw.count(vec.tobytes()) == 1
    env = _raw_env(path)
    with env.begin() as txn:
        records = b"".join(bytes(v) for _, v in txn.cursor(db=env.open_db(b"t1", txn=txn, create=False)))
    env.close()
    assert vec[:8].tobytes() not in records


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["add", "update", "delete", "plain"]), st.integers(0, 40),
                          st.integers(0, 2**31)), min_size=1, max_size=25))
def test_blocks_round_trip_through_adds_updates_and_deletes(make_db, ops):
    """A model dict of the live vectors equals what get(), search and a dump show, whatever
    the order of adds, updates, deletes and memories without vectors across blocks."""
    db = make_db(f"p{next(_FILES)}.engram", encrypted=False, passphrase=None)
    db.add_space("s", dims=DIMS, model="m", normalize=False)
    model: dict[str, np.ndarray] = {}
    plain: set[str] = set()
    for op, i, seed in ops:
        id_ = f"m{i}"
        vec = np.random.default_rng(seed).standard_normal(DIMS).astype(np.float32)
        exists = id_ in model or id_ in plain
        if op == "add" and not exists:
            db.add("text", id=id_, embeddings={"s": vec})
            model[id_] = vec
        elif op == "plain" and not exists:
            db.add("text", id=id_)
            plain.add(id_)
        elif op == "update" and id_ in model:
            db.update(id_, embeddings={"s": vec})
            model[id_] = vec
        elif op == "delete" and exists:
            db.delete(id_)
            model.pop(id_, None)
            plain.discard(id_)
    for id_, want in model.items():
        assert db.get(id_).embeddings["s"].tobytes() == want.tobytes()
    for id_ in plain:
        assert dict(db.get(id_).embeddings) == {}
    with db._store.read() as txn:
        assert db.indexes.vectors.count(txn, "s") == len(model)
        if model:
            q = next(iter(model.values()))
            hits = db.indexes.vectors.search(txn, "s", q, len(model) + 3)
            want = sorted((float(v @ q) for v in model.values()), reverse=True)
            assert np.allclose([score for _, score in hits], want, rtol=1e-5, atol=1e-3)
            docnos, _ = db.indexes.vectors.scores(txn, "s", q)
            assert docnos.tolist() == sorted(d for d, _ in hits)  # the matrix is in docno order
    assert db.verify() == []


def test_dump_and_restore_are_byte_identical_and_lossless(make_db, tmp_path):
    db = make_db()
    db.add_space("s", dims=DIMS, model="m", normalize=False)
    rng = np.random.default_rng(3)
    db.add_many([{"id": f"n{i}", "content": f"memory {i}", "embeddings": {"s": rng.standard_normal(DIMS)}}
                 for i in range(30)])
    db.delete("n4")
    first = io.StringIO()
    db.dump(first)
    engramdb.restore(io.StringIO(first.getvalue()), tmp_path / "r.engram", passphrase="x", kdf=TEST_KDF)
    with engramdb.open(tmp_path / "r.engram", passphrase="x") as again:
        second = io.StringIO()
        again.dump(second)
        assert again.get("n7").embeddings["s"].tobytes() == db.get("n7").embeddings["s"].tobytes()
    assert second.getvalue() == first.getvalue()


# --- the first layout ---------------------------------------------------------------------------


def test_a_first_layout_file_reads_the_same_before_and_after_its_conversion(tmp_path):
    path = golden_copy(tmp_path)
    with engramdb.open(path, passphrase="golden-passphrase", readonly=True) as db:
        with db._store.read() as txn:
            assert db.indexes.vectors.needs_migration(txn)
            before_hits = db.indexes.vectors.search(txn, "user", [1.0, 0.0, 0.0], 5)
            before_auto = db.indexes.vectors.search(txn, "hashed", db.indexes.vectors.embed_query(
                txn, "hashed", "Alice Berlin"), 5)
        vec = db.get("pref-tea").embeddings["user"]
        assert vec.dtype == np.float32 and vec.tolist() == [0.5, -1.25, 3.0]
        nodes = {n.id: n for n in db}
    with engramdb.open(path, passphrase="golden-passphrase") as db:  # writable: converts
        with db._store.read() as txn:
            assert not db.indexes.vectors.needs_migration(txn)
            assert db.indexes.vectors.search(txn, "user", [1.0, 0.0, 0.0], 5) == before_hits
            assert db.indexes.vectors.search(txn, "hashed", db.indexes.vectors.embed_query(
                txn, "hashed", "Alice Berlin"), 5) == before_auto
            assert db.indexes.vectors.layout(txn)["user"] == {"blocks": 1, "rows": 1, "dead_rows": 0}
        assert {n.id: n for n in db} == nodes
        assert db.verify() == []
        buf = io.StringIO()
        db.dump(buf)
    assert buf.getvalue() == (GOLDEN / "store-v1.aaak").read_text(encoding="utf-8")
    with engramdb.open(path, passphrase="golden-passphrase") as db:  # a second open has nothing to convert
        assert db.get("pref-tea").embeddings["user"].tolist() == [0.5, -1.25, 3.0]


# --- tamper, cache ------------------------------------------------------------------------------

def test_a_tampered_vector_block_is_detected(tmp_path):
    path = tmp_path / "t.engram"
    with engramdb.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add_space("s", dims=DIMS, model="m", normalize=False)
        db.add("a", id="a", embeddings={"s": np.ones(DIMS, np.float32)})
        prefix = db._store.blind(b"space", b"s")
    env = lmdb.open(str(path), subdir=False, max_dbs=32)
    table = env.open_db(b"t5", create=False)
    key = prefix + b"\x01" + (0).to_bytes(8, "big")
    with env.begin(write=True) as txn:
        value = bytearray(txn.get(key, db=table))
        value[len(value) // 2] ^= 0x01  # one bit of one float
        txn.put(key, bytes(value), db=table)
    env.close()
    # repair=True: past the commit-id binding, which refuses any raw LMDB commit (tests/test_store_tamper.py)
    with engramdb.open(path, passphrase=PASSPHRASE, readonly=True, repair=True) as db:
        with pytest.raises(DecryptionError):
            db.get("a")
        with pytest.raises(DecryptionError), db._store.read() as txn:
            db.indexes.vectors.search(txn, "s", np.ones(DIMS, np.float32), 1)
        assert any(p.kind == "decrypt" and p.detail.startswith("vectors/") for p in db.verify())


def test_a_matrix_over_the_cache_limit_is_streamed_with_the_same_answers(make_db):
    rng = np.random.default_rng(5)
    rows = rng.standard_normal((40, DIMS)).astype(np.float32)
    cached = make_db("c.engram", encrypted=False, passphrase=None)
    streamed = make_db("s.engram", encrypted=False, passphrase=None, cache_mb=0.1)  # 40 x 6 KiB > 0.1 MiB
    for db in (cached, streamed):
        db.add_space("s", dims=DIMS, model="m", normalize=False)
        db.add_many([{"id": f"n{i}", "content": "x", "embeddings": {"s": row}} for i, row in enumerate(rows)])
    q = rng.standard_normal(DIMS).astype(np.float32)
    with cached._store.read() as a, streamed._store.read() as b:
        assert cached.indexes.vectors.search(a, "s", q, 7) == streamed.indexes.vectors.search(b, "s", q, 7)
        assert cached.indexes.vectors._caches["s"].live is not None
        assert streamed.indexes.vectors._caches["s"].live is None  # nothing kept beyond the query
        assert streamed.indexes.vectors.cache_bytes == int(0.1 * 2**20)


def test_the_first_search_reads_each_block_once_into_one_matrix(make_db, monkeypatch):
    db = make_db(encrypted=False, passphrase=None)
    db.add_space("s", dims=DIMS, model="m", normalize=False)
    rng = np.random.default_rng(1)
    db.add_many([{"id": f"n{i}", "content": "x", "embeddings": {"s": rng.standard_normal(DIMS)}} for i in range(50)])
    with db._store.read() as txn:
        blocks = db.indexes.vectors.layout(txn)["s"]["blocks"]
    opened = []
    real_open = db._store.sealer.open
    monkeypatch.setattr(db._store.sealer, "open", lambda t, k, e: opened.append(t) or real_open(t, k, e))
    concatenations = []
    real_concat = np.concatenate
    monkeypatch.setattr(vec_mod.np, "concatenate", lambda *a, **k: concatenations.append(1) or real_concat(*a, **k))
    with db._store.read() as txn:
        db.indexes.vectors.search(txn, "s", rng.standard_normal(DIMS), 3)
    assert blocks == -(-51 // vec_mod.rows_per_block(DIMS))  # docnos 1..50 over blocks of 9
    assert opened.count(b"vectors") == blocks + 1  # every block once, plus the directory
    assert concatenations == []
    opened.clear()
    for i in (3, 17, 44):  # reads after a search come from the matrix: no block is decrypted
        db.get(f"n{i}")
    assert opened.count(b"vectors") == 0


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["add", "add", "add", "update", "delete"]), st.integers(0, 30),
                          st.integers(0, 2**31)), min_size=1, max_size=30))
def test_a_long_lived_handle_searches_like_a_fresh_one_after_every_commit(make_db, ops):
    """The cached matrix follows each commit (appended rows in place, anything else reloaded):
    after every commit, its search equals brute force over the live vectors."""
    db = make_db(f"l{next(_FILES)}.engram", encrypted=False, passphrase=None)
    db.add_space("s", dims=DIMS, model="m", normalize=False)
    model: dict[str, np.ndarray] = {}
    q = np.random.default_rng(0).standard_normal(DIMS).astype(np.float32)
    for op, i, seed in ops:
        id_ = f"m{i}"
        vec = np.random.default_rng(seed).standard_normal(DIMS).astype(np.float32)
        if op == "add" and id_ not in model:
            db.add("t", id=id_, embeddings={"s": vec})
            model[id_] = vec
        elif op == "update" and id_ in model:
            db.update(id_, embeddings={"s": vec})
            model[id_] = vec
        elif op == "delete" and id_ in model:
            db.delete(id_)
            del model[id_]
        with db._store.read() as txn:
            hits = db.indexes.vectors.search(txn, "s", q, 100)
            docnos, matrix = db.indexes.vectors._matrix(txn, "s")
        assert np.allclose([s for _, s in hits], sorted((float(v @ q) for v in model.values()), reverse=True),
                           rtol=1e-5, atol=1e-3)
        assert sorted(matrix[j].tobytes() for j in range(docnos.size)) == sorted(v.tobytes() for v in model.values())


def test_one_added_memory_rereads_only_its_block(make_db, monkeypatch):
    db = make_db(encrypted=False, passphrase=None)
    db.add_space("s", dims=DIMS, model="m", normalize=False)
    rng = np.random.default_rng(2)
    db.add_many([{"id": f"n{i}", "content": "x", "embeddings": {"s": rng.standard_normal(DIMS)}} for i in range(40)])
    q = rng.standard_normal(DIMS).astype(np.float32)
    with db._store.read() as txn:
        db.indexes.vectors.search(txn, "s", q, 3)  # loads the matrix
        first = db.indexes.vectors._matrix(txn, "s")[1]
    opened = []
    real_open = db._store.sealer.open
    monkeypatch.setattr(db._store.sealer, "open", lambda t, k, e: opened.append(t) or real_open(t, k, e))
    for i in range(40, 45):
        db.add("y", id=f"n{i}", embeddings={"s": rng.standard_normal(DIMS)})
        opened.clear()
        with db._store.read() as txn:
            db.indexes.vectors.search(txn, "s", q, 3)
            docnos, matrix = db.indexes.vectors._matrix(txn, "s")
        assert opened.count(b"vectors") == 2  # the directory and the one block that changed
        assert docnos.size == i + 1 and np.shares_memory(matrix, first)  # appended in place


def test_a_bulk_add_of_numpy_rows_builds_the_same_nodes_as_one_by_one(make_db):
    """add_many stacks a uniform embeddings column once (Node.from_fields_many): the nodes
    equal those built row by row, the caller's arrays are not shared, and a bad row still
    gives the row-by-row error."""
    rng = np.random.default_rng(4)
    rows = [{"id": f"n{i}", "content": f"c{i}", "embeddings": {"s": rng.standard_normal(8).astype(np.float32)}}
            for i in range(20)]
    bulk = make_db("bulk.engram", encrypted=False, passphrase=None)
    single = make_db("single.engram", encrypted=False, passphrase=None)
    for db in (bulk, single):
        db.add_space("s", dims=8, model="m", normalize=False)
    bulk.add_many(rows, now=5.0)
    for row in rows:
        single.add(dict(row), now=5.0)
    assert list(bulk) == list(single)
    got = Node.from_fields_many([dict(r, created_at=1.0, last_accessed=1.0) for r in rows])
    assert all(not np.shares_memory(n.embeddings["s"], r["embeddings"]["s"]) for n, r in zip(got, rows))
    assert all(not n.embeddings["s"].flags.writeable for n in got)
    bad = [dict(r) for r in rows]
    bad[3] = dict(bad[3], embeddings={"s": np.full(8, np.inf, np.float32)})
    with pytest.raises(engramdb.ValidationError, match="NaN or infinity"):
        bulk.add_many([dict(r, id="x" + r["id"]) for r in bad])
    assert len(bulk) == 20


def test_the_matrices_of_all_spaces_together_stay_within_the_cache_limit(make_db):
    """open(cache_mb=) bounds the vector cache, the matrices of every space together (README
    "Memory"): each space's matrix was checked against the whole limit alone, so a handle
    with three spaces held three times its limit."""
    rng = np.random.default_rng(8)
    rows = {s: rng.standard_normal((40, DIMS)).astype(np.float32) for s in "abc"}
    cached = make_db("c.engram", encrypted=False, passphrase=None)
    bounded = make_db("b.engram", encrypted=False, passphrase=None, cache_mb=0.5)  # one matrix: 40 x 6 KiB
    for db in (cached, bounded):
        for s in "abc":
            db.add_space(s, dims=DIMS, model="m" + s, normalize=False)
        db.add_many([{"id": f"n{i}", "content": "x", "embeddings": {s: rows[s][i] for s in "abc"}}
                     for i in range(40)])
    one = 40 * DIMS * 4
    assert 2 * one <= bounded.indexes.vectors.cache_bytes < 3 * one
    q = rng.standard_normal(DIMS).astype(np.float32)
    for _ in range(2):  # and again, from what the first round kept
        for s in "abc":
            with cached._store.read() as a, bounded._store.read() as b:
                assert cached.indexes.vectors.search(a, s, q, 7) == bounded.indexes.vectors.search(b, s, q, 7)
        held = [c.live[3].nbytes for c in bounded.indexes.vectors._caches.values() if c.live is not None]
        assert sum(held) <= bounded.indexes.vectors.cache_bytes and len(held) == 2
    bounded.add("y", id="new", embeddings={s: rows[s][0] for s in "abc"})  # the kept matrices follow a commit
    cached.add("y", id="new", embeddings={s: rows[s][0] for s in "abc"})
    for s in "abc":
        with cached._store.read() as a, bounded._store.read() as b:
            assert cached.indexes.vectors.search(a, s, q, 7) == bounded.indexes.vectors.search(b, s, q, 7)
    held = [c.live[3].nbytes for c in bounded.indexes.vectors._caches.values() if c.live is not None]
    assert sum(held) <= bounded.indexes.vectors.cache_bytes and len(held) == 2
