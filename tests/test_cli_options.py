"""Global options anywhere on the command line, a key source from every place, --quiet,
progress bars, --version, and no store created by a command that only reads or adds."""
from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

import engramdb
import engramdb.cli as cli_mod
from engramdb.cli import cli

KDF = "t=1,m=8,p=1"


@pytest.fixture
def run():
    runner = CliRunner()

    def invoke(*args: str, env: dict | None = None, input: str | None = None):
        full_env = {"ENGRAM_PASSPHRASE": "pw", "ENGRAM_TEST_WEAK_KDF": "1", "ENGRAM_KEY_FILE": None,
                    "ENGRAM_PLAINTEXT": None, **(env or {})}
        return runner.invoke(cli, list(args), env=full_env, input=input, catch_exceptions=False)

    return invoke


def test_global_options_work_after_the_subcommand(run, tmp_path):
    f = str(tmp_path / "a.engram")
    pw = tmp_path / "pw"
    pw.write_text("secret\n")
    no_env = {"ENGRAM_PASSPHRASE": ""}
    assert run("init", f, "--kdf", KDF, "--passphrase-file", str(pw), env=no_env).exit_code == 0
    assert run("add", f, "Alice moved", "--id", "a", "--passphrase-file", str(pw), env=no_env).exit_code == 0
    info = run("info", f, "--passphrase-file", str(pw), "--json", env=no_env)
    assert info.exit_code == 0, info.output
    assert json.loads(info.output)["memories"] == 1
    # before the command name still works
    assert run("--passphrase-file", str(pw), "get", f, "a", env=no_env).exit_code == 0
    # after the command wins over before it: the last word on the command line counts
    bad = tmp_path / "bad"
    bad.write_text("wrong\n")
    assert run("--passphrase-file", str(bad), "get", f, "a", "--passphrase-file", str(pw), env=no_env).exit_code == 0


def test_plaintext_from_the_environment_and_after_the_command(run, tmp_path):
    f = str(tmp_path / "p.engram")
    assert "PLAINTEXT" in run("init", f, "--plaintext").output
    assert run("add", f, "visible", "--id", "v", env={"ENGRAM_PLAINTEXT": "1"}).exit_code == 0
    got = run("get", f, "v", "--plaintext", "--json")
    assert json.loads(got.output)["content"] == "visible"
    wrong = run("get", f, "v")  # a passphrase for a plaintext file
    assert wrong.exit_code == 1 and "--plaintext" in wrong.output


def test_key_file_from_the_environment(run, tmp_path):
    f = str(tmp_path / "k.engram")
    kf = tmp_path / "raw.key"
    kf.write_bytes(bytes(range(32)))
    assert run("init", f, "--key-file", str(kf), env={"ENGRAM_PASSPHRASE": ""}).exit_code == 0
    env = {"ENGRAM_KEY_FILE": str(kf), "ENGRAM_PASSPHRASE": "not this"}  # the key file wins over the passphrase
    assert run("add", f, "keyed", "--id", "k", env=env).exit_code == 0
    assert json.loads(run("get", f, "k", "--json", env=env).output)["content"] == "keyed"
    # a passphrase file on the command line beats the variable (and here does not unlock the file)
    pw = tmp_path / "pw"
    pw.write_text("pw")
    assert run("get", f, "k", "--passphrase-file", str(pw), env=env).exit_code == 1


def test_contradicting_key_sources_are_a_usage_error(run, tmp_path):
    f = str(tmp_path / "c.engram")
    run("init", f, "--kdf", KDF)
    kf = tmp_path / "raw.key"
    kf.write_bytes(bytes(32))
    both = run("info", f, "--plaintext", "--key-file", str(kf))
    assert both.exit_code == 2 and "--key-file and --plaintext" in both.output
    env_both = run("info", f, env={"ENGRAM_PLAINTEXT": "1", "ENGRAM_KEY_FILE": str(kf)})
    assert env_both.exit_code == 2 and "$ENGRAM_KEY_FILE and $ENGRAM_PLAINTEXT" in env_both.output


@pytest.mark.parametrize("command", [["add", "x"], ["ingest", "IN"], ["list"], ["info"], ["recall", "q"]])
def test_a_mistyped_path_is_an_error_and_creates_nothing(run, tmp_path, command):
    src = tmp_path / "in.txt"
    src.write_text("Alice moved to Berlin in 2023.")
    missing = tmp_path / "typo.engram"
    args = [a if a != "IN" else str(src) for a in command]
    result = run(args[0], str(missing), *args[1:])
    assert result.exit_code == 1, result.output
    assert "does not exist" in result.output and "engramdb init" in result.output
    assert "create=True" not in result.output
    assert sorted(os.listdir(tmp_path)) == ["in.txt"]


def test_a_missing_directory_is_named_as_such(run, tmp_path):
    result = run("add", str(tmp_path / "nodir" / "x.engram"), "text")
    assert result.exit_code == 1 and "directory" in result.output and "verify" not in result.output


def test_import_creates_only_with_create(run, tmp_path):
    src = tmp_path / "m.jsonl"
    src.write_text(json.dumps({"id": "m1", "content": "hello there"}) + "\n")
    f = tmp_path / "new.engram"
    refused = run("import", str(src), str(f))
    assert refused.exit_code == 1 and "does not exist" in refused.output and not f.exists()
    created = run("import", str(src), str(f), "--create")
    assert created.exit_code == 0, created.output
    assert json.loads(run("get", str(f), "m1", "--json").output)["content"] == "hello there"


def test_version(run):
    result = run("--version")
    assert result.exit_code == 0 and result.output.strip() == f"engramdb {engramdb.__version__}"


def test_progress_bars_have_a_total_and_quiet_hides_them(run, tmp_path, monkeypatch):
    f = str(tmp_path / "q.engram")
    run("init", f, "--kdf", KDF)
    for n in range(3):
        run("add", f, f"memory number {n}", "--id", f"m{n}")
    monkeypatch.setattr(cli_mod, "_show_progress", lambda stream: True)
    shown = run("dump", f, "-o", str(tmp_path / "d.aaak"))
    assert shown.exit_code == 0 and "dumping" in shown.stderr and "/3 [" in shown.stderr  # the total
    quiet = run("dump", f, "-o", str(tmp_path / "d2.aaak"), "--quiet")
    assert quiet.exit_code == 0 and quiet.stderr == ""
    for command, word in (("verify", "verifying"), ("compact", "compacting")):
        shown = run(command, f)
        assert shown.exit_code == 0 and word in shown.stderr, shown.stderr
        assert "0%|" in shown.stderr  # a percentage: the bar has a total (the file's bytes)
        assert run(command, f, "-q").stderr == ""


def test_new_commands_get_the_global_options():
    """Any command declared with @cli.command() accepts them (a contract for new commands)."""
    for name, command in cli.commands.items():
        opts = {o for p in command.params for o in getattr(p, "opts", ())}
        assert {"--passphrase-file", "--key-file", "--plaintext", "--quiet"} <= opts, name


def test_update_tag_untag_link_unlink_edges(run, tmp_path):
    """The command line does what the API does (issue 12, "Scores and the CLI")."""
    f = str(tmp_path / "u.engram")
    run("init", f, "--kdf", KDF)
    run("add", f, "We chose JWT for auth", "--id", "jwt", "--tag", "auth")
    run("add", f, "We chose sessions instead", "--id", "sess")
    up = run("update", f, "jwt", "--importance", "0.9", "--tier", "warm", "--metadata", '{"by": "ana"}', "--json")
    assert up.exit_code == 0, up.output
    node = json.loads(up.output)
    assert node["importance"] == 0.9 and node["tier"] == "warm" and node["metadata"] == {"by": "ana"}
    assert run("update", f, "jwt", "--content", "-", input="We chose JWT\n").exit_code == 0
    assert json.loads(run("get", f, "jwt", "--json").output)["content"] == "We chose JWT"
    assert run("update", f, "jwt").exit_code == 2  # nothing to change
    assert run("update", f, "jwt", "--metadata", "[1]").exit_code == 2
    assert run("update", f, "nope", "--importance", "0.1").exit_code == 1
    tagged = run("tag", f, "jwt", "decision", "auth", "--json")
    assert json.loads(tagged.output) == {"id": "jwt", "tags": ["auth", "decision"]}
    assert json.loads(run("untag", f, "jwt", "auth", "missing", "--json").output)["tags"] == ["decision"]
    assert run("link", f, "sess", "jwt", "--kind", "supersedes").exit_code == 0
    listed = [json.loads(line) for line in run("edges", f, "sess", "--json").output.splitlines()]
    assert [(e["dst"], e["kind"]) for e in listed] == [("jwt", "supersedes")]
    assert listed[0]["created_at"].endswith("Z")
    assert run("unlink", f, "sess", "jwt", "--kind", "supersedes").exit_code == 0
    assert run("edges", f, "sess").output == ""
    again = run("unlink", f, "sess", "jwt", "--kind", "supersedes")
    assert again.exit_code == 1 and "engramdb edges" in again.output
    assert run("unlink", f, "sess", "jwt", "--kind", "supersedes", "--missing-ok").exit_code == 0
    assert run("link", f, "sess", "ghost").exit_code == 1


def test_filters_on_list_recall_and_context(run, tmp_path):
    f = str(tmp_path / "flt.engram")
    run("init", f, "--kdf", KDF)
    run("add", f, "Alice plays tennis on Mondays", "--id", "ab", "--tag", "a", "--tag", "b", "--source", "s1")
    run("add", f, "Alice plays chess on Mondays", "--id", "a", "--tag", "a", "--tier", "cold")

    def ids(*args):
        result = run(*args, "--json")
        assert result.exit_code == 0, result.output
        return [json.loads(line).get("id") for line in result.output.splitlines()]

    assert ids("list", f, "--tag", "a", "--tag", "b") == ["ab"]  # all of them
    assert ids("recall", f, "Alice Mondays", "--tag", "a", "--tag", "b") == ["ab"]  # the same meaning
    assert ids("list", f, "--any-tag", "b", "--any-tag", "a") == ["ab", "a"]
    assert sorted(ids("recall", f, "Alice Mondays", "--any-tag", "a")) == ["a", "ab"]
    assert ids("recall", f, "Alice Mondays", "--tier", "cold") == ["a"]
    assert ids("recall", f, "Alice Mondays", "--source", "s1") == ["ab"]
    assert ids("recall", f, "Alice Mondays", "--after", "2999-01-01") == []
    assert sorted(ids("recall", f, "Alice Mondays", "--before", "2999")) == ["a", "ab"]
    assert ids("recall", f, "Alice Mondays", "--flag", "DECISION") == []
    assert run("recall", f, "x", "--flag", "NOPE").exit_code == 2
    assert run("list", f, "--after", "last week").exit_code == 2
    ctx = json.loads(run("context", f, "Alice Mondays", "--tag", "b", "--json").output)
    assert [p["ids"] for p in ctx["passages"]] == [["ab"]]


def test_timestamps_print_as_iso_8601(run, tmp_path):
    f = str(tmp_path / "t.engram")
    run("init", f, "--kdf", KDF)
    run("add", f, "stamped", "--id", "s")
    got = json.loads(run("get", f, "s", "--json").output)
    listed = json.loads(run("list", f, "--json").output)
    import datetime

    for data in (got, listed):
        for key in ("created_at", "last_accessed"):
            assert data[key].endswith("Z")
            datetime.datetime.fromisoformat(data[key].replace("Z", "+00:00"))
    assert "created_at    " + got["created_at"] in run("get", f, "s").output
    # the dump keeps the exact encoding
    assert run("dump", f, "-o", str(tmp_path / "d.aaak")).exit_code == 0
    node_line = next(line for line in (tmp_path / "d.aaak").read_text().splitlines() if line.startswith("@n s|"))
    exact = float(node_line.split("|")[3])  # the dump's created_at: the float itself
    assert cli_mod._iso(exact) == got["created_at"] and "Z" not in node_line


def test_shell_unlocks_once_and_runs_commands_from_stdin(run, tmp_path, monkeypatch):
    f = str(tmp_path / "sh.engram")
    run("init", f, "--kdf", KDF)
    derivations = []
    real_open = cli_mod.engram_mod.open

    def counting_open(*args, **kwargs):
        derivations.append(args[0])
        return real_open(*args, **kwargs)

    monkeypatch.setattr(cli_mod.engram_mod, "open", counting_open)
    script = "\n".join([
        'add "Alice moved to Berlin in 2023" --id a --tag people',
        'add "Bob prefers tea" --id b',
        "get a --json",
        "list --tag people --json",
        'recall "where does alice live" --top-k 1 --json',
        "help",
        "bogus",
        "get missing",
        "tag b drinks",
        "exit",
        "get b",  # after exit: not run
    ]) + "\n"
    result = run("shell", f, input=script)
    assert derivations == [f]  # one open, one key derivation, for every command
    lines = result.stdout.splitlines()
    assert lines[0] == "a" and lines[1] == "b"
    assert json.loads(lines[2])["content"] == "Alice moved to Berlin in 2023"
    assert json.loads(lines[3])["id"] == "a"
    assert json.loads(lines[4])["id"] == "a"
    assert "commands (FILE is implied)" in result.stdout and "recall" in result.stdout
    assert "'bogus' is not a shell command" in result.stderr
    assert "no memory with id 'missing'" in result.stderr
    assert "b: drinks" in result.stdout and "Bob prefers tea" not in result.stdout
    assert result.exit_code == 1  # the last failing line ("get missing") sets the exit code
    clean = run("shell", f, input="get a\n")
    assert clean.exit_code == 0 and "Alice" in clean.stdout
    assert run("shell", str(tmp_path / "missing.engram"), input="get a\n").exit_code == 1


def test_shell_script_lines_starting_with_a_hash_are_comments(run, tmp_path):
    # a commented script failed with "'#' is not a shell command" (exit 2) for each comment
    f = str(tmp_path / "sh.engram")
    run("init", f, "--kdf", KDF)
    script = "# set up\n   # indented comment\nadd \"tea # not a comment\" --id t\nget t\n"
    result = run("shell", f, input=script)
    assert result.exit_code == 0, result.output
    assert result.stderr == "" and "tea # not a comment" in result.stdout


def test_shell_from_stdin_refuses_add_dash_instead_of_eating_the_script(run, tmp_path):
    # `add -` read the rest of stdin, which is the script: its later lines became one memory
    # and never ran, and the shell exited 0
    f = str(tmp_path / "sh.engram")
    run("init", f, "--kdf", KDF)
    result = run("shell", f, input="add -\nadd \"kept as a command\" --id k\nupdate k --content -\nget k\n")
    assert result.exit_code == 2, result.output
    assert result.stderr.count("cannot read the text") == 2
    assert [json.loads(line)["id"] for line in run("list", f, "--json").stdout.splitlines()] == ["k"]
    assert "kept as a command" in result.stdout


def test_diff_says_which_side_its_key_does_not_unlock(run, tmp_path):
    # "the passphrase does not unlock this file": of two files, which one, and that the
    # side's own --b-passphrase-file was the way out, went unsaid
    a, b = str(tmp_path / "a.engram"), str(tmp_path / "b.engram")
    run("init", a, "--kdf", KDF)
    run("init", b, "--kdf", KDF, env={"ENGRAM_PASSPHRASE": "other"})
    result = run("diff", a, b)
    assert result.exit_code == 2 and result.stdout == ""
    assert f"error: B ({b}): " in result.stderr and "--b-passphrase-file" in result.stderr
    pb = tmp_path / "pb"
    pb.write_text("other\n")
    assert run("diff", a, b, "--b-passphrase-file", str(pb)).exit_code == 0
    plain = str(tmp_path / "p.engram")
    run("init", plain, "--plaintext")
    result = run("diff", plain, a)
    assert result.exit_code == 2 and f"error: A ({plain}): " in result.stderr and "--a-plaintext" in result.stderr


def test_diff_exits_2_when_a_side_cannot_be_read_and_1_only_when_they_differ(run, tmp_path):
    # exit 1 meant both "they differ" and "an error", so `engramdb diff a b || alert` took a
    # wrong key or a damaged dump for a change; as diff(1), trouble is 2
    a, b = str(tmp_path / "a.engram"), str(tmp_path / "b.engram")
    run("init", a, "--plaintext")
    run("init", b, "--plaintext")
    run("add", a, "only in a", "--id", "m1", "--plaintext")
    differ = run("diff", a, b, "--plaintext")
    assert differ.exit_code == 1 and "only in a" in differ.stdout
    broken = tmp_path / "broken.aaak"
    broken.write_text("this is not a dump\n")
    result = run("diff", a, str(broken), "--plaintext")
    assert result.exit_code == 2 and result.stdout == ""
    assert f"error: B ({broken}): " in result.stderr and "hint: " in result.stderr


def test_diff_takes_a_store_or_a_dump_on_either_side_with_its_own_key(run, tmp_path):
    a, b = str(tmp_path / "a.engram"), str(tmp_path / "b.engram")
    pa, pb = tmp_path / "pa", tmp_path / "pb"
    pa.write_text("alpha")
    pb.write_text("beta")
    run("init", a, "--kdf", KDF, "--passphrase-file", str(pa))
    run("add", a, "shared memory", "--id", "m1", "--passphrase-file", str(pa))
    run("dump", a, "-o", str(tmp_path / "a.aaak"), "--passphrase-file", str(pa))
    assert run("restore", str(tmp_path / "a.aaak"), b, "--kdf", KDF, "--passphrase-file", str(pb)).exit_code == 0
    same = run("diff", a, b, "--a-passphrase-file", str(pa), "--b-passphrase-file", str(pb))
    assert same.exit_code == 0, same.output
    run("add", b, "only in b", "--id", "m2", "--passphrase-file", str(pb))
    # a dump on the left, a store on the right
    changed = run("diff", str(tmp_path / "a.aaak"), b, "--b-passphrase-file", str(pb))
    assert changed.exit_code == 1 and "+@c m2|only in b" in changed.stdout
    # an encrypted dump on the right, with its own passphrase
    enc = str(tmp_path / "b.enc")
    assert run("dump", b, "-o", enc, "--encrypt", "--passphrase-file", str(pb),
               env={"ENGRAM_DUMP_PASSPHRASE": "sealed"}).exit_code == 0
    dumps = run("diff", b, enc, "--a-passphrase-file", str(pb), env={"ENGRAM_DUMP_PASSPHRASE": "sealed"})
    assert dumps.exit_code == 0, dumps.output
    pd = tmp_path / "pd"
    pd.write_text("sealed")
    assert run("diff", str(tmp_path / "a.aaak"), enc, "--b-passphrase-file", str(pd)).exit_code == 1
    wrong = run("diff", a, b, "--b-passphrase-file", str(pb))  # A with the global passphrase "pw": wrong
    assert wrong.exit_code == 2 and "error:" in wrong.stderr
    both = run("diff", a, b, "--a-plaintext", "--a-key-file", str(pa))
    assert both.exit_code == 2


def test_kdf_without_a_passphrase_is_a_usage_error(run, tmp_path):
    # regression: init/restore --plaintext (or --key-file) --kdf ignored --kdf without a word
    f = str(tmp_path / "p.engram")
    got = run("init", f, "--plaintext", "--kdf", KDF)
    assert got.exit_code == 2 and "--kdf" in got.output and not os.path.exists(f)
    kf = tmp_path / "raw.key"
    kf.write_bytes(bytes(range(32)))
    assert run("init", f, "--key-file", str(kf), "--kdf", KDF).exit_code == 2
    assert run("init", f, "--plaintext").exit_code == 0
    dump = str(tmp_path / "d.aaak")
    assert run("dump", f, "-o", dump, "--plaintext").exit_code == 0
    restored = run("restore", dump, str(tmp_path / "r.engram"), "--plaintext", "--kdf", KDF)
    assert restored.exit_code == 2 and "--kdf" in restored.output
    assert run("restore", dump, str(tmp_path / "r.engram"), "--kdf", KDF).exit_code == 0  # a passphrase: taken


def test_json_nested_past_the_recursion_limit_is_a_clear_error(run, tmp_path):
    # update --metadata, ingest of a .jsonl or .json chat and agent after's transcript raised a
    # raw RecursionError (a traceback) on JSON nested some thousands deep
    f = str(tmp_path / "d.engram")
    run("init", f, "--kdf", KDF)
    run("add", f, "a memory", "--id", "x")
    deep = "[" * 20000 + "]" * 20000
    result = run("update", f, "x", "--metadata", deep)
    assert result.exit_code == 2 and "nests too deeply" in result.stderr
    for name in ("deep.jsonl", "deep.json"):
        (tmp_path / name).write_text(deep + "\n")
        result = run("ingest", f, str(tmp_path / name))
        assert result.exit_code == 1 and f"{name}, line 1: not JSON (JSON nests too deeply)" in result.stderr
    result = run("agent", "after", f, str(tmp_path / "deep.json"))
    assert result.exit_code == 1 and "nests too deeply" in result.stderr
    with engramdb.open(f, passphrase="pw", readonly=True) as db:
        assert len(db) == 1 and db.get("x").metadata == {}
