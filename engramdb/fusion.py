"""How recall fuses its retrievers: the weights (:class:`FusionWeights`) and the fused score.

Recall ranks candidates with BM25 and with every embedding space that can embed the
query (each ranking already spread one hop); this module turns those rankings into one
score per candidate (spec/recall.md, "Fusion"). It is pure arithmetic over the rankings:
no I/O, no hashing order, so it is deterministic.

For one retriever ``i`` with weight ``w_i`` and a candidate at rank ``r`` whose score
(plus hop share) is ``s``, with ``n(s)`` that score normalised over the ranking::

    part_i = w_i * ((1 - score_mix) / (rrf_k + r) + score_mix * n(s) / (rrf_k + 1))

``normalize = "z"``: ``n(s) = max(0, (s - mean) / std)`` over the ranking's candidates (how
far a candidate stands out of its own retriever's pool; BM25's and a model's scores have
unrelated scales, their standard scores do not); ``"max"``: ``n(s) = s / s_max``.
``score_mix = 0`` is weighted reciprocal rank fusion, 1 a weighted sum of normalised
scores. The candidates are ordered by the sum of their parts, and the fused score is
``1 / (rrf_k + rank)`` of that order (equal sums share a rank): the boosts applied after fusion (tier, date, the query
features) act on the same rank spacing whatever the signals, so a space that counts for
nothing leaves BM25's order and boosts as they are alone. With a single non-empty
ranking (BM25 alone, or one space alone) the fused score is that ranking's weighted rank
fusion ``w / (rrf_k + r)``.

BM25 weighs ``bm25``. A space weighs its own weight (``spaces`` by the space's name, else
``models`` by the id of the model that made its vectors, else ``vector``) times its trust::

    agree = (overlap / agreement_depth) ** agreement_power
    confident = clip((standout - standout_floor) / standout_span, 0, 1)
    related = clip((lift - lift_floor) / lift_span, 0, 1)
    trust = agree + (1 - agree) * max(confident, (1 - strength) * max(weak_match_trust, related))

with ``overlap`` the number of its top ``agreement_depth`` also in BM25's, ``strength`` in
[0, 1] the calibrated relevance of BM25's best match (spec/recall.md, "Relevance"), and
``standout`` the space's own confidence on this query (:func:`standout`): how far its best
similarity stands above the best of as many unrelated ones, in the Gumbel units of the
maximum of that many standard normal draws. A random space's best similarity is such a
maximum (standout about 0: above 2 on one query in 8, above 3 on one in 20); a model that recognises the
memory the question asks about puts it far above the rest. ``lift`` is how far the space's
mean similarity to BM25's best :data:`LIFT_DEPTH` direct matches stands above its mean
similarity to every row, in standard errors (:func:`lift`): a space whose vectors carry
nothing of the text gives a standard normal draw (above 3 on one query in 700), a model of
the text lifts the memories that share the query's words even when its own best match
does not stand out. So a space that agrees with BM25 keeps its weight, one that disagrees
keeps the share its own confidence earns, or, where BM25's match is weak, the share its
lift earns, and a random space neither agrees, stands out nor lifts. With no BM25 ranking
at all (no query word matched) a space weighs its own weight.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import ValidationError
from .index.vectors import HASHED_MODEL

__all__ = ["FusionWeights", "DEFAULT_FUSION", "NORMALIZATIONS", "SpaceSignal", "standout", "lift", "LIFT_DEPTH",
           "retriever_weight",
           "normalized_scores", "fusion_values", "fuse_rankings", "tied_ranks"]

_HINT = "see help(engramdb.FusionWeights) for the fields and their ranges"
Ranking = Sequence[tuple[int, float, float]]  # (docno, score, hop share), best first
NORMALIZATIONS = ("max", "z", "z-floor")
# Below this many rows a space's similarities say too little about their own spread for the
# standout (the extreme-value confidence) to mean anything: the space is trusted by agreement only.
STANDOUT_MIN_ROWS = 20
# How many of BM25's best direct matches a space's lift (:func:`lift`) averages over.
LIFT_DEPTH = 20


@dataclass(frozen=True)
class FusionWeights:
    """The weights recall fuses its retrievers with (spec/recall.md, "Fusion").

    Pass one to ``recall(..., fusion=)`` / ``recall_context(..., fusion=)``, or to
    ``engramdb.open(..., fusion=)`` for every recall of that handle. The defaults were
    chosen on the LoCoMo dev conversations and the document corpus (spec/recall.md,
    "Choosing the weights").

    Attributes:
        bm25: the weight of the BM25 ranking (0 leaves it out of the fused score; its
            candidates still count for relevance and agreement).
        vector: the weight of every embedding space not named in ``spaces`` or ``models``.
        spaces: ``(space name, weight)`` pairs overriding ``models`` and ``vector`` for those spaces.
        models: ``(model id, weight)`` pairs: the weight of a space whose vectors that model
            made (``EmbeddingSpace.model``), unless ``spaces`` names it. The default gives the
            built-in hashed space (:data:`~engramdb.HASHED_MODEL`) 0: it is computed from the
            same words BM25 reads, and on the benchmarks any weight of it only added noise to
            BM25's order (spec/recall.md, "Choosing the weights"). ``()`` weighs every space
            by ``vector``.
        agreement_depth: how many top results of a space and of BM25 are compared.
        agreement_power: how steeply a space's weight falls with its disagreement with BM25
            (0: not at all).
        standout_floor: how far (in Gumbel units, :func:`standout`) a space's best similarity
            must stand above the best of as many unrelated ones before the space is trusted
            where it disagrees with BM25 (``math.inf``: never; agreement alone decides).
        standout_span: how much further it must stand out to be trusted fully (> 0).
        weak_match_trust: in [0, 1], how much of its weight a space that disagrees with BM25
            keeps when BM25's best match is weak (scaled by ``1 - strength``; 0: agreement
            and confidence alone decide).
        lift_floor: how far (in standard errors, :func:`lift`) a space's mean similarity to
            BM25's best matches must stand above its mean similarity to every row before the
            space is trusted where it disagrees with BM25 and BM25's match is weak
            (``math.inf``: never).
        lift_span: how much further it must stand out to be trusted fully there (> 0).
        lexical_yield: in [0, 1], how much of its weight BM25 gives up when its best match
            is weak and a space stands out (times ``1 - strength`` and that space's confidence;
            0: BM25 always weighs ``bm25``).
        score_mix: in [0, 1], 0 fuses ranks only (reciprocal rank fusion), 1 fuses
            normalised scores, in between a blend.
        normalize: how a ranking's scores are normalised before they are summed: ``"z"``
            (standard score over the ranking's candidates, negatives 0) or ``"max"``
            (scaled to the ranking's best).
        rrf_k: the rank offset of reciprocal rank fusion.

    Raises:
        ValidationError: a field out of its range.
    """

    bm25: float = 1.0
    vector: float = 1.5
    spaces: tuple[tuple[str, float], ...] = ()
    models: tuple[tuple[str, float], ...] = ((HASHED_MODEL, 0.0),)
    agreement_depth: int = 10
    agreement_power: float = 1.0
    standout_floor: float = 3.0
    standout_span: float = 3.0
    weak_match_trust: float = 0.0
    lift_floor: float = 3.0
    lift_span: float = 2.0
    lexical_yield: float = 1.0
    score_mix: float = 0.8
    normalize: str = "z"
    rrf_k: int = 60

    def __post_init__(self) -> None:
        for name in ("bm25", "vector", "agreement_power"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    math.isfinite(value) and value >= 0):
                raise ValidationError(f"FusionWeights.{name} must be a finite number >= 0, got {value!r}", hint=_HINT)
        for name in ("weak_match_trust", "lexical_yield", "score_mix"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValidationError(f"FusionWeights.{name} must be a number in [0, 1], got {value!r}", hint=_HINT)
        for name in ("agreement_depth", "rrf_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValidationError(f"FusionWeights.{name} must be an integer >= 1, got {value!r}", hint=_HINT)
        for prefix in ("standout", "lift"):
            floor, span = getattr(self, prefix + "_floor"), getattr(self, prefix + "_span")
            if isinstance(floor, bool) or not isinstance(floor, (int, float)) or math.isnan(floor) or floor == -math.inf:
                raise ValidationError(f"FusionWeights.{prefix}_floor must be a number or math.inf, got {floor!r}",
                                      hint=_HINT)
            if isinstance(span, bool) or not isinstance(span, (int, float)) or not (math.isfinite(span) and span > 0):
                raise ValidationError(f"FusionWeights.{prefix}_span must be a finite number > 0, got {span!r}",
                                      hint=_HINT)
        if self.normalize not in NORMALIZATIONS:
            raise ValidationError(f"FusionWeights.normalize must be one of {', '.join(NORMALIZATIONS)}, "
                                  f"got {self.normalize!r}", hint=_HINT)
        for name, what in (("spaces", "space name"), ("models", "model id")):
            pairs = getattr(self, name)
            if not isinstance(pairs, tuple) or not all(
                    isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str)
                    and not isinstance(p[1], bool) and isinstance(p[1], (int, float))
                    and math.isfinite(p[1]) and p[1] >= 0 for p in pairs):
                raise ValidationError(f"FusionWeights.{name} must be a tuple of ({what}, weight >= 0) pairs, "
                                      f"got {pairs!r}", hint=_HINT)

    def space_weight(self, space: str, model: str = "") -> float:
        """The own weight of ``space`` (before trust): its ``spaces`` entry, else its model's
        ``models`` entry, else ``vector``."""
        for pairs, key in ((self.spaces, space), (self.models, model)):
            for n, w in pairs:
                if n == key:
                    return float(w)
        return float(self.vector)


DEFAULT_FUSION = FusionWeights()


def check_fusion(fusion: object) -> FusionWeights:
    """``fusion`` itself, or :data:`DEFAULT_FUSION` for None (ValidationError for anything else)."""
    if fusion is None:
        return DEFAULT_FUSION
    if not isinstance(fusion, FusionWeights):
        raise ValidationError(f"fusion must be an engramdb.FusionWeights or None, got {type(fusion).__name__}",
                              hint=_HINT)
    return fusion


def tied_ranks(ranking: Ranking) -> Iterator[tuple[int, int]]:
    """(rank, docno) of a ranking, 1-based, where documents with the same score (base plus
    hop) share the rank of the first of them: equal evidence earns equal rank fusion, so the
    tier factor, not the docno order of a tie, decides between them (a live memory beats an
    archived one that matched exactly as well; tests/test_archive.py)."""
    rank, previous = 0, None
    for position, (docno, base, hop) in enumerate(ranking, start=1):
        score = base + hop
        if score != previous:
            rank, previous = position, score
        yield rank, docno


@dataclass(frozen=True)
class SpaceSignal:
    """What fusion knows of one space on one query besides its ranking: the id of the model
    that made its vectors (for :attr:`FusionWeights.models`), its :func:`standout` and its
    :func:`lift` (None when they cannot be measured)."""

    model: str = ""
    standout: float | None = None
    lift: float | None = None


def standout(best: float, mean: float, std: float, count: int) -> float | None:
    """How far a space's best similarity ``best`` stands above what the best of ``count``
    unrelated similarities would be, in the units of that maximum's spread.

    With ``mean`` and ``std`` the moments of the query's similarity to every row, the
    maximum of ``count`` independent standard normal draws is about Gumbel distributed with
    location ``a = r - (ln ln count + ln 4 pi) / (2 r)`` and scale ``1 / r``, ``r = sqrt(2 ln
    count)``; the standout is ``((best - mean) / std - a) * r``. Unrelated vectors give about
    0 (Gumbel: above 2 on 1 query in 8, above 3 on 1 in 20); a model that recognises one
    memory as the answer gives 5-10. None below :data:`STANDOUT_MIN_ROWS` rows or when every
    similarity is the same.
    """
    if count < STANDOUT_MIN_ROWS or not (math.isfinite(std) and std > 1e-12 * max(1.0, abs(mean))):
        return None
    r = math.sqrt(2.0 * math.log(count))
    location = r - (math.log(math.log(count)) + math.log(4.0 * math.pi)) / (2.0 * r)
    return ((best - mean) / std - location) * r


def lift(top_mean: float, top_count: int, mean: float, std: float, count: int) -> float | None:
    """How far a space's mean similarity ``top_mean`` to BM25's best ``top_count`` direct
    matches stands above its mean similarity ``mean`` to all ``count`` rows, in standard
    errors of a mean of ``top_count`` draws: ``(top_mean - mean) / std * sqrt(top_count)``.

    For a space whose vectors carry nothing of the text, BM25's matches are rows like any
    other, so this is about a standard normal draw; a model of the text puts the memories
    that share the query's words nearer the query (a lift of 3-8). None below
    :data:`STANDOUT_MIN_ROWS` rows, with fewer than 2 matches, or when every similarity is
    the same.
    """
    if count < STANDOUT_MIN_ROWS or top_count < 2 or not (math.isfinite(std) and std > 1e-12 * max(1.0, abs(mean))):
        return None
    return (top_mean - mean) / std * math.sqrt(top_count)


def related(signal: SpaceSignal | None, fusion: FusionWeights) -> float:
    """How much a space is trusted where BM25's match is weak because it follows the text
    on this query, in [0, 1] (module doc): ``clip((lift - lift_floor) / lift_span, 0, 1)``,
    0 without a lift."""
    if signal is None or signal.lift is None or fusion.lift_floor == math.inf:
        return 0.0
    return min(1.0, max(0.0, (signal.lift - fusion.lift_floor) / fusion.lift_span))


def confidence(signal: SpaceSignal | None, fusion: FusionWeights) -> float:
    """How much a space is trusted on its own on this query, in [0, 1] (module doc):
    ``clip((standout - standout_floor) / standout_span, 0, 1)``, 0 without a standout or
    with its model's or name's weight 0 (a space that does not count has no say)."""
    if signal is None or signal.standout is None or fusion.standout_floor == math.inf:
        return 0.0
    return min(1.0, max(0.0, (signal.standout - fusion.standout_floor) / fusion.standout_span))


def retriever_weight(name: str, ranking: Ranking, lexical: Ranking | None, strength: float,
                     fusion: FusionWeights, signal: SpaceSignal | None = None, rival: float = 0.0) -> float:
    """The weight of one retriever (``"bm25"`` or ``"vector:<space>"``) in the fused score.

    ``lexical`` is BM25's ranking (None or empty when no query word matched), ``strength``
    the relevance of its best match, in [0, 1], and ``signal`` the space's model and
    standout on this query (module doc). For BM25, ``rival`` is the largest
    :func:`confidence` of the spaces that weigh anything: BM25 yields ``lexical_yield *
    rival * (1 - strength)`` of its weight to them.
    """
    weak = 1.0 - min(1.0, max(0.0, strength))
    if name == "bm25":
        return float(fusion.bm25) * (1.0 - fusion.lexical_yield * min(1.0, max(0.0, rival)) * weak)
    own = fusion.space_weight(name.split(":", 1)[1] if ":" in name else name, (signal or SpaceSignal()).model)
    if not lexical:
        return own
    depth = fusion.agreement_depth
    lex_top = {docno for docno, _, _ in lexical[:depth]}
    agree = float((sum(1 for docno, _, _ in ranking[:depth] if docno in lex_top) / depth) ** fusion.agreement_power)
    return own * (agree + (1.0 - agree) * max(confidence(signal, fusion),
                                              weak * max(fusion.weak_match_trust, related(signal, fusion))))


def normalized_scores(ranking: Ranking, normalize: str) -> list[float]:
    """Each candidate's score plus hop share on the scale ``normalize`` names (module doc):
    ``"max"`` over the ranking's best; ``"z"`` its standard score over the ranking, 0 below
    the ranking's mean; ``"z-floor"`` its distance above the ranking's last candidate in
    standard deviations. A ranking of equal scores: 1 each."""
    values = [score + hop for _, score, hop in ranking]
    if normalize == "max":
        best = max(values)
        return [v / best if best > 0 else 0.0 for v in values]
    mean = math.fsum(values) / len(values)
    spread = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
    if spread <= 1e-12 * max(1.0, abs(mean)):
        return [1.0] * len(values)
    if normalize == "z":
        return [max(0.0, (v - mean) / spread) for v in values]
    floor = min(values)
    return [(v - floor) / spread for v in values]


def fusion_values(rankings: Sequence[tuple[str, Ranking]], strength: float, fusion: FusionWeights,
                  signals: Mapping[str, SpaceSignal] | None = None) -> dict[int, float]:
    """The weighted sum of every candidate's parts (module doc), before rank spacing;
    ``signals`` by retriever name (``"vector:<space>"``)."""
    lexical = next((r for n, r in rankings if n == "bm25"), None)
    k = fusion.rrf_k
    # one retriever alone keeps its rank fusion: the boosts (tier, date) were set against rank spacing
    mix = float(fusion.score_mix) if sum(1 for _, r in rankings if r) > 1 else 0.0
    signals = signals or {}
    rival = max((confidence(signals.get(n), fusion) for n, r in rankings
                 if n != "bm25" and r and fusion.space_weight(n.split(":", 1)[-1], signals.get(n, SpaceSignal()).model) > 0),
                default=0.0)
    fused: dict[int, float] = {}
    for name, ranking in rankings:
        weight = retriever_weight(name, ranking, lexical, strength, fusion, signals.get(name), rival)
        if not ranking:
            continue
        scaled = normalized_scores(ranking, fusion.normalize) if mix else [0.0] * len(ranking)
        for (rank, docno), value in zip(tied_ranks(ranking), scaled):
            part = weight * ((1.0 - mix) / (k + rank) + mix * value / (k + 1))
            fused[docno] = fused.get(docno, 0.0) + part
    return fused


def fuse_rankings(rankings: Sequence[tuple[str, Ranking]], strength: float, fusion: FusionWeights,
                  signals: Mapping[str, SpaceSignal] | None = None) -> dict[int, float]:
    """The fused score of every candidate of any ranking (module doc): with one ranking its
    weighted rank fusion; with more, ``1 / (rrf_k + rank)`` of the order of
    :func:`fusion_values` (equal values share a rank), so the boosts after fusion act on
    the rank spacing they were set against."""
    fused = fusion_values(rankings, strength, fusion, signals)
    if sum(1 for _, r in rankings if r) <= 1:
        return fused
    out: dict[int, float] = {}
    rank, previous = 0, None
    for position, (docno, value) in enumerate(sorted(fused.items(), key=lambda item: (-item[1], item[0])), start=1):
        if value != previous:
            rank, previous = position, value
        out[docno] = 1.0 / (fusion.rrf_k + rank)
    return out
