"""engramdb.filters: one date parser for every after/before (issue 12, bug 7) and one
meaning and one name for each filter in scan and recall (bug 15)."""
from __future__ import annotations

import datetime as dt

import pytest
from conftest import NOW
from hypothesis import given
from hypothesis import strategies as st

from engramdb.errors import ValidationError
from engramdb.filters import Filter, parse_time
from engramdb.records import Node

DAY = 86_400.0


def test_parse_time_forms():
    base = dt.datetime(2023, 5, 1, tzinfo=dt.timezone.utc).timestamp()
    assert parse_time("2023-05-01") == base
    assert parse_time(" 2023-05 ") == base  # the first of the month
    assert parse_time("2023") == dt.datetime(2023, 1, 1, tzinfo=dt.timezone.utc).timestamp()
    assert parse_time(dt.date(2023, 5, 1)) == base
    assert parse_time(dt.datetime(2023, 5, 1)) == base  # naive is UTC
    assert parse_time("2023-05-01T02:00:00+02:00") == base
    assert parse_time(base) == base and parse_time(7) == 7.0
    assert parse_time(None) is None


@pytest.mark.parametrize("bad", ["yesterday", "", True, float("nan"), [2023], "2023-13-01"])
def test_parse_time_rejects_with_a_hint(bad):
    with pytest.raises(ValidationError) as info:
        parse_time(bad, "after")
    assert "after" in str(info.value) and "2023-05-01" in info.value.hint


def test_parse_time_shortens_a_long_value_in_its_message():
    with pytest.raises(ValidationError) as info:
        parse_time("x" * 10_000, "before")
    assert len(info.value.message) < 200


@given(st.datetimes(min_value=dt.datetime(1971, 1, 1), max_value=dt.datetime(2200, 1, 1)))
def test_parse_time_iso_round_trip(moment):
    assert parse_time(moment.isoformat()) == pytest.approx(parse_time(moment))


def _node(**fields) -> Node:
    return Node(id="n", content="c", created_at=NOW, **fields)


def test_filter_meanings():
    node = _node(tags=("a", "b"), flags=("DECISION",), tier="warm", source="notes.md")
    assert Filter()(node) and not Filter().active
    assert Filter(tags=["a", "b"])(node) and not Filter(tags=["a", "c"])(node)  # all of them
    assert Filter(any_tags=["a", "c"])(node) and not Filter(any_tags=["c"])(node)  # one of them
    assert Filter(tags="a")(node)  # one string is one tag
    assert Filter(flags=["DECISION"])(node) and not Filter(flags=["DECISION", "ORIGIN"])(node)
    assert Filter(any_flags=["DECISION", "ORIGIN"])(node)
    assert Filter(tiers=["hot", "warm"])(node) and not Filter(tiers="hot")(node)
    assert Filter(source="notes.md")(node) and not Filter(source="other")(node)
    assert Filter(after=NOW)(node) and not Filter(after=NOW + 1)(node)
    assert Filter(before=NOW + 1)(node) and not Filter(before=NOW)(node)
    assert Filter(any_tags=[]).active and not Filter(any_tags=[])(node)


@pytest.mark.parametrize("kwargs", [{"tiers": ["lukewarm"]}, {"flags": ["NOPE"]}, {"any_flags": ["NOPE"]},
                                    {"tags": [1]}, {"source": 3}, {"tags": 5}])
def test_filter_rejects_bad_arguments(kwargs):
    with pytest.raises(ValidationError):
        Filter(**kwargs)


def test_scan_and_recall_take_the_same_filters_with_the_same_meaning(tmp_engram):
    db = tmp_engram
    old = dt.datetime(2019, 6, 1, tzinfo=dt.timezone.utc).timestamp()
    db.add("Alice plays tennis", id="ab", tags=["a", "b"], now=NOW)
    db.add("Alice plays chess", id="a", tags=["a"], now=NOW)
    db.add("Alice played tennis long ago", id="old", tags=["b"], tier="cold", now=old)
    # bug 7: scan(after="2020-01-01") raised a raw TypeError
    assert [n.id for n in db.scan(after="2020-01-01")] == ["ab", "a"]
    assert [n.id for n in db.scan(before=dt.date(2020, 1, 1))] == ["old"]
    # bug 15: tags means all of them in scan and recall alike; any_tags one of them
    assert [n.id for n in db.scan(tags=["a", "b"])] == ["ab"]
    assert [h.id for h in db.recall("Alice", tags=["a", "b"], top_k=5)] == ["ab"]
    assert {n.id for n in db.scan(any_tags=["a", "b"])} == {"ab", "a", "old"}
    assert {h.id for h in db.recall("Alice", any_tags=["a", "b"], top_k=5)} == {"ab", "a", "old"}
    # one name: tiers= in both (tier= is still accepted by scan)
    assert [n.id for n in db.scan(tiers=["cold"])] == [h.id for h in db.recall("Alice", tiers=["cold"])] == ["old"]
    assert [n.id for n in db.scan(tier="cold")] == ["old"]
    with pytest.raises(ValidationError):
        db.scan(tier="cold", tiers=["hot"])
    with pytest.raises(ValidationError):  # raised at the call, not at the first next()
        db.scan(after="someday")


def _fuzz_target():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "fuzz" / "fuzz_filters.py"
    spec = importlib.util.spec_from_file_location("fuzz_filters", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fuzz_filters_corpus_replays():
    target = _fuzz_target()
    from pathlib import Path

    seeds = sorted(Path(target.CORPUS).iterdir())
    assert len(seeds) >= 25
    for seed in seeds:
        target.TestOneInput(seed.read_bytes())


def test_the_fuzz_filters_oracle_can_fail(monkeypatch):
    target = _fuzz_target()
    monkeypatch.setattr(target, "parse_time", lambda value, name: float("inf"))
    with pytest.raises(AssertionError):
        target.TestOneInput(b"2023-05-01")


@pytest.mark.parametrize("after", ["20230501", "2023-W18", "2023-W18-1", "20230501T120000"])
def test_a_resolved_date_is_compared_with_any_iso_form_of_the_bound(after):
    # the bound was compared as its text: "2023-05-03"[:8] sorts before "20230501", so a memory
    # about 3 May was left out of after="20230501" (and of the week date of 1 May)
    node = Node(id="n", content="c", created_at=NOW, resolved_date="2023-05-03")
    assert Filter(after=after)(node) and Filter(after=after)(node) == Filter(after="2023-05-01")(node)
    assert not Filter(before=after)(node)
    assert Filter(after="2023-05-03T23:59:00")(node) and not Filter(after="20230504")(node)


def test_parse_time_takes_numpy_and_other_real_numbers():
    # a NumPy integer (what pandas and numpy give for a timestamp column) is not an int: refused
    import fractions

    import numpy as np

    assert parse_time(np.int64(1_700_000_000)) == 1_700_000_000.0 and parse_time(np.float32(2.5)) == 2.5
    assert parse_time(fractions.Fraction(3, 2)) == 1.5
    assert Filter(after=np.int64(NOW))(_node()) and not Filter(after=np.int64(NOW + 1))(_node())
    for bad in (np.bool_(True), np.float64("nan")):
        with pytest.raises(ValidationError):
            parse_time(bad)
