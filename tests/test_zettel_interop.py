"""zettel-compress users' round trip: import its AAAK (entity table, importance), dump v3, give it back as v2."""
from __future__ import annotations

import io
from pathlib import Path

import pytest
from click.testing import CliRunner

import engramdb
from engramdb import aaak
from engramdb.backup import convert_dump_v2, import_records, zettel_view
from engramdb.cli import cli
from engramdb.importers import EntityTable, iter_aaak
from engramdb.records import Edge, Node

ORACLE = Path(__file__).resolve().parents[2] / "shared" / "data" / "zettel-compress"
NOW = 1_700_000_000.0


def _fixture(name: str) -> bytes:
    path = ORACLE / f"{name}.aaak"
    if not path.exists():
        pytest.skip(f"the zettel-compress reference outputs {ORACLE} are not beside this checkout")
    return path.read_bytes()


def _split(text: str) -> tuple[list[str], set[str]]:
    lines = text.split("\n")
    return [ln for ln in lines if not ln.startswith("T:")], {ln for ln in lines if ln.startswith("T:")}


@pytest.mark.parametrize("name", ["locomo-conv-26", "origin_of_species_pg1228"])
def test_imported_fixture_keeps_its_entity_table_and_comes_back_as_v2(make_db, tmp_path, name):
    raw = _fixture(name)
    reference = aaak.decode(raw.decode("utf-8"), strict=True)
    db = make_db()
    import_records(db, iter_aaak(raw, now=NOW))
    assert db.entity_table() == dict(reference.entity_index.code_to_name)
    for z in reference.zettels[:20]:
        assert db.get(z.id).importance == z.weight  # documented: importance from the weight
    dump = io.StringIO()
    db.dump(dump)
    text = dump.getvalue()
    assert "\n@meta entities|{" in text
    out = io.StringIO()
    assert convert_dump_v2(text, out) is False  # digit ids are kept
    v2 = out.getvalue()
    back = engramdb.decode(v2, strict=True)
    assert "warnings" not in back.meta
    # the zettel view is the reference file, except for the order of its tunnel lines
    # (a store keeps edges, not the order they were generated in)
    assert _split(v2)[0] == _split(raw.decode("utf-8"))[0]
    assert _split(v2)[1] == _split(raw.decode("utf-8"))[1]
    again = io.BytesIO()
    assert db.dump_v2(again) is False
    assert again.getvalue().decode("utf-8") == v2
    # the table survives restore, and dump | restore | dump is byte-identical
    copy = tmp_path / "copy.engram"
    engramdb.restore(text, copy, passphrase="pw", kdf=engramdb.KDFParams.for_tests())
    with engramdb.open(copy, passphrase="pw") as restored:
        assert restored.entity_table() == db.entity_table()
        second = io.StringIO()
        restored.dump(second)
    assert second.getvalue() == text


def test_cli_dump_format_v2_and_renumbering(tmp_path):
    env = {"ENGRAM_PASSPHRASE": "pw", "ENGRAM_TEST_WEAK_KDF": "1"}
    store = tmp_path / "s.engram"
    runner = CliRunner()
    assert runner.invoke(cli, ["init", str(store), "--kdf", "t=1,m=8,p=1"], env=env).exit_code == 0
    with engramdb.open(store, passphrase="pw") as db:
        db.add("We chose JWT for auth", id="jwt", entities=["JWT"], quote="We chose JWT", weight=0.9, now=NOW)
        db.add("Alice owns the rollout", id="rollout", entities=["Alice"], now=NOW)
        db.link("jwt", "rollout", "tunnel", label="JWT+ALC")
        db.link("jwt", "rollout", "related")
    result = runner.invoke(cli, ["dump", str(store), "--format", "v2"], env=env)
    assert result.exit_code == 0, result.output
    assert "numbered 001" in result.stderr
    lines = result.stdout.split("\n")
    assert lines[0] == "FILE:002|JWT+ALC|||v2"
    assert lines[1] == "E:ALC=Alice;JWT=JWT"
    assert lines[2] == '001:JWT||"We chose JWT"|0.90||'
    assert lines[3].startswith('002:ALC||"Alice owns the rollout"|')
    assert lines[4:] == ["T:001<->002|JWT+ALC"]  # only tunnels: v2 has no typed edges
    back = engramdb.decode(result.stdout, strict=True)
    assert [z.id for z in back.zettels] == ["001", "002"] and "warnings" not in back.meta
    refused = runner.invoke(cli, ["dump", str(store), "--format", "v2", "--encrypt"], env=env)
    assert refused.exit_code == 2


def test_entity_tables_of_two_imports_merge_without_changing_a_code(make_db):
    db = make_db()
    first = "FILE:001|AL1|||v2\nE:AL1=Allen;BOB=Bob\n001:AL1+BOB||\"q\"|0.50||"
    second = "FILE:001|AL1|||v2\nE:AL1=Alice;BOB=Bob\n001:AL1||\"r\"|0.50||"
    import_records(db, iter_aaak(first, now=NOW, id_prefix="a"))
    import_records(db, iter_aaak(second, now=NOW, id_prefix="b"))
    assert db.entity_table() == {"AL1": "Allen", "AL11": "Alice", "BOB": "Bob"}
    assert db.get("b001").entities == ("Alice",)


def test_iter_aaak_yields_the_entity_table_first():
    items = list(iter_aaak("FILE:001|A|||v2\nE:A=Ann\n001:A||\"q\"|1.70||", now=NOW))
    assert items[0] == EntityTable({"A": "Ann"})
    node = items[1]
    assert isinstance(node, Node) and node.importance == 1.0  # clamped into [0, 1]


def test_zettel_view_orders_numeric_ids_by_number_and_takes_the_document_date():
    nodes = [Node(id=i, content="c", quote="q", metadata={"aaak": {"date": "2023-05-08"}}) for i in ("1000", "999")]
    result, renumbered = zettel_view(nodes, [Edge("1000", "999", "tunnel", label="x")], {})
    assert not renumbered
    assert [z.id for z in result.zettels] == ["999", "1000"] and result.meta["date"] == "2023-05-08"
    assert [(t.from_id, t.to_id) for t in result.tunnels] == [("1000", "999")]


def test_inject_context_of_imported_memories_uses_the_imported_codes(make_db):
    db = make_db()
    doc = ("FILE:002|BN1|||v2\nE:BN1=Bennet;BN7=Bingley;ZZZ=Unused\n"
           '001:BN1+BN7||"Mr. Bennet met Mr. Bingley."|0.90||\n002:BN7||"Bingley left."|0.40||\nT:001<->002|BN7')
    import_records(db, iter_aaak(doc, now=NOW))
    text = db.inject_context(max_token_budget=500, format="aaak")
    assert "BN1=Bennet" in text and "BN7=Bingley" in text and "Unused" not in text
    assert "001:BN1+BN7|" in text
