"""Where the CLI writes: `-o -` is stdout, as the help's "instead of stdout" and the
stdin `-` of `add` and `restore` lead a user to expect (it made a file named "-")."""
from __future__ import annotations

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
