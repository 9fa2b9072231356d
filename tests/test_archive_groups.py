"""Archived originals packed in groups by compact (engramdb/maintenance/archive.py,
spec/file-format.md "Archive rows"): the group format round-trips, every original comes
back byte for byte through any mix of archive, unarchive, delete, forget and compact, and
the fuzz target's seed corpus replays."""
from __future__ import annotations

import importlib.util
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engramdb
from engramdb import codec
from engramdb.errors import CorruptFileError
from engramdb.maintenance import archive

from conftest import PASSPHRASE, TEST_KDF

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=400) | \
    st.text(alphabet="ab ", min_size=201, max_size=3000)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**63 - 1), texts), max_size=20, unique_by=lambda m: m[0]))
def test_group_round_trip(members):
    members = sorted(members)
    assert archive.unpack_group(archive.pack_group(members)) == members


@pytest.mark.parametrize("bad", [b"", b"\x01", archive.GROUP_MARK + b"junk",
                                 archive.GROUP_MARK + codec.pack_archive("x")[:-2]])
def test_a_damaged_group_is_a_corrupt_file_error(bad):
    with pytest.raises(CorruptFileError):
        archive.unpack_group(bad)


def test_a_group_with_unordered_or_malformed_members_is_refused():
    import zstandard

    for body in ([[2, "a"], [1, "b"]], [[1, "a"], [1, "b"]], [[1, 2]], [["1", "a"]], [[-1, "a"]], {"a": 1}):
        with pytest.raises(CorruptFileError):
            archive.unpack_group(archive.GROUP_MARK + zstandard.ZstdCompressor().compress(codec.pack(body)))


ops = st.lists(st.tuples(st.sampled_from(["archive", "unarchive", "delete", "compact", "add", "truncate"]),
                         st.integers(0, 11)), min_size=1, max_size=25)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(contents=st.lists(texts, min_size=12, max_size=12), steps=ops)
def test_originals_survive_any_mix_of_archive_unarchive_delete_and_compact(tmp_path_factory, contents, steps):
    path = tmp_path_factory.mktemp("groups") / "g.engram"
    db = engramdb.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF)
    try:
        model = {}  # id -> original content, for every memory present
        archived = set()
        truncated = set()
        for i, text in enumerate(contents):
            db.add(text, id=f"m{i}", now=1.0)
            model[f"m{i}"] = text
        for op, i in steps:
            id_ = f"m{i}"
            if op == "add" and id_ not in model:
                db.add(contents[i], id=id_, now=1.0)
                model[id_] = contents[i]
            elif id_ not in model or op == "add":
                continue
            elif op == "archive" and id_ not in truncated:
                db.archive(id_)
                archived.add(id_)
            elif op == "truncate" and id_ not in archived:
                if db.archive(id_, truncate=True) or len(model[id_]) > archive.PREVIEW_CHARS:
                    truncated.add(id_)
                archived.add(id_)
            elif op == "unarchive" and id_ not in truncated:
                db.unarchive(id_)
                archived.discard(id_)
            elif op == "delete":
                db.delete(id_)
                del model[id_]
                archived.discard(id_)
                truncated.discard(id_)
            elif op == "compact":
                db.compact()
            for j, text in model.items():
                if j not in truncated:
                    assert db.get(j, full=True).content == text
        assert db.verify() == []
        db.compact()
        for j, text in model.items():
            if j not in truncated:
                assert db.get(j, full=True).content == text
                assert db.get(j).archived == (j in archived)
        with db._store.read() as txn:
            stored = dict(archive.iter_originals(txn))
        assert sorted(stored.values()) == sorted(model[j] for j in archived - truncated)
        assert db.verify() == []
    finally:
        db.close()


def test_forget_rewrites_the_group_without_the_memory(make_db, now):
    db = make_db("f.engram", encrypted=False)
    db.add_many([{"id": f"m{i}", "content": f"note {i} " + "ordinary words " * 40} for i in range(20)], now=now)
    db.add("the zanzibarish quokkafication " * 20, id="secret", now=now)
    with db.transaction() as tx:
        for i in range(20):
            tx.archive(f"m{i}")
        tx.archive("secret")
    db.compact()
    with db._store.read() as txn:
        assert all(codec.from_u64(k) & archive.GROUP_BIT for k in txn.keys("archive"))
    receipt = db.forget(ids=["secret"])
    assert receipt.removed["archive"] == 1
    with open(db.path, "rb") as fh:
        data = fh.read()
    assert b"quokkafication" not in data and b"zanzibarish" not in data
    assert db.get("m7", full=True).content == "note 7 " + "ordinary words " * 40
    assert db.verify() == []


def test_verify_reports_a_group_member_that_also_has_its_own_row(make_db, now):
    db = make_db()
    db.add("x " * 300, id="a", now=now)
    db.archive("a")
    db.compact()
    with db._store.read() as txn:
        docno = next(archive.iter_originals(txn))[0]
    db._store.write(lambda txn: txn.put("archive", codec.u64(docno), codec.pack_archive("other")))
    assert [(p.kind, p.detail) for p in db.verify()] == [("archive", f"memory {docno} has two archived originals")]
    db._store.write(lambda txn: txn.delete("archive", codec.u64(docno)))
    assert db.get("a", full=True).content == "x " * 300
    with db._store.read() as txn:  # a group whose range is damaged: a docno beyond its key
        key, value = next(txn.items("archive"))
    db._store.write(lambda txn: (txn.delete("archive", key),
                                 txn.put("archive", codec.u64(archive.GROUP_BIT | (docno - 1)), value)))
    assert [(p.kind, p.detail) for p in db.verify()] == [
        ("archive", f"archive group {codec.u64(archive.GROUP_BIT | (docno - 1)).hex()} holds docnos outside its range")]
    db._store.write(lambda txn: (txn.delete("archive", codec.u64(archive.GROUP_BIT | (docno - 1))),
                                 txn.put("archive", key, value)))


def _fuzz_target():
    spec = importlib.util.spec_from_file_location("fuzz_archive", os.path.join(ROOT, "fuzz", "fuzz_archive.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fuzz_corpus_and_seeds_replay():
    target = _fuzz_target()
    folder = os.path.join(ROOT, "fuzz", "corpus", "archive")
    inputs = list(target.seeds())  # today's writers' bytes, and the committed corpus
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as fh:
            inputs.append(fh.read())
    assert len(inputs) >= 20
    for data in inputs:
        target.TestOneInput(data)


def test_the_fuzz_oracle_can_fail():
    target = _fuzz_target()
    good = b"\x00" + archive.pack_group([(1, "a"), (2, "b")])
    target.TestOneInput(good)
    real = archive.pack_group
    try:
        archive.pack_group = lambda members: real(list(members)[:-1])  # a writer that loses one
        with pytest.raises(AssertionError):
            target.TestOneInput(good)
    finally:
        archive.pack_group = real


def test_delete_many_takes_the_originals_out_of_their_groups(make_db, now):
    db = make_db()
    db.add_many([{"id": f"m{i:02}", "content": f"memory {i} " + "some longer words " * 20} for i in range(40)],
                now=now)
    with db.transaction() as tx:
        for i in range(0, 40, 2):
            tx.archive(f"m{i:02}")
    db.compact()
    with db._store.read() as txn:
        assert all(codec.from_u64(k) & archive.GROUP_BIT for k in txn.keys("archive"))
    assert db.delete_many([f"m{i:02}" for i in range(0, 40, 3)]) == 14
    assert db.verify() == []
    for i in range(40):
        if i % 3:
            assert db.get(f"m{i:02}", full=True).content == f"memory {i} " + "some longer words " * 20
    with db._store.read() as txn:
        assert len(list(archive.iter_originals(txn))) == len([i for i in range(0, 40, 2) if i % 3])
