"""Engram.stats(), pin/unpin, and how tiers and archiving feed recall, inject_context and wake_up."""
from __future__ import annotations

import pytest

import engramdb
from engramdb.maintenance import stats as stats_mod
from engramdb.recall import TIER_BOOST


def test_stats_counts_tiers_flags_tags_sources_and_tables(tmp_engram, now):
    db = tmp_engram
    db.add("one", id="1", tier="hot", tags=["x", "y"], flags=["DECISION"], source="s1", now=now)
    db.add("two", id="2", tier="warm", tags=["x"], flags=["DECISION", "CORE"], source="s1", now=now)
    db.add("three " * 100, id="3", tier="cold", source="s2", now=now)
    db.add("four", id="4", now=now)
    db.archive("3")
    db.pin("1")
    s = db.stats()
    assert s["memories"] == 4 and s["archived"] == 1 and s["pinned"] == 1
    assert s["tiers"] == {"hot": 2, "warm": 1, "cold": 0, "archive": 1}
    assert s["flags"] == {"DECISION": 2, "CORE": 1}
    assert list(s["tags"].items()) == [("x", 2), ("y", 1)]
    assert list(s["sources"].items()) == [("s1", 2), ("s2", 1)]
    assert set(s["tables"]) >= {"nodes", "ids", "postings", "archive", "sources"}
    assert s["tables"]["archive"] == {"entries": 1, "bytes": 4096}
    assert s["file_size"] > 0 and s["index"]["bm25"]["segments"] >= 1
    assert s["index"]["bm25"]["live_docs"] == 4 and s["index"]["vectors"] == {}
    db.add_space("h", dims=32)
    assert db.stats()["index"]["vectors"]["h"]["rows"] == 4


def test_stats_reports_the_last_maintenance_pass(tmp_engram, now):
    db = tmp_engram
    assert db.stats()["last_maintenance"] is None
    db.add("an old memory", id="old", now=now - 86400 * 40)
    db.add("a new memory", id="new", now=now)
    report = db.maintain(now=now)
    last = db.stats()["last_maintenance"]
    assert last["at"] == "2023-11-14T22:13:20.000Z" and last["decayed"] == report.decayed == 1
    assert last["memories"] == 2
    with db._store.read() as txn:
        assert stats_mod.last_maintenance(txn) == last


def test_pin_and_unpin(tmp_engram, now):
    tmp_engram.add("x", id="x", now=now)
    assert tmp_engram.pin("x").pinned and tmp_engram.get("x").pinned
    assert not tmp_engram.unpin("x").pinned and not tmp_engram.get("x").pinned
    with pytest.raises(engramdb.NotFoundError):
        tmp_engram.pin("missing")


def test_archive_tier_has_the_lowest_recall_boost():
    assert TIER_BOOST["archive"] == min(TIER_BOOST.values())
    assert TIER_BOOST["hot"] > TIER_BOOST["warm"] > TIER_BOOST["cold"] > TIER_BOOST["archive"]


def test_recall_applies_the_tier_factor_to_archived_memories(tmp_engram, now):
    db = tmp_engram
    db.add("the lighthouse keeper counted ships " + "at night " * 40, id="arch", now=now)
    db.add("the lighthouse keeper counted ships", id="hot", now=now)
    db.archive("arch")
    hits = {h.id: h for h in db.recall("lighthouse keeper", hops=False, top_k=2, explain=True)}
    assert hits["arch"].parts["tier"] == TIER_BOOST["archive"] and hits["hot"].parts["tier"] == 1.0
    assert hits["arch"].score == pytest.approx(hits["arch"].parts["rrf"] * TIER_BOOST["archive"])


def test_inject_context_and_wake_up_leave_archived_memories_out_unless_asked(tmp_engram, now):
    db = tmp_engram
    db.ingest("Alice founded Acme in Berlin in 2019. It was a DECISION that changed everything.", now=now)
    ids = db.ids()
    for id_ in ids:
        db.archive(id_)
    db.add("Bob joined Acme as the first engineer.", id="bob", now=now)
    assert "Alice" not in db.inject_context() and "Alice" in db.inject_context(include_archived=True)
    assert "DECISION" not in db.wake_up(top_pct=1.0)
    assert "DECISION" in db.wake_up(top_pct=1.0, include_archived=True)
    db.update("bob", tier="archive")  # the tier alone counts as archived too
    assert "Bob" not in db.inject_context()
