"""tools/bench/doc_corpus.py's labels file (tools/bench/data/gutenberg_qrels.json): integrity
without the books, the checker's power to catch each kind of damage, and, when the shared
books are beside the checkout, that the labelled passage ids mean the books' passages."""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

PATH = Path(__file__).resolve().parent.parent / "tools" / "bench" / "doc_corpus.py"


def _doc_corpus():
    spec = importlib.util.spec_from_file_location("bench_doc_corpus", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_doc_corpus", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


dc = _doc_corpus()


def _raw() -> tuple[dict, str]:
    with open(dc.QRELS, encoding="utf-8") as f:
        text = f.read()
    return json.loads(text), text


def test_labels_file_is_valid_and_canonical():
    spec, text = _raw()
    assert dc.check_labels(spec, text) == []
    assert dc.read_labels() == spec  # the loader itself runs the check


def test_labels_cover_both_books_every_style_and_enough_questions():
    spec, _ = _raw()
    queries = spec["queries"]
    assert len(queries) >= 150
    books = {pid.split("/")[0] for q in queries for pid in q["grades"]}
    assert books == {b.key for b in dc.BOOKS}
    assert {q["style"] for q in queries} == set(dc.STYLES)
    for key in books:
        assert sum(q["id"].startswith(key + "-") for q in queries) >= 30, key


def test_every_labelled_passage_exists_and_every_question_has_an_answer():
    spec, _ = _raw()
    sizes = {key: book["passages"] for key, book in spec["books"].items()}
    for q in spec["queries"]:
        assert 2 in q["grades"].values(), q["id"]
        for pid, grade in q["grades"].items():
            book, n = pid.split("/")
            assert 0 <= int(n) < sizes[book], (q["id"], pid)
            assert grade in (1, 2)
    assert len({q["id"] for q in spec["queries"]}) == len(spec["queries"])
    assert len({q["query"].lower() for q in spec["queries"]}) == len(spec["queries"])


def _damaged(change) -> list[str]:
    spec, _ = _raw()
    spec = copy.deepcopy(spec)
    change(spec)
    return dc.check_labels(spec)


@pytest.mark.parametrize("change, expected", [
    (lambda s: s["queries"].append(dict(s["queries"][0], query="another question")), "id used twice"),
    (lambda s: s["queries"].append(dict(s["queries"][0], id="origin-999")), "asked twice"),
    (lambda s: s["queries"][0]["grades"].update({"origin/99999": 1}), "is not a passage"),
    (lambda s: s["queries"][0]["grades"].update({"emma/3": 1}), "is not a passage"),
    (lambda s: s["queries"][0]["grades"].update({"origin/07": 1}), "is not a passage"),
    (lambda s: s["queries"][0]["grades"].update({"origin/1": 3}), "graded 3"),
    (lambda s: s["queries"][0].update(grades={"origin/1": 1}), "no passage answers it"),
    (lambda s: s["queries"][0].update(style="vague"), "style 'vague'"),
])
def test_check_labels_catches_each_kind_of_damage(change, expected):
    errors = _damaged(change)
    assert any(expected in e for e in errors), errors


def test_check_labels_reports_malformed_ids_in_a_file_it_checks_as_text():
    spec, _ = _raw()
    spec = copy.deepcopy(spec)
    spec["queries"][0]["grades"].update({"emma/3": 1, "origin/x": 1})
    errors = dc.check_labels(spec, dc.canonical(spec))
    assert sum("is not a passage" in e for e in errors) == 2


def test_check_labels_rejects_a_file_not_in_canonical_form():
    spec, text = _raw()
    assert dc.check_labels(spec, text.replace("\n", "\r\n")) != []
    assert dc.check_labels(spec, json.dumps(spec, indent=2)) != []


def test_canonical_sorts_grades_by_book_then_passage():
    spec = {"books": {}, "queries": [{"id": "x", "grades": {"pride/2": 1, "origin/10": 2, "origin/9": 1}}]}
    assert list(json.loads(dc.canonical(spec))["queries"][0]["grades"]) == ["origin/9", "origin/10", "pride/2"]


@given(st.lists(st.dictionaries(
    st.sampled_from([f"{b.key}/{n}" for b in dc.BOOKS for n in range(12)]), st.sampled_from([1, 2]),
    min_size=1), max_size=5), st.text(max_size=20))
def test_canonical_round_trips(grades, question):
    spec = {"about": {"built": question}, "queries": [
        {"id": f"q{i}", "style": "lexical", "query": question, "batch": 2, "grades": g} for i, g in enumerate(grades)]}
    text = dc.canonical(spec)
    assert dc.canonical(json.loads(text)) == text
    assert text.endswith("\n")


def test_ndcg_of_perfect_reversed_and_empty_rankings():
    grades = {3: 2, 7: 1}
    assert dc.ndcg([3, 7, 1], grades) == pytest.approx(1.0)
    assert 0 < dc.ndcg([7, 3], grades) < 1
    assert dc.ndcg([1, 2], grades) == 0.0
    assert dc.ndcg([1], {}) == 0.0


def test_relevance_modes_count_grade_one_as_zero_half_or_full():
    grades = {"3": 2, "7": 1}
    assert dc.relevance(grades) == {3: 2, 7: 1}
    assert dc.relevance(grades, "strict") == {3: 2}
    assert dc.relevance(grades, "binary") == {3: 2, 7: 2}
    assert dc.ndcg([7, 3], dc.relevance(grades, "binary")) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        dc.relevance(grades, "lenient")


@pytest.mark.skipif(not os.path.isdir(dc.GUTENBERG), reason=f"{dc.GUTENBERG} is not beside this checkout")
def test_labelled_ids_are_the_books_passages():
    spec, _ = _raw()
    ids, texts = dc.corpus()
    assert len(ids) == len(texts) == sum(b["passages"] for b in spec["books"].values())
    mapped = dc.load_qrels()
    for q, m in zip(spec["queries"], mapped["queries"]):
        assert [ids[int(p)] for p in m["grades"]] == list(q["grades"])
    assert not any("[Illustration" in t for t in texts)
