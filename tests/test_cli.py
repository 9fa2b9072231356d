"""The command line: every command, --json output, exit codes, and passphrase sources."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from engramdb.cli import cli

KDF = "t=1,m=8,p=1"


@pytest.fixture
def run(tmp_path):
    runner = CliRunner()

    def invoke(*args: str, env: dict | None = None, input: str | None = None):
        full_env = {"ENGRAM_PASSPHRASE": "pw", "ENGRAM_TEST_WEAK_KDF": "1", **(env or {})}
        return runner.invoke(cli, list(args), env=full_env, input=input, catch_exceptions=False)

    return invoke


def test_lifecycle(run, tmp_path):
    f = str(tmp_path / "c.engram")
    assert run("init", f, "--kdf", KDF).exit_code == 0
    added = run("add", f, "Alice moved to Berlin", "--tag", "people", "--id", "a1", "--json")
    assert added.exit_code == 0 and json.loads(added.output) == {"id": "a1"}
    assert run("add", f, "-", "--id", "a2", input="from stdin\n").exit_code == 0
    got = json.loads(run("get", f, "a1", "--json").output)
    assert got["content"] == "Alice moved to Berlin" and got["tags"] == ["people"]
    listed = [json.loads(line) for line in run("list", f, "--json").output.splitlines()]
    assert [n["id"] for n in listed] == ["a1", "a2"] and listed[1]["content"] == "from stdin"  # the final newline of stdin is not content
    assert [json.loads(x)["id"] for x in run("list", f, "--json", "--tag", "people").output.splitlines()] == ["a1"]
    info = json.loads(run("info", f, "--json").output)
    assert info["memories"] == 2 and info["encrypted"] is True
    assert run("verify", f).output.strip() == "ok"
    assert run("delete", f, "a2").exit_code == 0
    assert run("compact", f).exit_code == 0
    assert json.loads(run("verify", f, "--json").output) == []


def test_errors_exit_1_with_hint_and_no_traceback(run, tmp_path):
    f = str(tmp_path / "e.engram")
    run("init", f, "--kdf", KDF)
    missing = run("get", f, "nope")
    assert missing.exit_code == 1 and "error: no memory" in missing.output and "hint:" in missing.output
    wrong = run("list", f, env={"ENGRAM_PASSPHRASE": "bad"})
    assert wrong.exit_code == 1 and "passphrase does not unlock" in wrong.output
    assert "Traceback" not in missing.output + wrong.output
    again = run("init", f, "--kdf", KDF)
    assert again.exit_code == 1 and "exists already" in again.output
    assert run("get", str(tmp_path / "absent.engram"), "x").exit_code == 1


def test_usage_errors_exit_2(run, tmp_path):
    assert run("bogus").exit_code == 2
    assert run("init", str(tmp_path / "k.engram"), "--kdf", "nonsense").exit_code == 2
    assert run("add").exit_code == 2


def test_passphrase_file_and_rekey(run, tmp_path):
    f = str(tmp_path / "p.engram")
    pw = tmp_path / "pw.txt"
    pw.write_text("from-file\n")
    assert run("--passphrase-file", str(pw), "init", f, "--kdf", KDF, env={"ENGRAM_PASSPHRASE": ""}).exit_code == 0
    assert run("--passphrase-file", str(pw), "add", f, "x", "--id", "x").exit_code == 0
    result = run("--passphrase-file", str(pw), "rekey", f, "--kdf", KDF, env={"ENGRAM_NEW_PASSPHRASE": "next"})
    assert result.exit_code == 0, result.output
    assert run("get", f, "x", env={"ENGRAM_PASSPHRASE": "next"}).exit_code == 0
    assert run("--passphrase-file", str(pw), "get", f, "x").exit_code == 1


def test_recovery_key_and_key_file(run, tmp_path):
    f = str(tmp_path / "r.engram")
    out = run("init", f, "--kdf", KDF, "--recovery-key").output
    key = out.split(": ")[-1].strip()
    assert key.startswith("ERK1-")
    kf = tmp_path / "key.txt"
    kf.write_text(key)
    assert run("--key-file", str(kf), "info", f, env={"ENGRAM_PASSPHRASE": ""}).exit_code == 0


def test_export_and_import_key(run, tmp_path):
    f, k = str(tmp_path / "x.engram"), str(tmp_path / "x.key")
    run("init", f, "--kdf", KDF)
    assert run("export-key", f, k).exit_code == 0 and os.stat(k).st_mode & 0o777 == 0o600
    assert run("import-key", f, k).exit_code == 0


def test_plaintext_mode(run, tmp_path):
    f = str(tmp_path / "plain.engram")
    assert "PLAINTEXT" in run("--plaintext", "init", f).output
    assert run("--plaintext", "add", f, "visible", "--id", "v").exit_code == 0
    assert run("get", f, "v").exit_code == 1  # with a passphrase: mode mismatch


def test_no_passphrase_hint_names_plaintext(run, tmp_path):
    """A plaintext file opened without --plaintext and without a passphrase said only "set
    ENGRAM_PASSPHRASE, pass --passphrase-file FILE, or run in a terminal" (found by rev9):
    nothing a user of an unencrypted file would try."""
    f = str(tmp_path / "plain.engram")
    assert run("--plaintext", "init", f).exit_code == 0
    result = run("info", f, env={"ENGRAM_PASSPHRASE": ""})
    assert result.exit_code == 1 and "no passphrase given" in result.output
    assert "--plaintext" in result.output and "Traceback" not in result.output


def test_console_script_and_module_entry_points(tmp_path):
    env = {**os.environ, "ENGRAM_PASSPHRASE": "pw", "ENGRAM_TEST_WEAK_KDF": "1"}
    f = str(tmp_path / "m.engram")
    result = subprocess.run([sys.executable, "-m", "engramdb", "init", f, "--kdf", KDF], env=env,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    result = subprocess.run([sys.executable, "-m", "engramdb", "get", f, "missing"], env=env,
                            capture_output=True, text=True)
    assert result.returncode == 1 and "Traceback" not in result.stderr


def test_every_command_has_help_with_an_example(run):
    for name, command in cli.commands.items():
        assert command.help and "Example:" in command.help, name
        assert run(name, "--help").exit_code == 0


def test_dump_restore_diff_and_encrypted_dumps(run, tmp_path):
    a, b = str(tmp_path / "a.engram"), str(tmp_path / "b.engram")
    run("init", a, "--kdf", KDF)
    run("add", a, "Alice moved to Berlin | \"quoted\"\nsecond line", "--id", "m1", "--tag", "people")
    out = tmp_path / "a.aaak"
    assert run("dump", a, "-o", str(out)).exit_code == 0
    text = out.read_text(encoding="utf-8")
    assert text.startswith("FILE:") and "@end " in text
    assert run("restore", str(out), b, "--kdf", KDF).exit_code == 0
    assert run("diff", a, b).exit_code == 0
    refused = run("restore", str(out), b, "--kdf", KDF)
    assert refused.exit_code == 1 and "--force" in refused.output
    run("add", b, "only in b", "--id", "m2")
    changed = run("diff", a, b)
    assert changed.exit_code == 1 and "+@c m2|only in b" in changed.output
    assert run("restore", str(out), b, "--force", "--kdf", KDF).exit_code == 0
    assert run("diff", a, b).exit_code == 0
    # an edited dump is refused unless --allow-edited, and then still grammar-checked
    edited = tmp_path / "edited.aaak"
    edited.write_text(text.replace("second line", "edited line"), encoding="utf-8")
    assert run("restore", str(edited), str(tmp_path / "e.engram"), "--kdf", KDF).exit_code == 1
    assert run("restore", str(edited), str(tmp_path / "e.engram"), "--kdf", KDF, "--allow-edited").exit_code == 0
    # encrypted dumps: binary, sealed, restorable only with the dump passphrase
    enc = tmp_path / "a.aaak.enc"
    env = {"ENGRAM_DUMP_PASSPHRASE": "dump-secret"}
    assert run("dump", a, "--encrypt", "-o", str(enc), env=env).exit_code == 0
    assert b"Alice" not in enc.read_bytes()
    wrong = run("restore", str(enc), str(tmp_path / "c.engram"), "--kdf", KDF, env={"ENGRAM_DUMP_PASSPHRASE": "x"})
    assert wrong.exit_code == 1 and not (tmp_path / "c.engram").exists()
    assert run("restore", str(enc), str(tmp_path / "c.engram"), "--kdf", KDF, env=env).exit_code == 0
    assert run("diff", a, str(tmp_path / "c.engram")).exit_code == 0


def test_every_commands_help_shows_its_example_commands_whole():
    # click rewraps a paragraph: `fleet --help` joined its two example commands and broke the
    # second one before `--json`, so neither line could be copied into a shell as printed
    import click as click_module
    from click.testing import CliRunner as Runner

    from engramdb.cli import cli as root

    def commands(group: click_module.Group, prefix: list[str]):
        for name, command in sorted(group.commands.items()):
            yield [*prefix, name], command
            if isinstance(command, click_module.Group):
                yield from commands(command, [*prefix, name])

    checked = 0
    for path, command in commands(root, []):
        examples = [line.strip() for line in (command.help or "").splitlines()
                    if line.strip().startswith(("engramdb ", "ENGRAM_PASSPHRASE=... engramdb "))]
        if not examples:
            continue
        shown = Runner().invoke(root, [*path, "--help"], terminal_width=80).output
        lines = {line.strip() for line in shown.splitlines()}
        for example in examples:
            assert example in lines, (path, example)
            checked += 1
    assert checked >= 2
