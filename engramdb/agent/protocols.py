"""What the agent layer needs of a store: the part of ``Engram``'s public API it calls.

The agent modules sit below ``engram.py`` (tests/test_layering.py), so they take any object
with these methods instead of importing ``Engram``; an open ``Engram`` is one
(:class:`AgentMemory` is checked against it by mypy wherever the CLI and the MCP server pass
one, and at run time by the tests).
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from ..filters import NameSet
from ..recall import Hit
from ..records import Node

__all__ = ["AgentMemory", "AgentTransaction"]


@runtime_checkable
class AgentTransaction(Protocol):
    """The operations of ``Engram.transaction()``'s transaction the agent layer calls: the
    procedure rows, and what sleep consolidation writes per core memory in one commit."""

    def add(self, item: str, /, *, now: float | None = ..., **fields: Any) -> str: ...

    def find(self, id: str) -> Node | None: ...

    def link(self, src: str, dst: str, kind: str = ..., *, now: float | None = ...) -> None: ...

    def archive(self, id: str, /, *, now: float | None = ...) -> int: ...

    def procedure_rows(self) -> list[dict[str, Any]]: ...

    def procedure_keys(self) -> list[bytes]: ...

    def procedure_row(self, key: bytes) -> dict[str, Any] | None: ...

    def put_procedure_row(self, row: Mapping[str, Any]) -> None: ...

    def delete_procedure_row(self, row: Mapping[str, Any]) -> bool: ...


@runtime_checkable
class AgentMemory(Protocol):
    """The ``Engram`` methods that hooks, consolidation and the procedural graph call."""

    def __contains__(self, id: object) -> bool: ...

    def recall(self, query: str, *, top_k: int = ..., tiers: NameSet | None = ...,
               min_relevance: float = ...) -> list[Hit]: ...

    def remember(self, text: str, /, *, now: float | None = ..., **fields: Any) -> str: ...

    def scan(self, *, tiers: NameSet | None = ..., tags: NameSet | None = ...) -> Iterator[Node]: ...

    def link(self, src: str, dst: str, kind: str = ..., *, now: float | None = ...) -> None: ...

    def archive(self, id: str, /, *, now: float | None = ...) -> int: ...

    def procedure_rows(self) -> list[dict[str, Any]]: ...

    def transaction(self) -> AbstractContextManager[AgentTransaction]: ...
