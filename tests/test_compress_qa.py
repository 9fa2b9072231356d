"""Regression tests for the compress QA pass (one section per reported bug)."""
from __future__ import annotations

import json

import pytest

from engramdb.compress import compress, estimate_tokens, inject_context

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
