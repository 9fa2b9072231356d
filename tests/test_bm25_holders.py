"""Which small segments of a read state hold a term (spec/bm25.md "Caches", "Which new
segments hold the term"): the C extension's ``term_holders`` against the Python path
(``SegmentedBM25._holders`` and ``_counts``): the same holders and tombstone counts, as
tuples, for any cached entry's age, term sets of every kind a state holds (a packed
segment's index dict, a ``v`` record's frozenset, this handle's fresh rows, None when not
known), and states older than the entry. Skip without the extension unless
ENGRAMDB_REQUIRE_NATIVE=1, as tests/test_native.py does."""
from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engramdb import _accel
from engramdb.index.bm25 import SegmentedBM25, _View

NATIVE = _accel.load({})
if NATIVE is None and os.environ.get("ENGRAMDB_REQUIRE_NATIVE") == "1":
    raise RuntimeError("ENGRAMDB_REQUIRE_NATIVE=1 but engramdb._native is not built")
needs_native = pytest.mark.skipif(NATIVE is None, reason="engramdb._native is not built")

BLINDS = [bytes([i]) * 16 for i in range(6)]


@st.composite
def cases(draw: st.DrawFn) -> tuple[bytes, list[tuple[int, Any]], tuple[int, ...], tuple[int, ...], dict[int, int]]:
    """(blind, the state's small segments with term sets, the entry's live segments, its
    delta's holders (among its live small segments holding the term), tombstone counts)."""
    segnos = sorted(draw(st.sets(st.integers(1, 60), max_size=24)))
    blind = draw(st.sampled_from(BLINDS))
    terms: dict[int, Any] = {}
    for s in segnos:
        held = draw(st.sets(st.sampled_from(BLINDS), max_size=4))
        kind = draw(st.sampled_from(["dict", "frozenset", "rows", "none"]))
        terms[s] = (None if kind == "none" else frozenset(held) if kind == "frozenset"
                    else {b: (0, 1) for b in held} if kind == "rows" else {b: i for i, b in enumerate(sorted(held))})
    # the state's small segments: some of the entry's, some newer; the entry may also be
    # NEWER than the state (another thread's older snapshot): live segments the state lacks
    small_segs = sorted(draw(st.sets(st.sampled_from(segnos), max_size=len(segnos))) if segnos else [])
    small = [(s, terms[s]) for s in small_segs]
    live = tuple(sorted(draw(st.sets(st.sampled_from(segnos), max_size=len(segnos))) if segnos else []))
    # the entry's holders: its live segments whose term set held the term (or was not known)
    holders = tuple(s for s in live if terms[s] is None or blind in terms[s])
    if draw(st.booleans()):
        holders = ()  # an entry from another epoch, or none: every small segment asked
        live = ()
    dead = {s: draw(st.integers(1, 9)) for s in draw(st.sets(st.sampled_from(segnos), max_size=5))} if segnos else {}
    return blind, small, live, holders, dead


def _python(blind: bytes, small: list[tuple[int, Any]], live: tuple[int, ...], holders: tuple[int, ...],
            dead: dict[int, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    view = _View(small, ((), ()), {})
    old = SimpleNamespace(live=live, delta=SimpleNamespace(key=(holders, ())))
    got = SegmentedBM25._holders(view, old, blind)  # type: ignore[arg-type]
    state = SimpleNamespace(signature=lambda: ((), dead))
    return got, SegmentedBM25._counts(state, got)  # type: ignore[arg-type]


@needs_native
@settings(max_examples=400, deadline=None)
@given(case=cases())
def test_native_term_holders_equals_python(case: Any) -> None:
    assert NATIVE is not None
    got = NATIVE.term_holders(*case)
    want = _python(*case)
    assert got == want
    assert all(type(x) is tuple for x in got)


@needs_native
def test_native_term_holders_examples() -> None:
    """Named cases: an old holder stays one (even when its term set does not say so: term sets
    are immutable, so it never stops holding), a live non-holder is not asked again, a new
    segment is asked (None: it may hold), a segment the state lacks is not a holder."""
    assert NATIVE is not None
    b = BLINDS[0]
    small = [(1, frozenset()), (2, {b: 0}), (3, None), (5, frozenset([b])), (7, {BLINDS[1]: 0})]
    assert NATIVE.term_holders(b, small, (1, 2, 4), (1, 4), {5: 3, 9: 1}) == ((1, 3, 5), (0, 0, 3))
    assert NATIVE.term_holders(b, small, (), (), {}) == ((2, 3, 5), (0, 0, 0))
    assert NATIVE.term_holders(b, [], (1,), (1,), {}) == ((), ())


@needs_native
def test_native_term_holders_refuses_bad_arguments() -> None:
    assert NATIVE is not None
    b = BLINDS[0]
    with pytest.raises(TypeError, match="dead_sizes must be a dict"):
        NATIVE.term_holders(b, [], (), (), [])
    with pytest.raises(TypeError, match="old_live must be a tuple"):
        NATIVE.term_holders(b, [], [1], (), {})
    with pytest.raises(TypeError, match="old_holders must be a tuple"):
        NATIVE.term_holders(b, [], (), [1], {})
    with pytest.raises(TypeError, match="small holds"):
        NATIVE.term_holders(b, [(1,)], (), (), {})
    with pytest.raises(TypeError):
        NATIVE.term_holders(b, [("x", None)], (), (), {})
    with pytest.raises(TypeError):
        NATIVE.term_holders(b, [(1, 5)], (), (), {})  # a term set that is not a container
