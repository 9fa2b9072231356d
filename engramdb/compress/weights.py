"""Weights: raw importance of a chunk, centrality blending and rank normalization.

* Raw weight: ``min(0.35 * signal flags, 0.9) + min(0.1 * emotions, 0.4)
  + 0.5 * decision-word density``, clamped to 1 and rounded to 2 decimals. The signal
  flags are DECISION, ORIGIN, CORE, PIVOT and GENESIS; TECHNICAL never changes weight.
* Centrality: ``0.8 * weight + 0.2 * degree / max degree`` over the tunnel graph, so a
  zettel many tunnels touch is more central (LexRank's intuition per zettel).
* Normalization: weights become ranks with tie-aware midranks (equal raw scores get
  equal weights; input order never matters), scaled to ``[0, 1/temperature]``,
  softmaxed and min-max mapped to ``[0, 1]``, rounded half-up to 2 decimals.

``exp`` here is :func:`det_exp`, built from IEEE-exact operations only, so weights are
the same on every machine (a platform ``libm`` may differ in the last bit).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from ..errors import ValidationError
from ..records import Tunnel, Zettel
from .signals import Signals

__all__ = [
    "CENTRALITY_BLEND",
    "SIGNAL_FLAGS",
    "blend_centrality",
    "decay_factor",
    "det_exp",
    "normalize_weights",
    "raw_weight",
    "round2",
]

SIGNAL_FLAGS = frozenset({"DECISION", "ORIGIN", "CORE", "PIVOT", "GENESIS"})
CENTRALITY_BLEND = 0.2
_LN2 = 0.6931471805599453


def det_exp(x: float) -> float:
    """``e**x`` from +, *, / and ldexp only: identical on every IEEE-754 machine."""
    if x > 700.0:
        return math.inf
    if x < -745.0:
        return 0.0
    k = math.floor(x / _LN2 + 0.5)
    r = x - k * _LN2  # |r| <= ln2 / 2
    term = 1.0
    total = 1.0
    for i in range(1, 18):  # 17 Taylor terms: well past double precision for |r| < 0.35
        term = term * r / i
        total += term
    return math.ldexp(total, k)


def round2(x: float) -> float:
    """Round half-up to 2 decimals (``Math.round(x * 100) / 100``) for ``x >= 0``."""
    return math.floor(x * 100.0 + 0.5) / 100.0


def raw_weight(signals: Signals) -> float:
    """The un-normalized importance of a chunk from its signals."""
    signal_flags = sum(1 for f in signals.flags if f in SIGNAL_FLAGS)
    flag_score = min(signal_flags * 0.35, 0.9)
    emotion_score = min(len(signals.emotions) * 0.1, 0.4)
    density = signals.decision_count / signals.word_count if signals.word_count else 0.0
    return round2(min(flag_score + emotion_score + density * 0.5, 1.0))


def blend_centrality(zettels: Sequence[Zettel], tunnels: Iterable[Tunnel]) -> None:
    """Blend tunnel degree centrality into each zettel's weight, in place."""
    if not zettels:
        return
    degree: dict[str, int] = {}
    for t in tunnels:
        degree[t.from_id] = degree.get(t.from_id, 0) + 1
        degree[t.to_id] = degree.get(t.to_id, 0) + 1
    top = max(degree.values(), default=0)
    for z in zettels:
        centrality = degree.get(z.id, 0) / top if top else 0.0
        z.weight = (1.0 - CENTRALITY_BLEND) * z.weight + CENTRALITY_BLEND * centrality


def normalize_weights(zettels: Sequence[Zettel], temperature: float = 0.5) -> None:
    """Rank-normalize the weights of ``zettels`` onto ``[0, 1]``, in place.

    With one zettel the weight is left as is (there is no rank to spread).

    Raises:
        ValidationError: ``temperature`` is not a positive finite number, or an item is
            not a Zettel with a finite numeric weight.
    """
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
        math.isfinite(temperature) and temperature > 0
    ):
        raise ValidationError(f"temperature must be a positive number, got {temperature!r}", hint="the default is 0.5")
    for z in zettels:
        if not isinstance(z, Zettel) or isinstance(z.weight, bool) or not isinstance(z.weight, (int, float)) \
                or not math.isfinite(z.weight):
            raise ValidationError("normalize_weights takes Zettels with finite numeric weights",
                                  hint="pass result.zettels from compress()")
    n = len(zettels)
    if n <= 1:
        return
    order = sorted(range(n), key=lambda i: zettels[i].weight)
    midrank = [0.0] * n
    k = 0
    while k < n:
        j = k
        w = zettels[order[k]].weight
        while j + 1 < n and zettels[order[j + 1]].weight == w:
            j += 1
        avg = (k + j) / 2
        for t in range(k, j + 1):
            midrank[order[t]] = avg
        k = j + 1
    scaled = [r / (n - 1) / temperature for r in midrank]
    top = max(scaled)
    # softmax followed by min-max: the softmax denominator cancels, so min-max the exps
    exps = [det_exp(s - top) for s in scaled]
    lo, hi = min(exps), max(exps)
    for z, e in zip(zettels, exps):
        z.weight = round2((e - lo) / (hi - lo)) if hi > lo else 1.0


def decay_factor(age: int, half_life: float | None) -> float:
    """``0.5 ** (age / half_life)`` (1.0 without a half-life), deterministically."""
    if half_life is None or half_life <= 0 or age <= 0:
        return 1.0
    return det_exp(-(age / half_life) * _LN2)
