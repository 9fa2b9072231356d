"""Query expansion: synonym clusters, question words, dates named in a query."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engramdb.recall as recall_mod
from engramdb.index.synonyms import EXPANSION_WEIGHT, Expander, QueryDate, parse_date, query_dates
from engramdb.index.tokenize import Tokenizer

TOK = Tokenizer(stemmer="english")
EXP = Expander(TOK)


def test_a_cluster_member_adds_the_others_at_lower_weight():
    weights = EXP.expand(TOK("Caroline relocated"))
    assert weights["carolin"] == 1.0 and weights["reloc"] == 1.0
    assert weights["move"] == EXPANSION_WEIGHT and weights["transfer"] == EXPANSION_WEIGHT
    assert "job" not in weights


def test_phrases_match_consecutive_terms_and_split_their_weight():
    weights = EXP.expand(TOK("trip to NYC"))
    assert weights["new"] == pytest.approx(EXPANSION_WEIGHT / 2) and weights["york"] == pytest.approx(EXPANSION_WEIGHT / 2)
    assert EXP.expand(TOK("a new house in york"))["new"] == 1.0  # query terms keep their weight
    assert "nyc" in EXP.expand(TOK("moved to new york"))
    assert "nyc" not in EXP.expand(TOK("new year in york"))


def test_repeated_terms_count_and_expansions_never_override():
    weights = EXP.expand(["job", "job", "career"])
    assert weights["job"] == 2.0 and weights["career"] == 1.0 and weights["work"] == EXPANSION_WEIGHT


def test_question_words_are_dropped_unless_nothing_else_is_left():
    assert EXP.drop_question_words(TOK("When did Caroline move?")) == ["carolin", "move"]
    assert EXP.drop_question_words(TOK("what is it")) == TOK("what is it")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(TOK("job career wedding relocated nyc new york pear apple the trip month may")),
                max_size=8))
def test_expansion_is_deterministic_and_a_superset(terms):
    a = EXP.expand(terms)
    assert a == Expander(TOK).expand(list(terms))
    assert set(terms) <= set(a)
    assert all(w > 0 for w in a.values())


@pytest.mark.parametrize("query,expected", [
    ("What happened in May 2023?", [QueryDate(2023, 5)]),
    ("in 2022 or 2021", [QueryDate(2021), QueryDate(2022)]),
    ("may I ask about 2023", [QueryDate(2023)]),  # "may" the verb is not a month
    ("Sept 2020 and Jan 2020", [QueryDate(2020, 1), QueryDate(2020, 9)]),
    ("last July", []),  # a month without a year is too ambiguous to rank by
    ("room 1234", []),
])
def test_query_dates(query, expected):
    assert query_dates(query) == expected


@pytest.mark.parametrize("query,expected", [
    # "May" before a day and then the year (the US spelling, 4 LoCoMo questions) is the month
    ("Who did Maria have dinner with on May 3, 2023?", [QueryDate(2023, 5)]),
    ("on May 23rd 2023", [QueryDate(2023, 5)]),
    ("June 5, 2023 and May 3, 2023", [QueryDate(2023, 5), QueryDate(2023, 6)]),
    ("may 3 people come in 2023", [QueryDate(2023)]),  # "may" the verb, a number after it, no year next
    # an ISO date names its month; its year is not a target of its own (every day of it would match)
    ("what happened on 2023-05-08?", [QueryDate(2023, 5)]),
    ("2023-05 or 2022", [QueryDate(2022), QueryDate(2023, 5)]),
    ("between 2023-11-30 and 2024-01-02", [QueryDate(2023, 11), QueryDate(2024, 1)]),
    ("ticket 2023-13", [QueryDate(2023)]),  # no month 13: the year alone
])
def test_query_dates_in_other_spellings(query, expected):
    """"May 3, 2023" and "2023-05-08" named only the year, so every memory of 2023 got the
    date boost of that month's memories ("May 2023" and "3 June 2023" named the month)."""
    assert query_dates(query) == expected


def test_parse_date_and_proximity():
    assert parse_date("2023-05-08") == QueryDate(2023, 5)
    assert parse_date("2023") == QueryDate(2023)
    assert parse_date("2023-13-01") == QueryDate(2023)
    assert parse_date("yesterday") is None and parse_date(None) is None
    assert QueryDate(2023, 5).proximity(QueryDate(2023, 5)) == 1.0
    assert QueryDate(2023, 5).proximity(QueryDate(2023, 11)) == 0.5
    assert QueryDate(2023, 5).proximity(QueryDate(2025, 5)) == 0.0
    assert QueryDate(2023).proximity(QueryDate(2022, 3)) == 0.5


def test_early_stop_gives_the_same_hits_as_boosting_everything(make_db, monkeypatch):
    db = make_db()
    tiers = ["hot", "warm", "cold", "archive"]
    for i in range(60):
        db.add(f"memory {i} about apples {'pears ' * (i % 4)}", id=f"m{i}", tier=tiers[i % 4],
               resolved_date=f"20{20 + i % 5}-0{1 + i % 9}-01", now=1.0)
    queries = ["apples pears in March 2022", "pears", "apples 2024"]
    fast = [[(h.id, h.score) for h in db.recall(q, top_k=5)] for q in queries]
    # a boost no node has makes the bound useless, so every candidate is boosted
    monkeypatch.setitem(recall_mod.TIER_BOOST, "unused", 1e9)
    slow = [[(h.id, h.score) for h in db.recall(q, top_k=5)] for q in queries]
    assert fast == slow and all(fast)


def test_a_long_query_is_read_for_dates_in_linear_time():
    """A 100 KB query of "may may may ..." took ~90 s of CPU per recall: the "may next to a
    year" check read the whole query again for each "may", and its ``\\s*,?\\s*`` retried a
    long blank run from each blank ("may" and 100,000 spaces: ~55 s); "May 3, 2023" repeated
    built years x months with every repeat. Each input below is 300 KB (old code: minutes)."""
    import signal

    def hang(signum, frame):
        raise AssertionError("did not finish within 60 s")

    queries = ["may " * 75_000, "may" + " " * 300_000 + "x", "May 3, 2023 " * 25_000, "2023-05-" * 37_500]
    alarm = hasattr(signal, "SIGALRM")  # Windows has none: the results are still checked
    previous = signal.signal(signal.SIGALRM, hang) if alarm else None
    if alarm:
        signal.alarm(60)
    try:
        found = [query_dates(q) for q in queries]
    finally:
        if alarm:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
    assert found == [[], [], [QueryDate(2023, 5)], [QueryDate(2023, 5)]]
