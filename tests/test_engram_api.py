"""The Engram facade: records, transactions, scans, keys and errors, as a user calls them."""
from __future__ import annotations

import pytest

import engramdb
from engramdb import (
    DuplicateIdError, ModeMismatchError, Node, NotFoundError, ReadOnlyError, ValidationError, WrongPassphraseError,
)

from conftest import NOW, PASSPHRASE, TEST_KDF


def test_add_get_update_delete(make_db):
    db = make_db()
    mid = db.remember("Alice moved to Berlin", tags=["people"], importance=0.8, now=NOW)
    node = db.get(mid)
    assert (node.content, node.tags, node.importance, node.created_at, node.last_accessed) == \
        ("Alice moved to Berlin", ("people",), 0.8, NOW, NOW)
    assert mid in db and "nope" not in db and len(db) == 1
    new = db.update(mid, tier="warm", access_count=3)
    assert db.get(mid) == new and new.tier == "warm" and new.content == node.content
    assert db.delete(mid) is True
    assert mid not in db and len(db) == 0
    assert db.delete(mid, missing_ok=True) is False
    with pytest.raises(NotFoundError):
        db.get(mid)
    assert db.get(mid, None) is None


def test_add_accepts_node_mapping_and_text(make_db):
    db = make_db()
    a = db.add(Node(id="a", content="from a node"))
    b = db.add({"id": "b", "content": "from a mapping", "tags": ["t"]})
    c = db.add("from text", id="c")
    assert (a, b, c) == ("a", "b", "c")
    assert [n.id for n in db] == ["a", "b", "c"]  # insertion order


def test_errors_are_engram_errors_with_hints(make_db):
    db = make_db()
    db.add("x", id="same")
    with pytest.raises(DuplicateIdError) as info:
        db.add("y", id="same")
    assert info.value.hint and "db.update(" in str(info.value)
    with pytest.raises(ValidationError):
        db.add("x", tier="lukewarm")
    with pytest.raises(ValidationError):
        db.add("x", colour="blue")
    with pytest.raises(ValidationError):
        db.update("same", id="other")
    with pytest.raises(NotFoundError):
        db.update("missing", tier="cold")
    with pytest.raises(KeyError):  # NotFoundError is also a KeyError
        db.delete("missing")


def test_add_many_is_all_or_nothing(make_db):
    db = make_db()
    db.add("existing", id="dup")
    with pytest.raises(DuplicateIdError):
        db.add_many([{"id": "n1", "content": "one"}, {"id": "dup", "content": "two"}])
    assert len(db) == 1 and "n1" not in db
    with pytest.raises(DuplicateIdError):
        db.add_many([{"id": "r", "content": "1"}, {"id": "r", "content": "2"}])
    assert len(db) == 1


def test_transaction_commits_or_rolls_back(make_db):
    db = make_db()
    with db.transaction() as tx:
        tx.add("first", id="1")
        tx.add("second", id="2")
        assert tx.get("1").content == "first"  # reads see the transaction's own writes
    assert len(db) == 2
    with pytest.raises(RuntimeError), db.transaction() as tx:
        tx.delete("1")
        tx.update("2", tier="cold")
        raise RuntimeError("abort")
    assert "1" in db and db.get("2").tier == "hot"


def test_scan_filters(make_db):
    db = make_db()
    db.add_many([
        {"id": "a", "content": "a", "tier": "hot", "tags": ["x", "y"], "created_at": 10.0},
        {"id": "b", "content": "b", "tier": "warm", "tags": ["x"], "created_at": 20.0},
        {"id": "c", "content": "c", "tier": "cold", "created_at": 30.0},
    ])
    assert [n.id for n in db.scan(tier="hot")] == ["a"]
    assert [n.id for n in db.scan(tier=["hot", "warm"])] == ["a", "b"]
    assert [n.id for n in db.scan(tags=["x"])] == ["a", "b"]
    assert [n.id for n in db.scan(tags=["x", "y"])] == ["a"]
    assert [n.id for n in db.scan(after=15.0)] == ["b", "c"]
    assert [n.id for n in db.scan(before=30.0)] == ["a", "b"]
    # small batches exercise the snapshot-per-batch path
    assert [n.id for n in db.scan(batch=1)] == ["a", "b", "c"]


def test_reopen_keeps_everything(tmp_path):
    path = tmp_path / "r.engram"
    with engramdb.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add_space("e", dims=2, normalize=False)
        db.add("persisted", id="p", metadata={"k": [1, 2.5, None, {"n": b"\x00"}]}, embeddings={"e": [0.5, 1.0]})
        before = db.get("p")
    with engramdb.open(path, passphrase=PASSPHRASE) as db:
        assert db.get("p") == before


def test_readonly_refuses_writes(tmp_path):
    path = tmp_path / "ro.engram"
    engramdb.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF).close()
    with engramdb.open(path, passphrase=PASSPHRASE, readonly=True) as db:
        assert len(db) == 0
        with pytest.raises(ReadOnlyError):
            db.add("no")


def test_mode_mismatch_both_ways(tmp_path):
    plain = tmp_path / "plain.engram"
    with engramdb.open(plain, encrypted=False) as db:
        db.add("visible", id="v")
        assert not db.encrypted
    with pytest.raises(ModeMismatchError):
        engramdb.open(plain, passphrase="x")
    enc = tmp_path / "enc.engram"
    engramdb.open(enc, passphrase=PASSPHRASE, kdf=TEST_KDF).close()
    with pytest.raises(ModeMismatchError):
        engramdb.open(enc)
    with pytest.raises(ModeMismatchError):
        engramdb.open(tmp_path / "new.engram")  # a new encrypted file needs a key


def test_rekey_recovery_and_raw_key(tmp_path):
    path = tmp_path / "k.engram"
    with engramdb.open(path, passphrase="old", kdf=TEST_KDF) as db:
        db.add("secret", id="s")
        recovery = db.add_recovery_key()
        db.rekey("new", kdf=TEST_KDF)
    with pytest.raises(WrongPassphraseError):
        engramdb.open(path, passphrase="old")
    with engramdb.open(path, passphrase="new") as db:
        assert db.get("s").content == "secret"
    with engramdb.open(path, key=recovery.lower()) as db:  # case and dashes are forgiven
        assert db.get("s").content == "secret"
    raw = bytes(range(32))
    with engramdb.open(tmp_path / "raw.engram", key=raw) as db:
        db.add("k", id="k")
    with engramdb.open(tmp_path / "raw.engram", key=raw) as db:
        assert "k" in db
    with pytest.raises(WrongPassphraseError):
        engramdb.open(tmp_path / "raw.engram", key=bytes(32))


def test_export_and_import_key_repairs_a_destroyed_header(tmp_path):
    import lmdb

    path = tmp_path / "h.engram"
    with engramdb.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("keep me", id="m")
        db.export_key(tmp_path / "h.key")
    env = lmdb.open(str(path), subdir=False, max_dbs=32)
    meta = env.open_db(b"t0")
    with env.begin(write=True, db=meta) as txn:
        for key in (b"header", b"header.bak"):
            txn.put(key, b"garbage")
    env.close()
    with pytest.raises(engramdb.CorruptFileError):
        engramdb.open(path, passphrase=PASSPHRASE)
    with pytest.raises(WrongPassphraseError):
        engramdb.import_key(path, tmp_path / "h.key", passphrase="wrong")
    engramdb.import_key(path, tmp_path / "h.key", passphrase=PASSPHRASE)
    with engramdb.open(path, passphrase=PASSPHRASE) as db:
        assert db.get("m").content == "keep me" and db.verify() == []


def test_info_reports_counts_and_slots(make_db):
    db = make_db()
    db.add_many(["a", "b"])
    info = db.info()
    assert info["memories"] == 2 and info["encrypted"] and info["format"] == "engramdb"
    assert [s["kind"] for s in info["key_slots"]] == ["passphrase"]


def test_verify_fix_rebuilds_the_id_map(make_db):
    db = make_db()
    db.add_many([{"id": f"n{i}", "content": str(i)} for i in range(5)])
    with db._store.transaction() as txn:  # damage derived data: drop one id entry
        txn.delete("ids", db._id_key("n3"))
    problems = db.verify()
    assert any(p.kind == "ids" for p in problems)
    db.verify(fix=True)
    assert db.verify() == [] and db.get("n3").content == "3"


@pytest.mark.parametrize("importance", [-0.1, 1.5, 10**400])
def test_importance_must_be_between_0_and_1(make_db, importance):
    """Regression: importance=5.0 was stored (decay divides by 1 + 2 * importance), and
    10**400 raised a bare OverflowError."""
    db = make_db()
    with pytest.raises(ValidationError) as info:
        db.add("x", importance=importance)
    assert info.value.hint
    assert db.get(db.add("y", importance=1)).importance == 1.0


def test_add_many_restores_the_garbage_collector_even_across_threads(make_db):
    """add_many pauses the cyclic GC; overlapping calls from threads must leave it as found."""
    import gc
    import threading

    db = make_db()
    assert gc.isenabled()
    threads = [threading.Thread(target=lambda n=n: db.add_many([f"t{n} memory {i}" for i in range(300)]))
               for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert gc.isenabled() and len(db) == 1200
    gc.disable()
    try:
        db.add_many(["while the caller keeps gc off"])
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_compact_merges_away_a_deleted_memorys_postings(make_db):
    """A deleted memory's terms stay in a large live segment (as tombstoned postings) until a
    merge; compact() is the documented way to make deleted data leave the file."""
    db = make_db()
    ids = db.add_many(["zanzibar quokka secret"] + [f"keep memory {i}" for i in range(300)])
    db.delete(ids[0])
    term_key = db._store.blind(b"term", db.indexes.tokenizer("zanzibar")[0].encode())

    def stored() -> bool:  # a live segment holds the term's block (per-term or packed: spec/bm25.md)
        bm25 = db.indexes.bm25
        with db._store.read() as txn:
            d = bm25._directory(txn)
            return any(blind == term_key for segno in d.segs for blind, _ in bm25._segment_blocks(txn, d, segno))

    assert stored()  # still in the segment
    db.compact()
    assert not stored()
    assert db.recall("zanzibar") == [] and len(db) == 300


def test_numpy_scalars_are_taken_as_the_numbers_they_hold(make_db):
    # a pandas frame's rows hold NumPy scalars: "importance must be a number, got float64"
    # for an int64, float32 or bool_ (NumPy's float64 subclasses float and passed)
    import numpy as np

    from engramdb import codec
    from engramdb.records import Edge, Node

    given = {"importance": np.float32(0.5), "access_count": np.int64(3), "created_at": np.int64(1_700_000_000),
             "last_accessed": np.float32(2.5), "weight": np.int32(2), "source_start": np.uint16(1),
             "source_end": np.int64(4), "pinned": np.bool_(True)}
    plain = {k: v.item() for k, v in given.items()}
    node = Node(id="x", **given)
    assert node == Node(id="x", **plain) and codec.encode_node(node) == codec.encode_node(Node(id="x", **plain))
    assert all(type(getattr(node, k)) is type(Node(id="x", **plain).__dict__[k]) for k in given)
    assert Edge(src="a", dst="b", weight=np.float32(0.5)).weight == 0.5
    db = make_db()
    db.add_many([{"id": "a", "content": "text", **given}, {"id": "b", "content": "text", **plain}])
    a, b = db.get("a"), db.get("b")
    assert a.replace(id="b") == b
    meta = Node(id="x", metadata={"n": np.int64(7), "f": np.float32(0.5), "b": np.bool_(False), "l": [np.uint8(1)]})
    assert meta.metadata == {"n": 7, "f": 0.5, "b": False, "l": [1]} and type(meta.metadata["n"]) is int
    for bad in ({"access_count": np.int64(-1)}, {"importance": np.float64(2)}, {"pinned": np.int64(1)},
                {"metadata": {"x": np.float64("nan")}}, {"metadata": {"x": np.complex64(1)}}):
        with pytest.raises(engramdb.ValidationError):
            Node(id="x", **bad)


@pytest.mark.parametrize("native", [True, False], ids=["native", "pure"])
def test_a_list_field_or_tier_of_the_wrong_type_is_a_validation_error(make_db, monkeypatch, native):
    # tags=5 raised a raw TypeError ("'int' object is not iterable"), tags/tier as a NumPy
    # array a raw ValueError ("truth value of an array ... is ambiguous"), tags=0 or False
    # stored no tags; the same with the C extension's column pass and without it
    import numpy as np

    from engramdb import _accel

    if not native:
        monkeypatch.setattr(_accel, "NATIVE", None)
    db = make_db()
    for field, bad in (("tags", 5), ("tags", 0), ("flags", True), ("entities", 1.5), ("topics", np.float32(1)),
                       ("tags", object()), ("tier", np.array(["hot", "warm"])), ("tier", ["hot"])):
        rows = [{"id": f"{i}", "content": "text", field: bad} for i in range(3)]
        for call, arg in ((db.add, rows[0]), (db.add_many, rows), (db.import_many, rows)):
            with pytest.raises(engramdb.ValidationError, match=field):
                call(arg)
    assert len(db) == 0
    kept = db.add("text", tags=np.array(["a", "b"]), tier=np.str_("warm"))  # the strings they hold
    assert db.get(kept).tags == ("a", "b") and db.get(kept).tier == "warm"


@pytest.mark.parametrize("bad", ["abc", "2020", [1], True, float("nan"), float("inf")])
def test_an_injected_clock_that_is_not_a_number_is_a_validation_error(make_db, bad):
    # now_ts did float(now): "abc" raised a raw ValueError, "2020" was 2020 seconds, True was 1.0
    db = make_db()
    db.add("x " * 300, id="a")
    calls = [lambda: db.add("y", id="y", now=bad), lambda: db.archive("a", now=bad),
             lambda: db.link("a", "y", now=bad), lambda: db.maintain(now=bad)]
    for call in calls:
        with pytest.raises(engramdb.ValidationError) as exc:
            call()
        assert "now" in exc.value.message
    assert db.ids() == ["a"] and not db.get("a").archived
