"""How recall fuses its retrievers: the weights (:class:`FusionWeights`) and the fused score.

Recall ranks candidates with BM25 and with every embedding space that can embed the
query (each ranking already spread one hop); this module turns those rankings into one
score per candidate (spec/recall.md, "Fusion"). It is pure arithmetic over the rankings:
no I/O, no hashing order, so it is deterministic.

For one retriever ``i`` with weight ``w_i`` and a candidate at rank ``r`` whose score
(plus hop share) is ``s``, out of a ranking whose best score is ``s_max``::

    part_i = w_i * ((1 - score_mix) / (rrf_k + r) + score_mix * (s / s_max) / (rrf_k + 1))

``score_mix = 0`` is weighted reciprocal rank fusion; ``score_mix = 1`` a weighted sum of
the scores scaled to the ranking's best (score-aware: a close second keeps most of its
credit, a distant tail keeps little). Both parts top out at ``1 / (rrf_k + 1)``, so the
fused values stay on one scale whatever the mix. With a single non-empty ranking (BM25
alone, or one space alone) the mix is not applied: the order is that retriever's own and
the boosts act on rank spacing, as they were calibrated.

BM25 weighs ``bm25``. A space weighs its own weight (``spaces``, else ``vector``) times
its trust::

    agree = (overlap / agreement_depth) ** agreement_power
    trust = agree + (1 - agree) * weak_match_trust * (1 - strength)

with ``overlap`` the number of its top ``agreement_depth`` also in BM25's, and
``strength`` in [0, 1] the calibrated relevance of BM25's best match (spec/recall.md,
"Relevance"). A space that agrees with BM25 keeps its weight; one that disagrees keeps
``weak_match_trust * (1 - strength)`` of it: a dense signal is trusted less the stronger
the lexical match it contradicts, and, when no word matched well, it is trusted. With no
BM25 ranking at all (no query word matched) a space weighs its own weight.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .errors import ValidationError

__all__ = ["FusionWeights", "DEFAULT_FUSION", "retriever_weight", "fuse_rankings", "tied_ranks"]

_HINT = "see help(engramdb.FusionWeights) for the fields and their ranges"
Ranking = Sequence[tuple[int, float, float]]  # (docno, score, hop share), best first


@dataclass(frozen=True)
class FusionWeights:
    """The weights recall fuses its retrievers with (spec/recall.md, "Fusion").

    Pass one to ``recall(..., fusion=)`` / ``recall_context(..., fusion=)``, or to
    ``engramdb.open(..., fusion=)`` for every recall of that handle. The defaults were
    chosen on the LoCoMo dev conversations (spec/recall.md, "Choosing the weights").

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
        score_mix: in [0, 1], 0 fuses ranks only (reciprocal rank fusion), 1 fuses scores
            scaled to each ranking's best, in between a blend.
        rrf_k: the rank offset of reciprocal rank fusion.

    Raises:
        ValidationError: a field out of its range.
    """

    bm25: float = 1.0
    vector: float = 0.5
    spaces: tuple[tuple[str, float], ...] = ()
    agreement_depth: int = 10
    agreement_power: float = 2.0
    weak_match_trust: float = 0.5
    score_mix: float = 1.0
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


def fuse_rankings(rankings: Sequence[tuple[str, Ranking]], strength: float,
                  fusion: FusionWeights) -> dict[int, float]:
    """The fused score of every candidate of any ranking (module docstring)."""
    lexical = next((r for n, r in rankings if n == "bm25"), None)
    k = fusion.rrf_k
    # one retriever alone keeps its rank fusion: the boosts (tier, date) were set against rank spacing
    mix = float(fusion.score_mix) if sum(1 for _, r in rankings if r) > 1 else 0.0
    fused: dict[int, float] = {}
    for name, ranking in rankings:
        weight = retriever_weight(name, ranking, lexical, strength, fusion)
        if not ranking:
            continue
        best = max(score + hop for _, score, hop in ranking)
        for (rank, docno), (_, score, hop) in zip(tied_ranks(ranking), ranking):
            if mix:
                part = weight * ((1.0 - mix) / (k + rank) + mix * ((score + hop) / best if best > 0 else 0.0) / (k + 1))
            else:
                part = weight / (k + rank)
            fused[docno] = fused.get(docno, 0.0) + part
    return fused
