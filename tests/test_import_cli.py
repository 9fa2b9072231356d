"""`engramdb import` / `engramdb export` end to end, into and out of an encrypted store."""
from __future__ import annotations

import json

import pytest

from click.testing import CliRunner

from engramdb.cli import cli
from test_importers import terronex_file, tx_node

ENV = {"ENGRAM_PASSPHRASE": "pw", "ENGRAM_TEST_WEAK_KDF": "1"}
V2 = """FILE:002|ALC+BOB|2026-06-12|Auth Design|v2
E:ALC=Alice;BOB=Bob
001:ALC+BOB|authentication,security|"We decided to use JWT tokens."|0.91|conviction|DECISION+TECHNICAL
002:BOB|rollout|"Bob ships it on Friday."|0.40||
T:001<->002|BOB
"""


def _run(*args, env=None):
    return CliRunner().invoke(cli, list(args), env={**ENV, **(env or {})}, catch_exceptions=False)


def _init(path):
    assert _run("init", str(path), "--kdf", "t=1,m=8,p=1").exit_code == 0


def test_jsonl_export_import_round_trip(tmp_path):
    a, b = tmp_path / "a.engram", tmp_path / "b.engram"
    _init(a)
    _run("add", str(a), "Alice moved to Berlin", "--id", "m1", "--tag", "people")
    _run("add", str(a), "Bob likes tea", "--id", "m2")
    out = tmp_path / "m.jsonl"
    assert _run("export", str(a), "-o", str(out)).exit_code == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [m["id"] for m in lines] == ["m1", "m2"] and lines[0]["tags"] == ["people"]
    _init(b)
    result = _run("import", str(out), str(b))
    assert result.exit_code == 0 and "imported 2 memories" in result.output
    assert json.loads(_run("get", str(b), "m1", "--json").output) == json.loads(_run("get", str(a), "m1", "--json").output)
    again = _run("import", str(out), str(b))
    assert again.exit_code == 1 and "exists" in again.output  # nothing imported twice
    assert _run("verify", str(b)).output.strip() == "ok"


def test_an_export_of_archived_memories_imports_whole_and_verifies(tmp_path):
    # the export wrote an archived memory's stub (its preview and the reserved archive marker):
    # the import made a memory whose archive row was missing, `verify` said the file was
    # damaged, and the text past the preview was not in the export at all
    a, b = tmp_path / "a.engram", tmp_path / "b.engram"
    _init(a)
    long = "Alice moved to Berlin in 2023 to start a new job. " * 10
    _run("add", str(a), long, "--id", "kept", "--tag", "people")
    _run("add", str(a), long, "--id", "cut")
    _run("add", str(a), "short and live", "--id", "live")
    assert _run("archive", str(a), "kept").exit_code == 0
    assert _run("archive", str(a), "cut", "--truncate").exit_code == 0
    out = tmp_path / "m.jsonl"
    assert _run("export", str(a), "-o", str(out)).exit_code == 0
    lines = {m["id"]: m for m in map(json.loads, out.read_text().splitlines())}
    assert lines["kept"]["content"] == long and lines["kept"]["tier"] == "hot"
    assert "engramdb.archive" not in lines["kept"]["metadata"]
    assert lines["cut"]["tier"] == "archive"  # truncated: the preview is all there is
    assert _run("import", str(out), str(b), "--create").exit_code == 0
    assert _run("verify", str(b)).output.strip() == "ok"
    kept = json.loads(_run("get", str(b), "kept", "--json").output)
    assert kept["content"] == long and not kept["archived"] and kept["tags"] == ["people"]
    assert json.loads(_run("get", str(b), "cut", "--json").output)["archived"]


def test_aaak_v2_import_keeps_zettels_and_tunnels(tmp_path):
    src = tmp_path / "auth.aaak"
    src.write_text(V2)
    store = tmp_path / "s.engram"
    _init(store)
    result = _run("import", str(src), str(store), "--id-prefix", "auth-")
    assert result.exit_code == 0, result.output
    assert "imported 2 memories and 1 edges" in result.output
    node = json.loads(_run("get", str(store), "auth-001", "--json").output)
    assert node["flags"] == ["DECISION", "TECHNICAL"] and node["entities"] == ["Alice", "Bob"]


def test_terronex_import_with_embeddings(tmp_path):
    src = tmp_path / "legacy.engram"
    src.write_bytes(terronex_file([tx_node("n1", "first memory", embedding=[0.1, 0.2, 0.3]),
                                   tx_node("n2", "second memory", parent="n1")],
                                  passphrase="old", kdf="pbkdf2"))
    store = tmp_path / "new.engram"
    _init(store)
    failed = _run("import", str(src), str(store))
    assert failed.exit_code == 1 and "Traceback" not in failed.output
    ok = _run("import", str(src), str(store), env={"ENGRAM_SOURCE_PASSPHRASE": "old"})
    assert ok.exit_code == 0, ok.output
    info = json.loads(_run("info", str(store), "--json").output)
    assert info["memories"] == 2
    opening_the_foreign_file = _run("list", str(src))
    assert opening_the_foreign_file.exit_code == 1 and "engramdb import" in opening_the_foreign_file.output


# --- `import --resume`: streamed, a chunk per commit, stored ids skipped --------------------

def _open_store(path):
    import engramdb
    from conftest import TEST_KDF

    return engramdb.open(path, passphrase="pw", kdf=TEST_KDF)


def _jsonl_source(tmp_path, n=250):
    """A JSONL export of ``n`` memories with ids, timestamps and (every third) a vector:
    imported, each memory comes back exactly."""
    from engramdb.importers import export_jsonl

    nodes = [{"id": f"m{i:03d}", "content": f"memory {i} about topic {i % 7}", "created_at": 1000.0 + i,
              "last_accessed": 2000.0 + i, "tags": [f"t{i % 3}"],
              "embeddings": {"default": [float(i), 1.0, 0.5]} if i % 3 == 0 else {}} for i in range(n)]
    path = tmp_path / "src.engram"
    with _open_store(path) as db:
        db.add_space("default", dims=3, normalize=False)
        db.add_many(nodes)
        out = tmp_path / "src.jsonl"
        with open(out, "w", encoding="utf-8") as fh:
            export_jsonl(iter(db), fh)
    return out


def _contents(path):
    with _open_store(path) as db:
        edges = sorted((e.src, e.dst, e.kind, e.label, e.weight) for node in db for e in db.edges(node.id))
        return [n.to_dict() for n in db], edges, db.entity_table()


def _fail_on_call(monkeypatch, k):
    """The ``k``-th chunk's write raises a StoreError inside its transaction (a full disk, say)."""
    from engramdb.engram import Transaction
    from engramdb.errors import StoreError

    real, calls = Transaction._put_unstored, []

    def failing(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == k:
            raise StoreError("simulated: the disk is full")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Transaction, "_put_unstored", failing)


def test_an_interrupted_then_resumed_import_equals_a_one_shot_import(tmp_path, monkeypatch):
    from engramdb import bulk

    src = _jsonl_source(tmp_path)
    one, two = tmp_path / "one.engram", tmp_path / "two.engram"
    assert _run("import", str(src), str(one), "--create").exit_code == 0
    monkeypatch.setattr(bulk, "INGEST_CHUNK", 40)
    with monkeypatch.context() as m:
        _fail_on_call(m, 3)
        failed = _run("import", "--resume", str(src), str(two), "--create")
        assert failed.exit_code == 1 and "disk is full" in failed.output
    with _open_store(two) as db:
        assert len(db) == 80  # the two chunks before the failure are committed, and the file kept
    resumed = _run("import", "--resume", str(src), str(two), "--json")
    assert resumed.exit_code == 0, resumed.output
    assert json.loads(resumed.output) == {"file": str(two), "memories": 170, "skipped": 80, "repeated": 0,
                                          "edges": 0, "missing_edges": 0, "bad_embeddings": 0, "warnings": 0}
    assert _contents(two) == _contents(one)
    assert _run("verify", str(two)).output.strip() == "ok"
    again = _run("import", "--resume", str(src), str(two), "--json")  # nothing is added twice
    assert json.loads(again.output)["memories"] == 0 and json.loads(again.output)["skipped"] == 250
    refused = _run("import", str(src), str(two))  # without --resume: all or nothing, as before
    assert refused.exit_code == 1 and "exists" in refused.output


def test_a_resumed_aaak_import_keeps_its_entity_table_and_edges(tmp_path, monkeypatch):
    """Entity tables are merged as they come, edges written after the last memory: an
    import interrupted after its first memory and run again has both, as a one-shot one has."""
    from engramdb import bulk

    src = tmp_path / "auth.aaak"
    src.write_text(V2)
    one, two = tmp_path / "one.engram", tmp_path / "two.engram"
    assert _run("import", str(src), str(one), "--create").exit_code == 0
    monkeypatch.setattr(bulk, "INGEST_CHUNK", 1)
    with monkeypatch.context() as m:
        _fail_on_call(m, 2)
        assert _run("import", "--resume", str(src), str(two), "--create").exit_code == 1
    resumed = _run("import", "--resume", str(src), str(two))
    assert resumed.exit_code == 0, resumed.output
    assert "imported 1 memories and 1 edges" in resumed.output and "skipped 1" in resumed.output
    (nodes_one, edges_one, table_one), (nodes_two, edges_two, table_two) = _contents(one), _contents(two)
    fields = ("id", "content", "entities", "topics", "flags", "importance")  # not the import's clock
    assert [{k: n[k] for k in fields} for n in nodes_two] == [{k: n[k] for k in fields} for n in nodes_one]
    assert edges_two == edges_one == [("001", "002", "tunnel", "BOB", 1.0)]
    assert table_two == table_one == {"ALC": "Alice", "BOB": "Bob"}
    assert _run("verify", str(two)).output.strip() == "ok"


def test_a_resumed_import_holds_a_chunk_of_the_source_not_all_of_it(tmp_path, monkeypatch):
    """What the import holds is counted as the items read from the source and not yet handed
    to a write: a chunk with --resume, the whole source without it."""
    from engramdb import bulk, importers
    from engramdb.engram import Transaction

    src = _jsonl_source(tmp_path)
    monkeypatch.setattr(bulk, "INGEST_CHUNK", 40)
    read, written, held = [0], [0], []
    real_iter = importers.iter_import

    def counting_iter(*args, **kwargs):
        for item in real_iter(*args, **kwargs):
            read[0] += 1
            yield item

    def recording(real):
        def write(self, items, *args, **kwargs):
            items = list(items)
            held.append(read[0] - written[0])
            written[0] += len(items)
            return real(self, items, *args, **kwargs)
        return write

    monkeypatch.setattr(importers, "iter_import", counting_iter)
    monkeypatch.setattr(Transaction, "_put_unstored", recording(Transaction._put_unstored))
    monkeypatch.setattr(Transaction, "_put_new_many", recording(Transaction._put_new_many))
    assert _run("import", "--resume", str(src), str(tmp_path / "s.engram"), "--create").exit_code == 0
    assert read[0] == written[0] == 250 and len(held) == 7 and max(held) == 40
    read[0] = written[0] = 0
    held.clear()
    assert _run("import", str(src), str(tmp_path / "all.engram"), "--create").exit_code == 0
    assert held[0] == 250  # the default path reads the whole source before its first write


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_a_resumed_import_counts_ids_repeated_in_the_source_apart_from_stored_ones(tmp_path, monkeypatch):
    """A repeated id keeps its first copy (a one-shot import refuses the source) and is
    reported as a repeat, within a chunk and across chunks, interrupted or not."""
    from engramdb import bulk

    src = _jsonl(tmp_path / "rep.jsonl", [
        {"id": "a", "content": "first a"}, {"id": "a", "content": "second a"},  # one chunk
        {"id": "b", "content": "first b"}, {"id": "c", "content": "c"},
        {"id": "b", "content": "second b"},  # the chunk after b's
    ])
    monkeypatch.setattr(bulk, "INGEST_CHUNK", 2)
    one, two = tmp_path / "one.engram", tmp_path / "two.engram"
    refused = _run("import", str(src), str(one), "--create")  # all or nothing refuses it, saying why
    assert refused.exit_code == 1 and "the source holds the id 'a' more than once" in refused.output
    assert "exists" not in refused.output  # regression: it used to say the id was stored already
    done = _run("import", "--resume", str(src), str(one), "--create", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.output) == {"file": str(one), "memories": 3, "skipped": 0, "repeated": 2, "edges": 0,
                                       "missing_edges": 0, "bad_embeddings": 0, "warnings": 0}
    with _open_store(one) as db:
        assert sorted((n.id, n.content) for n in db) == [("a", "first a"), ("b", "first b"), ("c", "c")]
    again = _run("import", "--resume", str(src), str(one))
    assert again.exit_code == 0, again.output
    assert "imported 0 memories and 0 edges" in again.output
    assert "skipped 3 stored already, 2 repeated in the source (first kept)" in again.output
    with monkeypatch.context() as m:  # cut after the first chunk: a re-run counts the same repeats
        _fail_on_call(m, 2)
        assert _run("import", "--resume", str(src), str(two), "--create").exit_code == 1
    resumed = _run("import", "--resume", str(src), str(two), "--json")
    assert json.loads(resumed.output)["memories"] == 2
    assert json.loads(resumed.output)["skipped"] == 1 and json.loads(resumed.output)["repeated"] == 2
    with _open_store(two) as db:  # the same memories (not the import's clock)
        assert sorted((n.id, n.content) for n in db) == [("a", "first a"), ("b", "first b"), ("c", "c")]


def test_a_resumed_import_writes_the_good_edges_and_reports_the_bad_ones(tmp_path):
    """An edge naming a memory neither in the source nor stored is left out with a warning
    and a non-zero exit, after every memory and the other edges are stored: a re-run is not
    blocked, and once the memory is there a re-run writes the edge."""
    src = tmp_path / "bad.aaak"
    src.write_text(V2 + "T:001<->009|BOB\n")
    path = tmp_path / "b.engram"
    first = _run("import", "--resume", str(src), str(path), "--create")
    assert first.exit_code == 1
    assert "imported 2 memories and 1 edges" in first.output and "1 edge(s) left out" in first.output
    assert "warning: edge '001' -> '009' (tunnel) not imported" in first.output
    assert "error: 1 edge(s) name a memory that is neither in the source nor stored" in first.output
    assert _contents(path)[1] == [("001", "002", "tunnel", "BOB", 1.0)]
    again = _run("import", "--resume", str(src), str(path), "--json")
    assert again.exit_code == 1 and "warning: edge '001' -> '009'" in again.output
    summary = next(line for line in again.output.splitlines() if line.startswith("{"))  # stderr is mixed in
    assert json.loads(summary)["missing_edges"] == 1 and json.loads(summary)["skipped"] == 2
    assert _run("add", str(path), "the missing one", "--id", "009").exit_code == 0
    last = _run("import", "--resume", str(src), str(path))
    assert last.exit_code == 0, last.output
    assert "imported 0 memories and 1 edges" in last.output
    assert _contents(path)[1] == [("001", "002", "tunnel", "BOB", 1.0), ("001", "009", "tunnel", "BOB", 1.0)]
    assert _run("verify", str(path)).output.strip() == "ok"


def test_a_failed_import_leaves_no_embedding_space_and_no_memories_behind(tmp_path):
    """The import is all or nothing, but a vector that does not fit the space its first
    memory created failed after the space (and earlier batches) were committed: the
    corrected source was then refused ("space 'default' has 3 dims")."""
    store = tmp_path / "s.engram"
    _init(store)
    bad = tmp_path / "bad.jsonl"
    _jsonl(bad, [{"id": "a", "content": "x", "embedding": [1, 2, 3]},
                 {"id": "b", "content": "y", "embedding": [1, 2, 3, 4]}])
    result = _run("import", str(bad), str(store))
    assert result.exit_code == 1 and "3 dims" in result.output
    with _open_store(store) as db:
        assert db.spaces() == {} and len(db) == 0
    good = tmp_path / "good.jsonl"
    _jsonl(good, [{"id": "a", "content": "x", "embedding": [1, 2, 3, 4]}])
    assert _run("import", str(good), str(store)).exit_code == 0
    with _open_store(store) as db:
        assert db.spaces()["default"].dims == 4 and db.ids() == ["a"]


def test_an_import_failing_in_a_later_batch_writes_nothing(tmp_path):
    from engramdb.backup import import_records
    from engramdb.errors import EmbeddingError
    from engramdb.importers import EntityTable
    from engramdb.records import Node

    store = tmp_path / "s.engram"
    _init(store)
    items = [EntityTable({"ALC": "Alice"}), Node(id="a", content="x", embeddings={"v": (1.0, 2.0)}),
             Node(id="b", content="y"), Node(id="c", content="z", embeddings={"v": (1.0, 2.0, 3.0)})]
    with _open_store(store) as db:
        with pytest.raises(EmbeddingError):
            import_records(db, items, batch=1)
        assert len(db) == 0 and db.spaces() == {} and db.entity_table() == {}


def test_a_resumed_import_whose_chunk_fails_leaves_no_embedding_space_behind(tmp_path):
    """Each chunk of `import --resume` is all or nothing, but the space its first vector
    created was committed before the chunk: the chunk failed and the space stayed, so the
    corrected source was refused on every re-run."""
    store = tmp_path / "s.engram"
    _init(store)
    bad = _jsonl(tmp_path / "bad.jsonl", [{"id": "a", "content": "x", "embedding": [1, 2, 3]},
                                          {"id": "b", "content": "y", "embedding": [1, 2, 3, 4]}])
    result = _run("import", "--resume", str(bad), str(store))
    assert result.exit_code == 1 and "3 dims" in result.output
    with _open_store(store) as db:
        assert db.spaces() == {} and len(db) == 0
    good = _jsonl(tmp_path / "good.jsonl", [{"id": "a", "content": "x", "embedding": [1, 2, 3, 4]},
                                            {"id": "b", "content": "y", "embedding": [4, 3, 2, 1]}])
    assert _run("import", "--resume", str(good), str(store)).exit_code == 0
    with _open_store(store) as db:
        assert db.spaces()["default"].dims == 4 and db.ids() == ["a", "b"]


BROKEN_V2 = """FILE:003|ALC+BOB|2026-06-12|Auth Design|v2
E:ALC=Alice;BOB=Bob
001:ALC+BOB|authentication,security|"We decided to use JWT tokens."|0.91|conviction|DECISION+TECHNICAL
002 this line lost its colon and its quote
003:BOB|rollout|"Bob ships it on Friday."|0.40||
"""


def test_an_aaak_source_with_lines_the_reader_skipped_says_so(tmp_path):
    """The lenient AAAK reader skips a malformed zettel line with a warning in the result's
    meta, which the import dropped: a memory was lost without a word, exit status 0."""
    src = tmp_path / "broken.aaak"
    src.write_text(BROKEN_V2, encoding="utf-8")
    for resume in ([], ["--resume"]):
        store = tmp_path / f"s{len(resume)}.engram"
        _init(store)
        result = CliRunner().invoke(cli, ["import", *resume, str(src), str(store)], env=ENV)
        assert result.exit_code == 0, result.output
        assert "line 4" in result.stderr and "warning" in result.stderr, result.stderr
        assert "2 warning(s) about the source" in result.stdout
        with _open_store(store) as db:
            assert db.ids() == ["001", "003"]
    as_json = CliRunner().invoke(cli, ["import", "--json", "--id-prefix", "j", str(src), str(store)], env=ENV)
    assert json.loads(as_json.stdout)["warnings"] == 2


def test_an_encrypted_terronex_source_points_to_the_source_passphrase(tmp_path):
    """A wrong or missing Terronex passphrase got the store's hints: "check the passphrase
    (ENGRAM_PASSPHRASE or --passphrase-file); use the recovery key", which the source has not."""
    src = tmp_path / "brain.engram"
    src.write_bytes(terronex_file([tx_node("root", "the root")], passphrase="tx-pw"))
    store = tmp_path / "s.engram"
    _init(store)
    for env in ({"ENGRAM_SOURCE_PASSPHRASE": "wrong"}, {"ENGRAM_SOURCE_PASSPHRASE": None}):
        result = CliRunner().invoke(cli, ["import", str(src), str(store)], env={**ENV, **env})
        assert result.exit_code == 1
        assert "ENGRAM_SOURCE_PASSPHRASE" in result.output and "--source-passphrase-file" in result.output
        assert "recovery" not in result.output
    ok = CliRunner().invoke(cli, ["import", str(src), str(store)], env={**ENV, "ENGRAM_SOURCE_PASSPHRASE": "tx-pw"})
    assert ok.exit_code == 0, ok.output


def test_a_resumed_import_writes_edges_as_they_come_once_their_ends_are_stored(tmp_path, monkeypatch):
    """Every edge used to be held until the last memory was stored (~280 bytes each, ~263 MiB
    a million); those whose ends are stored are written a batch at a time. The edges are
    the same as a one-shot import's, and the missing one is still reported."""
    import engramdb
    from engramdb import backup
    from engramdb.records import Edge, Node

    nodes = [Node(id=f"n{i:03d}", content=f"memory {i}", created_at=1.0, last_accessed=1.0) for i in range(100)]
    edges = [Edge(f"n{a:03d}", f"n{(a + k) % 80:03d}", "related", weight=(a % 9) / 8, created_at=1.0)
             for k in (1, 2, 3) for a in range(80)]  # ends in the chunks written before the edges
    late = [Edge(f"n{i:03d}", "n000", "related", created_at=1.0) for i in range(80, 100)]  # the last chunk's
    before = Edge("n001", "old", "related", created_at=1.0)  # an end stored before this import
    gone = Edge("n002", "nowhere", "related", created_at=1.0)
    items = [*nodes, *edges[:120], before, gone, *late, *edges[120:]]
    monkeypatch.setattr(backup, "RESTORE_BATCH", 50)
    read, handed, held = [0], [0], []
    real_put = backup._put_new_edges

    def counting(items):
        for item in items:
            read[0] += isinstance(item, Edge)
            yield item

    def put(engram, batch):
        held.append(read[0] - handed[0])
        handed[0] += len(batch)
        return real_put(engram, batch)

    monkeypatch.setattr(backup, "_put_new_edges", put)
    one, two = str(tmp_path / "one.engram"), str(tmp_path / "two.engram")
    for path in (one, two):
        with engramdb.open(path, encrypted=False) as db:
            db.add("stored before", id="old")
    with engramdb.open(one, encrypted=False) as db:
        done = backup.import_resumable(db, counting(items), chunk=20)
        got = sorted((e.src, e.dst, e.weight) for n in db for e in db.edges(n.id))
    assert done.added == 100 and done.missing == [gone] and done.edges == len(items) - 100 - 1
    assert max(held) <= 50 + len(late) + 2  # a batch, and the edges that wait for the last memory
    with engramdb.open(two, encrypted=False) as db:
        backup.import_records(db, [item for item in items if item is not gone])
        assert got == sorted((e.src, e.dst, e.weight) for n in db for e in db.edges(n.id))


def test_list_json_imports_every_field_and_odd_timestamps_print(tmp_path):
    # `list --json` prints engramdb's own field names; `import` read the lines as Trace-Lite
    # Memories and dropped created_at, last_accessed, access_count, pinned, entities, weight,
    # ... without a word (created_at became the time of the import). And `list`/`get` of a
    # timestamp outside the years 1-9999 crashed with a raw ValueError traceback.
    import engramdb

    a, b = tmp_path / "a.engram", tmp_path / "b.engram"
    _init(a)
    with engramdb.open(a, passphrase="pw") as db:
        db.add_space("s", dims=2, model="m", normalize=False, auto=False)
        db.add("alpha", id="a", tags=["x"], metadata={"k": 1}, pinned=True, importance=0.9, created_at=1e9,
               last_accessed=1.25e9, access_count=4, entities=["Alice"], topics=["t"], quote="q", weight=0.7,
               flags=["DECISION"], emotions=["joy"], source_start=1, source_end=3, resolved_date="2023-01-01",
               source="chat", tier="warm", embeddings={"s": [3.0, 4.0]})
        db.add("beta", id="b", created_at=-5.5, last_accessed=1e12)
        originals = {n.id: n for n in db}
    listed = _run("list", str(a), "--json")
    assert listed.exit_code == 0
    assert _run("get", str(a), "b").exit_code == 0
    source = tmp_path / "list.jsonl"
    source.write_text(listed.output)
    _init(b)
    result = _run("import", str(source), str(b))
    assert result.exit_code == 0, result.output
    with engramdb.open(b, passphrase="pw") as db:
        assert {n.id: n for n in db} == originals


@pytest.mark.parametrize("line, message", [
    ('{"id": "a", "content": "x", "created_at": 1.0, "comment": 5}', "unknown keys comment"),
    ('{"id": "a", "content": "x", "pinned": true, "archived": true}', "archived memory's preview"),
])
def test_an_engramdb_shaped_line_that_would_lose_data_is_refused(tmp_path, line, message):
    source, b = tmp_path / "x.jsonl", tmp_path / "b.engram"
    source.write_text(line + "\n")
    _init(b)
    result = _run("import", str(source), str(b))
    assert result.exit_code == 1 and message in result.output
    assert json.loads(_run("stats", str(b), "--json").output)["memories"] == 0


def test_a_trace_lite_line_with_an_extra_engramdb_named_key_still_imports(tmp_path):
    # 6d7900b read any line holding one of engramdb's field names in engramdb's shape, so a
    # Trace-Lite export whose Memories carry an extra key of their own named like one of
    # engramdb's fields (weight, pinned, quote, ...) stopped importing ("mixes engramdb's field
    # names with unknown keys accessCount, createdAt, embedding"); it imported before (rev12).
    import engramdb

    source, b = tmp_path / "t.jsonl", tmp_path / "b.engram"
    source.write_text(json.dumps({"id": "m1", "content": "Alice moved to Berlin", "createdAt": "2026-01-01T00:00:00Z",
                                  "accessCount": 2, "weight": 0.5, "pinned": True}) + "\n"
                      + json.dumps({"id": "m2", "content": "x", "created_at": 1.0, "createdAt": 5000}) + "\n")
    _init(b)
    result = _run("import", str(source), str(b))
    assert result.exit_code == 0, result.output
    with engramdb.open(b, passphrase="pw") as db:
        first, second = db.get("m1"), db.get("m2")
    assert first.content == "Alice moved to Berlin" and first.access_count == 2
    assert first.created_at == 1767225600.0 and not first.pinned  # read as a Memory: extras ignored
    assert second.created_at == 5.0  # a Memory's createdAt (JavaScript milliseconds) wins


@pytest.mark.parametrize("resume", [False, True])
def test_import_now_gives_the_same_store_twice(tmp_path, resume):
    """A source without timestamps got the wall clock, so two imports of it differed in
    created_at; --now (as iter_import(now=) has) makes them identical."""
    src = tmp_path / "s.jsonl"
    src.write_text('{"id": "a", "content": "apples and pears"}\n{"id": "b", "content": "plums", "tags": ["x"]}\n')
    dumps = []
    for run in ("one", "two"):
        db = tmp_path / f"{run}.engram"
        _init(db)
        result = _run("import", *(["--resume"] if resume else []), "--now", "2026-06-01T12:00:00Z", str(src), str(db))
        assert result.exit_code == 0, result.output
        assert _run("dump", str(db), "-o", str(tmp_path / f"{run}.aaak")).exit_code == 0
        dumps.append((tmp_path / f"{run}.aaak").read_bytes())
        got = json.loads(_run("get", str(db), "a", "--json").output)
        assert got["created_at"].startswith("2026-06-01T12:00:00")
    assert dumps[0] == dumps[1]


def test_import_now_refuses_a_time_that_is_not_iso(tmp_path):
    src = tmp_path / "s.jsonl"
    src.write_text('{"id": "a", "content": "apples"}\n')
    result = CliRunner().invoke(cli, ["import", "--create", "--now", "yesterday", str(src), str(tmp_path / "n.engram")],
                                env=ENV)
    assert result.exit_code != 0
    assert "not an ISO 8601 time" in result.output and "2026-06-01T12:00:00Z" in result.output
    assert not (tmp_path / "n.engram").exists()


@pytest.mark.parametrize("resume", [False, True])
def test_jsonl_embedding_of_another_length_than_the_target_space_names_its_line(tmp_path, resume):
    """An embedding whose length differs from the TARGET store's space (not an earlier line)
    failed at insert time with "space 'default' has 4 dims, got a vector of 3": no line."""
    db = tmp_path / "t.engram"
    _init(db)
    first = tmp_path / "v4.jsonl"
    first.write_text('{"id": "a", "content": "apples", "embedding": [1, 2, 3, 4]}\n')
    assert _run("import", str(first), str(db)).exit_code == 0
    src = tmp_path / "v3.jsonl"
    src.write_text('{"id": "b", "content": "plums"}\n{"id": "c", "content": "pears", "embedding": [1, 2, 3]}\n')
    result = CliRunner().invoke(cli, ["import", *(["--resume"] if resume else []), str(src), str(db)], env=ENV)
    assert result.exit_code == 1
    assert "line 2: an embedding of 3 values, but space 'default' of the target store has 4 dims" in result.output
    assert "--space" in result.output  # what to do
    assert "Traceback" not in result.output
    # into a space of its own it imports
    assert _run("import", "--space", "other", str(src), str(tmp_path / "t.engram")).exit_code == 0
