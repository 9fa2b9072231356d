"""Fusion with a useless embedding space (issue 13).

A deliberately bad embedder (seeded random vectors: the same text always gets the same
vector, unrelated to its meaning) is added as an embedding space, with every memory's
vector and every query's vector from it. Recall on a fixed query set must then be no
worse than BM25 alone by more than ``MARGIN`` (R@1 and R@10 over 100 queries).

The corpus is synthetic and fixed (seeded): 300 memories of 12 words from a 400-word
vocabulary; each query is 3 words of one target memory plus one random vocabulary word.
"""
from __future__ import annotations

import functools
import hashlib
import math
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = str(Path(__file__).resolve().parent.parent)
DIMS = 64
MARGIN = 0.02  # the documented "within noise" allowance: 2 of the 100 queries
MARGIN_QUERIES = 2  # the same, as a count (the checks below compare counts, not floats)


def random_embedder(texts: list[str]) -> np.ndarray:
    """Seeded random vectors: deterministic per text, carrying no information about it."""
    out = np.empty((len(texts), DIMS), dtype=np.float32)
    for i, text in enumerate(texts):
        seed = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")
        out[i] = np.random.default_rng(seed).standard_normal(DIMS)
    return out


def corpus() -> tuple[list[str], list[tuple[str, str]]]:
    rng = np.random.default_rng(1234)
    vocab = [f"w{i:03d}" for i in range(400)]
    docs = [" ".join(rng.choice(vocab, size=12, replace=True)) for _ in range(300)]
    queries = []
    for _ in range(100):
        d = int(rng.integers(len(docs)))
        picked = [str(w) for w in rng.choice(docs[d].split(), size=3, replace=False)] + [str(rng.choice(vocab))]
        queries.append((" ".join(picked), f"d{d}"))
    return docs, queries


def build(db, *, space: bool) -> None:
    docs, _ = corpus()
    vecs = random_embedder(docs) if space else None
    if space:
        db.add_space("rand", dims=DIMS, model="test/random-vectors", embedder=random_embedder)
    db.add_many([{"id": f"d{i}", "content": text, "created_at": 1.0, "last_accessed": 1.0,
                  **({"embeddings": {"rand": tuple(float(x) for x in vecs[i])}} if vecs is not None else {})}
                 for i, text in enumerate(docs)])


def scores(db) -> tuple[float, float]:
    _, queries = corpus()
    r1 = r10 = 0
    for query, gold in queries:
        ids = [h.id for h in db.recall(query, top_k=10)]
        r1 += ids[:1] == [gold]
        r10 += gold in ids
    return r1 / len(queries), r10 / len(queries)


def test_the_random_space_is_searched(make_db):
    """The bad space really takes part in recall (so the fusion test below tests fusion)."""
    db = make_db()
    build(db, space=True)
    _, queries = corpus()
    parts = db.recall(queries[0][0], top_k=10, explain=True)
    assert any(key.startswith("vector:rand") for hit in parts for key in (hit.parts or {}))


def test_a_random_space_does_not_make_recall_worse_than_bm25(make_db):
    """Issue 13 regression: with equal-weight RRF a random space ranked as high as BM25
    (measured 2026-12-01: BM25 alone R@1 1.00 R@10 1.00, with the random space R@1 0.08
    R@10 0.74). Agreement-gated fusion (engramdb.fusion) gives it almost no weight: 1.00 / 1.00."""
    alone = make_db("bm25.engram")
    build(alone, space=False)
    fused = make_db("fused.engram")
    build(fused, space=True)
    (a1, a10), (f1, f10) = scores(alone), scores(fused)
    assert f1 >= a1 - MARGIN and f10 >= a10 - MARGIN, {"bm25": (a1, a10), "bm25+random": (f1, f10)}


def test_recall_with_a_space_is_deterministic_across_processes_and_hash_seeds(tmp_path):
    """Each process builds the same stores (the random space; a strong model, whose standout
    makes BM25 yield on the paraphrased queries) and prints ids and exact scores; two
    PYTHONHASHSEED values must print the same."""
    code = textwrap.dedent(f"""
        import json, os, sys
        sys.path.insert(0, {os.path.join(ROOT, "tests")!r})
        import engramdb.engram as em
        from engramdb.crypto import KDFParams
        import test_recall_fusion as t
        def make(name):
            return em.open({str(tmp_path)!r} + '/' + name + os.environ['PYTHONHASHSEED'] + '.engram',
                           passphrase='pw', kdf=KDFParams.for_tests())
        db = make('det')
        t.build(db, space=True)
        out = [[(h.id, repr(h.score), sorted(h.parts)) for h in db.recall(q, top_k=10, explain=True)]
               for q, _ in t.corpus()[1][:20]]
        strong = t._space_store(make, 'strong')
        out += [[(h.id, repr(h.score), sorted(h.parts)) for h in strong.recall(q, top_k=10, explain=True)]
                for q, _ in t.paraphrased_queries()[:20]]
        print(json.dumps(out))
    """)
    outputs = []
    for seed in ("1", "987"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=ROOT)
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        outputs.append(run.stdout)
    assert outputs[0] == outputs[1]
    rows = json.loads(outputs[0])
    assert len(rows) == 40 and all(len(r) == 10 for r in rows)
    assert any(key.startswith("vector:rand") for r in rows[:20] for _, _, keys in r for key in keys)
    assert any(key.startswith("vector:strong") for r in rows[20:] for _, _, keys in r for key in keys)


# --- every signal, not only a useless one: fused >= max(BM25 alone, space alone) - MARGIN ---

STRONG_DIMS = 384  # as wide as MiniLM: its 400 concepts barely interfere, so it is sure of the synonyms it knows
NOISY_DIMS = 32  # the same concepts crowded together: a noisy but useful model, never sure of its best match


def concept_embedder(texts: list[str], dims: int = STRONG_DIMS) -> np.ndarray:
    """A deterministic fake model that knows synonyms: ``wNNN`` and ``sNNN`` are the same
    concept NNN, each concept a fixed seeded random direction in ``dims`` dimensions; a text
    is the sum of its words' concepts (normalised by the space)."""
    basis = np.random.default_rng(77).standard_normal((400, dims)).astype(np.float32)
    out = np.zeros((len(texts), dims), dtype=np.float32)
    for i, text in enumerate(texts):
        for word in text.split():
            if len(word) == 4 and word[0] in "ws" and word[1:].isdigit():
                out[i] += basis[int(word[1:])]
    return out


def paraphrased_queries() -> list[tuple[str, str]]:
    """The fixed queries with each target word, with probability 0.7, replaced by its synonym (``w`` -> ``s``):
    BM25 sees less of the target, the concept model sees all of it."""
    rng = np.random.default_rng(99)
    out = []
    for query, gold in corpus()[1]:
        words = query.split()
        swap = [i for i in range(3) if rng.random() < 0.7]
        out.append((" ".join("s" + w[1:] if i in swap else w for i, w in enumerate(words)), gold))
    return out


def hit_counts(db, queries, fusion=None) -> tuple[int, int]:
    """(R@1, R@10) of ``queries`` as counts of queries (each has one gold memory)."""
    r1 = r10 = 0
    for query, gold in queries:
        ids = [h.id for h in db.recall(query, top_k=10, fusion=fusion)]
        r1 += ids[:1] == [gold]
        r10 += gold in ids
    return r1, r10



def _space_store(make_db, space: str):
    """The corpus with one space: ``hashed`` (built in), ``random``, ``strong`` (the concept
    model) or ``noisy`` (the concept model in :data:`NOISY_DIMS` dimensions)."""
    docs, _ = corpus()
    db = make_db(f"{space}.engram")
    embedder = {"random": random_embedder, "strong": concept_embedder,
                "noisy": functools.partial(concept_embedder, dims=NOISY_DIMS)}.get(space)
    if embedder is None:
        db.add_space("hashed", dims=256)
        db.add_many([{"id": f"d{i}", "content": t, "created_at": 1.0, "last_accessed": 1.0} for i, t in enumerate(docs)])
        return db
    dims = {"random": DIMS, "strong": STRONG_DIMS, "noisy": NOISY_DIMS}[space]
    db.add_space(space, dims=dims, model=f"test/{space}", embedder=embedder)
    vecs = embedder(docs)
    db.add_many([{"id": f"d{i}", "content": t, "created_at": 1.0, "last_accessed": 1.0,
                  "embeddings": {space: tuple(float(x) for x in vecs[i])}} for i, t in enumerate(docs)])
    return db


# the space alone: BM25 weighs nothing, no agreement gate, no per-model weight (the hashed space too)
MODEL_ONLY = dict(bm25=0.0, vector=1.0, models=(), agreement_power=0.0, score_mix=0.0)


@pytest.fixture(scope="module")
def paraphrase_bm25(tmp_path_factory):
    """BM25 alone on the paraphrased queries, as counts (one store for the module)."""
    import engramdb.engram as engram_mod
    from conftest import PASSPHRASE, TEST_KDF

    docs, _ = corpus()
    with engram_mod.open(tmp_path_factory.mktemp("bm25") / "bm25.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add_many([{"id": f"d{i}", "content": t, "created_at": 1.0, "last_accessed": 1.0}
                     for i, t in enumerate(docs)])
        return hit_counts(db, paraphrased_queries())


@pytest.mark.parametrize("space", ["random", "hashed", "strong", "noisy"])
def test_fused_is_at_least_its_best_single_signal_on_paraphrases(make_db, paraphrase_bm25, space):
    """Issue 13, "fusion that never loses to its parts": on the paraphrased queries (BM25
    matches one or two of four words; a synthetic regime unlike the benchmarks), recall with
    the default weights is at least the better of BM25 alone and the space alone, R@1 and
    R@10, within ``MARGIN`` (2 of the 100 queries), for a useless space (seeded random
    vectors), the built-in hashed space, a strong model that knows every synonym and the
    same model crowded into 32 dimensions (noisy: never sure of its best match, but useful).
    Measured 2026-12-01 with the defaults (R@1 / R@10 of 100): BM25 26 / 48; random alone
    0 / 4, fused 26 / 47; hashed alone 21 / 39, fused 26 / 48 (its model weighs 0); strong
    alone 99 / 100, fused 100 / 100; noisy alone 29 / 75, fused 37 / 75 (without the lift,
    the session-4 defaults: 32 / 71). With the defaults before those (agreement-only trust,
    no rank share): strong 86 / 100, random 26 / 40, hashed 25 / 42."""
    from engramdb import FusionWeights

    queries = paraphrased_queries()
    db = _space_store(make_db, space)
    alone = hit_counts(db, queries, FusionWeights(**MODEL_ONLY))
    fused = hit_counts(db, queries)
    seen = {"bm25": paraphrase_bm25, "alone": alone, "fused": fused}
    for metric in (0, 1):
        assert fused[metric] >= max(paraphrase_bm25[metric], alone[metric]) - MARGIN_QUERIES, seen
    if space == "strong":  # the check can fail: a space trusted by agreement alone loses to this model
        gated = hit_counts(db, queries, FusionWeights(standout_floor=float("inf"), lexical_yield=0.0, score_mix=1.0))
        assert gated[0] < alone[0] - MARGIN_QUERIES, {**seen, "agreement only": gated}
    if space == "noisy":  # and this one: without the lift (the previous defaults) nothing tells it from a useless space
        unlifted = hit_counts(db, queries, FusionWeights(vector=1.5, standout_floor=3.0, lexical_yield=1.0,
                                                         score_mix=0.8, lift_floor=math.inf))
        assert unlifted[1] < alone[1] - MARGIN_QUERIES, {**seen, "without the lift": unlifted}
    if space == "random":  # and so can this one: a random space weighed like BM25 costs R@10
        equal = hit_counts(db, queries, FusionWeights(vector=1.0, agreement_power=0.0))
        assert equal[1] < paraphrase_bm25[1] - MARGIN_QUERIES, {**seen, "equal weights": equal}
