"""`engramdb recall` and `engramdb context`: output, --json, --explain, exit codes."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from engramdb.cli import cli

KDF = "t=1,m=8,p=1"


@pytest.fixture
def run():
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(cli, list(args), env={"ENGRAM_PASSPHRASE": "pw", "ENGRAM_TEST_WEAK_KDF": "1"},
                             catch_exceptions=False)

    return invoke


@pytest.fixture
def file(run, tmp_path):
    f = str(tmp_path / "r.engram")
    assert run("init", f, "--kdf", KDF).exit_code == 0
    assert run("add", f, "Alice moved to Berlin in 2023", "--id", "a1", "--tag", "people").exit_code == 0
    assert run("add", f, "Bob likes green apples", "--id", "b1").exit_code == 0
    return f


def test_recall_text_json_and_explain(run, file):
    out = run("recall", file, "where did Alice relocate?")
    assert out.exit_code == 0 and "Alice moved to Berlin" in out.output and "Bob" not in out.output
    hits = [json.loads(line) for line in run("recall", file, "alice apples", "--json").output.splitlines()]
    assert sorted(h["id"] for h in hits) == ["a1", "b1"]
    assert all("parts" not in h for h in hits)
    explained = json.loads(run("recall", file, "apples", "--json", "--explain").output.splitlines()[0])
    assert explained["id"] == "b1" and explained["parts"]["bm25_rank"] == 1.0
    assert "bm25=" in run("recall", file, "apples", "--explain").output
    assert run("recall", file, "apples", "--top-k", "0").output == ""
    assert [json.loads(x)["id"] for x in run("recall", file, "alice apples", "--json", "--tag", "people")
            .output.splitlines()] == ["a1"]


def test_context(run, file):
    data = json.loads(run("context", file, "alice", "--json").output)
    assert data["passages"][0]["ids"] == ["a1"] and data["tokens"] == data["passages"][0]["tokens"]
    heading, text = run("context", file, "alice").output.strip().split("\n")
    assert heading.startswith("### memory a1 (") and text == "Alice moved to Berlin in 2023"
    tight = json.loads(run("context", file, "alice", "--json", "--max-tokens", "11").output)
    # trimmed, not dropped: the words that fit, marked as cut
    assert tight["tokens"] <= 11 and tight["passages"][0]["text"] == "Alice moved to \u2026"
    assert json.loads(run("context", file, "alice", "--json", "--max-tokens", "0").output)["passages"] == []


def test_errors_exit_cleanly(run, file, tmp_path):
    assert run("recall", file, "x", "--top-k", "-1").exit_code == 2
    missing = run("recall", str(tmp_path / "missing.engram"), "x")
    assert missing.exit_code == 1 and "error:" in missing.output


def test_context_says_when_memories_match_but_none_fits_the_budget(tmp_path):
    """`context --max-tokens 5` on a query that matches printed "no memory matches": the
    memory matched, but not even its heading fits. The note says so, and what to do."""
    runner = CliRunner()
    env = {"ENGRAM_PASSPHRASE": "pw", "ENGRAM_TEST_WEAK_KDF": "1"}
    f = str(tmp_path / "r.engram")
    assert runner.invoke(cli, ["init", f, "--kdf", KDF], env=env).exit_code == 0
    assert runner.invoke(cli, ["add", f, "Alice moved to Berlin in 2023", "--id", "a1"], env=env).exit_code == 0
    tight = runner.invoke(cli, ["context", f, "alice", "--max-tokens", "5"], env=env)
    assert tight.exit_code == 0 and tight.stdout == ""
    assert "no memory matches" not in tight.stderr
    assert "1 memory matches" in tight.stderr and "--max-tokens 5" in tight.stderr
    none = runner.invoke(cli, ["context", f, "zebra", "--max-tokens", "5"], env=env)
    assert none.exit_code == 0 and "no memory matches" in none.stderr
