"""Forget by a query text also compares an archived memory by its archived original
(engramdb/maintenance/forget.py, ``_by_originals``; spec/maintenance.md, "Forget", step 1):
its stub's vector is only its preview's, so a subject past the preview did not choose it and
its full text stayed in the file."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import engramdb
import engramdb.maintenance.forget  # the module (the package's name `forget` is the function)
from engramdb import codec
from engramdb.maintenance import archive

FILLER = " ".join(f"filler{i}" for i in range(40))
SUBJECT = "zebra quagga okapi"


def _archive_values(db) -> list[bytes]:
    """The archive table's values as stored (sealed; the plaintext rows of an unencrypted file)."""
    with db._store.read() as txn:
        return [v for _, v in txn.raw_items("archive")]


def _words_in_originals(db, *words: str) -> list[str]:
    with db._store.read() as txn:
        return sorted({w for _, text in archive.iter_originals(txn) for w in words if w in text})


def test_an_archived_memory_is_chosen_by_a_subject_past_its_preview(make_db, now):
    # the reproduction: the stub's vector is the preview's, which lacks the subject
    db = make_db()
    db.add_space("h", dims=256, auto=True)
    db.add({"id": "a", "content": FILLER + " " + SUBJECT}, now=now)
    db.add({"id": "b", "content": "an unrelated note about tax returns"}, now=now)
    assert db.forget(query=SUBJECT, threshold=0.2, dry_run=True).ids == ("a",)
    db.archive("a")
    assert SUBJECT not in db.get("a").content and db.archived("a").endswith(SUBJECT)
    receipt = db.forget(query=SUBJECT, threshold=0.2, dry_run=True)
    assert receipt.ids == ("a",) and receipt.removed["archive"] == 1
    assert db.archived("a").endswith(SUBJECT)  # a dry run writes nothing


def test_forget_by_query_removes_an_original_kept_in_a_group(make_db, now):
    db = make_db("g.engram", encrypted=False)
    db.add_space("h", dims=256, auto=True)
    notes = {f"m{i}": f"note {i} " + "ordinary garden words " * 20 for i in range(12)}
    notes["s1"] = FILLER + " the zanzibarish quokkafication " + SUBJECT
    notes["s2"] = FILLER.replace("filler", "other") + " zanzibarish quokkafication " + SUBJECT
    db.add_many([{"id": k, "content": v} for k, v in notes.items()], now=now)
    with db.transaction() as tx:
        for id_ in notes:
            tx.archive(id_)
    db.compact()
    with db._store.read() as txn:  # every original sits in a group row
        keys = list(txn.keys("archive"))
        assert keys and all(codec.from_u64(k) & archive.GROUP_BIT for k in keys)
    old = _archive_values(db)
    data = Path(db.path).read_bytes()
    assert old and all(v in data for v in old)  # the check below can fail
    assert _words_in_originals(db, "quokkafication", "quagga") == ["quagga", "quokkafication"]
    query = "zanzibarish quokkafication " + SUBJECT
    dry = db.forget(query=query, threshold=0.3, dry_run=True)
    assert dry.ids == ("s1", "s2") and dry.removed["archive"] == 2 and len(db) == 14
    receipt = db.forget(query=query, threshold=0.3)
    assert receipt.ids == ("s1", "s2") and receipt.removed["archive"] == 2
    data = Path(db.path).read_bytes()  # the group was rewritten without them: the old one left the file
    assert [v for v in old if v in data] == [] and _words_in_originals(db, "quokkafication", "quagga") == []
    assert b"quokkafication" not in data and b"zanzibarish" not in data and b"quagga" not in data
    assert sorted(db.ids()) == sorted(k for k in notes if k.startswith("m"))
    assert all(db.archived(k) == notes[k] for k in db.ids())
    assert db.verify() == []


def test_forget_by_query_removes_an_original_in_its_own_row(make_db, now):
    db = make_db("own.engram", encrypted=False)
    db.add_space("h", dims=256, auto=True)
    db.add({"id": "a", "content": FILLER + " " + SUBJECT}, now=now)
    db.add({"id": "k", "content": "kept: a note about tax returns"}, now=now)
    db.archive("a")
    with db._store.read() as txn:  # its own row, not a group
        docno = codec.from_u64(txn.get("ids", db._id_key("a")))
        assert list(txn.keys("archive")) == [codec.u64(docno)]
    old = _archive_values(db)
    assert len(old) == 1 and old[0] in Path(db.path).read_bytes()
    assert db.forget(query=SUBJECT, threshold=0.2).ids == ("a",)
    data = Path(db.path).read_bytes()
    assert old[0] not in data and b"quagga" not in data and b"okapi" not in data
    assert db.ids() == ["k"] and db.verify() == []


def test_a_preview_match_is_enough(make_db, now):
    # either the stub's vector or the original reaching the threshold chooses the memory
    db = make_db()
    db.add_space("h", dims=256, auto=True)
    tail = " ".join(f"tail{i}" for i in range(300))
    db.add({"id": "p", "content": SUBJECT + " " + tail}, now=now)
    db.archive("p")
    with db._store.read() as txn:
        embed = db.indexes.vectors.embed_query
        q = embed(txn, "h", SUBJECT)
        preview, original = embed(txn, "h", db.get("p").content), embed(txn, "h", db.archived("p"))
    threshold = 0.25
    assert float(preview @ q) >= threshold > float(original @ q)  # only the preview matches
    assert db.forget(query=SUBJECT, threshold=threshold, dry_run=True).ids == ("p",)
    assert db.forget(query=SUBJECT, threshold=threshold).ids == ("p",)


def test_an_original_without_indexed_terms_is_not_compared(make_db, now):
    # its vector is zero: no direction, so even the lowest threshold does not choose it by it
    db = make_db()
    db.add_space("h", dims=256, auto=True)
    db.add({"id": "e", "content": "?! " * 150}, now=now)
    db.add({"id": "w", "content": "a note about walruses"}, now=now)
    db.archive("e")
    db.archive("w")
    assert db.archived("e") == "?! " * 150
    assert db.forget(query="walruses", threshold=-1.0, dry_run=True).ids == ("w",)


def test_an_embedding_query_compares_only_the_stub(make_db, now):
    # documented: a vector cannot embed the original, so the stub's vector alone decides
    db = make_db()
    db.add_space("h", dims=256, auto=True)
    db.add({"id": "a", "content": FILLER + " " + SUBJECT}, now=now)
    db.archive("a")
    with db._store.read() as txn:
        q = db.indexes.vectors.embed_query(txn, "h", SUBJECT)
    assert db.forget(embedding=q, threshold=0.2, dry_run=True).ids == ()
    assert db.forget(query=SUBJECT, threshold=0.2, dry_run=True).ids == ("a",)


def test_originals_are_embedded_in_batches_by_the_space_embedder(make_db, now, monkeypatch):
    # a space of another model is compared with this handle's embedder for it, batch by batch;
    # a space with no embedder on this handle is skipped, as for the stored vectors
    db = make_db()
    calls: list[int] = []

    def embedder(texts: list[str]) -> np.ndarray:
        calls.append(len(texts))
        return np.array([[1.0, 0.0] if "secret" in t else [0.0, 1.0] for t in texts], dtype=np.float32)

    db.add_space("u", dims=2, model="mine")
    db.add_space("x", dims=2, model="nobody")  # no embedder here
    db.set_embedder("u", embedder)
    for i in range(7):
        db.add({"id": f"n{i}", "content": f"note {i} " + "words " * 60 + ("secret" if i in (2, 5) else ""),
                "embeddings": {"u": [0.0, 1.0], "x": [1.0, 0.0]}}, now=now)
    with db.transaction() as tx:
        for i in range(7):
            tx.archive(f"n{i}")
    monkeypatch.setattr(sys.modules["engramdb.maintenance.forget"], "ORIGINALS_BATCH", 3)
    calls.clear()
    assert db.forget(query="secret", threshold=0.9, dry_run=True).ids == ("n2", "n5")
    assert calls == [1, 3, 3, 1]  # the query, then the seven originals
    assert db.forget(query="secret", threshold=0.9, space="u", dry_run=True).ids == ("n2", "n5")
    with pytest.raises(engramdb.ValidationError):
        db.forget(query="secret", space="x", dry_run=True)  # as before: no embedder for it


def test_an_embedder_that_fails_on_the_originals_is_a_validation_error(make_db, now):
    db = make_db()
    db.add_space("u", dims=2, model="mine")
    db.set_embedder("u", lambda texts: np.array([[1.0, 0.0]], dtype=np.float32))  # one row, whatever it gets
    for i in range(2):
        db.add({"id": f"n{i}", "content": f"note {i}", "embeddings": {"u": [0.0, 1.0]}}, now=now)
        db.archive(f"n{i}")
    with pytest.raises(engramdb.ValidationError) as exc:
        db.forget(query="note", dry_run=True)
    assert "archived originals" in exc.value.message and exc.value.hint
    assert len(db) == 2


def test_an_archived_original_whose_negation_differs_is_not_chosen_in_the_built_in_space(make_db, now):
    db = make_db()
    db.add_space("h", dims=256, auto=True)
    db.add({"id": "yes", "content": FILLER + " Alice will come to the party"}, now=now)
    db.add({"id": "no", "content": FILLER + " Alice will never come to the party"}, now=now)
    db.archive("yes")
    db.archive("no")
    assert "party" not in db.get("no").content  # chosen, if at all, by its original
    assert db.forget(query="Alice will come to the party", threshold=0.2, dry_run=True).ids == ("yes",)
    assert db.forget(query="Alice will never come to the party", threshold=0.2, dry_run=True).ids == ("no",)
