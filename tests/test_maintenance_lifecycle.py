"""The pure lifecycle functions: decay boundaries, pinned memories, extensions, no mutation."""
from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engramdb.errors import ValidationError
from engramdb.maintenance.lifecycle import (
    MaintenanceConfig,
    Memory,
    cluster,
    consolidate,
    cosine_similarity,
    decay,
    deduplicate,
    forget,
    format_iso,
    parse_iso,
    preview,
    utf16_len,
)

NOW = parse_iso("2026-06-01T12:00:00Z")
DAY = 86400.0
MS = 0.001
TL = MaintenanceConfig.trace_lite()


def mem(id="a", *, age_days=0.0, tier="hot", importance=0.5, access=0, pinned=False, emb=(1.0, 0.0), **kw):
    return Memory(id=id, content=kw.pop("content", id), embedding=tuple(emb), importance=importance, tier=tier,
                  created_at=NOW - age_days * DAY, last_accessed=kw.pop("last_accessed", NOW - age_days * DAY),
                  access_count=access, pinned=pinned, **kw)


def tier_after(m, config=TL, now=NOW):
    return decay([m], config, now=now).memories[0].tier


@pytest.mark.parametrize("tier,importance,access,stays,moves", [
    ("hot", 0.0, 0, 7 * DAY, 7 * DAY + MS),
    ("warm", 0.0, 0, 30 * DAY, 30 * DAY + MS),
    ("cold", 0.0, 0, 365 * DAY, 365 * DAY + MS),
    # importance 1.0 triples the age limit, 10 accesses take 5 days off: hot until 26 days
    ("hot", 1.0, 10, 26 * DAY, 26 * DAY + MS),
    # the access boost is capped at 5 days
    ("hot", 1.0, 40, 26 * DAY, 26 * DAY + MS),
    # importance 0.5 doubles the limit, 3 accesses take 1.5 days off: warm until 61.5 days
    ("warm", 0.5, 3, 61.5 * DAY, 61.5 * DAY + MS),
])
def test_decay_boundaries(tier, importance, access, stays, moves):
    nxt = {"hot": "warm", "warm": "cold", "cold": "archive"}[tier]
    m = mem(tier=tier, importance=importance, access=access)
    assert tier_after(m, now=m.created_at + stays) == tier
    assert tier_after(m, now=m.created_at + moves) == nxt


def test_importance_one_ten_accesses_leaves_hot_just_past_26_days():
    m = mem(importance=1.0, access=10)
    assert tier_after(m, now=m.created_at + 26 * DAY) == "hot"
    assert tier_after(m, now=m.created_at + 26 * DAY + MS) == "warm"
    assert tier_after(m, now=m.created_at + 25.9 * DAY) == "hot"


def test_one_step_per_pass():
    m = mem(age_days=5000)
    tiers = []
    for _ in range(4):
        m = decay([m], TL, now=NOW).memories[0]
        tiers.append(m.tier)
    assert tiers == ["warm", "cold", "archive", "archive"]


def test_default_config_catches_up_in_one_pass():
    m = mem(age_days=5000, importance=0.0)
    assert tier_after(m, MaintenanceConfig()) == "archive"
    assert tier_after(m, MaintenanceConfig(decay_steps=2)) == "cold"
    assert tier_after(mem(age_days=20, importance=0.0), MaintenanceConfig()) == "warm"


def test_archive_never_decays_further_and_unknown_tiers_stay():
    assert tier_after(mem(age_days=9000, tier="archive")) == "archive"


def test_pinned_never_decays_unless_parity():
    m = mem(age_days=5000, pinned=True)
    assert tier_after(m, MaintenanceConfig()) == "hot"
    assert tier_after(m, TL) == "warm"


def test_decay_from_last_accessed():
    m = mem(age_days=100, last_accessed=NOW - 1 * DAY)
    assert tier_after(m, MaintenanceConfig(decay_from="last_accessed")) == "hot"
    assert tier_after(m, MaintenanceConfig()) == "cold"
    assert tier_after(m, MaintenanceConfig(decay_steps=1)) == "warm"


def test_decay_counts_changes_and_keeps_unchanged_objects():
    a, b = mem("a", importance=0.0), mem("b", age_days=8, importance=0.0)
    out, changed = decay([a, b], TL, now=NOW)
    assert changed == 1 and out[0] is a and out[1].tier == "warm" and b.tier == "hot"


def test_dedupe_keeps_higher_score_earlier_on_ties():
    a = mem("a", importance=0.5, emb=(1, 0))
    b = mem("b", importance=0.5, emb=(1, 0.01))
    c = mem("c", importance=0.9, emb=(1, 0.02))
    assert [m.id for m in deduplicate([a, b], config=TL).memories] == ["a"]
    assert [m.id for m in deduplicate([a, c], config=TL).memories] == ["c"]
    # strictly above the threshold: identical vectors at threshold 1.0 both stay
    assert len(deduplicate([a, a.__class__(**{**a.__dict__, "id": "z"})], 1.0, config=TL).memories) == 2


def test_dedupe_pinned_and_merge_extensions():
    a = mem("a", importance=0.9, access=2, emb=(1, 0), tags=("x",))
    b = mem("b", importance=0.1, access=3, pinned=True, emb=(1, 0.001), tags=("y", "x"))
    c = mem("c", importance=0.0, access=1, emb=(1, 0.002), tags=("z",))
    out = deduplicate([a, b, c], config=TL).memories
    assert [m.id for m in out] == ["a"] and out[0].tags == ("x",)
    out = deduplicate([a, b, c]).memories  # engramdb's defaults: pinned stays, losers merged
    assert [m.id for m in out] == ["b"]
    assert out[0].tags == ("y", "x", "z") and out[0].access_count == 6
    both = deduplicate([b, b.__class__(**{**b.__dict__, "id": "b2"})]).memories
    assert [m.id for m in both] == ["b", "b2"]


def test_cluster_greedy_release_and_pinned():
    base = [mem(f"m{i}", tier="warm", emb=(1, 0.05 * i)) for i in range(3)]
    far = mem("far", tier="cold", emb=(0, 1))
    hot = mem("hot", tier="hot", emb=(1, 0))
    assert cluster(base + [far, hot], TL) == [[0, 1, 2]]
    assert cluster(base[:2] + [far], TL) == []
    pinned = base[:2] + [mem("p", tier="warm", pinned=True, emb=(1, 0.1))]
    assert cluster(pinned, TL) == [[0, 1, 2]]
    assert cluster(pinned, MaintenanceConfig()) == []


def test_forget_threshold_is_strict_for_survivors():
    a, b = mem("a", emb=(1, 0)), mem("b", emb=(0, 1))
    out = forget([a, b], (1, 0), 1.0)
    assert [m.id for m in out.memories] == ["b"] and out.forgotten == 1
    assert forget([a], (1, 0, 0), 0.7).forgotten == 0  # length mismatch: similarity 0


def test_cosine_edge_cases():
    assert cosine_similarity((), ()) == 0.0
    assert cosine_similarity((0, 0), (1, 0)) == 0.0
    assert cosine_similarity((1, 2), (1, 2, 3)) == 0.0
    assert cosine_similarity((1, 0), (2, 0)) == 1.0


def test_consolidate_summary_and_truncation():
    long = "word " * 100
    group = [mem(f"g{i}", tier="warm", importance=0.1 * i, emb=(1, 0.01 * i), content=f"t{i} x") for i in range(3)]
    old = mem("old", tier="archive", content=long, emb=(0, 1))
    texts = []

    def summarize(t):
        texts.append(t)
        return "a summary of it all"
    out, report = consolidate(group + [old], TL.replace(dedupe_threshold=0.99999999), summarize, now=NOW)
    assert texts == [["t0 x", "t1 x", "t2 x"]]
    assert report.clusters_found == 1 and report.summarized == 2 and report.archived == 1
    assert [m.id for m in out] == ["g2", "old"]
    assert out[0].content == "a summary of it all" and "consolidated" in out[0].tags
    assert out[0].metadata["consolidatedFrom"] == 3
    assert out[1].content == long[:200] + "..." and out[1].metadata["originalLength"] == 500
    assert report.bytes_dropped == 300
    # engramdb's default keeps archived text (the file moves it to its archive table)
    out, report = consolidate([old], now=NOW)
    assert out[0].content == long and report.archived == 0
    # short summaries and failing summarizers leave the cluster alone
    out, report = consolidate(group, TL.replace(dedupe_threshold=0.99999999), lambda t: "short", now=NOW)
    assert report.summarized == 0 and len(out) == 3

    def boom(t):
        raise RuntimeError("model down")
    assert consolidate(group, TL.replace(dedupe_threshold=0.99999999), boom, now=NOW).report.summarized == 0


def test_utf16_lengths_and_preview():
    s = "\U0001F600" * 150
    assert utf16_len(s) == 300
    assert preview(s, 201) == "\U0001F600" * 100 + "..."
    assert format_iso(parse_iso("2026-06-01T12:00:00.123Z")) == "2026-06-01T12:00:00.123Z"


def test_config_checks():
    with pytest.raises(ValidationError):
        MaintenanceConfig(decay_from="birthday")
    with pytest.raises(ValidationError):
        MaintenanceConfig(batch_size=0)
    with pytest.raises(ValidationError):
        MaintenanceConfig(hot_days=float("nan"))


_floats = st.floats(-1, 1, allow_nan=False, width=32)
_memory = st.builds(
    Memory, id=st.text(min_size=1, max_size=4), content=st.text(max_size=250),
    embedding=st.lists(_floats, min_size=2, max_size=2).map(tuple),
    tags=st.lists(st.sampled_from(["a", "b", "consolidated"]), max_size=3).map(tuple),
    importance=st.floats(0, 1), tier=st.sampled_from(["hot", "warm", "cold", "archive"]),
    created_at=st.floats(NOW - 900 * DAY, NOW), last_accessed=st.floats(NOW - 900 * DAY, NOW),
    access_count=st.integers(0, 20), metadata=st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    pinned=st.booleans())


@settings(max_examples=60, deadline=None)
@given(st.lists(_memory, max_size=12), st.booleans(), st.booleans())
def test_pure_functions_never_mutate_their_input(memories, parity, with_summarizer):
    config = TL if parity else MaintenanceConfig()
    before = copy.deepcopy(memories)
    snapshot = [dict(m.__dict__, metadata=dict(m.metadata)) for m in memories]
    decay(memories, config, now=NOW)
    deduplicate(memories, config=config)
    cluster(memories, config.replace(cluster_threshold=0.5, min_cluster_size=2))
    forget(memories, (1.0, 0.0), 0.5)
    consolidate(memories, config.replace(cluster_threshold=0.5, min_cluster_size=2),
                (lambda t: "summary: " + " ".join(t)) if with_summarizer else None, now=NOW)
    assert memories == before
    assert [dict(m.__dict__, metadata=dict(m.metadata)) for m in memories] == snapshot


@pytest.mark.parametrize("bad", [{"id": None}, {"createdAt": None}, {"id": 7}, {"createdAt": 5},
                                 {"embedding": [1, "x"]}, {"embedding": "12"}, {"importance": "high"}, {"tags": "abc"},
                                 {"metadata": [1, 2]}, {"accessCount": "many"}, {"createdAt": "yesterday"}])
def test_from_trace_lite_refuses_a_malformed_memory_with_a_validation_error(bad):
    # raised KeyError, AttributeError, ValueError or TypeError; tags="abc" became ("a", "b", "c")
    base = {"id": "a", "content": "x", "embedding": [1, 0], "createdAt": "2026-01-01T00:00:00Z"}
    data = {k: v for k, v in {**base, **bad}.items() if v is not None}  # None: the field is missing
    with pytest.raises(ValidationError) as exc:
        Memory.from_trace_lite(data)
    assert exc.value.message
    assert Memory.from_trace_lite(base).embedding == (1.0, 0.0)


@pytest.mark.parametrize(("bad", "field_name"), [
    ({"pinned": "false"}, "pinned"), ({"pinned": 1}, "pinned"), ({"content": 5}, "content"),
    ({"tier": "frozen"}, "tier"), ({"tier": 7}, "tier"), ({"source": 5}, "source"), ({"tags": [1, 2]}, "tags"),
    ({"tags": ["ok", None]}, "tags")])
def test_from_trace_lite_refuses_a_malformed_pinned_content_tier_source_or_tag(bad, field_name):
    # were accepted: "pinned": "false" became pinned=True (keep_pinned then protected a memory
    # Trace Lite did not pin), and the passes ran on a number as content, an unknown tier, ...
    base = {"id": "a", "content": "x", "createdAt": "2026-01-01T00:00:00Z"}
    with pytest.raises(ValidationError) as exc:
        Memory.from_trace_lite({**base, **bad})
    assert f": {field_name} has the wrong type" in exc.value.message and exc.value.hint
    good = Memory.from_trace_lite({**base, "pinned": False, "tier": "cold", "source": None, "tags": ["t"]})
    assert (good.pinned, good.tier, good.source, good.tags) == (False, "cold", "", ("t",))
    assert Memory.from_trace_lite({**base, "pinned": True}).pinned is True


def test_the_package_exports_the_pure_forget_and_every_pure_function_checks_its_input():
    # engramdb.maintenance.forget was the submodule forget.py (importing it rebinds the name):
    # "TypeError: 'module' object is not callable"; a list of Trace Lite dicts raised AttributeError
    import engramdb  # noqa: F401  (imports engramdb.maintenance.forget, the submodule)
    import engramdb.maintenance as maintenance
    from engramdb.maintenance import cluster, consolidate, decay, deduplicate, forget

    assert callable(maintenance.forget) and forget is maintenance.forget
    kept = forget([Memory(id="a", embedding=(1.0, 0.0)), Memory(id="b", embedding=(0.0, 1.0))], [1, 0])
    assert [m.id for m in kept.memories] == ["b"] and kept.forgotten == 1
    raw = {"id": "a", "content": "x", "embedding": [1, 0], "createdAt": "2026-01-01T00:00:00Z"}
    calls = [lambda m: decay(m, now=NOW), lambda m: deduplicate(m), lambda m: cluster(m),
             lambda m: forget(m, [1, 0]), lambda m: consolidate(m, now=NOW)]
    for call in calls:
        for bad in ([raw, raw], "ab", [Memory(id="a"), None]):
            with pytest.raises(ValidationError) as exc:
                call(bad)
            assert "from_trace_lite" in exc.value.hint
    for query in ("ab", [[1, 0]], [object()]):
        with pytest.raises(ValidationError):
            forget([Memory(id="a", embedding=(1.0, 0.0))], query)


def test_parse_iso_reads_every_time_format_iso_writes():
    # format_iso writes years outside 0000-9999 as toISOString does (+055840-...); parse_iso,
    # on Python's datetime, refused them, so a memory's Trace Lite form did not read back
    from engramdb.maintenance.lifecycle import format_iso

    for ts in (1.7e12, -62167219201.0, 253402300800.0, -8.64e12, 8.64e12, 1_780_315_200.123, 0.0):
        assert parse_iso(format_iso(ts)) == round(ts * 1000) / 1000
    m = Memory(id="far", content="x", created_at=1.7e12, last_accessed=1.7e12)
    assert Memory.from_trace_lite(m.to_trace_lite()) == m
    for bad in ("+010001-02-29T00:00:00.000Z", "+010000-13-01T00:00:00Z", "+55840-01-01T00:00:00Z"):
        with pytest.raises(ValidationError):
            parse_iso(bad)


@pytest.mark.parametrize("bad", ["abc", "2020", True, float("nan")])
def test_the_pure_passes_check_their_clock(bad):
    # decay multiplied the string by 1000 (TypeError from round), consolidate raised ValueError
    from engramdb.maintenance import consolidate, decay

    for call in (lambda: decay([Memory(id="a")], now=bad), lambda: consolidate([Memory(id="a")], now=bad)):
        with pytest.raises(ValidationError):
            call()
