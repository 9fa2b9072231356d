"""Regression tests for the compress QA pass (one section per reported bug)."""
from __future__ import annotations

import datetime
import json

import pytest

from engramdb.compress import CompressStream, compress, estimate_tokens, inject_context
from engramdb.errors import ValidationError

TWO_FACTS = "Alice decided to move to Berlin. Bob stayed in Lisbon."


# --- 1. inject_context: no @end trailer, "" instead of an empty frame ---------------


def test_aaak_context_has_no_trailer_and_fits_a_small_budget():
    r = compress(TWO_FACTS)
    out = inject_context(r, max_token_budget=60)
    assert "@end" not in out
    assert "Alice decided to move to Berlin." in out  # the memory itself, not just the frame
    assert out.splitlines()[0].startswith("FILE:")
    assert estimate_tokens(out) <= 60
    assert "@end" not in inject_context(r)


@pytest.mark.parametrize("fmt", ["aaak", "json", "markdown"])
def test_nothing_chosen_renders_empty_string(fmt):
    r = compress(TWO_FACTS)
    assert inject_context(r, format=fmt, max_token_budget=5) == ""  # no zettel fits
    assert inject_context(r, format=fmt, min_weight=2.0) == ""  # no zettel passes the filter
    assert inject_context(r, format=fmt, max_zettels=0) == ""


def test_json_context_still_parses_when_not_empty():
    r = compress(TWO_FACTS)
    doc = json.loads(inject_context(r, format="json"))
    assert [z["quote"] for z in doc["zettels"]] == ["Alice decided to move to Berlin."]


# --- 2. an unreadable date option raises ---------------------------------------------


@pytest.mark.parametrize("bad", ["notadate", "", "2023-13-01", "2023-02-30", "sometime soon"])
def test_bad_date_option_raises_with_hint(bad):
    with pytest.raises(ValidationError) as info:
        compress("We met yesterday.", date=bad)
    assert "YYYY-MM-DD" in info.value.hint
    with pytest.raises(ValidationError):
        CompressStream(date=bad)


@pytest.mark.parametrize("good, expected", [
    ("2023-05-08", "2023-05-07"), ("2023-05", "2023-05"), ("2023", "2023"), ("8 May 2023", "2023-05-07"),
    ("May 8, 2023", "2023-05-07"), (datetime.date(2023, 5, 8), "2023-05-07"),
])
def test_good_date_options_still_anchor(good, expected):
    r = compress("We met yesterday.", date=good)
    assert r.zettels[0].resolved_date == expected
    assert not any("date" in w for w in r.meta["warnings"])
