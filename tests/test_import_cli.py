"""`engramdb import` / `engramdb export` end to end, into and out of an encrypted store."""
from __future__ import annotations

import json

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
