"""`engramdb agent before|after|consolidate|procedures` and the runnable agent loop example."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from engramdb import estimate_tokens
from engramdb.cli import cli

ROOT = Path(__file__).resolve().parents[1]
KDF = "t=1,m=8,p=1"
SESSION1 = ROOT / "tests" / "fixtures" / "agent" / "session1_task_manager.json"
SAMPLE = ROOT / "engramdb" / "data" / "sample_memories.txt"


@pytest.fixture
def run():
    runner = CliRunner()

    def invoke(*args: str):
        env = {"ENGRAM_PASSPHRASE": "pw", "ENGRAM_TEST_WEAK_KDF": "1"}
        return runner.invoke(cli, list(args), env=env, catch_exceptions=False)

    return invoke


def test_agent_commands(run, tmp_path):
    f = str(tmp_path / "a.engram")
    assert run("init", f, "--kdf", KDF).exit_code == 0
    for n, line in enumerate(x for x in SAMPLE.read_text().splitlines() if x.strip()):
        assert run("add", f, line, "--id", f"bg{n}").exit_code == 0  # other memories of the file
    after = run("agent", "after", f, str(SESSION1), "--outcome", "success", "--json")
    assert after.exit_code == 0, after.output
    facts = json.loads(after.output)
    assert 1 <= len(facts) <= 3 and any(".tasks.json" in x["content"] for x in facts)
    assert run("agent", "after", f, str(SESSION1)).output.strip() == "no new facts"

    before = run("agent", "before", f, "build a CLI bookmark manager with tags and HTML export")
    assert before.exit_code == 0 and before.output.startswith("## Relevant Memories\n1. ")
    assert "no argparse or click" in before.output
    block = before.output.rstrip("\n")
    small = run("agent", "before", f, "build a CLI bookmark manager with tags and HTML export", "--max-tokens",
                str(estimate_tokens(block) - 1), "--json")
    cut = json.loads(small.output)["block"]  # a memory left out whole, not the block cut
    memories = {line.split(". ", 1)[1] for line in block.splitlines()[1:]}
    assert cut.startswith("## Relevant Memories\n1. ") and estimate_tokens(cut) < estimate_tokens(block)
    assert all(line.split(". ", 1)[1] in memories for line in cut.splitlines()[1:])
    none = run("agent", "before", f, "build a CLI bookmark manager with tags and HTML export", "--max-tokens", "3")
    assert none.exit_code == 0 and none.stdout == ""  # a hook: nothing to put into the prompt
    assert f"nothing fits in --max-tokens 3: without a budget the block has {estimate_tokens(block)} tokens" in none.stderr
    quiet = run("agent", "before", f, "refactor this messy module", "--json")
    assert json.loads(quiet.output) == {"block": ""}

    graph = json.loads(run("agent", "procedures", f, "--json").output)
    assert graph["trajectories"] == 1 and graph["outcomes"] == {"success": 1}
    start = [e for e in graph["edges"] if e["src"] == "start"]
    assert [(e["dst"], e["relation"], e["success"]) for e in start] == [("bash", "leads_to", 1)]
    text = run("agent", "procedures", f, "--refine").output
    assert "1 trajectories success=1" in text and "refining needs 10" in text

    skipped = run("agent", "consolidate", f)
    assert skipped.exit_code == 0 and "sleep consolidation runs at 50" in skipped.output
    done = json.loads(run("agent", "consolidate", f, "--force", "--target", "2", "--json").output)
    assert done["archived"] == len(facts) and 1 <= len(done["cores"]) <= 2
    # the store's own memories are not the agent's: consolidation left them live (it took
    # every memory of the file until session 8); --all takes them
    assert all(not json.loads(line)["archived"] for line in run("list", f, "--json").output.splitlines()
               if json.loads(line)["id"].startswith("bg"))
    every = json.loads(run("agent", "consolidate", f, "--force", "--all", "--json").output)
    assert every["candidates"] == n + 1 and every["archived"] == n + 1
    assert run("agent", "consolidate", f, "--all", "--tag", "x").exit_code == 2


def test_agent_after_names_a_bad_transcript(run, tmp_path):
    f = str(tmp_path / "a.engram")
    assert run("init", f, "--kdf", KDF).exit_code == 0
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps([{"role": "user", "content": "x"}, {"role": "assistant", "content": [{"type": "?"}]}]))
    result = CliRunner().invoke(cli, ["agent", "after", f, str(bad)], env={"ENGRAM_PASSPHRASE": "pw"})
    assert result.exit_code == 1 and "message 1: content[0].type" in result.output
    bad.write_text("{not json")
    result = CliRunner().invoke(cli, ["agent", "after", f, str(bad)], env={"ENGRAM_PASSPHRASE": "pw"})
    assert result.exit_code == 1 and "neither JSON nor JSON Lines" in result.output


def test_agent_after_reads_a_transcript_with_a_byte_order_mark(run, tmp_path):
    # Windows tools (PowerShell 5's Out-File, Notepad) write UTF-8 with a BOM: the transcript
    # was refused as "neither JSON nor JSON Lines: Unexpected UTF-8 BOM"
    f = str(tmp_path / "a.engram")
    assert run("init", f, "--kdf", KDF).exit_code == 0
    for name, text in (("t.json", SESSION1.read_text(encoding="utf-8")),
                       ("t.jsonl", '{"role": "user", "content": "I always indent with tabs."}\n')):
        path = tmp_path / name
        path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
        result = run("agent", "after", f, str(path), "--json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)


def test_the_agent_loop_example_runs(tmp_path):
    env = {**os.environ, "ENGRAM_PASSPHRASE": "demo-passphrase", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "examples" / "agent_loop.py"),
                          str(tmp_path / "agent.engram")], env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.split("== session 2")
    assert "(nothing relevant)" in first and "outcome: success" in first
    assert "Preferences (from: build a CLI task manager in Python)" in first
    assert "## Relevant Memories" in second and "no argparse or click" in second
    assert "I kept to what I remember" in second


def test_mcp_without_the_sdk_says_how_to_install_it(run, tmp_path, monkeypatch):
    from engramdb import mcp_server

    real = mcp_server.importlib.import_module

    def no_mcp(name, *args):
        if name.startswith("mcp"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real(name, *args)

    monkeypatch.setattr(mcp_server.importlib, "import_module", no_mcp)
    result = CliRunner().invoke(cli, ["mcp", str(tmp_path / "missing.engram")], env={"ENGRAM_PASSPHRASE": "pw"})
    assert result.exit_code == 1 and "pip install 'engramdb[mcp]'" in result.output
    assert "not installed" in result.output
    assert not (tmp_path / "missing.engram").exists()  # reported before the file is touched


def test_mcp_1_2_whose_fastmcp_takes_no_instructions_is_named_too_old(monkeypatch):
    # found by rev10: mcp 1.2 has mcp.server.fastmcp, but its FastMCP(name, **settings) puts
    # `instructions` into settings that ignore unknown fields: the server ran without them and
    # nothing said the installed mcp was older than the extra's mcp>=1.3
    import types

    from engramdb import mcp_server
    from engramdb.errors import ConfigMismatchError

    class FastMCP:  # mcp 1.2.0's signature
        def __init__(self, name: str | None = None, **settings: object) -> None:
            self.settings = settings

    modules = {"mcp": types.ModuleType("mcp"),
               "mcp.server.fastmcp": types.SimpleNamespace(FastMCP=FastMCP),
               "mcp.server.fastmcp.exceptions": types.SimpleNamespace(ToolError=Exception)}

    def fake(name, *args):
        if name in modules:
            return modules[name]
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    monkeypatch.setattr(mcp_server.importlib, "import_module", fake)
    with pytest.raises(ConfigMismatchError) as err:
        mcp_server._sdk()
    assert "too old" in str(err.value) and "pip install -U" in (err.value.hint or "")
