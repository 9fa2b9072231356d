"""`engramdb maintain`: plan, apply, --now, --json, --summarizer-cmd."""
from __future__ import annotations

import json
import sys

from click.testing import CliRunner
from conftest import NOW
from test_maintenance_file import fill

import engramdb.engram as engram_mod
from engramdb.cli import cli

NOW_ISO = "2023-11-14T22:13:20Z"  # conftest.NOW

SUMMARIZER = """import json, sys
texts = json.load(sys.stdin)
print("summary of %d: " % len(texts) + " ".join(t.split(" ")[0] for t in texts))
"""


def run(*args):
    return CliRunner().invoke(cli, [*args, "--plaintext"], catch_exceptions=False)


def test_maintain_plan_apply_json(tmp_path):
    path = tmp_path / "c.engram"
    with engram_mod.open(path, encrypted=False) as db:
        fill(db, 50, seed=4)
    script = tmp_path / "summarize.py"
    script.write_text(SUMMARIZER)
    planned = run("maintain", str(path), "--plan", "--now", NOW_ISO, "--json")
    assert planned.exit_code == 0, planned.output
    plan = json.loads(planned.output)
    assert plan["plan"] and plan["decayed"] > 0
    with engram_mod.open(path, encrypted=False) as db:
        assert len(db) == 50
    done = run("maintain", str(path), "--now", NOW_ISO, "--summarizer-cmd", f"{sys.executable} {script}", "--json")
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["now"] == NOW and report["summarized"] > 0 and report["deduplicated"] == plan["deduplicated"]
    with engram_mod.open(path, encrypted=False) as db:
        assert db.get(report["summary_ids"][0]).content.startswith("summary of ")
        assert db.verify() == []
    again = run("maintain", str(path), "--now", NOW_ISO)
    assert again.exit_code == 0 and again.output.startswith("maintained: 0 decayed, 0 deduplicated")


def test_maintain_errors(tmp_path):
    path = tmp_path / "c.engram"
    with engram_mod.open(path, encrypted=False) as db:
        fill(db, 50, seed=4)
    bad_time = run("maintain", str(path), "--now", "yesterday")
    assert bad_time.exit_code == 1 and "ISO 8601" in bad_time.output
    missing = run("maintain", str(path), "--summarizer-cmd", "no-such-program-here")
    assert missing.exit_code == 2
    failing = CliRunner().invoke(cli, ["maintain", str(path), "--plaintext", "--now", NOW_ISO,
                                       "--summarizer-cmd", f"{sys.executable} -c 'import sys; sys.exit(3)'"])
    assert failing.exit_code == 0
    assert "warning: the summarizer failed" in failing.stderr
    assert json.loads(run("maintain", str(path), "--plan", "--json").output)["summarized"] == 0


def test_a_summary_too_short_is_counted_in_the_warning(tmp_path):
    # the README says a summary under 10 characters leaves its cluster alone with a warning on
    # stderr; the cluster was left alone, but without a word
    path = tmp_path / "s.engram"
    with engram_mod.open(path, encrypted=False) as db:
        fill(db, 50, seed=4)
    short = CliRunner().invoke(cli, ["maintain", str(path), "--plaintext", "--now", NOW_ISO, "--json",
                                     "--summarizer-cmd", f"{sys.executable} -c 'print(\"short\")'"])
    assert short.exit_code == 0 and json.loads(short.stdout)["summarized"] == 0
    assert "warning: the summarizer failed for" in short.stderr and "under 10 characters: 'short'" in short.stderr


def test_a_summarizer_command_with_an_unclosed_quote_is_a_usage_error(tmp_path):
    # shlex's ValueError reached the user as a raw traceback
    path = tmp_path / "q.engram"
    with engram_mod.open(path, encrypted=False) as db:
        fill(db, 10, seed=4)
    bad = CliRunner().invoke(cli, ["maintain", str(path), "--plaintext", "--summarizer-cmd", 'echo "unclosed'])
    assert bad.exit_code == 2 and "--summarizer-cmd" in bad.output and "quotation" in bad.output
    assert bad.exception is None or isinstance(bad.exception, SystemExit)


def test_a_summary_that_is_not_utf8_is_counted_in_the_warning(tmp_path):
    # a summarizer printing bytes that are not UTF-8 left its cluster alone without a word
    path = tmp_path / "u.engram"
    with engram_mod.open(path, encrypted=False) as db:
        fill(db, 50, seed=4)
    script = tmp_path / "latin1.py"
    script.write_text("import sys\nsys.stdin.read()\nsys.stdout.buffer.write(b'r\\xe9sum\\xe9 of the cluster')\n")
    done = CliRunner().invoke(cli, ["maintain", str(path), "--plaintext", "--now", NOW_ISO, "--json",
                                    "--summarizer-cmd", f"{sys.executable} {script}"])
    assert done.exit_code == 0 and json.loads(done.stdout)["summarized"] == 0
    assert "warning: the summarizer failed for" in done.stderr and "UTF-8" in done.stderr


def test_maintain_help_shows_each_example_on_its_own_line():
    # the two example commands were rewrapped into one line, which no shell runs
    shown = CliRunner().invoke(cli, ["maintain", "--help"]).output
    assert "\n      engramdb maintain notes.engram --plan\n" in shown
