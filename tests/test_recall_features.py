"""Query-side recall features (engramdb/recall_features.py): speaker, source and time."""
from __future__ import annotations

import pytest

from engramdb.index.tokenize import Tokenizer
from engramdb.recall_features import SOURCE_WEIGHT, SPEAKER_WEIGHT, QueryFeatures
from engramdb.records import Node

NOW = 1_700_000_000.0


def _turns(db, turns):
    db.add_many([{"id": id_, "content": text, "metadata": {"speaker": who}, "source": "chat", "created_at": NOW + i,
                  "last_accessed": NOW + i} for i, (id_, who, text) in enumerate(turns)])


def test_speaker_match_needs_every_term_of_the_name():
    tok = Tokenizer()
    q = QueryFeatures.of("What did Anna Lee paint last summer?", tok)
    assert q.speaker_match(Node(id="a", metadata={"speaker": "Anna Lee"})) == 1.0
    assert q.speaker_match(Node(id="b", metadata={"speaker": "Anna"})) == 1.0
    assert q.speaker_match(Node(id="c", metadata={"speaker": "Anna Smith"})) == 0.0
    assert q.speaker_match(Node(id="d")) == 0.0  # no speaker: no feature
    assert q.speaker_match(Node(id="e", metadata={"speaker": 7})) == 0.0  # not a name
    assert q.speaker_match(Node(id="f", metadata={"speaker": ""})) == 0.0


def test_boost_is_bounded_and_recorded():
    q = QueryFeatures.of("what did bob say", Tokenizer())
    parts: dict[str, float] = {}
    assert q.boost(Node(id="a", metadata={"speaker": "Bob"}), parts) == pytest.approx(1.0 + SPEAKER_WEIGHT)
    assert parts["speaker"] == 1.0
    assert q.boost(Node(id="b", metadata={"speaker": "Eve"})) == 1.0
    assert q.max_boost() >= 1.0 + SPEAKER_WEIGHT


def test_recall_prefers_the_named_speaker(make_db):
    db = make_db()
    # The reply that answers is Bob's; Eve's question about it matches the words better.
    _turns(db, [
        ("e1", "Eve", "Bob, what did you think of the violin concert?"),
        ("b1", "Bob", "The violin concert was moving, I cried."),
        ("e2", "Eve", "I also went to a violin concert, Bob."),
        ("x", "Eve", "The weather is nice today."),
    ])
    plain = [h.id for h in db.recall("violin concert", top_k=3)]
    named = db.recall("What did Bob think of the violin concert?", top_k=3, explain=True)
    assert named[0].id == "b1"
    assert named[0].parts is not None and named[0].parts["speaker"] == 1.0
    assert all(h.parts is not None and h.parts["speaker"] == 0.0 for h in named[1:])
    assert set(plain) == {h.id for h in named}  # the feature reorders, it does not add matches


def test_speaker_feature_is_deterministic(make_db):
    db = make_db()
    _turns(db, [(f"t{i}", "Bob" if i % 2 else "Eve", f"note {i} about the garden") for i in range(8)])
    runs = {tuple(h.id for h in db.recall("Bob garden", top_k=4)) for _ in range(3)}
    assert len(runs) == 1
    ids = next(iter(runs))
    assert ids == ("t1", "t3", "t5", "t7")  # Bob's notes first, then insertion order


def test_asks_time_and_mentions_time():
    from engramdb.recall_features import asks_time, mentions_time

    assert asks_time("When did Anna move?")
    assert asks_time("How long has Bob played chess?")
    assert asks_time("In what year did they marry?")
    assert not asks_time("What did the year bring?")
    assert asks_time("What year did they marry?")
    assert not asks_time("What did Anna paint?")
    for text in ("I went there yesterday", "last Friday was fun", "two weeks ago", "in May we met",
                 "back in 2019", "on the 15th", "I've had them for 3 years now", "see you tomorrow!"):
        assert mentions_time(text), text
    for text in ("I like turtles", "a mayday call", "the 2 dogs", "last one standing"):
        assert not mentions_time(text), text


def test_time_match_only_for_time_questions():
    tok = Tokenizer()
    dated = Node(id="a", content="We adopted a cat last week")
    plain = Node(id="b", content="We adopted a cat")
    when = QueryFeatures.of("When did they adopt a cat?", tok)
    what = QueryFeatures.of("What did they adopt?", tok)
    assert when.time_match(dated) == 1.0 and when.time_match(plain) == 0.0
    assert what.time_match(dated) == 0.0


def test_recall_prefers_a_dated_answer_to_a_when_question(make_db):
    db = make_db()
    _turns(db, [
        ("plain", "Eve", "We adopted a puppy from the shelter."),
        ("dated", "Bob", "We adopted a puppy from the shelter last month."),
    ])
    assert db.recall("Who adopted a puppy from the shelter?", top_k=1)[0].id == "plain"  # insertion order
    hits = db.recall("When was the puppy adopted from the shelter?", top_k=2, explain=True)
    assert [h.id for h in hits] == ["dated", "plain"]
    assert hits[0].parts is not None and hits[0].parts["time"] == 1.0


def test_score_sources_counts_the_terms_a_source_covers_between_its_memories():
    nodes = {1: Node(id="a", source="s1"), 2: Node(id="b", source="s1"), 3: Node(id="c", source="s2"),
             4: Node(id="d"), 5: Node(id="e")}
    holds = {"violin": {1, 3, 5}, "concert": {2, 4}}
    mass = {"violin": 2.0, "concert": 1.0}
    q = QueryFeatures.of("violin concert", Tokenizer())
    q.score_sources(nodes.get, lambda term, ds: [mass[term] if d in holds[term] else 0.0 for d in ds],
                    {"violin": 1.0, "concert": 1.0}, 3.0, [5, 4, 3, 2, 1, 2])
    # d and e have no source: not scored; they get the best source's match
    assert q.sources == {1: 1.0, 2: 1.0, 3: pytest.approx(2 / 3)}
    assert q.boost(nodes[4], docno=4) == q.boost(nodes[1], docno=1)
    assert q.boost(nodes[1], docno=1) == pytest.approx(1.0 + SOURCE_WEIGHT)
    q.score_sources(nodes.get, lambda term, ds: [0.0] * len(ds), {"violin": 1.0}, 0.0, [1])
    assert q.sources == {}


def test_recall_prefers_the_source_about_the_question(make_db):
    db = make_db()
    # Two equally good matches of "trophy"; only session s2 is also about the season.
    db.add_many([
        {"id": "a1", "content": "We won a trophy at the fair.", "source": "s1", "created_at": NOW},
        {"id": "a2", "content": "The pie contest was fun.", "source": "s1", "created_at": NOW + 1},
        {"id": "b1", "content": "The basketball season was intense.", "source": "s2", "created_at": NOW + 2},
        {"id": "b2", "content": "We won a trophy at the end.", "source": "s2", "created_at": NOW + 3},
    ])
    hits = db.recall("What trophy did the team win at the end of the season?", top_k=4, explain=True)
    order = [h.id for h in hits]
    assert order.index("b2") < order.index("a1")
    by_id = {h.id: h for h in hits}
    assert by_id["b2"].parts is not None and by_id["a1"].parts is not None
    assert by_id["b2"].parts["source"] > by_id["a1"].parts["source"]


def test_a_memory_without_a_source_gets_the_best_source_factor(make_db):
    # regression: a weak match with a source used to overtake the best match without one
    db = make_db()
    db.add_many([
        {"id": "sourced", "content": "Alice started a new job.", "source": "notes", "created_at": NOW},
        {"id": "other", "content": "Bob likes an old tea.", "source": "notes", "created_at": NOW + 1},
    ])
    db.add("a new memory in an old file", id="bare", now=NOW + 2)
    hits = db.recall("new memory old file", top_k=2, explain=True)
    assert hits[0].id == "bare"
    assert hits[0].parts is not None and hits[1].parts is not None
    assert hits[0].parts["source"] == max(h.parts["source"] for h in hits if h.parts is not None) > 0
