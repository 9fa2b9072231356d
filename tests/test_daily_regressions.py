"""Regression tests for the rough edges of issue 12 ("daily use"), one per bug."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import engramdb
from engramdb.cli import cli
from engramdb.errors import EngramError, FileMissingError, NotFoundError

PACKAGE = Path(engramdb.__file__).resolve().parent
KDF = "t=1,m=8,p=1"


@pytest.fixture
def run():
    runner = CliRunner()

    def invoke(*args, env: dict | None = None, input: str | bytes | None = None):
        full_env = {"ENGRAM_PASSPHRASE": "pw", "ENGRAM_TEST_WEAK_KDF": "1", "ENGRAM_KEY_FILE": None,
                    "ENGRAM_PLAINTEXT": None, **(env or {})}
        return runner.invoke(cli, [str(a) for a in args], env=full_env, input=input, catch_exceptions=False)

    return invoke


def test_bug14_a_long_id_is_shortened_in_messages(tmp_engram):
    with pytest.raises(NotFoundError) as info:
        tmp_engram.get("i" * 10_000)
    assert len(str(info.value)) < 300 and "10000 characters" in info.value.message
    with pytest.raises(NotFoundError) as info:
        tmp_engram.update("j" * 10_000, importance=0.5)
    assert len(info.value.message) < 200


def test_bug11_a_missing_directory_is_not_a_store_error(tmp_path):
    with pytest.raises(FileMissingError) as info:
        engramdb.open(tmp_path / "no" / "such" / "x.engram", passphrase="pw")
    assert "directory" in info.value.message and "verify" not in info.value.hint


def _hint_strings() -> list[tuple[str, str]]:
    found = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            values: list[ast.AST] = []
            if isinstance(node, ast.keyword) and node.arg == "hint":
                values.append(node.value)
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "default_hint" for t in node.targets):
                values.append(node.value)
            for value in values:
                for sub in ast.walk(value):
                    if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                        found.append((f"{path.name}:{sub.lineno}", sub.value))
    return found


def test_bug11_no_hint_cites_a_spec_page_the_package_does_not_ship():
    hints = _hint_strings()
    assert len(hints) > 50  # the walk found the hints
    assert [where for where, text in hints if "spec/" in text] == []


def test_bug11_cli_hints_name_cli_commands(run, tmp_path):
    f = tmp_path / "h.engram"
    run("init", f, "--kdf", KDF)
    assert run("add", f, "first", "--id", "a").exit_code == 0
    again = run("add", f, "second", "--id", "a")
    assert again.exit_code == 1 and "engramdb update" in again.output and "update()" not in again.output
    bad = run("recall", f, "x", "--after", "someday")
    assert bad.exit_code == 2 and "2023-05-01" in bad.output


def test_library_hints_speak_python():
    from engramdb.errors import DuplicateIdError, IndexMismatchError, ValidationError

    assert "db.update" in DuplicateIdError("x").hint
    assert "spec/" not in ValidationError("x").hint
    assert "verify(fix=True)" in IndexMismatchError("x").hint
    assert all(isinstance(cls("m").hint, str) for cls in (EngramError, ValidationError))


def test_bug9_a_failed_ingest_creates_and_changes_nothing_and_encoding_is_accepted(run, tmp_path):
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("Zoë moved to Montréal in 2021. She opened a café there.".encode("latin-1"))
    new = tmp_path / "new.engram"
    failed = run("ingest", new, latin)
    assert failed.exit_code == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["latin1.txt"]
    f = tmp_path / "s.engram"
    run("init", f, "--kdf", KDF)
    good = tmp_path / "good.txt"
    good.write_text("Alice moved to Berlin in 2023.", encoding="utf-8")
    mixed = run("ingest", f, good, latin)  # the second input fails: the first is not stored either
    assert mixed.exit_code == 1 and "--encoding" in mixed.output
    assert json.loads(run("info", f, "--json").output)["memories"] == 0
    ok = run("ingest", f, latin, "--encoding", "latin-1", "--json")
    assert ok.exit_code == 0, ok.output
    contents = [json.loads(line)["content"] for line in run("list", f, "--json").output.splitlines()]
    assert any("Montréal" in c for c in contents)
    assert run("ingest", f, latin, "--encoding", "no-such-codec").exit_code == 2


def test_bug10_a_byte_order_mark_is_not_stored(run, tmp_path, tmp_engram):
    book = tmp_path / "pg.txt"
    book.write_bytes("\ufeffThe Project Gutenberg eBook of Moby Dick. Call me Ishmael.".encode("utf-8"))
    f = tmp_path / "b.engram"
    run("init", f, "--kdf", KDF)
    assert run("ingest", f, book).exit_code == 0
    contents = [json.loads(line)["content"] for line in run("list", f, "--json").output.splitlines()]
    assert contents and not any("\ufeff" in c for c in contents)
    ids = tmp_engram.ingest("\ufeffCall me Ishmael. Some years ago I went to sea.")
    assert all(not tmp_engram.get(i).content.startswith("\ufeff") for i in ids)
    ctx = tmp_engram.recall_context("Ishmael sea")
    assert "\ufeff" not in ctx.text


def test_bug8_stdin_text_loses_its_final_newline(run, tmp_path):
    f = tmp_path / "n.engram"
    run("init", f, "--kdf", KDF)
    assert run("add", f, "-", "--id", "a", input="hi\n").exit_code == 0
    assert run("add", f, "-", "--id", "b", input="two\nlines\r\n\n").exit_code == 0
    assert json.loads(run("get", f, "a", "--json").output)["content"] == "hi"
    assert json.loads(run("get", f, "b", "--json").output)["content"] == "two\nlines"
    assert run("add", f, "keep trailing\n", "--id", "c").exit_code == 0  # an argument is taken as given
    assert json.loads(run("get", f, "c", "--json").output)["content"] == "keep trailing\n"


def _small_store(run, path, n=40):
    run("init", path, "--kdf", KDF)
    lines = "".join(json.dumps({"id": f"m{i:03d}", "content": f"memory {i} about topic {i % 7} and Berlin"}) + "\n"
                    for i in range(n))
    src = path.parent / (path.name + ".jsonl")
    src.write_text(lines)
    assert run("import", src, path).exit_code == 0


def test_bug5_a_restored_store_is_already_compact(run, tmp_path):
    import engramdb as e

    f, dump, back = tmp_path / "a.engram", tmp_path / "a.aaak", tmp_path / "b.engram"
    with e.open(f, passphrase="pw", kdf=e.KDFParams.for_tests()) as db:
        db.add_many([f"memory number {i} about Berlin, Lisbon and topic {i % 13}" for i in range(3000)], now=1e9)
    assert run("dump", f, "-o", dump).exit_code == 0
    assert run("restore", dump, back, "--kdf", KDF).exit_code == 0
    restored = back.stat().st_size
    assert run("compact", back).exit_code == 0
    assert restored <= back.stat().st_size * 1.02, (restored, back.stat().st_size)


def test_bug6_allow_edited_accepts_added_and_removed_records_with_a_warning(run, tmp_path):
    f, dump = tmp_path / "a.engram", tmp_path / "a.aaak"
    _small_store(run, f)
    assert run("dump", f, "-o", dump).exit_code == 0
    lines = dump.read_text(encoding="utf-8").splitlines(keepends=True)
    first_node = next(i for i, line in enumerate(lines) if line.startswith("@n "))
    node_end = next(i for i in range(first_node + 1, len(lines)) if not lines[i].startswith("@"))
    removed = lines[:first_node - 1] + lines[node_end:]  # the zettel line, @n and @c of the first memory
    cases = {
        "removed": "".join(removed),
        "no-final-newline": "".join(lines).rstrip("\n"),
        "both": "".join(removed).rstrip("\n"),
    }
    for name, text in cases.items():
        edited = tmp_path / f"{name}.aaak"
        edited.write_text(text, encoding="utf-8")
        target = tmp_path / f"{name}.engram"
        refused = run("restore", edited, target, "--kdf", KDF)
        assert refused.exit_code == 1 and "--allow-edited" in refused.output and not target.exists(), name
        accepted = run("restore", edited, target, "--kdf", KDF, "--allow-edited", "--json")
        assert accepted.exit_code == 0, (name, accepted.output)
        assert "warning: edited dump" in accepted.stderr, name
        expected = 39 if name != "no-final-newline" else 40
        assert json.loads(accepted.stdout)["memories"] == expected
    # a dump cut in the middle of a record still fails, flag or not
    cut = tmp_path / "cut.aaak"
    cut.write_text("".join(lines)[: len("".join(lines)) // 2], encoding="utf-8")
    assert run("restore", cut, tmp_path / "cut.engram", "--kdf", KDF, "--allow-edited").exit_code == 1
    assert "SHA-256 or record count" in run("restore", "--help").output


def test_bug6_read_dump_warns_in_python(tmp_path):
    import warnings

    from engramdb import aaak

    with engramdb.open(tmp_path / "w.engram", passphrase="pw", kdf=engramdb.KDFParams.for_tests()) as db:
        db.add("one", id="a")
        db.add("two", id="b")
        import io

        buf = io.StringIO()
        db.dump(buf)
    text = buf.getvalue().rstrip("\n")
    with pytest.raises(EngramError):
        list(aaak.read_dump(text))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        items = list(aaak.read_dump(text, allow_edited=True))
    assert len(items) == 3 and any("final LF" in str(w.message) for w in caught)


def test_progress_totals_for_restore_import_and_export(run, tmp_path, monkeypatch):
    import engramdb.cli as cli_mod

    f = tmp_path / "p.engram"
    _small_store(run, f, n=12)
    run("dump", f, "-o", tmp_path / "p.aaak")
    monkeypatch.setattr(cli_mod, "_show_progress", lambda stream: True)
    restored = run("restore", tmp_path / "p.aaak", tmp_path / "q.engram", "--kdf", KDF)
    exported = run("export", f, "-o", tmp_path / "p.jsonl")
    imported = run("import", tmp_path / "p.jsonl", tmp_path / "r.engram", "--create")
    for result, word in ((restored, "restoring"), (exported, "exporting"), (imported, "importing")):
        assert result.exit_code == 0 and word in result.stderr and "/12 [" in result.stderr, result.stderr
    quiet = run("export", f, "-o", tmp_path / "p2.jsonl", "--quiet")
    assert quiet.exit_code == 0 and quiet.stderr == ""


def test_a_failed_import_create_leaves_nothing(run, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "content": "x"}\n{"id": "a", "content": "again"}\n')
    target = tmp_path / "new.engram"
    result = run("import", bad, target, "--create")
    assert result.exit_code == 1
    assert not any(p.name.startswith("new.engram") for p in tmp_path.iterdir())
