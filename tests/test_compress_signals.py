"""Flags and emotions: keyword tables, word boundaries and negation scope."""
from __future__ import annotations

import pytest

from engramdb.compress.signals import EMOTION_KEYWORDS, FLAG_KEYWORDS, detect, detect_emotions, detect_flags
from engramdb.compress.weights import raw_weight
from engramdb.records import ALL_EMOTIONS, ALL_FLAGS

FLAG_CASES = [
    ("We decided to ship on Friday.", {"DECISION"}),
    ("After the review we chose Postgres.", {"DECISION"}),
    ("The team agreed to freeze the API.", {"DECISION"}),  # "api" alone is too broad for TECHNICAL
    ("Bob founded the company in a garage.", {"ORIGIN"}),
    ("This is how it began: a napkin sketch.", {"ORIGIN"}),
    ("Privacy is a non-negotiable principle for us.", {"CORE"}),
    ("Tests are fundamental to how we work.", {"CORE"}),
    ("That benchmark was the turning point.", {"PIVOT"}),
    ("The outage led to a full rewrite.", {"GENESIS"}),
    ("The config lives next to the database schema.", {"TECHNICAL"}),
    ("Lunch was nice and the weather was fine.", set()),
    # word boundaries: no keyword inside another word
    ("A rapid classic chateau mission.", set()),
    ("The foundations were poured; undecided voters.", set()),
]

NEGATED = [
    ("we never decided", "DECISION"),
    ("We have not decided anything yet.", "DECISION"),
    ("They didn't choose a vendor and hadn't decided.", "DECISION"),
    ("nobody founded anything", "ORIGIN"),
    ("It was hardly a turning point.", "PIVOT"),
    ("Without a breakthrough the project stalled.", "PIVOT"),
    ("We failed to reach a final decision.", "DECISION"),
    ("We don’t think it is essential.", "CORE"),  # typographic apostrophe
]

NOT_NEGATED = [
    ("No, we decided to ship.", "DECISION"),  # the comma closes the negation's scope
    ("It was not easy but we decided to ship.", "DECISION"),  # "but" closes it too
    ("We did not sleep. We decided at dawn.", "DECISION"),
    ("Not only that: the outage led to a rewrite.", "GENESIS"),
    ("We do not use it, yet the database matters.", "TECHNICAL"),
    ("We don't use a database.", "TECHNICAL"),  # TECHNICAL names a subject: never negated
]

EMOTION_CASES = [
    ("I am so happy about this!", {"joy"}),
    ("She was worried and anxious before the exam.", {"fear", "anxiety"}),
    ("Honestly I feel burnt out and exhausted.", {"exhaustion"}),
    ("I'm grateful for your help.", {"gratitude"}),
    ("We're looking forward to the launch.", {"hope", "anticipation"}),
    ("I love this team.", {"love"}),
    ("My grandmother passed away last spring; I feel lost.", {"loss", "grief"}),
    ("I should have done it differently, if only I had known.", {"guilt", "regret"}),
    ("We will never give up, no matter what.", {"determination"}),
    ("The view was breathtaking.", {"awe"}),
    ("The meeting is at noon in room four.", set()),
    ("a hateful chateau", set()),
]

EMOTION_NEGATED = [
    ("I am not happy with this.", "joy"),
    ("I was never afraid of him.", "fear"),
    ("She isn't grateful at all.", "gratitude"),
    ("We were free from fear.", "fear"),
]


@pytest.mark.parametrize("text, expected", FLAG_CASES)
def test_flag_table(text, expected):
    assert set(detect_flags(text)) == expected


@pytest.mark.parametrize("text, flag", NEGATED)
def test_negation_suppresses_flags(text, flag):
    assert flag not in detect_flags(text)


@pytest.mark.parametrize("text, flag", NOT_NEGATED)
def test_negation_scope_ends(text, flag):
    assert flag in detect_flags(text)


@pytest.mark.parametrize("text, expected", EMOTION_CASES)
def test_emotion_table(text, expected):
    assert set(detect_emotions(text)) == expected


@pytest.mark.parametrize("text, emotion", EMOTION_NEGATED)
def test_negation_suppresses_emotions(text, emotion):
    assert emotion not in detect_emotions(text)


def test_canonical_order_and_tables_complete():
    assert set(FLAG_KEYWORDS) == set(ALL_FLAGS) and set(EMOTION_KEYWORDS) == set(ALL_EMOTIONS)
    s = detect("The config is essential. We decided: it changed everything. I am happy, proud and grateful.")
    assert list(s.flags) == [f for f in ALL_FLAGS if f in s.flags]
    assert list(s.emotions) == [e for e in ALL_EMOTIONS if e in s.emotions]
    assert {"DECISION", "CORE", "PIVOT", "TECHNICAL"} <= set(s.flags)


def test_every_keyword_fires_on_its_own():
    for table, detector in ((FLAG_KEYWORDS, detect_flags), (EMOTION_KEYWORDS, detect_emotions)):
        for category, keywords in table.items():
            for keyword in keywords:
                assert category in detector(f"and then {keyword} happened"), (category, keyword)


def test_technical_does_not_change_weight():
    plain = detect("We talked for an hour about lunch and the weather today.")
    technical = detect("We talked for an hour about the database and the schema today.")
    assert technical.flags == ("TECHNICAL",)
    assert raw_weight(plain) == raw_weight(technical)
    assert raw_weight(detect("We decided to ship it.")) > raw_weight(plain)
