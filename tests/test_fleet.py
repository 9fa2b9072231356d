"""The fleet: one job over many files as Dask tasks, equal to running it file by file.

Runs on a local Dask cluster of two worker processes (skips where Dask's distributed
scheduler is not installed; CI installs it with the test extra).
"""
from __future__ import annotations

import io
import json
import os
import shutil
import signal
import sys

import pytest
from conftest import NOW, TEST_KDF

import engramdb
from engramdb import fleet
from engramdb.errors import ValidationError

distributed = pytest.importorskip("distributed")
cloudpickle = pytest.importorskip("cloudpickle")
# The user-function jobs below travel to the workers by value (the workers cannot import a test module).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

DAY = 86_400.0
FILES = 50


def _memories(i: int) -> list[dict]:
    """Old memories with near-duplicates, so a maintenance pass decays, dedupes and archives."""
    topics = ["garden tomatoes", "railway timetable", "violin lessons", "tax return", "roof repair"]
    items = []
    for j in range(12):
        topic = topics[(i + j) % len(topics)]
        # the same text for each topic (j and j + 5): "entry 0" / "entry 2" differed only in a
        # digit, which the built-in space cannot see, and such pairs are no duplicates since session 8
        items.append({"id": f"m{j}", "content": f"user {i} notes about the {topic}",
                      "created_at": NOW - (40 + 37 * j) * DAY, "importance": 0.1 * (j % 4)})
    return items


def _secret(i: int) -> str | bytes:
    return bytes([i + 1]) * 32 if i % 2 else f"passphrase-{i}"


def _open_kwargs(secret: str | bytes) -> dict:
    return {"key": secret} if isinstance(secret, bytes) else {"passphrase": secret}


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    """FILES small stores with mixed keys (passphrases and raw keys): {path: secret}."""
    folder = tmp_path_factory.mktemp("fleet-originals")
    keys = {}
    for i in range(FILES):
        path = str(folder / f"user{i:02d}.engram")
        secret = _secret(i)
        with engramdb.open(path, kdf=TEST_KDF, **_open_kwargs(secret)) as db:
            db.add_many(_memories(i), now=NOW - 40 * DAY)
        keys[path] = secret
    return keys


def _copy(keys: dict, folder) -> dict:
    folder.mkdir()
    copied = {}
    for path, secret in keys.items():
        target = str(folder / os.path.basename(path))
        shutil.copyfile(path, target)
        copied[target] = secret
    return copied


def _dump(path: str, secret: str | bytes) -> bytes:
    out = io.BytesIO()
    with engramdb.open(path, create=False, **_open_kwargs(secret)) as db:
        db.dump(out)
    return out.getvalue()


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    with distributed.Client(cluster) as dask_client:
        yield dask_client
    cluster.close()


def test_maintain_verify_dump_equal_one_file_at_a_time(originals, client, tmp_path):
    on_fleet = _copy(originals, tmp_path / "fleet")
    one_by_one = _copy(originals, tmp_path / "loop")

    report = fleet.run(list(on_fleet), "maintain", client=client, key_source=on_fleet.__getitem__,
                       now=NOW, progress=False)
    assert report.ok and report.totals == {"files": FILES, "ok": FILES, "problems": 0, "error": 0, "busy": 0}
    assert [f.path for f in report.files] == list(on_fleet)  # in the order given
    loop_reports = []
    for path, secret in one_by_one.items():
        with engramdb.open(path, create=False, **_open_kwargs(secret)) as db:
            loop_reports.append(db.maintain(now=NOW).to_dict())
    # the same work was done...
    for fleet_file, loop_report in zip(report.files, loop_reports):
        assert {k: fleet_file.result[k] for k in ("decayed", "deduplicated", "archived", "after_by_tier")} == \
               {k: loop_report[k] for k in ("decayed", "deduplicated", "archived", "after_by_tier")}
    assert sum(f.result["decayed"] for f in report.files) > 0
    assert sum(f.result["deduplicated"] for f in report.files) > 0
    # ...and left the same files
    for (a, secret), b in zip(on_fleet.items(), one_by_one):
        assert _dump(a, secret) == _dump(b, secret)

    verified = fleet.run(list(on_fleet), "verify", client=client, key_source=on_fleet.__getitem__, progress=False)
    assert verified.ok and all(f.result == {"problems": []} for f in verified.files)

    out = tmp_path / "dumps"
    dumped = fleet.run(list(on_fleet), "dump", client=client, key_source=on_fleet.__getitem__, out=str(out),
                       progress=False)
    assert dumped.ok
    for path, secret in on_fleet.items():
        name = os.path.basename(path)[:-len(".engram")] + ".aaak"
        assert (out / name).read_bytes() == _dump(path, secret)
    assert sorted(os.listdir(out)) == sorted(os.path.basename(p)[:-len(".engram")] + ".aaak" for p in on_fleet)


def test_a_damaged_file_and_a_wrong_key_fail_only_their_tasks(originals, client, tmp_path):
    files = _copy(originals, tmp_path / "fleet")
    paths = list(files)
    damaged, wrong = paths[3], paths[10]
    with open(damaged, "r+b") as fh:  # a foreign header over the file's first page
        fh.write(b"this is not an engram file at all" * 100)
    keys = dict(files)
    keys[wrong] = "not-the-passphrase"
    report = fleet.run(paths, "verify", client=client, key_source=keys.__getitem__, progress=False)
    by_path = {f.path: f for f in report.files}
    assert report.totals["ok"] == FILES - 2 and report.totals["error"] == 2 and not report.ok
    assert by_path[wrong].error == "WrongPassphraseError" and by_path[wrong].hint
    assert by_path[damaged].status == "error" and by_path[damaged].error.endswith("Error") and by_path[damaged].hint
    table = report.table()
    assert "48 ok" in table and "2 failed" in table and os.path.basename(damaged) in table
    assert json.loads(report.to_json())["totals"]["error"] == 2


def maintain_killed_once(db):
    """A maintenance job whose worker is SIGKILLed in the middle of its first attempt."""
    from engramdb.maintenance.lifecycle import MaintenanceConfig

    marker = db.path + ".killed-once"

    def progress(stage, done, total):
        if done and not os.path.exists(marker):
            with open(marker, "w") as fh:
                fh.write(stage)
            os.kill(os.getpid(), signal.SIGKILL)

    return db.maintain(MaintenanceConfig(batch_size=2), now=NOW, progress=progress).to_dict()


def test_a_worker_killed_during_maintain_is_retried_and_converges(originals, client, tmp_path):
    (path, secret), = list(_copy({p: s for p, s in originals.items() if "user04" in p}, tmp_path / "fleet").items())
    (twin, _), = list(_copy({p: s for p, s in originals.items() if "user04" in p}, tmp_path / "twin").items())

    report = fleet.run([path], maintain_killed_once, client=client, key_source=lambda p: secret, progress=False)
    assert os.path.exists(path + ".killed-once")  # the first attempt really died
    assert report.ok, report.table()
    with engramdb.open(path, create=False, **_open_kwargs(secret)) as db:
        assert db.verify() == []
    from engramdb.maintenance.lifecycle import MaintenanceConfig

    with engramdb.open(twin, create=False, **_open_kwargs(secret)) as db:
        db.maintain(MaintenanceConfig(batch_size=2), now=NOW)
    assert _dump(path, secret) == _dump(twin, secret)


def test_a_busy_file_is_retried_then_reported_busy(originals, client, tmp_path):
    files = _copy(dict(list(originals.items())[:3]), tmp_path / "fleet")
    paths = list(files)
    held = engramdb.open(paths[1], create=False, **_open_kwargs(files[paths[1]]))
    try:  # compaction needs the file to itself; this handle keeps it busy
        report = fleet.run(paths, "compact", client=client, key_source=files.__getitem__, retries=1,
                           progress=False)
    finally:
        held.close()
    assert [f.status for f in report.files] == ["ok", "busy", "ok"]
    assert report.files[1].error == "BusyFileError" and report.files[1].hint
    assert report.files[0].result["bytes_after"] <= report.files[0].result["bytes_before"]


def test_dump_to_an_fsspec_url(originals, client, tmp_path):
    files = _copy(dict(list(originals.items())[:2]), tmp_path / "fleet")
    url = (tmp_path / "bucket").as_uri()
    (tmp_path / "bucket").mkdir()
    report = fleet.run(list(files), "dump", client=client, key_source=files.__getitem__, out=url, progress=False)
    assert report.ok and all(f.result["dump"].startswith("file://") for f in report.files)
    for path, secret in files.items():
        name = os.path.basename(path)[:-len(".engram")] + ".aaak"
        assert (tmp_path / "bucket" / name).read_bytes() == _dump(path, secret)


def test_cli_runs_a_job_on_a_scheduler(originals, client, tmp_path):
    from click.testing import CliRunner

    from engramdb.cli import cli

    folder = tmp_path / "fleet"
    folder.mkdir()
    for i in range(3):  # one passphrase for all
        with engramdb.open(folder / f"t{i}.engram", passphrase="shared", kdf=TEST_KDF) as db:
            db.add(f"memory {i}")
    address = client.scheduler.address
    secret = tmp_path / "passphrase"
    secret.write_text("shared\n")
    env = {"ENGRAM_TEST_WEAK_KDF": "1"}
    glob_ = str(folder / "*.engram")
    # the scheduler's workers were started without $ENGRAM_PASSPHRASE: say so, per file
    no_env = CliRunner().invoke(cli, ["fleet", "stats", glob_, "--scheduler", address],
                                env={**env, "ENGRAM_PASSPHRASE": "shared"}, catch_exceptions=False)
    assert no_env.exit_code == 1 and "not set on the worker" in no_env.output
    result = CliRunner().invoke(cli, ["fleet", "stats", glob_, "--scheduler", address, "--json",
                                      "--passphrase-file", str(secret)], env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["totals"]["ok"] == 3 and [f["result"]["memories"] for f in data["files"]] == [1, 1, 1]
    secret.write_text("wrong\n")
    bad = CliRunner().invoke(cli, ["fleet", "verify", glob_, "--scheduler", address, "--passphrase-file", str(secret)],
                             env=env, catch_exceptions=False)
    assert bad.exit_code == 1 and "3 failed" in bad.output and "WrongPassphraseError" in bad.output


# --- no cluster needed ----------------------------------------------------------------------

def test_key_sources_resolve_on_the_worker(tmp_path, monkeypatch):
    path = str(tmp_path / "k.engram")
    raw = bytes(range(32))
    with engramdb.open(path, key=raw, kdf=TEST_KDF) as db:
        db.add("hello", id="h")
    with open(path + ".key", "wb") as fh:
        fh.write(raw)
    assert fleet.run_one(path, "stats", fleet.KeyFileBeside())["status"] == "ok"
    assert fleet.run_one(path, "stats", fleet.KeyFiles({path: path + ".key"}))["status"] == "ok"
    assert fleet.run_one(path, "stats", fleet.KeyFile(path + ".key"))["status"] == "ok"
    unmapped = fleet.run_one(path, "stats", fleet.KeyFiles({}))
    assert unmapped["status"] == "error" and "mapping" in unmapped["hint"]
    monkeypatch.delenv("ENGRAM_PASSPHRASE", raising=False)
    missing = fleet.run_one(path, "stats", fleet.PassphraseEnv())
    assert missing["status"] == "error" and "ENGRAM_PASSPHRASE" in missing["message"]
    assert "secret" not in repr(fleet.Passphrase("secret")) and "secret" not in str(fleet.Passphrase("secret"))
    wrong_type = fleet.run_one(path, "stats", lambda p: 42)
    assert wrong_type["status"] == "error" and "str" in wrong_type["hint"]


def test_user_function_job_and_bad_arguments(tmp_path):
    path = str(tmp_path / "u.engram")
    with engramdb.open(path, passphrase="pw", kdf=TEST_KDF) as db:
        db.add("hello", id="h")
    row = fleet.run_one(path, lambda db: {"n": len(db)}, fleet.Passphrase("pw"))
    assert row["status"] == "ok" and row["result"] == {"n": 1}
    assert fleet.run_one(path, lambda db: 3, fleet.Passphrase("pw"))["status"] == "error"
    with pytest.raises(ValidationError, match="unknown job"):
        fleet.run([path], "defragment")
    with pytest.raises(ValidationError, match="output folder"):
        fleet.run([path], "dump")
    with pytest.raises(ValidationError, match="no file matches"):
        fleet.run(str(tmp_path / "nothing-*.engram"), "verify")
    with pytest.raises(ValidationError, match="named twice"):
        fleet.run([path, path], "verify")


def test_dump_out_that_is_a_file_is_refused_before_any_task(tmp_path):
    """out= naming a file raised a raw FileExistsError from os.makedirs (the CLI printed
    "File exists" with a hint about permissions); a folder that cannot be made, the same."""
    path = str(tmp_path / "u.engram")
    with engramdb.open(path, passphrase="pw", kdf=TEST_KDF) as db:
        db.add("hello", id="h")
    taken = tmp_path / "backups"
    taken.write_text("not a folder")
    with pytest.raises(ValidationError, match="not a folder"):
        fleet.run([path], "dump", out=str(taken))
    assert taken.read_text() == "not a folder"
    with pytest.raises(ValidationError, match="cannot create the output folder"):
        fleet.run([path], "dump", out=str(taken / "sub"))


def _mixed_folder(folder) -> None:
    """One plaintext and one encrypted store (passphrase "pw")."""
    folder.mkdir()
    with engramdb.open(folder / "a-plain.engram", encrypted=False) as db:
        db.add("plaintext memory")
    with engramdb.open(folder / "b-secret.engram", passphrase="pw", kdf=TEST_KDF) as db:
        db.add("encrypted memory")


def test_a_mode_mismatch_hint_names_the_fleet_key_source_not_open_arguments(tmp_path, monkeypatch):
    """A plaintext store run with a passphrase said "open it without a passphrase
    (encrypted=False)", an encrypted one run with Plaintext() "pass encrypted=False for a
    plaintext one": open()'s arguments, which a fleet user does not pass."""
    _mixed_folder(tmp_path / "mixed")
    plain, secret = str(tmp_path / "mixed" / "a-plain.engram"), str(tmp_path / "mixed" / "b-secret.engram")
    monkeypatch.setenv("ENGRAM_PASSPHRASE", "pw")
    for source in (fleet.PassphraseEnv(), fleet.Passphrase("pw"), lambda p: "pw", lambda p: bytes(32)):
        row = fleet.run_one(plain, "stats", source)
        assert row["status"] == "error" and row["error"] == "ModeMismatchError"
        assert "Plaintext() (--plaintext)" in row["hint"] and "encrypted=False" not in row["hint"]
        assert fleet.run_one(secret, "stats", source if not callable(source) or source(secret) == "pw"
                             else fleet.Passphrase("pw"))["status"] == "ok"
    row = fleet.run_one(secret, "stats", fleet.Plaintext())
    assert row["status"] == "error" and row["error"] == "ModeMismatchError"
    assert "not Plaintext() (--plaintext)" in row["hint"] and "encrypted=False" not in row["hint"]
    assert fleet.run_one(plain, "stats", fleet.Plaintext())["status"] == "ok"

    def rekey(db):  # a job's own mode mismatch keeps its own words
        db.rekey("new")
        return {}

    row = fleet.run_one(plain, rekey, fleet.Plaintext())
    assert row["error"] == "ModeMismatchError" and "Plaintext()" not in row["hint"]


def test_cli_fleet_over_plaintext_and_encrypted_files_hints_at_the_option(client, tmp_path):
    from click.testing import CliRunner

    from engramdb.cli import cli

    _mixed_folder(tmp_path / "mixed")
    glob_ = str(tmp_path / "mixed" / "*.engram")
    secret = tmp_path / "passphrase"
    secret.write_text("pw\n")
    address = client.scheduler.address
    env = {"ENGRAM_TEST_WEAK_KDF": "1"}
    keyed = CliRunner().invoke(cli, ["fleet", "stats", glob_, "--scheduler", address, "--passphrase-file", str(secret)],
                               env=env, catch_exceptions=False)
    assert keyed.exit_code == 1 and "1 ok" in keyed.output and "1 failed" in keyed.output
    assert "--plaintext" in keyed.output and "encrypted=False" not in keyed.output
    plain = CliRunner().invoke(cli, ["--plaintext", "fleet", "stats", glob_, "--scheduler", address],
                               env=env, catch_exceptions=False)
    assert plain.exit_code == 1 and "1 ok" in plain.output and "1 failed" in plain.output
    assert "not Plaintext() (--plaintext)" in plain.output and "encrypted=False" not in plain.output


def _count(path: str, secret: str | bytes) -> int:
    with engramdb.open(path, create=False, readonly=True, **_open_kwargs(secret)) as db:
        return len(db)


def add_then_fail(db):
    """A job function with a bug after its first write."""
    db.add("written by the job")
    raise KeyError("no such setting")


def test_a_failing_job_function_runs_once_and_reports_its_error(originals, client, tmp_path):
    """Any exception but a busy file's went back to Dask, which retried the task `retries`
    times (documented for busy files only): a job that wrote before failing wrote three times,
    and its row said "see the worker logs"."""
    files = _copy(dict(list(originals.items())[:2]), tmp_path / "fleet")
    paths = list(files)
    before = [_count(p, s) for p, s in files.items()]
    report = fleet.run(paths, add_then_fail, client=client, key_source=files.__getitem__, retries=2, progress=False)
    assert [f.status for f in report.files] == ["error", "error"]
    for item in report.files:
        assert item.error == "KeyError" and "no such setting" in item.message and "retried" in item.hint
    after = [_count(p, s) for p, s in files.items()]
    assert after == [n + 1 for n in before]  # once each, not 1 + retries times
    row = fleet.run_one(paths[0], add_then_fail, files.__getitem__)  # the same row without Dask
    assert row["status"] == "error" and row["error"] == "KeyError"


def test_the_timeout_reaches_each_task(client, tmp_path):
    """`engramdb --timeout 0 fleet ...` and fleet.run had no way to set how long a task waits
    for another process writing to its file: every task waited open()'s default 30 s."""
    from click.testing import CliRunner

    from engramdb.cli import cli

    folder = tmp_path / "fleet"
    folder.mkdir()
    path = str(folder / "t.engram")
    with engramdb.open(path, passphrase="pw", kdf=TEST_KDF) as db:
        db.add("a memory")
    secret = tmp_path / "passphrase"
    secret.write_text("pw\n")
    db = engramdb.open(path, passphrase="pw")
    try:
        with db.transaction() as tx:  # another process writing to the file meanwhile
            tx.add("a write in progress")
            report = fleet.run([path], "maintain", client=client, key_source=fleet.Passphrase("pw"), retries=0,
                               timeout=0.0, progress=False)
            assert report.files[0].status == "busy" and "timeout (0.0 s)" in report.files[0].message
            result = CliRunner().invoke(cli, ["--timeout", "0", "--passphrase-file", str(secret), "fleet", "maintain",
                                              str(folder / "*.engram"), "--scheduler", client.scheduler.address,
                                              "--retries", "0"], catch_exceptions=False)
            assert result.exit_code == 1 and "timeout (0.0 s)" in result.output and "1 busy" in result.output
    finally:
        db.close()
    with pytest.raises(ValidationError, match="timeout"):
        fleet.run([path], "stats", timeout=-1.0)


def test_a_scheduler_that_cannot_be_reached_is_an_error_with_a_hint(tmp_path):
    """--scheduler with a malformed address raised a raw ValueError (a traceback); an address
    where no scheduler listens said "check the path and its permissions"."""
    import dask
    from click.testing import CliRunner

    from engramdb.cli import cli

    path = tmp_path / "t.engram"
    with engramdb.open(path, passphrase="pw", kdf=TEST_KDF) as db:
        db.add("a memory")
    env = {"ENGRAM_PASSPHRASE": "pw"}
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        for address in ("no-port-here", "tcp://127.0.0.1:1"):  # port 1: nothing listens there
            result = CliRunner().invoke(cli, ["fleet", "stats", str(path), "--scheduler", address], env=env,
                                        catch_exceptions=False)
            assert result.exit_code == 1 and result.output.startswith("error: ")
            assert f"Dask scheduler at {address}" in result.output and "hint: check --scheduler" in result.output
            assert "Traceback" not in result.output and "the path and its permissions" not in result.output


def test_a_failed_connection_leaves_no_client_for_a_later_garbage_collection():
    """A Client that failed to connect sat in a reference cycle; a later collection ran its
    __del__ inside the next Client's start, which holds distributed's class-wide LoopRunner
    lock that close() waits for: the full suite hung in the test above (caught by the lead's
    run, 2026-12-02). _connect collects it at once."""
    import gc

    import dask
    import distributed

    def clients() -> set[int]:
        return {id(o) for o in gc.get_objects() if isinstance(o, distributed.Client)}

    before = clients()
    with (dask.config.set({"distributed.comm.timeouts.connect": "1s"}),
          pytest.raises(engramdb.errors.ConfigMismatchError, match="Dask scheduler at no-port-here")):
        fleet._connect("no-port-here")
    assert clients() - before == set()


def test_a_busy_file_on_the_local_cluster_prints_no_worker_tracebacks(tmp_path):
    """Each attempt on a busy file made the local cluster's worker log "Compute Failed" with a
    Traceback to the terminal, even under -q; the report already says which file was busy."""
    import subprocess

    path = str(tmp_path / "t.engram")
    with engramdb.open(path, passphrase="pw", kdf=TEST_KDF) as db:
        db.add("a memory")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "ENGRAM_PASSPHRASE": "pw", "PYTHONPATH": root}
    db = engramdb.open(path, passphrase="pw")
    try:
        with db.transaction() as tx:  # another process writing to the file meanwhile
            tx.add("a write in progress")
            result = subprocess.run([sys.executable, "-m", "engramdb", "-q", "--timeout", "0", "fleet", "maintain",
                                     path, "--workers", "1", "--retries", "1"], env=env, capture_output=True,
                                    text=True, stdin=subprocess.DEVNULL, timeout=300, check=False)
    finally:
        db.close()
    assert result.returncode == 1 and "1 busy" in result.stdout, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "Compute Failed" not in result.stderr, result.stderr


def test_a_glob_leaves_out_the_key_files_beside_the_stores_and_one_file_is_named_once(tmp_path):
    """`engramdb fleet stats 'tenants/*' --key-files-beside` ran each NAME.engram.key as a store
    (an error row each: "cannot read NAME.engram.key.key"); and one file named twice under two
    spellings (./t.engram, a symlink) became two tasks on the same file at once."""
    raw = bytes(range(32))
    for name in ("a", "b"):
        path = str(tmp_path / f"{name}.engram")
        with engramdb.open(path, key=raw, kdf=TEST_KDF) as db:
            db.add("hello")
        with open(path + ".key", "wb") as fh:
            fh.write(raw)
    (tmp_path / "notes.key").write_bytes(b"not beside a store")  # no store of that name: kept
    assert fleet.expand_paths(str(tmp_path / "*")) == [str(tmp_path / n) for n in ("a.engram", "b.engram",
                                                                                  "notes.key")]
    os.symlink(tmp_path / "a.engram", tmp_path / "link.engram")
    for twice in ([str(tmp_path / "a.engram"), os.path.join(str(tmp_path), ".", "a.engram")],
                  [str(tmp_path / "a.engram"), str(tmp_path / "link.engram")]):
        with pytest.raises(ValidationError, match="named twice"):
            fleet.run(twice, "stats")


def test_a_dump_to_a_url_that_fails_leaves_the_last_backup_there(tmp_path):
    """A dump to an fsspec URL wrote NAME.aaak in place: when the dump failed half-way (a
    damaged record), last night's good backup at that URL was already cut and replaced by
    the half that was written. A local folder's dump was atomic; a URL's is now too (written
    under a temporary name, moved over NAME.aaak once complete)."""
    import lmdb

    path = tmp_path / "t.engram"
    with engramdb.open(path, passphrase="pw", kdf=TEST_KDF) as db:
        db.add_many([{"id": f"m{i:02d}", "content": f"memory number {i}"} for i in range(40)])
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    url = bucket.as_uri()
    assert fleet.run_one(str(path), "dump", fleet.Passphrase("pw"), {"out": url})["status"] == "ok"
    good = (bucket / "t.aaak").read_bytes()
    env = lmdb.open(str(path), subdir=False, max_dbs=32, readonly=True)
    with env.begin(db=env.open_db(b"t1", create=False)) as txn:  # the nodes table
        last = [value for _, value in txn.cursor()][-1]
    env.close()
    data = bytearray(path.read_bytes())
    data[data.index(last) + len(last) - 1] ^= 0x01  # the last memory's record: damaged, its MAC fails
    path.write_bytes(bytes(data))
    row = fleet.run_one(str(path), "dump", fleet.Passphrase("pw"), {"out": url})
    assert row["status"] == "error" and row["error"] == "DecryptionError", row
    assert (bucket / "t.aaak").read_bytes() == good
    assert sorted(os.listdir(bucket)) == ["t.aaak"]  # no temporary file left either


def test_allow_unsafe_fs_reaches_each_task(tmp_path, monkeypatch):
    # rel2 (session 9): a fleet over files on a network filesystem had no spelling of the opt-out
    # but the environment variable on every worker
    import engramdb.store as store_mod
    monkeypatch.delenv(store_mod.ALLOW_UNSAFE_FS_ENV, raising=False)
    path = str(tmp_path / "t.engram")
    with engramdb.open(path, encrypted=False) as db:
        db.add("kept", id="kept")
    table = tmp_path / "mountinfo"
    table.write_text(f"25 1 0:25 / / rw - ext4 src rw\n26 25 0:26 / {tmp_path} rw - nfs4 srv:/x rw\n")
    monkeypatch.setattr(store_mod, "MOUNTINFO", str(table))
    refused = fleet.run_one(path, "stats", fleet.Plaintext())
    assert refused["status"] == "error" and refused["error"] == "UnsafeFilesystemError"
    assert "allow_unsafe_fs=True" in refused["hint"]
    assert fleet.run_one(path, "stats", fleet.Plaintext(), {"allow_unsafe_fs": True})["status"] == "ok"
    seen = []
    monkeypatch.setattr(fleet, "_gather", lambda distributed, client, paths, job, key_source, options, retries,
                        progress: seen.append(options) or fleet.FleetReport(job=job, files=[], workers=0))
    fleet.run([path], "stats", client=object(), key_source=fleet.Plaintext(), allow_unsafe_fs=True, progress=False)
    fleet.run([path], "stats", client=object(), key_source=fleet.Plaintext(), progress=False)
    assert [o.get("allow_unsafe_fs", False) for o in seen] == [True, False]
    with pytest.raises(ValidationError, match="allow_unsafe_fs"):
        fleet.run([path], "stats", client=object(), allow_unsafe_fs="yes")


def test_a_glob_leaves_out_the_temporary_files_of_a_compaction_restore_or_dump(tmp_path):
    """`engramdb fleet maintain 'tenants/*'` ran a restore's new store in the making
    (NAME.engram.restore-tmp) as a tenant of its own, writing into it while the restore
    wrote it; the same for a compacting copy and a dump's partial file."""
    path = str(tmp_path / "a.engram")
    with engramdb.open(path, passphrase="pw", kdf=TEST_KDF) as db:
        db.add("hello")
    for suffix in (".restore-tmp", ".compact-tmp"):
        shutil.copyfile(path, path + suffix)
    (tmp_path / "a.aaak.partial").write_text("AAAK")
    assert fleet.expand_paths(str(tmp_path / "*")) == [path]
