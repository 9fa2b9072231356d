"""The deterministic fact extractor: what a finished trajectory teaches that outlives it.

Without a model, ``after_task`` forms facts from patterns (spec/agent.md section 2.2):
stated preferences and constraints ("only the standard library", "no argparse"),
storage shapes (file names with their fields), decisions, and the testing approach. Each
fact names the task it came from, so that it is found again for related tasks and not
for unrelated ones, and environment noise (absolute paths, temp dirs, hostnames) is
scrubbed out.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from collections.abc import Iterable, Iterator

from .serialize import SerializedConversation
from .text import scrub

__all__ = ["Fact", "extract_facts", "task_summary"]

MAX_FACT = 400
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])|\n+")
_CONSTRAINT = re.compile(
    r"\b(?:only|no|not|never|without|avoid|don'?t|do not|must(?:n'?t)?|always|prefer(?:s|red)?|instead of|"
    r"make sure|keep it)\b", re.IGNORECASE)
_INSTRUCTION = re.compile(r"^(?:please\s+)?(?:use|stick to|keep|write|follow|format|name|put|colou?r|print|show|"
                          r"log|indent|document|comment|handle|support|return|exit)\b|"
                          r"\b(?:i (?:want|like|prefer|need)|i'?d (?:like|prefer)|we (?:want|need|prefer))\b",
                          re.IGNORECASE)
_DECISION = re.compile(r"\b(?:decided|decision|we'?ll use|i'?ll use|let'?s use|chose|choose|going with|went with|"
                       r"switched to|settled on|opted for)\b", re.IGNORECASE)
_TESTING = re.compile(r"\b(?:unittest|pytest|doctest|tests?|testing|tdd|test suite|coverage)\b", re.IGNORECASE)
_TEST_COMMAND = re.compile(r"\b(?:python3? -m (?:unittest|pytest)(?: [\w./:-]+)*|pytest(?: [\w./:-]+)*|"
                           r"npm (?:run )?test|go test(?: [\w./-]+)*|cargo test)")
_FILE = re.compile(r"(?<![\w/.-])(\.?[A-Za-z_][\w-]*\.(?:json|jsonl|csv|tsv|db|sqlite3?|ya?ml|toml|ini|xml|txt|"
                   r"parquet|md))\b")
# No \s* before an alternative that starts with \s: the split between them made a run of
# blanks quadratic (60,000 blanks: 10 s).
_FIELD_LIST = re.compile(r"\b(?:with|fields?|keys?|columns?|containing|holding|has|have)(?:\s*:\s+|\s+)"
                         r"((?:`?[A-Za-z_]\w*`?(?:\s*,\s*|\s+and\s+|\s*\(\w+\)\s*,?\s*)){1,15}`?[A-Za-z_]\w*`?)")
# A dict literal without nested braces; its body is checked by _dict_body (one regex for the
# whole literal, entries repeated with optional commas, backtracked exponentially when the
# literal did not close, e.g. at a nested dict: 20 entries took seconds, 30 hours).
_BRACES = re.compile(r"\{([^{}]*)\}")
_KEY = re.compile(r"[\"']([A-Za-z_]\w*)[\"']\s*:")
_CODE_ARGS = ("content", "file_text", "new_str", "new_string", "text", "code", "patch", "command", "cmd")


@dataclass(frozen=True)
class Fact:
    """A fact and its kind (``preference``, ``storage``, ``approach`` or ``task``)."""

    text: str
    kind: str


def _sentences(text: str) -> list[str]:
    return [s.strip(" \t-*•>") for s in _SENTENCE.split(text) if s and s.strip(" \t-*•>")]


def task_summary(conv: SerializedConversation, limit: int = 100) -> str:
    """The task, as the first sentence of the first user prompt (scrubbed, without its final stop)."""
    first = next((turn.user for turn in conv.turns if turn.user.strip()), "")
    sentences = _sentences(scrub(first))
    if not sentences:
        return ""
    summary = sentences[0].rstrip(".!?:;, ")
    if len(summary) > limit:
        summary = summary[:limit].rsplit(" ", 1)[0]
    return summary[:1].lower() + summary[1:] if summary[1:2].islower() else summary


def _join(parts: Iterable[str], limit: int) -> str:
    out: list[str] = []
    size = 0
    for part in parts:
        part = part.strip()
        if not part:
            continue
        if not part.endswith((".", "!", "?")):
            part += "."
        if size + len(part) + 1 > limit:
            break
        out.append(part)
        size += len(part) + 1
    return " ".join(out)


def _fields(m: re.Match[str] | None) -> list[str]:
    """The field names of a ``_FIELD_LIST`` match."""
    if not m:
        return []
    return [f.strip("` ") for f in re.split(r",|\band\b|\(\w+\)", m.group(1)) if f.strip("` ")]


def _call_texts(conv: SerializedConversation) -> list[str]:
    """The code and commands tool calls carried (the values of content-like arguments)."""
    texts = []
    for turn in conv.turns:
        for call in turn.tool_calls:
            args = call.arguments
            if isinstance(args, dict):
                for key in _CODE_ARGS:
                    if isinstance(args.get(key), str):
                        texts.append(args[key])
                if isinstance(args.get("path"), str) or isinstance(args.get("file_path"), str):
                    texts.append(str(args.get("path") or args.get("file_path")))
            elif isinstance(args, str):
                texts.append(args)
    return texts


def _dict_bodies(text: str) -> Iterator[str]:
    """The bodies of the brace pairs of ``text`` (no braces inside) made only of entries
    ``"key": value`` (values without commas; the commas between entries optional, a trailing
    one allowed) with at least two keys, in order."""
    for m in _BRACES.finditer(text):
        chunks = m.group(1).split(",")
        if len(chunks) > 1 and not chunks[-1].strip():
            chunks.pop()  # a trailing comma
        if all(_KEY.match(chunk.lstrip()) for chunk in chunks) and len(_KEY.findall(m.group(1))) >= 2:
            yield m.group(1).lstrip()


def _storage(user_text: str, code: list[str]) -> list[tuple[str, list[str]]]:
    """(file name, fields) for every data file named by the user or written by a tool."""
    shapes: dict[str, list[str]] = {}
    for sentence in _sentences(user_text):
        # the first field list after each name: one search serves every name before the list
        # it found (a search per name read the rest of the sentence each time: quadratic)
        found: re.Match[str] | None = None
        searched = False
        for m in _FILE.finditer(sentence):
            name = m.group(1)
            if name.lower().endswith(".md"):
                continue
            if not searched or (found is not None and found.start() < m.end()):
                found, searched = _FIELD_LIST.search(sentence, m.end()), True
            fields = _fields(found)
            if fields or name not in shapes:
                shapes[name] = shapes.get(name) or fields
    for text in code:
        names = [m.group(1) for m in _FILE.finditer(text) if not m.group(1).lower().endswith(".md")]
        keys: list[str] = []
        for body in _dict_bodies(text):
            keys = list(dict.fromkeys(_KEY.findall(body)))
            if len(keys) >= 2:
                break
        for name in names:
            if not shapes.get(name):
                shapes[name] = keys
    return [(name, fields) for name, fields in shapes.items()]


def extract_facts(conv: SerializedConversation, *, outcome: str | None = None, limit: int = 3) -> list[Fact]:
    """Up to ``limit`` facts from a trajectory, most durable first: preferences and
    constraints, storage shapes, then the approach (decisions and testing). When none of
    these appears, one ``task`` fact says what was done and how it ended.
    """
    task = task_summary(conv)
    context = f" (from: {task})" if task else ""
    user_text = scrub("\n".join(turn.user for turn in conv.turns))
    assistant_text = scrub("\n".join(turn.assistant for turn in conv.turns))
    code = _call_texts(conv)

    constraints, instructions, testing, decisions = [], [], [], []
    for sentence in _sentences(user_text):
        if sentence.endswith("?") or len(sentence) > 300:
            continue
        is_test = bool(_TESTING.search(sentence))
        if _CONSTRAINT.search(sentence):
            constraints.append(sentence)
        elif _INSTRUCTION.search(sentence) and not is_test and not _FILE.search(sentence):
            instructions.append(sentence)
        if is_test:
            testing.append(sentence)
        if _DECISION.search(sentence):
            decisions.append(sentence)
    for sentence in _sentences(assistant_text):
        if _DECISION.search(sentence) and not sentence.endswith("?") and len(sentence) <= 300:
            decisions.append(sentence)

    facts: list[Fact] = []
    preferences = list(dict.fromkeys(constraints + instructions))
    if preferences:
        facts.append(Fact("Preferences" + context + ": " + _join(preferences, MAX_FACT - 40), "preference"))
    shapes = [(name, fields) for name, fields in _storage(user_text, [scrub(c) for c in code]) if fields]
    if shapes:
        parts = [f"{name} holds records with the fields {', '.join(fields)}" for name, fields in shapes[:3]]
        facts.append(Fact("Storage shape" + context + ": " + _join(parts, MAX_FACT - 40), "storage"))
    commands = list(dict.fromkeys(m.group(0) for text in code for m in _TEST_COMMAND.finditer(scrub(text))))
    approach = list(dict.fromkeys(decisions[:2] + testing[:2]))
    if commands:
        approach.append("Tests run with " + ", ".join(commands[:2]))
    if approach:
        facts.append(Fact("Approach" + context + ": " + _join(approach, MAX_FACT - 40), "approach"))
    if not facts and task:
        ended = f" ({outcome})" if outcome else ""
        facts.append(Fact(f"Task{ended}: {task}.", "task"))
    return [Fact(scrub(f.text)[:MAX_FACT], f.kind) for f in facts[:limit]]

