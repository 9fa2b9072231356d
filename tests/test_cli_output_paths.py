"""Where the CLI writes: `-o -` is stdout, as the help's "instead of stdout" and the
stdin `-` of `add` and `restore` lead a user to expect (it made a file named "-")."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import engramdb


def _engramdb(*args: str, cwd: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "ENGRAM_PLAINTEXT": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("ENGRAM_PASSPHRASE", None)
    env.pop("ENGRAM_KEY_FILE", None)
    return subprocess.run([sys.executable, "-m", "engramdb", *args], env=env, cwd=cwd, capture_output=True)


@pytest.fixture
def store(tmp_path):
    path = str(tmp_path / "s.engram")
    with engramdb.open(path, encrypted=False) as db:
        db.add("alpha beta", id="a", now=1.0)
        db.add("gamma", id="b", now=2.0)
    return path


@pytest.mark.parametrize("command", [["dump"], ["dump", "--format", "v2"], ["export"]])
def test_output_dash_is_stdout_not_a_file_named_dash(store, tmp_path, command):
    to_file = _engramdb(command[0], store, *command[1:], "-o", "out", cwd=str(tmp_path))
    dashed = _engramdb(command[0], store, *command[1:], "-o", "-", cwd=str(tmp_path))
    assert to_file.returncode == 0 and dashed.returncode == 0, dashed.stderr
    assert not (tmp_path / "-").exists()
    assert dashed.stdout == (tmp_path / "out").read_bytes() != b""


def test_list_and_recall_print_one_line_per_memory_whatever_the_text_holds(tmp_path):
    """`list` and `recall` print a memory per line, but only LF was replaced: the CR of CRLF
    text moved the cursor back over the id, an escape sequence reached the terminal, and a
    tag or id with a newline split the line."""
    from click.testing import CliRunner

    from engramdb.cli import cli

    path = str(tmp_path / "s.engram")
    with engramdb.open(path, encrypted=False) as db:
        db.add("hello\r\nworld \x1b[2J\u2028 cleared\x85 next\x00", id="crlf", tags=["a\nb", "c\rd"], now=1.0)
        db.add("hello tail", id="id\x1b]0;title\x07", now=2.0)
        db.link("crlf", "id\x1b]0;title\x07", "related", label="two\r\nlines")
    env = {"ENGRAM_PLAINTEXT": "1", "ENGRAM_PASSPHRASE": None, "ENGRAM_KEY_FILE": None}
    for args in (["list", path], ["recall", path, "hello", "--top-k", "5"]):
        out = CliRunner().invoke(cli, args, env=env, catch_exceptions=False).stdout
        lines = out.splitlines()
        assert len(lines) == 2, (args, out)
        assert not any(ch in out for ch in "\r\x1b\x07\x00\x85\u2028"), (args, out)
        assert "crlf" in out and "hello world" in out and "a\\nb" in out and "id\\x1b]0;title\\x07" in out
    edges = CliRunner().invoke(cli, ["edges", path, "crlf"], env=env, catch_exceptions=False).stdout
    assert edges == "crlf -[related]-> id\\x1b]0;title\\x07  weight=1  two\\r\\nlines\n"


def test_export_refuses_a_space_the_store_does_not_have(tmp_path):
    """--space with a typo wrote every memory with "embedding": null and exit status 0."""
    from click.testing import CliRunner

    from engramdb.cli import cli

    path = str(tmp_path / "s.engram")
    with engramdb.open(path, encrypted=False) as db:
        db.add_space("minilm", dims=2, model="minilm", normalize=False)
        db.add("alpha", id="a", embeddings={"minilm": [0.5, 0.25]}, now=1.0)
    env = {"ENGRAM_PLAINTEXT": "1", "ENGRAM_PASSPHRASE": None, "ENGRAM_KEY_FILE": None}
    out = tmp_path / "m.jsonl"
    result = CliRunner().invoke(cli, ["export", path, "--space", "minlm", "-o", str(out)], env=env)
    assert result.exit_code == 1 and "minlm" in result.output and "minilm" in result.output
    assert not out.exists()
    result = CliRunner().invoke(cli, ["export", path, "--space", "minilm", "-o", str(out)], env=env)
    assert result.exit_code == 0 and '"embedding":[0.5,0.25]' in out.read_text()


def test_key_commands_on_a_plaintext_file_say_how_to_encrypt_it(tmp_path):
    """`init --plaintext --recovery-key` printed "created" and then failed (the file removed);
    `rekey` asked for a new passphrase before finding the file plaintext; both, and
    `recovery-key`, ended with the hint "pass the passphrase (or key) for an encrypted file"."""
    from click.testing import CliRunner

    from engramdb.cli import cli

    env = {"ENGRAM_PLAINTEXT": "1", "ENGRAM_PASSPHRASE": None, "ENGRAM_KEY_FILE": None,
           "ENGRAM_NEW_PASSPHRASE": None}
    new = tmp_path / "new.engram"
    result = CliRunner().invoke(cli, ["init", str(new), "--recovery-key"], env=env)
    assert result.exit_code == 2 and "created" not in result.output and "encrypted" in result.output
    assert not new.exists()
    path = str(tmp_path / "s.engram")
    with engramdb.open(path, encrypted=False) as db:
        db.add("alpha", id="a", now=1.0)
    for command in (["rekey", path], ["recovery-key", path]):
        result = CliRunner().invoke(cli, command, env=env)
        assert result.exit_code == 1, result.output
        assert "plaintext" in result.output and "engramdb restore" in result.output, result.output
        assert "new passphrase" not in result.output


def test_info_shows_the_embedding_spaces_the_dims_hint_points_to(tmp_path):
    """EmbeddingError's hint says "check the embedding space's dims with `engramdb info FILE`",
    but info showed no space; and stats ran a long space name into its figures
    ("space hashed-tfidf-v11 blocks")."""
    from click.testing import CliRunner

    from engramdb.cli import cli

    path = str(tmp_path / "s.engram")
    with engramdb.open(path, encrypted=False) as db:
        db.add_space("minilm-l6-v2", dims=3, model="all-MiniLM-L6-v2", normalize=False)
        db.add("alpha", id="a", embeddings={"minilm-l6-v2": [0.5, 0.25, 0.0]}, now=1.0)
        with pytest.raises(engramdb.EmbeddingError) as info:
            db.add("beta", id="b", embeddings={"minilm-l6-v2": [0.5, 0.25]}, now=1.0)
    assert "engramdb info" in info.value.hint
    env = {"ENGRAM_PLAINTEXT": "1", "ENGRAM_PASSPHRASE": None, "ENGRAM_KEY_FILE": None}
    text = CliRunner().invoke(cli, ["info", path], env=env, catch_exceptions=False).stdout
    assert "space minilm-l6-v2 model=all-MiniLM-L6-v2, dims=3" in text, text
    data = json.loads(CliRunner().invoke(cli, ["info", path, "--json"], env=env, catch_exceptions=False).stdout)
    assert data["spaces"]["minilm-l6-v2"]["dims"] == 3
    stats = CliRunner().invoke(cli, ["stats", path], env=env, catch_exceptions=False).stdout
    assert "space minilm-l6-v2 1 blocks" in stats, stats


def test_add_from_stdin_that_is_not_utf8_says_so(tmp_path):
    """`add F -` with Latin-1 on stdin failed with "cannot encode value: 'utf-8' codec can't
    encode characters ...: surrogates not allowed", which says nothing of the input."""
    from click.testing import CliRunner

    from engramdb.cli import cli

    path = str(tmp_path / "s.engram")
    engramdb.open(path, encrypted=False).close()
    env = {"ENGRAM_PLAINTEXT": "1", "ENGRAM_PASSPHRASE": None, "ENGRAM_KEY_FILE": None}
    result = CliRunner().invoke(cli, ["add", path, "-"], env=env, input=b"caf\xe9 au lait\n")
    assert result.exit_code == 1 and "stdin is not UTF-8" in result.output and "byte 3" in result.output
    ok = CliRunner().invoke(cli, ["add", path, "-", "--id", "c"], env=env, input="café\r\nau lait\r\n".encode())
    assert ok.exit_code == 0, ok.output
    with engramdb.open(path, encrypted=False) as db:
        assert db.get("c").content == "café\r\nau lait"  # the text's own line ends, only the last one dropped
    lone = CliRunner().invoke(cli, ["add", path, "-", "--id", "d"], env=env, input=b"a\rb\rc\n")
    assert lone.exit_code == 0, lone.output
    with engramdb.open(path, encrypted=False) as db:
        assert db.get("d").content == "a\rb\rc"  # regression: a lone CR became a newline


@pytest.mark.parametrize("command", ["dump", "export"])
def test_dump_and_export_do_not_write_over_another_store(tmp_path, command):
    """`engramdb dump a.engram -o b.engram` (a completion slip) replaced the store b.engram by
    text, without --force or a word: only the store being read was protected."""
    from click.testing import CliRunner

    from engramdb.cli import cli

    source, other = str(tmp_path / "a.engram"), tmp_path / "b.engram"
    for path, text in ((source, "alpha"), (str(other), "the other store's only memory")):
        with engramdb.open(path, encrypted=False) as db:
            db.add(text, id="m", now=1.0)
    before = other.read_bytes()
    env = {"ENGRAM_PLAINTEXT": "1", "ENGRAM_PASSPHRASE": None, "ENGRAM_KEY_FILE": None}
    result = CliRunner().invoke(cli, [command, source, "-o", str(other)], env=env)
    assert result.exit_code == 1 and "engramdb store" in result.output, result.output
    assert other.read_bytes() == before
    with engramdb.open(str(other), encrypted=False) as db:
        assert db.get("m").content == "the other store's only memory"
    backup = tmp_path / "a.aaak"
    backup.write_text("an older dump")  # an existing dump or export is replaced, as before
    assert CliRunner().invoke(cli, [command, source, "-o", str(backup)], env=env).exit_code == 0
    assert backup.read_text() != "an older dump"


def test_restore_of_a_store_or_an_import_source_says_what_it_is(tmp_path):
    """`restore notes.engram copy.engram` (a store as the dump) said "line 1, column 1: not
    UTF-8 text ... look for a hand edit there"; a JSONL file, "the first line must be
    'FILE:||||v3|dump' ... look for a hand edit"."""
    from click.testing import CliRunner

    from engramdb.cli import cli

    store = str(tmp_path / "a.engram")
    with engramdb.open(store, encrypted=False) as db:
        db.add("alpha", id="m", now=1.0)
    jsonl = tmp_path / "m.jsonl"
    jsonl.write_text('{"id": "m", "content": "alpha"}\n')
    env = {"ENGRAM_PLAINTEXT": "1", "ENGRAM_PASSPHRASE": None, "ENGRAM_KEY_FILE": None}
    target = tmp_path / "copy.engram"
    result = CliRunner().invoke(cli, ["restore", store, str(target)], env=env)
    assert result.exit_code == 1 and "is an engramdb store, not a dump" in result.output
    assert "engramdb dump" in result.output and not target.exists()
    result = CliRunner().invoke(cli, ["restore", str(jsonl), str(target)], env=env)
    assert result.exit_code == 1 and "is a JSONL file, not a dump" in result.output
    assert "engramdb import" in result.output and not target.exists()
