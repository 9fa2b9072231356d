"""Context builders: ``inject_context`` (a budgeted prompt block) and ``wake_up``.

``inject_context`` selection, in order:

1. filters: ``min_weight``, then ``flags`` (keep zettels with any of them);
2. ranking by ``0.7 * weight + 0.3 * bonus`` (bonus 1 for a DECISION, ORIGIN or CORE
   flag), ties by document order; ``selection="mmr"`` trades that score against the
   similarity to zettels already chosen (maximal marginal relevance, lambda 0.7);
   the top ``max_zettels`` are kept;
3. ``guarantee_flags``: for each listed flag no kept zettel has, the heaviest zettel of
   the whole result with it replaces the weakest unguaranteed pick (or is added);
4. ``max_token_budget``: zettels enter (guaranteed ones first, then by rank) only if the
   *rendered* output still fits, measured with ``count_tokens`` (default
   :func:`estimate_tokens`); the output never exceeds the budget. When not even one
   zettel fits, the result is ``""``.

With no zettel chosen every format renders ``""``, not an empty frame (a bare AAAK
header or ``{"zettels": []}`` tells a model nothing and costs tokens). The AAAK format
leaves out the ``@end`` integrity trailer: a prompt is never verified, and the trailer
would eat the budget.

The output lists the chosen zettels in document order; only the tunnels between them
and the entity entries they use are emitted. Source offsets are left out (they index a
text the prompt does not carry).

The default format is markdown, the one a model reads best: one bullet per zettel, with
names spelled out (never entity codes or AAAK escapes), who said the quote and on which
day (from the chat's speaker prefix and date header lines in the source text), its flags,
the other people involved and its first topics::

    - 2023-05-25 · decision · Caroline: “I'm thrilled to make a family for kids who need one.” (mentions Melanie; topics: adoption, support, adoption agencies)

``format="json"`` carries the same (plus ``speaker`` and ``said_on``); ``format="aaak"``
is AAAK with entity codes, for those who ask for it.
"""  # noqa: E501  (the example line above is output, quoted whole)
from __future__ import annotations

import bisect
import json
import math
import re
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from ..errors import ValidationError
from ..tokens import estimate_tokens, token_counter
from ..records import ALL_FLAGS, CompressResult, EntityIndex, Tunnel, Zettel

__all__ = ["Said", "Utterance", "estimate_tokens", "inject_context", "wake_up"]

SIGNAL_BONUS_FLAGS = frozenset({"DECISION", "ORIGIN", "CORE"})
MMR_LAMBDA = 0.7
FORMATS = ("aaak", "json", "markdown")
SELECTIONS = ("weight", "mmr")
WAKE_UP_FLAGS = ("ORIGIN", "CORE", "GENESIS")
WAKE_UP_CAP = 5
_PREFIX = {"ORIGIN": "Origin: ", "CORE": "Core: ", "GENESIS": "Genesis: ", "DECISION": "Decision: ",
           "PIVOT": "Pivot: "}


def _check_result(result: Any) -> CompressResult:
    if not isinstance(result, CompressResult):
        raise ValidationError(
            f"expected a CompressResult, got {type(result).__name__}", hint="pass the value compress() returned"
        )
    return result


def _check_flags(name: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ValidationError(f"{name} must be a list of flags, not a single string", hint=f'e.g. {name}=["DECISION"]')
    out = tuple(value)
    for flag in out:
        if flag not in ALL_FLAGS:
            raise ValidationError(f"unknown flag {flag!r} in {name}", hint=f"flags are {', '.join(ALL_FLAGS)}")
    return out


def _score(z: Zettel) -> float:
    bonus = 1.0 if any(f in SIGNAL_BONUS_FLAGS for f in z.flags) else 0.0
    return 0.7 * z.weight + 0.3 * bonus


def _similarity(a: Zettel, b: Zettel) -> float:
    sa, sb = set(a.topics) | set(a.entities), set(b.topics) | set(b.entities)
    if not sa or not sb:
        return 0.0
    inter = len(sa & sb)
    return inter / (len(sa) + len(sb) - inter)


def _ranked(zettels: Sequence[Zettel], pos: dict[int, int]) -> list[Zettel]:
    return sorted(zettels, key=lambda z: (-_score(z), pos[id(z)]))


def _select(zettels: list[Zettel], n: int, mode: str, pos: dict[int, int]) -> list[Zettel]:
    ranked = _ranked(zettels, pos)
    if mode != "mmr" or len(ranked) <= n:
        return ranked[:n]
    selected: list[Zettel] = []
    pool = ranked
    while len(selected) < n and pool:
        best, best_val = 0, -math.inf
        for k, z in enumerate(pool):
            max_sim = max((_similarity(z, s) for s in selected), default=0.0)
            val = MMR_LAMBDA * _score(z) - (1 - MMR_LAMBDA) * max_sim
            if val > best_val:
                best, best_val = k, val
        selected.append(pool.pop(best))
    return selected


def _guarantee(
    selected: list[Zettel], everything: Sequence[Zettel], flags: tuple[str, ...], pos: dict[int, int]
) -> list[Zettel]:
    out = list(selected)
    for flag in flags:
        if any(flag in z.flags for z in out):
            continue
        chosen = {id(z) for z in out}
        options = [z for z in everything if flag in z.flags and id(z) not in chosen]
        if not options:
            continue
        best = min(options, key=lambda z: (-z.weight, pos[id(z)]))
        victim, victim_key = -1, None
        for k, z in enumerate(out):
            if any(f in z.flags for f in flags):
                continue
            key = (_score(z), -pos[id(z)])
            if victim_key is None or key < victim_key:
                victim, victim_key = k, key
        if victim >= 0:
            out[victim] = best
        else:
            out.append(best)
    return out


def _view(z: Zettel) -> Zettel:
    return Zettel(id=z.id, entities=list(z.entities), topics=list(z.topics), quote=z.quote, weight=z.weight,
                  emotions=list(z.emotions), flags=list(z.flags), resolved_date=z.resolved_date)


def _index_for(zettels: Sequence[Zettel], full: EntityIndex) -> EntityIndex:
    out = EntityIndex()
    for z in zettels:
        for name in z.entities:
            code = full.name_to_code.get(name)
            if code is not None and name not in out.name_to_code:
                out.name_to_code[name] = code
                out.code_to_name[code] = name
    return out


# A chat line's speaker ("Caroline: ...") and a chat date header line ("[2023-05-08]"), as
# engramdb.ingest.messages_to_text writes them.
_SPEAKER = re.compile(r"([^\W\d_][\w.'\- ]{0,40}?):[ \t]+(?=\S)")
_LINE_SPEAKER = re.compile(r"^([^\W\d_][\w.'\- ]{0,40}?):[ \t]+(?=\S)", re.M)
_QUOTE_DATE = re.compile(r"\[(\d{4}-\d{2}-\d{2})[^\]]*\]\s*")
_DATE_HEADER = re.compile(r"^\[(\d{4}-\d{2}-\d{2})[^\]\n]*\][ \t]*$", re.M)


@dataclass(frozen=True)
class Utterance:
    """One speaker's words within a quote."""

    text: str
    speaker: str | None
    on: str | None


@dataclass(frozen=True)
class Said:
    """Who said a zettel's quote, and when (what a model needs to read it right).

    A quote may run over several chat lines; each line is an :class:`Utterance` with its own
    speaker and day.

    Attributes:
        parts: the quote's utterances, in order (consecutive lines of one speaker on one day
            are one utterance).
        about: the zettel's ``resolved_date`` when it differs from the day the quote was
            said (the quote speaks of another time, "last year"), else None.
    """

    parts: tuple[Utterance, ...]
    about: str | None = None

    @property
    def quote(self) -> str:
        """The quote's words, without speaker prefixes or date headers."""
        return " ".join(u.text for u in self.parts)

    @property
    def speaker(self) -> str | None:
        """Who said the quote's first words (None when unknown)."""
        return self.parts[0].speaker if self.parts else None

    @property
    def on(self) -> str | None:
        """The day the quote's first words were said (None when unknown)."""
        return self.parts[0].on if self.parts else None


class _Attribution:
    """Finds who said each zettel's quote and when, in the text it came from: the result's
    ``meta["source"]`` (compress keeps it) or ``meta["source_texts"][zettel id]`` (stored
    memories). A ``Name:`` prefix counts as a speaker when the name is one of the result's
    entities or starts at least two lines of the text (a transcript), so "Note: ..." in
    prose does not. The day is the last ``[YYYY-MM-DD]`` header line before the words."""

    def __init__(self, result: CompressResult) -> None:
        self.result = result
        self.names = set(result.entity_index.name_to_code)
        self._speakers: dict[int, set[str]] = {}
        self._dates: dict[int, tuple[list[int], list[str]]] = {}

    def _text(self, z: Zettel) -> str | None:
        texts = self.result.meta.get("source_texts")
        text = texts.get(z.id) if isinstance(texts, dict) else None
        if text is None:
            text = self.result.meta.get("source")
        return text if isinstance(text, str) else None

    def _is_speaker(self, name: str, z: Zettel, text: str | None) -> bool:
        if name in z.entities or name in self.names:
            return True
        if text is None:
            return False
        known = self._speakers.get(id(text))
        if known is None:
            counts: dict[str, int] = {}
            for m in _LINE_SPEAKER.finditer(text):
                counts[m.group(1)] = counts.get(m.group(1), 0) + 1
            known = self._speakers[id(text)] = {n for n, c in counts.items() if c >= 2}
        return name in known

    def _date_before(self, text: str, at: int) -> str | None:
        table = self._dates.get(id(text))
        if table is None:
            found = [(m.start(), m.group(1)) for m in _DATE_HEADER.finditer(text)]
            table = self._dates[id(text)] = ([p for p, _ in found], [d for _, d in found])
        k = bisect.bisect_right(table[0], at)
        return table[1][k - 1] if k else None

    def __call__(self, z: Zettel) -> Said:
        text = self._text(z)
        speaker: str | None = None
        on: str | None = None
        if text is not None:  # who was speaking, and on which day, where the quote starts
            lo = z.source_start if z.source_start is not None else 0
            hi = z.source_end if z.source_end is not None else len(text)
            head = next((ln.strip() for ln in z.quote.splitlines() if ln.strip()), "")  # its first line
            at = text.find(head, lo, hi) if head else -1
            if at < 0:
                at = lo
            line = text.rfind("\n", 0, at) + 1
            m = _SPEAKER.match(text, line)
            if m is not None and m.end() <= at + 1 and self._is_speaker(m.group(1), z, text):
                speaker = m.group(1)
            on = self._date_before(text, at)
        said_on = on
        parts: list[Utterance] = []
        for raw in z.quote.splitlines():
            words = " ".join(raw.split())
            header = _QUOTE_DATE.fullmatch(words) or _QUOTE_DATE.match(words)
            if header is not None:
                on = header.group(1)
                words = words[header.end():]
            m = _SPEAKER.match(words)
            if m is not None and self._is_speaker(m.group(1), z, text):
                speaker, words = m.group(1), words[m.end():]
            if not words:
                continue
            if parts and parts[-1].speaker == speaker and parts[-1].on == on:
                parts[-1] = Utterance(f"{parts[-1].text} {words}", speaker, on)
            else:
                parts.append(Utterance(words, speaker, on))
        first_on = parts[0].on if parts else said_on
        if parts and first_on is None and z.resolved_date:
            parts[0] = Utterance(parts[0].text, parts[0].speaker, z.resolved_date)
        about = z.resolved_date if first_on and z.resolved_date and z.resolved_date != first_on else None
        return Said(parts=tuple(parts), about=about)


def _quoted(text: str) -> str:
    return f"\u201c{text}\u201d" if text else ""


def _utterances(said: Said, verb: str) -> str:
    """``Speaker<verb> “words”``, then each later utterance with its own day when it changes."""
    out = []
    day = said.on
    for k, u in enumerate(said.parts):
        when = f"on {u.on}, " if k and u.on and u.on != day else ""
        day = u.on or day
        who = f"{u.speaker}{verb} " if u.speaker else ""
        out.append(f"{when}{who}{_quoted(u.text)}")
    return "; ".join(out)


def _markdown_line(z: Zettel, said: Said) -> str:
    """One bullet: date, flags, who said what, then the other people and the topics."""
    head = []
    if said.on:
        head.append(said.on + (f" (about {said.about})" if said.about else ""))
    head.extend(f.lower() for f in z.flags)
    body = _utterances(said, ":") or ", ".join(z.topics[:3]) or f"memory {z.id}"
    line = "- " + " \u00b7 ".join([*head, body])
    extra = []
    speakers = {u.speaker for u in said.parts}
    others = [e for e in z.entities if e not in speakers]
    if others:
        extra.append("mentions " + ", ".join(others))
    if z.topics and said.parts:
        extra.append("topics: " + ", ".join(z.topics[:3]))
    return line + (f" ({'; '.join(extra)})" if extra else "")


class _Renderer:
    def __init__(self, result: CompressResult, fmt: str) -> None:
        self.result = result
        self.fmt = fmt
        self.meta = {k: result.meta[k] for k in ("date", "title") if isinstance(result.meta.get(k), str)}
        self.said = _Attribution(result)
        self._said: dict[int, Said] = {}
        if fmt == "aaak":
            from ..aaak import encode  # lazy: aaak is only needed for this format

            self.encode = encode

    def render(self, chosen: Sequence[Zettel], pos: dict[int, int]) -> str:
        if not chosen:
            return ""
        ordered = sorted(chosen, key=lambda z: pos[id(z)])
        ids = {z.id for z in ordered}
        tunnels = [
            Tunnel(t.from_id, t.to_id, t.label) for t in self.result.tunnels if t.from_id in ids and t.to_id in ids
        ]
        if self.fmt == "markdown":
            return "\n".join(self.line(z) for z in ordered)
        views = [_view(z) for z in ordered]
        if self.fmt == "json":
            said = [self.attribution(z) for z in ordered]
            doc = {
                "zettels": [
                    {"id": z.id, "entities": z.entities, "topics": z.topics, "quote": z.quote, "weight": z.weight,
                     "emotions": z.emotions, "flags": z.flags, "resolved_date": z.resolved_date,
                     "speaker": w.speaker, "said_on": w.on,
                     "said": [{"speaker": u.speaker, "on": u.on, "text": u.text} for u in w.parts]}
                    for z, w in zip(views, said)
                ],
                "tunnels": [{"from_id": t.from_id, "to_id": t.to_id, "label": t.label} for t in tunnels],
            }
            return json.dumps(doc, indent=2, ensure_ascii=False)
        sub = CompressResult(zettels=views, tunnels=tunnels, entity_index=_index_for(views, self.result.entity_index),
                             meta=dict(self.meta))
        text = self.encode(sub)
        # encode() always ends with the "@end <count> <sha256>" line: drop that last line
        return text[: text.rindex("\n", 0, len(text) - 1) + 1]

    def attribution(self, z: Zettel) -> Said:
        said = self._said.get(id(z))
        if said is None:
            said = self._said[id(z)] = self.said(z)
        return said

    def line(self, z: Zettel) -> str:
        return _markdown_line(z, self.attribution(z))

    def lower_bound_text(self, z: Zettel) -> str:
        # text every rendering that includes z contains, for skipping hopeless candidates
        return self.line(z) if self.fmt == "markdown" else z.quote


def _fit(
    renderer: _Renderer, ordered: list[Zettel], budget: int, count: Callable[[str], int], pos: dict[int, int]
) -> str:
    chosen: list[Zettel] = []
    best = ""
    # Adding a zettel's count to the text's so far is no lower bound of the joined text's count:
    # estimate_tokens' ceilings and its word or character floor, or a counter's fixed overhead (a
    # tokenizer's BOS token), count the parts' sum above the joined text, which left out zettels
    # that fit. Markdown under estimate_tokens is counted exactly without rendering (its lines
    # are joined by "\n": words and characters add up); otherwise only a zettel whose own text
    # alone is over the budget is skipped unrendered.
    exact = renderer.fmt == "markdown" and count is estimate_tokens
    words = chars = 0  # of best, for the exact count
    for z in ordered:
        low = renderer.lower_bound_text(z)
        if exact:
            w, c = words + len(low.split()), chars + len(low) + (1 if chosen else 0)
            if max(-(-13 * w // 10), -(-c // 4)) > budget:
                continue
        elif count(low) > budget:
            continue
        attempt = renderer.render(chosen + [z], pos)
        if count(attempt) <= budget:
            chosen.append(z)
            best = attempt
            words, chars = len(best.split()), len(best)
    return best


def inject_context(
    result: CompressResult,
    *,
    max_zettels: int | None = 10,
    selection: str = "weight",
    guarantee_flags: Iterable[str] | None = None,
    min_weight: float | None = None,
    flags: Iterable[str] | None = None,
    format: str = "markdown",
    max_token_budget: int | None = None,
    count_tokens: Callable[[str], int] | None = None,
) -> str:
    """Render the most important zettels of ``result`` as a context block for a prompt.

    Args:
        result: a compress result.
        max_zettels: keep at most this many (``None``: no cap).
        selection: ``"weight"`` or ``"mmr"`` (penalize near-duplicates).
        guarantee_flags: flags that must be represented if any zettel has them.
        min_weight: drop zettels lighter than this.
        flags: keep only zettels with at least one of these flags.
        format: ``"markdown"`` (the default: one bullet per memory, names spelled out,
            who said it and when), ``"json"`` (the same, structured) or ``"aaak"`` (AAAK with
            entity codes: denser, but a model reads it less well).
        max_token_budget: hard ceiling on the tokens of the returned text.
        count_tokens: the token counter for the budget (default :func:`estimate_tokens`).

    Returns:
        The rendered text (``""`` when no zettel is chosen or none fits the budget).

    Raises:
        ValidationError: a bad argument, an unknown flag, a counter that fails or
            returns something other than a non-negative int, or a ``max_token_budget``
            below the counter's count of ``""`` (no text fits it).
    """
    result = _check_result(result)
    # NumPy numbers (pandas rows give them) as their Python values, as recall takes them
    if isinstance(max_zettels, np.integer):
        max_zettels = int(max_zettels)
    if isinstance(max_token_budget, np.integer):
        max_token_budget = int(max_token_budget)
    if isinstance(min_weight, (np.integer, np.floating)):
        min_weight = float(min_weight)
    if max_zettels is not None and (
        isinstance(max_zettels, bool) or not isinstance(max_zettels, int) or max_zettels < 0
    ):
        raise ValidationError(f"max_zettels must be a non-negative integer or None, got {max_zettels!r}",
                              hint="e.g. inject_context(result, max_zettels=10) (the default); None for no cap")
    if selection not in SELECTIONS:
        raise ValidationError(f"selection must be one of {', '.join(SELECTIONS)}, got {selection!r}",
                              hint="e.g. inject_context(result, selection=\"mmr\")")
    if format not in FORMATS:
        raise ValidationError(f"format must be one of {', '.join(FORMATS)}, got {format!r}",
                              hint="e.g. inject_context(result, format=\"markdown\") (the default)")
    if min_weight is not None and (isinstance(min_weight, bool) or not isinstance(min_weight, (int, float))
                                   or not math.isfinite(min_weight)):
        raise ValidationError(f"min_weight must be a finite number or None, got {min_weight!r}",
                              hint="e.g. inject_context(result, min_weight=0.5); None keeps every weight")
    if max_token_budget is not None and (isinstance(max_token_budget, bool) or not isinstance(max_token_budget, int)
                                         or max_token_budget < 0):
        raise ValidationError(f"max_token_budget must be a non-negative integer or None, got {max_token_budget!r}",
                              hint="e.g. inject_context(result, max_token_budget=2000); None for no budget")
    guarantees = _check_flags("guarantee_flags", guarantee_flags)
    wanted = _check_flags("flags", flags)
    count = token_counter(count_tokens)
    if max_token_budget is not None:
        # the budget is a hard limit on the text as returned (spec/recall.md 2), as in
        # recall_context: under one below the count of "", not even "" fits, and returning it
        # would exceed the budget without a word
        empty = count("")
        if empty > max_token_budget:
            raise ValidationError(f"count_tokens counts {empty} tokens in the empty text, more than "
                                  f"max_token_budget={max_token_budget}: no context can fit",
                                  hint=f"raise max_token_budget to at least {empty} plus the zettels' tokens")

    everything = list(result.zettels)
    pos = {id(z): k for k, z in enumerate(everything)}
    chosen = everything
    if min_weight is not None:
        chosen = [z for z in chosen if z.weight >= min_weight]
    if wanted:
        chosen = [z for z in chosen if any(f in z.flags for f in wanted)]
    if max_zettels is not None:
        chosen = _select(chosen, max_zettels, selection, pos)
    if guarantees:
        chosen = _guarantee(chosen, everything, guarantees, pos)

    renderer = _Renderer(result, format)
    if max_token_budget is None:
        return renderer.render(chosen, pos)
    guaranteed = [z for z in chosen if any(f in z.flags for f in guarantees)]
    rest = [z for z in chosen if not any(f in z.flags for f in guarantees)]
    ordered = _ranked(guaranteed, pos) + _ranked(rest, pos)
    return _fit(renderer, ordered, max_token_budget, count, pos)


def _sentence(z: Zettel, said: Said) -> str:
    prefix = next((_PREFIX[f] for f in ("ORIGIN", "CORE", "GENESIS", "DECISION", "PIVOT") if f in z.flags), "")
    when = f"On {said.on}" if said.on else ""
    if not said.parts:
        what = ", ".join(z.topics) or ", ".join(z.entities) or f"Zettel {z.id}"
        if what[-1] not in ".!?\"'\u201d\u2019)":
            what += "."
        return f"{prefix}{when}{': ' if when else ''}{what}"
    what = _utterances(said, " said:")
    sep = ", " if said.speaker else ": "
    return f"{prefix}{when}{sep if when else ''}{what}"


def wake_up(result: CompressResult, top_pct: float = 0.15) -> str:
    """A short narrative of the key moments: the top ``top_pct`` of zettels by weight
    plus every ORIGIN, CORE and GENESIS zettel, the heaviest 5 of those, told in
    document order, one line each, keeping who said each quote and when
    (``Decision: On 2023-05-25, Caroline said: “I'm thrilled to ...”``; see :class:`Said`).
    Never empty when the result has zettels.

    Raises:
        ValidationError: ``result`` is not a CompressResult or ``top_pct`` is not in (0, 1].
    """
    result = _check_result(result)
    if isinstance(top_pct, bool) or not isinstance(top_pct, (int, float)) or not 0.0 < top_pct <= 1.0:
        raise ValidationError(f"top_pct must be in (0, 1], got {top_pct!r}", hint="the default is 0.15")
    zettels = result.zettels
    if not zettels:
        return ""
    by_weight = sorted(range(len(zettels)), key=lambda i: (-zettels[i].weight, i))
    take = max(1, math.ceil(top_pct * len(zettels)))
    picked = set(by_weight[:take])
    picked.update(i for i, z in enumerate(zettels) if any(f in z.flags for f in WAKE_UP_FLAGS))
    top = sorted(picked, key=lambda i: (-zettels[i].weight, i))[:WAKE_UP_CAP]
    said = _Attribution(result)
    return "\n".join(_sentence(zettels[i], said(zettels[i])) for i in sorted(top))
