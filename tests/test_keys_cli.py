"""The key commands on the command line: passphrase files (what a file's line ends do), --kdf,
and replacing the recovery key."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import TEST_KDF

import engramdb.engram as engram
from engramdb.crypto import KDFParams
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


@pytest.mark.parametrize("kdf", ["t=3,m=65536,p=4,x=1", "t=3,m=65536,p=4,t=9", "t=3,m=65536,p=4,mem=1"])
def test_kdf_with_an_unknown_or_repeated_parameter_is_a_usage_error(tmp_path, kdf):
    """An unknown name (a typo) or a repeated one was ignored: the file was created with
    other parameters than the user wrote, and no word said so."""
    f = tmp_path / "s.engram"
    result = _run("init", f, "--kdf", kdf, env={"ENGRAM_PASSPHRASE": "pw"})
    assert result.exit_code == 2 and "--kdf" in result.output
    assert not f.exists()


def _recovery_wrap(path) -> bytes:
    with engram.open(path, passphrase="pw", readonly=True) as db:
        return next(s["wrapped"] for s in db._header["slots"] if s.get("label") == "recovery")


def test_replacing_the_recovery_key_compacts_the_old_one_out_of_the_file(tmp_path):
    """rekey compacts so that the old passphrase's wrapped key leaves the file; replacing a
    (leaked) recovery key did not: its slot stayed in free pages (2 copies), so the old key
    still unwrapped the data key read from the current file."""
    f = tmp_path / "s.engram"
    env = {"ENGRAM_PASSPHRASE": "pw"}
    assert _run("init", f, "--kdf", KDF, "--recovery-key", env=env).exit_code == 0
    old = _recovery_wrap(f)
    result = _run("recovery-key", f, env=env)
    assert result.exit_code == 0 and result.output.startswith("ERK1-")
    assert f.read_bytes().count(old) == 0
    new_key = result.output.strip()
    engram.open(f, key=new_key, readonly=True).close()
    kept = _recovery_wrap(f)
    assert _run("recovery-key", f, "--no-compact", env=env).exit_code == 0
    assert f.read_bytes().count(kept) > 0  # as asked


def test_a_replaced_recovery_key_is_printed_even_when_the_compaction_fails(tmp_path):
    f = tmp_path / "s.engram"
    env = {"ENGRAM_PASSPHRASE": "pw"}
    assert _run("init", f, "--kdf", KDF, "--recovery-key", env=env).exit_code == 0
    holder = subprocess.Popen([sys.executable, "-c", "import sys, engramdb; db = engramdb.open(sys.argv[1], "
                               "passphrase='pw', readonly=True); print('open', flush=True); sys.stdin.readline()",
                               str(f)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "ENGRAM_TEST_WEAK_KDF": "1"})
    try:
        assert holder.stdout.readline().strip() == "open"
        result = CliRunner().invoke(cli, ["recovery-key", str(f)], env={"ENGRAM_TEST_WEAK_KDF": "1", **env})
    finally:
        holder.communicate("\n")
    assert result.exit_code == 1
    printed = result.stdout.strip()
    assert printed.startswith("ERK1-") and "not compacted" in result.stderr
    engram.open(f, key=printed, readonly=True).close()


def test_rekey_refuses_a_weak_kdf_before_asking_for_the_new_passphrase(tmp_path):
    """The parameters were checked only after the file was unlocked and the new passphrase
    read (typed twice at a prompt)."""
    f = tmp_path / "s.engram"
    engram.open(f, passphrase="pw", kdf=KDFParams(*KDFParams.FLOOR)).close()  # the cheapest allowed
    result = CliRunner().invoke(cli, ["rekey", str(f), "--kdf", KDF],  # no new passphrase given at all
                                env={"ENGRAM_PASSPHRASE": "pw", "ENGRAM_TEST_WEAK_KDF": ""})
    assert result.exit_code == 1 and "below the floor" in result.output


def test_init_with_a_kdf_above_the_cap_hints_at_the_choice_not_at_a_hostile_header(tmp_path):
    """`init --kdf t=20,...` hinted "the file or dump header may be hostile or corrupt" first."""
    result = _run("init", tmp_path / "s.engram", "--kdf", "t=20,m=8,p=1", env={"ENGRAM_PASSPHRASE": "pw"})
    assert result.exit_code == 1 and "exceed the cap" in result.output and not (tmp_path / "s.engram").exists()
    assert result.output.split("hint: ", 1)[1].startswith("for a new file or passphrase, choose")
