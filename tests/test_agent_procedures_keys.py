"""Procedure rows are keyed by their blind index, not by an unkeyed hash of their content.

Found by rev9 (2026-12-02): the key of a row was SHA-256(msgpack(row))[:16], so anyone holding
an encrypted file, without its passphrase, could confirm guesses such as "the agent ran pytest"
(a tool's node row is {"id", "kind", "label", "row"}, all guessable). spec/file-format.md says
no key holds plaintext content; a keyed hash (HMAC with the store's blind key) gives nothing.
"""
from __future__ import annotations

import hashlib

import pytest

import engramdb
from engramdb import codec
from engramdb.agent import ProceduralGraph
from engramdb.agent.procedures import node_id

from conftest import PASSPHRASE, TEST_KDF, tool_transcript as _transcript


def _unkeyed(row: dict) -> bytes:
    return hashlib.sha256(codec.pack(_sorted(row))).digest()[:16]


def _sorted(value):
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def _keys_and_rows(db) -> list[tuple[bytes, dict]]:
    with db.transaction() as tx:
        return [(key, tx.procedure_row(key)) for key in tx.procedure_keys()]


def test_no_key_confirms_a_guessed_row(tmp_path, now):
    with engramdb.open(tmp_path / "a.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        ProceduralGraph(db).record_trajectory(_transcript("fix the build", ["git_clone", "pytest"]), "success", now=now)
        stored = _keys_and_rows(db)
        assert stored and all(row is not None for _, row in stored)
        keys = {key for key, _ in stored}
        # an attacker's guess: the node row of a tool, hashed as the old key was
        guess = {"id": node_id("pytest"), "kind": "action", "label": "pytest", "row": "node"}
        assert any(row == guess for _, row in stored)  # the guess is right ...
        assert _unkeyed(guess) not in keys  # ... and the file does not say so
        assert all(key != _unkeyed(row) for key, row in stored)


def test_rows_under_the_old_unkeyed_keys_are_converted_by_the_first_procedure_write(tmp_path, now):
    path = tmp_path / "old.engram"
    with engramdb.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        graph = ProceduralGraph(db)
        graph.record_trajectory(_transcript("first", ["read_file", "run_tests"]), "success", now=now)
        rows = [row for _, row in _keys_and_rows(db)]
        # what a file written before 2026-12-02 holds: the same rows under their SHA-256 keys
        with db.transaction() as tx:
            for key in tx.procedure_keys():
                tx._txn.delete("procedures", key)
            for row in rows:
                data = codec.pack(_sorted(row))
                tx._txn.put("procedures", _unkeyed(row), data)
            tx._txn.delete("meta", b"procedures.blind")
        assert {key for key, _ in _keys_and_rows(db)} == {_unkeyed(row) for row in rows}
    with engramdb.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF, readonly=True) as db:
        assert sorted(map(repr, db.procedure_rows())) == sorted(map(repr, rows))  # read as they are
    with engramdb.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        before = ProceduralGraph(db).to_dict()
        ProceduralGraph(db).record_trajectory(_transcript("second", ["read_file", "run_tests"]), "success", now=now + 1)
        stored = _keys_and_rows(db)
        assert all(key != _unkeyed(row) for key, row in stored)  # every row converted
        after = ProceduralGraph(db).to_dict()
        assert after["trajectories"] == before["trajectories"] + 1 == 2
        edges = {(e["src"], e["dst"], e["relation"]): e for e in after["edges"]}
        assert len(edges) == len(after["edges"])  # the edge rows were replaced, not duplicated
        assert edges["read_file", "run_tests", "leads_to"]["success"] == 2
        with db.transaction() as tx:
            assert len(tx.procedure_keys()) == len(db.procedure_rows())
        assert db.verify() == []


def test_two_stores_list_the_same_rows_in_the_same_order(tmp_path, now):
    listed = []
    for name in ("a", "b"):
        with engramdb.open(tmp_path / f"{name}.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
            graph = ProceduralGraph(db)
            for i in range(4):
                graph.record_trajectory(_transcript(f"task {i}", ["read_file", "edit_file", "run_tests"][: 2 + i % 2]),
                                        "success", now=now + i)
            listed.append(db.procedure_rows())
    assert listed[0] == listed[1]


def test_compact_converts_the_old_keys_and_leaves_none_in_the_file(tmp_path, now):
    # found by rev10: the conversion deleted the old keys, but LMDB's free pages kept them
    # (every one of them, readable in the file); compact is what drops free pages, so it converts
    path = tmp_path / "old.engram"
    with engramdb.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        ProceduralGraph(db).record_trajectory(_transcript("first", ["read_file", "run_tests"]), "success", now=now)
        rows = [row for _, row in _keys_and_rows(db)]
        with db.transaction() as tx:
            for key in tx.procedure_keys():
                tx._txn.delete("procedures", key)
            for row in rows:
                tx._txn.put("procedures", _unkeyed(row), codec.pack(_sorted(row)))
            tx._txn.delete("meta", b"procedures.blind")
    old_keys = [_unkeyed(row) for row in rows]
    with engramdb.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.compact()
    raw = path.read_bytes()
    assert [key for key in old_keys if key in raw] == []
    with engramdb.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        assert sorted(map(repr, db.procedure_rows())) == sorted(map(repr, rows))
        assert all(key != _unkeyed(row) for key, row in _keys_and_rows(db))
        ProceduralGraph(db).record_trajectory(_transcript("second", ["read_file", "run_tests"]), "success", now=now + 1)
        edges = ProceduralGraph(db).to_dict()["edges"]
        assert len({(e["src"], e["dst"], e["relation"]) for e in edges}) == len(edges)
        assert db.verify() == []


def test_compact_of_a_file_without_procedure_rows_writes_no_marker(tmp_path):
    with engramdb.open(tmp_path / "a.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("a memory")
        db.compact()
        with db.transaction() as tx:
            assert tx._txn.get("meta", b"procedures.blind") is None


def test_two_rows_for_one_edge_give_the_same_winner_in_every_read_path(tmp_path):
    # found by rev10: procedure_rows() (the graph's reads) lists rows in value order and a
    # transaction's keys (record_trajectory, refine) come in blind-key order; with two rows for
    # one edge each path kept the last it met, so they disagreed on about half of such edges.
    # 16 edges, each with two hand-made rows (their blind keys are random per file): one winner
    # rule everywhere, the row whose msgpack bytes sort last.
    with engramdb.open(tmp_path / "dup.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        with db.transaction() as tx:
            for i in range(16):
                for success in (1, 7):
                    tx.put_procedure_row({"row": "edge", "src": f"tool{i}", "dst": "end", "relation": "leads_to",
                                          "condition": "", "guidance": f"take {success}", "pitfalls": [],
                                          "success": success, "failure": 0})
                for label in ("one", "two"):
                    tx.put_procedure_row({"row": "node", "id": f"tool{i}", "kind": "action", "label": label})
                for status in ("applied", "rejected"):
                    tx.put_procedure_row({"row": "proposal", "key": f"p{i}", "status": status})
        graph = ProceduralGraph(db)
        read = graph._rows()
        with db.transaction() as tx:
            written = graph._rows_in(tx)
        assert read.edges == written.edges and len(read.edges) == 16
        assert read.nodes == written.nodes and read.decided == written.decided
        winners = {e.key: (e.success, e.guidance) for e in graph.edges()}
        assert set(winners.values()) == {(7, "take 7")}  # "take 7" sorts after "take 1"
        assert {n.label for n in graph.nodes()} == {"two"}
        assert set(graph.decided().values()) == {"rejected"}


def test_converted_keys_are_a_format_feature_that_a_version_not_knowing_it_must_not_write(tmp_path, now):
    # rev10: an engramdb from before the blind keys wrote to a converted file as it always had
    # (unkeyed SHA-256 keys again: duplicate edges, the leak back) and nothing stopped it. Those
    # versions cannot be changed; from now on a file lists the format features it was written
    # with, and a version that finds one it does not know opens the file read-only only.
    from engramdb import format_features
    from engramdb.errors import FormatVersionError

    path = tmp_path / "f.engram"
    with engramdb.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        with db.transaction() as tx:
            assert format_features.held(tx._txn) == set()  # nothing converted yet
        ProceduralGraph(db).record_trajectory(_transcript("first", ["read_file", "run_tests"]), "success", now=now)
        with db.transaction() as tx:
            assert format_features.held(tx._txn) == {"procedure-keys-blind"}
            format_features.add(tx._txn, {"from-the-future"})  # as a newer version would
    with pytest.raises(FormatVersionError) as err:
        engramdb.open(path, passphrase=PASSPHRASE)
    assert "from-the-future" in err.value.message and "upgrade engramdb" in err.value.hint
    with engramdb.open(path, passphrase=PASSPHRASE, readonly=True) as db:  # reading still works
        assert len(ProceduralGraph(db).trajectories()) == 1
