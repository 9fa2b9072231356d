"""Regression tests for bugs found by using engramdb as a first user would (CLI and API)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import lmdb
import pytest
from pathlib import Path
from click.testing import CliRunner

import engramdb.engram as engram_mod
from engramdb.cli import cli
from engramdb.crypto import KDFParams
from engramdb.errors import AlreadyOpenError, ReadOnlyError
from engramdb.store import _map_lmdb_error

PW = "qa-passphrase"
KDF = "t=1,m=8,p=1"

# A second process that opens FILE (read-only or not) and holds it until stdin closes.
_HOLDER = """
import sys
import engramdb.engram as e
db = e.open(sys.argv[1], passphrase=sys.argv[2], readonly=sys.argv[3] == "ro", create=False)
print("ready", flush=True)
sys.stdin.read()
db.close()
"""

# A second process that tries to compact FILE and prints what happened.
_COMPACTOR = """
import sys
import engramdb.engram as e
from engramdb.errors import AlreadyOpenError
with e.open(sys.argv[1], passphrase=sys.argv[2], create=False) as db:
    try:
        db.compact()
        print("compacted")
    except AlreadyOpenError:
        print("refused")
"""


def _env() -> dict:
    return {**os.environ, "ENGRAM_TEST_WEAK_KDF": "1",
            "PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                           os.environ.get("PYTHONPATH", "")])}


def _holder(path, mode: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path), PW, mode], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=_env())
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _release(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0


def _make_store(path) -> None:
    with engram_mod.open(path, passphrase=PW, kdf=KDFParams.for_tests()) as db:
        db.add("Alice moved to Berlin in 2023", id="a")


@pytest.fixture
def run():
    runner = CliRunner()

    def invoke(*args: str, env: dict | None = None, input: str | None = None):
        full_env = {"ENGRAM_PASSPHRASE": PW, "ENGRAM_TEST_WEAK_KDF": "1", **(env or {})}
        return runner.invoke(cli, [str(a) for a in args], env=full_env, input=input, catch_exceptions=False)

    return invoke


# --- storage engine ----------------------------------------------------------------------------

def test_reader_without_maint_sidecar_still_blocks_compact(tmp_path):
    """A read-only opener of a file whose -maint sidecar is missing (a copied file) took no
    shared lock, so another process's compact replaced the file under it and then read the
    copy through the reader's stale -lock table ("an LMDB file, but not an engramdb file")."""
    path = tmp_path / "copied.engram"
    _make_store(path)
    os.unlink(str(path) + "-maint")
    reader = _holder(path, "ro")
    try:
        with engram_mod.open(path, passphrase=PW, create=False) as db, pytest.raises(AlreadyOpenError):
            db.compact()
    finally:
        _release(reader)


def test_failed_compact_keeps_this_handles_shared_lock(tmp_path):
    """flock(2) drops the shared lock when an upgrade to exclusive fails; a handle whose
    compact() was refused must still keep other processes' compactions away."""
    path = tmp_path / "shared.engram"
    _make_store(path)
    with engram_mod.open(path, passphrase=PW, create=False) as db:
        other = _holder(path, "ro")
        try:
            with pytest.raises(AlreadyOpenError):
                db.compact()
        finally:
            _release(other)
        out = subprocess.run([sys.executable, "-c", _COMPACTOR, str(path), PW], capture_output=True, text=True,
                             env=_env(), timeout=60)
        assert out.stdout.strip() == "refused", out.stderr
        assert db.get("a").content == "Alice moved to Berlin in 2023"


@pytest.mark.parametrize("exc", [lmdb.ReadonlyError("f.engram: Permission denied"),
                                 lmdb.Error("f.engram: Read-only file system")])
def test_read_only_file_hint_says_how_to_get_write_access(exc):
    """Writing to a chmod 444 file (or a read-only mount) said "open the file with
    readonly=False": the user never asked for read-only; the file is."""
    err = _map_lmdb_error(exc, "cannot open f.engram")
    assert isinstance(err, ReadOnlyError)
    assert "readonly=False" not in err.hint and "writable" in err.hint


# --- ingest ------------------------------------------------------------------------------------

def test_two_inputs_with_one_source_name_keep_their_own_passages(tmp_path):
    """`engramdb ingest F a/notes.txt b/notes.txt` stored both texts under "notes.txt": the
    second overwrote the first, and `context` answered a question about the first with
    the second file's text."""
    alice = "Alice moved to Berlin in 2023. She loves the city and its parks."
    bob = "Bob bought a red bicycle yesterday and rides it to work every morning through the old town."
    path = tmp_path / "s.engram"
    with engram_mod.open(path, passphrase=PW, kdf=KDFParams.for_tests()) as db:
        first = db.ingest(alice, source_name="notes.txt", now=1.0)
        db.ingest(bob, source_name="notes.txt", now=1.0)
    for _ in range(2):  # the second round after ingesting the first text again: stored once
        with engram_mod.open(path, passphrase=PW, create=False) as db:
            assert [p.text for p in db.recall_context("Alice Berlin parks", max_tokens=200).passages] == [alice]
            assert [p.text for p in db.recall_context("Bob red bicycle", max_tokens=200).passages] == [bob]
            assert db.ingest(alice, source_name="notes.txt", now=1.0) == first
            assert db.verify() == []


@pytest.mark.parametrize(("value", "header"), [
    ("1:56 pm on 8 May, 2023", "[2023-05-08]"),  # the LoCoMo session stamp
    ("May 8th, 2023", "[2023-05-08]"),
    ("2023-05-08T13:56:00Z", "[2023-05-08]"),
    (1683554160, "[2023-05-08]"),  # Unix seconds, UTC
])
def test_message_dates_become_iso_headers(value, header):
    """A chat message's date was cut to its first 10 characters: "1:56 pm on 8 May, 2023"
    became the header "[1:56 pm on]" and the memory lost its date."""
    from engramdb.ingest import messages_to_text

    assert messages_to_text([{"speaker": "Caroline", "text": "Hi Mel!", "date": value}]).splitlines() == \
        [header, "Caroline: Hi Mel!"]


@pytest.mark.parametrize("value", ["yesterday", "2023-13-45", True])
def test_unreadable_message_date_is_a_clear_error(value):
    from engramdb.errors import ValidationError
    from engramdb.ingest import messages_to_text

    with pytest.raises(ValidationError, match="cannot read the date") as info:
        messages_to_text([{"speaker": "A", "text": "x", "date": value}])
    assert "YYYY-MM-DD" in info.value.hint


# --- command line ------------------------------------------------------------------------------

def test_missing_input_files_are_usage_errors_not_tracebacks(run, tmp_path):
    """`engramdb restore missing.aaak X` and `engramdb ingest F missing.txt` printed a
    FileNotFoundError traceback."""
    f = tmp_path / "m.engram"
    assert run("init", f, "--kdf", KDF).exit_code == 0
    for args in (("restore", tmp_path / "missing.aaak", tmp_path / "x.engram"),
                 ("ingest", f, tmp_path / "missing.txt")):
        result = run(*args)
        assert result.exit_code == 2 and "does not exist" in result.output, result.output
    assert not (tmp_path / "x.engram").exists()


def test_unexpected_os_error_is_one_error_line_with_hint(run, tmp_path):
    """An OSError the library never saw (here: the dump output path vanishes) is an
    `error:`/`hint:` pair with exit 1, never a traceback."""
    f = tmp_path / "o.engram"
    run("init", f, "--kdf", KDF)
    result = run("dump", f, "-o", tmp_path / "no-such-dir" / "out.aaak")
    assert result.exit_code == 1
    assert result.output.startswith("error: ") and "\nhint: " in result.output and "Traceback" not in result.output


def test_ingest_of_non_utf8_or_non_object_lines_is_a_clear_error(run, tmp_path):
    """A Latin-1 file raised UnicodeDecodeError (a traceback); a JSONL line holding an array
    said "message 0 is neither a string nor a mapping" without naming the file or line."""
    f = tmp_path / "i.engram"
    run("init", f, "--kdf", KDF)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"caf\xe9 au lait\n")
    result = run("ingest", f, latin1)
    assert result.exit_code == 1 and "is not UTF-8" in result.output and "hint: name its encoding" in result.output
    lines = tmp_path / "chat.jsonl"
    lines.write_text('{"speaker": "A", "text": "hello"}\n[1, 2]\n', encoding="utf-8")
    result = run("ingest", f, lines)
    assert result.exit_code == 1 and "chat.jsonl, line 2" in result.output and "hint:" in result.output


def test_wrong_dump_passphrase_hint_names_the_dump_passphrase(run, tmp_path):
    """The hint told the user to check ENGRAM_PASSPHRASE (the store's), not the dump's."""
    f, out = tmp_path / "d.engram", tmp_path / "d.aaak.enc"
    run("init", f, "--kdf", KDF)
    run("add", f, "Alice moved to Berlin")
    assert run("dump", f, "--encrypt", "-o", out, env={"ENGRAM_DUMP_PASSPHRASE": "dump-pw"}).exit_code == 0
    result = run("restore", out, tmp_path / "r.engram", env={"ENGRAM_DUMP_PASSPHRASE": "not-it"})
    assert result.exit_code == 1 and "wrong passphrase" in result.output
    hint = result.output.split("hint: ", 1)[1]
    assert "ENGRAM_DUMP_PASSPHRASE" in hint and "ENGRAM_PASSPHRASE " not in hint
    assert not (tmp_path / "r.engram").exists()


def test_import_with_a_clash_in_a_later_batch_writes_nothing(tmp_path):
    """Imports commit batch by batch: an id clash found in the second batch left the first
    batch's memories behind, and running the import again then failed on those."""
    import io

    from engramdb.backup import import_records
    from engramdb.errors import DuplicateIdError
    from engramdb.importers import iter_import

    lines = "".join(f'{{"id": "m{i}", "content": "memory number {i}"}}\n' for i in range(5))
    with engram_mod.open(tmp_path / "imp.engram", passphrase=PW, kdf=KDFParams.for_tests()) as db:
        db.add("already here", id="m3")
        with pytest.raises(DuplicateIdError) as info:
            import_records(db, iter_import(io.BytesIO(lines.encode()), fmt="jsonl"), batch=2)
        assert "--id-prefix" in info.value.hint
        assert db.ids() == ["m3"]
        assert import_records(db, iter_import(io.BytesIO(lines.encode()), fmt="jsonl", id_prefix="x-"),
                              batch=2) == (5, 0)
        assert len(db) == 6


@pytest.mark.parametrize("value", ["5", "-3"])
def test_add_importance_outside_0_1_is_a_usage_error(run, tmp_path, value):
    """`add --importance` says "0..1" but stored 5.0 and -3.0."""
    f = tmp_path / "imp.engram"
    run("init", f, "--kdf", KDF)
    result = run("add", f, "x", "--importance", value)
    assert result.exit_code == 2 and "--importance" in result.output
    assert run("add", f, "x", "--importance", "1").exit_code == 0


def test_plaintext_dump_and_export_files_are_owner_only(run, tmp_path):
    """`dump -o` and `export -o` wrote the decrypted store world-readable (0644)."""
    f = tmp_path / "p.engram"
    run("init", f, "--kdf", KDF)
    run("add", f, "a secret memory")
    old = os.umask(0o022)
    try:
        assert run("dump", f, "-o", tmp_path / "p.aaak").exit_code == 0
        assert run("export", f, "-o", tmp_path / "p.jsonl").exit_code == 0
    finally:
        os.umask(old)
    for name in ("p.aaak", "p.jsonl"):
        assert (tmp_path / name).stat().st_mode & 0o077 == 0, name
    assert "a secret memory" in (tmp_path / "p.jsonl").read_text(encoding="utf-8")


def test_every_command_that_prints_data_takes_json(run, tmp_path):
    """README: "Every command that prints data takes --json"; inject, wakeup, recovery-key,
    compact, delete, import and restore refused it ("No such option")."""
    f = tmp_path / "j.engram"
    run("init", f, "--kdf", KDF)
    run("ingest", f, "-", input="Alice decided to move to Berlin in 2023. Bob stayed in Lisbon with Carol.\n")
    run("add", f, "to delete", "--id", "gone")
    outputs = {
        "inject": run("inject", f, "--json"), "wakeup": run("wakeup", f, "--json"),
        "recovery-key": run("recovery-key", f, "--json"), "delete": run("delete", f, "gone", "--json"),
        "compact": run("compact", f, "--json"),
    }
    run("export", f, "-o", tmp_path / "j.jsonl")
    run("dump", f, "-o", tmp_path / "j.aaak")
    outputs["import"] = run("import", tmp_path / "j.jsonl", tmp_path / "k.engram", "--id-prefix", "k-", "--create", "--json")
    outputs["restore"] = run("restore", tmp_path / "j.aaak", tmp_path / "r.engram", "--kdf", KDF, "--json")
    data = {}
    for name, result in outputs.items():
        assert result.exit_code == 0, (name, result.output)
        data[name] = json.loads(result.stdout)
    assert "Alice" in data["inject"]["text"] and data["wakeup"]["text"]
    assert data["recovery-key"]["recovery_key"].startswith("ERK1-")
    assert data["delete"] == {"deleted": ["gone"]}
    assert data["compact"]["after"] > 0 and data["import"]["memories"] == data["restore"]["memories"] >= 1


def test_export_key_never_overwrites_the_store_or_another_backup(run, tmp_path):
    """`engramdb export-key notes.engram notes.engram` truncated the data file to a 300-byte
    key file (every memory lost); an existing OUT (maybe another store's only key backup)
    was silently replaced."""
    f = tmp_path / "k.engram"
    run("init", f, "--kdf", KDF)
    run("add", f, "keep me", "--id", "keep")
    size = f.stat().st_size
    for target in (f, tmp_path / "k.engram-lock", tmp_path / "k.engram-maint"):
        result = run("export-key", f, target, "--force")
        assert result.exit_code == 1 and "own file" in result.output, result.output
    assert f.stat().st_size == size and run("get", f, "keep").exit_code == 0
    other = tmp_path / "other.key"
    other.write_bytes(b"another store's key backup")
    result = run("export-key", f, other)
    assert result.exit_code == 1 and "--force" in result.output
    assert other.read_bytes() == b"another store's key backup"
    assert run("export-key", f, other, "--force").exit_code == 0 and other.read_bytes() != b"another store's key backup"


def test_dump_export_restore_never_write_over_their_own_input(run, tmp_path):
    """`dump F -o F` and `export F -o F` replaced the encrypted store by its plaintext;
    `restore D D --force` replaced the dump by the new store."""
    f, d = tmp_path / "s.engram", tmp_path / "s.aaak"
    run("init", f, "--kdf", KDF)
    run("add", f, "keep me", "--id", "keep")
    assert run("dump", f, "-o", d).exit_code == 0
    before = (f.read_bytes(), d.read_bytes())
    for args in (("dump", f, "-o", f), ("export", f, "-o", f), ("dump", f, "-o", str(f) + "-lock"),
                 ("restore", d, d, "--force", "--kdf", KDF)):
        result = run(*args)
        assert result.exit_code == 1 and "itself" in result.output and "hint:" in result.output, (args, result.output)
    assert (f.read_bytes(), d.read_bytes()) == before


def test_key_file_takes_raw_bytes_and_rejects_bad_keys_clearly(run, tmp_path):
    """`--key-file` with 32 raw key bytes (what the help promises) was a UnicodeDecodeError
    traceback; a mistyped recovery key said "generate one with os.urandom(32)"; a missing
    --passphrase-file pointed at spec/file-format.md."""
    import engramdb

    raw = bytes(range(32))
    f = tmp_path / "raw.engram"
    with engramdb.open(f, key=raw):
        pass
    keyfile = tmp_path / "raw.key"
    keyfile.write_bytes(raw)
    assert run("--key-file", keyfile, "add", f, "hello", "--id", "h").exit_code == 0
    assert run("--key-file", keyfile, "get", f, "h").exit_code == 0
    bad = tmp_path / "bad.key"
    bad.write_text("ERK1-AAAA-BBBB\n")
    result = run("--key-file", bad, "get", f, "h")
    assert result.exit_code == 1 and "recovery key" in result.output and "urandom" not in result.output
    result = run("--passphrase-file", tmp_path / "nope.txt", "get", f, "h")
    assert result.exit_code == 1 and "hint: check the path" in result.output


def test_key_and_mode_errors_name_the_cli_options(run, tmp_path):
    """A wrong passphrase said "use the recovery key if you have one" without saying how;
    a plaintext file opened without --plaintext said "open it ... (encrypted=False)"."""
    f, plain = tmp_path / "e.engram", tmp_path / "p.engram"
    run("init", f, "--kdf", KDF)
    assert run("--plaintext", "init", plain).exit_code == 0
    wrong = run("info", f, env={"ENGRAM_PASSPHRASE": "not-it"})
    assert wrong.exit_code == 1 and "--key-file" in wrong.output
    mode = run("info", plain)
    assert mode.exit_code == 1 and "--plaintext" in mode.output and "encrypted=False" not in mode.output
    mode = run("--plaintext", "info", f)
    assert mode.exit_code == 1 and "leave out --plaintext" in mode.output
    assert run("--plaintext", "info", plain).exit_code == 0


@pytest.mark.parametrize("value", ["notadate", "2023-02-30"])
def test_ingest_date_must_be_a_real_date(run, tmp_path, value):
    """`ingest --date notadate` was accepted and silently ignored: relative dates
    ("yesterday") then resolved to nothing."""
    f, text = tmp_path / "d.engram", tmp_path / "rel.txt"
    run("init", f, "--kdf", KDF)
    text.write_text("We met yesterday and decided to ship next week.\n", encoding="utf-8")
    result = run("ingest", f, text, "--date", value)
    assert result.exit_code == 2 and "YYYY-MM-DD" in result.output
    assert run("ingest", f, text, "--date", "2024-05-02").exit_code == 0


def test_export_help_does_not_promise_what_import_loses(run, tmp_path):
    """`export --help` said "lossless with `engramdb import`", but edges and source texts
    do not travel through JSONL (0 edges imported, `context` finds nothing)."""
    f, out, back = tmp_path / "x.engram", tmp_path / "x.jsonl", tmp_path / "y.engram"
    run("init", f, "--kdf", KDF)
    text = "".join(f"Alice and Bob met Carol in Berlin on day {n}. They talked about the Berlin office.\n\n"
                   for n in range(6))
    assert run("ingest", f, "-", "--chunk-size", "60", input=text).exit_code == 0
    run("export", f, "-o", out)
    imported = json.loads(run("import", out, back, "--create", "--json").stdout)
    original = json.loads(run("info", f, "--json").stdout)
    help_text = run("export", "--help").output
    assert imported["edges"] < original["tables"]["edges"]  # the tunnels did not travel
    assert "lossless" not in help_text and "dump" in help_text


def test_ctrl_c_is_an_error_line_with_hint(run, tmp_path, monkeypatch):
    """Ctrl-C printed click's bare "Aborted!" (no error:/hint: pair)."""
    f, text = tmp_path / "c.engram", tmp_path / "t.txt"
    run("init", f, "--kdf", KDF)
    text.write_text("Alice moved to Berlin in 2023.\n", encoding="utf-8")

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(engram_mod.Engram, "ingest", interrupted)
    result = run("ingest", f, text)
    assert result.exit_code == 1 and "Aborted" not in result.output
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("error: interrupted") and lines[1].startswith("hint: ")
    assert json.loads(run("info", f, "--json").stdout)["memories"] == 0


def test_dump_to_a_pipe_or_device_writes_into_it(run, tmp_path):
    """`dump -o /dev/null` (or a FIFO) renamed a temporary file over the device: as root it
    replaced /dev/null by a regular file. Output to a non-regular file is written in place."""
    import stat
    import threading

    f, fifo = tmp_path / "f.engram", tmp_path / "pipe"
    run("init", f, "--kdf", KDF)
    run("add", f, "through the pipe")
    os.mkfifo(fifo)
    received: list[bytes] = []

    def reader() -> None:
        with open(fifo, "rb") as fh:
            received.append(fh.read())

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    result = run("dump", f, "-o", fifo)
    thread.join(timeout=10)
    assert result.exit_code == 0, result.output
    assert stat.S_ISFIFO(os.stat(fifo).st_mode), "the FIFO was replaced by a regular file"
    assert received and b"through the pipe" in received[0]


def test_opening_a_dump_or_key_file_as_a_store_says_what_it_is(run, tmp_path):
    """`engramdb info notes.key` called the key file "a Terronex .engram file" (both start
    with ENGRAM) and told the user to import it; a dump was "not an LMDB data file"."""
    f = tmp_path / "s.engram"
    run("init", f, "--kdf", KDF)
    run("add", f, "x")
    run("export-key", f, tmp_path / "s.key")
    run("dump", f, "-o", tmp_path / "s.aaak")
    run("dump", f, "--encrypt", "-o", tmp_path / "s.enc", env={"ENGRAM_DUMP_PASSPHRASE": "d"})
    for name, what, todo in (("s.key", "key file", "import-key"), ("s.aaak", "AAAK text", "engramdb restore"),
                             ("s.enc", "encrypted AAAK dump", "engramdb restore")):
        result = run("info", tmp_path / name)
        assert result.exit_code == 1 and what in result.output and todo in result.output, result.output
        assert "Terronex" not in result.output


@pytest.mark.parametrize("name", ["chat.json", "chat.txt"])
def test_ingest_format_chat_reads_a_json_list_of_messages(run, tmp_path, name):
    """`--format chat` was accepted but read the file as plain text, so a JSON chat export
    became memories full of braces and quotes."""
    f, chat = tmp_path / "c.engram", tmp_path / name
    run("init", f, "--kdf", KDF)
    messages = [{"speaker": "Caroline", "text": "I went to a support group yesterday.", "date": "2023-05-08"},
                {"speaker": "Melanie", "text": "That sounds powerful, Caroline!", "date": "2023-05-08"}]
    chat.write_text(json.dumps({"messages": messages}), encoding="utf-8")
    args = ("ingest", f, chat, "--json") + (() if name.endswith(".json") else ("--format", "chat"))
    result = run(*args)
    assert result.exit_code == 0, result.output
    node = json.loads(run("list", f, "--json").stdout.splitlines()[0])
    assert "Caroline: I went to a support group" in node["content"] and '"speaker"' not in node["content"]
    chat.write_text('{"not": "a chat"}', encoding="utf-8")
    result = run("ingest", f, chat, "--format", "chat")
    assert result.exit_code == 1 and "not a chat" in result.output and "hint:" in result.output


def test_rekey_whose_compact_is_refused_says_the_passphrase_changed(run, tmp_path):
    """With another process holding the file, `rekey` changed the passphrase, then failed
    in compact with only "another process has this file open": the user retried with the
    old passphrase, which no longer worked."""
    f = tmp_path / "r.engram"
    run("init", f, "--kdf", KDF)
    reader = _holder(f, "ro")
    try:
        result = run("rekey", f, "--kdf", KDF, env={"ENGRAM_NEW_PASSPHRASE": "new-pw"})
    finally:
        _release(reader)
    assert result.exit_code == 1 and "passphrase was changed" in result.output
    assert "engramdb compact" in result.output
    assert run("info", f, env={"ENGRAM_PASSPHRASE": "new-pw"}).exit_code == 0
    assert run("compact", f, env={"ENGRAM_PASSPHRASE": "new-pw"}).exit_code == 0


def test_truncated_encrypted_dump_hint_is_about_the_dump(run, tmp_path):
    """Restoring a truncated encrypted dump hinted "run `engramdb verify FILE`", a store
    command that cannot help with a dump."""
    f, enc = tmp_path / "s.engram", tmp_path / "s.enc"
    run("init", f, "--kdf", KDF)
    for n in range(5):
        run("add", f, f"memory {n} " + "padding " * 50)
    env = {"ENGRAM_DUMP_PASSPHRASE": "d"}
    assert run("dump", f, "--encrypt", "-o", enc, env=env).exit_code == 0
    enc.write_bytes(enc.read_bytes()[:-20])
    result = run("restore", enc, tmp_path / "r.engram", "--kdf", KDF, env=env)
    assert result.exit_code == 1 and "hint:" in result.output
    hint = result.output.split("hint: ", 1)[1]
    assert "verify" not in hint and "dump" in hint
    assert not (tmp_path / "r.engram").exists()


@pytest.mark.parametrize("source", [None, 123, b"bytes text", {"speaker": "Caroline", "text": "hello there"}])
def test_ingest_of_something_neither_text_nor_messages_is_a_validation_error(tmp_path, source):
    """`db.ingest(None)` raised TypeError; `db.ingest({"speaker": ..., "text": ...})` stored
    the dict's keys ("speaker", "text") as the conversation."""
    from engramdb.errors import ValidationError

    with engram_mod.open(tmp_path / "v.engram", passphrase=PW, kdf=KDFParams.for_tests()) as db:
        with pytest.raises(ValidationError, match="text or a list of messages"):
            db.ingest(source)
        assert len(db) == 0
        assert db.ingest(m for m in [{"speaker": "Caroline", "text": "hello there"}])  # any iterable works


def test_restore_given_a_path_says_to_open_it(tmp_path):
    """`engramdb.restore("backup.aaak", ...)` parsed the path as dump text and reported
    "line 1: the last line has no LF: the dump is truncated"."""
    import engramdb
    from engramdb.errors import AAAKParseError, ValidationError

    dump = tmp_path / "b.aaak"
    with engram_mod.open(tmp_path / "s.engram", passphrase=PW, kdf=KDFParams.for_tests()) as db:
        db.add("x", id="x")
        with open(dump, "w", encoding="utf-8") as fh:
            db.dump(fh)
    for given in (str(dump), str(dump).encode()):
        with pytest.raises(ValidationError, match="not a path"):
            engramdb.restore(given, tmp_path / "r.engram", passphrase=PW, kdf=KDFParams.for_tests())
    with pytest.raises(AAAKParseError):  # a truncated dump is still a parse error
        engramdb.restore(dump.read_text(encoding="utf-8")[:3], tmp_path / "r.engram", passphrase=PW)
    with open(dump, "rb") as fh:
        assert engramdb.restore(fh, tmp_path / "r.engram", passphrase=PW, kdf=KDFParams.for_tests()) == 1


def test_open_and_scan_reject_bad_arguments_clearly(tmp_path):
    """`engramdb.open(None)` raised TypeError; `db.scan(tier="hto")` and `db.scan(tags="people")`
    silently matched nothing (now an error, and the tag "people")."""
    import engramdb
    from engramdb.errors import ValidationError

    with pytest.raises(ValidationError, match="path"):
        engramdb.open(None, passphrase=PW)
    with engram_mod.open(tmp_path / "s.engram", passphrase=PW, kdf=KDFParams.for_tests()) as db:
        db.add("x", id="x", tags=["people"])
        with pytest.raises(ValidationError, match="unknown tier"):
            list(db.scan(tier="hto"))
        # one string is one tag (as in recall), never a set of letters (issue 12, bug 15)
        assert [n.id for n in db.scan(tags="people")] == ["x"]
        assert [n.id for n in db.scan(tier="hot", tags=["people"])] == ["x"]


def test_ingest_creating_a_new_file_confirms_a_prompted_passphrase(run, tmp_path, monkeypatch):
    """`import --create` (once `ingest` too) creates a missing file; with a prompted passphrase it
    asked once, so one typo made a store nobody could open (init asks twice)."""
    import engramdb.cli as cli_mod

    asked: list[bool] = []

    def fake_secret(what, file, env, option, *, confirm):
        asked.append(confirm)
        return PW

    monkeypatch.setattr(cli_mod, "_secret", fake_secret)
    src = tmp_path / "m.jsonl"
    src.write_text(json.dumps({"id": "m1", "content": "Alice moved to Berlin in 2023."}) + "\n", encoding="utf-8")
    assert run("import", src, tmp_path / "new.engram", "--create").exit_code == 0
    assert run("import", src, tmp_path / "new.engram", "--create", "--id-prefix", "b-").exit_code == 0
    assert asked == [True, False]


def test_dump_through_a_symlink_updates_its_target(run, tmp_path):
    """`dump -o latest.aaak` (a symlink to the real backup) replaced the link by a new file
    and left the backup it pointed at stale."""
    f = tmp_path / "s.engram"
    run("init", f, "--kdf", KDF)
    run("add", f, "fresh memory")
    target, link = tmp_path / "backup.aaak", tmp_path / "latest.aaak"
    target.write_text("old backup\n", encoding="utf-8")
    link.symlink_to(target)
    assert run("dump", f, "-o", link).exit_code == 0
    assert link.is_symlink() and "fresh memory" in target.read_text(encoding="utf-8")


def test_empty_file_hint_does_not_send_the_user_in_a_circle(run, tmp_path):
    """An empty .engram file said "run `engramdb verify FILE`", which fails the same way."""
    f = tmp_path / "empty.engram"
    f.write_bytes(b"")
    result = run("verify", f)
    assert result.exit_code == 1 and "is empty" in result.output
    assert "verify" not in result.output.split("hint: ", 1)[1]


def test_import_key_with_a_wrong_key_file_hints_at_export_key(run, tmp_path):
    """`engramdb import-key STORE OTHERFILE` hinted "to bring in data from another tool, use
    `engramdb import`"."""
    f = tmp_path / "s.engram"
    run("init", f, "--kdf", KDF)
    result = run("import-key", f, f)  # the arguments swapped or mistyped: the store is no key file
    assert result.exit_code == 1 and "not an engramdb key file" in result.output
    assert "export-key" in result.output and "engramdb import`" not in result.output


def test_recall_and_context_without_results_say_so_on_stderr(run, tmp_path):
    """A query with no hits printed nothing at all (recall) or an empty line (context), so
    users could not tell "nothing matches" from a budget too small for any passage."""
    f = tmp_path / "n.engram"
    run("init", f, "--kdf", KDF)
    run("ingest", f, "-", input="Alice moved to Berlin in 2023 to start a new job at a robotics company.\n")
    for args in (("recall", f, "zzzqqq"), ("context", f, "zzzqqq"), ("context", f, "Berlin", "--max-tokens", "0")):
        result = run(*args)
        assert result.exit_code == 0 and result.stdout.strip() == "" and "no " in result.stderr, args
    assert "Berlin" in run("context", f, "Berlin").stdout


def test_ingest_again_says_nothing_new_was_stored(run, tmp_path):
    """Ingesting the same file twice printed "N memories" both times, as if it had stored
    duplicates; it stores the text once."""
    f, text = tmp_path / "a.engram", tmp_path / "t.txt"
    run("init", f, "--kdf", KDF)
    text.write_text("Alice moved to Berlin in 2023 to start a new job.\n", encoding="utf-8")
    first, again = run("ingest", f, text), run("ingest", f, text)
    assert first.exit_code == again.exit_code == 0
    assert first.stdout.strip().endswith("1 memories (1 new)") and again.stdout.strip().endswith("(0 new)")


@pytest.mark.parametrize(("text", "stdin"), [("", None), ("   ", None), ("-", "")])
def test_add_refuses_empty_text(run, tmp_path, text, stdin):
    """`add FILE ""` (or an empty stdin) stored an empty memory that no query can find."""
    f = tmp_path / "e.engram"
    run("init", f, "--kdf", KDF)
    result = run("add", f, text, input=stdin)
    assert result.exit_code == 1 and "empty" in result.output and "hint:" in result.output
    assert json.loads(run("info", f, "--json").stdout)["memories"] == 0


_KILLED_DUMP = """
import os, signal, sys
import engramdb.engram as e
from engramdb.cli import main

def dump_then_die(self, fp, **_options):
    fp.write(b"FILE:||||v3|dump\\npartial plaintext of the store\\n")
    fp.flush()
    os.kill(os.getpid(), signal.SIGKILL)

e.Engram.dump = dump_then_die
main(sys.argv[1:])
"""


def test_killed_dump_leaves_no_hidden_plaintext_and_a_rerun_cleans_up(run, tmp_path):
    """A dump killed midway left click's hidden `.__atomic-writeXXXX` file holding part of
    the store's plaintext, under a random name no later run would ever remove."""
    f, out = tmp_path / "s.engram", tmp_path / "out" / "s.aaak"
    out.parent.mkdir()
    run("init", f, "--kdf", KDF)
    run("add", f, "a secret memory")
    env = {**_env(), "ENGRAM_PASSPHRASE": PW}
    proc = subprocess.run([sys.executable, "-c", _KILLED_DUMP, "dump", str(f), "-o", str(out)], env=env,
                          capture_output=True, timeout=60)
    assert proc.returncode == -9
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".")] == []  # nothing hidden
    assert run("dump", f, "-o", out).exit_code == 0
    assert sorted(p.name for p in out.parent.iterdir()) == ["s.aaak"]
    assert "a secret memory" in out.read_text(encoding="utf-8")


def test_readme_json_claim_matches_the_commands():
    """README said every command that prints data takes --json; several did not. Every
    command that prints something now takes it, apart from the ones README names."""
    readme = Path(__file__).resolve().parents[1].joinpath("README.md").read_text(encoding="utf-8")
    exempt = {"dump", "export", "diff", "mcp", "shell"}  # mcp: stdout carries the Model Context Protocol; shell runs other commands
    assert all(f"`{name}`" in readme for name in exempt)
    silent = {"init", "rekey", "export-key", "import-key"}  # they print a status line, not data
    commands = [(name, command) for name, command in cli.commands.items() if not hasattr(command, "commands")]
    commands += [(f"{name} {sub}", c) for name, group in cli.commands.items()
                 for sub, c in getattr(group, "commands", {}).items()]  # a group's commands (engramdb agent ...)
    for name, command in commands:
        if name in exempt | silent:
            continue
        assert any(p.name == "as_json" for p in command.params), f"{name} has no --json"
