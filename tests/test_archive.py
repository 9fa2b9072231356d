"""Archive compaction (engramdb/maintenance/archive.py): stub + archive row, byte-for-byte round trips."""
from __future__ import annotations

import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engramdb
from engramdb import codec
from engramdb.maintenance import archive
from engramdb.records import ARCHIVE_KEY, TIERS

from conftest import PASSPHRASE, TEST_KDF

LONG = "The quarterly planning meeting moved to Thursday. " * 20  # 1000 characters


def _record(db, id_):
    """The stored record bytes of memory ``id_`` (after opening its envelope)."""
    from engramdb.engram import Transaction

    with db._store.read() as txn:
        tx = Transaction(db, txn)
        return txn.get("nodes", codec.u64(tx._docno(id_)))


def test_archive_keeps_a_preview_and_get_full_gives_the_original_byte_for_byte(tmp_engram, now):
    db = tmp_engram
    db.add(LONG, id="m", tier="cold", tags=["work"], metadata={"k": 1}, importance=0.7, now=now)
    before = _record(db, "m")
    original = db.get("m")
    assert not original.archived
    assert db.archive("m") == 0
    stub = db.get("m")
    assert stub.archived and stub.tier == "archive"
    assert stub.content == LONG[:200] + "..."
    assert stub.metadata[ARCHIVE_KEY] == {"tier": "cold", "length": len(LONG), "truncated": False}
    assert stub.tags == ("work",) and stub.importance == 0.7
    assert db.archived("m") == LONG  # the archive row holds the full text
    assert codec.encode_node(db.get("m", full=True)) == before
    assert db.get("m", full=True) == original
    assert db.unarchive("m") == original
    assert _record(db, "m") == before
    assert db.archived("m") is None and not db.get("m").archived


def test_archive_twice_and_unarchive_of_a_live_memory_change_nothing(tmp_engram, now):
    db = tmp_engram
    db.add(LONG, id="m", now=now)
    db.archive("m")
    stub_bytes = _record(db, "m")
    assert db.archive("m") == 0
    assert _record(db, "m") == stub_bytes
    db.unarchive("m")
    live = _record(db, "m")
    assert db.unarchive("m") == db.get("m")
    assert _record(db, "m") == live
    assert db.get("m", full=True) == db.get("m")


def test_truncating_archive_drops_the_text_and_counts_the_bytes(tmp_engram, now):
    db = tmp_engram
    text = "é" * 300  # two UTF-8 bytes a character: 100 characters dropped = 200 bytes
    db.add(text, id="t", now=now)
    assert db.archive("t", truncate=True) == 200
    stub = db.get("t")
    assert stub.archived and stub.content == "é" * 200 + "..."
    assert stub.metadata[ARCHIVE_KEY]["truncated"] is True
    assert db.archived("t") is None
    assert db.get("t", full=True) == stub  # nothing left to give back
    with pytest.raises(engramdb.ValidationError) as exc:
        db.unarchive("t")
    assert exc.value.hint
    with db._store.read() as txn:
        assert txn.count("archive") == 0


def test_short_content_is_archived_whole(tmp_engram, now):
    db = tmp_engram
    db.add("short note", id="s", now=now)
    assert db.archive("s", truncate=True) == 0
    assert db.get("s").content == "short note" and db.get("s").archived
    assert db.get("s").metadata[ARCHIVE_KEY]["truncated"] is False


def test_archived_memory_is_found_by_its_preview_only(tmp_engram, now):
    db = tmp_engram
    db.add("zebra crossing at the start. " + "filler words here. " * 20 + "walrus at the end", id="m", now=now)
    db.add("an unrelated memory about walrus tusks", id="other", now=now)
    db.archive("m")
    assert [h.id for h in db.recall("zebra", hops=False)] == ["m"]
    assert "m" not in [h.id for h in db.recall("walrus", hops=False)]
    db.unarchive("m")
    assert "m" in [h.id for h in db.recall("walrus", hops=False)]


def test_missing_id_and_bad_chars(tmp_engram):
    with pytest.raises(engramdb.NotFoundError):
        tmp_engram.archive("nope")
    with pytest.raises(engramdb.NotFoundError):
        tmp_engram.unarchive("nope")
    tmp_engram.add("x", id="x")
    with tmp_engram.transaction() as tx, pytest.raises(engramdb.ValidationError):
        archive.archive(tx, "x", chars=0)


def test_preview_matches_trace_lite_truncation():
    assert archive.preview("a" * 200) == "a" * 200
    assert archive.preview("a" * 201) == "a" * 200 + "..."
    assert archive.preview("abcdef", 3) == "abc..."
    # UTF-16 code units, as Trace Lite counts: an emoji is two, and is never cut in half
    assert archive.preview("ab\U0001F600cd", 3) == "ab..."
    assert archive.preview("ab\U0001F600", 4) == "ab\U0001F600"


def test_file_archive_truncation_agrees_with_the_pure_pass(tmp_engram, now):
    from engramdb.maintenance import lifecycle

    text = "x" * 199 + "\U0001F600" + "tail " * 30
    tmp_engram.add(text, id="e", tier="archive", now=now)
    dropped = tmp_engram.archive("e", truncate=True)
    memory = lifecycle.Memory(id="e", content=text, tier="archive")
    config = lifecycle.MaintenanceConfig(archive_truncate=True)
    out, _, pure_dropped = lifecycle._archive([memory], config)
    assert tmp_engram.get("e").content == out[0].content == "x" * 199 + "..."
    assert dropped == pure_dropped


def test_delete_removes_the_archive_row(tmp_engram, now):
    tmp_engram.add(LONG, id="m", now=now)
    tmp_engram.archive("m")
    tmp_engram.delete("m")
    with tmp_engram._store.read() as txn:
        assert txn.count("archive") == 0


def test_verify_reports_a_lost_archive_row_and_an_orphan_row(tmp_engram, now):
    db = tmp_engram
    db.add(LONG, id="m", now=now)
    db.add("y", id="y", now=now)
    db.archive("m")
    assert db.verify() == []
    with db.transaction() as tx:
        tx._drop_archived("m")  # damage on purpose (the public drop_archived refuses it)
    kinds = [(p.kind, p.detail) for p in db.verify()]
    assert kinds == [("archive", "archived memory 'm' has lost its archive row (its full text)")]
    with db.transaction() as tx:
        tx.set_archived("m", LONG)
        tx.set_archived("y", "y's original")  # a row without a stub entry (restore's primitive) is allowed
    assert db.verify() == []
    with db._store.transaction() as txn:
        txn.put("archive", codec.u64(999), codec.pack_archive("orphan"))
    assert [p.detail for p in db.verify()] == ["archive row 999 belongs to no memory"]
    with db._store.transaction() as txn:
        txn.delete("archive", codec.u64(999))


def test_drop_archived_refuses_an_archived_stubs_only_full_text(tmp_engram, now):
    """drop_archived on a non-truncated stub deleted its only full text and left a file verify
    reported as damaged (rev9); it now refuses, saying to unarchive or delete."""
    db = tmp_engram
    db.add(LONG, id="m", now=now)
    db.archive("m")
    with pytest.raises(engramdb.ValidationError, match="only full text") as caught, db.transaction() as tx:
        tx.drop_archived("m")
    assert "unarchive" in (caught.value.hint or "")
    assert db.verify() == []
    assert db.get("m", full=True).content == LONG
    db.add("preview", id="a", now=now)
    with db.transaction() as tx:  # a row without a stub entry is not an archived memory's text
        tx.set_archived("a", "the full original text")
        assert tx.drop_archived("a") and not tx.drop_archived("a")
        assert not tx.drop_archived("nobody")
    assert db.verify() == []
    assert db.unarchive("m").content == LONG and db.verify() == []


def test_set_archived_refuses_to_replace_or_add_an_archived_stubs_text(tmp_engram, now):
    """set_archived replaced an archived memory's full text (lost on unarchive), and gave a
    truncated stub a row verify reports as damage; it now refuses both."""
    db = tmp_engram
    db.add(LONG, id="m", now=now)
    db.add(LONG, id="t", now=now)
    db.archive("m")
    db.archive("t", truncate=True)
    with pytest.raises(engramdb.ValidationError, match="replace its full text"), db.transaction() as tx:
        tx.set_archived("m", "something else")
    with pytest.raises(engramdb.ValidationError, match="truncation"), db.transaction() as tx:
        tx.set_archived("t", LONG)
    assert db.verify() == []
    assert db.get("m", full=True).content == LONG
    assert db.unarchive("m").content == LONG


def test_transaction_has_no_public_raw_store_transaction(tmp_engram):
    """``Transaction.txn`` handed out the raw store transaction, through which any table could be
    damaged (rev9); the maintenance pass uses the private ``_txn``."""
    with tmp_engram.transaction() as tx:
        assert not hasattr(tx, "txn")


def test_a_row_written_by_set_archived_alone_is_the_full_text(tmp_engram, now):
    """Files written before archive() (set_archived only): get(full=True) and archive() use the row."""
    db = tmp_engram
    db.add("preview", id="a", now=now)
    with db.transaction() as tx:
        tx.set_archived("a", "the full original text")
    assert db.get("a", full=True).content == "the full original text"
    db.archive("a")
    assert db.get("a", full=True).content == "the full original text"
    assert db.unarchive("a").content == "the full original text"


@pytest.mark.parametrize("encrypted", [True, False])
def test_dump_restore_keeps_archived_records_archived(make_db, tmp_path, now, encrypted):
    db = make_db("a.engram", encrypted=encrypted)
    db.add(LONG, id="m", tier="warm", metadata={"z": [1, 2]}, now=now)
    db.add("é" * 400, id="t", now=now)
    db.add("live memory", id="l", now=now)
    original = codec.encode_node(db.get("m"))
    db.archive("m")
    db.archive("t", truncate=True)
    buf = io.StringIO()
    db.dump(buf)
    kwargs = {"passphrase": PASSPHRASE, "kdf": TEST_KDF} if encrypted else {"encrypted": False}
    engramdb.restore(io.StringIO(buf.getvalue()), tmp_path / "b.engram", **kwargs)
    with engramdb.open(tmp_path / "b.engram", **kwargs) as restored:
        assert restored.get("m").archived and restored.get("t").archived
        assert codec.encode_node(restored.get("m", full=True)) == original
        assert restored.get("t") == db.get("t")
        assert codec.encode_node(restored.unarchive("m")) == original
        assert restored.verify() == []


texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=600)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=texts, tier=st.sampled_from(TIERS), meta=st.dictionaries(st.text(max_size=5), st.integers(-2**63, 2**63 - 1), max_size=3),
       pinned=st.booleans())
def test_archive_unarchive_round_trip_is_byte_identical(tmp_engram, content, tier, meta, pinned):
    db = tmp_engram
    id_ = db.add(content, id="h", tier=tier, metadata=meta, pinned=pinned, now=1.0)
    before = _record(db, id_)
    db.archive(id_)
    assert codec.encode_node(db.get(id_, full=True)) == before
    db.unarchive(id_)
    assert _record(db, id_) == before
    db.delete(id_)


def test_an_archived_memory_keeps_changes_to_other_fields_but_not_a_new_content(tmp_engram, now):
    db = tmp_engram
    db.add(LONG, id="m", tags=["a"], now=now)
    db.archive("m")
    with pytest.raises(engramdb.ValidationError) as exc:
        db.update("m", content="new text")
    assert "unarchive" in exc.value.hint
    db.update("m", tags=["a", "b"], pinned=True)
    restored = db.unarchive("m")
    assert restored.content == LONG and restored.tags == ("a", "b") and restored.pinned and restored.tier == "hot"


def test_a_tier_set_while_archived_is_kept_when_unarchived(tmp_engram, now):
    # the spec: an archived memory's other fields can change and keep their new values when it
    # is unarchived; a new tier was dropped (unarchive put back the tier from before the archive)
    db = tmp_engram
    db.add(LONG, id="m", tier="cold", now=now)
    db.archive("m")
    assert db.update("m", tier="warm").tier == "warm"
    assert db.get("m", full=True).tier == "warm"
    assert db.unarchive("m").tier == "warm" and db.get("m").content == LONG
    db.archive("m")  # untouched: the tier from before the archive comes back
    assert db.unarchive("m").tier == "warm"


@pytest.mark.parametrize("truncate", [False, True])
def test_new_metadata_keeps_an_archived_memory_archived(tmp_engram, now, truncate):
    # the new metadata replaced the archive entry: the memory looked live, its content (the
    # preview) could be changed, and unarchive (or get(full=True)) brought back the old text
    # over the new one
    db = tmp_engram
    db.add(LONG, id="m", metadata={"k": 1}, now=now)
    db.archive("m", truncate=truncate)
    db.update("m", metadata={"k": 2})
    stub = db.get("m")
    assert stub.archived and stub.metadata["k"] == 2 and ARCHIVE_KEY in stub.metadata
    with pytest.raises(engramdb.ValidationError):
        db.update("m", metadata={}, content="new text")
    assert db.verify() == []
    if not truncate:
        restored = db.unarchive("m")
        assert restored.content == LONG and restored.metadata == {"k": 2} and not restored.archived
        db.update("m", metadata={"k": 3})  # a live memory's metadata is replaced as before
        assert db.get("m").metadata == {"k": 3}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=st.lists(st.tuples(texts, st.sampled_from(TIERS), st.sampled_from(["keep", "archive", "truncate"])),
                      min_size=1, max_size=6))
def test_dump_restore_round_trip_of_archived_memories(tmp_path_factory, items):
    """Any mix of live, archived and truncated memories: restore(dump) gives the same records,
    and the same originals through get(full=True)."""
    d = tmp_path_factory.mktemp("rt")
    with engramdb.open(d / "a.engram", encrypted=False) as db:
        for n, (content, tier, action) in enumerate(items):
            db.add(content, id=f"m{n}", tier=tier, now=1.0)
            if action != "keep":
                db.archive(f"m{n}", truncate=action == "truncate")
        buf = io.StringIO()
        db.dump(buf)
        want = {i: (_record(db, i), codec.encode_node(db.get(i, full=True))) for i in db.ids()}
    engramdb.restore(io.StringIO(buf.getvalue()), d / "b.engram", encrypted=False)
    with engramdb.open(d / "b.engram", encrypted=False) as restored:
        got = {i: (_record(restored, i), codec.encode_node(restored.get(i, full=True))) for i in restored.ids()}
        assert got == want
        assert restored.verify() == []


def test_compact_after_truncating_archives_makes_the_file_smaller(make_db, now):
    """LMDB's compacting copy keeps pages as they are; compact refills the records' pages first."""
    import os

    db = make_db("s.engram", encrypted=False)
    db.add_many([{"id": f"m{i:04}", "content": f"memory {i} " + "lorem ipsum dolor sit amet " * 60}
                 for i in range(400)], now=now)
    db.compact()
    before = os.path.getsize(db.path)
    with db._store.read() as txn:
        nodes_before = txn.table_bytes("nodes")
    with db.transaction() as tx:
        for i in range(0, 400, 2):
            tx.archive(f"m{i:04}", truncate=True)
    db.compact()
    assert os.path.getsize(db.path) < before
    with db._store.read() as txn:  # half the records shrank to a preview: their pages were refilled
        assert txn.table_bytes("nodes") < 0.75 * nodes_before


def test_repack_keeps_every_envelope_and_the_digest(tmp_engram, now):
    db = tmp_engram
    db.add_many([{"id": f"m{i}", "content": f"text {i} " * (i % 50 + 1)} for i in range(300)], now=now)
    with db._store.read() as txn:
        before = list(txn.raw_items("nodes"))
    db._store.write(lambda txn: txn.repack("nodes"))
    with db._store.read() as txn:
        assert list(txn.raw_items("nodes")) == before
    assert db.verify() == []


@pytest.mark.parametrize("live_tier", ["hot", "warm", "cold"])
@pytest.mark.parametrize("extra", [0, 2])
def test_live_memory_beats_an_archived_one_on_an_exact_lexical_tie(make_db, now, live_tier, extra):
    """Regression: BM25 ties were ranked by docno before fusion, so the older (archived)
    memory got the better RRF rank, a larger gap than the tier factor (0.98 vs 0.99 for cold;
    more with other ties between them). Equal lexical evidence now gets equal rank."""
    db = make_db()
    db.add("the harbour ferry leaves at noon", id="old", now=now)
    for k in range(extra):  # more tied memories between them push the live one down a rank each
        db.add("the harbour ferry leaves at noon", id=f"mid{k}", tier="archive", now=now)
    db.add("the harbour ferry leaves at noon", id="new", tier=live_tier, now=now)
    db.archive("old")
    for k in range(extra):
        db.archive(f"mid{k}")
    hits = db.recall("harbour ferry noon", top_k=3 + extra, hops=False, explain=True)
    assert hits[0].id == "new", [(h.id, h.score) for h in hits]
    assert hits[0].parts["bm25"] == hits[1].parts["bm25"]  # the tie was exact
    assert [h.id for h in hits[1:]] == ["old"] + [f"mid{k}" for k in range(extra)]  # then docno order


def _sentence(rng, words):
    return " ".join(rng.choice(words) for _ in range(rng.randrange(60, 160))) + "."


@pytest.mark.parametrize("encrypted", [True, False])
def test_a_pass_then_compact_makes_a_file_with_archivable_memories_smaller(make_db, now, encrypted):
    """Issue 9: compact() after a pass that archives makes the file smaller, the originals
    packed together in groups, and every original still comes back byte for byte."""
    import os
    import random

    rng = random.Random(3)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randrange(3, 10)))
             for _ in range(800)]
    db = make_db("p.engram", encrypted=encrypted)
    day = 86400.0
    items = [{"id": f"m{i:04}", "content": _sentence(rng, vocab), "created_at": now - 800 * day, "tier": "cold",
              "importance": 0.0} for i in range(300)]
    items += [{"id": f"new{i:04}", "content": _sentence(rng, vocab), "created_at": now} for i in range(100)]
    db.add_many(items, now=now)
    db.maintain(now=now - 799 * day)  # nothing is due yet: creates the similarity space only
    db.compact()
    before = os.path.getsize(db.path)
    originals = {n.id: db.get(n.id) for n in db.scan()}
    report = db.maintain(now=now)
    assert report.archived == 300 and report.deduplicated == 0
    db.compact()
    after = os.path.getsize(db.path)
    # archiving's own saving, 8 % here: nodes 97 -> 56 pages, archive groups +20 (of 256).
    # Until postings were keyed segment first (spec/bm25.md) this also counted ~20 pages of
    # half-empty postings pages that compaction repacked (12 % in all); they are now written
    # full, so `before` is smaller by those pages.
    assert after < 0.93 * before, (before, after)
    with db._store.read() as txn:
        keys = [codec.from_u64(k) for k in txn.keys("archive")]
    assert keys and all(k & archive.GROUP_BIT for k in keys)  # packed: no row of its own left
    for id_, node in originals.items():
        full = db.get(id_, full=True)
        assert full.content == node.content  # the tier is the decayed one: archive
    assert db.unarchive("m0123").content == originals["m0123"].content
    assert db.verify() == []


@pytest.mark.parametrize("tier", ["hot", "warm", "cold"])
def test_a_memory_the_pass_archived_is_unarchived_into_a_live_tier(make_db, now, tier):
    # maint's notes: the pass decays and archives in one write, so the archive entry held the
    # tier "archive" and unarchive gave back a live memory in the archive tier
    db = make_db()
    db.add(LONG, id="m", tier=tier, importance=0.0, now=now - 400 * 86400)
    db.add("kept short", id="s", tier=tier, importance=0.0, now=now - 400 * 86400)
    report = db.maintain(now=now)
    assert sorted(report.archived_ids) == ["m", "s"]
    for id_ in ("m", "s"):
        assert db.get(id_).tier == "archive" and db.get(id_, full=True).tier == "cold"
        restored = db.unarchive(id_)
        assert not restored.archived and restored.tier == "cold"
    assert db.get("m").content == LONG
    # still past the cold limit: the next pass archives it again, by the same rule; pinned, it stays
    db.update("s", pinned=True)
    assert db.maintain(now=now).archived_ids == ["m"]
    assert db.get("s").tier == "cold" and not db.get("s").archived


def test_a_memory_in_the_archive_tier_before_the_pass_keeps_that_tier_in_its_entry(make_db, now):
    # as archive() by hand: a tier the user set comes back as it was
    db = make_db()
    db.add(LONG, id="m", tier="archive", now=now)
    assert db.maintain(now=now).archived_ids == ["m"]
    assert db.get("m", full=True).tier == "archive"


def test_new_content_for_a_truncated_archive_is_refused_with_a_way_that_works(tmp_engram, now):
    # the hint said "unarchive it first", which a truncated archive refuses: a loop
    db = tmp_engram
    db.add(LONG, id="t", now=now)
    db.archive("t", truncate=True)
    with pytest.raises(engramdb.ValidationError) as exc:
        db.update("t", content="a new text")
    assert "truncation" in exc.value.message and "unarchive" not in exc.value.hint
    db.add(LONG, id="u", now=now)
    db.archive("u")
    with pytest.raises(engramdb.ValidationError) as exc:
        db.update("u", content="a new text")
    assert "unarchive it first" in exc.value.hint
