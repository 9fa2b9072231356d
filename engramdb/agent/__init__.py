"""Agent memory: an ``.engram`` file as the memory around any agent loop.

* :func:`serialize_conversation` reads OpenAI chat and Anthropic messages transcripts;
* :class:`MemoryHooks` recalls before a task and forms facts after it;
* :func:`consolidate_sleep` turns many fresh memories into a few core memories;
* :class:`ProceduralGraph` learns which tool paths work, stored in the file.

Everything here works on an ``Engram`` through its public API (any :class:`AgentMemory`:
the methods it calls, as a Protocol); models stay
outside as callables the user passes in. Semantics: spec/agent.md.
"""
from __future__ import annotations

from .consolidate import SleepReport, Summarizer, consolidate_sleep, unconsolidated
from .extract import Fact, extract_facts
from .hooks import MemoryHooks
from .protocols import AgentMemory, AgentTransaction
from .procedures import ProceduralGraph, ProcedureEdge, ProcedureNode, Proposal, RefineReport, Trajectory
from .serialize import SerializedConversation, ToolCall, Turn, serialize_conversation

__all__ = [
    "MemoryHooks", "consolidate_sleep", "unconsolidated", "SleepReport", "Summarizer", "extract_facts", "Fact",
    "serialize_conversation", "SerializedConversation", "Turn", "ToolCall",
    "ProceduralGraph", "ProcedureNode", "ProcedureEdge", "Trajectory", "Proposal", "RefineReport",
    "AgentMemory", "AgentTransaction",
]
