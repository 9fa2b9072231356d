"""CompressStream: replay equality, bounded size, dedupe refresh, decay, recall."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engramdb.compress import CompressStream, result_to_json
from engramdb.errors import ValidationError

MESSAGES = [
    "[2023-05-08] Session 1\nAlice: we decided to move billing to Postgres.",
    "Bob: sounds good. She is right about the schema.",
    "Carol: I am worried about the migration timeline next week.",
    "Alice: Bob founded the platform group in 2019, remember?",
    "Bob: the Kafka consumer lag is back again, I am frustrated.",
    "Alice: we decided to move billing to Postgres.",
    "Carol: security is a non-negotiable principle.",
    "Dave: lunch at noon?",
]


def _replay(messages, **options):
    s = CompressStream(**options)
    for m in messages:
        s.push(m)
    return s


def test_replay_gives_identical_snapshots():
    for options in ({}, {"half_life_turns": 2, "max_zettels": 4}, {"dedupe": True, "tunnel_threshold": 0.1}):
        a = _replay(MESSAGES, **options).snapshot()
        b = _replay(MESSAGES, **options).snapshot()
        assert result_to_json(a) == result_to_json(b)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.sampled_from(MESSAGES), min_size=1, max_size=15),
    st.integers(min_value=1, max_value=5),
    st.one_of(st.none(), st.floats(min_value=0.5, max_value=10)),
    st.booleans(),
)
def test_eviction_bounds_size_and_replay_property(messages, cap, half_life, dedupe):
    s = CompressStream(half_life_turns=half_life, max_zettels=cap, dedupe=dedupe)
    for m in messages:
        s.push(m)
        assert s.size <= cap
    snap = s.snapshot()
    assert len(snap.zettels) == s.size
    replay = _replay(messages, half_life_turns=half_life, max_zettels=cap, dedupe=dedupe)
    assert result_to_json(replay.snapshot()) == result_to_json(snap)


def test_eviction_drops_the_lightest_decayed():
    s = CompressStream(max_zettels=2, half_life_turns=1)
    s.push("Alice founded the Orion guild and we decided it is essential.")  # heavy but will decay
    s.push("lunch at noon?")
    s.push("Carol decided to lead the rollout.")
    quotes = [z.quote for z in s.snapshot().zettels]
    assert "lunch at noon?" not in quotes  # the weightless message goes first
    assert s.size == 2


def test_dedupe_refreshes_instead_of_growing():
    s = CompressStream(dedupe=True)
    first = s.push(MESSAGES[5])
    s.push(MESSAGES[2])
    again = s.push(MESSAGES[5])
    assert s.size == 2
    assert again == first  # the re-sent message touched the zettel it duplicates
    plain = _replay([MESSAGES[5], MESSAGES[2], MESSAGES[5]])
    assert plain.size == 3


def test_dedupe_refresh_restores_recency():
    s = CompressStream(dedupe=True, half_life_turns=1, max_zettels=2)
    s.push("Alice: the Orion launch date is fixed for June.")
    s.push("Bob: the Kafka lag is back.")
    s.push("Alice: the Orion launch date is fixed for June.")  # refresh: now the freshest
    s.push("Carol: the Terraform plan looks clean.")
    quotes = [z.quote for z in s.snapshot().zettels]
    assert any("Orion" in q for q in quotes)


def test_pronouns_and_sessions_carry_across_pushes():
    s = CompressStream()
    s.push("[2023-05-08] Session 1\nAlice: hello there, I moved to Berlin.")
    s.push("Bob: she said she likes it there.")
    snap = s.snapshot()
    assert "Alice" in snap.zettels[1].entities
    assert snap.zettels[1].resolved_date == "2023-05-08"
    assert all(z.source_start is None for z in snap.zettels)


def test_recall():
    s = _replay(MESSAGES)
    hits = s.recall("Postgres billing", top_k=2)
    assert hits and "Postgres" in hits[0].quote
    assert s.recall("") == []
    dated = s.recall("Postgres", after="2023-05", before="2023-05-31")
    assert all(z.resolved_date and z.resolved_date.startswith("2023-05") for z in dated)
    with pytest.raises(ValidationError):
        s.recall("x", top_n=3)
    with pytest.raises(ValidationError):
        s.recall(3)  # type: ignore[arg-type]


def test_bad_arguments():
    with pytest.raises(ValidationError):
        CompressStream(max_zettels=0)
    with pytest.raises(ValidationError):
        CompressStream(half_life_turns=-1)
    with pytest.raises(ValidationError):
        CompressStream(chunksize=3)
    with pytest.raises(ValidationError):
        CompressStream().push(None)  # type: ignore[arg-type]


class _BruteForceStream(CompressStream):
    """The dedupe definition, without the prefix-filter index."""

    def _duplicate_of(self, tokens):
        from engramdb.index.tunnels import jaccard

        best, best_score = None, 0.0
        for kept in sorted(self._kept, key=lambda k: k.serial):
            score = jaccard(tokens, kept.tokens)
            if score >= self._opts.dedupe_threshold and score > best_score:
                best, best_score = kept, score
        return best


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.lists(st.sampled_from(["alpha", "beta", "gamma", "delta", "Alice", "Bob", "decided", "kafka",
                                       "postgres", "lunch", "lag", "queue"]), min_size=1, max_size=8),
             min_size=1, max_size=25),
    st.sampled_from([0.5, 0.7, 0.9, 1.0]),
    st.one_of(st.none(), st.integers(min_value=2, max_value=6)),
)
def test_dedupe_index_equals_brute_force(messages, threshold, cap):
    texts = ["Alice: " + " ".join(words) for words in messages]
    fast = _replay(texts, dedupe=True, dedupe_threshold=threshold, max_zettels=cap)
    slow = _BruteForceStream(dedupe=True, dedupe_threshold=threshold, max_zettels=cap)
    for t in texts:
        slow.push(t)
    assert result_to_json(fast.snapshot()) == result_to_json(slow.snapshot())
