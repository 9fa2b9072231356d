"""The text a model reads: inject defaults to markdown with names, wake_up keeps who and when,
and `inject` says so when nothing fits (issue 12, bug 4)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import engramdb
from engramdb.cli import cli
from engramdb.compress import compress, inject_context, wake_up
from engramdb.ingest import messages_to_text
from engramdb.records import CompressResult, Zettel

from conftest import NOW, PASSPHRASE

CHAT = [
    {"speaker": "Caroline", "text": "Hey Mel! I went to a LGBTQ support group yesterday and it was so powerful.",
     "date": "2023-05-08"},
    {"speaker": "Melanie", "text": "Wow, that's cool! Painting's a fun way to express my feelings.",
     "date": "2023-05-08"},
    {"speaker": "Caroline", "text": "I decided to adopt kids. I'm thrilled to make a family for kids who need one.",
     "date": "2023-05-25"},
    {"speaker": "Melanie", "text": "I ran a charity race for mental health last Saturday, it was rewarding.",
     "date": "2023-05-25"},
]


def _result():
    return compress(messages_to_text(CHAT), chunk_size=120, chunk_overlap=0)


def _adopt(text: str, said: str) -> str:
    """The line that tells Caroline's decision; it must carry the day she said it."""
    line = next(line for line in text.splitlines() if "adopt kids" in line)
    before = line.split(f"Caroline{said} \u201cI decided to adopt kids.")[0]
    assert "2023-05-25" in before, line
    return line


def test_inject_defaults_to_markdown_with_names_speakers_and_dates():
    r = _result()
    out = inject_context(r)
    assert out == inject_context(r, format="markdown")
    lines = out.splitlines()
    assert lines and all(line.startswith("- 2023-05-") for line in lines)
    assert "decision" in _adopt(out, ":")
    assert "Melanie: \u201cPainting's a fun way" in out or "Melanie: \u201cWow" in out
    codes = set(r.entity_index.code_to_name)
    words = set(out.replace("(", " ").replace(")", " ").replace(",", " ").replace(";", " ").split())
    assert not codes & words and "\\_" not in out and "|" not in out  # no entity codes, no AAAK escapes
    aaak = inject_context(r, format="aaak")  # still there on request
    assert aaak.startswith("FILE:") and "E:" in aaak
    doc = json.loads(inject_context(r, format="json"))
    said = [(u["speaker"], u["on"]) for z in doc["zettels"] for u in z["said"]]
    assert ("Caroline", "2023-05-25") in said
    assert set(said) <= {("Caroline", "2023-05-08"), ("Melanie", "2023-05-08"), ("Caroline", "2023-05-25"),
                         ("Melanie", "2023-05-25")}
    assert all((z["speaker"], z["said_on"]) == (z["said"][0]["speaker"], z["said"][0]["on"]) for z in doc["zettels"])


def test_wake_up_keeps_who_said_it_and_when():
    text = wake_up(_result(), top_pct=1.0)
    lines = text.splitlines()
    assert lines and all(" said: \u201c" in line and "On 2023-05-" in line for line in lines), text
    assert _adopt(text, " said:").startswith("Decision: On 2023-05-")


def test_a_quote_over_several_chat_lines_keeps_each_speaker():
    r = CompressResult(zettels=[Zettel(id="001", quote="Painting is fun.\n[2023-05-25]\nCaroline: I decided to adopt.",
                                       entities=["Caroline", "Melanie"], flags=["DECISION"], source_start=0,
                                       source_end=80, resolved_date="2023-05-08")],
                       meta={"source": "[2023-05-08]\nMelanie: Painting is fun.\n[2023-05-25]\n"
                                       "Caroline: I decided to adopt.\n"})
    assert inject_context(r) == ("- 2023-05-08 \u00b7 decision \u00b7 Melanie: \u201cPainting is fun.\u201d; "
                                 "on 2023-05-25, Caroline: \u201cI decided to adopt.\u201d")
    assert wake_up(r) == ("Decision: On 2023-05-08, Melanie said: \u201cPainting is fun.\u201d; "
                          "on 2023-05-25, Caroline said: \u201cI decided to adopt.\u201d")
    # a quote about another time says so
    r.zettels[0].resolved_date = "2022"
    assert inject_context(r).startswith("- 2023-05-08 (about 2022) \u00b7 decision")


def test_prose_without_speakers_is_not_attributed():
    r = compress("Note: the budget was approved on 2024-02-12. Alice decided to move to Berlin.")
    out = inject_context(r)
    assert "Note:" not in out.split("\u201c")[0]  # "Note" is not a speaker
    assert " said: " not in wake_up(r)


def test_stored_memories_keep_speaker_and_date(make_db):
    db = make_db()
    db.ingest(CHAT, title="chat", now=NOW, chunk_size=120, chunk_overlap=0)
    assert "decision" in _adopt(db.inject_context(), ":")
    assert _adopt(db.wake_up(top_pct=1.0), " said:").startswith("Decision: On 2023-05-")


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.setenv("ENGRAM_PASSPHRASE", PASSPHRASE)
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(cli, [str(a) for a in args])

    return invoke


def test_cli_inject_when_nothing_fits_fails_with_a_message(run, tmp_path):
    """Bug 4: `inject F --max-tokens 100 --format json` printed an empty line and exited 0."""
    store = tmp_path / "s.engram"
    assert run("init", store).exit_code == 0
    empty = run("inject", store, "--max-tokens", "100", "--format", "json")
    assert empty.exit_code == 0 and empty.stdout == "" and "no memories to inject" in empty.stderr
    chat = tmp_path / "chat.jsonl"
    chat.write_text("\n".join(json.dumps(m) for m in CHAT) + "\n")
    assert run("ingest", store, chat).exit_code == 0
    tight = run("inject", store, "--max-tokens", "100", "--format", "json")
    assert tight.exit_code == 1 and tight.stdout == ""
    assert "nothing fits in --max-tokens 100" in tight.stderr and "raise --max-tokens to at least" in tight.stderr
    needed = int(tight.stderr.split("at least ")[1].split()[0])
    fits = run("inject", store, "--max-tokens", str(needed), "--format", "json", "--max-zettels", "1")
    assert fits.exit_code == 0 and json.loads(fits.stdout)["zettels"]
    plain = run("inject", store)
    assert plain.exit_code == 0 and plain.stdout.startswith("- 2023-05-")  # markdown by default
    assert run("inject", store, "--format", "aaak").stdout.startswith("FILE:")
    wake = run("wakeup", store)
    assert wake.exit_code == 0 and " said: " in wake.stdout


def test_public_surface_unchanged_by_default_format():
    assert engramdb.inject_context.__kwdefaults__["format"] == "markdown"


def test_cli_inject_json_with_nothing_to_inject_prints_a_document(run, tmp_path):
    # `inject --json` on an empty store printed nothing, so `json.loads(stdout)` failed where
    # `wakeup --json` and `context --json` give a document
    store = tmp_path / "s.engram"
    assert run("init", store).exit_code == 0
    empty = run("inject", store, "--json")
    assert empty.exit_code == 0 and json.loads(empty.stdout) == {"text": ""}
    assert "no memories to inject" in empty.stderr
    assert json.loads(run("wakeup", store, "--json").stdout) == {"text": ""}
