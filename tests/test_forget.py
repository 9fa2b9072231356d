"""Forget (engramdb/maintenance/forget.py): the memories and everything derived from them leave the file."""
from __future__ import annotations

import random

import numpy as np
import pytest

import engramdb
from pathlib import Path
from engramdb import codec
from engramdb.store import TABLES
from conftest import Killed, kill_at_write

_rng = random.Random(7)
WORDS = sorted({"".join(_rng.choice("bcdfghjklmnpqrstvwxz") for _ in range(9)) + "qv" for _ in range(100)})
FILLER = ("meeting notes about the garden, the weekly shopping list, a phone call with the bank, "
          "planning the next holiday trip and reading a book on the train").split(", ")


def _populate(db, now):
    """20 doomed memories holding the 100 distinctive words (5 each, in content, a tag, metadata
    and an edge label), 60 others; edges, a vector space, an archived doomed memory."""
    assert len(WORDS) == 100
    db.add_space("h", dims=64)
    doomed, keep = [], []
    for i in range(20):  # interleaved, so the doomed records share pages with kept ones
        words = " ".join(WORDS[5 * i:5 * i + 5])
        text = f"Doomed note {i}: {words}. " + FILLER[i % len(FILLER)] + " " + "padding text " * (i * 3)
        doomed.append(db.add(text, id=f"d{i:02}", tags=[WORDS[5 * i]], metadata={"w": WORDS[5 * i + 1]}, now=now))
        keep += [db.add(f"Kept note {k}: {FILLER[k % len(FILLER)]} number {k}", id=f"k{k:02}", now=now)
                 for k in range(3 * i, 3 * i + 3)]
    db.link("d00", "d01", "related", label=WORDS[2], now=now)
    db.link("k00", "d02", "related", now=now)
    db.link("k01", "d03", "derived_from", now=now)  # k01 is a summary built from d03
    db.archive("d04")
    return doomed, keep


def test_forget_by_id_removes_every_trace_of_the_words_from_a_plaintext_file(make_db, now):
    db = make_db("plain.engram", encrypted=False)
    doomed, keep = _populate(db, now)
    db.compact()
    before = Path(db.path).read_bytes()
    assert sum(w.encode() in before for w in WORDS) == 100  # the check below can fail
    receipt = db.forget(ids=doomed)
    assert receipt.ids == tuple(doomed) and not receipt.dry_run
    assert receipt.summaries == ("k01",)
    assert receipt.removed["nodes"] == 20 and receipt.removed["ids"] == 20 and receipt.removed["archive"] == 1
    assert receipt.removed["edges"] == 6  # three edges, forward and reverse keys
    assert receipt.removed["vectors"] >= 0 and receipt.size_after <= receipt.size_before
    data = Path(db.path).read_bytes()
    assert [w for w in WORDS if w.encode() in data] == []
    assert len(db) == 60 and db.verify() == []
    for word in WORDS:  # no BM25 match is left; vector search may still return kept memories
        assert all(h.id not in doomed for h in db.recall(word, top_k=100))
        assert db.recall(word, top_k=100, tiers=["archive"]) == []
    assert sorted(db.ids()) == keep
    assert db.edges("k00") == [] and db.edges("k01") == []


def test_forget_leaves_none_of_the_old_ciphertexts_in_an_encrypted_file(make_db, now):
    db = make_db("enc.engram")
    doomed, _ = _populate(db, now)
    with db._store.read() as txn:
        old = {table: dict(txn.raw_items(table)) for table in TABLES}
        docnos = {codec.from_u64(txn.get("ids", db._id_key(i))) for i in doomed}
    theirs = [old["nodes"][codec.u64(d)] for d in docnos] + [old["ids"][db._id_key(i)] for i in doomed]
    theirs += [v for k, v in old["archive"].items() if codec.from_u64(k) in docnos]
    assert len(theirs) == 41
    receipt = db.forget(ids=doomed)
    assert len(receipt.ids) == 20
    data = Path(db.path).read_bytes()
    assert [i for i, v in enumerate(theirs) if v in data] == []
    with db._store.read() as txn:
        new = {table: dict(txn.raw_items(table)) for table in TABLES}
    # every value that left a table (forgotten, or rewritten by the merge) has left the file
    gone = [v for table in TABLES for k, v in old[table].items() if new[table].get(k) != v and len(v) >= 24]
    assert gone and [v for v in gone if v in data] == []
    assert db.verify() == []
    for word in WORDS:
        assert all(h.id not in doomed for h in db.recall(word, top_k=100))


def test_forget_by_query_and_embedding(make_db, now):
    db = make_db()
    db.add_space("h", dims=256)
    db.add("the walrus sat on the ice floe", id="w1", now=now)
    db.add("the walrus sat on the ice floe today", id="w2", now=now)
    db.add("tax returns are due in april", id="t", now=now)
    dry = db.forget(query="the walrus sat on the ice floe", threshold=0.8, dry_run=True)
    assert dry.dry_run and dry.ids == ("w1", "w2") and dry.removed["nodes"] == 2
    assert len(db) == 3
    vec = db.indexes.vectors.embed_query
    with db._store.read() as txn:
        tax = vec(txn, "h", "tax returns are due in april")
    receipt = db.forget(embedding=tax, threshold=0.99)
    assert receipt.ids == ("t",)
    assert db.forget(query="the walrus sat on the ice floe", threshold=0.8).ids == ("w1", "w2")
    assert len(db) == 0


def test_forget_sources_only_when_no_remaining_memory_uses_them(make_db, now):
    db = make_db()
    ids_a = db.ingest("Alice founded the company in 2019. She chose Berlin for the office.", source_name="a", now=now)
    db.ingest("Bob joined in 2021 as the first engineer. He wrote the storage layer.", source_name="b", now=now)
    assert {db.get(i).source for i in ids_a} == {"a"}
    db.add("a later note on the same document", id="note", source="a", now=now)
    with db._store.read() as txn:
        assert txn.count("sources") == 2
    assert db.forget(ids=ids_a).removed["sources"] == 0  # "note" still uses source a
    assert db.forget(ids=["note"]).removed["sources"] == 1
    with db._store.read() as txn:
        assert txn.count("sources") == 1


def test_forget_errors_have_hints(make_db):
    db = make_db()
    db.add("x", id="x")
    for kwargs in ({}, {"ids": "x"}, {"ids": ["x"], "threshold": 2}, {"query": "x"}):
        with pytest.raises(engramdb.ValidationError) as exc:
            db.forget(**kwargs)
        assert exc.value.hint
    with pytest.raises(engramdb.NotFoundError):
        db.forget(ids=["x", "nope"])
    assert "x" in db


@pytest.mark.parametrize("dry_run", ["no", "false", 1, 0, None, 1.0])
def test_forget_refuses_a_dry_run_that_is_not_a_bool(make_db, dry_run):
    """dry_run="no" (any truthy value) was a dry run, and its receipt said dry_run="no"; 0 or None
    forgot. Whether memories are removed is not decided by a value's truthiness."""
    db = make_db()
    db.add("x", id="x")
    with pytest.raises(engramdb.ValidationError, match="dry_run must be True or False") as exc:
        db.forget(ids=["x"], dry_run=dry_run)
    assert "dry_run=True" in exc.value.hint
    assert "x" in db


def test_forget_takes_a_numpy_bool_as_dry_run(make_db):
    import numpy as np
    db = make_db()
    db.add("x", id="x")
    receipt = db.forget(ids=["x"], dry_run=np.bool_(True))
    assert receipt.dry_run is True and receipt.ids == ("x",) and "x" in db
    assert db.forget(ids=["x"], dry_run=np.bool_(False)).dry_run is False and "x" not in db


def test_forget_needs_the_only_handle_to_compact(make_db, tmp_path):
    db = make_db("a.engram", encrypted=False)
    db.add("x", id="x")
    other = engramdb.open(tmp_path / "a.engram", encrypted=False)
    try:
        with pytest.raises(engramdb.AlreadyOpenError) as exc:
            db.forget(ids=["x"])
        assert "removed" in exc.value.message and "compact" in exc.value.hint
    finally:
        other.close()
    assert "x" not in db


def test_forget_removes_them_from_the_maintenance_state(make_db, now):
    from engramdb.maintenance import run

    db = make_db()
    for i in range(30):
        db.add(" ".join(WORDS[3 * i:3 * i + 3]), id=f"n{i:02}", now=now - 86400 * i)
    db.maintain(now=now)
    docnos = {}
    with db._store.read() as txn:
        for id_ in ("n03", "n07"):
            docnos[id_] = codec.from_u64(txn.get("ids", db._id_key(id_)))
    db.forget(ids=["n03", "n07"])
    with db._store.read() as txn:
        rows = run._unpack_rows(codec.unpack(txn.get("meta", run.STATE_KEY))["rows"])
        assert len(rows["docno"]) == 28 and not set(docnos.values()) & set(rows["docno"].tolist())
        assert list(txn.keys("meta", run.DIRTY_PREFIX)) == []
    again = db.maintain(now=now)  # the state still describes the file: an incremental pass, nothing to do
    assert not again.full and again.decayed == 0
    assert db.verify() == []


def test_forget_finishes_an_unfinished_maintenance_pass_first(make_db, now):
    from engramdb.maintenance import run

    db = make_db()
    for i in range(10):
        db.add(" ".join(WORDS[3 * i:3 * i + 3]), id=f"n{i}", now=now - 86400 * 40)
    with pytest.raises(Killed):
        db.maintain(now=now, progress=kill_at_write)  # the plan is stored; no batch has run
    with db._store.read() as txn:
        assert txn.get("meta", run.PLAN_KEY) is not None
        assert db.get("n2").tier == "hot"
    db.forget(ids=["n1"])
    with db._store.read() as txn:
        assert txn.get("meta", run.PLAN_KEY) is None
    assert db.get("n2").tier != "hot" and "n1" not in db
    assert db.verify() == []


def test_forget_by_embedding_checks_the_vector(make_db):
    # a string or complex numbers raised a raw ValueError/TypeError; a 2-D batch was flattened
    # into one vector (of another length, and it matched a space of that length and forgot by it);
    # a finite vector of large values was normalised to zeros
    db = make_db()
    db.add_space("s", dims=4, model="m")
    db.add("a", id="a", embeddings={"s": [1, 0, 0, 0]})
    db.add("b", id="b", embeddings={"s": [0, 1, 0, 0]})
    for bad in ("abcd", [1j, 0, 0, 0], {"a": 1}, [[1, 0], [0, 0]], [], [float("nan"), 0, 0, 0]):
        with pytest.raises(engramdb.EmbeddingError) as exc:  # a ValidationError too
            db.forget(embedding=bad, dry_run=True)
        assert exc.value.hint
    assert db.forget(embedding=[[0, 2, 0, 0]], dry_run=True).ids == ("b",)  # one row, as an embedder returns it
    assert db.forget(embedding=[1e30, 0, 0, 0], threshold=0.5).ids == ("a",)
    assert db.ids() == ["b"]


def test_forget_compares_by_cosine_in_a_space_that_does_not_normalise(make_db):
    # the space's scores are dot products: [1, 0, 0] scored 10, 5 and 1 against these rows,
    # all at or above 0.9, and forget removed all three (cosines 1, 0.71, 0.11)
    db = make_db()
    db.add_space("raw", dims=3, model="m", normalize=False)
    db.add("a", id="a", embeddings={"raw": [10, 0, 0]})
    db.add("b", id="b", embeddings={"raw": [5, 5, 0]})
    db.add("c", id="c", embeddings={"raw": [1, 9, 0]})
    assert db.forget(embedding=[1, 0, 0], threshold=0.9, dry_run=True).ids == ("a",)
    assert db.forget(embedding=[3, 1, 0], threshold=0.9, dry_run=True).ids == ("a",)  # b: 0.894
    assert db.forget(embedding=[2, 1, 0], threshold=0.8).ids == ("a", "b")  # c: 0.54
    with pytest.raises(engramdb.ValidationError):
        db.forget(embedding=[0, 0, 0], dry_run=True)
    assert db.ids() == ["c"]


def test_forget_by_query_without_a_text_space_says_how_to_get_one(make_db):
    # the hint said "add one with add_space()", which a command-line user cannot call and
    # which named no arguments; it now gives the call, and following it makes the query work
    db = make_db()
    db.add("My old address was Main Street 5", id="old")
    db.add("Bob prefers tea", id="tea")
    with pytest.raises(engramdb.ValidationError) as exc:
        db.forget(query="old address Main Street", threshold=0.5, dry_run=True)
    call = exc.value.hint.split("add the built-in space that embeds text: ")[1].split(" (")[0]
    assert call == "db.add_space('hashed-tfidf-v1', dims=256)" and "engramdb maintain" in exc.value.hint
    eval(call, {"db": db})
    assert db.forget(query="old address Main Street", threshold=0.5, dry_run=True).ids == ("old",)


def test_forget_says_the_memories_were_removed_when_the_compaction_fails(make_db, monkeypatch):
    """A compaction that failed for want of disk space raised the compaction's own error
    ("the original is untouched ... retry"): the removal had committed, so a retry found no
    such ids (NotFoundError), and the forgotten text stayed in free pages without a word."""
    from engramdb.store import Store

    db = make_db()
    db.add("forget me", id="x")

    def full(self):
        raise engramdb.StorageFullError("compacting copy failed; the original is untouched: the disk is full")

    monkeypatch.setattr(Store, "compact", full)
    with pytest.raises(engramdb.StorageFullError) as exc:
        db.forget(ids=["x"])
    assert "removed" in exc.value.message and "engramdb compact FILE" in exc.value.hint
    assert "free disk space" in exc.value.hint
    assert "x" not in db
    monkeypatch.undo()
    db.compact()


def test_forget_by_query_keeps_a_memory_whose_negation_differs_in_the_built_in_space(make_db, now):
    # the built-in space drops stop words such as "not": both memories scored 1 against either
    # query, so forgetting "Alice will come to the party" also took its negation (and vice versa)
    db = make_db()
    db.add_space("h", dims=256)
    db.add("Alice will come to the party", id="yes", now=now)
    db.add("Alice will not come to the party", id="no", now=now)
    db.add("tax returns are due in april", id="t", now=now)
    with db._store.read() as txn:  # the blind spot is real: the vectors are equal
        vec = db.indexes.vectors.embed_query
        assert float(vec(txn, "h", "Alice will come to the party") @
                     vec(txn, "h", "Alice will not come to the party")) > 0.999
    assert db.forget(query="Alice will come to the party", threshold=0.9, dry_run=True).ids == ("yes",)
    assert db.forget(query="Alice will not come to the party", threshold=0.9).ids == ("no",)
    assert sorted(db.ids()) == ["t", "yes"]
    assert db.forget(query="alice will come to the party", threshold=0.9).ids == ("yes",)  # an ordinary match
    assert list(db.ids()) == ["t"]


def _random_texts(seed):
    """A function giving random lowercase texts of a given length, seeded."""
    rng = random.Random(seed)
    return lambda n: "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(n))


def test_a_large_value_rewritten_smaller_in_one_transaction_passes_the_structural_check(make_db, tmp_path):
    # LMDB overwrites a large value in place when its overflow pages were written earlier in the
    # same transaction, keeping the longer run (mdb_cursor_put does not shrink it, and frees by
    # the run's own count). lmdb.verify wanted the exact count, so verify() called such a file
    # damaged and open() refused it after a forget or compact (its groups are rewritten smaller
    # in one transaction): a sound store could not be opened.
    text = _random_texts(5)
    db = make_db("big.engram", encrypted=False)
    db.add(text(70_000), id="a")
    with db.transaction() as tx:
        tx.update("a", content=text(80_000))
        tx.update("a", content=text(60_000))
    assert db.verify() == []
    path = db.path
    db.close()
    with engramdb.open(path, encrypted=False, verify=True) as again:
        assert len(again.get("a").content) == 60_000 and again.verify() == []
        again.delete("a")  # LMDB frees the whole run: nothing leaks
        assert again.verify() == []


def test_compact_zeroes_the_tail_of_an_overflow_run_longer_than_its_value(make_db):
    # The run of a value rewritten smaller in one transaction keeps its pages; their tail held
    # the earlier version's bytes, and the compacting copy's scrub zeroed only the pages the
    # value needs: that version stayed in the file after compact.
    text = _random_texts(6)
    db = make_db("tail.engram", encrypted=False)
    db.add(text(70_000), id="a")
    with db.transaction() as tx:
        tx.update("a", content=text(80_000))
        earlier = dict(tx._txn.raw_items("nodes"))
        tx.update("a", content=text(40_000))
        now = dict(tx._txn.raw_items("nodes"))
    (old,), (new,) = earlier.values(), now.values()
    pieces = [old[i:i + 64] for i in range(len(new) + 4096, len(old) - 64, 4096)]
    assert pieces and all(p in Path(db.path).read_bytes() for p in pieces)  # the check below can fail
    db._store.compact()  # the copy and its scrub, without compact()'s rewrite of shrunk tables
    data = Path(db.path).read_bytes()
    assert [p for p in pieces if p in data] == []
    assert db.verify() == [] and len(db.get("a").content) == 40_000


@pytest.mark.parametrize("query", ["", "  \n"])
def test_an_empty_query_is_refused_as_empty(make_db, now, query):
    # It said "no embedding space of this file can compare the query text": true of no query, and misleading.
    from click.testing import CliRunner

    from engramdb.cli import cli
    from engramdb.errors import ValidationError

    db = make_db("q.engram", encrypted=False)
    db.add("a note to keep", id="k", now=now)
    with pytest.raises(ValidationError, match="the query is empty") as info:
        db.forget(query=query)
    assert "query=" in info.value.hint
    db.close()
    result = CliRunner().invoke(cli, ["forget", str(db.path), "--query", query], env={"ENGRAM_PLAINTEXT": "1"})
    assert result.exit_code != 0 and "the query is empty" in result.output
    with engramdb.open(db.path, encrypted=False) as again:
        assert again.ids() == ["k"]


def test_equal_vectors_are_forgotten_together_at_the_threshold_recall_scores_them(make_db):
    """forget scored a space that does not normalise with BLAS (``rows @ q``), whose kernel
    depends on the number of rows: of 50 equal vectors, 48 scored a float32 ulp below the
    other two, so at a threshold equal to their score forget took 2 of the 50 copies. Each
    row is now scored on its own, as recall scores a normalised space (bit for bit)."""
    from engramdb.index.vectors import row_dots, unit_rows

    rng = np.random.default_rng(37)  # one of many cases where BLAS splits the rows (here: 48 + 2)
    v = rng.standard_normal(8).astype(np.float32)
    u = rng.standard_normal(8).astype(np.float32)
    db = make_db()
    db.add_space("raw", dims=8, model="m", normalize=False)
    db.add_space("unit", dims=8, model="m")
    ids = [db.add(f"copy {i}", id=f"c{i:02}", embeddings={"raw": v, "unit": v}) for i in range(50)]
    score = float(row_dots(unit_rows(v[None])[0], unit_rows(u[None])[0][0])[0])
    with db._store.read() as txn:  # recall's scores in the normalised space
        assert set(db.indexes.vectors.scores(txn, "unit", u)[1].tolist()) == {score}
    for space in ("raw", "unit"):
        assert db.forget(embedding=u, threshold=score, space=space, dry_run=True).ids == tuple(ids), space
    assert db.forget(embedding=u, threshold=np.nextafter(np.float32(score), np.float32(2)).item(), space="raw",
                     dry_run=True).ids == ()


def test_an_archived_original_scores_the_same_in_any_batch():
    """Archived originals are embedded and scored in batches; BLAS scored a text an ulp
    otherwise by how many texts shared its batch (here the last 2 of 50 copies)."""
    from engramdb.index.vectors import EmbeddingSpace, row_dots, unit_rows
    from engramdb.maintenance.forget import _original_scores

    rng = np.random.default_rng(37)
    v = rng.standard_normal(8).astype(np.float32)
    q = unit_rows(rng.standard_normal(8).astype(np.float32)[None])[0][0]
    space = EmbeddingSpace("s", "m", 8)
    one = float(row_dots(unit_rows(v[None])[0], q)[0])
    for n in (1, 7, 50, 300):
        scores, zero = _original_scores(lambda texts: np.tile(v, (len(texts), 1)), space, ["t"] * n, q)
        assert scores.tolist() == [one] * n and not zero.any(), n
