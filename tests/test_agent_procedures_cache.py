"""Recording a trajectory reads only the procedure rows its graph object has not read before
(they are cached by key, and a key is a hash of its row's content), and the graph it builds is
the one an uncached object builds, with other writers, enclosing and aborted transactions and a
compaction in between. Before session 9 every call decrypted and parsed every row: recording
n trajectories took time quadratic in n."""
from __future__ import annotations

from contextlib import nullcontext

import pytest

import engramdb
from engramdb.agent import ProceduralGraph
from engramdb.agent import procedures
from engramdb.errors import ValidationError
from engramdb.store import Txn

from conftest import PASSPHRASE, TEST_KDF, tool_transcript as _transcript


TOOLSETS = [["read_file", "edit_file", "run_tests"], ["read_file", "write_file", "run_tests"],
            ["grep", "edit_file"], ["build", "upload", "sftp_upload", "run_tests"]]


class _Counter:
    """Counts procedure rows decrypted (read through the store) and written."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.read = 0
        self.written = 0
        items, get, put = Txn.items, Txn.get, Txn.put

        def counting_items(txn, table, *args, **kwargs):
            for pair in items(txn, table, *args, **kwargs):
                self.read += table == "procedures"
                yield pair

        def counting_get(txn, table, key):
            self.read += table == "procedures"
            return get(txn, table, key)

        def counting_put(txn, table, key, value):
            self.written += table == "procedures"
            return put(txn, table, key, value)

        monkeypatch.setattr(Txn, "items", counting_items)
        monkeypatch.setattr(Txn, "get", counting_get)
        monkeypatch.setattr(Txn, "put", counting_put)


def test_recording_reads_only_the_rows_written_since_the_last_call(tmp_engram, now, monkeypatch):
    graph = ProceduralGraph(tmp_engram)
    counter = _Counter(monkeypatch)
    reads, writes = [], []
    for i in range(80):
        read0, written0 = counter.read, counter.written
        graph.record_trajectory(_transcript(f"task {i}", TOOLSETS[i % 4], failed=(1,) if i % 3 else ()),
                                "success" if i % 2 else "failure", now=now + i)
        reads.append(counter.read - read0)
        writes.append(counter.written - written0)
    total = len(tmp_engram.procedure_rows())
    assert total > 100
    # each call decrypts what the call before it wrote, not the whole graph again
    assert all(reads[i] <= writes[i - 1] for i in range(1, len(reads))), (reads, writes)
    assert max(reads[1:]) <= 12


def _script(db, graph_of, now: float) -> None:
    """A fixed sequence of recordings on ``db`` (through ``graph_of(db)``), with writes by
    another handle, an enclosing transaction, an aborted one and a compaction."""
    graph = graph_of(db)

    def other_records(task: str, tools: list[str], outcome: str, at: float) -> None:
        with engramdb.open(db.path, passphrase=PASSPHRASE, kdf=TEST_KDF) as other:
            graph_of(other).record_trajectory(_transcript(task, tools, failed=(1,)), outcome, now=at)

    for i in range(6):
        graph.record_trajectory(_transcript(f"fix bug {i}", TOOLSETS[i % 4]), "success" if i % 3 else "failure",
                                now=now + i, call_id=f"c{i}")
    # another handle records: its rows and the edges it rewrote are new to this object
    other_records("deploy", TOOLSETS[3], "success", now + 10)
    graph.record_trajectory(_transcript("deploy again", TOOLSETS[3]), "failure", now=now + 11)
    # an enclosing transaction that commits: the second call sees the first's rows, and a row
    # the caller put itself
    with db.transaction() as tx:
        graph.record_trajectory(_transcript("fix bug 6", TOOLSETS[0]), "success", now=now + 12)
        tx.put_procedure_row({"row": "note", "text": "kept by the caller"})
        graph.record_trajectory(_transcript("fix bug 7", TOOLSETS[1]), "failure", now=now + 13)
    # an enclosing transaction that aborts: what this object parsed there was never stored,
    # and the seq numbers it took are taken again below, with other rows
    with pytest.raises(RuntimeError), db.transaction():
        graph.record_trajectory(_transcript("lost", TOOLSETS[2]), "success", now=now + 14, call_id="lost")
        graph.record_trajectory(_transcript("lost too", TOOLSETS[2]), "success", now=now + 15)
        raise RuntimeError("abort")
    other_records("other after the abort", TOOLSETS[2], "failure", now + 16)
    graph.record_trajectory(_transcript("lost", TOOLSETS[2]), "success", now=now + 17, call_id="lost")
    graph.record_trajectory(_transcript("retried", TOOLSETS[0]), "success", now=now + 18, call_id="c1")
    db.compact()
    for i in range(8):
        graph.record_trajectory(_transcript(f"fix parser bug {i}", TOOLSETS[i % 2]), "success" if i % 2 == 0
                                else "failure", now=now + 20 + i)
    graph.refine(now=now + 30)
    graph.record_trajectory(_transcript("after refining", TOOLSETS[1]), "failure", now=now + 31)


def _uncached(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ProceduralGraph, "_rows_in", lambda self, tx: procedures._Rows(tx.procedure_rows()))


def _run(tmp_path, name: str, now: float, graph_of) -> tuple[dict, list]:
    path = str(tmp_path / name)
    with engramdb.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        _script(db, graph_of, now)
        assert db.verify() == []
        return ProceduralGraph(db).to_dict(), db.procedure_rows()


def test_a_cached_graph_object_records_what_an_uncached_one_does(tmp_path, now, monkeypatch):
    graphs: dict[int, tuple[object, ProceduralGraph]] = {}  # the handle is kept: its id is not reused

    def long_lived(db):  # one object per handle for the whole script: its cache spans every step
        return graphs.setdefault(id(db), (db, ProceduralGraph(db, min_trajectories=4)))[1]

    cached = _run(tmp_path, "cached.engram", now, long_lived)
    with monkeypatch.context() as patch:
        _uncached(patch)
        uncached = _run(tmp_path, "uncached.engram", now, lambda db: ProceduralGraph(db, min_trajectories=4))
    assert cached == uncached
    graph, rows = cached
    tasks = sorted(row["task"] for row in rows if row.get("row") == "trajectory")
    assert tasks.count("lost") == 1 and "lost too" not in tasks  # the aborted rows are not there
    assert "retried" not in tasks  # c1 was recorded: its retry wrote nothing
    assert graph["decided"]  # refine decided something: its transaction read through the cache too
    assert sum(t.startswith("fix") for t in tasks) == 16


def test_procedure_row_by_key(tmp_engram):
    with tmp_engram.transaction() as tx:
        tx.put_procedure_row({"row": "note", "b": [1, 2], "a": "x"})
        keys = tx.procedure_keys()
        assert len(keys) == 1 and all(isinstance(k, bytes) for k in keys)
        assert tx.procedure_row(keys[0]) == {"a": "x", "b": [1, 2], "row": "note"}
        assert tx.procedure_row(b"\0" * 16) is None
        assert tx.procedure_row(b"") is None
        with pytest.raises(ValidationError, match="bytes"):
            tx.procedure_row("key")  # type: ignore[arg-type]
    assert tmp_engram.procedure_rows() == [{"a": "x", "b": [1, 2], "row": "note"}]


def test_guidance_on_an_unchanged_file_reads_no_row_and_matches_a_fresh_graph(tmp_path, now, monkeypatch):
    # fixE (session 9): guidance_for (every before_task with procedures) decrypted every row per
    # call, 16.9 ms at 1,000 trajectories; the rows read are now kept until the file moves on.
    path = tmp_path / "g.engram"
    db = engramdb.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF)
    other = engramdb.open(path, passphrase=PASSPHRASE)  # another handle writes between the calls
    try:
        graph = ProceduralGraph(db)
        counter = _Counter(monkeypatch)
        tasks = ["fix the login bug", "deploy the web app", "fix the login page"]
        for i in range(24):
            writer = ProceduralGraph(other) if i % 5 == 4 else graph
            writer.record_trajectory(_transcript(tasks[i % 3], TOOLSETS[i % 4], failed=(1,) if i % 7 == 3 else ()),
                                     "failure" if i % 4 == 3 else "success", now=now + i)
            if i % 6 == 5:  # an uncommitted row is seen inside a transaction, and not kept
                label = f"inside {i}"
                with pytest.raises(RuntimeError) if i % 12 == 5 else nullcontext(), db.transaction() as tx:
                    tx.put_procedure_row({"row": "node", "id": label, "kind": "action", "label": label})
                    assert label in {n.id for n in graph.nodes()}
                    if i % 12 == 5:
                        raise RuntimeError("rolled back")
                assert (label in {n.id for n in graph.nodes()}) == (i % 12 == 11)
            for task in tasks:
                fresh = ProceduralGraph(db)
                assert graph.guidance_for(task) == fresh.guidance_for(task)
                assert graph.to_dict() == fresh.to_dict()
                assert graph.trajectories() == fresh.trajectories()
        before = counter.read
        for task in tasks * 3:
            graph.guidance_for(task)
        graph.edges(), graph.nodes(), graph.to_dict()
        assert counter.read == before  # the old code: every row, every call
        other.add(id="elsewhere", content="a commit that is not a procedure row", now=now)
        assert graph.guidance_for(tasks[0]) == ProceduralGraph(db).guidance_for(tasks[0])
    finally:
        other.close()
        db.close()
