"""Passphrase files on the command line: what a file's line ends do (the help did not say)."""
from __future__ import annotations

import pytest
from click.testing import CliRunner
from conftest import TEST_KDF

import engramdb.engram as engram
from engramdb.cli import cli

KDF = f"t={TEST_KDF.t},m={TEST_KDF.m_kib},p={TEST_KDF.p}"


def _run(*args, env=None):
    full = {"ENGRAM_TEST_WEAK_KDF": "1", "ENGRAM_PASSPHRASE": "", **(env or {})}
    return CliRunner().invoke(cli, [str(a) for a in args], env=full, catch_exceptions=False)


@pytest.mark.parametrize("text", ["pass word", "pass word\n", "pass word\r\n", "pass word\n\n"])
def test_a_passphrase_file_s_final_line_breaks_are_not_part_of_the_passphrase(tmp_path, text):
    pw = tmp_path / "pw.txt"
    pw.write_bytes(text.encode())
    f = tmp_path / "s.engram"
    assert _run("init", f, "--kdf", KDF, "--passphrase-file", pw).exit_code == 0
    engram.open(f, passphrase="pass word", readonly=True).close()
    assert _run("info", f, env={"ENGRAM_PASSPHRASE": "pass word"}).exit_code == 0


def test_spaces_at_the_end_of_a_passphrase_file_are_kept(tmp_path):
    pw = tmp_path / "pw.txt"
    pw.write_text("pass word \n")
    f = tmp_path / "s.engram"
    assert _run("init", f, "--kdf", KDF, "--passphrase-file", pw).exit_code == 0
    assert _run("info", f, env={"ENGRAM_PASSPHRASE": "pass word"}).exit_code == 1
    assert _run("info", f, env={"ENGRAM_PASSPHRASE": "pass word "}).exit_code == 0


def test_the_help_says_what_a_passphrase_file_holds():
    for command in (["info"], ["rekey"]):
        text = " ".join(_run(*command, "--help").output.split())
        assert "line breaks at its end are dropped" in text, command
    assert "--new-passphrase-file" in _run("rekey", "--help").output
    rekey = " ".join(_run("rekey", "--help").output.split())
    assert rekey.count("line breaks at its end are dropped") == 2
