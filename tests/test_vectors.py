"""Embedding spaces and exact vector search: errors, brute-force equality, blocks, caches."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engramdb import codec
from engramdb.crypto import ENVELOPE_OVERHEAD, Sealer
from engramdb.errors import ConfigMismatchError, CorruptFileError, EmbeddingError, ValidationError
from engramdb.index.vectors import (
    HASHED_MODEL, EmbeddingSpace, HashedTfidfEmbedder, VectorIndex, decode_vector_block, encode_vector_block,
    row_dots, rows_per_block, unit_rows,
)
from engramdb.records import Node
from engramdb.store import Store


def _node(i: int, vec=None, space: str = "s") -> Node:
    return Node(id=f"n{i}", content=f"text {i}", embeddings={} if vec is None else {space: vec})


def _brute(matrix: np.ndarray, docnos: np.ndarray, q: np.ndarray, k: int) -> list[tuple[int, float]]:
    scores = matrix @ q
    order = sorted(range(len(docnos)), key=lambda i: (-float(scores[i]), int(docnos[i])))[:k]
    return [(int(docnos[i]), float(scores[i])) for i in order]


def test_exact_search_equals_brute_force_across_blocks_and_deletes(store):
    rng = np.random.default_rng(7)
    vi = VectorIndex(store.blind, store.last_txnid)
    store.write(lambda txn: vi.add_space(txn, EmbeddingSpace("s", "test-model", 16, normalize=False)))
    vectors = rng.normal(size=(300, 16)).astype(np.float32)
    vectors[5] = vectors[9]  # an exact tie, broken by docno
    for start in range(0, 300, 37):
        batch = [(i + 1, _node(i + 1, vectors[i])) for i in range(start, min(300, start + 37))]
        store.write(lambda txn, batch=batch: vi.apply(txn, batch, ["" for _ in batch], []))
    dead = [3, 50, 51, 299]
    store.write(lambda txn: vi.apply(txn, [], [], [(d, _node(d, vectors[d - 1])) for d in dead]))
    live = np.asarray([i for i in range(1, 301) if i not in dead], dtype=np.uint64)
    matrix = vectors[live.astype(int) - 1]
    for q in (rng.normal(size=16).astype(np.float32), vectors[5]):
        with store.read() as txn:
            got = vi.search(txn, "s", q, 10)
        want = _brute(matrix, live, q, 10)
        assert [d for d, _ in got] == [d for d, _ in want]
        assert np.allclose([s for _, s in got], [s for _, s in want], rtol=1e-6)
    with store.read() as txn:
        assert vi.count(txn, "s") == 296
        assert vi.verify(txn, [(int(d), _node(int(d), vectors[int(d) - 1])) for d in live], [""] * len(live)) == []
    store.write(lambda txn: vi.merge(txn, 10))
    with store.read() as txn:
        assert [d for d, _ in vi.search(txn, "s", vectors[0], 5)] == [d for d, _ in _brute(matrix, live, vectors[0], 5)]


def test_errors_are_embedding_errors_with_hints(store):
    vi = VectorIndex(store.blind, store.last_txnid)
    with pytest.raises(EmbeddingError, match="unknown embedding space"):
        store.write(lambda txn: vi.apply(txn, [(1, _node(1, [1.0, 2.0]))], ["x"], []))
    store.write(lambda txn: vi.add_space(txn, EmbeddingSpace("s", "m", 3)))
    with pytest.raises(EmbeddingError, match="3 dims, got a vector of 2") as err:
        store.write(lambda txn: vi.apply(txn, [(1, _node(1, [1.0, 2.0]))], ["x"], []))
    assert err.value.hint
    with pytest.raises(EmbeddingError, match="unknown embedding space 'other'"):
        store.write(lambda txn: vi.apply(txn, [(1, _node(1, [1.0, 2.0, 3.0], space="other"))], ["x"], []))
    with pytest.raises(EmbeddingError, match="zero vector"):
        store.write(lambda txn: vi.apply(txn, [(1, _node(1, [0.0, 0.0, 0.0]))], ["x"], []))
    with store.read() as txn:
        for bad in ([1.0, float("nan"), 0.0], [1.0, 2.0], [[1.0, 2.0, 3.0, 4.0]], ["a", "b", "c"]):
            with pytest.raises(EmbeddingError):
                vi.search(txn, "s", bad, 3)
        with pytest.raises(EmbeddingError, match="unknown"):
            vi.search(txn, "nope", [1.0, 0.0, 0.0], 3)
    # NaN never reaches the index through a Node either: the record itself refuses it
    with pytest.raises(ValidationError):
        _node(2, [float("nan"), 1.0, 1.0])


def test_space_settings_are_recorded_and_enforced(store):
    vi = VectorIndex(store.blind, store.last_txnid)
    space = EmbeddingSpace("s", "all-MiniLM-L6-v2", 384)
    store.write(lambda txn: vi.add_space(txn, space))
    store.write(lambda txn: vi.add_space(txn, space))  # idempotent
    with pytest.raises(ConfigMismatchError):
        store.write(lambda txn: vi.add_space(txn, EmbeddingSpace("s", "other-model", 384)))
    fresh = VectorIndex(store.blind, store.last_txnid)
    with store.read() as txn:
        assert fresh.spaces(txn) == {"s": space}
    for bad in (dict(name="", model="m", dims=3), dict(name="s", model="", dims=3), dict(name="s", model="m", dims=0),
                dict(name="s", model="m", dims=3, dtype="float16"), dict(name="s", model="m", dims=3, auto=True)):
        with pytest.raises(EmbeddingError):
            EmbeddingSpace(**bad)


def test_normalised_space_is_cosine(store):
    vi = VectorIndex(store.blind, store.last_txnid)
    store.write(lambda txn: vi.add_space(txn, EmbeddingSpace("s", "m", 2)))
    store.write(lambda txn: vi.apply(txn, [(1, _node(1, [10.0, 0.0])), (2, _node(2, [1.0, 1.0]))], ["", ""], []))
    with store.read() as txn:
        hits = vi.search(txn, "s", [0.0, 5.0], 2)
    assert [d for d, _ in hits] == [2, 1]
    assert hits[0][1] == pytest.approx(2 ** -0.5, rel=1e-6)


def test_auto_space_embeds_text_with_the_hashed_model(store):
    vi = VectorIndex(store.blind, store.last_txnid)
    store.write(lambda txn: vi.add_space(txn, EmbeddingSpace("h", HASHED_MODEL, 64, auto=True)))
    nodes = [(1, _node(1)), (2, _node(2)), (3, Node(id="n3", content=""))]
    texts = ["apples and pears", "a red car in the city", ""]
    store.write(lambda txn: vi.apply(txn, nodes, texts, []))
    with store.read() as txn:
        assert vi.count(txn, "h") == 2  # an empty text has no vector
        q = vi.embed_query(txn, "h", "pears")
        assert [d for d, _ in vi.search(txn, "h", q, 1)] == [1]
        assert vi.embed_query(txn, "h", "") is None


def test_hashed_embedder_is_deterministic_and_normalised():
    emb = HashedTfidfEmbedder(32)
    a = emb(["the quick brown fox", "fox fox fox", ""])
    assert a.dtype == np.float32 and a.shape == (3, 32)
    assert np.allclose(np.linalg.norm(a[:2], axis=1), 1.0)
    assert not np.any(a[2])
    # pinned: CRC-32 hashing, so these bytes are the same in every process
    assert HashedTfidfEmbedder(32)(["the quick brown fox"]).tobytes() == a[:1].tobytes()
    with pytest.raises(ValidationError):
        HashedTfidfEmbedder(0)


def test_a_second_handle_refreshes_its_matrix_after_a_commit(store, tmp_path):
    other = Store.open(tmp_path / "raw.engram")  # conftest's `store` fixture file
    other.sealer = store.sealer
    try:
        writer = VectorIndex(store.blind, store.last_txnid)
        reader = VectorIndex(other.blind, other.last_txnid)
        store.write(lambda txn: writer.add_space(txn, EmbeddingSpace("s", "m", 2, normalize=False)))
        store.write(lambda txn: writer.apply(txn, [(1, _node(1, [1.0, 0.0]))], [""], []))
        with other.read() as txn:
            assert reader.search(txn, "s", [1.0, 0.0], 5) == [(1, 1.0)]
        store.write(lambda txn: writer.apply(txn, [(2, _node(2, [2.0, 0.0]))], [""], [(1, _node(1, [1.0, 0.0]))]))
        with other.read() as txn:
            assert reader.search(txn, "s", [1.0, 0.0], 5) == [(2, 2.0)]
    finally:
        other.close()


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 200), st.integers(1, 9), st.data())
def test_vector_block_round_trip(rows, dims, data):
    offsets = np.asarray(sorted(data.draw(st.sets(st.integers(0, rows - 1), max_size=rows))), dtype=np.int64)
    matrix = np.asarray(data.draw(st.lists(st.floats(width=32), min_size=offsets.size * dims,
                                           max_size=offsets.size * dims)), dtype=np.float32).reshape(-1, dims)
    blob = encode_vector_block(offsets, matrix, rows)
    assert len(blob) == 8 + (rows + 7) // 8 + matrix.nbytes  # header, bitmap, the floats: nothing else
    got_o, got_m = decode_vector_block(blob)
    assert got_o.tolist() == offsets.tolist() and got_m.dtype == np.float32
    assert got_m.tobytes() == matrix.tobytes()  # bit for bit (NaN payloads and -0.0 included)


def test_bad_vector_blocks_are_corrupt_file_errors():
    blob = encode_vector_block(np.asarray([1, 2]), np.ones((2, 3), dtype=np.float32), 8)
    flipped_bitmap = blob[:8] + bytes([blob[8] ^ 0x01]) + blob[9:]  # 3 bits set, 2 rows
    beyond = encode_vector_block(np.asarray([1]), np.ones((1, 3), dtype=np.float32), 3)
    beyond = beyond[:8] + b"\x09" + beyond[9:]  # a bit past the block's rows
    no_rows = b"\x00\x00\x00\x00\x03\x00\x00\x00"
    for bad in (blob[:5], blob[:-1], blob + b"\x00", flipped_bitmap, beyond, no_rows):
        with pytest.raises(CorruptFileError):
            decode_vector_block(bad)
    with pytest.raises(ValidationError):
        encode_vector_block(np.asarray([2, 1]), np.ones((2, 3), dtype=np.float32), 8)
    with pytest.raises(ValidationError):
        encode_vector_block(np.asarray([8]), np.ones((1, 3), dtype=np.float32), 8)


def test_rows_per_block_fill_lmdb_overflow_pages():
    for dims in (3, 64, 384, 768, 1536):
        rows = rows_per_block(dims)
        size = ENVELOPE_OVERHEAD + 8 + (rows + 7) // 8 + rows * dims * 4
        pages = (size + 15) // 4096 + 1
        assert size <= 64 * 1024 and rows * dims * 4 / (pages * 4096) > 0.95
    assert rows_per_block(384) == 37  # 14 pages of 4 KiB hold 37 x 1,536 bytes and the header (99.1 %)


def test_local_model_embedder_never_downloads(monkeypatch):
    import sys
    import types

    from engramdb.index.vectors import LocalModelEmbedder

    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # not installed
    with pytest.raises(EmbeddingError, match="not installed") as err:
        LocalModelEmbedder("all-MiniLM-L6-v2")(["x"])
    assert "hashed" in err.value.hint
    calls = []

    class FakeModel:
        def __init__(self, name, **kwargs):
            calls.append((name, kwargs))
            if name == "missing":
                raise OSError("not in the local cache")

        def encode(self, texts, normalize_embeddings, convert_to_numpy):
            return np.ones((len(texts), 4), dtype=np.float64) * (0.5 if normalize_embeddings else 2.0)

    monkeypatch.setitem(sys.modules, "sentence_transformers", types.SimpleNamespace(SentenceTransformer=FakeModel))
    out = LocalModelEmbedder("/models/minilm")(["a", "b"])
    assert out.dtype == np.float32 and out.shape == (2, 4)
    assert calls == [("/models/minilm", {"local_files_only": True})]
    with pytest.raises(EmbeddingError, match="not available locally"):
        LocalModelEmbedder("missing")(["a"])


def test_forced_merge_of_a_space_whose_only_block_was_deleted(make_db):
    """Regression (found by the stateful test): add one memory to an auto space, delete it,
    then merge(force=True) raised numpy's 'need at least one array to concatenate'."""
    db = make_db()
    db.add_space("hashed", dims=16)
    db.delete(db.add("lonely memory"))
    db.delete(db.add(""))  # the stateful test's example: an empty memory
    db.merge_indexes(force=True)
    assert db.recall("lonely") == [] and db.verify() == []


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["s", "t", "none", "both", "short", "list"]), min_size=1, max_size=12),
       st.integers(0, 2**31))
def test_the_one_space_column_path_gives_the_rows_of_the_node_by_node_path(tmp_path_factory, kinds, seed):
    """vectors_for's bulk path (one vector each, one space) and the general one agree, and
    the general one still rejects what the bulk path leaves to it."""
    rng = np.random.default_rng(seed)
    s = Store.open(tmp_path_factory.mktemp("col") / "v.engram")
    s.sealer = Sealer(b"\x05" * 32)
    vi = VectorIndex(s.blind, s.last_txnid)
    s.write(lambda txn: (vi.add_space(txn, EmbeddingSpace("s", "m", 4, normalize=False)),
                         vi.add_space(txn, EmbeddingSpace("t", "m", 4, normalize=True))))

    def vec(n: int = 4) -> np.ndarray:
        return rng.normal(size=n).astype(np.float32) + 0.5

    emb = {"s": lambda: {"s": vec()}, "t": lambda: {"t": vec()}, "none": dict, "both": lambda: {"s": vec(), "t": vec()},
           "short": lambda: {"s": vec(3)}, "list": lambda: {"s": vec().tolist()}}
    nodes = [(i + 1, Node(id=f"n{i}", embeddings=emb[kind]())) for i, kind in enumerate(kinds)]
    with s.read() as txn:
        spaces = vi._read_spaces(txn)
        try:
            want = vi._rows_one_by_one(spaces, nodes)
        except EmbeddingError:
            with pytest.raises(EmbeddingError):
                vi.vectors_for(txn, nodes, [""] * len(nodes))
            return
        got = vi.vectors_for(txn, nodes, [""] * len(nodes))
    s.close()
    assert sorted(got) == sorted(want)
    for name in got:
        assert got[name][0] == want[name][0]
        assert got[name][1].dtype == np.float32 and got[name][1].tobytes() == want[name][1].tobytes()


def test_a_normalised_space_keeps_the_direction_of_large_and_tiny_finite_vectors(make_db):
    # float32 squares overflowed (norm inf: the vector was stored as zeros) or underflowed
    # (norm 0: a nonzero vector was refused as zero)
    db = make_db()
    db.add_space("s", dims=4, model="m")
    big = np.array([3e19, 4e19, 0, 0], dtype=np.float32)
    tiny = np.array([0, 0, 3e-25, 4e-25], dtype=np.float32)
    usual = np.array([1, 2, 2, 0], dtype=np.float32)
    db.add_many([{"id": "big", "content": "b", "embeddings": {"s": big}},
                 {"id": "tiny", "content": "t", "embeddings": {"s": tiny}},
                 {"id": "usual", "content": "u", "embeddings": {"s": usual}}])
    vi = db.indexes.vectors
    with db._store.read() as txn:
        rows = {i: vi.fetch(txn, codec.from_u64(txn.get("ids", db._id_key(i))), ["s"])["s"] for i in ("big", "tiny", "usual")}
        assert np.allclose(rows["big"], [0.6, 0.8, 0, 0]) and np.allclose(rows["tiny"], [0, 0, 0.6, 0.8])
        assert np.array_equal(rows["usual"], usual / np.linalg.norm(usual))  # the float32 path, as before
        assert vi.search(txn, "s", big * 1e10, 1)[0][1] == pytest.approx(1.0)
    with pytest.raises(EmbeddingError):
        db.add("z", id="z", embeddings={"s": np.zeros(4, np.float32)})


def test_a_vector_with_nan_or_infinity_is_an_embedding_error(make_db):
    # spec/vectors.md: it MUST fail with EmbeddingError; the record check raised a plain
    # ValidationError, which `except EmbeddingError` did not catch
    db = make_db()
    db.add_space("s", dims=3, model="m")
    db.add("a", id="a", embeddings={"s": [1, 0, 0]})
    for bad in ([np.nan, 0, 0], [np.inf, 0, 0], np.array([0, -np.inf, 0], np.float32), "abc", [[1, 0, 0]]):
        with pytest.raises(EmbeddingError):
            db.add("x", id="x", embeddings={"s": bad})
        with pytest.raises(EmbeddingError):
            db.update("a", embeddings={"s": bad})
        with pytest.raises(EmbeddingError):
            db.add_many([{"id": "y", "content": "y", "embeddings": {"s": np.asarray([1, 0, 0], np.float32)}},
                         {"id": "x", "content": "x", "embeddings": {"s": bad}}])
    assert db.ids() == ["a"] and np.array_equal(db.get("a").embeddings["s"], [1, 0, 0])


def test_a_bad_query_embedder_is_an_embedding_error(make_db):
    # a non-callable was accepted and the first recall raised TypeError; an embedder that
    # returned text raised a raw ValueError from NumPy
    db = make_db()
    db.add_space("s", dims=3, model="m")
    db.add("hello", id="a", embeddings={"s": [1, 0, 0]})
    with pytest.raises(EmbeddingError):
        db.set_embedder("s", "not callable")
    for embedder in (lambda texts: "abc", lambda texts: [[object()] * 3]):
        db.set_embedder("s", embedder)
        with pytest.raises(EmbeddingError) as exc:
            db.recall("hello")
        assert exc.value.hint
    db.set_embedder("s", lambda texts: np.ones((len(texts), 3), np.float32))
    assert [h.id for h in db.recall("hello")] == ["a"]


def test_a_query_embedder_answering_other_than_one_row_is_an_embedding_error(make_db):
    # a query is one text, so one row (n, dims) with n = 1; the first row of a longer answer
    # was taken as the query's vector (a batch embedder keyed wrongly searched for another
    # text), and an empty answer searched without vectors, both without a word
    db = make_db()
    db.add_space("s", dims=3, model="m")
    db.add("hello", id="a", embeddings={"s": [1, 0, 0]})
    db.add("other", id="b", embeddings={"s": [0, 1, 0]})
    for answer in (np.array([[1, 0, 0], [0, 1, 0]], np.float32), np.zeros((0, 3), np.float32),
                   np.ones((1, 1, 3), np.float32), np.float32(1)):
        db.set_embedder("s", lambda texts, answer=answer: answer)
        with pytest.raises(EmbeddingError, match="for 1 text") as exc:
            db.recall("hello")
        assert exc.value.hint
    for answer in (np.array([[0, 1, 0]], np.float32), np.array([0, 1, 0], np.float32)):  # one row, or one vector
        db.set_embedder("s", lambda texts, answer=answer: answer)
        assert db.recall("zzz", hops=False)[0].id == "b"


def test_add_space_with_a_non_callable_embedder_creates_nothing(make_db):
    # regression: the space was written first, then the embedder refused
    db = make_db()
    with pytest.raises(EmbeddingError, match="callable"):
        db.add_space("s", dims=3, model="m", embedder=5)
    assert "s" not in db.spaces()


def _swap_builtin(db, space, embedder):
    """Stand in for the built-in embedder of ``space`` on this handle (a model that misbehaves:
    set_embedder refuses a built-in space), to reach the checks on what an embedder returns."""
    db.indexes.vectors._builtin[space] = embedder


def test_a_builtin_space_takes_no_embedder(make_db):
    # regression (found by rel): an embedder set on a built-in space wrote this handle's auto
    # vectors with it, while every other handle embeds with the built-in model, so their
    # verify() reported the rows as damaged
    db = make_db()
    fn = lambda texts: np.ones((len(texts), 2), np.float32)  # noqa: E731
    with pytest.raises(EmbeddingError, match="built-in model") as exc:
        db.add_space("s", dims=2, embedder=fn)
    assert exc.value.hint and "s" not in db.spaces()
    db.add_space("s", dims=2)
    with pytest.raises(EmbeddingError, match="built-in model"):
        db.set_embedder("s", fn)
    db.add_space("m", dims=2, model="my-model", embedder=fn)  # a model of the user's: taken
    db.set_embedder("m", fn)


def test_an_embedder_set_before_its_builtin_space_exists_is_refused(make_db):
    # set_embedder on a space not there yet (model unknown) then add_space without model=:
    # the space was the built-in model's, this handle wrote its auto vectors with the user's
    # embedder, and another handle's verify() reported the rows as damaged
    db = make_db()
    fn = lambda texts: np.ones((len(texts), 2), np.float32)  # noqa: E731
    db.set_embedder("s", fn)
    with pytest.raises(EmbeddingError, match="built-in model") as exc:
        db.add_space("s", dims=2)
    assert exc.value.hint and "s" not in db.spaces()
    db.set_embedder("m", fn)  # a model of the user's: taken
    db.add_space("m", dims=2, model="my-model")
    db.add("hello there", id="a")
    assert db.verify() == []


def test_an_embedder_registered_before_another_handle_creates_the_builtin_space_is_not_used(make_db):
    # handle a registered an embedder under "s" before the space existed; handle b then
    # created "s" with the built-in model: a wrote its auto vectors (and embedded its queries)
    # with its own embedder, and b's verify() reported a's rows as damaged
    a = make_db()
    b = make_db()
    a.set_embedder("s", lambda texts: np.ones((len(texts), 2), np.float32))
    b.add_space("s", dims=2)
    a.add("alpha beta gamma", id="x")
    a.add("delta epsilon", id="y")
    assert b.verify() == [] and a.verify() == []
    assert [h.id for h in a.recall("alpha beta gamma", top_k=1)] == ["x"]


def test_an_auto_space_embedder_returning_non_numbers_is_an_embedding_error(make_db):
    # 92498d3 fixed this for queries only: adding to an auto space raised NumPy's raw ValueError
    db = make_db()
    db.add_space("s", dims=2, auto=True)
    _swap_builtin(db, "s", lambda texts: np.ones((len(texts), 2), np.float32))
    db.add("first", id="a")
    _swap_builtin(db, "s", lambda texts: [["x", "y"]] * len(texts))
    with pytest.raises(EmbeddingError) as exc:
        db.add("hello", id="b")
    assert exc.value.hint
    with pytest.raises(EmbeddingError):
        db.add_many([{"id": "c", "content": "hello"}, {"id": "d", "content": "there"}])
    _swap_builtin(db, "s", lambda texts: np.ones((len(texts), 2), np.float32))  # verify re-embeds
    assert db.ids() == ["a"] and db.verify() == []
    assert [h.id for h in db.recall("first")] == ["a"]


def test_an_auto_space_embedder_returning_the_wrong_number_of_rows_is_an_embedding_error(make_db):
    # one row for two texts went to the first memory and the second got none (silently); a
    # 1-D array raised NumPy's AxisError; three rows for two texts an IndexError
    db = make_db()
    db.add_space("s", dims=2, auto=True)
    _swap_builtin(db, "s", lambda texts: np.ones((len(texts), 2), np.float32))
    db.add("first", id="a")
    for embedder in (lambda texts: np.ones((1, 2), np.float32), lambda texts: np.ones(2, np.float32),
                     lambda texts: np.ones((len(texts) + 1, 2), np.float32)):
        _swap_builtin(db, "s", embedder)
        with pytest.raises(EmbeddingError) as exc:
            db.add_many([{"id": "b", "content": "hello"}, {"id": "c", "content": "there"}])
        assert "for 2 texts" in exc.value.message and exc.value.hint
    _swap_builtin(db, "s", lambda texts: np.ones((len(texts), 2), np.float32))  # verify re-embeds
    assert db.ids() == ["a"] and db.verify() == []

def test_an_error_inside_the_embedder_propagates_unchanged(make_db):
    # embed_query wrapped the call itself, so a bug in the user's model was reported as
    # "did not return numbers" and its traceback dropped
    db = make_db()
    db.add_space("s", dims=2, auto=True)
    _swap_builtin(db, "s", lambda texts: np.ones((len(texts), 2), np.float32))
    db.add("first", id="a")

    def broken(texts):
        raise ValueError("model shape mismatch")

    _swap_builtin(db, "s", broken)
    for call in (lambda: db.recall("first"), lambda: db.add("hello", id="b")):
        with pytest.raises(ValueError, match="model shape mismatch") as exc:
            call()
        assert not isinstance(exc.value, EmbeddingError)
        assert exc.traceback[-1].name == "broken"
    _swap_builtin(db, "s", lambda texts: np.ones((len(texts), 2), np.float32))  # verify re-embeds
    assert db.ids() == ["a"] and db.verify() == []


def _unit_rows_reference(arr):
    """unit_rows as 0e8fe3a wrote it (every matrix through the boolean passes): the fast path
    added later must give the same bytes."""
    with np.errstate(over="ignore", under="ignore"):
        norms = np.linalg.norm(arr, axis=1, keepdims=True)
    odd = np.flatnonzero(~(norms[:, 0] >= 1e-15) | ~np.isfinite(norms[:, 0]))
    if not odd.size:
        return (arr / norms).astype(np.float32), np.zeros(arr.shape[0], dtype=bool)
    wide = arr[odd].astype(np.float64)
    wide_norms = np.linalg.norm(wide, axis=1, keepdims=True)
    zero = np.zeros(arr.shape[0], dtype=bool)
    zero[odd] = wide_norms[:, 0] == 0
    norms[odd] = 1.0
    out = (arr / norms).astype(np.float32)
    out[odd] = np.divide(wide, wide_norms, out=np.zeros_like(wide), where=wide_norms > 0)
    return out, zero


_SCALES = [1.0, 0.0, 1e-42, 1e-25, 1e-18, 1e18, 1e20, 1e30, 3e38, np.inf]


@st.composite
def _matrices(draw):
    dims = draw(st.sampled_from([1, 2, 3, 7, 384]))
    rows = []
    for _ in range(draw(st.integers(0, 5))):
        seed, scale = draw(st.integers(0, 2**32 - 1)), draw(st.sampled_from(_SCALES))
        row = np.random.default_rng(seed).standard_normal(dims)
        if draw(st.booleans()):  # a few exact values too: zeros, float32 extremes, inf
            picks = draw(st.lists(st.sampled_from([0.0, 1.0, -3.4e38, 1e-45, np.inf, -np.inf]), min_size=1, max_size=3))
            row[:len(picks)] = picks[:dims]
        with np.errstate(over="ignore", invalid="ignore"):
            rows.append((row * scale).astype(np.float32))
    return np.asarray(rows, dtype=np.float32).reshape(len(rows), dims)


@settings(max_examples=300, deadline=None)
@given(_matrices())
def test_unit_rows_fast_path_gives_the_bytes_of_the_full_function(arr):
    # unit_rows took the boolean float64-branch passes on every call (4-9 us per _check_matrix,
    # twice per space per recall); the fast path must not change a single output byte
    with np.errstate(invalid="ignore"):  # inf / inf in an infinite row (outside the contract)
        out, zero = unit_rows(arr)
        ref_out, ref_zero = _unit_rows_reference(arr)
    assert out.dtype == ref_out.dtype == np.float32 and out.shape == ref_out.shape
    assert out.tobytes() == ref_out.tobytes() and zero.tobytes() == ref_zero.tobytes()
    with np.errstate(over="ignore", under="ignore"):
        norms = np.linalg.norm(arr, axis=1, keepdims=True)
    if np.all(norms >= 1e-15) and np.all(np.isfinite(norms)):  # where engramdb's first fast path applied
        assert out.tobytes() == (arr / norms).astype(np.float32).tobytes() and not zero.any()


def test_unit_rows_fast_path_on_query_and_matrix_shapes():
    rng = np.random.default_rng(7)
    for arr in (rng.standard_normal((1, 384)).astype(np.float32), rng.standard_normal((1000, 384)).astype(np.float32),
                np.zeros((0, 384), np.float32)):
        out, zero = unit_rows(arr)
        ref_out, ref_zero = _unit_rows_reference(arr)
        assert out.tobytes() == ref_out.tobytes() and zero.tobytes() == ref_zero.tobytes()
        assert out.tobytes() == (arr / np.linalg.norm(arr, axis=1, keepdims=True)).astype(np.float32).tobytes()


def test_equal_vectors_score_equal_wherever_they_sit_so_ties_go_by_docno(store):
    """Scores came from BLAS (``matrix @ q``), whose kernel depends on the matrix's shape:
    the last rows of 50 equal vectors scored a float32 ulp apart from the others (here 11 of
    these 16 spaces), so a duplicate added later could rank first (6 of them), and a space
    searched block by block (over the cache limit) scored otherwise than one held whole."""
    vi = VectorIndex(store.blind, store.last_txnid)
    streamed = VectorIndex(store.blind, store.last_txnid, cache_mb=0)
    rng = np.random.default_rng(0)
    for n in range(16):
        space = f"s{n}"
        store.write(lambda txn, space=space: vi.add_space(txn, EmbeddingSpace(space, "test-model", 384)))
        v = rng.standard_normal(384).astype(np.float32)
        q = v + rng.standard_normal(384).astype(np.float32)
        for start in range(0, 50, 7):  # 50 equal vectors, added in batches of 7
            batch = [(i + 1, _node(i + 1, v, space)) for i in range(start, min(50, start + 7))]
            store.write(lambda txn, batch=batch: vi.apply(txn, batch, ["" for _ in batch], []))
        with store.read() as txn:
            scores = vi.scores(txn, space, q)[1]
            assert np.all(scores == scores[0]), space
            assert np.array_equal(streamed.scores(txn, space, q)[1], scores)
            assert [d for d, _ in vi.search(txn, space, q, 50)] == list(range(1, 51))



@pytest.mark.parametrize("stream_rows", [1, 256, 300])
def test_a_streamed_space_scores_as_a_held_one_bit_for_bit(store, monkeypatch, stream_rows):
    """The streamed search gathers blocks (42 rows each at 384 dims, some with deleted rows)
    into a buffer scored at once; every score and docno equals the held matrix's."""
    from engramdb.index import vectors as vec_mod

    monkeypatch.setattr(vec_mod, "STREAM_ROWS", stream_rows)
    vi = VectorIndex(store.blind, store.last_txnid)
    streamed = VectorIndex(store.blind, store.last_txnid, cache_mb=0)
    store.write(lambda txn: vi.add_space(txn, EmbeddingSpace("s", "test-model", 384, normalize=False)))
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((1000, 384)).astype(np.float32)
    batch = [(i + 1, _node(i + 1, rows[i])) for i in range(1000)]
    store.write(lambda txn: vi.apply(txn, batch, ["" for _ in batch], []))
    dead = sorted({int(d) for d in rng.integers(1, 1001, 150)})
    store.write(lambda txn: vi.apply(txn, [], [], [(d, _node(d, rows[d - 1])) for d in dead]))
    q = rng.standard_normal(384).astype(np.float32)
    with store.read() as txn:
        held_docnos, held = vi.scores(txn, "s", q)
        docnos, got = streamed.scores(txn, "s", q)
        assert streamed._matrix(txn, "s") is None  # it did stream
    assert len(got) == 1000 - len(dead) and np.array_equal(docnos, held_docnos)
    assert got.tobytes() == held.tobytes() == row_dots(rows[np.asarray(docnos, np.int64) - 1], q).tobytes()


def test_the_builtin_embedder_remembers_a_bounded_number_of_terms():
    """Its memo of term slots grew to 1,000,000 terms (~146 MiB per space and handle, no
    cache limit), which a long-lived handle reaches on ids, numbers and names."""
    from engramdb.index import vectors as vec_mod

    emb = HashedTfidfEmbedder(64)
    texts = [" ".join(f"t{i * 50 + j:x}" for j in range(50)) for i in range(1000)]  # 50,000 distinct terms
    first = emb(texts)
    assert len(emb._slots) == vec_mod.MAX_SLOTS < 50_000  # before: all 50,000
    assert np.array_equal(emb(texts), first) and np.array_equal(HashedTfidfEmbedder(64)(texts), first)


def test_complex_and_out_of_range_vectors_are_embedding_errors(make_db):
    """A complex array was stored as its real parts (NumPy's cast, with only a ComplexWarning);
    a Python int past float's range raised a raw OverflowError from add and forget; a float
    past float32's range was called "NaN or infinity"."""
    import warnings

    db = make_db(encrypted=False, passphrase=None)
    db.add_space("m", dims=2, model="toy", normalize=False)
    calls = [lambda v: db.add("x", embeddings={"m": v}),
             lambda v: db.add_many([{"content": "x", "embeddings": {"m": v}}]),
             lambda v: db.forget(embedding=v, space="m", dry_run=True)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is cast with a warning either
        for call in calls:
            with pytest.raises(EmbeddingError, match="complex numbers"):
                call(np.array([1 + 2j, 3]))
            for big in ([10**400, 0], np.array([1e39, 0.0]), [-1e39, 1.0]):
                with pytest.raises(EmbeddingError, match="beyond float32's range"):
                    call(big)
        assert db.stats()["memories"] == 0
        db.add_space("q", dims=2, model="toy-q", embedder=lambda texts: np.ones((len(texts), 2), np.complex64))
        db.add("x", embeddings={"q": [1.0, 1.0]})
        with pytest.raises(EmbeddingError, match="complex numbers"):
            db.recall("x")


def test_add_space_refuses_settings_it_would_store_wrongly(make_db):
    """normalize="false" was stored as the string and acted by its truthiness: vectors were
    normalised, re-adding the space with normalize=False was a ConfigMismatchError naming
    the same model and dims, and the dump of the file failed. A NumPy bool was a raw
    TypeError from msgpack, a lone surrogate in a name a raw UnicodeEncodeError."""
    import io

    import msgpack

    from engramdb.index.vectors import SPACES_KEY

    db = make_db(encrypted=False, passphrase=None)
    for kwargs in ({"normalize": "false"}, {"normalize": 0}, {"normalize": None}, {"auto": "no"},
                   {"name": "s\ud800"}, {"model": "m\udc00"}):
        call = {"name": "s", "dims": 2, "model": "m", **kwargs}
        with pytest.raises(EmbeddingError) as exc:
            db.add_space(call.pop("name"), **call)
        assert exc.value.hint
    assert db.spaces() == {}
    db.add_space("s", dims=np.int64(2), model="m", normalize=np.bool_(False), auto=np.bool_(False))
    space = db.spaces()["s"]
    assert (space.dims, space.normalize, space.auto) == (2, False, False)
    assert type(space.dims) is int and type(space.normalize) is bool
    db.add("a", id="a", embeddings={"s": [3.0, 4.0]})
    assert db.get("a").embeddings["s"].tolist() == [3.0, 4.0]
    db.add_space("s", dims=2, model="m", normalize=False)  # the same settings: a no-op
    with pytest.raises(ConfigMismatchError, match="normalize=False"):
        db.add_space("s", dims=2, model="m", normalize=True)
    # a file an older engramdb wrote with normalize="false" reads as what it did (normalised)
    db._store.write(lambda txn: txn.put("meta", SPACES_KEY, msgpack.packb(
        {"s": {"model": "m", "dims": 2, "dtype": "float32", "normalize": "false", "auto": False}})))
    assert db.spaces()["s"].normalize is True
    out = io.StringIO()
    db.dump(out)
    assert "@space s|m|2|float32|1|" in out.getvalue()
    # normalize=None (add_space took it too) was stored as nil and acted as False: such a
    # file was called corrupt (the settings "malformed") by every read of its spaces
    db._store.write(lambda txn: txn.put("meta", SPACES_KEY, msgpack.packb(
        {"s": {"model": "m", "dims": 2, "dtype": "float32", "normalize": None, "auto": None}})))
    space = db.spaces()["s"]
    assert (space.normalize, space.auto) == (False, False)
    out = io.StringIO()
    db.dump(out)
    assert "@space s|m|2|float32|0|" in out.getvalue()


def test_an_update_keeps_the_stored_vectors_it_does_not_change_bit_for_bit(make_db):
    """An update re-wrote the memory's vectors through the space's normalisation, and float32
    normalisation is not idempotent: update(tags=...) moved a stored unit vector by an ulp
    (found by the dump helper: dump -> update -> dump differed in the vector)."""
    db = make_db(encrypted=False, passphrase=None)
    db.add_space("s", dims=4, model="m")
    db.add_space("t", dims=3, model="m2")
    rng = np.random.default_rng(2)
    ids = db.add_many([{"id": f"n{i}", "content": f"note {i}",
                        "embeddings": {"s": rng.standard_normal(4), "t": rng.standard_normal(3)}} for i in range(40)])
    before = {i: {k: v.tobytes() for k, v in db.get(i).embeddings.items()} for i in ids}
    for i in ids:
        db.update(i, tags=("x",))
        db.update(i, embeddings=dict(db.get(i).embeddings))  # the same arrays handed back
        db.update(i, embeddings={"s": db.get(i).embeddings["s"].copy(), "t": db.get(i).embeddings["t"]})
    assert {i: {k: v.tobytes() for k, v in db.get(i).embeddings.items()} for i in ids} == before
    new = rng.standard_normal(4)
    db.update("n3", embeddings={"s": new})  # a new vector is normalised as ever
    assert db.get("n3").embeddings["s"].tobytes() == db.get(db.add("y", embeddings={"s": new})).embeddings["s"].tobytes()
    assert db.verify() == []


def test_a_transaction_reads_and_keeps_the_vectors_it_wrote(make_db):
    """A transaction's index changes wait for its end, and reads took vectors from the blocks:
    a memory added with a vector read back as CorruptFileError ("names a vector ... that is
    not stored"), an updated one with its old vector, and a second update of it (its tags)
    wrote that old vector back: the new vector was lost."""
    db = make_db(encrypted=False, passphrase=None)
    db.add_space("m", dims=3, model="toy", normalize=False)
    a = db.add("alpha", id="a", embeddings={"m": [1.0, 0.0, 0.0]})
    with db.transaction() as t:
        b = t.add("beta", id="b", embeddings={"m": [0.0, 0.0, 2.0]})
        assert t.get(b).embeddings["m"].tolist() == [0.0, 0.0, 2.0]
        assert db.get(b).embeddings["m"].tolist() == [0.0, 0.0, 2.0]
        t.update(a, embeddings={"m": [0.0, 5.0, 0.0]})
        assert t.get(a).embeddings["m"].tolist() == [0.0, 5.0, 0.0]
        t.update(a, tags=("x",))
        db.update(b, tags=("y",))  # the handle's own write joins the transaction
    assert db.get(a).embeddings["m"].tolist() == [0.0, 5.0, 0.0] and db.get(a).tags == ("x",)
    assert db.get(b).embeddings["m"].tolist() == [0.0, 0.0, 2.0] and db.get(b).tags == ("y",)
    with db.transaction() as t:
        t.update(a, embeddings={"m": [3.0, 0.0, 0.0]})
        db.update(a, content="alpha two")  # joins: must not write the old vector back
        t.update(b, content="beta two")
    assert db.get(a).embeddings["m"].tolist() == [3.0, 0.0, 0.0] and db.get(a).content == "alpha two"
    with db._store.read() as txn:
        assert [d for d, _ in db.indexes.vectors.search(txn, "m", np.array([3.0, 0, 0], np.float32), 1)] == [1]
    assert [h.id for h in db.recall("two", top_k=5)] == ["a", "b"]
    with db.transaction() as t:  # a delete, an add and an update in one batch
        t.delete(b)
        t.add("gamma", id="c", embeddings={"m": [0.0, 1.0, 1.0]})
        t.update(a, tags=("z",))
    assert db.get(a).embeddings["m"].tolist() == [3.0, 0.0, 0.0] and db.get("c").embeddings["m"].tolist() == [0, 1, 1]
    assert db.verify() == []
