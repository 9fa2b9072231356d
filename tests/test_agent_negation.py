"""Agent fact deduplication and negations: a fact that negates a stored one is a new fact
(spec/agent.md, fact formation step 4)."""
from __future__ import annotations

import pytest

from engramdb.agent import MemoryHooks

USE = "Build a CLI tool. Use argparse for the options."
AVOID = "Build a CLI tool. Do not use argparse for the options."


def _task(text: str) -> list:
    return [{"role": "user", "content": text}, {"role": "assistant", "content": "Done."}]


@pytest.mark.parametrize("first, second", [(USE, AVOID), (AVOID, USE)])
def test_a_fact_that_negates_a_stored_one_is_no_duplicate(make_db, now, first, second):
    # "not" is a stopword, so the two facts had the same content words and the second was
    # dropped as a duplicate: the agent kept the stale opposite preference
    db = make_db()
    hooks = MemoryHooks(db)
    assert len(hooks.after_task(_task(first), outcome="success", now=now)) == 1
    ids = hooks.after_task(_task(second), outcome="success", now=now + 1)
    assert len(ids) == 1 and "argparse" in db.get(ids[0]).content
    assert ("not" in db.get(ids[0]).content) == (second == AVOID)
    # the same negation again (worded with a contraction) is still a duplicate
    again = second.replace("Do not", "Don't") + " Thanks."
    assert hooks.after_task(_task(again), outcome="success", now=now + 2) == []


def test_negations_are_normalised_and_sorted():
    from engramdb.agent.text import negations

    assert negations("Use argparse") == ()
    assert negations("Don't use it, never; we CANNOT, can\u2019t, do not, without") == \
        ("never", "not", "not", "not", "not", "without")
    assert negations("Do not use X") == negations("don't use x") == ("not",)
    assert negations("Nothing and nobody") == ("nobody", "nothing")


@pytest.mark.parametrize(("first", "second"), [
    ("Set up the web server. Always listen on port 8080.", "Set up the web server. Always listen on port 9090."),
    ("Set up the backups. Always run them on Monday at 2am.", "Set up the backups. Always run them on Friday at 2am."),
    ("Pin the toolchain. Use Python 3.11 only.", "Pin the toolchain. Use Python 3.12 only."),
])
def test_a_fact_changing_a_number_or_a_day_is_not_a_duplicate(make_db, now, first, second):
    # "... port 9090" shares all words but one with "... port 8080" (overlap 7/8 >= 0.8), so the
    # changed preference was dropped as a duplicate: the agent kept being told the old port
    db = make_db()
    hooks = MemoryHooks(db, procedures=False, sleep_threshold=None)
    [old] = hooks.after_task([{"role": "user", "content": first}], now=now)
    [new] = hooks.after_task([{"role": "user", "content": second}], now=now + 1)
    assert old != new
    assert hooks.after_task([{"role": "user", "content": second}], now=now + 2) == []  # the same one again
