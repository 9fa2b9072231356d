"""`engramdb mcp FILE`: one .engram file served over stdio with the Model Context Protocol.

Any MCP-speaking agent can then remember, recall, forget and use the task hooks without
writing Python. The server uses the official ``mcp`` SDK (the optional extra
``engramdb[mcp]``): ``MCPServer`` in mcp 2.x, ``FastMCP`` in mcp 1.x (1.3 or later). Each tool has a JSON
schema (from its typed signature) and reports an ``EngramError`` as a tool error with its
message and hint. The passphrase never travels as a tool argument: the command line opens
the file (``ENGRAM_PASSPHRASE``, ``--passphrase-file`` or ``--key-file``) before serving.
Semantics: spec/agent.md section 5.
"""
from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any
from collections.abc import Callable

from .agent.hooks import MemoryHooks
from .engram import Engram
from .errors import (
    BusyError, ClosedError, ConfigMismatchError, DuplicateIdError, EngramError, IndexMismatchError, NotFoundError,
    ReadOnlyError, ValidationError,
)

__all__ = ["build_server", "serve", "TOOLS", "READ_TOOLS", "INSTALL_HINT"]

INSTALL_HINT = "install the MCP extra: pip install 'engramdb[mcp]'"
UPGRADE_HINT = "upgrade it (mcp 1.3 or later): pip install -U 'engramdb[mcp]'"
TOOLS = ("remember", "recall", "recall_context", "forget", "before_task", "after_task", "stats")
# the tools a read-only handle offers (``engramdb mcp --readonly``): the others write
READ_TOOLS = ("recall", "recall_context", "before_task", "stats")
INSTRUCTIONS = ("Long-term memory in one encrypted .engram file. Call before_task with the task first and use "
                "what it returns; call after_task with the conversation when the task is done; remember facts "
                "worth keeping; recall to search; forget removes memories for good.")


def _sdk() -> tuple[Any, type[Exception]]:  # Any: the MCP SDK's server class (an optional extra)
    """(the server class, its ToolError) of the installed SDK.

    Raises:
        ConfigMismatchError: the ``mcp`` package is not installed.
    """
    failures = []
    for module, name in (("mcp.server.mcpserver", "MCPServer"), ("mcp.server.fastmcp", "FastMCP")):  # 2.x, 1.x
        try:
            server = getattr(importlib.import_module(module), name)
            if not _takes_instructions(server):  # mcp 1.2's FastMCP: it would drop them unsaid
                failures.append(f"{module}.{name} takes no instructions (mcp before 1.3)")
                continue
            return server, importlib.import_module(module + ".exceptions").ToolError
        except (ImportError, AttributeError) as exc:
            failures.append(f"{module}: {exc}")
            continue
    try:
        importlib.import_module("mcp")
    except ModuleNotFoundError as exc:
        if exc.name in (None, "mcp"):  # mcp itself, not a module mcp needs
            raise ConfigMismatchError("the MCP server needs the `mcp` package, which is not installed",
                                      hint=INSTALL_HINT) from None
    except ImportError:  # installed, but broken by its dependencies: said below
        pass
    # an mcp before 1.3 (no FastMCP with instructions), or one broken by its dependencies
    raise ConfigMismatchError("the installed `mcp` package is too old for the MCP server, or cannot be imported "
                              f"({'; '.join(failures)})", hint=UPGRADE_HINT)


def _takes_instructions(server: Any) -> bool:
    try:
        return "instructions" in inspect.signature(server).parameters
    except (TypeError, ValueError):  # no signature to read: let the call say
        return True


# What each tool takes, in its arguments' names: the hint of an error about a value (the library's
# default hint names Python calls: "... the docstring of the function or method you called").
_ARGUMENTS = {
    "remember": "text (the fact, as text), tags (a list of non-blank strings) and importance (a number from 0 "
                "to 1, or left out)",
    "recall": "query (text) and top_k (1 to 100)",
    "recall_context": "query (text) and max_tokens (1 to 100000)",
    "forget": "ids (a list of the ids that remember or recall returned)",
    "before_task": "task (text) and max_tokens (1 to 100000)",
    "after_task": "messages (OpenAI chat or Anthropic messages) and outcome ('success', 'failure', or left out)",
    "stats": "no arguments",
}
# Default hints that speak of Python calls, in the words of an MCP client (None: the tool's arguments).
_MCP_HINTS: dict[type[EngramError], str | None] = {
    ValidationError: None,
    DuplicateIdError: "remember gives each memory a new id; recall finds the one that exists",
    BusyError: "another process is writing to or compacting the file; call the tool again later (or start "
               "`engramdb mcp` with a longer --timeout)",
    ReadOnlyError: "the server serves the file read-only (`engramdb mcp --readonly`); start it without "
                   "--readonly, on a file it may write, to use this tool",
    ClosedError: "restart the MCP server",
    NotFoundError: "check the ids: remember and recall return them",
    IndexMismatchError: "stop the server and run `engramdb verify --fix FILE` to rebuild the indexes from the records",
}


def _hint(exc: EngramError, tool: str) -> str:
    """The hint an MCP client gets: the error's own when it was written for this case, else
    (a class's default, in Python's terms) what to do through the tools."""
    for cls in type(exc).__mro__:
        if cls in _MCP_HINTS and exc.hint == getattr(cls, "default_hint", None):
            return _MCP_HINTS[cls] or f"check the {tool} tool's arguments: {_ARGUMENTS.get(tool, 'see its schema')}"
    return exc.hint


def _node_view(node: Any) -> dict[str, Any]:
    return {"id": node.id, "content": node.content, "tags": list(node.tags), "tier": node.tier,
            "importance": node.importance, "created_at": node.created_at}


def _check_max_tokens(max_tokens: int) -> None:
    if not 1 <= max_tokens <= 100_000:
        raise ValidationError(f"max_tokens must be between 1 and 100000, got {max_tokens}",
                              hint="pass max_tokens between 1 and 100000")


def build_server(db: Engram, *, hooks: MemoryHooks | None = None, name: str = "engramdb") -> Any:
    """An MCP server (not yet running) whose tools work on the open file ``db``: all of
    :data:`TOOLS`, or only :data:`READ_TOOLS` when ``db`` is open read-only.

    Raises:
        ConfigMismatchError: the ``mcp`` package is not installed.
    """
    server_cls, tool_error = _sdk()
    hooks = hooks or MemoryHooks(db)
    server = server_cls(name, instructions=INSTRUCTIONS)

    def tool(description: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(fn)
            def wrapped(*args: Any, **kwargs: Any) -> Any:
                try:
                    return fn(*args, **kwargs)
                except EngramError as exc:  # the message and hint, never a traceback
                    hint = _hint(exc, fn.__name__)
                    raise tool_error(f"{exc.message}" + (f" (hint: {hint})" if hint else "")) from None

            if fn.__name__ in READ_TOOLS or not db.readonly:
                server.add_tool(wrapped, name=fn.__name__, description=description)
            return wrapped
        return register

    @tool("Store a memory (a fact, preference or decision worth keeping across sessions). Returns its id.")
    def remember(text: str, tags: list[str] | None = None, importance: float | None = None) -> dict[str, Any]:
        fields: dict[str, Any] = {"tags": list(tags or [])}
        if importance is not None:
            fields["importance"] = importance
        return {"id": db.remember(text, **fields)}

    @tool("Search memories: the best matches for the query, best first, each with its relevance in [0, 1].")
    def recall(query: str, top_k: int = 5) -> dict[str, Any]:
        if not 1 <= top_k <= 100:
            raise ValidationError(f"top_k must be between 1 and 100, got {top_k}", hint="pass a top_k between 1 and 100")
        hits = db.recall(query, top_k=top_k)
        return {"hits": [{**_node_view(h.node), "relevance": h.relevance, "score": h.score} for h in hits]}

    @tool("The source passages behind the best memories for the query, within a token budget, as text.")
    def recall_context(query: str, max_tokens: int = 1000) -> str:
        _check_max_tokens(max_tokens)
        return db.recall_context(query, max_tokens=max_tokens).text

    @tool("Delete memories by id for good (records, index entries, edges, archived text). Returns a receipt.")
    def forget(ids: list[str]) -> dict[str, Any]:
        if not ids:
            raise ValidationError("forget needs at least one id", hint="pass the ids that remember or recall returned")
        return db.forget(ids=list(ids)).to_dict()

    @tool("Call before starting a task: the memories relevant to it (and a procedure that worked for similar "
          "tasks) as a block to put into the prompt, within a token budget; an empty string when nothing is "
          "relevant.")
    def before_task(task: str, max_tokens: int = 1000) -> str:
        # a budget by default: the block goes into the agent's prompt, and one long memory made it
        # larger than any model's context
        _check_max_tokens(max_tokens)
        return hooks.before_task(task, max_tokens=max_tokens)

    @tool("Call when a task is done, with the conversation (OpenAI chat or Anthropic messages) and optionally "
          "its outcome ('success' or 'failure'): stores 1 to 3 new facts and returns their ids.")
    def after_task(messages: list[dict[str, Any]], outcome: str | None = None) -> dict[str, Any]:
        return {"ids": hooks.after_task(messages, outcome=outcome)}

    @tool("Counts and sizes of the memory file (memories per tier, archived, edges, procedures, file size).")
    def stats() -> dict[str, Any]:
        return db.stats()

    del remember, recall, recall_context, forget, before_task, after_task, stats  # registered above
    return server


def serve(db: Engram, **kwargs: Any) -> None:
    """Serve ``db`` over stdio until the client closes the connection.

    Raises:
        ConfigMismatchError: the ``mcp`` package is not installed.
    """
    build_server(db, **kwargs).run("stdio")
