"""Compressed memory in the file: ingest, recall_context over sources, inject_context, wake_up, CLI."""
from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

import engramdb
from engramdb.cli import cli
from engramdb.ingest import messages_to_text

from conftest import NOW

DOC = """Project Atlas kickoff

Alice Johnson leads Project Atlas. We decided to use PostgreSQL for the ledger because it is reliable.
Bob Smith worried about the migration timeline; he said the vendor contract ends in March 2024.

Later that week Alice moved the weekly sync to Thursday. She asked Bob to draft the rollback plan.
The team felt relief after the load test passed on 2024-02-12.

Carol from finance approved the budget. Never store credentials in the repository; Carol insisted on the vault.
"""

CHAT = [
    {"speaker": "Alice", "text": "I finally moved to Berlin last month!", "date": "2023-05-08"},
    {"speaker": "Bob", "text": "Congrats! How is the new job at the robotics company?", "date": "2023-05-08"},
    {"speaker": "Alice", "text": "Great, though I miss my sister Carol in Lisbon.", "date": "2023-05-09"},
]


def test_ingest_stores_zettels_with_exact_offsets(make_db):
    db = make_db()
    ids = db.ingest(DOC, title="Atlas kickoff", chunk_size=200, chunk_overlap=20, now=NOW)
    assert len(ids) >= 3 and len(db) == len(ids)
    nodes = [db.get(i) for i in ids]
    assert all(n.source == "Atlas kickoff" and n.created_at == NOW for n in nodes)
    assert any("Alice" in n.entities and "Bob" in n.entities for n in nodes)
    assert any("DECISION" in n.flags for n in nodes)
    context = db.recall_context("Who approved the budget?", max_tokens=400)
    assert "Carol" in context.text and "approved the budget" in context.text


def test_ingest_is_idempotent_and_deterministic(tmp_path):
    runs = []
    for n in range(2):
        with engramdb.open(tmp_path / f"i{n}.engram", passphrase="p", kdf=engramdb.KDFParams.for_tests()) as db:
            first = db.ingest(DOC, chunk_size=200, now=NOW)
            assert db.ingest(DOC, chunk_size=200, now=NOW + 5) == first and len(db) == len(first)
            runs.append([db.get(i) for i in first])
    assert runs[0] == runs[1]


def test_messages_become_chat_lines_with_date_headers(make_db):
    text = messages_to_text(CHAT)
    assert text.splitlines()[:2] == ["[2023-05-08]", "Alice: I finally moved to Berlin last month!"]
    assert "[2023-05-09]" in text
    db = make_db()
    ids = db.ingest(CHAT, now=NOW)
    nodes = [db.get(i) for i in ids]
    assert any("Alice" in n.entities and "Bob" in n.entities for n in nodes)
    assert any((n.resolved_date or "").startswith("2023-05") for n in nodes)


def test_tunnels_become_edges(make_db):
    db = make_db()
    ids = db.ingest(DOC + "\n\nAlice Johnson and Bob Smith reviewed Project Atlas again.\n", chunk_size=150, now=NOW)
    edges = [e for i in ids for e in db.edges(i)]
    assert edges and all(e.kind == "tunnel" and e.src in ids and e.dst in ids for e in edges)


def test_inject_context_respects_the_budget_and_wake_up_speaks(make_db):
    db = make_db()
    db.ingest(DOC, chunk_size=200, now=NOW)
    for budget in (20, 60, 200):
        out = db.inject_context(max_token_budget=budget, format="markdown")
        assert engramdb.estimate_tokens(out) <= budget
    assert db.inject_context(format="json") and json.loads(db.inject_context(format="json")) is not None
    assert db.wake_up().strip()


def test_ingest_leaves_no_plaintext_in_the_file(make_db):
    db = make_db()
    db.ingest(DOC, now=NOW)
    path = db.path
    db.close()
    raw = Path(path).read_bytes()
    for word in ("Atlas", "PostgreSQL", "Johnson", "credentials", "ledger"):
        assert word.encode() not in raw and word.lower().encode() not in raw


def test_cli_ingest_inject_wakeup(tmp_path):
    runner = CliRunner()
    env = {"ENGRAM_PASSPHRASE": "pw", "ENGRAM_TEST_WEAK_KDF": "1"}
    store = str(tmp_path / "s.engram")
    doc = tmp_path / "atlas.md"
    doc.write_text(DOC)
    chat = tmp_path / "chat.jsonl"
    chat.write_text("\n".join(json.dumps(m) for m in CHAT))
    assert runner.invoke(cli, ["init", store, "--kdf", "t=1,m=8,p=1"], env=env).exit_code == 0
    out = runner.invoke(cli, ["ingest", store, str(doc), str(chat), "--json"], env=env)
    assert out.exit_code == 0, out.output
    ids = json.loads(out.output)
    assert set(ids) == {str(doc), str(chat)} and all(ids.values())
    # 100: compress's default (zettel-compress's algorithm) keeps this short document in one
    # chunk whose AAAK line alone counts more than 80 tokens
    injected = runner.invoke(cli, ["inject", store, "--max-tokens", "100"], env=env)
    assert injected.exit_code == 0 and injected.output.strip()
    assert runner.invoke(cli, ["wakeup", store], env=env).output.strip()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    failed = runner.invoke(cli, ["ingest", store, str(bad), "--format", "jsonl"], env=env)
    assert failed.exit_code == 1 and "not JSON" in failed.output


def test_the_same_text_under_another_name_leaves_nothing_after_forget(tmp_path):
    # the second ingest stored no memory but kept the text under "copy.md", a row no memory
    # read: forget() of every memory left the whole document in the file
    path = tmp_path / "f.engram"
    with engramdb.open(path, encrypted=False) as db:
        ids = db.ingest(DOC, source_name="atlas.md", now=NOW)
        assert db.ingest(DOC, source_name="copy.md", now=NOW + 5) == ids
        assert db.stats()["tables"]["sources"]["entries"] == 1
        db.forget(ids=ids)
        assert db.stats()["tables"]["sources"]["entries"] == 0
    assert b"ledger" not in path.read_bytes()


def test_ingesting_again_leaves_the_stored_tunnels_alone(make_db):
    # every tunnel was written again: a new created_at (dumps differed), an unlinked tunnel
    # came back, and a user's own tunnel edge became a derived one (dropped by the next
    # link_tunnels)
    db = make_db()
    doc = DOC + "\n\nAlice Johnson and Bob Smith reviewed Project Atlas again.\n"
    ids = db.ingest(doc, chunk_size=150, now=NOW)
    edges = sorted((e.src, e.dst, e.label) for i in ids for e in db.edges(i))
    assert len(edges) >= 2
    (a, b, _), (c, d, _) = edges[:2]
    db.unlink(a, b, "tunnel")
    db.link(c, d, "tunnel", weight=7.0, label="mine")
    before = {(e.src, e.dst): e for i in ids for e in db.edges(i)}
    assert db.ingest(doc, chunk_size=150, now=NOW + 100) == ids
    assert {(e.src, e.dst): e for i in ids for e in db.edges(i)} == before
    db.link_tunnels(now=NOW)
    assert db.edges(c) and any(e.dst == d and e.label == "mine" and e.weight == 7.0 for e in db.edges(c))


def test_cli_ingest_refuses_a_binary_file_that_decodes(tmp_path):
    # zeros, or UTF-16 text without a byte-order mark, are valid UTF-8: they were stored as
    # memories of NULs and letters between NULs, which no query finds
    runner = CliRunner()
    env = {"ENGRAM_PLAINTEXT": "1"}
    store = str(tmp_path / "s.engram")
    assert runner.invoke(cli, ["init", store], env=env).exit_code == 0
    (tmp_path / "zeros.bin").write_bytes(b"\x00" * 1000)
    (tmp_path / "utf16.txt").write_bytes("Alice moved to Berlin in 2023.".encode("utf-16-le"))
    for name in ("zeros.bin", "utf16.txt"):
        result = runner.invoke(cli, ["ingest", store, str(tmp_path / name)], env=env)
        assert result.exit_code == 1 and "holds a NUL character" in result.stderr
        assert "--encoding utf-16" in result.stderr
    ok = runner.invoke(cli, ["ingest", store, str(tmp_path / "utf16.txt"), "--encoding", "utf-16-le"], env=env)
    assert ok.exit_code == 0, ok.output
    with engramdb.open(store, encrypted=False) as db:
        assert [n.content for n in db.scan()] == ["Alice moved to Berlin in 2023."]


def test_cli_ingest_checks_every_message_before_storing_any_input(tmp_path):
    # a message without text or with an unreadable date was found by ingest itself: the
    # inputs before it were stored already (the help says an input that cannot be read
    # changes nothing), and the error did not name the file
    runner = CliRunner()
    env = {"ENGRAM_PLAINTEXT": "1"}
    store = str(tmp_path / "s.engram")
    assert runner.invoke(cli, ["init", store], env=env).exit_code == 0
    (tmp_path / "good.md").write_text(DOC)
    (tmp_path / "bad.json").write_text(json.dumps([{"text": "hello", "date": "not a date"}]))
    (tmp_path / "bad.jsonl").write_text(json.dumps({"speaker": "Alice"}) + "\n")
    for bad in ("bad.json", "bad.jsonl"):
        result = runner.invoke(cli, ["ingest", store, str(tmp_path / "good.md"), str(tmp_path / bad)], env=env)
        assert result.exit_code == 1 and f"{tmp_path / bad}: message 0" in result.stderr
    with engramdb.open(store, encrypted=False) as db:
        assert len(db) == 0


def test_cli_ingest_now_gives_the_same_content_twice(tmp_path):
    # without a clock to inject, two ingests of the same inputs differed in every created_at
    runner = CliRunner()
    env = {"ENGRAM_PLAINTEXT": "1"}
    doc = tmp_path / "atlas.md"
    doc.write_text(DOC + "\n\nAlice Johnson and Bob Smith reviewed Project Atlas again.\n")
    dumps = []
    for n in range(2):
        store = str(tmp_path / f"s{n}.engram")
        assert runner.invoke(cli, ["init", store], env=env).exit_code == 0
        result = runner.invoke(cli, ["ingest", store, str(doc), "--chunk-size", "150", "--now", "2024-05-02T09:30:00Z"],
                               env=env)
        assert result.exit_code == 0, result.output
        assert runner.invoke(cli, ["dump", store, "-o", f"{store}.aaak"], env=env).exit_code == 0
        dumps.append(Path(f"{store}.aaak").read_text())
    assert dumps[0] == dumps[1] and "@e " in dumps[0]
    with engramdb.open(tmp_path / "s0.engram", encrypted=False) as db:
        assert {n.created_at for n in db.scan()} == {1714642200.0}
    bad = runner.invoke(cli, ["ingest", str(tmp_path / "s0.engram"), str(doc), "--now", "noon"], env=env)
    assert bad.exit_code == 1 and "not an ISO 8601 time" in bad.stderr
