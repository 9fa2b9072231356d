"""A complete agent loop with engramdb as its memory, runnable without any model.

    ENGRAM_PASSPHRASE=demo-passphrase python tools/examples/agent_loop.py agent.engram

Two sessions of a small coding agent, each in its own handle (as two processes would be):

1. ``before_task`` puts the relevant memories into the system prompt (and the procedure
   that worked for a similar task, when one shares at least half of its words: these two
   tasks share fewer, so none is shown); the first session finds none.
2. The loop runs: the model answers in the OpenAI chat format, tool calls are executed in
   a scratch directory (``write_file``, ``run_tests`` really runs ``python -m unittest``),
   their results go back to the model.
3. ``after_task`` forms facts from the transcript (the user's stated preferences, the
   storage shape, the testing approach) and records the trajectory with its outcome.

The model is a stand-in callable (``scripted_model``): replace it with a call to your
model's API; everything else stays the same.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any
from collections.abc import Callable

import engramdb
from engramdb.agent import MemoryHooks

Model = Callable[[list[dict[str, Any]]], dict[str, Any]]

TASKS = [
    "Build a CLI task manager in Python. Use only the standard library: no argparse or click. "
    "Store the tasks in .tasks.json with id, title, done and created_at. Write the tests with unittest.",
    "Build a CLI bookmark manager with tags and HTML export.",
]

APP = '''import json, sys, time
PATH = "{store}"

def add(items, title):
    items.append({{"id": len(items) + 1, "title": title, "done": False, "created_at": time.time()}})
    return items
'''
TEST = '''import unittest
import app

class AppTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(app.add([], "x")[0]["id"], 1)
'''


def scripted_model(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A stand-in for an LLM: writes the app and its test, runs the tests, then reports."""
    calls = [m for m in messages if m["role"] == "assistant" and m.get("tool_calls")]
    system = messages[0]["content"] if messages[0]["role"] == "system" else ""
    store = ".bookmarks.json" if "bookmark" in messages[1]["content"].lower() else ".tasks.json"
    step = len(calls)
    if step == 0:
        return {"role": "assistant", "content": "Writing the app and its test.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "write_file", "arguments": json.dumps(
                {"path": "app.py", "content": APP.format(store=store)})}},
            {"id": "c2", "type": "function", "function": {"name": "write_file", "arguments": json.dumps(
                {"path": "test_app.py", "content": TEST})}}]}
    if step == 1:
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c3", "type": "function", "function": {"name": "run_tests", "arguments": json.dumps(
                {"command": "python -m unittest"})}}]}
    remembered = "; I kept to what I remember about you" if "## Relevant Memories" in system else ""
    return {"role": "assistant", "content": f"Done: app.py stores items in {store} and its tests pass{remembered}."}


def run_tool(workdir: Path, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
    """Execute one tool call in ``workdir``: (result text, failed?)."""
    if name == "write_file":
        (workdir / arguments["path"]).write_text(arguments["content"], encoding="utf-8")
        return f"wrote {len(arguments['content'])} characters to {arguments['path']}", False
    if name == "run_tests":
        done = subprocess.run([sys.executable, "-m", "unittest"], cwd=workdir, capture_output=True, text=True,
                              timeout=60, check=False)
        return (done.stderr or done.stdout)[-400:], done.returncode != 0
    return f"error: unknown tool {name}", True


def run_session(path: str, passphrase: str, task: str, model: Model) -> dict[str, Any]:
    """One session: recall, the tool loop, then fact formation. Returns what happened."""
    with engramdb.open(path, passphrase=passphrase) as db:
        hooks = MemoryHooks(db)
        memory = hooks.before_task(task)
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent.\n\n" + memory},
                                          {"role": "user", "content": task}]
        failed = False
        with tempfile.TemporaryDirectory() as scratch:
            for _ in range(10):  # a step budget, as every agent loop needs
                reply = model(messages)
                messages.append(reply)
                if not reply.get("tool_calls"):
                    break
                for call in reply["tool_calls"]:
                    result, error = run_tool(Path(scratch), call["function"]["name"],
                                             json.loads(call["function"]["arguments"]))
                    failed = error  # the last call decides
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": result,
                                     "is_error": error})
        outcome = "failure" if failed else "success"
        ids = hooks.after_task(messages, outcome=outcome)
        return {"memory": memory, "answer": messages[-1]["content"], "outcome": outcome,
                "facts": [db.get(i).content for i in ids]}


def main(path: str) -> None:
    passphrase = os.environ.get("ENGRAM_PASSPHRASE") or "demo-passphrase"
    with engramdb.open(path, passphrase=passphrase) as db:
        if len(db) == 0:  # an agent's file holds other memories too: the bundled sample stands in for them
            sample = resources.files("engramdb").joinpath("data/sample_memories.txt").read_text("utf-8")
            db.add_many(line for line in sample.splitlines() if line.strip())
    for n, task in enumerate(TASKS, 1):
        report = run_session(path, passphrase, task, scripted_model)
        print(f"== session {n}: {task}")
        print("memory given to the model:")
        print(report["memory"] or "  (nothing relevant)")
        print(f"outcome: {report['outcome']}; answer: {report['answer']}")
        print(f"new facts: {len(report['facts'])}")
        for fact in report["facts"]:
            print(f"  - {fact}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tools/examples/agent_loop.py FILE.engram")
    main(sys.argv[1])
