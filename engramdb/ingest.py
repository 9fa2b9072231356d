"""Compressed memory in the file: ``Engram.ingest``, ``inject_context`` and ``wake_up``.

``compress`` is pure; this module stores its result (zettels as nodes, tunnels as
edges, the normalized source for ``recall_context``) and rebuilds a
:class:`CompressResult` from stored memories for the context builders.
"""
from __future__ import annotations

import datetime
import hashlib
import math
import re
from typing import Any
from collections.abc import Iterable, Mapping, Sequence

from .agent.serialize import is_structured, parse_messages, render_message
from .compress import compress
from .backup import read_entities as stored_entities
from .compress.entities import assign_codes
from .engram import Engram
from .errors import StoreError, ValidationError
from .index import iter_nodes
from .recall import default_source_loader
from .records import CompressResult, Edge, EntityIndex, Node, Tunnel, Zettel, now_ts
from .store import Txn

__all__ = ["ingest", "stored_result", "messages_to_text"]

_SPEAKER_KEYS = ("speaker", "name", "role", "author")
_TEXT_KEYS = ("content", "text", "message")
_DATE_KEYS = ("date", "timestamp", "time")


_MESSAGE_HINT = "give each message as a string, or a mapping with a text (content, text or message), " \
                "optionally a speaker and a date"
_MONTHS = {name: n for n, name in enumerate(("january", "february", "march", "april", "may", "june", "july",
                                             "august", "september", "october", "november", "december"), 1)}
_MONTH = r"(january|february|march|april|may|june|july|august|september|october|november|december)"
_ISO_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})")
_DAY_MONTH_YEAR = re.compile(r"\b(\d{1,2})(?:st|nd|rd|th)? " + _MONTH + r",? (\d{4})\b", re.IGNORECASE)
_MONTH_DAY_YEAR = re.compile(_MONTH + r" (\d{1,2})(?:st|nd|rd|th)?,? (\d{4})\b", re.IGNORECASE)


def _message_date(value: Any, n: int) -> str:
    """A message's date as ``YYYY-MM-DD``: from an ISO date or datetime anywhere in a string
    ("2023-05-08T13:56"), an English date ("1:56 pm on 8 May, 2023", "May 8, 2023"), a
    ``date``/``datetime``, or a Unix timestamp in seconds (UTC).

    Raises:
        ValidationError: the value holds no date these forms can read.
    """
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()[:10]
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        try:
            return datetime.datetime.fromtimestamp(value, datetime.timezone.utc).date().isoformat()
        except (OverflowError, OSError, ValueError):
            pass
    elif isinstance(value, str):
        if m := _ISO_DATE.search(value):
            parts = (int(m[1]), int(m[2]), int(m[3]))
        elif m := _DAY_MONTH_YEAR.search(value):
            parts = (int(m[3]), _MONTHS[m[2].lower()], int(m[1]))
        elif m := _MONTH_DAY_YEAR.search(value):
            parts = (int(m[3]), _MONTHS[m[1].lower()], int(m[2]))
        else:
            parts = None
        if parts is not None:
            try:
                return datetime.date(*parts).isoformat()
            except ValueError:
                pass
    raise ValidationError(f"message {n}: cannot read the date {value!r}",
                          hint="give dates as YYYY-MM-DD (ISO 8601) or a Unix timestamp in seconds")


def messages_to_text(messages: Iterable[Any]) -> str:
    """Serialize a conversation as chat lines (``Speaker: text``) with a date header line
    (``[YYYY-MM-DD]``) wherever the date changes, the shape ``compress`` reads.

    Messages are strings (taken as they are) or mappings with a speaker (``speaker``,
    ``name``, ``role`` or ``author``), a text (``content``, ``text`` or ``message``) and
    optionally a date (``date``, ``timestamp`` or ``time``: an ISO date or datetime, an
    English date such as "8 May, 2023", or a Unix timestamp). OpenAI chat and Anthropic
    messages (content blocks, tool calls, tool results, thinking) are rendered by the agent
    serializer (``engramdb.agent.serialize``, spec/agent.md): ``assistant: [tool call NAME]
    {arguments}``, ``tool: [NAME result] text`` (``error`` for a failed call),
    ``assistant: [thinking] text``.

    Raises:
        ValidationError: not a list of messages; a message has no text, or a date that cannot be read.
    """
    if isinstance(messages, (str, bytes, bytearray, Mapping)) or not isinstance(messages, Iterable):
        # a lone message dict would be read as its keys, a string as its characters
        raise ValidationError(f"a conversation is a list of messages, not {type(messages).__name__}",
                              hint="wrap a single message in a list: [message]")
    messages = list(messages)
    if any(map(is_structured, messages)):
        return _structured_to_text(messages)
    lines: list[str] = []
    last_date = None
    for n, message in enumerate(messages):
        if isinstance(message, str):
            lines.append(message)
            continue
        if not isinstance(message, Mapping):
            raise ValidationError(f"message {n} is neither a string nor a mapping", hint=_MESSAGE_HINT)
        text = next((message[k] for k in _TEXT_KEYS if isinstance(message.get(k), str)), None)
        if text is None:
            raise ValidationError(f"message {n} has no text", hint=f"give it one of the keys {', '.join(_TEXT_KEYS)}")
        date = next((_message_date(message[k], n) for k in _DATE_KEYS if message.get(k)), None)
        if date and date != last_date:
            lines.append(f"[{date}]")
            last_date = date
        speaker = next((str(message[k]) for k in _SPEAKER_KEYS if message.get(k)), None)
        lines.append(f"{speaker}: {text}" if speaker else text)
    return "\n".join(lines)


def _structured_to_text(messages: list[Any]) -> str:
    """OpenAI chat / Anthropic messages as chat lines, rendered by the agent serializer (content
    blocks, tool calls with their arguments, tool results matched by id, thinking), with the
    same date header lines as plain messages."""
    lines: list[str] = []
    last_date = None
    for message in parse_messages(messages):
        raw = message.raw
        if isinstance(raw, Mapping):
            date = next((_message_date(raw[k], message.index) for k in _DATE_KEYS if raw.get(k)), None)
            if date and date != last_date:
                lines.append(f"[{date}]")
                last_date = date
        lines.extend(render_message(message))
    return "\n".join(lines)


def _node_from_zettel(z: Zettel, source_text: str, source_name: str, id_prefix: str,
                      stamp: float, fields: Mapping[str, Any]) -> Node:
    content = source_text[z.source_start:z.source_end] if z.source_start is not None and z.source_end is not None \
        else z.quote
    return Node(
        id=id_prefix + z.id, content=content,
        entities=tuple(z.entities), topics=tuple(z.topics), quote=z.quote,
        weight=z.weight, flags=tuple(z.flags), emotions=tuple(z.emotions), source_start=z.source_start, source_end=z.source_end,
        resolved_date=z.resolved_date, source=source_name, created_at=stamp, last_accessed=stamp, **fields,
    )


def ingest(engram: Engram, source: str | Iterable[Any], *, source_name: str | None = None, now: float | None = None,
           tags: Sequence[str] = (), importance: float | None = None, **compress_options: Any) -> list[str]:
    """Compress ``source`` (text, or a list of chat messages) and store the zettels.

    Ids are ``<source key>:<zettel id>``, where the source key is a hash of the normalized
    text, so ingesting the same text twice stores it once and returns the same ids.
    The normalized text is kept in the file (sealed) under ``source_name`` (default: the
    ``title`` option, else ``doc-<hash>``) for :meth:`Engram.recall_context`; when that
    name already holds a different text, under ``<name>#<source key>`` instead.

    Raises:
        ValidationError: bad input or options.
    """
    if isinstance(source, str):
        text = source.removeprefix("\ufeff")  # a byte-order mark is not text (issue 12, bug 10)
    elif isinstance(source, (Mapping, bytes, bytearray)) or not isinstance(source, Iterable):
        # a lone message dict would be iterated as its keys ("speaker", "text") and stored
        raise ValidationError(f"ingest takes text or a list of messages, not {type(source).__name__}",
                              hint="decode bytes to str first; wrap a single message in a list: [message]")
    else:
        text = messages_to_text(source)
    result = compress(text, **{**compress_options, "keep_source": True})
    normalized = result.meta.get("source", text)
    key = hashlib.sha256(normalized.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    name = source_name or compress_options.get("title") or f"doc-{key}"
    stamp = now_ts(now)
    fields: dict[str, Any] = {"tags": list(tags)}
    if importance is not None:
        fields["importance"] = importance
    tunnels = [(f"{key}:{t.from_id}", f"{key}:{t.to_id}", t.label) for t in result.tunnels]
    encoded = normalized.encode("utf-8", "surrogatepass")

    def store(txn: Txn) -> list[str]:
        stored_name = _free_source_name(engram, txn, name, key, encoded)
        nodes = [_node_from_zettel(z, normalized, stored_name, f"{key}:", stamp, fields) for z in result.zettels]
        new: set[str] = set()
        with engram._batched(txn) as tx:
            for node in nodes:
                if tx.find(node.id) is None:
                    tx._put_new(node)
                    new.add(node.id)
        # The same text again (under any name) stores nothing: a row under a new name that no
        # memory reads would outlive a forget() of the memories, text and all, and a tunnel
        # between two stored memories is theirs already, or was unlinked, or was replaced by
        # the user's own tunnel edge, which a derived one would overwrite.
        if new:
            txn.put("sources", engram._store.blind(b"source", stored_name.encode("utf-8", "surrogatepass")), encoded)
        for src, dst, label in tunnels:
            if src not in new and dst not in new:
                continue
            a, b = tx._docno(src), tx._docno(dst)
            if a is None or b is None:  # both ends were stored just above, in this transaction
                raise StoreError(f"a tunnel end ({src!r} or {dst!r}) is missing from the transaction")
            engram.indexes.graph.put(txn, a, b, Edge(src=src, dst=dst, kind="tunnel", label=label, created_at=stamp),
                                     derived=True)
        return [node.id for node in nodes]

    return engram._store.write(store)


def _free_source_name(engram: Engram, txn: Txn, name: str, key: str, encoded: bytes) -> str:
    """``name``, or ``name#key`` when ``name`` already holds a different text.

    Memories find their passages through the source name, so two inputs with the same
    name (``a/notes.md`` and ``b/notes.md``, or one ``--title`` for several files) must
    not overwrite each other's text. The suffix is the text's hash: deterministic, and
    ingesting the same text again finds the same name.
    """
    for candidate in (name, f"{name}#{key}"):
        stored = txn.get("sources", engram._store.blind(b"source", candidate.encode("utf-8", "surrogatepass")))
        if stored is None or bytes(stored) == encoded:
            return candidate
    return f"{name}#{key}"  # a different text already sits under name#key: only a hash collision


def stored_result(engram: Engram, *, source: str | None = None, tags: Iterable[str] | None = None,
                  include_archived: bool = False) -> CompressResult:
    """The stored memories as a :class:`CompressResult` (zettels, tunnels, entity index),
    optionally only those of one ``source`` or carrying all ``tags``, in insertion order.
    Archived memories (tier ``archive``, or archived stubs) are left out unless
    ``include_archived``.
    """
    want_tags = set(tags or ())
    zettels: list[Zettel] = []
    names: list[str] = []
    tunnels: list[Tunnel] = []
    # each memory's source text, so inject_context and wake_up can say who said a quote and when
    load = default_source_loader(engram._store)
    sources: dict[str, str | None] = {}
    source_texts: dict[str, str] = {}
    with engram._store.read() as txn:
        kept: set[str] = set()
        for _docno, node in iter_nodes(txn):
            if source is not None and node.source != source:
                continue
            if want_tags and not want_tags.issubset(node.tags):
                continue
            if not include_archived and (node.tier == "archive" or node.archived):
                continue
            kept.add(node.id)
            names.extend(node.entities)
            zettels.append(Zettel(id=node.id, entities=list(node.entities), topics=list(node.topics),
                                  quote=node.quote or node.content[:200], weight=node.weight,
                                  emotions=list(node.emotions), flags=list(node.flags),
                                  source_start=node.source_start, source_end=node.source_end,
                                  resolved_date=node.resolved_date))
            if node.source and node.source_start is not None:
                if node.source not in sources:
                    sources[node.source] = load(txn, node.source)
                text = sources[node.source]
                if text is not None and node.source_end is not None and node.source_end <= len(text):
                    source_texts[node.id] = text
        for docno, node in iter_nodes(txn):
            if node.id not in kept:
                continue
            for _, edge, _ in engram.indexes.graph.outgoing(txn, docno):
                if edge.kind == "tunnel" and edge.dst in kept:
                    tunnels.append(Tunnel(from_id=edge.src, to_id=edge.dst, label=edge.label))
        table = stored_entities(txn)
    # Names keep the codes of the imported entity table (so tunnel labels such as BN1+BN7 still
    # resolve); other names get codes by compress's rule.
    wanted = set(names)
    index = EntityIndex({}, {})
    for code, name in sorted(table.items()):
        if name in wanted and name not in index.name_to_code:
            index.code_to_name[code] = name
            index.name_to_code[name] = code
    assign_codes(index, names)
    return CompressResult(zettels=zettels, tunnels=tunnels, entity_index=index,
                          meta={"input_length": 0, "chunk_count": len(zettels), "source_texts": source_texts})
