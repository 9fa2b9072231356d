"""CLI: archive, unarchive, get --full, pin, unpin, forget, stats, inject/wakeup --include-archived."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from engramdb import cli as cli_mod
from engramdb.cli import cli

LONG = "Alice moved to Berlin in 2023 and started at the university. " * 8


@pytest.fixture
def run():
    runner = CliRunner()

    def invoke(*args: str, input: str | None = None):
        return runner.invoke(cli, ["--plaintext", *args], input=input, catch_exceptions=False)

    return invoke


@pytest.fixture
def store(run, tmp_path):
    f = str(tmp_path / "l.engram")
    assert run("init", f).exit_code == 0
    assert run("add", f, LONG, "--id", "a", "--tier", "cold", "--tag", "people").exit_code == 0
    assert run("add", f, "Bob likes green tea", "--id", "b", "--source", "chat").exit_code == 0
    return f


def test_archive_get_full_unarchive(run, store):
    assert run("archive", store, "a").output.strip() == "archived a"
    stub = json.loads(run("get", store, "a", "--json").output)
    assert stub["archived"] is True and stub["tier"] == "archive" and stub["content"] == LONG[:200] + "..."
    full = json.loads(run("get", store, "a", "--full", "--json").output)
    assert full["archived"] is False and full["content"] == LONG and full["tier"] == "cold"
    assert "archived      True" in run("get", store, "a").output
    back = run("unarchive", store, "a", "--json")
    assert back.exit_code == 0 and json.loads(back.output) == full
    assert json.loads(run("get", store, "a", "--json").output) == full


def test_archive_truncate_reports_bytes_and_unarchive_refuses(run, store):
    out = json.loads(run("archive", store, "a", "--truncate", "--json").output)
    assert out == {"id": "a", "bytes_dropped": len(LONG) - 200}
    refused = run("unarchive", store, "a")
    assert refused.exit_code == 1 and "truncation" in refused.output and "hint:" in refused.output


def test_archive_and_unarchive_say_when_they_change_nothing(run, store):
    # `archive --truncate` of a memory archived already printed "archived a" and dropped
    # nothing; `unarchive` of a live memory printed "unarchived b"
    assert run("archive", store, "a").output.strip() == "archived a"
    again = run("archive", store, "a", "--truncate")
    assert again.exit_code == 0 and again.output.strip() == "a is archived already: nothing changed"
    assert json.loads(run("get", store, "a", "--full", "--json").output)["content"] == LONG  # still whole
    live = run("unarchive", store, "b")
    assert live.exit_code == 0 and live.output.strip() == "b is not archived: nothing changed"
    assert json.loads(run("archive", store, "a", "--json").output) == {"id": "a", "bytes_dropped": 0}


def test_pin_unpin(run, store):
    assert json.loads(run("pin", store, "b", "--json").output) == {"id": "b", "pinned": True}
    assert json.loads(run("get", store, "b", "--json").output)["pinned"] is True
    assert run("unpin", store, "b").output.strip() == "unpinned b"
    assert json.loads(run("get", store, "b", "--json").output)["pinned"] is False
    missing = run("pin", store, "nope")
    assert missing.exit_code == 1 and "no memory" in missing.output


def test_forget_dry_run_then_yes(run, store):
    dry = json.loads(run("forget", store, "--id", "b", "--dry-run", "--json").output)
    assert dry["dry_run"] is True and dry["ids"] == ["b"] and dry["removed"]["nodes"] == 1
    assert json.loads(run("get", store, "b", "--json").output)["id"] == "b"
    done = json.loads(run("forget", store, "--id", "b", "--yes", "--json").output)
    assert done["dry_run"] is False and done["ids"] == ["b"]
    assert run("get", store, "b").exit_code == 1
    assert run("verify", store).output.strip() == "ok"


def test_forget_refuses_without_yes_when_not_a_terminal(run, store):
    refused = run("forget", store, "--id", "b")
    assert refused.exit_code == 1 and "--yes" in refused.output
    assert run("get", store, "b").exit_code == 0


def test_forget_asks_on_a_terminal(run, store, monkeypatch):
    monkeypatch.setattr(cli_mod, "_interactive", lambda: True)
    declined = run("forget", store, "--id", "b", input="n\n")
    assert declined.exit_code == 1 and "would forget 1 memories: b" in declined.output
    assert "nothing was forgotten" in declined.output and run("get", store, "b").exit_code == 0
    accepted = run("forget", store, "--id", "b", input="y\n")
    assert accepted.exit_code == 0 and "forgot 1 memories: b" in accepted.output
    assert run("get", store, "b").exit_code == 1


def test_forget_by_query_and_usage_errors(run, store, tmp_path):
    assert run("forget", store).exit_code == 2
    no_space = run("forget", store, "--query", "green tea", "--yes")
    assert no_space.exit_code == 1 and "hint:" in no_space.output
    assert run("forget", store, "--id", "nope", "--yes").exit_code == 1


def test_stats(run, store):
    run("archive", store, "a")
    run("pin", store, "b")
    data = json.loads(run("stats", store, "--json").output)
    assert data["memories"] == 2 and data["archived"] == 1 and data["pinned"] == 1
    assert data["tiers"] == {"hot": 1, "warm": 0, "cold": 0, "archive": 1}
    assert data["tags"] == {"people": 1} and data["sources"] == {"chat": 1} and data["flags"] == {}
    assert data["tables"]["nodes"]["entries"] == 2 and data["tables"]["archive"]["entries"] == 1
    assert data["tables"]["nodes"]["bytes"] >= 4096
    assert data["index"]["bm25"]["live_docs"] == 2 and data["last_maintenance"] is None
    text = run("stats", store).output
    assert "memories         2 (1 archived, 1 pinned)" in text and "last_maintenance never" in text


def test_inject_and_wakeup_leave_archived_out_unless_asked(run, store):
    run("archive", store, "a")
    assert "Alice" not in run("inject", store).output
    assert "Alice" in run("inject", store, "--include-archived").output
    assert "Alice" not in run("wakeup", store, "--top-pct", "1").output
    assert "Alice" in run("wakeup", store, "--top-pct", "1", "--include-archived").output


def test_wakeup_with_nothing_to_tell_prints_nothing_and_says_why(run, tmp_path):
    # an empty store printed a blank line, which a script reads as a narrative
    empty = str(tmp_path / "empty.engram")
    assert run("init", empty).exit_code == 0
    result = run("wakeup", empty)
    assert (result.exit_code, result.stdout) == (0, "")
    assert "no memories to tell of" in result.stderr
    assert json.loads(run("wakeup", empty, "--json").stdout) == {"text": ""}
    assert run("add", empty, "Alice moved to Berlin in 2023", "--id", "a").exit_code == 0
    assert run("archive", empty, "a").exit_code == 0
    result = run("wakeup", empty)  # only archived memories: says how to include them
    assert (result.exit_code, result.stdout) == (0, "") and "--include-archived" in result.stderr
    assert "Alice" in run("wakeup", empty, "--include-archived").stdout


def test_delete_of_an_id_given_twice_deletes_it(run, store):
    # the second delete of the id in one transaction found it gone: "no memory with id 'a'"
    # (it was there) and nothing was deleted
    result = run("delete", store, "a", "b", "a", "--json")
    assert result.exit_code == 0 and json.loads(result.output) == {"deleted": ["a", "b"]}
    assert run("list", store).output == ""


def test_stats_shows_a_tag_or_source_with_a_newline_on_its_line(run, store):
    # stats printed tags and sources raw: a tag "bad\ntag" broke its line in two, where list
    # and edges show \n
    assert run("tag", store, "b", "bad\ntag").output == "b: bad\\ntag\n"
    assert run("update", store, "a", "--source", "two\rlines").exit_code == 0
    lines = run("stats", store).output.splitlines()
    assert any(line.startswith("tags ") and "bad\\ntag=1" in line for line in lines)
    assert any(line.startswith("sources ") and "two\\rlines=1" in line for line in lines)
    assert len(lines) == 9


def test_update_refuses_empty_content_as_add_does(run, store):
    # `failing-command | engramdb update F ID --content -` replaced the text by "" (exit 0),
    # where `add` refuses an empty text
    for args, stdin in ((("--content", "-"), ""), (("--content", "-"), "\n\n"), (("--content", "  "), None)):
        result = run("update", store, "b", *args, input=stdin)
        assert result.exit_code == 1 and "the new content is empty" in result.output
    assert json.loads(run("get", store, "b", "--json").output)["content"] == "Bob likes green tea"
