"""The procedural graph: recording, the refiner (threshold, a failure-predicting transition,
rejected proposals), guidance, and the graph surviving a dump and restore."""
from __future__ import annotations

import io
import itertools
import json

import pytest

import engramdb
from engramdb.agent import ProceduralGraph
from engramdb.errors import ValidationError

from conftest import PASSPHRASE, TEST_KDF, tool_transcript as _transcript


GOOD = ["read_file", "edit_file", "run_tests"]
BAD = ["read_file", "write_file", "run_tests"]  # write_file right after read_file: the failing transition


def _record_synthetic(graph: ProceduralGraph, now: float, good: int = 9, bad: int = 6) -> None:
    for i in range(good):
        graph.record_trajectory(_transcript(f"fix parser bug {i}", GOOD), "success", now=now + i)
    for i in range(bad):
        graph.record_trajectory(_transcript(f"fix parser bug {i}", BAD), "failure", now=now + 100 + i)


def test_recording_counts_transitions_fallbacks_and_verifiers(tmp_engram, now):
    graph = ProceduralGraph(tmp_engram)
    graph.record_trajectory(_transcript("deploy the site", ["build", "upload", "sftp_upload", "run_tests"],
                                        failed=(1,)), "success", now=now)
    graph.record_trajectory(_transcript("deploy the site", ["build", "upload"]), "failure", now=now)
    edges = {e.key: e for e in graph.edges()}
    assert (edges[("build", "upload", "leads_to")].success, edges[("build", "upload", "leads_to")].failure) == (1, 1)
    assert edges[("start", "build", "leads_to")].success == 1
    assert ("sftp_upload", "upload", "fallback_for") in edges
    assert ("run_tests", "sftp_upload", "verifies") in edges
    assert {n.id: n.kind for n in graph.nodes()}["start"] == "state"
    assert [t.outcome for t in graph.trajectories()] == ["success", "failure"]
    assert graph.trajectories()[0].errors == (1,)
    with pytest.raises(ValidationError):
        graph.record_trajectory(_transcript("x", ["a"]), "maybe")


def test_refine_does_nothing_before_the_threshold(tmp_engram, now):
    graph = ProceduralGraph(tmp_engram, min_trajectories=10)
    _record_synthetic(graph, now, good=5, bad=4)
    rows_before = tmp_engram.procedure_rows()
    report = graph.refine(now=now)
    assert report.skipped == "9 trajectories recorded; refining needs 10"
    assert report.proposed == report.applied == []
    assert tmp_engram.procedure_rows() == rows_before


def test_a_failure_predicting_transition_becomes_a_pitfall(tmp_engram, now):
    graph = ProceduralGraph(tmp_engram)
    _record_synthetic(graph, now)
    report = graph.refine(now=now)
    pitfalls = [a for a in report.applied if a["op"] == "add_pitfall"]
    assert ("read_file", "write_file") in {(a["src"], a["dst"]) for a in pitfalls}
    edge = {e.key: e for e in graph.edges()}[("read_file", "write_file", "leads_to")]
    assert edge.pitfalls and "preceded failure" in edge.pitfalls[0]
    assert edge.failure == 6 and edge.success == 0
    # guidance for a similar task follows the successful path and warns about the pitfall
    text = graph.guidance_for("fix the parser bug in the tokenizer")
    assert text.startswith("## Procedure")
    assert "1. read_file\n2. edit_file" in text
    assert "write_file right after read_file preceded failure" in text
    assert graph.guidance_for("plan a birthday party") == ""
    # decided proposals are not proposed again
    again = graph.refine(now=now)
    assert again.proposed == [] and set(again.already_decided) >= {a["op"] + "|read_file|write_file|leads_to"
                                                                   for a in pitfalls}


def test_a_rejected_proposal_is_not_proposed_again(tmp_engram, now):
    graph = ProceduralGraph(tmp_engram)
    _record_synthetic(graph, now)
    calls = []

    def proposer(contrast):
        calls.append(contrast)
        assert contrast["successes"] and contrast["failures"]
        assert all(set(t) == {"id", "task", "tools", "failed_calls"} for t in contrast["successes"])
        # wrong on purpose: edit_file -> run_tests is what successful trajectories do
        return [{"op": "add_pitfall", "src": "edit_file", "dst": "run_tests", "text": "never test after editing"}]

    first = graph.refine(proposer=proposer, now=now)
    assert [r["src"] for r in first.rejected] == ["edit_file"] and first.applied == []
    assert "ended in failure" in first.rejected[0]["why"]
    assert graph.decided() == {"add_pitfall|edit_file|run_tests|leads_to": "rejected"}
    second = graph.refine(proposer=proposer, now=now + 1)
    assert len(calls) == 2 and "add_pitfall|edit_file|run_tests|leads_to" in calls[1]["decided"]
    assert second.proposed == [] and second.already_decided == ["add_pitfall|edit_file|run_tests|leads_to"]
    assert all(not e.pitfalls for e in graph.edges())  # nothing was applied


def test_a_proposal_no_held_out_trajectory_takes_stays_undecided(tmp_engram, now):
    graph = ProceduralGraph(tmp_engram)
    _record_synthetic(graph, now)
    report = graph.refine(proposer=lambda c: [{"op": "add_edge", "src": "lint", "dst": "edit_file",
                                               "relation": "verifies", "text": "lint after editing"}], now=now)
    assert [u["src"] for u in report.unvalidated] == ["lint"] and graph.decided() == {}


@pytest.mark.parametrize("bad, match", [
    ([{"op": "delete_everything", "src": "a", "dst": "b"}], "op 'delete_everything'"),
    ([{"op": "add_pitfall", "src": "a"}], "proposal 0: dst must be a non-empty string"),
    ([{"op": "add_edge", "src": "a", "dst": "b", "relation": "causes"}], "relation 'causes'"),
    (["not a mapping"], "proposal 0 is a str"),
])
def test_malformed_proposals_are_named(tmp_engram, now, bad, match):
    graph = ProceduralGraph(tmp_engram, min_trajectories=2)
    _record_synthetic(graph, now, good=2, bad=2)
    with pytest.raises(ValidationError, match=match):
        graph.refine(proposer=lambda c: bad, now=now)


def test_the_graph_round_trips_through_a_dump(tmp_path, now):
    db = engramdb.open(tmp_path / "a.engram", passphrase=PASSPHRASE, kdf=TEST_KDF)
    with db:
        db.remember("a memory", now=now)
        graph = ProceduralGraph(db)
        _record_synthetic(graph, now)
        graph.refine(now=now)
        before = graph.to_dict()
        guidance = graph.guidance_for("fix parser bug")
        buf = io.StringIO()
        db.dump(buf)
    assert buf.getvalue().count("\n@p ") == len(before["nodes"]) + len(before["edges"]) + 15 + len(before["decided"])
    engramdb.restore(io.StringIO(buf.getvalue()), tmp_path / "b.engram", passphrase=PASSPHRASE, kdf=TEST_KDF)
    with engramdb.open(tmp_path / "b.engram", passphrase=PASSPHRASE) as db2:
        graph2 = ProceduralGraph(db2)
        assert graph2.to_dict() == before
        assert graph2.guidance_for("fix parser bug") == guidance
        again = io.StringIO()
        db2.dump(again)
        assert again.getvalue() == buf.getvalue()
        # the restored rows stay writable: the same row has the same key
        graph2.record_trajectory(_transcript("fix parser bug", GOOD), "success", now=now)
        assert graph2.to_dict()["trajectories"] == 16
        assert db2.verify() == []


def test_rows_are_keyed_by_content_whatever_their_key_order(tmp_engram):
    with tmp_engram.transaction() as tx:
        tx.put_procedure_row({"b": 1, "a": {"y": 2, "x": [1, {"d": 0, "c": 1}]}})
        tx.put_procedure_row({"a": {"x": [1, {"c": 1, "d": 0}], "y": 2}, "b": 1})
    assert tmp_engram.procedure_rows() == [{"a": {"x": [1, {"c": 1, "d": 0}], "y": 2}, "b": 1}]
    with tmp_engram.transaction() as tx:
        assert tx.delete_procedure_row({"b": 1, "a": {"y": 2, "x": [1, {"d": 0, "c": 1}]}})
        assert not tx.delete_procedure_row({"b": 1})
        with pytest.raises(ValidationError):
            tx.put_procedure_row(["not", "a", "map"])
    assert tmp_engram.procedure_rows() == []


@pytest.mark.parametrize("returned", [None, 3, "add_pitfall", {"proposals": []}])
def test_a_proposer_that_returns_no_list_is_a_validation_error(tmp_engram, now, returned):
    # None or a number raised a bare TypeError from iterating it; a string or a mapping (a
    # model's {"proposals": [...]} parsed) was iterated as characters or keys.
    graph = ProceduralGraph(tmp_engram, min_trajectories=2)
    _record_synthetic(graph, now, good=2, bad=2)
    with pytest.raises(ValidationError, match="the proposer returned"):
        graph.refine(proposer=lambda c: returned, now=now)
    assert graph.decided() == {}


@pytest.mark.parametrize("kwargs", [{"holdout": "0.3"}, {"holdout": None}, {"min_trajectories": True}])
def test_graph_arguments_of_the_wrong_type_are_validation_errors(tmp_engram, kwargs):
    with pytest.raises(ValidationError):
        ProceduralGraph(tmp_engram, **kwargs)


def test_guidance_and_recording_arguments_of_the_wrong_type_are_validation_errors(tmp_engram, now):
    # each raised a bare TypeError (a proposer that is no callable only once refine() ran)
    graph = ProceduralGraph(tmp_engram, min_trajectories=2)
    _record_synthetic(graph, now, good=2, bad=2)
    for kwargs in ({"min_overlap": "0.5"}, {"min_overlap": None}, {"max_steps": "3"}, {"max_steps": 0},
                   {"max_steps": True}):
        with pytest.raises(ValidationError, match=next(iter(kwargs))):
            graph.guidance_for("fix parser bug", **kwargs)
    with pytest.raises(ValidationError, match="task"):
        graph.record_trajectory(_transcript("x", ["a"]), "success", task=5)
    with pytest.raises(ValidationError, match="proposer"):
        ProceduralGraph(tmp_engram, proposer=5)
    with pytest.raises(ValidationError, match="proposer"):
        graph.refine(proposer="propose", now=now)
    assert len(graph.trajectories()) == 4 and graph.decided() == {}


def test_a_tool_named_start_or_end_is_not_the_start_or_end_state(tmp_engram, now):
    # tools were nodes by their name, so a tool named "start" or "end" was the built-in state:
    # edges edit->start, start->end, end->end mixed the states with the tools
    graph = ProceduralGraph(tmp_engram)
    graph.record_trajectory(_transcript("ship the release", ["edit", "start", "end", "tool:end"]), "success", now=now)
    assert sorted(e.key for e in graph.edges() if e.relation == "leads_to") == [
        ("edit", "tool:start", "leads_to"), ("start", "edit", "leads_to"), ("tool:end", "tool:tool:end", "leads_to"),
        ("tool:start", "tool:end", "leads_to"), ("tool:tool:end", "end", "leads_to")]
    assert [(n.id, n.kind, n.label) for n in graph.nodes()] == [
        ("edit", "action", "edit"), ("end", "state", "end"), ("start", "state", "start"),
        ("tool:end", "action", "end"), ("tool:start", "action", "start"), ("tool:tool:end", "action", "tool:end")]
    assert graph.trajectories()[0].tools == ("edit", "start", "end", "tool:end")
    assert graph.guidance_for("ship the release").splitlines()[2:] == ["1. edit", "2. start", "3. end", "4. tool:end"]


def test_procedure_rows_written_before_tool_ids_were_escaped_read_the_same(tmp_engram, now):
    # an older version stored a tool named "start" as the state itself; those rows stay as written
    old_rows = [{"row": "node", "id": "start", "kind": "state", "label": "start"},
                {"row": "node", "id": "end", "kind": "state", "label": "end"},
                {"row": "node", "id": "edit", "kind": "action", "label": "edit"},
                {"row": "edge", "src": "edit", "dst": "start", "relation": "leads_to", "condition": "",
                 "guidance": "", "pitfalls": [], "success": 1, "failure": 0},
                {"row": "trajectory", "id": "t000001-000000000000", "seq": 1, "tools": ["edit", "start"], "errors": [],
                 "outcome": "success", "task": "ship", "at": now}]
    with tmp_engram.transaction() as tx:
        for row in old_rows:
            tx.put_procedure_row(row)
    graph = ProceduralGraph(tmp_engram)
    def canonical(rows):
        return sorted(json.dumps(dict(row), sort_keys=True) for row in rows)

    assert canonical(tmp_engram.procedure_rows()) == canonical(old_rows)
    assert [e.key for e in graph.edges()] == [("edit", "start", "leads_to")]
    assert [(n.id, n.kind) for n in graph.nodes()] == [("edit", "action"), ("end", "state"), ("start", "state")]
    assert graph.trajectories()[0].tools == ("edit", "start")
    assert graph.to_dict()["trajectories"] == 1


def test_a_proposal_holding_a_lone_surrogate_is_stored_with_a_replacement_character(tmp_engram, now):
    # a model's JSON can hold half an escaped surrogate pair ("\\ud83d"): refine raised "cannot
    # encode value" (with a hint about Node fields) and decided nothing
    graph = ProceduralGraph(tmp_engram, min_trajectories=4)
    _record_synthetic(graph, now)
    proposal = {"op": "add_guidance", "src": "read_file", "dst": "edit_file", "text": "read it first \ud83d",
                "condition": "when \udfff"}
    report = graph.refine(proposer=lambda contrast: [proposal], now=now)
    assert [(p["text"], p["condition"]) for p in report.applied] == [("read it first \ufffd", "when \ufffd")]
    edge = {e.key: e for e in graph.edges()}[("read_file", "edit_file", "leads_to")]
    assert (edge.guidance, edge.condition) == ("read it first \ufffd", "when \ufffd")
    assert "2. edit_file: read it first \ufffd" in graph.guidance_for("fix parser bug")


@pytest.mark.parametrize("proposer", [
    lambda contrast: 1 / 0,
    lambda contrast: (p for p in [{"op": "add_pitfall", "src": "start", "dst": "end"}, 1 / 0]),
])
def test_a_proposer_that_raises_is_a_validation_error_and_nothing_is_decided(tmp_engram, now, proposer):
    # the model's own exception left refine raw (a caller catching EngramError missed it)
    graph = ProceduralGraph(tmp_engram, min_trajectories=2)
    _record_synthetic(graph, now, good=2, bad=2)
    rows = tmp_engram.procedure_rows()
    with pytest.raises(ValidationError, match="the proposer raised ZeroDivisionError") as info:
        graph.refine(proposer=proposer, now=now)
    assert isinstance(info.value.__cause__, ZeroDivisionError) and "nothing of what it was called for was written" in info.value.hint
    assert graph.decided() == {} and tmp_engram.procedure_rows() == rows


def test_a_proposer_returning_an_endless_generator_is_refused_after_a_bounded_read(tmp_engram, now):
    # refine read the generator to its end: an endless one hung it
    MAX_PROPOSALS = 1000  # spec/agent.md 4.3

    read = []

    def endless(contrast):
        for i in itertools.count():
            if i > MAX_PROPOSALS:  # the old code read on; stop it here instead of hanging the test
                raise AssertionError("read past the limit")
            read.append(i)
            yield {"op": "add_pitfall", "src": "start", "dst": f"t{i}"}

    graph = ProceduralGraph(tmp_engram, min_trajectories=2)
    _record_synthetic(graph, now, good=2, bad=2)
    rows = tmp_engram.procedure_rows()
    with pytest.raises(ValidationError, match=f"the proposer returned more than {MAX_PROPOSALS} proposals") as info:
        graph.refine(proposer=endless, now=now)
    assert "nothing was written" in info.value.hint and len(read) == MAX_PROPOSALS + 1
    assert graph.decided() == {} and tmp_engram.procedure_rows() == rows


@pytest.mark.parametrize("key", ["text", "condition"])
def test_a_proposal_text_over_a_memorys_limit_is_refused_and_nothing_written(tmp_engram, now, key):
    # a 17 MB text was applied and stored twice (the edge and the proposal row)
    from engramdb.records import MAX_CONTENT_BYTES as MAX_PROPOSAL_TEXT  # a memory's limit (spec/agent.md 4.3)

    graph = ProceduralGraph(tmp_engram, min_trajectories=2)
    _record_synthetic(graph, now, good=2, bad=2)
    rows = tmp_engram.procedure_rows()
    proposal = {"op": "add_guidance", "src": "read_file", "dst": "edit_file", key: "x" * (MAX_PROPOSAL_TEXT + 1)}
    with pytest.raises(ValidationError, match=f"the proposer's proposal 0: {key} is {MAX_PROPOSAL_TEXT + 1} "
                                              f"characters, more than {MAX_PROPOSAL_TEXT}"):
        graph.refine(proposer=lambda contrast: [proposal], now=now)
    assert graph.decided() == {} and tmp_engram.procedure_rows() == rows
    short = {**proposal, key: "x" * 50}  # a text within the limit is still taken
    assert graph.refine(proposer=lambda contrast: [short], now=now).proposed
