"""Before/after-task hooks: the cross-session scenario, the relevance floor, fact formation
(provenance, deduplication, environment noise, a user extractor) and the deterministic extractor."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import engramdb
from engramdb.agent import MemoryHooks, extract_facts, serialize_conversation
from engramdb.agent.hooks import HEADER
from engramdb.agent.text import content_words, has_noise, scrub
from engramdb.errors import ValidationError
from engramdb.records import MAX_CONTENT_BYTES

from conftest import PASSPHRASE

ROOT = Path(__file__).resolve().parent.parent

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "agent"
SAMPLE = Path(engramdb.__file__).parent / "data" / "sample_memories.txt"


def _session1() -> list:
    return json.loads((FIXTURES / "session1_task_manager.json").read_text(encoding="utf-8"))


def _other_memories(db, now) -> None:
    """What an agent's file holds besides session 1: the bundled sample memories. (In a file
    holding nothing but the three facts of session 1, every word of the task is in every memory,
    so none of them is informative to BM25 and relevance stays near 0; see spec/agent.md 2.1.)"""
    db.add_many([line for line in SAMPLE.read_text(encoding="utf-8").splitlines() if line.strip()], now=now)


def test_the_cross_session_scenario(make_db, now):
    db = make_db("agent.engram")
    _other_memories(db, now)
    ids = MemoryHooks(db).after_task(_session1(), outcome="success", session="session-1", now=now)
    assert 1 <= len(ids) <= 3
    db.close()

    db = make_db("agent.engram")  # session 2: a new process opens the same file
    hooks = MemoryHooks(db)
    block = hooks.before_task("build a CLI bookmark manager with tags and HTML export")
    assert block.startswith(HEADER + "\n1. ")
    assert "only the standard library" in block and "no argparse or click" in block
    assert ".tasks.json" in block and "id, title, done, created_at" in block
    for noise in ("/home/alice", "/tmp/", "devbox"):
        assert noise not in block
    unrelated = hooks.before_task("refactor this messy module")
    assert unrelated == ""
    for fact_id in ids:
        assert db.get(fact_id).content not in unrelated


def test_facts_carry_provenance_and_are_not_stored_twice(make_db, now):
    db = make_db()
    hooks = MemoryHooks(db)
    ids = hooks.after_task(_session1(), outcome="success", session="s1", now=now)
    node = db.get(ids[0])
    provenance = node.metadata["agent"]
    assert provenance["session"] == "s1" and provenance["at"] == now and provenance["outcome"] == "success"
    assert provenance["tool_sequence"] == ["bash", "write_file", "write_file", "bash", "edit_file", "bash"]
    assert provenance["had_errors"] is True
    assert {"agent", "fact"} <= set(node.tags) and node.created_at == now
    assert hooks.after_task(_session1(), outcome="success", session="s2", now=now + 1) == []  # deduplicated
    # a near-duplicate worded differently is recognised too
    reworded = [{"role": "user", "content": "Build a CLI task manager in Python. Use only the standard library: "
                                            "explicitly no argparse or click, parse sys.argv yourself, please."}]
    assert hooks.after_task(reworded, now=now + 2) == []
    for i in ids:
        assert not has_noise(db.get(i).content)


def test_the_trajectory_goes_to_the_procedural_graph_with_an_outcome(make_db, now):
    db = make_db()
    hooks = MemoryHooks(db)
    hooks.after_task(_session1(), now=now)
    assert hooks.graph.trajectories() == []
    hooks.after_task(_session1(), outcome="failure", now=now)
    assert [t.outcome for t in hooks.graph.trajectories()] == ["failure"]
    with pytest.raises(ValidationError, match="outcome"):
        hooks.after_task(_session1(), outcome="meh")


def test_a_retried_after_task_records_its_trajectory_once(make_db, now):
    # a caller retrying after_task (a timeout, an MCP client resending) recorded the trajectory
    # again: every edge it showed counted twice
    db = make_db()
    hooks = MemoryHooks(db)
    hooks.after_task(_session1(), outcome="success", now=now)
    rows = sorted(map(repr, db.procedure_rows()))
    assert hooks.after_task(_session1(), outcome="success", now=now + 5) == []
    assert sorted(map(repr, db.procedure_rows())) == rows
    assert [e.success for e in hooks.graph.edges() if e.src == "start"] == [1]
    # another session, or another outcome, is another trajectory
    hooks.after_task(_session1(), outcome="success", session="again", now=now + 6)
    hooks.after_task(_session1(), outcome="failure", now=now + 7)
    assert [t.outcome for t in hooks.graph.trajectories()] == ["success", "success", "failure"]
    assert [(e.success, e.failure) for e in hooks.graph.edges() if e.src == "start"] == [(2, 1)]


def test_before_task_includes_the_procedure_for_similar_tasks(make_db, now):
    db = make_db()
    hooks = MemoryHooks(db)
    hooks.after_task(_session1(), outcome="success", now=now)
    block = hooks.before_task("build a CLI task manager in Python with due dates")
    assert "## Procedure" in block and "1. bash\n2. write_file" in block
    assert MemoryHooks(db, procedures=False).before_task("build a CLI task manager with due dates").count(
        "## Procedure") == 0


def test_a_user_extractor_is_used_and_checked(make_db, now):
    db = make_db()
    seen = []

    def extractor(text):
        seen.append(text)
        return ["The user keeps notes in /home/alice/notes.md and wants Markdown output", "  ", "Prefers tabs"]

    ids = MemoryHooks(db, extractor=extractor).after_task(_session1(), now=now)
    assert "[tool call write_file]" in seen[0]
    assert [db.get(i).content for i in ids] == ["The user keeps notes in and wants Markdown output", "Prefers tabs"]
    with pytest.raises(ValidationError, match="must return a list"):
        MemoryHooks(db, extractor=lambda text: "one string").after_task(_session1(), now=now)
    with pytest.raises(ValidationError, match="each fact must be a string"):
        MemoryHooks(db, extractor=lambda text: [1]).after_task(_session1(), now=now)


def test_the_relevance_floor_is_checked(make_db):
    db = make_db()
    with pytest.raises(ValidationError):
        MemoryHooks(db, min_relevance=1.5)
    assert MemoryHooks(db).before_task("") == ""
    with pytest.raises(ValidationError):
        MemoryHooks(db).before_task(None)


def test_the_deterministic_extractor_finds_the_four_kinds():
    conv = serialize_conversation(_session1())
    facts = extract_facts(conv)
    assert [f.kind for f in facts] == ["preference", "storage", "approach"]
    assert "no argparse or click" in facts[0].text and "ANSI" in facts[0].text
    assert ".tasks.json holds records with the fields id, title, done, created_at" in facts[1].text
    assert "unittest" in facts[2].text
    assert all("(from: build a CLI task manager in Python)" in f.text for f in facts)
    decided = serialize_conversation([{"role": "user", "content": "Write a blog post about Rust."},
                                      {"role": "assistant", "content": "We decided to use Hugo for the site."}])
    assert [f.kind for f in extract_facts(decided)] == ["preference", "approach"]
    bare = serialize_conversation([{"role": "user", "content": "Summarise the meeting notes."}])
    assert [(f.kind, f.text) for f in extract_facts(bare, outcome="success")] == [
        ("task", "Task (success): summarise the meeting notes.")]


@pytest.mark.parametrize("text, clean", [
    ("saved to /tmp/tmpab12cd/out.json ok", "saved to ok"),
    ("alice@devbox:~/src$ make", "make"),
    ("served on 10.0.0.12:8080 and localhost:3000", "served on and"),
    ("see C:\\Users\\bob\\notes.txt", "see"),
    ("keep .tasks.json and tasks.py", "keep .tasks.json and tasks.py"),
])
def test_environment_noise_is_scrubbed(text, clean):
    assert scrub(text) == clean


def test_a_fact_stored_meanwhile_by_another_process_is_skipped(make_db, now, monkeypatch):
    db = make_db()
    hooks = MemoryHooks(db)
    monkeypatch.setattr(hooks, "_is_duplicate", lambda text: False)
    first = hooks.after_task(_session1(), now=now)
    real_contains = type(db).__contains__
    monkeypatch.setattr(type(db), "__contains__", lambda self, id: False)  # the check ran before the other write
    assert hooks.after_task(_session1(), now=now) == []
    monkeypatch.setattr(type(db), "__contains__", real_contains)
    assert sorted(first) == sorted(i for i in db.ids() if i.startswith("fact-"))


def test_a_transcript_with_a_lone_surrogate_is_stored_whole_or_not_at_all(make_db, now):
    # JSON decoders turn a cut emoji ("\ud83d" with its pair lost) into a lone surrogate, which
    # the file cannot encode. after_task used to store the first facts, then raise on the one
    # that carried it (and never record the trajectory): now every fact and the task keep it
    # as U+FFFD, and the whole call goes through.
    db = make_db()
    messages = [{"role": "user", "content": "Write a csv parser. Use only the standard library. Store it in "
                                            "data.json with fields name, age and city \ud83d."},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": "c1", "function": {"name": "bash\udc00", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "ok"},
                {"role": "assistant", "content": "We decided to use pytest \ud83d."}]
    hooks = MemoryHooks(db)
    ids = hooks.after_task(messages, outcome="success", now=now)
    assert len(ids) == 3
    assert any("pytest \ufffd" in db.get(i).content for i in ids)
    assert db.get(ids[0]).metadata["agent"]["tool_sequence"] == ["bash\ufffd"]
    assert [t.tools for t in hooks.graph.trajectories()] == [("bash\ufffd",)]
    extracted = MemoryHooks(db, extractor=lambda text: ["first fact here", "second \udc80 fact"])
    assert [db.get(i).content for i in extracted.after_task([{"role": "user", "content": "x"}], now=now)] == [
        "first fact here", "second \ufffd fact"]


def test_an_extractor_returning_a_mapping_is_refused(make_db, now):
    # json.loads of a model's {"facts": [...]} reply is a dict; iterating it gave its keys, and
    # the fact "facts" was stored.
    db = make_db()
    hooks = MemoryHooks(db, extractor=lambda text: {"facts": ["The user wants tabs"]})
    with pytest.raises(ValidationError, match="must return a list"):
        hooks.after_task([{"role": "user", "content": "Format the code."}], now=now)
    assert len(db) == 0


def test_tags_given_as_one_string_are_refused(make_db, now):
    # tags="project-x" was split into the one-letter tags p, r, o, ...
    db = make_db()
    with pytest.raises(ValidationError, match="tags"):
        MemoryHooks(db, tags="project-x")
    with pytest.raises(ValidationError, match="tags"):
        MemoryHooks(db, tags=["ok", 5])
    assert MemoryHooks(db, tags=("project-x",)).tags == ["project-x"]


@pytest.mark.parametrize("kwargs", [{"min_relevance": "0.2"}, {"top_k": "5"}, {"top_k": True},
                                    {"min_relevance": None},
                                    # a non-callable extractor or summarizer raised a bare
                                    # TypeError from after_task, not here
                                    {"extractor": 5}, {"summarizer": "summarize"}])
def test_hooks_arguments_of_the_wrong_type_are_validation_errors(make_db, kwargs):
    with pytest.raises(ValidationError):
        MemoryHooks(make_db(), **kwargs)


def test_a_session_that_is_not_a_string_is_refused(make_db, now):
    # session=5 was stored as the number 5 in every fact's provenance
    hooks = MemoryHooks(make_db())
    for session in (5, ["a"], b"s1"):
        with pytest.raises(ValidationError, match="session"):
            hooks.after_task(_session1(), session=session, now=now)
    assert hooks.after_task(_session1(), session="s1", now=now)


def test_facts_and_tasks_in_other_scripts_are_compared_by_their_words(make_db, now):
    # content_words kept only ASCII letters: a Cyrillic (Greek, CJK ...) fact had no words,
    # so its reworded twin was never a duplicate, a task never matched a recorded one, and
    # "café" was the word "caf".
    assert content_words("Écrire un analyseur café") == {"écrire", "un", "analyseur", "café"}
    assert content_words("build the CLI with python3 and C++") == {"cli", "python3", "c++"}
    db = make_db()
    _other_memories(db, now)
    fact = "Пользователь хочет только стандартную библиотеку и табуляцию"
    first = MemoryHooks(db, extractor=lambda text: [fact]).after_task([{"role": "user", "content": "Парсер"}],
                                                                      outcome="success", now=now)
    assert len(first) == 1
    again = MemoryHooks(db, extractor=lambda text: [fact + ", всегда"])
    assert again.after_task([{"role": "user", "content": "Парсер"}], now=now) == []
    tools = [{"role": "user", "content": "Напиши парсер CSV для отчётов"},
             {"role": "assistant", "content": None,
              "tool_calls": [{"id": "c1", "function": {"name": "write_file", "arguments": "{}"}}]},
             {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    hooks = MemoryHooks(db)
    hooks.after_task(tools, outcome="success", now=now)
    assert "1. write_file" in hooks.graph.guidance_for("напиши парсер CSV для отчётов о продажах")


def _config_module(entries: int) -> list:
    code = "PATH = 'tasks.json'\nCONFIG = {\n" + "".join(f'    "key_{i}": "value {i}",\n' for i in range(entries)) + \
        '    "nested": {"a": 1},\n}\nSTORE = {"id": 1, "title": "x"}\n'
    return [{"role": "user", "content": "Write the config module."},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "a", "function": {
                "name": "write_file", "arguments": json.dumps({"path": "config.py", "content": code})}}]},
            {"role": "tool", "tool_call_id": "a", "content": "ok"}]


def _within_a_minute(work):
    """``work()``, or an AssertionError when it hangs (SIGALRM after 60 s; what is tested takes
    milliseconds, the old code hours)."""
    import signal

    if not hasattr(signal, "SIGALRM"):  # Windows: no alarm, the test still checks the result
        return work()

    def hang(signum, frame):
        raise AssertionError("did not finish within 60 s")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(60)
    try:
        return work()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_dict_literal_that_does_not_close_before_a_nested_one_is_read_in_linear_time():
    # The dict-literal regex repeated its entries with optional commas and a value that may
    # be empty, so a literal interrupted by a nested dict was backtracked exponentially: a
    # 20-entry config took seconds, 30 entries hours, and after_task hung.
    facts = _within_a_minute(lambda: extract_facts(serialize_conversation(_config_module(40))))
    # the first literal that closes with two keys is the one read, as before
    assert [f.text for f in facts if f.kind == "storage"] == [
        "Storage shape (from: write the config module): tasks.json holds records with the fields id, title."]


def test_a_long_run_of_blanks_is_scrubbed_in_linear_time():
    # each blank of a run rescanned the rest of it for a following punctuation mark:
    # quadratic, 20,000 blanks took 2 s, a megabyte of padding hours
    text = "x" + " " * 400_000 + "y ."
    assert _within_a_minute(lambda: scrub(text)) == "x y."


def test_a_field_list_followed_by_a_long_run_of_blanks_is_read_in_linear_time():
    # "\s*" before alternatives starting with "\s" split every run of blanks both ways:
    # quadratic (40,000 blanks: 5 s). scrub() collapses spaces and tabs, not other blanks.
    conv = serialize_conversation([{"role": "user",
                                    "content": "Save data.json with id, name" + "\u00a0" * 400_000 + "(x"}])
    facts = _within_a_minute(lambda: extract_facts(conv))
    storage = [f.text for f in facts if f.kind == "storage"]
    assert len(storage) == 1 and storage[0].endswith("data.json holds records with the fields id, name.")


def test_long_runs_of_name_characters_are_scrubbed_in_linear_time():
    # the user@host, host-name, machine-name and temp-dir patterns started again at every word
    # boundary of a run and read the run to its end: quadratic on a run with no "@", host
    # suffix or digit (20,000 chars took a second, these 400,000 minutes)
    runs = {"1." * 200_000: "." * 50_000, "ip-1" * 100_000: "", "ip-x" * 100_000: "ip-x" * 100_000,
            "tmp-" * 100_000: "tmp-" * 100_000, "a.b-" * 100_000: "a.b-" * 100_000,
            "localhostx-" * 40_000: "localhostx-" * 40_000, "localhost-" * 40_000: "-" * 40_000}
    for text, clean in runs.items():
        assert _within_a_minute(lambda text=text: scrub(text)) == clean
        assert _within_a_minute(lambda text=text: has_noise(text)) == (clean != text)


# The noise patterns as they were before they were made linear: the reference their linear
# forms must agree with, match for match.
_PLAIN_NOISE = [
    r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)*:[~/][^\s]*",
    r"(?<![\w.])(?:[A-Za-z]:\\|\\\\)[^\s\"'`,;)]+",
    r"(?<![\w.~])/(?:tmp|var|private|home|Users|root|opt|usr|etc|mnt|srv|proc|dev|run)(?:/[^\s\"'`,;)]*)?",
    r"(?<![\w/])~/[^\s\"'`,;)]*",
    r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b",
    r"(?i)\b(?:localhost|[\w-]+\.(?:local|lan|internal|localdomain))(?::\d+)?\b",
    r"(?i)\b(?:ip|host|node|worker|runner|pod)-[\w-]*\d[\w-]*\b",
    r"(?i)\b(?:tmp|temp)[\w.-]*\d[\w.-]*\b",
]
# pieces that make runs with and without "@", host suffixes and digits, localhost inside runs,
# ports, case-folded letters (ſ, the Kelvin sign), non-ASCII word characters and digits
_NOISE_PIECES = ["localhost", "LocalHost", ".lan", ".local", ".localdomain", ".internal", ".", ".", "-", "-", "+",
                 "@", "@", ":", ":", "~", "/", " ", " ", "\t", "1", "80", "7", "ip", "host", "node", "pod", "worker",
                 "tmp", "temp", "TMP", "x", "a", "é", "_", "ſ", "\u212a", "\\", "C:", "/tmp", "~/", "1.2.3.4",
                 "(", ")", ",", "\n", "\u0663", "user", "ab", "/home/u", "-1", "ip-", "tmp1", "a@b:", "@h:~", "x.lan"]


def test_the_linear_noise_patterns_remove_what_the_plain_ones_did():
    import random
    import re

    from engramdb.agent.text import _NOISE

    plain = [re.compile(p) for p in _PLAIN_NOISE]
    rng = random.Random(8)
    for _ in range(20_000):
        text = "".join(rng.choice(_NOISE_PIECES) for _ in range(rng.randint(0, 30)))
        for reference, remove in zip(plain, _NOISE):
            assert remove(text) == reference.sub("", text), (reference.pattern, text)
        expected, cleaned = text, text
        for reference, remove in zip(plain, _NOISE):
            expected, cleaned = reference.sub("", expected), remove(cleaned)
        assert cleaned == expected, text
        assert has_noise(text) == any(reference.search(text) for reference in plain), text


def test_a_sentence_naming_many_data_files_is_read_in_linear_time():
    # each file name searched the rest of its sentence for a field list: quadratic in the
    # number of names (80,000 chars of "a.json " took 11 s; a pasted file listing hung)
    listing = "Merge " + "a.json " * 60_000 + "into all.json with id, name and size."
    facts = _within_a_minute(lambda: extract_facts(serialize_conversation([{"role": "user", "content": listing}])))
    assert [f.text for f in facts if f.kind == "storage"] == [
        "Storage shape (from: merge " + "a.json " * 12 + "a.json): a.json holds records with the fields id, name, "
        "size. all.json holds records with the fields id, name, size."]


def test_each_data_file_gets_the_field_list_that_follows_it():
    # the field list search is shared by the file names before it: the same as searching
    # after each name (the reference below is the code before the change)
    import random
    import re

    from engramdb.agent.extract import _FIELD_LIST, _FILE, _storage

    def reference(text):
        shapes = {}
        for m in _FILE.finditer(text):
            name = m.group(1)
            if name.lower().endswith(".md"):
                continue
            found = _FIELD_LIST.search(text, m.end())
            fields = [] if not found else [f.strip("` ") for f in re.split(r",|\band\b|\(\w+\)", found.group(1))
                                           if f.strip("` ")]
            if fields or name not in shapes:
                shapes[name] = shapes.get(name) or fields
        return list(shapes.items())

    pieces = ["a.json", "b.csv", "notes.md", "with", "fields:", "id", "name", ",", "and", "(int)", "x", "keys", "c.db"]
    rng = random.Random(8)
    for _ in range(3000):
        text = " ".join(rng.choice(pieces) for _ in range(rng.randint(0, 25)))
        assert _storage(text, []) == reference(text), text


def test_the_patterns_compile_on_python_3_10():
    # requires-python is >=3.10, and atomic groups "(?>...)" and possessive quantifiers are
    # Python 3.11's: on 3.10 importing engramdb.agent raised re.error ("unknown extension ?>")
    import re

    root = Path(__file__).resolve().parent.parent
    assert 'requires-python = ">=3.10"' in (root / "pyproject.toml").read_text(encoding="utf-8")
    newer = re.compile(r"\(\?>|(?<![\\(])[*+?}]\+(?=[^\w\s]|$)")
    for path in sorted((root / "engramdb").rglob("*.py")):
        for pattern in re.findall(r"""r(?:"([^"\n]*)"|'([^'\n]*)')""", path.read_text(encoding="utf-8")):
            text = "".join(pattern)
            assert not newer.search(text), (path.name, text)


def test_before_task_holds_a_token_budget_with_each_memory_whole(make_db, now):
    # before_task had no budget: recall_context and inject_context hold one, and an agent's
    # prompt has a size; the memories are whole (spec/agent.md 2.1), so a budget leaves out
    # those that do not fit instead of cutting them
    db = make_db()
    _other_memories(db, now)
    hooks = MemoryHooks(db)
    hooks.after_task(_session1(), outcome="success", session="s1", now=now)
    db.remember("The CLI task manager stores each task with a title, due dates and the date it was added; "
                "overdue tasks come first when the manager lists them, then by due date", now=now)
    db.remember("Task manager: due dates in ISO format", now=now)
    task = "build a CLI task manager in Python with due dates"
    full = hooks.before_task(task)
    assert hooks.before_task(task, max_tokens=None) == full == hooks.before_task(task, max_tokens=10**6)
    memories, procedure = full.split("\n\n", 1) if "\n\n## Procedure" in full else (full, "")
    whole = [line.split(". ", 1)[1] for line in memories.splitlines()[1:]]
    assert len(whole) >= 3 and procedure.startswith("## Procedure")
    seen_skip = False
    for counter in (engramdb.estimate_tokens, len):
        for budget in range(counter(full) + 2):
            text = hooks.before_task(task, max_tokens=budget, count_tokens=counter)
            assert counter(text) <= budget
            if not text:
                continue
            head, _, tail = text.partition("\n\n")
            if head.startswith("## Procedure"):
                head, tail = "", text
            assert tail in ("", procedure)  # the procedure block is whole or left out
            lines = head.splitlines()[1:] if head else []
            assert [line.split(". ", 1)[0] for line in lines] == [str(n) for n in range(1, len(lines) + 1)]
            kept = [line.split(". ", 1)[1] for line in lines]
            assert all(m in whole for m in kept)  # every memory whole, never cut
            assert kept == sorted(kept, key=whole.index)  # best first
            seen_skip |= kept != whole[:len(kept)]  # a later, shorter memory in after one that did not fit
    assert seen_skip
    assert hooks.before_task(task, max_tokens=0) == ""
    for bad in (-1, 1.5, "100", True):
        with pytest.raises(ValidationError, match="max_tokens"):
            hooks.before_task(task, max_tokens=bad)
    with pytest.raises(ValidationError, match="count_tokens"):
        hooks.before_task(task, max_tokens=100, count_tokens=lambda s: -1)


@pytest.mark.parametrize("tags", [[""], ["agent", " "], ("\t",)])
def test_blank_tags_are_refused_when_the_hooks_are_made(tmp_engram, tags):
    # they were taken, and every after_task that formed a fact then failed on its write
    with pytest.raises(ValidationError, match="empty or blank") as err:
        MemoryHooks(tmp_engram, tags=tags)
    assert "leave the empty tag out" in err.value.hint
    assert MemoryHooks(tmp_engram, tags=[]).tags == []


def test_an_extractor_fact_too_long_for_a_memory_is_refused_before_any_fact_is_written(make_db, now):
    # the first fact was stored, then the second's write raised "content is longer than ...",
    # (with the hint about engramdb.Node) and the trajectory was not recorded: half a task
    db = make_db()
    hooks = MemoryHooks(db, extractor=lambda text: ["The user prefers tabs", "x" * (MAX_CONTENT_BYTES + 1)])
    with pytest.raises(ValidationError, match="the extractor returned a fact of 16777217 characters"):
        hooks.after_task(_session1(), outcome="success", now=now)
    assert list(db.scan()) == [] and hooks.graph is not None and hooks.graph.trajectories() == []


@pytest.mark.parametrize("extractor", [
    lambda text: 1 / 0,
    lambda text: (fact for fact in ["The user prefers tabs", 1 / 0]),  # raising while iterated
])
def test_an_extractor_that_raises_is_a_validation_error_and_nothing_is_written(make_db, now, extractor):
    # the model's own exception (a ZeroDivisionError here, a rate limit or timeout from an API)
    # left after_task raw: a caller catching EngramError around its hooks did not catch it
    db = make_db()
    hooks = MemoryHooks(db, extractor=extractor)
    with pytest.raises(ValidationError, match="the extractor raised ZeroDivisionError") as info:
        hooks.after_task(_session1(), outcome="success", now=now)
    assert isinstance(info.value.__cause__, ZeroDivisionError) and "nothing of what it was called for was written" in info.value.hint
    assert list(db.scan()) == [] and hooks.graph is not None and hooks.graph.trajectories() == []


def test_an_extractor_yielding_without_end_gives_its_first_three_facts(make_db, now):
    # every item was read before the first three were taken: a generator that does not end
    # (a model's stream read line by line) hung after_task
    db = make_db()

    def endless(text):
        yield from ["Prefers tabs over spaces", "   ", "Keeps notes in Markdown", "Deploys on Fridays"]
        raise AssertionError("read past the third fact")

    ids = MemoryHooks(db, extractor=endless).after_task(_session1(), now=now)
    assert [db.get(i).content for i in ids] == ["Prefers tabs over spaces", "Keeps notes in Markdown",
                                                 "Deploys on Fridays"]


def test_hooks_shared_by_threads_do_not_store_one_fact_twice(make_db, now):
    # `engramdb mcp` runs each tool call in a worker thread (mcp 2.x), all on one MemoryHooks:
    # two after_task calls at once both checked for a duplicate before either stored its fact,
    # so parallel calls saying the same thing stored it once per call (10 calls: 10 facts)
    db = make_db()
    first = [{"role": "user", "content": "Task one: always use tabs. Never use spaces."}]
    second = [{"role": "user", "content": "Task two: always use tabs. Never use spaces."}]
    other: list = []

    class Racing:
        """The store as the first call sees it: while it stores its fact, the second call runs."""

        def __getattr__(self, name):
            return getattr(db, name)

        def __contains__(self, id):
            return id in db

        def remember(self, text, **fields):
            if not other:
                other.append(threading.Thread(target=lambda: other.append(hooks.after_task(second, now=now))))
                other[0].start()
                other[0].join(timeout=3)  # done by then, unless it waits for this call to finish
            return db.remember(text, **fields)

    hooks = MemoryHooks(Racing(), procedures=False, sleep_threshold=None)
    stored = hooks.after_task(first, now=now)
    other[0].join()
    assert len(stored) == 1 and other[1] == []  # the second call found the first one's fact
    assert [n.content for n in db.scan()] == [db.get(stored[0]).content]


def test_a_failing_sleep_says_that_the_tasks_facts_were_stored(make_db, now):
    # the summarizer's failure left after_task saying only that (and, since session 11, "nothing
    # was written"), though this task's fact and trajectory were stored: the caller took the
    # task as not done and never learnt the new fact's id
    db = make_db()

    def summarizer(texts):
        raise TimeoutError("the model did not answer")

    hooks = MemoryHooks(db, summarizer=summarizer, sleep_threshold=2)
    hooks.after_task([{"role": "user", "content": "Build the invoice tool. Never use global variables."}],
                     outcome="success", now=now)
    with pytest.raises(ValidationError, match="the summarizer raised TimeoutError") as info:
        hooks.after_task([{"role": "user", "content": "Port the parser to Rust. Always run clippy."}],
                         outcome="success", now=now + 1)
    facts = [n.id for n in db.scan()]
    assert len(facts) == 2 and hooks.graph is not None and len(hooks.graph.trajectories()) == 2
    assert info.value.message.startswith(f"after_task stored this task's facts ({facts[1]}) and its trajectory, "
                                         "then sleep consolidation failed: ")
    assert isinstance(info.value.__cause__, TimeoutError) and str(info.value).startswith(info.value.message)


def test_two_processes_saying_the_same_at_once_store_it_once(make_db, now):
    # two agents (processes) on one file finishing at once: each checked for a duplicate
    # before the other stored its fact, so both stored it
    db = make_db()
    second = """
import json, sys
import engramdb
from engramdb.agent import MemoryHooks
db = engramdb.open(sys.argv[1], passphrase=sys.argv[2])
hooks = MemoryHooks(db, procedures=False, sleep_threshold=None)
print("ready", flush=True)
print(json.dumps(hooks.after_task([{"role": "user", "content": "Task two: always use tabs. Never use spaces."}],
                                  now=float(sys.argv[3]))), flush=True)
"""
    other: list = []

    class Racing:
        """The store as the first process sees it: while it stores its fact, the second runs."""

        def __getattr__(self, name):
            return getattr(db, name)

        def __contains__(self, id):
            return id in db

        def remember(self, text, **fields):
            if not other:
                env = {**os.environ, "PYTHONPATH": str(ROOT)}
                other.append(subprocess.Popen([sys.executable, "-c", second, db.path, PASSPHRASE, str(now)], env=env,
                                              stdout=subprocess.PIPE, text=True))
                assert other[0].stdout.readline() == "ready\n"
                try:  # done by then (a few reads and a write), unless it waits for this call's transaction
                    other[0].wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            return db.remember(text, **fields)

    hooks = MemoryHooks(Racing(), procedures=False, sleep_threshold=None)
    stored = hooks.after_task([{"role": "user", "content": "Task one: always use tabs. Never use spaces."}], now=now)
    out, _ = other[0].communicate(timeout=60)
    assert other[0].returncode == 0 and json.loads(out) == [] and len(stored) == 1
    assert [n.id for n in db.scan()] == stored


def test_a_thread_skips_the_sleep_another_thread_of_the_hooks_is_running(make_db, now):
    # a second after_task at the threshold while the first one's summarizer (a model call)
    # ran planned a sleep of its own: its groups were stale by the time it wrote them, and the
    # model was asked for nothing
    db = make_db()
    for k in range(4):
        db.remember(f"The garden note number {k} says to water the basil on day {k}.", tags=["agent"], now=now)
    callers: list = []
    second: list = []

    def summarizer(texts):
        callers.append(threading.current_thread().name)
        if not second:
            task = [{"role": "user", "content": "Ship the mobile app. Never ship on a Friday."}]
            second.append(threading.Thread(target=lambda: second.append(hooks.after_task(task, now=now + 1)),
                                           name="second"))
            second[0].start()
            second[0].join(timeout=20)  # done by then, unless it waits for this sleep
        return "Summary: " + texts[0]

    hooks = MemoryHooks(db, summarizer=summarizer, sleep_threshold=4)
    first = hooks.after_task([{"role": "user", "content": "Plan the garden. Always water in the morning."}],
                             now=now + 2)
    assert not second[0].is_alive() and len(second[1]) == 1 and len(first) == 1
    assert callers and "second" not in callers  # the second call left the sleep to the first


def test_after_task_checks_for_duplicates_outside_its_write_transaction(make_db, now):
    # since 49a7451 the duplicate check's recalls ran inside after_task's write transaction, where
    # a recall reads every index uncached (a vector space's whole matrix decoded from its blocks:
    # 20-50 ms a recall instead of 3 at 20k memories) while holding the writer lock
    db = make_db()
    inside: list[bool] = []

    class Watching:
        def __getattr__(self, name):
            return getattr(db, name)

        def __contains__(self, id):
            return id in db

        def recall(self, *args, **kwargs):
            inside.append(getattr(db._store._local, "txn", None) is not None)
            return db.recall(*args, **kwargs)

    hooks = MemoryHooks(Watching(), procedures=False, sleep_threshold=None)
    ids = hooks.after_task(_session1(), now=now)
    assert len(ids) == 3 and inside and not any(inside)
    recalls = len(inside)
    assert hooks.after_task(_session1(), now=now) == [] and len(inside) == recalls  # stored by id: no recall
    # a fact in the same call that repeats an earlier one is still left out (checked against it)
    twice = MemoryHooks(Watching(), procedures=False, sleep_threshold=None,
                        extractor=lambda text: ["Deploys run on Fridays at noon.", "Deploys run on Fridays at noon!"])
    assert len(twice.after_task([{"role": "user", "content": "deploy"}], now=now)) == 1


def test_a_commit_between_the_duplicate_check_and_the_write_is_checked_again(make_db, now):
    # the check's answers stand only for the state they read: another writer's commit in
    # between (here: the same fact, stored under another id) makes after_task check inside
    db = make_db()
    fact = "The staging database is reset every Monday."
    hooks = MemoryHooks(db, procedures=False, sleep_threshold=None, extractor=lambda text: [fact])
    real = hooks._is_duplicate
    calls: list[bool] = []

    def checking(text):
        found = real(text)
        if not calls:  # after the first (outside) check: another process says the same
            db.remember(fact, id="other-process", now=now)
        calls.append(found)
        return found

    hooks._is_duplicate = checking  # type: ignore[method-assign]
    assert hooks.after_task([{"role": "user", "content": "reset staging"}], now=now) == []
    assert calls == [False, True]
    assert [n.id for n in db.scan()] == ["other-process"]


def test_one_call_s_facts_saying_the_same_are_stored_once_when_checked_inside(make_db, now):
    # When another commit came in between (or the AgentMemory does not say its last commit),
    # the duplicate check runs inside after_task's write transaction, whose recall does not
    # see the facts stored earlier in it (their index changes wait for its end): two facts of
    # one call saying the same thing were both stored.
    db = make_db()
    hooks = MemoryHooks(db, extractor=lambda text: ["Always use tabs for indentation in Python files.",
                                                    "Always use tabs for indentation in Python files!!"])
    hooks._last_commit = lambda: None  # the check inside the transaction
    ids = hooks.after_task([{"role": "user", "content": "Task: format the code."}], now=now)
    assert len(ids) == 1 and [n.content for n in db if "fact" in n.tags] == [
        "Always use tabs for indentation in Python files."]

