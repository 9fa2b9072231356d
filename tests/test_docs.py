"""The README's Python examples and its command-line block run as written (in order, on one
file), every CLI command is in the README, and every command-line example (README and --help) parses."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from engramdb.cli import cli

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def test_readme_python_example_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
    assert "Alice moved to Berlin" in capsys.readouterr().out


def test_every_command_is_documented_in_the_readme():
    for name in cli.commands:
        assert f"engramdb {name}" in README, f"`engramdb {name}` is missing from README.md"


def _examples() -> list[tuple[str, str]]:
    """Every `engramdb ...` line of the README's command-line block and of the commands'
    --help examples, as (where, line)."""
    block = README.split("## Command line", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    found = [("README.md", line) for line in block.splitlines()]

    def walk(command: click.Command, path: str) -> None:
        if command.help and "Example:" in command.help:
            found.extend((f"{path} --help", line) for line in command.help.split("Example:", 1)[1].splitlines())
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(cli, "engramdb")
    return [(where, line.split(" # ", 1)[0].strip()) for where, line in found if "engramdb " in line]


def test_every_command_line_example_parses(tmp_path, monkeypatch):
    # options that exist, choices that are valid, the right number of arguments: a renamed
    # option or a mistyped choice in an example fails here (files are stood in by empty ones)
    monkeypatch.chdir(tmp_path)
    examples = _examples()
    assert len(examples) > 60
    for where, line in examples:
        words = shlex.split(re.sub(r"\[(--?[\w-]+)\]", r"\1", line).replace(" > recovery.txt", ""))
        while "=" in words[0]:  # VAR=value before the command
            words.pop(0)
        assert words.pop(0) == "engramdb", line
        for word in words:
            if "." in word and not word.startswith(("-", "'")) and "*" not in word and "://" not in word:
                Path(word).touch()
        command: click.Command = cli
        try:
            ctx = command.make_context("engramdb", list(words))
            while isinstance(command, click.Group):
                rest = [*ctx._protected_args, *ctx.args]
                name, command, rest = command.resolve_command(ctx, rest)
                assert command is not None, line
                ctx = command.make_context(name or "", rest, parent=ctx)
        except click.ClickException as exc:
            pytest.fail(f"{where}: `{line}` does not parse: {exc.format_message()}")


def test_every_option_has_help():
    # `--help` showed inject's --selection and export's --format with no text at all
    def walk(command: click.Command, path: str) -> None:
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert param.help, f"{path} {param.opts[0]} has no help text"
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(cli, "engramdb")


# Lines of the README's command-line block that are not run here, and why.
_NOT_RUN = {
    "mcp": "serves stdin until it closes (tests/test_mcp_server.py runs the server)",
    "fleet": "starts a Dask cluster (tests/test_fleet.py runs the same jobs)",
}
# Lines that must fail, as the README says they do.
_MUST_FAIL = {
    # a new file has no text space; the README's forget bullet says so and the hint says how
    "forget notes.engram --query": (1, "add_space('hashed-tfidf-v1', dims=256)"),
}
_WEAK = "t=1,m=8,p=1"  # the README's lines with a cheap KDF (ENGRAM_TEST_WEAK_KDF is set)


def test_the_readme_command_line_block_runs_in_order(tmp_path, monkeypatch):
    # every line, in order, on one file; the placeholders ID, ID2, NEW and OLD are memories
    # with those ids, added again before a line when a `forget` or `delete` took them
    from click.testing import CliRunner

    monkeypatch.chdir(tmp_path)
    Path("meeting.md").write_text("# Auth\n\nWe decided to use JWT for auth. Alice moved to Berlin.\n")
    Path("chat.jsonl").write_text('{"role": "user", "content": "Where do we host it?"}\n'
                                  '{"role": "assistant", "content": "We decided on Frankfurt."}\n')
    Path("memories.jsonl").write_text('{"id": "j1", "content": "Bob prefers tea"}\n')
    Path("big.jsonl").write_text("".join(f'{{"id": "b{i}", "content": "bulk memory {i}"}}\n' for i in range(5)))
    Path("transcript.json").write_text(
        '[{"role": "user", "content": "Build a CLI tool. Use only the standard library: no argparse."},'
        ' {"role": "assistant", "content": "Done; the tests pass."}]')
    env = {"ENGRAM_PASSPHRASE": "pw", "ENGRAM_DUMP_PASSPHRASE": "dump-pw"}
    runner = CliRunner()

    def run(words: list[str]) -> tuple[int, str]:
        result = runner.invoke(cli, words, env=env, catch_exceptions=False, input="")
        return result.exit_code, result.output

    block = README.split("## Command line", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    ran = 0
    for line in block.splitlines():
        line = re.sub(r"\s\[--?[\w-]+\]", "", line.split(" # ", 1)[0]).strip()
        words = shlex.split(line)
        assignments = {}
        while words and "=" in words[0]:
            name, value = words.pop(0).split("=", 1)
            assignments[name] = value
        if words[:1] != ["engramdb"] or words[1] in _NOT_RUN:
            assert words[:1] == ["export"] or words[1] in _NOT_RUN, line
            continue
        words.pop(0)
        if words[0] in ("init", "rekey"):
            words += ["--kdf", _WEAK]
        if "notes.engram" in words and words[0] != "init":
            for placeholder in ("ID", "ID2", "NEW", "OLD"):
                run(["add", "notes.engram", f"placeholder {placeholder}", "--id", placeholder])  # exists: exit 1
        env.update({k: v for k, v in assignments.items() if v != "..."})
        if "ENGRAM_NEW_PASSPHRASE" in assignments:
            env["ENGRAM_NEW_PASSPHRASE"] = "pw2"
        code, output = run(words)
        ran += 1
        expected = next((v for k, v in _MUST_FAIL.items() if line.startswith(f"engramdb {k}")), None)
        if expected:
            assert code == expected[0] and expected[1] in output, (line, code, output)
        else:
            assert code == 0, (line, code, output)
        if words[0] == "rekey":
            env["ENGRAM_PASSPHRASE"] = env.pop("ENGRAM_NEW_PASSPHRASE")
    assert ran > 40
    code, output = run(["verify", "notes.engram"])
    assert (code, output.strip()) == (0, "ok")
