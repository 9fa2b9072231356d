"""What the write API refuses though a stored record may hold it (records.check_written): the
reserved archive entry set by hand, and empty or blank tags; and export_jsonl of a stub."""
from __future__ import annotations

import io
import json
import os

import pytest
from click.testing import CliRunner

import engramdb
from engramdb.cli import cli
from engramdb.engram import Transaction
from engramdb.errors import ValidationError
from engramdb.importers import export_jsonl, iter_jsonl
from engramdb.records import ARCHIVE_KEY, Node

from conftest import PASSPHRASE, TEST_KDF

ENV = {"ENGRAM_PASSPHRASE": "pw", "ENGRAM_TEST_WEAK_KDF": "1"}
LONG = "Alice moved to Berlin in 2023 to start a new job. " * 10
ENTRY = {"length": 13, "tier": "hot", "truncated": False}


def _run(*args):
    return CliRunner().invoke(cli, list(args), env=ENV, catch_exceptions=False)


def _init(path):
    assert _run("init", str(path), "--kdf", "t=1,m=8,p=1").exit_code == 0


def _archived(db, now):
    """A memory archived whole ("kept"), one archived with truncation ("cut"), one live."""
    db.add(LONG, id="kept", tags=["people"], now=now)
    db.add(LONG, id="cut", now=now)
    db.add("short and live", id="live", now=now)
    db.archive("kept")
    db.archive("cut", truncate=True)


# --- the reserved archive entry -------------------------------------------------------

def test_update_refuses_the_reserved_archive_entry(tmp_engram, now):
    # it made a live memory a "stub" whose archive row did not exist: verify reported damage
    db = tmp_engram
    db.add("a live memory", id="m", now=now)
    with pytest.raises(ValidationError, match="reserved") as err:
        db.update("m", metadata={ARCHIVE_KEY: ENTRY})
    assert "archive(id)" in err.value.hint
    with pytest.raises(ValidationError, match="reserved"), db.transaction() as tx:
        tx.update("m", metadata={"k": 1, ARCHIVE_KEY: {**ENTRY, "truncated": True}})
    assert not db.get("m").archived and db.verify() == []


def test_no_public_update_of_a_transaction_sets_the_reserved_archive_entry(tmp_engram, now):
    # Transaction.update_stub (public before session 9, for archive's own stub write) wrote it
    db = tmp_engram
    db.add(LONG, id="m", now=now)
    updates = [name for name in dir(Transaction) if "update" in name and not name.startswith("_")]
    assert "update" in updates
    for name in updates:
        with pytest.raises(ValidationError, match="reserved"), db.transaction() as tx:
            getattr(tx, name)("m", metadata={ARCHIVE_KEY: ENTRY})
    assert not db.get("m").archived and db.verify() == []
    with db.transaction() as tx:  # archive, which writes the entry, still works inside one
        tx.archive("m")
    assert db.get("m").archived and db.get("m", full=True).content == LONG and db.verify() == []


@pytest.mark.parametrize("how", ["add", "add_node", "add_many", "import_many", "transaction"])
def test_new_memories_refuse_the_reserved_archive_entry(tmp_engram, now, how):
    db = tmp_engram
    item = {"id": "m", "content": "a live memory", "metadata": {ARCHIVE_KEY: ENTRY}}
    with pytest.raises(ValidationError, match="reserved"):
        if how == "add":
            db.add(**item, now=now)
        elif how == "add_node":
            db.add(Node(**item, created_at=now, last_accessed=now))
        elif how == "add_many":
            db.add_many([{"id": "ok", "content": "fine"}, item], now=now)
        elif how == "import_many":
            db.import_many([item], now=now)
        else:
            with db.transaction() as tx:
                tx.add(item, now=now)
    assert len(db) == 0 and db.verify() == []


def test_a_stub_keeps_its_entry_through_metadata_updates_and_archive_still_works(tmp_engram, now):
    db = tmp_engram
    _archived(db, now)
    stub = db.get("kept")
    db.update("kept", metadata={**stub.metadata, "k": 1})  # the stub's own entry, kept as it is
    db.update("kept", metadata={"k": 2})  # left out: kept (spec/maintenance.md, "Archive")
    assert db.get("kept").archived
    with pytest.raises(ValidationError, match="reserved"):  # changed: refused
        db.update("kept", metadata={ARCHIVE_KEY: {**stub.metadata[ARCHIVE_KEY], "length": 1}})
    assert db.verify() == []
    restored = db.unarchive("kept")
    assert restored.content == LONG and restored.metadata == {"k": 2}
    db.archive("kept")
    assert db.get("kept").archived and db.verify() == []


def test_copying_a_store_in_python_keeps_archived_memories(make_db, now):
    # a truncated archive's stub (no original exists) may be added; a whole one is added as
    # get(id, full=True), which the hint says
    src, dst = make_db("a.engram"), make_db("b.engram")
    _archived(src, now)
    with pytest.raises(ValidationError, match="reserved") as err:
        dst.add_many(list(src.scan()))
    assert "full=True" in err.value.hint
    dst.add_many([src.get(n.id, full=True) for n in src.scan()])
    assert dst.get("kept").content == LONG and not dst.get("kept").archived
    assert dst.get("cut").archived and dst.get("cut").metadata[ARCHIVE_KEY]["truncated"] is True
    assert dst.verify() == []


def test_a_dump_with_archived_memories_restores(make_db, tmp_path, now):
    src = make_db("a.engram")
    _archived(src, now)
    buf = io.StringIO()
    src.dump(buf)
    buf.seek(0)
    assert engramdb.restore(buf, tmp_path / "r.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) == 3
    with engramdb.open(tmp_path / "r.engram", passphrase=PASSPHRASE) as db:
        assert db.get("kept").archived and db.get("kept", full=True).content == LONG
        assert db.get("cut").archived and db.verify() == []


def test_cli_update_metadata_refuses_the_reserved_entry(tmp_path):
    f = tmp_path / "a.engram"
    _init(f)
    assert _run("add", str(f), "a live memory", "--id", "m").exit_code == 0
    result = _run("update", str(f), "m", "--metadata", json.dumps({ARCHIVE_KEY: ENTRY}))
    assert result.exit_code != 0 and "reserved" in result.output
    assert _run("verify", str(f)).output.strip() == "ok"


def test_cli_import_of_an_old_export_with_stubs_is_refused_not_damaged(tmp_path, now):
    # an export written before 5b67b1f (or by export_jsonl of db.scan()) has whole archives as
    # stubs: importing it made memories verify called damaged
    f = tmp_path / "b.engram"
    _init(f)
    stub = Node(id="kept", content=LONG[:200] + "...", tier="archive", created_at=now, last_accessed=now,
                metadata={ARCHIVE_KEY: {"length": len(LONG), "tier": "hot", "truncated": False}})
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps(_line(stub)) + "\n")
    result = _run("import", str(old), str(f))
    assert result.exit_code != 0 and "reserved" in result.output
    assert _run("verify", str(f)).output.strip() == "ok"
    # what the hint says: without the key, the preview imports as a live memory
    line = _line(stub)
    del line["metadata"][ARCHIVE_KEY], line["engramdb"]
    old.write_text(json.dumps(line) + "\n")
    assert _run("import", str(old), str(f)).exit_code == 0
    assert _run("verify", str(f)).output.strip() == "ok"


def _line(node: Node) -> dict:
    """The JSONL line export_jsonl writes for ``node``, written without its refusal."""
    buf = io.StringIO()
    export_jsonl([node.replace(metadata={})], buf)
    line = json.loads(buf.getvalue())
    line["metadata"] = dict(node.metadata)
    line["tier"] = line["engramdb"]["node"]["tier"] = node.tier
    return line


def test_export_jsonl_refuses_a_stub_and_exports_what_the_cli_exports(make_db, now):
    # export_jsonl(db.scan()) wrote the stub: the text past the preview was lost
    db = make_db()
    _archived(db, now)
    with pytest.raises(ValidationError, match="archived stub") as err:
        export_jsonl(db.scan(), io.StringIO())
    assert "full=True" in err.value.hint
    buf = io.StringIO()
    assert export_jsonl((db.get(n.id, full=True) if n.archived else n for n in db.scan()), buf) == 3
    back = {node.id: node for node in iter_jsonl(io.StringIO(buf.getvalue()))}
    assert back["kept"] == db.get("kept", full=True) and back["kept"].content == LONG
    assert back["cut"] == db.get("cut")  # truncated: the stub is all there is
    other = make_db("b.engram")
    other.add_many(list(back.values()))
    assert other.verify() == []


class _Pipe(io.RawIOBase):
    """A writer that cannot seek (a pipe, a terminal): what reaches it stays written."""

    def __init__(self) -> None:
        self.data = b""

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.data += bytes(b)
        return len(b)


@pytest.mark.parametrize("target", ["text file", "binary file", "appended fd", "middle of a file", "StringIO", "BytesIO",
                                    "pipe"])
def test_export_jsonl_of_a_stub_writes_nothing(make_db, now, tmp_path, target):
    # export_jsonl(db.scan(), fp) wrote the live memories' lines before it refused the stub:
    # a partial export that looked complete
    db = make_db()
    db.add("first live memory", id="a", now=now)
    db.add("second live memory", id="b", now=now)
    _archived(db, now)
    assert [n.id for n in db.scan()][:2] == ["a", "b"]  # the stub comes after lines were made
    before = "an earlier line\n"
    path = tmp_path / "out.jsonl"
    if target == "text file":
        path.write_text(before)
        fp = open(path, "a", encoding="utf-8")  # noqa: SIM115 (checked after close)
    elif target == "binary file":
        path.write_bytes(before.encode())
        fp = open(path, "ab")  # noqa: SIM115
    elif target == "appended fd":  # a shell's `>> out.jsonl` stdout: writes go to the end, tell() says 0
        path.write_text(before)
        fp = open(os.open(path, os.O_WRONLY | os.O_APPEND), "w", encoding="utf-8")  # noqa: SIM115
    elif target == "middle of a file":  # "r+" at the start of a file with lines: overwritten in place
        path.write_text(before)
        fp = open(path, "r+", encoding="utf-8")  # noqa: SIM115
    elif target == "StringIO":
        fp = io.StringIO()
        fp.write(before)
    elif target == "BytesIO":
        fp = io.BytesIO()
        fp.write(before.encode())
    else:
        fp = _Pipe()
        fp.write(before.encode())
    with pytest.raises(ValidationError, match="archived stub") as err:
        export_jsonl(db.scan(), fp)
    assert err.value.hint.startswith("nothing was written") and "full=True" in err.value.hint
    if target.endswith(("file", "fd")):
        fp.close()
        written = path.read_bytes()
    else:
        written = fp.data if target == "pipe" else fp.getvalue()
    assert (written.encode() if isinstance(written, str) else written) == before.encode()
    # the call the hint gives exports everything, the archived memory with its full text
    fp = io.StringIO()
    assert export_jsonl((db.get(n.id, full=True) if n.archived else n for n in db.scan()), fp) == 5
    assert {node.id: node.content for node in iter_jsonl(io.StringIO(fp.getvalue()))}["kept"] == LONG


def test_export_jsonl_takes_back_its_lines_when_reading_the_nodes_fails(now):
    def nodes():
        yield Node(id="a", content="x", created_at=now, last_accessed=now)
        raise OSError("the disk went away")

    fp = io.StringIO()
    with pytest.raises(OSError, match="went away"):
        export_jsonl(nodes(), fp)
    assert fp.getvalue() == ""
    with pytest.raises(ValidationError, match="Node objects") as err:
        export_jsonl([Node(id="a", content="x", created_at=now, last_accessed=now), {"id": "b"}], fp)
    assert fp.getvalue() == "" and err.value.hint.startswith("nothing was written")


# --- empty and blank tags -------------------------------------------------------------

@pytest.mark.parametrize("tag", ["", " ", "\t\n"])
def test_empty_or_blank_tags_are_refused(tmp_engram, now, tag):
    db = tmp_engram
    with pytest.raises(ValidationError, match="empty or blank tag"):
        db.add("x", tags=["people", tag], now=now)
    with pytest.raises(ValidationError, match="empty or blank tag"):
        db.add_many([{"id": "a", "content": "x", "tags": [tag]}], now=now)
    with pytest.raises(ValidationError, match="empty or blank tag"):
        db.import_many([{"id": "a", "content": "x", "tags": [tag]}], now=now)
    db.add("x", id="m", tags=["people"], now=now)
    with pytest.raises(ValidationError, match="empty or blank tag"):
        db.update("m", tags=["people", tag])
    assert db.get("m").tags == ("people",) and len(db) == 1


def test_a_blank_tag_stored_before_may_stay(tmp_engram, now):
    # written below the write API, as an older engramdb stored it: updates still work
    db = tmp_engram
    with db.transaction() as tx:
        Transaction._put_new(tx, Node(id="m", content="x", tags=("", "a"), created_at=now, last_accessed=now))
    db.update("m", tags=("", "a", "b"), importance=0.9)
    assert db.get("m").tags == ("", "a", "b")


def test_cli_tag_refuses_an_empty_tag(tmp_path):
    f = tmp_path / "a.engram"
    _init(f)
    assert _run("add", str(f), "x", "--id", "m", "--tag", "people").exit_code == 0
    result = _run("tag", str(f), "m", "")
    assert result.exit_code != 0 and "empty or blank tag" in result.output
    assert json.loads(_run("get", str(f), "m", "--json").output)["tags"] == ["people"]


def test_an_export_of_a_store_with_a_blank_tag_imports(tmp_path, now):
    # a store an older engramdb wrote may hold blank tags: `engramdb export` then `engramdb
    # import` (moving memories to a new file) refused the whole export; the blank tags, which
    # say nothing, are left out and everything else comes over
    src = engramdb.open(tmp_path / "a.engram", create=True, passphrase=PASSPHRASE, kdf=TEST_KDF)
    with src.transaction() as tx:
        Transaction._put_new(tx, Node(id="m", content="x", tags=("", "a", " "), created_at=now, last_accessed=now))
    buf = io.StringIO()
    export_jsonl(src.scan(), buf)
    src.close()
    (node,) = iter_jsonl(buf.getvalue())
    assert node.tags == ("a",)
    f = tmp_path / "e.jsonl"
    f.write_text(buf.getvalue())
    _init(tmp_path / "c.engram")
    result = _run("import", str(f), str(tmp_path / "c.engram"))
    assert result.exit_code == 0, result.output
    assert json.loads(_run("get", str(tmp_path / "c.engram"), "m", "--json").output)["tags"] == ["a"]


def test_a_trace_lite_source_with_a_blank_tag_imports(tmp_path):
    # regression (found by rev8): a Trace-Lite JSONL line (no engramdb block) with a blank tag
    # imported before the write API refused blank tags; since then `engramdb import` refused
    # the whole source. The blank tags are left out, everything else comes over.
    line = {"id": "t1", "content": "from another tool", "tags": ["", "keep", "  "], "importance": 0.7,
            "tier": "warm", "createdAt": "2024-01-02T03:04:05Z"}
    (node,) = iter_jsonl(json.dumps(line) + "\n")
    assert node.tags == ("keep",) and node.importance == 0.7
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps(line) + "\n")
    _init(tmp_path / "c.engram")
    result = _run("import", str(f), str(tmp_path / "c.engram"))
    assert result.exit_code == 0, result.output
    assert json.loads(_run("get", str(tmp_path / "c.engram"), "t1", "--json").output)["tags"] == ["keep"]


@pytest.mark.parametrize("how", ["put_new", "put_new_many"])
def test_no_public_put_of_a_transaction_stores_the_reserved_archive_entry(tmp_engram, now, how):
    # Transaction.put_new / put_new_many (public) stored a node as given: a live memory claiming
    # an archived original that does not exist, which verify reports as damage (the write API,
    # update and the former update_stub refuse it); a blank tag likewise
    db = tmp_engram
    stub = Node(id="m", content="preview", metadata={ARCHIVE_KEY: ENTRY}, created_at=now, last_accessed=now)
    blank = Node(id="b", content="x", tags=("a", " "), created_at=now, last_accessed=now)
    for node, match in ((stub, "reserved"), (blank, "empty or blank tag")):
        with pytest.raises(ValidationError, match=match), db.transaction() as tx:
            if how == "put_new":
                tx.put_new(node)
            else:
                tx.put_new_many([Node(id="fine", content="y", created_at=now, last_accessed=now), node])
    assert len(db) == 0 and db.verify() == []
    with db.transaction() as tx:  # a node the write API takes still goes in
        getattr(tx, how)(Node(id="ok", content="z", created_at=now, last_accessed=now)) if how == "put_new" \
            else tx.put_new_many([Node(id="ok", content="z", created_at=now, last_accessed=now)])
    assert db.ids() == ["ok"] and db.verify() == []
