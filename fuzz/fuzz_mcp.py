"""Coverage-guided fuzzing of the MCP tools' argument handling (atheris / libFuzzer).

Run (see fuzz/README.md; needs the MCP extra, ``pip install 'engramdb[mcp]'``)::

    python fuzz/fuzz_mcp.py /tmp/mcp-new fuzz/corpus/mcp -max_total_time=60

The first byte picks the tool (``byte % 7``, in ``engramdb.mcp_server.TOOLS`` order); the
rest, as JSON, is its arguments: an object as it is, anything else as the tool's first
argument (``{"text": value}`` for remember). The call goes through the SDK's
``call_tool``, as a client's would: the SDK checks the arguments against the tool's
schema, then the tool runs on a plaintext store in a temporary directory (made afresh
every ``RESET`` calls so it stays small).

Oracle: a call returns a result, or fails with a tool error whose cause is engramdb's
(an ``EngramError`` turned into the SDK's ``ToolError`` by the server) or the SDK's
argument validation; any other exception inside a tool is a crash. What ``remember``
stores is the text and tags it was given.

``python fuzz/fuzz_mcp.py --seeds DIR`` writes the seed corpus (deterministic; the
committed one is ``fuzz/corpus/mcp``, replayed by tests/test_fuzz_regressions.py).
"""
from __future__ import annotations

import asyncio
import atexit
import hashlib
import json
import os
import shutil
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

if __name__ == "__main__" and "--seeds" not in sys.argv:
    import atheris

    with atheris.instrument_imports(include=["engramdb"]):
        import engramdb
        from engramdb import mcp_server
else:  # imported by tests/test_fuzz_regressions.py to replay the corpus without atheris
    import engramdb
    from engramdb import mcp_server

FIRST = {"remember": "text", "recall": "query", "recall_context": "query", "forget": "ids",
         "before_task": "task", "after_task": "messages", "stats": None}
RESET = 300


class _Server:
    """The server on a small store, rebuilt every RESET calls."""

    def __init__(self) -> None:
        self.db: Any = None
        self.calls = 0
        self.dir = ""

    def get(self) -> tuple[Any, Any]:
        if self.db is None or self.calls >= RESET:
            self.close()
            self.dir = tempfile.mkdtemp(prefix="fuzz-mcp-")
            self.db = engramdb.open(os.path.join(self.dir, "fuzz.engram"), encrypted=False)
            self.server = mcp_server.build_server(self.db)
            self.calls = 0
        self.calls += 1
        return self.db, self.server

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            shutil.rmtree(self.dir, ignore_errors=True)
            self.db = None


SERVER = _Server()
atexit.register(SERVER.close)
_, TOOL_ERROR = mcp_server._sdk()


def arguments_of(tool: str, body: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if isinstance(value, dict):
        return value
    return {FIRST[tool]: value} if FIRST[tool] else {}


def _expected(exc: BaseException) -> bool:
    """Whether a failed call failed the way a client may see: engramdb's ToolError (raised
    ``from None`` by the server) or the SDK's schema validation (pydantic)."""
    inner = exc
    while inner.__cause__ is not None:
        inner = inner.__cause__
    if isinstance(inner, TOOL_ERROR):
        return True
    return type(inner).__module__.startswith("pydantic")


def TestOneInput(data: bytes) -> None:
    if not data:
        return
    tool = mcp_server.TOOLS[data[0] % len(mcp_server.TOOLS)]
    args = arguments_of(tool, data[1:])
    if args is None:
        return
    db, server = SERVER.get()
    try:
        result = asyncio.run(server.call_tool(tool, args))
    except TOOL_ERROR as exc:
        if not _expected(exc):
            inner = exc
            while inner.__cause__ is not None:
                inner = inner.__cause__
            raise inner from None  # the crash itself, for libFuzzer's report
        return
    if tool == "remember" and not getattr(result, "is_error", getattr(result, "isError", False)):
        payload = getattr(result, "structured_content", None) or getattr(result, "structuredContent", None)
        node = db.get(payload["id"])
        assert node.content == args["text"], (node.content, args["text"])
        assert list(node.tags) == list(args.get("tags") or []), (node.tags, args.get("tags"))


def seeds() -> list[bytes]:
    calls: list[tuple[str, Any]] = [
        ("remember", {"text": "Alice moved to Berlin in 2023", "tags": ["people", "places"], "importance": 0.8}),
        ("remember", "The deploy runs on Fridays"), ("remember", {"text": ""}), ("remember", {"text": "x", "tags": [""]}),
        ("remember", {"text": "x", "importance": "NaN"}), ("remember", {"text": "x", "importance": 1e308}),
        ("remember", {"text": "\ud800 lone surrogate"}), ("remember", {"text": "x", "tags": ["a", "a"]}),
        ("remember", {"text": "x", "tags": "not a list"}), ("remember", {"text": "x", "extra": 1}),
        ("recall", {"query": "where does alice live?", "top_k": 3}), ("recall", {"query": "", "top_k": 0}),
        ("recall", {"query": "x", "top_k": 1.5}), ("recall", {"query": "x", "top_k": True}), ("recall", "deploy"),
        ("recall_context", {"query": "deploy", "max_tokens": 100}), ("recall_context", {"query": "x", "max_tokens": 1}),
        ("forget", {"ids": ["no-such-id"]}), ("forget", {"ids": []}), ("forget", {"ids": [""]}), ("forget", "x"),
        ("before_task", {"task": "build a CLI task manager in Python"}), ("before_task", ""),
        ("after_task", {"messages": [{"role": "user", "content": "add a --json flag"},
                                     {"role": "assistant", "content": "Done: the CLI prints JSON with --json."}],
                        "outcome": "success"}),
        ("after_task", {"messages": [], "outcome": "done"}), ("after_task", {"messages": [{}]}),
        ("after_task", {"messages": [{"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f"}}]}]}),
        ("stats", {}), ("stats", {"unexpected": 1}),
    ]
    out = []
    for tool, args in calls:
        out.append(bytes([mcp_server.TOOLS.index(tool)]) + json.dumps(args).encode())
    return out


if __name__ == "__main__":
    if "--seeds" in sys.argv:
        folder = sys.argv[sys.argv.index("--seeds") + 1]
        os.makedirs(folder, exist_ok=True)
        for seed in seeds():
            with open(os.path.join(folder, hashlib.sha1(seed).hexdigest()), "wb") as fh:
                fh.write(seed)
    else:
        atheris.Setup(sys.argv, TestOneInput)
        atheris.Fuzz()
