"""The README's Python example runs as written, and every CLI command is in the README."""
from __future__ import annotations

import re
from pathlib import Path

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
