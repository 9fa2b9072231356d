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
"""
from __future__ import annotations

import json
import math
from typing import Any, Callable, Iterable, Sequence

from ..errors import ValidationError
from ..tokens import estimate_tokens, token_counter
from ..records import ALL_FLAGS, CompressResult, EntityIndex, Tunnel, Zettel

__all__ = ["estimate_tokens", "inject_context", "wake_up"]

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


def _markdown_line(z: Zettel) -> str:
    parts = []
    if z.resolved_date:
        parts.append(z.resolved_date)
    if z.flags:
        parts.append(", ".join(z.flags))
    head = f"**[{z.id}]** *({' · '.join(parts)})* " if parts else f"**[{z.id}]** "
    return head + z.quote


class _Renderer:
    def __init__(self, result: CompressResult, fmt: str) -> None:
        self.result = result
        self.fmt = fmt
        self.meta = {k: result.meta[k] for k in ("date", "title") if isinstance(result.meta.get(k), str)}
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
        views = [_view(z) for z in ordered]
        if self.fmt == "markdown":
            return "\n\n".join(_markdown_line(z) for z in views)
        if self.fmt == "json":
            doc = {
                "zettels": [
                    {"id": z.id, "entities": z.entities, "topics": z.topics, "quote": z.quote, "weight": z.weight,
                     "emotions": z.emotions, "flags": z.flags, "resolved_date": z.resolved_date}
                    for z in views
                ],
                "tunnels": [{"from_id": t.from_id, "to_id": t.to_id, "label": t.label} for t in tunnels],
            }
            return json.dumps(doc, indent=2, ensure_ascii=False)
        sub = CompressResult(zettels=views, tunnels=tunnels, entity_index=_index_for(views, self.result.entity_index),
                             meta=dict(self.meta))
        doc = self.encode(sub)
        # encode() always ends with the "@end <count> <sha256>" line: drop that last line
        return doc[: doc.rindex("\n", 0, len(doc) - 1) + 1]

    def lower_bound_text(self, z: Zettel) -> str:
        # text every rendering that includes z contains, for skipping hopeless candidates
        return _markdown_line(z) if self.fmt == "markdown" else z.quote


def _fit(
    renderer: _Renderer, ordered: list[Zettel], budget: int, count: Callable[[str], int], pos: dict[int, int]
) -> str:
    chosen: list[Zettel] = []
    best, used = "", 0
    for z in ordered:
        if used + count(renderer.lower_bound_text(z)) > budget:
            continue
        attempt = renderer.render(chosen + [z], pos)
        tokens = count(attempt)
        if tokens <= budget:
            chosen.append(z)
            best, used = attempt, tokens
    return best


def inject_context(
    result: CompressResult,
    *,
    max_zettels: int | None = 10,
    selection: str = "weight",
    guarantee_flags: Iterable[str] | None = None,
    min_weight: float | None = None,
    flags: Iterable[str] | None = None,
    format: str = "aaak",
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
        format: ``"aaak"``, ``"json"`` or ``"markdown"``.
        max_token_budget: hard ceiling on the tokens of the returned text.
        count_tokens: the token counter for the budget (default :func:`estimate_tokens`).

    Returns:
        The rendered text (``""`` when no zettel is chosen or none fits the budget).

    Raises:
        ValidationError: a bad argument, an unknown flag, or a counter that fails or
            returns something other than a non-negative int.
    """
    result = _check_result(result)
    if max_zettels is not None and (
        isinstance(max_zettels, bool) or not isinstance(max_zettels, int) or max_zettels < 0
    ):
        raise ValidationError("max_zettels must be a non-negative integer or None")
    if selection not in SELECTIONS:
        raise ValidationError(f"selection must be one of {', '.join(SELECTIONS)}, got {selection!r}")
    if format not in FORMATS:
        raise ValidationError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if min_weight is not None and (isinstance(min_weight, bool) or not isinstance(min_weight, (int, float))
                                   or not math.isfinite(min_weight)):
        raise ValidationError("min_weight must be a finite number or None")
    if max_token_budget is not None and (isinstance(max_token_budget, bool) or not isinstance(max_token_budget, int)
                                         or max_token_budget < 0):
        raise ValidationError("max_token_budget must be a non-negative integer or None")
    guarantees = _check_flags("guarantee_flags", guarantee_flags)
    wanted = _check_flags("flags", flags)
    count = token_counter(count_tokens)

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


def _sentence(z: Zettel) -> str:
    text = z.quote.strip() or ", ".join(z.topics) or ", ".join(z.entities) or f"Zettel {z.id}"
    prefix = next((_PREFIX[f] for f in ("ORIGIN", "CORE", "GENESIS", "DECISION", "PIVOT") if f in z.flags), "")
    if text[-1] not in ".!?\"'\u201d\u2019)":
        text += "."
    return prefix + text


def wake_up(result: CompressResult, top_pct: float = 0.15) -> str:
    """A short narrative of the key moments: the top ``top_pct`` of zettels by weight
    plus every ORIGIN, CORE and GENESIS zettel, the heaviest 5 of those, told in
    document order. Never empty when the result has zettels.

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
    return " ".join(_sentence(zettels[i]) for i in sorted(top))
