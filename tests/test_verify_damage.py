"""verify reports each kind of damage it checks for, by name (its checks stream the records
since session 12, comparing digests and flat arrays: these pin what they must still find)."""
from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import PASSPHRASE, TEST_KDF

import engramdb.engram as engram
from engramdb import codec
from engramdb.records import Edge


def _store(path):
    db = engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF)
    db.add_many([{"id": f"m{i}", "content": f"apples pears note {i} " + "plums " * (i % 3)} for i in range(40)],
                now=1.0)
    db.link("m1", "m2", kind="related")
    db.link("m3", "m4", kind="related")
    return db


def _docno(db, txn, id_: str) -> int:
    return codec.from_u64(txn.get("ids", db._id_key(id_)))


def _rewrite_text(db, txn):  # a record's text changes, its postings do not
    key = codec.u64(_docno(db, txn, "m5"))
    node = codec.decode_node(txn.get("nodes", key))
    txn.put("nodes", key, codec.encode_node(replace(node, content="quinces only")))


def _drop_record(db, txn):  # postings and an edge of a memory whose record is gone
    docno = _docno(db, txn, "m1")
    txn.delete("nodes", codec.u64(docno))
    txn.delete("ids", db._id_key("m1"))


def _drop_id_entry(db, txn):
    txn.delete("ids", db._id_key("m7"))


def _wrong_id_entry(db, txn):  # an id entry naming another memory's record
    txn.put("ids", db._id_key("m8"), txn.get("ids", db._id_key("m9")))


def _malformed_id_entry(db, txn):
    txn.put("ids", db._id_key("m10"), b"\x01\x02")


def _drop_reverse_edge(db, txn):
    txn.delete("edges", next(iter(txn.keys("edges", b"r"))))


def _edge_with_other_ids(db, txn):
    a, b = _docno(db, txn, "m3"), _docno(db, txn, "m4")
    db.indexes.graph.put(txn, a, b, Edge(src="m30", dst="m4", kind="related"))


DAMAGE = {
    "differ from their text": (_rewrite_text, ["documents have postings that differ from their text"]),
    "indexed documents no longer exist": (_drop_record, ["1 indexed documents no longer exist",
                                                         "edges point at memories that no longer exist"]),
    "no id entry": (_drop_id_entry, ["has no id entry"]),
    "wrong id entry": (_wrong_id_entry, ["points at a missing or different record"]),
    "malformed id entry": (_malformed_id_entry, ["is malformed"]),
    "reverse edge": (_drop_reverse_edge, ["the reverse index disagrees with the edges (1 entries)"]),
    "edge ids": (_edge_with_other_ids, ["names ids that do not match its nodes"]),
}


@pytest.mark.parametrize("name", sorted(DAMAGE))
def test_verify_names_each_kind_of_damage(tmp_path, name):
    damage, expected = DAMAGE[name]
    with _store(tmp_path / "d.engram") as db:
        assert db.verify() == []
        db._store.write(lambda txn: damage(db, txn))
        problems = [str(p) for p in db.verify()]
    for text in expected:
        assert any(text in p for p in problems), (text, problems)


def test_verify_names_a_record_the_index_lacks(tmp_path):
    with _store(tmp_path / "d.engram") as db:
        with db._store.read() as txn:
            key, id_entry = codec.u64(_docno(db, txn, "m6")), txn.get("ids", db._id_key("m6"))
            record = txn.get("nodes", key)
        db.delete("m6")  # the index drops it ...
        db._store.write(lambda txn: (txn.put("nodes", key, record),  # ... and its record comes back
                                     txn.put("ids", db._id_key("m6"), id_entry)))
        problems = [str(p) for p in db.verify()]
    assert any("1 documents are not indexed" in p for p in problems), problems
    assert any("bm25: statistics say" in p for p in problems), problems


@pytest.mark.parametrize("name", sorted(DAMAGE))
def test_verify_fix_repairs_each_kind_of_damage(tmp_path, name):
    """verify --fix left an edge naming other ids than its memories' as it was, so the next
    verify reported it again (the rebuild rewrote only the reverse index)."""
    damage, _ = DAMAGE[name]
    with _store(tmp_path / "d.engram") as db:
        db._store.write(lambda txn: damage(db, txn))
        assert db.verify(fix=True)
        assert db.verify() == []
        assert [(e.src, e.dst) for e in db.edges("m3")] == [("m3", "m4")]
