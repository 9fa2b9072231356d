"""FusionWeights: the documented, overridable weights of recall's fusion (engramdb/fusion.py)."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

import engramdb
from engramdb.errors import ValidationError
from engramdb.fusion import (DEFAULT_FUSION, FusionWeights, SpaceSignal, fuse_rankings, fusion_values,
                             lift, normalized_scores, retriever_weight, standout)


def test_defaults_are_the_documented_ones():
    assert DEFAULT_FUSION == FusionWeights() == engramdb.FusionWeights(
        bm25=1.0, vector=1.5, spaces=(), models=((engramdb.HASHED_MODEL, 0.0),), agreement_depth=10,
        agreement_power=1.0, standout_floor=3.0, standout_span=3.0, weak_match_trust=0.0, lift_floor=3.0,
        lift_span=2.0, lexical_yield=1.0, score_mix=0.8, normalize="z", rrf_k=60)


@pytest.mark.parametrize("kwargs", [
    {"bm25": -1.0}, {"vector": float("nan")}, {"vector": True}, {"agreement_power": math.inf},
    {"weak_match_trust": 1.5}, {"score_mix": -0.1}, {"agreement_depth": 0}, {"rrf_k": 2.5},
    {"normalize": "minmax"}, {"normalize": None}, {"spaces": (("model", -1.0),)}, {"spaces": [("model", 1.0)]}, {"spaces": (("model",),)},
    {"models": (("m", math.nan),)}, {"models": [("m", 1.0)]}, {"models": ((1, 1.0),)},
    {"standout_floor": math.nan}, {"standout_floor": -math.inf}, {"standout_floor": "2"}, {"standout_floor": True},
    {"standout_span": 0.0}, {"standout_span": math.inf}, {"standout_span": -1.0},
    {"lift_floor": math.nan}, {"lift_floor": -math.inf}, {"lift_floor": "2"}, {"lift_span": 0.0}, {"lift_span": True},
])
def test_out_of_range_fields_are_validation_errors_with_a_hint(kwargs):
    with pytest.raises(ValidationError) as err:
        FusionWeights(**kwargs)
    assert "FusionWeights" in err.value.hint


def test_frozen_and_hashable():
    w = FusionWeights(spaces=(("model", 0.5),))
    with pytest.raises(AttributeError):
        w.vector = 2.0  # type: ignore[misc]
    assert hash(w) == hash(FusionWeights(spaces=(("model", 0.5),)))
    assert w.space_weight("model") == 0.5 and FusionWeights(vector=1.0, spaces=(("a", 2.0),)).space_weight("b") == 1.0


def test_a_space_weighs_by_its_name_then_its_model_then_vector():
    w = FusionWeights(vector=1.5, spaces=(("mine", 0.7),), models=(("org/model", 0.3),))
    assert w.space_weight("mine", "org/model") == 0.7  # the space's own entry wins
    assert w.space_weight("other", "org/model") == 0.3
    assert w.space_weight("other", "org/else") == 1.5
    # the built-in hashed model weighs 0 by default; models=() gives it the common weight
    assert FusionWeights().space_weight("hashed", engramdb.HASHED_MODEL) == 0.0
    assert FusionWeights(models=()).space_weight("hashed", engramdb.HASHED_MODEL) == 1.5
    assert FusionWeights(standout_floor=math.inf).standout_floor == math.inf  # never trusted on its own


def test_standout_of_unrelated_similarities_is_about_a_gumbel_draw():
    """The best of N unrelated similarities stands out by about 0 (a standard Gumbel: mean
    0.58, above 2 with probability 0.13, above 3 with 0.05); one planted match far more."""
    rng = np.random.default_rng(5)
    draws = []
    for _ in range(400):
        s = rng.standard_normal(2000) * 0.1 + 0.3  # any location and scale: the moments are the query's own
        draws.append(standout(float(s.max()), float(s.mean()), float(s.std()), s.size))
    values = np.array(draws)
    assert 0.3 < values.mean() < 0.9 and 0.06 < (values > 2).mean() < 0.2 and (values > 3).mean() < 0.1
    s = rng.standard_normal(2000) * 0.1 + 0.3
    s[17] = 0.3 + 0.1 * 6.5  # 6.5 standard deviations: far beyond the best of 2000 (about 3.4)
    assert standout(float(s.max()), float(s.mean()), float(s.std()), s.size) > 8
    # too few rows, or every similarity equal: nothing to measure
    assert standout(0.9, 0.1, 0.2, 19) is None and standout(0.5, 0.5, 0.0, 1000) is None


def test_lift_of_unrelated_similarities_is_a_standard_normal_draw():
    """A space whose vectors carry nothing of the text: BM25's matches are rows like any
    other, so their mean similarity stands above the mean of all rows by a standard normal
    draw (in standard errors); a model of the text lifts them far more."""
    rng = np.random.default_rng(8)
    draws = []
    for _ in range(400):
        s = rng.standard_normal(2000) * 0.1 + 0.3
        top = s[rng.choice(2000, size=20, replace=False)]
        draws.append(lift(float(top.mean()), top.size, float(s.mean()), float(s.std()), s.size))
    values = np.array(draws)
    assert abs(values.mean()) < 0.15 and 0.85 < values.std() < 1.15 and (values > 3).mean() < 0.01
    s = rng.standard_normal(2000) * 0.1 + 0.3
    s[:20] += 0.2  # each match two standard deviations nearer: 2 * sqrt(20) = 8.9 standard errors, give or take 1
    assert 6.0 < lift(float(s[:20].mean()), 20, float(s.mean()), float(s.std()), s.size) < 12.0
    # too few rows or matches, or every similarity equal: nothing to measure
    assert lift(0.9, 20, 0.1, 0.2, 19) is None and lift(0.9, 1, 0.1, 0.2, 1000) is None
    assert lift(0.5, 20, 0.5, 0.0, 1000) is None


def test_the_lift_is_measured_on_bm25s_matches_that_have_a_vector():
    """recall's per-space signal: the lift over the given matches present in the space (the
    others have no vector there), from the similarities to every row."""
    from engramdb.recall import _signal

    docnos = np.arange(10, 110, dtype=np.uint64)  # docno order, as the space returns them
    scores = np.random.default_rng(3).standard_normal(100).astype(np.float32)
    scores[[0, 5]] += 3.0  # docnos 10 and 15
    sig = _signal("org/m", docnos, scores, [3, 10, 15, 200])  # 3 and 200 have no vector here
    top = scores[[0, 5]].astype(np.float64)
    assert sig.model == "org/m" and sig.lift == pytest.approx(
        lift(float(top.mean()), 2, float(scores.mean(dtype=np.float64)), float(scores.std(dtype=np.float64)), 100))
    assert sig.standout is not None and _signal("m", docnos, scores, [10]).lift is None  # one match: no lift
    assert _signal("m", docnos[:0], scores[:0], [10]) == SpaceSignal("m")


BM25 = [(1, 9.0, 0.0), (2, 8.0, 0.0), (3, 1.0, 0.0)]
VEC = [(4, 0.9, 0.0), (2, 0.8, 0.0), (1, 0.1, 0.0)]


def test_rank_fusion_is_weighted_rrf():
    rrf = FusionWeights(vector=1.0, agreement_power=0.0, score_mix=0.0)
    values = fusion_values([("bm25", BM25), ("vector:m", VEC)], 0.0, rrf)
    assert values == {1: 1 / 61 + 1 / 63, 2: 1 / 62 + 1 / 62, 3: 1 / 63, 4: 1 / 61}
    # the fused score is the rank spacing of that order: 1 (0.03227) > 2 (0.03226) > 4 > 3
    assert fuse_rankings([("bm25", BM25), ("vector:m", VEC)], 0.0, rrf) == {1: 1 / 61, 2: 1 / 62, 4: 1 / 63, 3: 1 / 64}


def test_fused_scores_are_rank_spaced_with_shared_ranks():
    """Equal sums share a rank; a candidate only a zero-weight retriever ranked comes after
    all the others (the space alone: BM25 weighs 0)."""
    model_only = FusionWeights(bm25=0.0, vector=1.0, agreement_power=0.0, score_mix=0.0)
    fused = fuse_rankings([("bm25", BM25), ("vector:m", VEC)], 0.0, model_only)
    assert fused == {4: 1 / 61, 2: 1 / 62, 1: 1 / 63, 3: 1 / 64}
    tied = [(5, 1.0, 0.0), (6, 1.0, 0.0)]
    assert fuse_rankings([("bm25", tied), ("vector:m", tied)], 0.0, FusionWeights(agreement_power=0.0)) == {
        5: 1 / 61, 6: 1 / 61}


def test_a_space_that_counts_for_nothing_leaves_bm25s_order():
    """With the space's weight 0 (no overlap with BM25, no weak-match trust: the defaults),
    BM25's candidates keep exactly BM25's rank fusion; the space's own share the next rank."""
    unrelated = [(7, 0.9, 0.0), (8, 0.8, 0.0)]
    fused = fuse_rankings([("bm25", BM25), ("vector:m", unrelated)], 0.0, FusionWeights(normalize="max"))
    assert fused == {1: 1 / 61, 2: 1 / 62, 3: 1 / 63, 7: 1 / 64, 8: 1 / 64}
    assert {d: fused[d] for d in (1, 2, 3)} == fuse_rankings([("bm25", BM25)], 0.0, FusionWeights())


def test_normalized_scores():
    assert normalized_scores(BM25, "max") == pytest.approx([1.0, 8 / 9, 1 / 9])
    mean, std = 6.0, float(np.std([9.0, 8.0, 1.0]))
    assert normalized_scores(BM25, "z") == pytest.approx([3 / std, 2 / std, 0.0])  # below the mean: 0
    assert normalized_scores([(1, 2.0, 0.5), (2, 2.5, 0.0)], "z") == [1.0, 1.0]  # equal scores (with the hop)
    assert normalized_scores([(1, 0.4, 0.0)], "z") == [1.0]
    assert mean == pytest.approx(float(np.mean([9.0, 8.0, 1.0])))


def test_agreement_and_guard_lower_a_disagreeing_space():
    w = FusionWeights(vector=1.0, agreement_depth=3, agreement_power=2.0, weak_match_trust=0.0)
    assert retriever_weight("vector:m", VEC, BM25, 0.0, w) == pytest.approx((2 / 3) ** 2)
    assert retriever_weight("vector:m", VEC, BM25, 0.0, FusionWeights(vector=1.0, agreement_depth=3)) == pytest.approx(2 / 3)
    trusting = FusionWeights(vector=1.0, agreement_depth=3, agreement_power=2.0, weak_match_trust=0.5)
    agree = (2 / 3) ** 2
    # a strong lexical match (strength 1): agreement alone; a weak one (0.25): part of the rest back
    assert retriever_weight("vector:m", VEC, BM25, 1.0, trusting) == pytest.approx(agree)
    assert retriever_weight("vector:m", VEC, BM25, 0.25, trusting) == pytest.approx(agree + (1 - agree) * 0.5 * 0.75)
    assert retriever_weight("vector:m", VEC, BM25, 0.0, FusionWeights(vector=1.0, agreement_depth=3,
                                                                       weak_match_trust=1.0)) == 1.0
    # no lexical ranking: the space's own weight; BM25's weight is its field
    assert retriever_weight("vector:m", VEC, [], 1.0, FusionWeights(spaces=(("m", 0.3),))) == 0.3
    assert retriever_weight("bm25", BM25, BM25, 1.0, FusionWeights(bm25=0.25)) == 0.25


def test_a_space_that_stands_out_is_trusted_where_it_disagrees():
    """trust = agree + (1 - agree) * clip((standout - floor) / span, 0, 1): below the floor
    agreement alone; from floor + span on, the full weight, whatever BM25 says."""
    w = FusionWeights(vector=1.0, agreement_depth=3, standout_floor=2.0, standout_span=3.0)
    agree = 2 / 3

    def weight(value, fusion=w, model=""):
        return retriever_weight("vector:m", VEC, BM25, 1.0, fusion, SpaceSignal(model, value))

    assert weight(None) == weight(1.9) == weight(-5.0) == pytest.approx(agree)
    assert weight(3.5) == pytest.approx(agree + (1 - agree) * 0.5)
    assert weight(5.0) == weight(40.0) == pytest.approx(1.0)
    assert weight(40.0, FusionWeights(vector=1.0, agreement_depth=3, standout_floor=math.inf)) == pytest.approx(agree)
    # an unrelated top 3 (no overlap) is trusted by its standout alone
    unrelated = [(7, 0.9, 0.0), (8, 0.8, 0.0), (9, 0.1, 0.0)]
    assert retriever_weight("vector:m", unrelated, BM25, 1.0, w, SpaceSignal("", 2.3)) == pytest.approx(0.1)
    # the model's weight scales the whole: a model weighing 0 counts for nothing however it stands out
    assert weight(40.0, FusionWeights(), engramdb.HASHED_MODEL) == 0.0


def test_a_space_that_follows_the_text_is_trusted_where_bm25_is_weak():
    """trust = agree + (1 - agree) * max(confident, (1 - strength) * clip((lift - floor) /
    span, 0, 1)): a space whose similarities lift BM25's matches (a model of the text) keeps
    the share of a disagreeing top that BM25's weakness and its lift earn; BM25 keeps its weight."""
    w = FusionWeights(vector=1.0, agreement_depth=3, standout_floor=math.inf, lift_floor=3.0, lift_span=2.0)
    agree = 2 / 3

    def weight(value, strength=0.0, fusion=w):
        return retriever_weight("vector:m", VEC, BM25, strength, fusion, SpaceSignal("", None, value))

    assert weight(None) == weight(2.9) == weight(-4.0) == pytest.approx(agree)
    assert weight(4.0) == pytest.approx(agree + (1 - agree) * 0.5)
    assert weight(4.0, strength=0.5) == pytest.approx(agree + (1 - agree) * 0.25)
    assert weight(9.0) == pytest.approx(1.0) and weight(9.0, strength=1.0) == pytest.approx(agree)
    assert weight(9.0, fusion=replace(w, lift_floor=math.inf)) == pytest.approx(agree)  # off
    # the lift does not make BM25 give way (only a standout does)
    lifted = {"vector:m": SpaceSignal("", None, 9.0)}
    assert fusion_values([("bm25", BM25), ("vector:m", VEC)], 0.0, replace(w, score_mix=0.0), lifted)[1] == \
        pytest.approx(1 / 61 + 1 / 63)


def test_score_mix_keeps_the_credit_of_a_close_second():
    w = FusionWeights(vector=1.0, agreement_power=0.0, score_mix=1.0, normalize="max")
    fused = fusion_values([("bm25", BM25), ("vector:m", VEC)], 0.0, w)
    assert fused[1] == pytest.approx(1 / 61 + 0.1 / 0.9 / 61)
    assert fused[2] == pytest.approx(8 / 9 / 61 + 0.8 / 0.9 / 61)  # rank-only: 1/62 + 1/62
    assert fused[3] == pytest.approx(1 / 9 / 61)
    half = fusion_values([("bm25", BM25), ("vector:m", VEC)], 0.0,
                         FusionWeights(vector=1.0, agreement_power=0.0, score_mix=0.5, normalize="max"))
    assert half[3] == pytest.approx(0.5 / 63 + 0.5 * 1 / 9 / 61)


def test_a_single_ranking_keeps_rank_fusion():
    """BM25 alone (no space) ranks exactly as before score-aware fusion existed."""
    assert fuse_rankings([("bm25", BM25)], 0.0, FusionWeights(score_mix=1.0)) == {1: 1 / 61, 2: 1 / 62, 3: 1 / 63}
    assert fuse_rankings([("bm25", BM25), ("vector:m", [])], 0.0, FusionWeights(score_mix=1.0))[2] == 1 / 62


def _store(make_db, name, **kwargs):
    db = make_db(name, **kwargs)
    vocab = ["apple", "river", "stone", "cloud", "ember", "frost", "grain", "harbor"]

    def emb(texts):  # a fixed fake model: word counts over the vocabulary, plus one
        out = np.ones((len(texts), len(vocab) + 1), dtype=np.float32)
        for i, t in enumerate(texts):
            for j, w in enumerate(vocab):
                out[i, j] += 2 * t.split().count(w)
        return out

    docs = ["apple river", "stone cloud", "ember frost", "grain harbor apple", "river stone frost"]
    db.add_space("fake", dims=len(vocab) + 1, model="test/fake", embedder=emb)
    db.add_many([{"id": f"d{i}", "content": d, "created_at": 1.0, "last_accessed": 1.0,
                  "embeddings": {"fake": tuple(float(x) for x in emb([d])[0])}} for i, d in enumerate(docs)])
    return db


def test_recall_open_and_call_weights(make_db):
    db = _store(make_db, "a.engram")
    default = [(h.id, h.score) for h in db.recall("apple river", top_k=5)]
    assert default == [(h.id, h.score) for h in db.recall("apple river", top_k=5, fusion=FusionWeights())]
    model_only = FusionWeights(bm25=0.0, vector=1.0, agreement_power=0.0, score_mix=0.0)
    only = db.recall("apple river", top_k=5, fusion=model_only, explain=True)
    assert len(only) == 5  # every memory has a vector: the ranking is the space's alone
    assert all(h.parts["rrf"] == pytest.approx(1 / (60 + h.parts["vector_rank:fake"])) for h in only)
    db.close()
    handle = _store(make_db, "b.engram", fusion=model_only)
    assert handle.fusion == model_only
    assert [h.id for h in handle.recall("apple river", top_k=5)] == [h.id for h in only]
    # a call's own weights win over the handle's
    assert [(h.id, h.score) for h in handle.recall("apple river", top_k=5, fusion=FusionWeights())] == default
    # recall_context ranks with the handle's weights unless given its own
    ctx = handle.recall_context("apple river", top_k=1, max_tokens=100)
    ctx_default = handle.recall_context("apple river", top_k=1, max_tokens=100, fusion=FusionWeights())
    assert ctx.text.endswith(only[0].node.content)
    assert ctx_default.text.endswith(handle.get(default[0][0]).content)
    with pytest.raises(ValidationError):
        handle.recall("apple", fusion={"bm25": 1.0})
    with pytest.raises(ValidationError):
        make_db("c.engram", fusion="rank")



def test_bm25_yields_to_a_confident_space_only_when_its_own_match_is_weak():
    """BM25 weighs ``bm25 * (1 - lexical_yield * rival * (1 - strength))``, ``rival`` the
    largest confidence of the spaces that weigh anything on the query."""
    w = FusionWeights(lexical_yield=1.0, standout_floor=2.0, standout_span=3.0, score_mix=0.0)  # parts: weight / (60 + rank)
    assert retriever_weight("bm25", BM25, BM25, 0.25, w, rival=1.0) == pytest.approx(0.25)
    assert retriever_weight("bm25", BM25, BM25, 1.0, w, rival=1.0) == 1.0  # a strong match keeps its weight
    assert retriever_weight("bm25", BM25, BM25, 0.0, w, rival=0.5) == pytest.approx(0.5)
    assert retriever_weight("bm25", BM25, BM25, 0.0, FusionWeights(lexical_yield=0.0), rival=1.0) == 1.0

    def bm25_part(signals, fusion=w):
        return fusion_values([("bm25", BM25), ("vector:m", VEC)], 0.0, fusion, signals)[3]  # 3: BM25's alone

    sure = {"vector:m": SpaceSignal("org/model", 9.0)}
    assert bm25_part(sure) == pytest.approx(0.0)  # a space sure of itself and a match worth nothing
    assert bm25_part({}) == pytest.approx(1 / 63)
    assert bm25_part({"vector:m": SpaceSignal("org/model", 0.5)}) > 0  # a space that does not stand out
    # a space whose model weighs 0 does not make BM25 yield, however it stands out
    muted = replace(w, models=(("org/model", 0.0),))
    assert bm25_part(sure, muted) == pytest.approx(bm25_part({}, muted)) == pytest.approx(1 / 63)
