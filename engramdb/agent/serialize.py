"""Conversation serializer: OpenAI chat and Anthropic messages transcripts -> turns and text.

``serialize_conversation(messages)`` reads a trajectory in either format (they may even
be mixed) and returns a :class:`SerializedConversation`: the turns (user prompt,
assistant response, tool calls with their arguments and their results matched by id,
thinking blocks), a readable full text for fact extraction, the tool names in call
order and whether any tool call failed. ``Engram.ingest`` renders structured messages
with the same code (:func:`parse_messages`, :func:`render_message`). Semantics:
spec/agent.md section 1.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Iterable, Mapping

from ..errors import ValidationError

__all__ = [
    "ToolCall", "Turn", "SerializedConversation", "Message", "serialize_conversation", "parse_messages",
    "render_message", "is_structured",
]

_SPEAKER_KEYS = ("role", "speaker", "name", "author")
_TEXT_KEYS = ("content", "text", "message")
_HINT = ("give OpenAI chat messages ({'role', 'content', 'tool_calls'} and {'role': 'tool', 'tool_call_id'}) "
         "or Anthropic messages ({'role', 'content': [text / thinking / tool_use / tool_result blocks]})")
# A tool result in the OpenAI format carries no error flag: these shapes count as failures
# (spec/agent.md 1.3). An explicit ``is_error`` on the message wins.
_FAILED = re.compile(
    r"^\s*(?:error|exception|fatal|failed|failure)\b|Traceback \(most recent call last\)"
    r"|\b(?:exit(?:ed with)? code|exit status|returncode)[ :=]+[1-9]\d*", re.IGNORECASE)
_PLACEHOLDER_BLOCKS = {"image": "[image]", "image_url": "[image]", "input_image": "[image]", "document": "[document]",
                       "file": "[file]", "input_audio": "[audio]", "audio": "[audio]"}


@dataclass
class ToolCall:
    """One tool call and, once matched by id, its result.

    Attributes:
        id: the call's id (``tool_use.id`` / ``tool_calls[].id``; None for a legacy
            OpenAI ``function_call``).
        name: the tool's name.
        arguments: the parsed arguments (a dict), or the raw string when it is not JSON.
        result: the result's text, None when no result came back.
        is_error: the call failed (Anthropic ``is_error``; for OpenAI see spec/agent.md).
    """

    id: str | None
    name: str
    arguments: Any
    result: str | None = None
    is_error: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments, "result": self.result,
                "is_error": self.is_error}


@dataclass
class Turn:
    """A user prompt and everything the assistant did until the next prompt."""

    user: str = ""
    assistant: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"user": self.user, "assistant": self.assistant, "thinking": list(self.thinking),
                "tool_calls": [call.to_dict() for call in self.tool_calls]}


@dataclass
class SerializedConversation:
    """A parsed trajectory (see :func:`serialize_conversation`)."""

    turns: list[Turn]
    text: str
    tool_sequence: list[str]
    has_errors: bool
    system: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"turns": [turn.to_dict() for turn in self.turns], "text": self.text,
                "tool_sequence": list(self.tool_sequence), "has_errors": self.has_errors, "system": self.system}


@dataclass
class Message:
    """One message, normalized: its speaker, text parts, thinking, the calls it makes and the
    calls it answers (the same :class:`ToolCall` objects, so results are shared)."""

    index: int
    role: str
    texts: list[str] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    results: list[ToolCall] = field(default_factory=list)
    raw: Any = None


def _fail(n: int, where: str, problem: str) -> ValidationError:
    return ValidationError(f"message {n}: {where} {problem}", hint=_HINT)


def _text_of(value: Any, n: int, where: str) -> str:
    """The text of a content value: a string, or a list of text parts (other parts as placeholders)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for i, block in enumerate(value):
            if isinstance(block, str):
                parts.append(block)
                continue
            if not isinstance(block, Mapping):
                raise _fail(n, f"{where}[{i}]", f"is a {type(block).__name__}, not a content block")
            kind = block.get("type")
            if not isinstance(kind, str):  # a list or a mapping cannot even be looked up
                raise _fail(n, f"{where}[{i}].type", f"{kind!r} is not a text, image or document block")
            if kind in ("text", "input_text", "output_text"):
                parts.append(_str_field(block, "text", n, f"{where}[{i}].text"))
            elif kind in _PLACEHOLDER_BLOCKS:
                parts.append(_PLACEHOLDER_BLOCKS[kind])
            else:
                raise _fail(n, f"{where}[{i}].type", f"{kind!r} is not a text, image or document block")
        return "\n".join(p for p in parts if p)
    raise _fail(n, where, f"is a {type(value).__name__}, not text or a list of content blocks")


def _str_field(block: Mapping[str, Any], key: str, n: int, where: str, *, optional: bool = False) -> str:
    value = block.get(key)
    if isinstance(value, str):
        return value
    if value is None and optional:
        return ""
    raise _fail(n, where, "is missing" if value is None else f"is a {type(value).__name__}, not a string")


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value) if value.strip() else {}
        except (ValueError, RecursionError):  # nested past the recursion limit: RecursionError
            return value  # models do emit broken JSON; keep it rather than lose the call
    return {} if value is None else value


def is_structured(message: Any) -> bool:
    """Whether a message is in the OpenAI or Anthropic format beyond plain ``role``/``content``
    text: content blocks, tool calls, or a tool result."""
    return isinstance(message, Mapping) and (
        isinstance(message.get("content"), list) or bool(message.get("tool_calls"))
        or message.get("role") in ("tool", "function") or bool(message.get("function_call")))


def parse_messages(messages: Iterable[Any]) -> list[Message]:
    """Normalize a transcript: every message with its texts, thinking and tool calls, and each
    tool result matched to its call by id (calls and results share :class:`ToolCall` objects).

    Messages are strings (user text), plain ``{role|speaker, content|text}`` mappings,
    OpenAI chat messages or Anthropic messages.

    Raises:
        ValidationError: a message or field that cannot be parsed, named by its index and path.
    """
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Iterable):
        raise ValidationError(f"a conversation is a list of messages, not {type(messages).__name__}",
                              hint="wrap a single message in a list: [message]")
    parsed: list[Message] = []
    calls: dict[str, ToolCall] = {}
    last_function: dict[str, ToolCall] = {}
    for n, raw in enumerate(messages):
        if isinstance(raw, str):
            parsed.append(Message(n, "user", [raw], raw=raw))
            continue
        if not isinstance(raw, Mapping):
            raise _fail(n, "the message", f"is a {type(raw).__name__}, not a mapping or a string")
        role = next((raw[k] for k in _SPEAKER_KEYS if isinstance(raw.get(k), str) and raw.get(k)), None)
        if role is None:
            raise _fail(n, "role", "is missing")
        msg = Message(n, role, raw=raw)
        parsed.append(msg)
        if role in ("tool", "function"):
            _openai_result(raw, msg, n, calls, last_function)
            continue
        content_key = next((k for k in _TEXT_KEYS if k in raw), "content")
        content = raw.get(content_key)
        if isinstance(content, list):
            _blocks(content, msg, n, calls, content_key)
        elif content is not None:
            if not isinstance(content, str):
                raise _fail(n, content_key, f"is a {type(content).__name__}, not text or a list of content blocks")
            msg.texts.append(content)
        for key in ("reasoning_content", "reasoning"):  # OpenAI-compatible reasoning models
            if isinstance(raw.get(key), str) and raw[key]:
                msg.thinking.append(raw[key])
        _openai_calls(raw, msg, n, calls, last_function)
    return parsed


def _register(call: ToolCall, calls: dict[str, ToolCall], n: int, where: str) -> None:
    if call.id is not None:
        if call.id in calls:
            raise _fail(n, where, f"repeats the tool call id {call.id!r}")
        calls[call.id] = call


def _match(call_id: Any, calls: dict[str, ToolCall], n: int, where: str) -> ToolCall:
    if not isinstance(call_id, str) or not call_id:
        raise _fail(n, where, "is missing" if call_id is None else "is not a string")
    call = calls.get(call_id)
    if call is None:
        raise _fail(n, where, f"names the tool call {call_id!r}, which no earlier message made")
    if call.result is not None:
        raise _fail(n, where, f"answers the tool call {call_id!r} a second time")
    return call


def _blocks(content: list[Any], msg: Message, n: int, calls: dict[str, ToolCall], key: str) -> None:
    for i, block in enumerate(content):
        where = f"{key}[{i}]"
        if isinstance(block, str):
            msg.texts.append(block)
            continue
        if not isinstance(block, Mapping):
            raise _fail(n, where, f"is a {type(block).__name__}, not a content block")
        kind = block.get("type")
        if not isinstance(kind, str):  # a list or a mapping cannot even be looked up
            kind = repr(kind)
            raise _fail(n, f"{where}.type", f"{kind} is not a known content block "
                                            "(text, thinking, tool_use, tool_result, image, document)")
        if kind in ("text", "input_text", "output_text"):
            msg.texts.append(_str_field(block, "text", n, f"{where}.text"))
        elif kind == "thinking":
            msg.thinking.append(_str_field(block, "thinking", n, f"{where}.thinking"))
        elif kind == "redacted_thinking":
            continue  # encrypted by the provider: nothing readable
        elif kind == "refusal":
            msg.texts.append(_str_field(block, "refusal", n, f"{where}.refusal"))
        elif kind in ("tool_use", "server_tool_use"):
            call = ToolCall(id=_str_field(block, "id", n, f"{where}.id"),
                            name=_str_field(block, "name", n, f"{where}.name"),
                            arguments=_arguments(block.get("input")))
            _register(call, calls, n, f"{where}.id")
            msg.calls.append(call)
        elif kind == "tool_result" or (isinstance(kind, str) and kind.endswith("_tool_result")):
            call = _match(block.get("tool_use_id"), calls, n, f"{where}.tool_use_id")
            call.result = _text_of(block.get("content"), n, f"{where}.content")
            is_error = block.get("is_error", False)
            if not isinstance(is_error, bool):
                raise _fail(n, f"{where}.is_error", "is not true or false")
            call.is_error = is_error
            msg.results.append(call)
        elif kind in _PLACEHOLDER_BLOCKS:
            msg.texts.append(_PLACEHOLDER_BLOCKS[kind])
        else:
            raise _fail(n, f"{where}.type", f"{kind!r} is not a known content block "
                                            "(text, thinking, tool_use, tool_result, image, document)")


def _openai_calls(raw: Mapping[str, Any], msg: Message, n: int, calls: dict[str, ToolCall],
                  last_function: dict[str, ToolCall]) -> None:
    tool_calls = raw.get("tool_calls")
    if tool_calls is not None:
        if not isinstance(tool_calls, list):
            raise _fail(n, "tool_calls", "is not a list")
        for i, item in enumerate(tool_calls):
            where = f"tool_calls[{i}]"
            if not isinstance(item, Mapping):
                raise _fail(n, where, "is not a mapping")
            function = item.get("function")
            if not isinstance(function, Mapping):
                raise _fail(n, f"{where}.function", "is missing" if function is None else "is not a mapping")
            call = ToolCall(id=_str_field(item, "id", n, f"{where}.id"),
                            name=_str_field(function, "name", n, f"{where}.function.name"),
                            arguments=_arguments(function.get("arguments")))
            _register(call, calls, n, f"{where}.id")
            msg.calls.append(call)
    function_call = raw.get("function_call")  # the legacy single-call form, answered by role "function"
    if function_call is not None:
        if not isinstance(function_call, Mapping):
            raise _fail(n, "function_call", "is not a mapping")
        call = ToolCall(id=None, name=_str_field(function_call, "name", n, "function_call.name"),
                        arguments=_arguments(function_call.get("arguments")))
        last_function[call.name] = call
        msg.calls.append(call)


def _openai_result(raw: Mapping[str, Any], msg: Message, n: int, calls: dict[str, ToolCall],
                   last_function: dict[str, ToolCall]) -> None:
    if raw.get("role") == "function" and "tool_call_id" not in raw:
        name = _str_field(raw, "name", n, "name")
        call = last_function.pop(name, None)
        if call is None:
            raise _fail(n, "name", f"answers a function call {name!r} that no earlier message made")
    else:
        call = _match(raw.get("tool_call_id"), calls, n, "tool_call_id")
    call.result = _text_of(raw.get("content"), n, "content")
    explicit = raw.get("is_error")
    if explicit is not None and not isinstance(explicit, bool):
        raise _fail(n, "is_error", "is not true or false")
    call.is_error = explicit if explicit is not None else bool(_FAILED.search(call.result))
    msg.results.append(call)


def _compact_json(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError, RecursionError):
        return _shallow(value)


def _shallow(value: Any) -> str:
    """``str(value)``, or its type's name when it is nested too deep even for that."""
    try:
        return str(value)
    except RecursionError:
        return f"<{type(value).__name__} nested too deep to show>"


def render_message(msg: Message) -> list[str]:
    """A message as readable ``speaker: text`` lines (thinking, tool calls and results marked).

    ``Engram.ingest`` stores these lines for structured messages, and
    :attr:`SerializedConversation.text` is made of them.
    """
    lines = [f"{msg.role}: [thinking] {text}" for text in msg.thinking if text]
    text = "\n".join(t for t in msg.texts if t)
    if text:
        lines.append(f"{msg.role}: {text}")
    for call in msg.calls:
        lines.append(f"{msg.role}: [tool call {call.name}] {_compact_json(call.arguments)}")
    for call in msg.results:
        status = "error" if call.is_error else "result"
        lines.append(f"tool: [{call.name} {status}] {call.result or ''}")
    return lines


def serialize_conversation(messages: Iterable[Any] | SerializedConversation) -> SerializedConversation:
    """Parse a trajectory in the OpenAI chat or Anthropic messages format.

    A turn starts at each user message that says something (an Anthropic user message
    holding only tool results continues the turn); system and developer messages go to
    ``system``. Returns the turns, the readable ``text``, the ``tool_sequence`` (tool
    names in call order) and ``has_errors`` (any failed tool call).
    A :class:`SerializedConversation` is returned as it is.

    Raises:
        ValidationError: a message or field that cannot be parsed, named by its index and path.
    """
    if isinstance(messages, SerializedConversation):
        return messages
    parsed = parse_messages(messages)
    turns: list[Turn] = []
    system: list[str] = []
    sequence: list[str] = []
    lines: list[str] = []
    for msg in parsed:
        lines.extend(render_message(msg))
        text = "\n".join(t for t in msg.texts if t)
        if msg.role in ("system", "developer"):
            system.append(text)
            continue
        if msg.role in ("user", "human") and text:
            turns.append(Turn(user=text))
        elif not turns:
            turns.append(Turn())
        turn = turns[-1]
        if msg.role not in ("user", "human", "tool", "function"):
            if text:
                turn.assistant = f"{turn.assistant}\n{text}" if turn.assistant else text
            turn.thinking.extend(t for t in msg.thinking if t)
            turn.tool_calls.extend(msg.calls)
            sequence.extend(call.name for call in msg.calls)
    calls = [call for turn in turns for call in turn.tool_calls]
    return SerializedConversation(turns=turns, text="\n".join(lines), tool_sequence=sequence,
                                  has_errors=any(call.is_error for call in calls), system="\n".join(system))
