"""The MCP round trip: `engramdb mcp FILE` started as a subprocess and driven by the official
SDK's stdio client (list tools, remember, recall, forget, the hooks, stats, a tool error)."""
from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

import engramdb
from conftest import PASSPHRASE, TEST_KDF

mcp = pytest.importorskip("mcp", reason="the MCP SDK (engramdb[mcp]) is not installed")
from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402

from engramdb.mcp_server import TOOLS  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _field(obj, snake: str, camel: str):
    """mcp 2.x names fields in snake_case, mcp 1.x in camelCase."""
    return getattr(obj, snake) if hasattr(obj, snake) else getattr(obj, camel)


def _payload(result):
    assert not _field(result, "is_error", "isError"), result.content
    text = result.content[0].text
    try:
        return json.loads(text)
    except ValueError:
        return text


async def _session(path: Path, script):
    env = {**os.environ, "ENGRAM_PASSPHRASE": PASSPHRASE, "PYTHONPATH": str(ROOT)}
    params = StdioServerParameters(command=sys.executable, args=["-m", "engramdb", "mcp", str(path)], env=env,
                                   cwd=str(ROOT))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        return await script(session)


def test_mcp_round_trip(tmp_path):
    path = tmp_path / "agent.engram"
    engramdb.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF).close()

    async def script(session):
        tools = (await session.list_tools()).tools
        assert sorted(t.name for t in tools) == sorted(TOOLS)
        for t in tools:
            schema = _field(t, "input_schema", "inputSchema")
            assert schema["type"] == "object" and t.description
            assert "passphrase" not in json.dumps(schema)
        schemas = {t.name: _field(t, "input_schema", "inputSchema") for t in tools}
        assert schemas["remember"]["required"] == ["text"] and schemas["recall"]["required"] == ["query"]

        first = _payload(await session.call_tool("remember", {"text": "Alice moved to Berlin in 2023",
                                                              "tags": ["people"]}))
        second = _payload(await session.call_tool("remember", {"text": "The deploy runs on Fridays"}))
        hits = _payload(await session.call_tool("recall", {"query": "where does alice live?", "top_k": 3}))["hits"]
        assert hits[0]["id"] == first["id"] and hits[0]["tags"] == ["people"]
        assert 0.0 < hits[0]["relevance"] <= 1.0

        context = _payload(await session.call_tool("recall_context", {"query": "deploy", "max_tokens": 100}))
        assert "Fridays" in context

        receipt = _payload(await session.call_tool("forget", {"ids": [first["id"]]}))
        assert first["id"] in json.dumps(receipt)
        after = _payload(await session.call_tool("recall", {"query": "where does alice live?"}))["hits"]
        assert first["id"] not in [h["id"] for h in after]

        missing = await session.call_tool("forget", {"ids": ["no-such-id"]})
        assert _field(missing, "is_error", "isError")
        assert "no-such-id" in missing.content[0].text and "hint:" in missing.content[0].text
        bad = await session.call_tool("recall", {"query": "x", "top_k": 0})
        assert _field(bad, "is_error", "isError") and "top_k" in bad.content[0].text

        transcript = json.loads((ROOT / "tests" / "fixtures" / "agent" / "session1_task_manager.json").read_text())
        ids = _payload(await session.call_tool("after_task", {"messages": transcript, "outcome": "success"}))["ids"]
        assert 1 <= len(ids) <= 3
        block = _payload(await session.call_tool("before_task", {"task": "build a CLI task manager in Python"}))
        assert "## Procedure" in block
        unrelated = await session.call_tool("before_task", {"task": "plan a birthday party"})
        assert unrelated.content == [] or unrelated.content[0].text == ""
        stats = _payload(await session.call_tool("stats", {}))
        assert stats["memories"] == 1 + len(ids)
        return [second["id"], *ids]

    kept = asyncio.run(_session(path, script))
    with engramdb.open(path, passphrase=PASSPHRASE) as db:  # the server closed the file cleanly
        assert sorted(db.ids()) == sorted(kept)
        assert db.verify() == []


def test_mcp_needs_a_passphrase_from_the_environment(tmp_path):
    import subprocess

    path = tmp_path / "agent.engram"
    engramdb.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF).close()
    env = {k: v for k, v in os.environ.items() if k != "ENGRAM_PASSPHRASE"}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run([sys.executable, "-m", "engramdb", "mcp", str(path)], env=env, capture_output=True,
                            text=True, stdin=subprocess.DEVNULL, timeout=60, check=False)
    assert result.returncode == 1 and result.stdout == ""
    assert "no passphrase given" in result.stderr and "ENGRAM_PASSPHRASE" in result.stderr


def test_the_servers_own_argument_errors_say_what_to_pass(tmp_path):
    # They carried ValidationError's default hint, "help(engramdb.Node) for fields": Python
    # advice, about another object, for an MCP client.
    from engramdb.mcp_server import build_server

    db = engramdb.open(tmp_path / "agent.engram", passphrase=PASSPHRASE, kdf=TEST_KDF)
    server = build_server(db)

    async def failing(name, args):
        try:
            result = await server.call_tool(name, args)
        except Exception as exc:  # the SDK raises its ToolError in process
            return str(exc)
        assert _field(result, "is_error", "isError"), result
        return result.content[0].text

    for name, args, hint in [("recall", {"query": "x", "top_k": 0}, "top_k between 1 and 100"),
                             ("recall_context", {"query": "x", "max_tokens": 0}, "max_tokens between 1 and 100000"),
                             ("forget", {"ids": []}, "the ids that remember or recall returned"),
                             ("after_task", {"messages": [], "outcome": "done"}, "'success' or 'failure'")]:
        text = asyncio.run(failing(name, args))
        assert "hint: " in text and hint in text and "engramdb.Node" not in text, text
    # the library's own checks: their default hint named Python objects (help(engramdb.Node))
    for name, args, hint in [("remember", {"text": "x", "importance": float("nan")}, "importance (a number from 0"),
                             ("remember", {"text": "x", "tags": [" "]}, "leave the empty tag out")]:
        text = asyncio.run(failing(name, args))
        assert "hint: " in text and hint in text and "help(" not in text and "engramdb.Node" not in text, text
    assert "importance must be finite" in asyncio.run(failing("remember", {"text": "x", "importance": float("nan")}))
    db.close()


def test_a_default_hint_in_python_terms_is_told_in_the_tools_terms():
    from engramdb.errors import BusyError, ReadOnlyError, ValidationError
    from engramdb.mcp_server import _hint

    for exc in (ValidationError("bad"), BusyError("busy"), ReadOnlyError("read-only")):
        hint = _hint(exc, "remember")
        assert hint and hint != exc.hint and "open(" not in hint and "help(" not in hint, hint
    assert _hint(ValidationError("bad"), "recall").startswith("check the recall tool's arguments: query")
    assert _hint(ValidationError("bad", hint="pass a top_k between 1 and 100"), "recall") == \
        "pass a top_k between 1 and 100"  # a hint written for the case is kept


def _text(result) -> str:
    """The text of an in-process call_tool's answer: a result (mcp 2.x), or in mcp 1.x the
    content blocks, or (content blocks, structured content)."""
    if isinstance(result, tuple):
        result = result[0]
    if isinstance(result, list):
        content = result
    else:
        assert not _field(result, "is_error", "isError"), result.content
        content = result.content
    return content[0].text if content else ""


def test_before_task_holds_a_token_budget(tmp_path):
    """The before_task tool returned every relevant memory whole: one long memory made a block
    of 270,000 tokens for the agent's prompt, past any model's context. It now holds
    max_tokens (default 1000, as recall_context), each memory whole or left out."""
    from engramdb import estimate_tokens
    from engramdb.mcp_server import build_server

    db = engramdb.open(tmp_path / "agent.engram", passphrase=PASSPHRASE, kdf=TEST_KDF)
    for text in ["The cat sleeps on the sofa", "Paris is the capital of France", "Buy milk and eggs",
                 "The meeting moved to Tuesday", "Use tabs in Go code", "The garden needs water",
                 "Violin lesson at five", "Tax return due in April"]:
        db.remember(text)
    db.remember("The quarterly revenue report for Berlin shows growth. " * 20000)
    db.remember("Quarterly revenue in Berlin grew ten percent.")
    server = build_server(db)
    task = "write the quarterly revenue report for Berlin"

    async def call(args):
        return await server.call_tool("before_task", args)

    block = _text(asyncio.run(call({"task": task})))
    assert "grew ten percent" in block and estimate_tokens(block) <= 1000
    small = _text(asyncio.run(call({"task": task, "max_tokens": 30})))
    assert "grew ten percent" in small and estimate_tokens(small) <= 30
    with pytest.raises(Exception, match="max_tokens between 1 and 100000"):  # the SDK's ToolError in process
        asyncio.run(call({"task": task, "max_tokens": 0}))
    db.close()


def test_a_file_can_be_served_read_only(tmp_path):
    """`engramdb mcp` always opened read-write: a file on a read-only mount (or in a folder the
    user cannot write) could not be served at all, and the error's hint, "open the file
    read-only", named nothing `engramdb mcp` had. `--readonly` serves the read tools only."""
    path = tmp_path / "agent.engram"
    with engramdb.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.remember("Alice moved to Berlin in 2023")
        for text in ["The cat sleeps on the sofa", "Buy milk and eggs", "The garden needs water"]:
            db.remember(text)
    before = path.read_bytes()
    env = {**os.environ, "ENGRAM_PASSPHRASE": PASSPHRASE, "PYTHONPATH": str(ROOT)}
    params = StdioServerParameters(command=sys.executable, args=["-m", "engramdb", "mcp", "--readonly", str(path)],
                                   env=env, cwd=str(ROOT))

    async def script():
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            names = sorted(t.name for t in (await session.list_tools()).tools)
            hits = _payload(await session.call_tool("recall", {"query": "where does alice live?"}))["hits"]
            context = _payload(await session.call_tool("recall_context", {"query": "alice"}))
            stats = _payload(await session.call_tool("stats", {}))
            refused = await session.call_tool("remember", {"text": "a new fact"})
            return names, hits, context, stats, refused

    names, hits, context, stats, refused = asyncio.run(script())
    assert names == sorted(["recall", "recall_context", "before_task", "stats"])
    assert hits[0]["content"] == "Alice moved to Berlin in 2023" and "Berlin" in context and stats["memories"] == 4
    assert _field(refused, "is_error", "isError")
    assert path.read_bytes() == before


def test_mcp_never_prompts_for_the_passphrase_even_in_a_terminal(tmp_path):
    """In a terminal, `engramdb mcp` without a passphrase prompted for one (spec/agent.md 5:
    never a prompt, stdin carries the protocol), and without a terminal its hint said "or run
    in a terminal", which an MCP client's configuration cannot do."""
    import pty
    import subprocess

    path = tmp_path / "agent.engram"
    engramdb.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF).close()
    env = {k: v for k, v in os.environ.items() if k != "ENGRAM_PASSPHRASE"}
    env["PYTHONPATH"] = str(ROOT)
    leader, follower = pty.openpty()
    try:
        result = subprocess.run([sys.executable, "-m", "engramdb", "mcp", str(path)], env=env, capture_output=True,
                                text=True, stdin=follower, timeout=60, check=False)
    finally:
        os.close(follower)
        os.close(leader)
    assert result.returncode == 1 and result.stdout == ""
    assert "no passphrase given" in result.stderr and "run in a terminal" not in result.stderr
    assert "ENGRAM_PASSPHRASE" in result.stderr and "--passphrase-file" in result.stderr


def test_an_mcp_sdk_too_old_for_the_server_is_named_as_such(tmp_path):
    """pyproject asked for mcp>=1.0, but the server needs FastMCP with `instructions` (mcp 1.3,
    or MCPServer in 2.x): with mcp 1.0-1.2 installed, `pip install 'engramdb[mcp]'` kept it and
    `engramdb mcp` said the mcp package "is not installed"."""
    import subprocess

    fake = tmp_path / "site" / "mcp"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")  # an mcp without mcp.server.fastmcp, as 1.0 and 1.1 are
    path = tmp_path / "agent.engram"
    engramdb.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF).close()
    env = {**os.environ, "ENGRAM_PASSPHRASE": PASSPHRASE, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"),
                                                                                          str(ROOT)])}
    result = subprocess.run([sys.executable, "-m", "engramdb", "mcp", str(path)], env=env, capture_output=True,
                            text=True, stdin=subprocess.DEVNULL, timeout=60, check=False)
    assert result.returncode == 1 and result.stdout == ""
    assert "not installed" not in result.stderr and "too old" in result.stderr, result.stderr
    assert "pip install -U 'engramdb[mcp]'" in result.stderr
    pyproject = (ROOT / "pyproject.toml").read_text()  # (tomllib is 3.11+)
    assert 'mcp = ["mcp>=1.3"]' in pyproject and '"mcp>=1.0"' not in pyproject
