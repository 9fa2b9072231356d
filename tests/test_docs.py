"""The README's Python examples run as written, every CLI command is in the README, and every
command-line example (README and --help) parses."""
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
