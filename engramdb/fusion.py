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

BM25 weighs ``bm25``. A space weighs its own weight (``spaces``, else ``vector``) times
its trust::

    agree = (overlap / agreement_depth) ** agreement_power
    trust = agree + (1 - agree) * weak_match_trust * (1 - strength)

with ``overlap`` the number of its top ``agreement_depth`` also in BM25's, and
``strength`` in [0, 1] the calibrated relevance of BM25's best match (spec/recall.md,
"Relevance"). A space that agrees with BM25 keeps its weight; one that shares nothing
with it (a random or unrelated model) keeps ``weak_match_trust * (1 - strength)`` of it.
With no BM25 ranking at all (no query word matched) a space weighs its own weight.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .errors import ValidationError

__all__ = ["FusionWeights", "DEFAULT_FUSION", "NORMALIZATIONS", "retriever_weight", "normalized_scores", "fusion_values",
           "fuse_rankings", "tied_ranks"]

_HINT = "see help(engramdb.FusionWeights) for the fields and their ranges"
Ranking = Sequence[tuple[int, float, float]]  # (docno, score, hop share), best first
NORMALIZATIONS = ("max", "z", "z-floor")


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
        vector: the weight of every embedding space not named in ``spaces``.
        spaces: ``(space name, weight)`` pairs overriding ``vector`` for those spaces.
        agreement_depth: how many top results of a space and of BM25 are compared.
        agreement_power: how steeply a space's weight falls with its disagreement with BM25
            (0: not at all).
        weak_match_trust: in [0, 1], how much of its weight a space that disagrees with BM25
            keeps when BM25's best match is weak (scaled by ``1 - strength``; 0: agreement
            alone decides).
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
    agreement_depth: int = 10
    agreement_power: float = 1.0
    weak_match_trust: float = 0.0
    score_mix: float = 1.0
    normalize: str = "z"
    rrf_k: int = 60

    def __post_init__(self) -> None:
        for name in ("bm25", "vector", "agreement_power"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    math.isfinite(value) and value >= 0):
                raise ValidationError(f"FusionWeights.{name} must be a finite number >= 0, got {value!r}", hint=_HINT)
        for name in ("weak_match_trust", "score_mix"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValidationError(f"FusionWeights.{name} must be a number in [0, 1], got {value!r}", hint=_HINT)
        for name in ("agreement_depth", "rrf_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValidationError(f"FusionWeights.{name} must be an integer >= 1, got {value!r}", hint=_HINT)
        if self.normalize not in NORMALIZATIONS:
            raise ValidationError(f"FusionWeights.normalize must be one of {', '.join(NORMALIZATIONS)}, "
                                  f"got {self.normalize!r}", hint=_HINT)
        if not isinstance(self.spaces, tuple) or not all(
                isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str)
                and not isinstance(p[1], bool) and isinstance(p[1], (int, float))
                and math.isfinite(p[1]) and p[1] >= 0 for p in self.spaces):
            raise ValidationError("FusionWeights.spaces must be a tuple of (space name, weight >= 0) pairs, "
                                  f"got {self.spaces!r}", hint=_HINT)

    def space_weight(self, space: str) -> float:
        """The own weight of ``space`` (before agreement): its ``spaces`` entry, else ``vector``."""
        return next((float(w) for n, w in self.spaces if n == space), float(self.vector))


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


def retriever_weight(name: str, ranking: Ranking, lexical: Ranking | None, strength: float,
                     fusion: FusionWeights) -> float:
    """The weight of one retriever (``"bm25"`` or ``"vector:<space>"``) in the fused score.

    ``lexical`` is BM25's ranking (None or empty when no query word matched) and
    ``strength`` the relevance of its best match, in [0, 1].
    """
    if name == "bm25":
        return float(fusion.bm25)
    own = fusion.space_weight(name.split(":", 1)[1] if ":" in name else name)
    if not lexical:
        return own
    depth = fusion.agreement_depth
    lex_top = {docno for docno, _, _ in lexical[:depth]}
    agree = float((sum(1 for docno, _, _ in ranking[:depth] if docno in lex_top) / depth) ** fusion.agreement_power)
    weak = 1.0 - min(1.0, max(0.0, strength))
    return own * (agree + (1.0 - agree) * fusion.weak_match_trust * weak)


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


def fusion_values(rankings: Sequence[tuple[str, Ranking]], strength: float,
                  fusion: FusionWeights) -> dict[int, float]:
    """The weighted sum of every candidate's parts (module doc), before rank spacing."""
    lexical = next((r for n, r in rankings if n == "bm25"), None)
    k = fusion.rrf_k
    # one retriever alone keeps its rank fusion: the boosts (tier, date) were set against rank spacing
    mix = float(fusion.score_mix) if sum(1 for _, r in rankings if r) > 1 else 0.0
    fused: dict[int, float] = {}
    for name, ranking in rankings:
        weight = retriever_weight(name, ranking, lexical, strength, fusion)
        if not ranking:
            continue
        scaled = normalized_scores(ranking, fusion.normalize) if mix else [0.0] * len(ranking)
        for (rank, docno), value in zip(tied_ranks(ranking), scaled):
            part = weight * ((1.0 - mix) / (k + rank) + mix * value / (k + 1))
            fused[docno] = fused.get(docno, 0.0) + part
    return fused


def fuse_rankings(rankings: Sequence[tuple[str, Ranking]], strength: float,
                  fusion: FusionWeights) -> dict[int, float]:
    """The fused score of every candidate of any ranking (module doc): with one ranking its
    weighted rank fusion; with more, ``1 / (rrf_k + rank)`` of the order of
    :func:`fusion_values` (equal values share a rank), so the boosts after fusion act on
    the rank spacing they were set against."""
    fused = fusion_values(rankings, strength, fusion)
    if sum(1 for _, r in rankings if r) <= 1:
        return fused
    out: dict[int, float] = {}
    rank, previous = 0, None
    for position, (docno, value) in enumerate(sorted(fused.items(), key=lambda item: (-item[1], item[0])), start=1):
        if value != previous:
            rank, previous = position, value
        out[docno] = 1.0 / (fusion.rrf_k + rank)
    return out
