"""The maintenance pass over a file: idempotent, incremental == full, plan, batches, summaries."""
from __future__ import annotations

import random
import tempfile
from pathlib import Path

import numpy as np
import pytest
from conftest import NOW, Killed, kill_at_write
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import engramdb
import engramdb.engram as engram_mod
from engramdb.errors import EmbeddingError, ValidationError
from engramdb.maintenance.lifecycle import MaintenanceConfig
import engramdb.maintenance.run as run_mod
from engramdb.maintenance.run import BUILTIN_SPACE, iter_dirty, read_last_pass

DAY = 86400.0
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima", "mike", "november"]


def summarize(texts):
    return f"summary of {len(texts)}: " + " ".join(t.split(" ")[0] for t in texts)


def text_of(rng: random.Random) -> str:
    base = rng.randrange(6)
    return " ".join(WORDS[base:base + 4] + [rng.choice(WORDS) for _ in range(rng.randrange(4))])


def fill(db, n: int, seed: int = 0, start: int = 0) -> None:
    rng = random.Random(seed)
    db.add_many([{"id": f"m{start + i}", "content": text_of(rng), "created_at": NOW - rng.randrange(900) * DAY,
                  "last_accessed": NOW - rng.randrange(100) * DAY, "tier": rng.choice(["hot", "warm", "cold"]),
                  "importance": rng.choice([0.0, 0.2, 0.5, 0.9]), "access_count": rng.randrange(6),
                  "pinned": rng.random() < 0.1, "tags": [rng.choice(["a", "b", "c"])]} for i in range(n)])


def snapshot(db) -> dict:
    """Every memory (as stored, and its full original when archived) plus its edges."""
    out = {}
    for node in db.scan():
        full = db.get(node.id, full=True)
        edges = sorted((e.dst, e.kind, e.weight) for e in db.edges(node.id))
        out[node.id] = (node.to_dict(), full.to_dict(), edges)
    return out


def test_pass_plan_then_apply_then_idempotent(make_db):
    db = make_db(encrypted=False)
    fill(db, 80)
    before = snapshot(db)
    planned = db.maintain(now=NOW, plan=True, summarizer=summarize)
    assert snapshot(db) == before and planned.plan and planned.changed
    with db._store.read() as txn:
        assert read_last_pass(txn) is None
    done = db.maintain(now=NOW, summarizer=summarize)
    for field in ("decayed", "deduplicated", "clusters_found", "summarized", "archived", "after_total"):
        assert getattr(done, field) == getattr(planned, field), field
    assert done.removed_ids == planned.removed_ids and done.summary_ids == planned.summary_ids
    assert done.deduplicated > 0 and done.decayed > 0 and done.summarized > 0
    assert len(db) == done.after_total
    after = snapshot(db)
    again = db.maintain(now=NOW, summarizer=summarize)
    assert not again.changed and snapshot(db) == after
    assert again.compared < done.compared
    with db._store.read() as txn:
        assert read_last_pass(txn)["at"] == "2023-11-14T22:13:20.000Z"
        assert list(iter_dirty(txn)) == []
    assert BUILTIN_SPACE in db.spaces()
    last = db.stats()["last_maintenance"]
    assert last["decayed"] == 0 and last["compared"] == again.compared and not last["full"]


def test_summaries_are_new_memories_linked_to_archived_sources(make_db):
    db = make_db(encrypted=False)
    fill(db, 60, seed=3)
    report = db.maintain(now=NOW, summarizer=summarize)
    assert report.summary_ids
    for sid in report.summary_ids:
        summary = db.get(sid)
        assert summary.content.startswith("summary of ") and "consolidated" in summary.tags
        sources = [e.dst for e in db.edges(sid) if e.kind == "derived_from"]
        assert len(sources) == summary.metadata["consolidatedFrom"]
        for src in sources:
            assert db.get(src).archived  # archived, not deleted
            assert db.get(src, full=True).content == db.archived(src)


def test_extensions_pinned_and_merge(make_db):
    db = make_db(encrypted=False)
    db.add("alpha bravo charlie delta", id="keep", importance=0.9, tags=["x"], access_count=2, now=NOW)
    db.add("alpha bravo charlie delta", id="pin", importance=0.1, pinned=True, tags=["y"], now=NOW - 900 * DAY)
    db.add("alpha bravo charlie delta", id="dup", importance=0.0, tags=["z"], access_count=3, now=NOW)
    report = db.maintain(now=NOW)
    assert sorted(report.removed_ids) == ["dup", "keep"]
    pin = db.get("pin")
    assert pin.tier == "hot" and set(pin.tags) == {"x", "y", "z"} and pin.access_count == 5


def test_parity_config_on_a_file(make_db):
    db = make_db(encrypted=False)
    db.add("alpha bravo charlie delta " * 80, id="old", tier="cold", importance=0.0, now=NOW - 400 * DAY)
    db.add("kilo lima mike", id="young", now=NOW)
    report = db.maintain(MaintenanceConfig.trace_lite(), now=NOW)
    assert report.archived == 1 and report.bytes_dropped > 0
    old = db.get("old")
    assert old.archived and old.tier == "archive" and len(old.content) == 203
    with pytest.raises(ValidationError):
        db.unarchive("old")


def test_small_batches_and_progress(make_db):
    db = make_db(encrypted=False)
    fill(db, 50, seed=5)
    seen = []
    report = db.maintain(MaintenanceConfig(batch_size=3), now=NOW, progress=lambda *a: seen.append(a))
    assert report.batches >= 5
    writes = [a for a in seen if a[0] == "write"]
    assert writes[-1][1] == writes[-1][2] and len(writes) >= report.batches


def test_bad_arguments(make_db):
    db = make_db(encrypted=False)
    with pytest.raises(ValidationError):
        db.maintain(config={"hot_days": 3})
    with pytest.raises(ValidationError):
        db.maintain(summarizer="not callable")
    with pytest.raises(EmbeddingError):
        db.maintain(MaintenanceConfig(space="nope"))


def test_user_space_and_concurrent_change_is_left_for_next_pass(make_db):
    db = make_db(encrypted=False)
    db.add_space("v", dims=3, model="mine", auto=False)
    db.add("one", id="a", embeddings={"v": [1, 0, 0]}, now=NOW)
    db.add("two", id="b", embeddings={"v": [1, 0.001, 0]}, importance=0.9, now=NOW)
    db.add("three", id="c", embeddings={"v": [0, 1, 0]}, now=NOW)
    report = db.maintain(MaintenanceConfig(space="v"), now=NOW)
    assert report.removed_ids == ["a"] and BUILTIN_SPACE not in db.spaces()
    db.update("c", embeddings={"v": [1, 0.002, 0]})
    report = db.maintain(MaintenanceConfig(space="v"), now=NOW)
    assert report.compared == 1 and report.removed_ids == ["c"]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(0, 40), seed=st.integers(0, 10_000), steps=st.sampled_from([None, 1]),
       with_summarizer=st.booleans())
def test_pass_is_idempotent_over_random_stores(tmp_path_factory, n, seed, steps, with_summarizer):
    path = tmp_path_factory.mktemp("idem") / "f.engram"
    with engram_mod.open(path, encrypted=False) as db:
        fill(db, n, seed=seed)
        config = MaintenanceConfig(decay_steps=steps, batch_size=7)
        s = summarize if with_summarizer else None
        db.maintain(config, s, now=NOW)
        if steps is None:
            after = snapshot(db)
            assert not db.maintain(config, s, now=NOW).changed
            assert snapshot(db) == after
        assert db.verify() == []


class IncrementalEqualsFull(RuleBasedStateMachine):
    """Random adds, updates, deletes and passes on two files: one maintained incrementally,
    one with full passes. After every pass they hold the same memories."""

    @initialize()
    def setup(self):
        self.dir = Path(tempfile.mkdtemp())
        self.inc = engram_mod.open(self.dir / "inc.engram", encrypted=False)
        self.full = engram_mod.open(self.dir / "full.engram", encrypted=False)
        self.ids: list[str] = []
        self.counter = 0
        self.now = NOW
        self.rng = random.Random(0)

    def both(self, fn):
        return fn(self.inc), fn(self.full)

    @rule(k=st.integers(1, 6), seed=st.integers(0, 1000))
    def add(self, k, seed):
        rng = random.Random(seed)
        items = []
        for _ in range(k):
            self.counter += 1
            items.append({"id": f"m{self.counter}", "content": text_of(rng),
                          "created_at": self.now - rng.randrange(500) * DAY, "tier": rng.choice(["hot", "warm"]),
                          "importance": rng.choice([0.0, 0.5, 1.0]), "pinned": rng.random() < 0.1})
        self.both(lambda db: db.add_many(items))

    def live(self):
        return [n.id for n in self.inc.scan()]

    @precondition(lambda self: len(self.inc) > 0)
    @rule(pick=st.integers(0, 10_000), seed=st.integers(0, 1000), what=st.sampled_from(["content", "importance", "pin", "tier"]))
    def update(self, pick, seed, what):
        ids = self.live()
        id_ = ids[pick % len(ids)]
        rng = random.Random(seed)
        changes = {"content": {"content": text_of(rng)}, "importance": {"importance": rng.random()},
                   "pin": {"pinned": rng.random() < 0.5}, "tier": {"tier": rng.choice(["hot", "warm", "cold"])}}[what]
        if self.inc.get(id_).archived and what == "content":
            return
        self.both(lambda db: db.update(id_, **changes))

    @precondition(lambda self: len(self.inc) > 0)
    @rule(pick=st.integers(0, 10_000))
    def delete(self, pick):
        ids = self.live()
        id_ = ids[pick % len(ids)]
        self.both(lambda db: db.delete(id_))

    @precondition(lambda self: len(self.inc) > 1)
    @rule(a=st.integers(0, 10_000), b=st.integers(0, 10_000), weight=st.sampled_from([0.2, 0.5, 1.0]),
          kind=st.sampled_from(["related", "supersedes"]))
    def link(self, a, b, weight, kind):
        ids = self.live()
        src, dst = ids[a % len(ids)], ids[b % len(ids)]
        if src != dst:  # a removed duplicate's edges go to its survivor, the same in both files
            self.both(lambda db: db.link(src, dst, kind, weight=weight, now=self.now))

    @precondition(lambda self: len(self.inc) > 0)
    @rule(pick=st.integers(0, 10_000))
    def unarchive(self, pick):
        ids = [n.id for n in self.inc.scan() if n.archived]
        if ids:
            id_ = ids[pick % len(ids)]
            self.both(lambda db: db.unarchive(id_))

    @rule(days=st.sampled_from([0, 1, 20, 200]), with_summarizer=st.booleans())
    def maintain(self, days, with_summarizer):
        self.now += days * DAY
        s = summarize if with_summarizer else None
        a = self.inc.maintain(MaintenanceConfig(batch_size=4), s, now=self.now)
        b = self.full.maintain(MaintenanceConfig(batch_size=4, incremental=False), s, now=self.now)
        assert (a.decayed, a.deduplicated, a.summarized, a.archived) == \
            (b.decayed, b.deduplicated, b.summarized, b.archived)
        assert a.removed_ids == b.removed_ids and a.summary_ids == b.summary_ids
        assert snapshot(self.inc) == snapshot(self.full)

    @invariant()
    def same_ids(self):
        if hasattr(self, "inc"):
            assert sorted(self.live()) == sorted(n.id for n in self.full.scan())

    def teardown(self):
        if hasattr(self, "inc"):
            for db in (self.inc, self.full):
                assert db.verify() == []
                db.close()


TestIncrementalEqualsFull = IncrementalEqualsFull.TestCase
TestIncrementalEqualsFull.settings = settings(max_examples=12, stateful_step_count=14, deadline=None)


def test_dump_restore_after_a_pass_keeps_archived_records_archived(make_db, tmp_path):
    import io

    import engramdb

    db = make_db(encrypted=False)
    fill(db, 60, seed=8)
    report = db.maintain(now=NOW, summarizer=summarize)
    assert report.archived > 0
    before = snapshot(db)
    buf = io.StringIO()
    db.dump(buf)
    engramdb.restore(io.StringIO(buf.getvalue()), tmp_path / "r.engram", encrypted=False)
    with engram_mod.open(tmp_path / "r.engram", encrypted=False) as restored:
        assert snapshot(restored) == before  # stubs, full originals and derived_from edges
        assert sum(n.archived for n in restored.scan()) == sum(n.archived for n in db.scan()) > 0
        again = restored.maintain(now=NOW, summarizer=summarize)  # no state in a restored file: a full pass
        assert again.full and not again.changed and snapshot(restored) == before
        assert restored.verify() == []


def test_decode_without_vectors_is_the_node_without_embeddings():
    from engramdb import codec
    from engramdb.records import Node

    node = Node(id="x", content="hello " * 500, tags=("a",), embeddings={"e": (1.0, 0.5, 0.25)}, tier="warm")
    raw = codec.encode_node(node)
    assert codec.decode_node(raw, vectors=False) == node.replace(embeddings={})
    assert codec.decode_node(raw, fetch=lambda names: dict(node.embeddings)) == node


@pytest.mark.parametrize("bad", ["surrogate", "too long"])
def test_a_summary_no_memory_can_hold_leaves_its_group_alone_and_the_file_working(make_db, monkeypatch, bad):
    # A summary longer than a memory may be used to be stored in the plan, whose apply then
    # raised ValidationError on every later maintain() and forget(): the file was stuck.
    import engramdb.records as records_mod

    monkeypatch.setattr(records_mod, "MAX_CONTENT_BYTES", 4000)
    db = make_db(encrypted=False)
    fill(db, 60, seed=3)
    good = db.maintain(now=NOW, summarizer=summarize, plan=True)
    assert good.summary_ids
    text = "a summary \ud800 of them" if bad == "surrogate" else "y" * 5000
    report = db.maintain(now=NOW, summarizer=lambda texts: text)
    assert report.clusters_found == good.clusters_found and report.summarized == 0 and report.summary_ids == []
    assert not any(node.id.startswith("summary-") for node in db.scan())
    again = db.maintain(now=NOW, summarizer=summarize)
    assert again.summary_ids and db.verify() == []


def test_a_stored_plan_with_a_summary_that_cannot_be_stored_is_finished(make_db, monkeypatch):
    # a plan stored with a summary its apply refuses (stored before summaries were checked;
    # here, stored under a larger limit): the next call finishes it, without that summary
    import engramdb.records as records_mod

    db = make_db(encrypted=False)
    fill(db, 60, seed=3)

    with pytest.raises(Killed):
        db.maintain(MaintenanceConfig(batch_size=1), now=NOW, summarizer=lambda texts: "y" * 5000,
                    progress=kill_at_write)
    monkeypatch.setattr(records_mod, "MAX_CONTENT_BYTES", 4000)
    finished = db.maintain(now=NOW)
    assert finished.summarized > 0 and not any(node.id.startswith("summary-") for node in db.scan())
    assert not db.maintain(now=NOW).changed and db.verify() == []


def test_format_iso_writes_every_javascript_date_as_to_iso_string_does():
    # datetime cannot hold years past 9999: format_iso raised ValueError there
    from engramdb.maintenance.lifecycle import format_iso

    assert format_iso(NOW) == "2023-11-14T22:13:20.000Z" and format_iso(951782400) == "2000-02-29T00:00:00.000Z"
    # the values Node.js 20 prints for new Date(ms).toISOString()
    assert format_iso(1.7e12) == "+055840-11-08T22:13:20.000Z"
    assert format_iso(253402300800) == "+010000-01-01T00:00:00.000Z"
    assert format_iso(-62167219200) == "0000-01-01T00:00:00.000Z"
    assert format_iso(-62167219201) == "-000001-12-31T23:59:59.000Z"
    assert format_iso(-42484026532.35) == "0623-09-26T17:31:07.650Z"
    assert format_iso(8.64e12) == "+275760-09-13T00:00:00.000Z" and format_iso(-8.64e12) == "-271821-04-20T00:00:00.000Z"
    for bad in (8.64e12 + 1, float("nan"), float("inf")):
        with pytest.raises(ValidationError):
            format_iso(bad)


def test_a_pass_with_now_past_year_9999_finishes(make_db):
    # now=1.7e12 (a millisecond clock given as seconds) stored the plan, then raised a raw
    # ValueError writing its time, on this call and every later maintain() and forget()
    db = make_db(encrypted=False)
    fill(db, 30, seed=1)
    report = db.maintain(now=1.7e12, summarizer=summarize)
    assert report.after_by_tier["archive"] > 0
    assert db.stats()["last_maintenance"]["at"] == "+055840-11-08T22:13:20.000Z"
    assert not db.maintain(now=1.7e12).changed
    with pytest.raises(ValidationError) as exc:
        db.maintain(now=1e15)
    assert "millisecond" in exc.value.hint
    with db._store.read() as txn:
        assert txn.get("meta", run_mod.PLAN_KEY) is None


def test_a_stored_plan_with_a_now_beyond_javascript_dates_is_finished(make_db, monkeypatch):
    db = make_db(encrypted=False)
    fill(db, 30, seed=1)
    monkeypatch.setattr(run_mod, "MAX_TIME", float("inf"), raising=False)  # a version that took any finite now

    with pytest.raises(Killed):
        db.maintain(now=1e15, progress=kill_at_write)
    monkeypatch.undo()
    assert db.maintain().now == 1e15
    assert not db.maintain(now=NOW).changed and db.verify() == []


def _during_planning(db, action):
    """A progress callback that runs ``action`` once, while the pass plans (before it writes)."""
    done = []

    def progress(phase, n, total):
        if not done and phase != "write":
            done.append(phase)
            action()
    return progress


def test_a_pass_planned_while_another_pass_ran_plans_again(make_db, tmp_path):
    # the other pass applied the same operations and dropped their change-log entries, so
    # every operation of the stale plan looked unchanged: it deleted a memory deleted
    # already, and NotFoundError stopped this and every later maintain() and forget()
    db = make_db("race.engram", encrypted=False)
    fill(db, 40, seed=2)
    other = engramdb.open(tmp_path / "race.engram", encrypted=False)
    try:
        first = []
        report = db.maintain(now=NOW, progress=_during_planning(db, lambda: first.append(other.maintain(now=NOW))))
    finally:
        other.close()
    assert first[0].deduplicated > 0 and first[0].changed
    assert not report.changed
    assert not db.maintain(now=NOW).changed and db.verify() == []
    with db._store.read() as txn:
        assert list(iter_dirty(txn)) == []


def test_a_pass_skips_memories_forgotten_while_it_planned(make_db, tmp_path):
    # forget drops a memory's change-log entry with it: an operation on it looked unchanged
    db = make_db("forget.engram", encrypted=False)
    db.add("alpha bravo charlie delta", id="a", now=NOW)
    db.add("alpha bravo charlie delta", id="b", now=NOW)  # a duplicate of a, deleted by the pass
    other = engramdb.open(tmp_path / "forget.engram", encrypted=False)

    def forget_b():
        with pytest.raises(engramdb.AlreadyOpenError):  # removed; compacting waits for db to close
            other.forget(ids=["b"])
    try:
        report = db.maintain(now=NOW, progress=_during_planning(db, forget_b))
    finally:
        other.close()
    assert report.removed_ids == ["b"] and db.ids() == ["a"]
    assert not db.maintain(now=NOW).changed and db.verify() == []


def test_a_state_listing_a_forgotten_memory_makes_a_full_pass(make_db, tmp_path):
    # x, added after the last pass, was forgotten while another pass planned: that pass wrote
    # x's row back into the state, and a later pass whose decay reached x read its missing
    # record: CorruptFileError on every maintain() from then on
    db = make_db("stale.engram", encrypted=False)
    db.add("alpha bravo charlie", id="a", now=NOW)
    db.maintain(now=NOW)
    db.add("kilo lima mike november", id="x", now=NOW)
    other = engramdb.open(tmp_path / "stale.engram", encrypted=False)

    def forget_x():
        with pytest.raises(engramdb.AlreadyOpenError):
            other.forget(ids=["x"])
    try:
        db.maintain(now=NOW + DAY, progress=_during_planning(db, forget_x))
    finally:
        other.close()
    for days in (10, 100, 1000):
        report = db.maintain(now=NOW + days * DAY)
        assert report.before_total == 1 and report.after_total == 1
    assert db.get("a").tier == "archive" and db.verify() == []


@pytest.mark.parametrize("length", [50, 500, 0])
def test_the_file_pass_truncates_at_the_configured_length(make_db, length):
    # the file pass cut at 200 characters whatever archive_truncate_length said: with 500 it
    # dropped 300 characters the config kept, and with 0 (no truncation in the pure pass) it
    # truncated anyway
    from engramdb.maintenance import lifecycle

    db = make_db(encrypted=False)
    text = "word " * 200
    db.add(text, id="old", tier="cold", importance=0.0, now=NOW - 900 * DAY)
    config = MaintenanceConfig.trace_lite(archive_truncate_length=length)
    report = db.maintain(config, now=NOW)
    memory = lifecycle.Memory(id="old", content=text, tier="archive")
    out, _, pure_dropped = lifecycle._archive([memory], config)
    assert report.bytes_dropped == pure_dropped
    if length:
        assert db.get("old").content == out[0].content
    else:  # the pure pass keeps the text; the file pass archives it whole, as without archive_truncate
        assert out[0].content == text and db.get("old", full=True).content == text


def test_times_and_counts_past_int64_milliseconds_saturate(make_db):
    # a time stored from a nanosecond clock (as seconds), or an access count of 2**63, did
    # not fit the state's int64 columns: a raw OverflowError on every maintain()
    db = make_db(encrypted=False)
    db.add("alpha bravo charlie", id="past", created_at=-1e300, now=NOW)
    db.add("kilo lima mike", id="future", created_at=1.7e18, now=NOW)  # time.time_ns() as seconds
    db.add("november oscar papa", id="used", access_count=2**63, now=NOW)
    db.add("quebec romeo sierra", id="seen", last_accessed=1e300, now=NOW)
    db.maintain(MaintenanceConfig(decay_from="last_accessed"), now=NOW)
    assert db.get("past").tier == "archive" and db.get("future").tier == "hot"
    assert db.get("used").tier == "hot" and db.get("used").access_count == 2**63
    assert not db.maintain(MaintenanceConfig(decay_from="last_accessed"), now=NOW).changed
    assert db.maintain(now=NOW).decayed == 0 and db.verify() == []


def test_a_config_switch_must_be_a_bool():
    # regression: keep_pinned="no" (or 0, "false") was accepted and taken as True / False by truthiness
    for name in ("archive_truncate", "keep_pinned", "merge_duplicates", "incremental"):
        for bad in ("no", "false", 0, 1, None):
            with pytest.raises(ValidationError, match=f"MaintenanceConfig.{name} must be True or False"):
                MaintenanceConfig(**{name: bad})
        assert getattr(MaintenanceConfig(**{name: np.bool_(False)}), name) is False
    with pytest.raises(ValidationError, match="space"):
        MaintenanceConfig(space=3)


def test_config_takes_numpy_numbers_as_their_python_values(make_db):
    # a threshold computed with numpy (np.float32(0.9), np.int64(3)) was refused as "must be a
    # finite number", while the boolean options already took numpy.bool_ and recall takes NumPy numbers
    config = MaintenanceConfig(dedupe_threshold=np.float64(0.9), cluster_threshold=np.float32(0.5),
                               min_cluster_size=np.int64(4), hot_days=np.int32(3), decay_steps=np.int64(2),
                               batch_size=np.uint16(50), archive_truncate_length=np.int64(100))
    assert config.dedupe_threshold == 0.9 and type(config.dedupe_threshold) is float
    assert type(config.cluster_threshold) is float and config.cluster_threshold == float(np.float32(0.5))
    assert (config.min_cluster_size, config.decay_steps, config.batch_size, config.archive_truncate_length) == (4, 2, 50, 100)
    assert all(type(v) is int for v in (config.min_cluster_size, config.decay_steps, config.batch_size))
    assert config.hot_days == 3.0
    for bad in (np.bool_(True), np.float64("nan"), "0.9"):
        with pytest.raises(ValidationError, match="dedupe_threshold"):
            MaintenanceConfig(dedupe_threshold=bad)
    with pytest.raises(ValidationError, match="min_cluster_size"):
        MaintenanceConfig(min_cluster_size=np.float64(3.0))
    db = make_db(encrypted=False)
    db.add("one memory", id="a", now=NOW)
    assert db.maintain(config, now=NOW).after_total == 1


def test_dedupe_in_the_builtin_space_keeps_texts_that_differ_in_words_it_cannot_see(make_db):
    # the built-in space embeds only the index's words: "not" (a stop word) and "5" / "6" (single
    # characters) leave no trace, so these pairs had cosine 1 and the first maintain() deleted
    # one memory of each as a duplicate of the other
    db = make_db(encrypted=False)
    for i, text in enumerate(["The migration is done", "The migration is not done", "Call mom at 5",
                              "Call mom at 6", "Alice moved to Berlin", "alice  moved to BERLIN!"]):
        db.add(text, id=f"m{i}", now=NOW)
    report = db.maintain(now=NOW)
    assert report.removed_ids == ["m5"] and report.deduplicated == 1  # only the true duplicate
    assert [n.id for n in db.scan()] == ["m0", "m1", "m2", "m3", "m4"]
    assert not db.maintain(now=NOW).changed
    # a space of the user's model is taken as it is: its vectors see every word
    other = make_db(encrypted=False)
    other.add_space("mine", dims=2, model="my-model", auto=False)
    other.add("The migration is done", id="a", embeddings={"mine": [1.0, 0.0]}, now=NOW)
    other.add("The migration is not done", id="b", embeddings={"mine": [1.0, 0.0]}, now=NOW)
    assert other.maintain(MaintenanceConfig(space="mine"), now=NOW).removed_ids == ["b"]


# a long shared start: one changed word after it leaves the built-in space's cosine above 0.92
_LONG_HEAD = ("The quarterly review covered the Atlas project, the hiring plan for the platform team, "
              "the new office lease, the customer escalations from the enterprise accounts and the roadmap. ")


def _maintain_pairs_after_a_long_head(db, pairs):
    """Each pair stored as NAME-a and NAME-b after :data:`_LONG_HEAD`; the pass's report."""
    for name, (a, b) in pairs.items():
        db.add(_LONG_HEAD + a, id=f"{name}-a", now=NOW)
        db.add(_LONG_HEAD + b, id=f"{name}-b", now=NOW)
    return db.maintain(now=NOW)


def test_dedupe_in_the_builtin_space_keeps_texts_that_differ_in_a_number_or_a_date(make_db):
    # In a long text one different number, date or month moves the built-in space's vector
    # little: these pairs scored above 0.92 and maintain() deleted the second memory of each
    # as a duplicate, losing the fact ("the budget is 25000"). Numbers, dates and times must
    # agree as well; the true duplicate still goes.
    db = make_db(encrypted=False)
    pairs = {"num": ("The budget is 15000 dollars.", "The budget is 25000 dollars."),
             "date": ("Launch is on 2024-03-14.", "Launch is on 2025-03-14."),
             "month": ("Launch is in March.", "Launch is in April."),
             "day": ("The review is on Monday.", "The review is on Friday."),
             "time": ("Standup at 10:30.", "Standup at 11:30."),
             "twin": ("Retro on 2023-01-09.", "retro on 2023-01-09!")}
    report = _maintain_pairs_after_a_long_head(db, pairs)
    assert report.removed_ids == ["twin-b"]
    assert not db.maintain(now=NOW).changed


def test_dedupe_in_the_builtin_space_compares_skipped_words_as_the_tokenizer_normalises_them(make_db):
    # The skipped-word check reads the text as the tokenizer does (NFKC, lowercase): twins that
    # differ only in Unicode form have the same index words and the same skipped words, and are
    # merged; the tokenizer folds no accents, so "cafe" / "café" are two index words, never
    # cosine-1 twins, and a pair whose skipped words differ ("not", "5" / "6") stays apart.
    db = make_db(encrypted=False)
    texts = {
        "precomposed": "We met Anna at the caf\u00e9 near the station",
        "combining": "We met Anna at the cafe\u0301 near the station",  # the same text, NFD
        "fullwidth": "Call mom at \uff15 about the \ufb01le",  # fullwidth 5, the fi ligature
        "ascii": "Call mom at 5 about the file",
        "six": "Call mom at 6 about the file",
        "plain": "We met Anna at the cafe near the station",  # no accent: another index word
        "negated": "We did not meet Anna at the caf\u00e9 near the station",
    }
    for id_, text in texts.items():
        db.add(text, id=id_, now=NOW)
    tokenizer = db.indexes.tokenizer
    assert tokenizer(texts["precomposed"]) == tokenizer(texts["combining"])
    assert tokenizer(texts["precomposed"]) != tokenizer(texts["plain"])
    report = db.maintain(now=NOW)
    assert sorted(report.removed_ids) == ["ascii", "combining"] and report.deduplicated == 2
    assert [n.id for n in db.scan()] == ["precomposed", "fullwidth", "six", "plain", "negated"]


def test_dedupe_in_the_builtin_space_keeps_texts_that_differ_in_a_name_or_its_place(make_db):
    # "... Alice owes Bob 50 euros" and "... Bob owes Alice 50 euros" hold the same words (cosine
    # 1 in the built-in space), and "... owes Carol" changes one word of a long text: maintain()
    # deleted the second memory of each pair as a duplicate. Names (capitalised words not
    # starting a sentence) must agree, in order; a twin differing in a sentence's first letter
    # still goes.
    db = make_db(encrypted=False)
    pairs = {"swap": ("After the trip Alice owes Bob 50 euros.", "After the trip Bob owes Alice 50 euros."),
             "name": ("The lease was signed by Alice.", "The lease was signed by Carol."),
             "twin": ("Then Alice signs.", "then Alice signs!")}
    report = _maintain_pairs_after_a_long_head(db, pairs)
    assert report.removed_ids == ["twin-b"]
    assert not db.maintain(now=NOW).changed


def test_the_words_dedupe_cannot_weigh_are_read_in_order():
    from engramdb.index.tokenize import Tokenizer
    from engramdb.maintenance import run

    tokenizer = Tokenizer()
    _, facts = run._unseen_words(tokenizer, "Alice met Bob. Then Carol paid 50 on Monday.\nDana left")
    assert facts == ("bob", "carol", "50", "monday")  # Alice, Then and Dana start a sentence or a line
    _, facts = run._unseen_words(tokenizer, "met İstanbul friends and Bob")  # "İ".lower() is two characters
    assert facts == ("i̇stanbul", "bob")


def _links(db):
    """Every edge: (src, kind, dst, weight, label)."""
    return sorted((e.src, e.kind, e.dst, e.weight, e.label) for n in db.scan() for e in db.edges(n.id))


def _duplicates_with_edges(db):
    db.add_space("v", dims=3, model="mine", auto=False)
    for id_, vec, importance in (("a", [1, 0, 0], 0.0), ("a2", [1, 0.0005, 0], 0.1), ("b", [1, 0.001, 0], 0.9),
                                 ("c", [0, 1, 0], 0.5), ("d", [0, 0, 1], 0.5), ("e", [0, 1, 1], 0.5)):
        db.add(f"memory {id_}", id=id_, importance=importance, embeddings={"v": vec}, now=NOW,
               entities=["Paris", "Louvre"] if id_ in ("a", "c") else [])
    db.link_tunnels(now=NOW)  # a derived tunnel a -> c (shared entities)
    db.link("a", "c", "related", weight=0.7, label="moves", now=NOW)
    db.link("d", "a", "supersedes", now=NOW)  # incoming: d -> b
    db.link("a", "b", "related", now=NOW)  # between the duplicates: no self-link
    db.link("a", "a2", "related", now=NOW)  # between two removed duplicates: gone
    db.link("a2", "e", "related", weight=0.3, now=NOW)
    db.link("b", "e", "related", weight=0.9, now=NOW)  # b's own, stronger: kept
    db.link("a", "d", "related", weight=0.8, now=NOW)
    db.link("b", "d", "related", weight=0.2, now=NOW)  # b's own, weaker: a's replaces it


def test_a_removed_duplicate_gives_its_edges_to_its_survivor(make_db):
    # maint's notes: the pass deleted a duplicate's edges with it, so the graph lost the links
    # its survivor now stands for (tags and access counts already moved)
    db = make_db(encrypted=False)
    _duplicates_with_edges(db)
    report = db.maintain(MaintenanceConfig(space="v", batch_size=1), now=NOW)
    assert report.removed_ids == ["a", "a2"]
    assert _links(db) == [
        ("b", "related", "c", 0.7, "moves"),
        ("b", "related", "d", 0.8, ""),
        ("b", "related", "e", 0.9, ""),
        ("b", "tunnel", "c", pytest.approx(1.0), "shared entities/topics"),
        ("d", "supersedes", "b", 1.0, ""),
    ]
    with db._store.read() as txn:  # the tunnel stays derived: the next recomputation replaces it
        b = engram_mod.Transaction(db, txn)._docno("b")
        assert [derived for _, e, derived in db.indexes.graph.outgoing(txn, b) if e.kind == "tunnel"] == [True]
    assert db.verify() == []
    # one batch or many, the same graph
    other = make_db("other.engram", encrypted=False)
    _duplicates_with_edges(other)
    other.maintain(MaintenanceConfig(space="v"), now=NOW)
    assert _links(other) == _links(db)


def test_without_merge_duplicates_a_removed_duplicates_edges_go_with_it(make_db):
    db = make_db(encrypted=False)
    _duplicates_with_edges(db)
    db.maintain(MaintenanceConfig(space="v", merge_duplicates=False), now=NOW)
    assert _links(db) == [("b", "related", "d", 0.2, ""), ("b", "related", "e", 0.9, "")]


@pytest.mark.parametrize("change", ["content", "delete"])
def test_a_duplicate_stays_when_its_survivor_changed_while_the_pass_planned(make_db, tmp_path, change):
    # the pass deleted the duplicate all the same: its text, no longer in the survivor, was lost
    db = make_db("survivor.engram", encrypted=False)
    db.add_space("v", dims=3, model="mine", auto=False)
    db.add("the ferry leaves at noon", id="a", embeddings={"v": [1, 0, 0]}, now=NOW)
    db.add("the ferry leaves at noon!", id="b", importance=0.9, embeddings={"v": [1, 0.001, 0]}, now=NOW)
    other = engram_mod.open(tmp_path / "survivor.engram", encrypted=False)

    def act():
        if change == "content":
            other.update("b", content="something else entirely", embeddings={"v": [0, 1, 0]})
        else:
            other.delete("b")
    try:
        report = db.maintain(MaintenanceConfig(space="v"), now=NOW, progress=_during_planning(db, act))
    finally:
        other.close()
    # kept: not listed as removed, nor counted (the report listed the plan's decision)
    assert report.removed_ids == [] and report.deduplicated == 0
    assert db.stats()["last_maintenance"]["deduplicated"] == 0
    assert db.get("a").content == "the ferry leaves at noon"
    with db._store.read() as txn:  # logged as changed: the next pass looks at it again
        assert list(iter_dirty(txn)) != []
    again = db.maintain(MaintenanceConfig(space="v"), now=NOW)
    assert again.removed_ids == [] and db.get("a") is not None and db.verify() == []
