"""Recall on a compress result (engramdb.recall_result, CompressStream.recall), the date filters
as zettel-compress defines them, and recall_context with the source text given."""
from __future__ import annotations

import datetime

import pytest

import engramdb
from engramdb import CompressStream, compress, recall_result
from engramdb.errors import ValidationError
from engramdb.importers import iter_aaak
from engramdb.backup import import_records
from engramdb.records import CompressResult, EntityIndex, Tunnel, Zettel

NOW = 1_700_000_000.0


def test_the_seeds_compress_stream_example():
    """zettel-compress's README: ``mem.recall('token decision')`` returns zettel 002."""
    mem = CompressStream(half_life_turns=50, max_zettels=200)
    mem.push("Alice: the login service keeps timing out")
    mem.push("Bob: we decided to rotate tokens hourly")
    hits = mem.recall("token decision")
    assert [z.id for z in hits][:1] == ["002"]
    assert hits[0].quote == "Bob: we decided to rotate tokens hourly"
    with pytest.raises(ValidationError, match="unknown recall option"):
        mem.recall("x", topk=3)


def _result(*zettels, tunnels=()):
    return CompressResult(list(zettels), list(tunnels), EntityIndex(), {})


def test_stemming_and_synonyms_as_the_stores_recall():
    r = _result(Zettel("1", quote="Alice relocated to Berlin last spring."),
                Zettel("2", quote="The rotating credentials expired."),
                Zettel("3", quote="Bob likes tea."))
    assert [z.id for z in recall_result(r, "credential rotation")] == ["2"]  # Snowball stems
    assert [z.id for z in recall_result(r, "where did alice move?")] == ["1"]  # move ~ relocate
    assert recall_result(r, "where did she move?", expand_query=False) == []


def test_the_date_bonus_ranks_the_nearer_memory_first():
    r = _result(Zettel("1", quote="We visited the museum.", resolved_date="2021-02-01"),
                Zettel("2", quote="We visited the museum.", resolved_date="2023-05-08"))
    assert [z.id for z in recall_result(r, "museum visit")] == ["1", "2"]  # a tie: position
    assert [z.id for z in recall_result(r, "museum visit in May 2023")] == ["2", "1"]


def test_after_and_before_as_zettel_compress_defines_them():
    r = _result(Zettel("1", quote="tea party", resolved_date="2023-04-30"),
                Zettel("2", quote="tea party", resolved_date="2023-05-01"),
                Zettel("3", quote="tea party", resolved_date="2023-06-15"),
                Zettel("4", quote="tea party"))
    ids = lambda **kw: sorted(z.id for z in recall_result(r, "tea", top_k=10, **kw))  # noqa: E731
    assert ids() == ["1", "2", "3", "4"]
    assert ids(after="2023-05") == ["2", "3"]  # prefix compare; no resolved date: left out
    assert ids(before="2023-05") == ["1", "2"]  # inclusive at the bound's precision
    assert ids(after="2023-05-01", before="2023-05-31") == ["2"]
    assert ids(after=datetime.date(2023, 5, 1), before=datetime.datetime(2023, 5, 31, 12)) == ["2"]


def test_date_bounds_in_other_iso_forms_filter_as_the_stores_recall_does():
    """A datetime string, ISO basic or a week date compared as text with the zettels' dates
    kept or dropped the wrong ones (``after="2023-05-01T10:00"`` dropped 2023-05-01, since
    "2023-05-01" < "2023-05-01T10:00"; ``before="20230531"`` kept June); a bound that is no
    date at all ("May 2023", "2023/05/01", "2023-5") silently matched nothing. Each is now
    compared as the store's recall compares it (its date), or refused."""
    r = _result(Zettel("1", quote="tea party", resolved_date="2023-04-30"),
                Zettel("2", quote="tea party", resolved_date="2023-05-01"),
                Zettel("3", quote="tea party", resolved_date="2023-06-15"))
    ids = lambda **kw: sorted(z.id for z in recall_result(r, "tea", top_k=10, **kw))  # noqa: E731
    assert ids(after="2023-05-01T10:00") == ["2", "3"]
    assert ids(before="2023-04-30T23:30:00-02:00") == ["1"]  # its own date, as the store cuts a string
    assert ids(before="20230531") == ["1", "2"]
    assert ids(after="2023-W18") == ["2", "3"]  # the week of Monday 2023-05-01
    for bad in ("May 2023", "2023/05/01", "2023-5", "", "soon"):
        with pytest.raises(ValidationError, match="after must be"):
            recall_result(r, "tea", after=bad)


def test_hops_surface_a_tunnelled_zettel_and_source_text_is_indexed():
    r = _result(Zettel("1", quote="The deploy failed."), Zettel("2", quote="Nothing relevant here."),
                Zettel("3", quote="Unrelated words."), tunnels=[Tunnel("1", "2", "X")])
    assert [z.id for z in recall_result(r, "deploy")] == ["1", "2"]
    assert [z.id for z in recall_result(r, "deploy", hops=False)] == ["1"]
    text = "zebra crossing. The deploy failed."
    r2 = _result(Zettel("1", quote="The deploy failed.", source_start=0, source_end=len(text)))
    assert recall_result(r2, "zebra") == []
    assert [z.id for z in recall_result(r2, "zebra", source=text)] == ["1"]
    with pytest.raises(ValidationError):
        recall_result(r2, "x", after=20230101)


def test_recall_result_on_a_compress_result_is_deterministic():
    text = "Alice decided to move to Berlin in May 2023. Bob stayed in Lisbon. " * 5
    r = compress(text)
    first = [z.id for z in recall_result(r, "where did alice move")]
    assert first and first == [z.id for z in recall_result(compress(text), "where did alice move")]


def test_store_recall_filters_on_the_resolved_date_else_created_at(make_db):
    db = make_db()
    db.add("tea in spring", id="dated", resolved_date="2023-05-08", now=NOW)  # created 2023-11-14
    db.add("tea in autumn", id="undated", now=NOW)
    ids = lambda **kw: sorted(h.id for h in db.recall("tea", top_k=10, **kw))  # noqa: E731
    assert ids(after="2023-05", before="2023-05") == ["dated"]
    assert ids(after="2023-11-01") == ["undated"]  # the dated memory's own date is in May
    assert ids(before=datetime.date(2023, 6, 1)) == ["dated"]
    assert ids(after=NOW - 1) == ["undated"]  # a timestamp bound: the resolved date's day is before it
    assert ids(after=-1e300) == ["dated", "undated"] and ids(before=1e300) == ["dated", "undated"]


def test_recall_context_with_the_source_text(make_db):
    text = "Intro line. We decided to rotate the tokens hourly because of the audit. Outro."
    doc = (f'FILE:001||||v2\n001:||"We decided to rotate the tokens hourly"|0.90||DECISION|12-{len(text) - 8}')
    db = make_db()
    import_records(db, iter_aaak(doc, now=NOW))
    without = db.recall_context("rotate tokens")
    assert [p.text for p in without.passages] == ["We decided to rotate the tokens hourly"]  # no source text
    ctx = db.recall_context("rotate tokens", source_text=text)
    assert [(p.source, p.start, p.end) for p in ctx.passages] == [("import:aaak", 12, len(text) - 7)]
    assert ctx.passages[0].text == "We decided to rotate the tokens hourly because of the audit."  # whole sentence
    assert ctx.passages[0].text in ctx.text
    assert db.recall_context("rotate tokens", source="elsewhere", source_text=text).passages == ()
    with pytest.raises(ValidationError):
        db.recall_context("x", source_text=b"bytes")
    assert engramdb.recall_result is recall_result


def test_cli_context_with_a_source_text_file(tmp_path):
    from click.testing import CliRunner

    from engramdb.cli import cli

    env = {"ENGRAM_PASSPHRASE": "pw", "ENGRAM_TEST_WEAK_KDF": "1"}
    text = "Intro line. We decided to rotate the tokens hourly because of the audit. Outro."
    (tmp_path / "book.txt").write_text(text, encoding="utf-8")
    (tmp_path / "doc.aaak").write_text(
        f'FILE:001||||v2\n001:||"We decided to rotate the tokens hourly"|0.90||DECISION|12-{len(text) - 8}')
    store = str(tmp_path / "s.engram")
    runner = CliRunner()
    assert runner.invoke(cli, ["init", store, "--kdf", "t=1,m=8,p=1"], env=env).exit_code == 0
    assert runner.invoke(cli, ["import", str(tmp_path / "doc.aaak"), store], env=env).exit_code == 0
    out = runner.invoke(cli, ["context", store, "rotate tokens", "--source-text", str(tmp_path / "book.txt"),
                              "--json"], env=env)
    assert out.exit_code == 0, out.output
    import json
    assert [p["text"] for p in json.loads(out.stdout)["passages"]] == [
        "We decided to rotate the tokens hourly because of the audit."]


@pytest.mark.parametrize("call, kwargs, names", [
    ("recall_result", {"query": 3}, "recall_result"),
    ("recall_result", {"top_k": -1}, "top_k"),
    ("recall_result", {"top_k": "5"}, "top_k"),
    ("recall_result", {"hops": "no"}, "hops"),
    ("recall_result", {"expand_query": 1}, "hops"),
    ("recall_result", {"source": b"text"}, "source"),
    ("recall_result", {"tokenizer": "default"}, "tokenizer"),
    ("inject_context", {"max_zettels": -1}, "max_zettels"),
    ("inject_context", {"selection": "best"}, "selection"),
    ("inject_context", {"format": "md"}, "format"),
    ("inject_context", {"min_weight": float("nan")}, "min_weight"),
    ("inject_context", {"max_token_budget": 1.5}, "max_token_budget"),
])
def test_argument_errors_hint_at_the_call_and_argument_not_at_node_fields(call, kwargs, names):
    # they carried ValidationError's default hint "help(engramdb.Node) for fields": the wrong object
    from engramdb.compress import inject_context

    result = compress("Alice moved to Berlin in May 2023. Bob stayed in Paris.")
    with pytest.raises(ValidationError) as info:
        if call == "recall_result":
            recall_result(result, **{"query": "Berlin", **kwargs})
        else:
            inject_context(result, **kwargs)
    hint = info.value.hint
    assert hint and "engramdb.Node" not in hint and hint != ValidationError.default_hint
    assert call in hint and names in hint
