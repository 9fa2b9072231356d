"""Agent memory: an ``.engram`` file as the memory around any agent loop.

* :func:`serialize_conversation` reads OpenAI chat and Anthropic messages transcripts;
* :class:`ProceduralGraph` learns which tool paths work, stored in the file.

Everything here works on an ``Engram`` through its public API (duck-typed); models stay
outside as callables the user passes in. Semantics: spec/agent.md.
"""
from __future__ import annotations

from .procedures import ProceduralGraph, ProcedureEdge, ProcedureNode, Proposal, RefineReport, Trajectory
from .serialize import SerializedConversation, ToolCall, Turn, serialize_conversation

__all__ = [
    "serialize_conversation", "SerializedConversation", "Turn", "ToolCall",
    "ProceduralGraph", "ProcedureNode", "ProcedureEdge", "Trajectory", "Proposal", "RefineReport",
]
