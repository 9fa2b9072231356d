"""The conversation serializer: OpenAI chat and Anthropic messages fixtures (a failed tool call,
parallel tool calls, thinking blocks), errors that name the message and field, and ingest."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engramdb.agent import serialize_conversation
from engramdb.agent.serialize import parse_messages
from engramdb.errors import ValidationError

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "agent"


def _load(name: str) -> list:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", ["openai_session.json", "anthropic_session.json"])
def test_both_formats_give_the_same_turns(name):
    conv = serialize_conversation(_load(name))
    assert [t.user for t in conv.turns] == [
        "Build a CLI task manager in Python. Use only the standard library: no argparse or click.",
        "Thanks, add colours.",
    ]
    first = conv.turns[0]
    assert first.assistant == "I'll look at the project first.\nFixed the NameError; tests pass now."
    assert conv.turns[1].assistant == "Added ANSI colours."
    # parallel calls keep their order; results are matched by id even when they come back swapped
    assert [(c.id is not None, c.name, c.arguments) for c in first.tool_calls] == [
        (True, "list_files", {"path": "."}), (True, "read_file", {"path": "README.md"}),
        (True, "run_tests", {"cmd": "python -m unittest"})]
    assert [c.result for c in first.tool_calls[:2]] == ["README.md", "# Tasks\n"]
    assert [c.is_error for c in first.tool_calls] == [False, False, True]
    assert "NameError" in first.tool_calls[2].result
    assert first.thinking and "sys.argv" in first.thinking[0]
    assert conv.tool_sequence == ["list_files", "read_file", "run_tests"]
    assert conv.has_errors
    for needle in ("no argparse or click", "[thinking]", "[tool call read_file]", "[run_tests error]",
                   "[read_file result] # Tasks"):
        assert needle in conv.text


def test_no_failed_call_means_no_errors():
    msgs = _load("openai_session.json")
    msgs[6] = {"role": "tool", "tool_call_id": "call_3", "content": "Ran 3 tests\nOK"}
    assert not serialize_conversation(msgs).has_errors
    msgs[6] = {"role": "tool", "tool_call_id": "call_3", "content": "Ran 3 tests", "is_error": True}
    assert serialize_conversation(msgs).has_errors  # an explicit flag wins over the text


@pytest.mark.parametrize("messages, where", [
    ([{"content": "hi"}], "message 0: role is missing"),
    ([{"role": "user", "content": 5}], "message 0: content is a int"),
    ([{"role": "assistant", "content": [{"type": "video"}]}], "message 0: content[0].type 'video'"),
    ([{"role": "assistant", "content": [{"type": "tool_use", "name": "x", "input": {}}]}],
     "message 0: content[0].id is missing"),
    ([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}],
     "message 0: content[0].tool_use_id names the tool call 'nope'"),
    ([{"role": "assistant", "tool_calls": [{"id": "a", "function": {"arguments": "{}"}}]}],
     "message 0: tool_calls[0].function.name is missing"),
    ([{"role": "user", "content": "x"}, {"role": "tool", "content": "r"}], "message 1: tool_call_id is missing"),
    ([{"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f"}}]},
      {"role": "tool", "tool_call_id": "a", "content": "1"}, {"role": "tool", "tool_call_id": "a", "content": "2"}],
     "message 2: tool_call_id answers the tool call 'a' a second time"),
    ([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "is_error": "yes"}]}],
     "message 0: content[0].tool_use_id names"),
    ([3], "message 0: the message is a int"),
])
def test_errors_name_the_message_and_field(messages, where):
    with pytest.raises(ValidationError) as err:
        serialize_conversation(messages)
    assert where in err.value.message
    assert err.value.hint


def test_a_lone_message_or_text_is_refused():
    for bad in ("hello", {"role": "user", "content": "x"}, b"x", 5):
        with pytest.raises(ValidationError):
            serialize_conversation(bad)


def test_broken_json_arguments_are_kept_raw_and_legacy_function_calls_match_by_name():
    conv = serialize_conversation([
        {"role": "user", "content": "go"},
        {"role": "assistant", "tool_calls": [{"id": "a", "type": "function",
                                              "function": {"name": "f", "arguments": "{\"x\": 1"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "done"},
        {"role": "assistant", "content": None, "function_call": {"name": "g", "arguments": "{\"y\": 2}"}},
        {"role": "function", "name": "g", "content": "error: no such file"},
    ])
    calls = conv.turns[0].tool_calls
    assert [(c.name, c.arguments, c.result, c.is_error) for c in calls] == [
        ("f", "{\"x\": 1", "done", False), ("g", {"y": 2}, "error: no such file", True)]


_names = st.text(alphabet="abcdefgh_", min_size=1, max_size=8)


@st.composite
def openai_conversations(draw):
    msgs, expected = [], []
    for turn in range(draw(st.integers(1, 3))):
        msgs.append({"role": "user", "content": draw(st.text(min_size=1, max_size=30))})
        calls = draw(st.lists(st.tuples(_names, st.booleans()), max_size=4))
        if calls:
            ids = [f"c{turn}_{i}" for i in range(len(calls))]
            msgs.append({"role": "assistant", "tool_calls": [
                {"id": i, "type": "function", "function": {"name": n, "arguments": "{}"}}
                for i, (n, _) in zip(ids, calls)]})
            order = draw(st.permutations(range(len(calls))))
            for k in order:
                msgs.append({"role": "tool", "tool_call_id": ids[k], "content": "r", "is_error": calls[k][1]})
            expected.extend(calls)
    return msgs, expected


@settings(max_examples=60, deadline=None)
@given(openai_conversations())
def test_results_are_matched_to_their_calls_whatever_their_order(case):
    msgs, expected = case
    conv = serialize_conversation(msgs)
    calls = [c for t in conv.turns for c in t.tool_calls]
    assert [(c.name, c.is_error) for c in calls] == expected
    assert conv.tool_sequence == [n for n, _ in expected]
    assert conv.has_errors == any(e for _, e in expected)
    assert all(c.result == "r" for c in calls)
    assert len(parse_messages(msgs)) == len(msgs)


@pytest.mark.parametrize("name", ["openai_session.json", "anthropic_session.json"])
def test_ingest_accepts_both_formats_with_tool_calls(make_db, name, now):
    db = make_db()
    messages = _load(name)
    messages[1] = {**messages[1], "date": "2024-05-02"}
    ids = db.ingest(messages, now=now)
    assert ids
    text = "\n".join(db.get(i).content for i in ids)
    assert "no argparse or click" in text
    assert "[tool call read_file]" in text and "README.md" in text  # the call and its arguments
    assert "[run_tests error]" in text
    hits = db.recall("which tool failed with a NameError?", top_k=3)
    assert any("NameError" in h.node.content for h in hits)
    ctx = db.recall_context("NameError", max_tokens=200)
    assert "NameError" in ctx.text
    assert db.ingest(messages, now=now) == ids  # deterministic, stored once


def test_ingest_names_the_message_it_cannot_parse(make_db):
    db = make_db()
    with pytest.raises(ValidationError, match=r"message 1: content\[0\]\.type 'video'"):
        db.ingest([{"role": "user", "content": "x"}, {"role": "assistant", "content": [{"type": "video"}]}])
    assert len(db) == 0


@pytest.mark.parametrize("messages, where", [
    ([{"role": "assistant", "content": [{"type": ["text"], "text": "x"}]}], "message 0: content[0].type ['text']"),
    ([{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": [{"type": {"t": 1}}]}]}],
     "message 1: content[0].content[0].type {'t': 1}"),
])
def test_a_block_type_that_is_not_a_string_is_named(messages, where):
    # A list or a mapping as a block's type (JSON a client built wrong) raised a bare
    # TypeError ("unhashable type") from the lookup of the placeholder blocks.
    with pytest.raises(ValidationError) as err:
        serialize_conversation(messages)
    assert where in err.value.message and err.value.hint


def test_arguments_nested_too_deep_for_json_are_kept_as_text():
    # json.loads / json.dumps raise RecursionError (not ValueError) past Python's recursion
    # limit: a model's runaway "[[[[..." arguments, or a deeply nested input, escaped as a
    # bare RecursionError instead of being kept raw like other broken JSON
    deep = "[" * 100_000
    conv = serialize_conversation([{"role": "assistant", "content": None,
                                    "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": deep}}]}])
    assert conv.turns[0].tool_calls[0].arguments == deep
    nested: dict = {}
    inner = nested
    for _ in range(5000):
        inner["a"] = {}
        inner = inner["a"]
    conv = serialize_conversation([{"role": "assistant",
                                    "content": [{"type": "tool_use", "id": "a", "name": "f", "input": nested}]}])
    assert conv.tool_sequence == ["f"] and "[tool call f] <dict nested too deep to show>" in conv.text
