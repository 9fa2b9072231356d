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
