"""Issue 16: regression tests for what an independent attack on the file, its sidecars and
its inputs found. Crash cases run in forked children (tests/conftest.py's fork server), so a
signal death is a test failure instead of a dead pytest.
"""
from __future__ import annotations

import io
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap

import lmdb
import pytest
from pathlib import Path
from conftest import PASSPHRASE, TEST_KDF

import engramdb
import engramdb.engram as engram
from engramdb import codec
from engramdb.errors import AlreadyOpenError, CorruptFileError, EngramError, StoreError

PAGE = 4096
P_LEAF = 0x02


def build(path, n: int = 60) -> dict[str, str]:
    """A closed file with small and overflow-sized records, updated and deleted ones; {id: record hex}."""
    rnd = random.Random(16)
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add_many([{"id": f"id-{i}", "content": f"memory number {i} about topic {i % 7}", "tags": ["t"]}
                     for i in range(n)], now=1.0)
        db.add_many([{"id": f"big-{i}", "metadata": {"blob": rnd.randbytes(rnd.randint(2000, 9000))}}
                     for i in range(6)], now=1.0)
        for i in range(0, n, 5):
            db.update(f"id-{i}", importance=0.9)
        db.delete("id-1")
        return {node.id: codec.encode_node(node).hex() for node in db.scan()}


def read_everything(emit, path: str, expected: dict, verify: bool = False) -> str:
    """Open normally, scan, get every id, verify: 'OK', 'DETECTED ...' or 'WRONG n'."""
    try:
        db = engram.open(path, passphrase=PASSPHRASE, verify=verify)
    except EngramError as exc:
        return f"DETECTED open {type(exc).__name__}"
    wrong = detected = 0
    try:
        try:
            seen = {node.id: codec.encode_node(node).hex() for node in db.scan()}
            wrong += sum(1 for i, rec in seen.items() if expected.get(i) != rec)
        except EngramError:
            detected += 1
        for id_, record in expected.items():
            try:
                if codec.encode_node(db.get(id_)).hex() != record:
                    wrong += 1
            except EngramError:
                detected += 1
        problems = db.verify()
    finally:
        try:
            db.close()
        except EngramError:
            pass
    if wrong:
        return f"WRONG {wrong}"
    if detected or problems:
        return f"DETECTED read {detected} verify {len(problems)}"
    return "OK"


def leaf_pages(data: bytes) -> list[int]:
    """Numbers of the B-tree leaf pages (flags at offset 10 of the page header)."""
    return [p for p in range(2, len(data) // PAGE)
            if int.from_bytes(data[p * PAGE + 10:p * PAGE + 12], "little") == P_LEAF]


def damage_node_offsets(emit, original: str, expected_path: str, workdir: str) -> None:
    """Finding 1's reproduction: one 2-byte node offset of a leaf page pointed past the
    page (SIGBUS in scan() and in verify() before the fix), for every leaf page."""
    expected = json.loads(Path(expected_path).read_text())
    data = Path(original).read_bytes()
    for page in leaf_pages(data):
        target = os.path.join(workdir, f"leaf{page}.engram")
        buf = bytearray(data)
        buf[page * PAGE + 16:page * PAGE + 18] = (0xFFF0).to_bytes(2, "little")  # mp_ptrs[0]
        Path(target).write_bytes(bytes(buf))
        emit(f"{page} {read_everything(emit, target, expected)}")


CORRUPTIONS = ("header", "ptr", "bytes", "zero", "random-page")


def corrupt(data: bytes, rnd: random.Random) -> tuple[bytes, str]:
    """One damaged page: its header, a node offset, a few bytes, zeroed, or replaced by noise."""
    page = rnd.randrange(2, len(data) // PAGE)
    kind = rnd.choice(CORRUPTIONS)
    buf = bytearray(data)
    base = page * PAGE
    if kind == "header":
        at = base + rnd.randrange(16)
        buf[at] = rnd.randrange(256)
    elif kind == "ptr":
        at = base + 16 + 2 * rnd.randrange(8)
        buf[at:at + 2] = rnd.randrange(65536).to_bytes(2, "little")
    elif kind == "bytes":
        at = base + rnd.randrange(PAGE - 2)
        buf[at:at + 2] = rnd.randbytes(2)
    elif kind == "zero":
        buf[base:base + PAGE] = bytes(PAGE)
    else:
        buf[base:base + PAGE] = rnd.randbytes(PAGE)
    return bytes(buf), f"page {page} {kind}"


def sweep(emit, original: str, expected_path: str, workdir: str, seed: int, start: int, count: int) -> None:
    """Corruptions start..count-1 of ``seed``, each on a fresh copy, one line per corruption.
    A signal death ends the child; the parent resumes after the corruption that killed it."""
    expected = json.loads(Path(expected_path).read_text())
    data = Path(original).read_bytes()
    rnd = random.Random(seed)
    cases = [corrupt(data, rnd) for _ in range(count)]
    for i in range(start, count):
        damaged, what = cases[i]
        target = os.path.join(workdir, f"c{i}.engram")
        Path(target).write_bytes(damaged)
        emit(f"START {i}")
        outcome = read_everything(emit, target, expected)
        emit(f"DONE {i} {outcome} ({what})")
        for suffix in ("", "-lock", "-maint"):
            try:
                os.unlink(target + suffix)
            except FileNotFoundError:
                pass


def run_sweep(fork_server, tmp_path, count: int, seed: int) -> dict[str, int]:
    original = tmp_path / "orig.engram"
    expected_path = tmp_path / "expected.json"
    expected_path.write_text(json.dumps(build(original)))
    work = tmp_path / "work"
    work.mkdir()
    outcomes: dict[str, int] = {}
    crashes, wrong = [], []
    start = 0
    while start < count:
        lines, code, signum = fork_server.call("sweep", str(original), str(expected_path), str(work), seed,
                                               start, count)
        done = [line for line in lines if line.startswith("DONE ")]
        for line in done:
            outcome = line.split()[2]
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            if outcome not in ("OK", "DETECTED"):
                wrong.append(line)
        started = [int(line.split()[1]) for line in lines if line.startswith("START ")]
        if signum or code:
            last = started[-1] if started else start
            crashes.append((last, signum, code, lines[-2:]))
            start = last + 1
        else:
            start = count
    print(f"{count} single-page corruptions (seed {seed}), normal open: {outcomes}; crashes {crashes}")
    assert crashes == [], crashes
    assert wrong == [], wrong
    return outcomes


# --- finding 1: a damaged file cannot kill the process ----------------------------------------

def test_damaged_node_offset_in_every_leaf_page_is_an_error_not_a_signal(fork_server, tmp_path):
    original = tmp_path / "orig.engram"
    expected_path = tmp_path / "expected.json"
    expected_path.write_text(json.dumps(build(original)))
    lines, code, signum = fork_server.call("damage_node_offsets", str(original), str(expected_path), str(tmp_path))
    assert (code, signum) == (0, 0), lines[-3:]
    assert len(lines) == len(leaf_pages(original.read_bytes())) > 3
    outcomes = [line.split()[1] for line in lines]
    assert set(outcomes) <= {"OK", "DETECTED"}, lines  # OK: a free page, outside the tree
    assert outcomes.count("DETECTED") > 3, lines


def verify_after_damage_under_the_map(emit, path: str) -> None:
    """The file is damaged while this handle has it open: verify() reports the structural
    problems and stops there instead of reading the damaged pages through the map."""
    db = engram.open(path, passphrase=PASSPHRASE)
    data = bytearray(Path(path).read_bytes())
    for page in leaf_pages(bytes(data)):
        data[page * PAGE + 16:page * PAGE + 18] = (0xFFF0).to_bytes(2, "little")
    with open(path, "r+b") as fh:
        fh.write(bytes(data))
    problems = db.verify()
    emit(" ".join(sorted({p.kind for p in problems})))


def test_verify_stops_after_the_structural_check_fails(fork_server, tmp_path):
    path = tmp_path / "v.engram"
    build(path)
    lines, code, signum = fork_server.call("verify_after_damage_under_the_map", str(path))
    assert (code, signum) == (0, 0), lines
    assert lines == ["structure"]


def test_single_page_corruption_sweep_normal_open(fork_server, tmp_path):
    outcomes = run_sweep(fork_server, tmp_path, 320, seed=int(os.environ.get("ENGRAM_TEST_SEED", "16")))
    assert outcomes.get("DETECTED", 0) > 100


@pytest.mark.soak
def test_single_page_corruption_sweep_soak(fork_server, tmp_path):
    run_sweep(fork_server, tmp_path, 5000, seed=int(os.environ.get("ENGRAM_TEST_SEED", "17")))


def test_a_file_changed_outside_engramdb_gets_the_structural_check(tmp_path, monkeypatch):
    """The check runs when the file's fingerprint differs from the last clean close's record
    (a copy, an edit, a replaced file), and not on the open after a clean close."""
    from engramdb import store

    path = tmp_path / "c.engram"
    build(path, n=5)
    calls = []
    real = store.structural_verify
    monkeypatch.setattr(store, "structural_verify", lambda p: (calls.append(p), real(p)))
    engram.open(path, passphrase=PASSPHRASE).close()
    assert calls == []  # the last close recorded this very file
    os.utime(path)  # only times change: still "may have changed"
    engram.open(path, passphrase=PASSPHRASE).close()
    assert len(calls) == 1
    engram.open(path, passphrase=PASSPHRASE).close()
    assert len(calls) == 1  # the checked session's clean close recorded the file again
    copy = tmp_path / "copy.engram"
    shutil.copyfile(path, copy)
    engram.open(copy, passphrase=PASSPHRASE, readonly=True).close()
    assert len(calls) == 2
    with engram.open(path, passphrase=PASSPHRASE) as db:  # changed by someone else while open:
        db.add("a commit of this process", id="mine")
        os.utime(path)
    assert len(calls) == 2
    engram.open(path, passphrase=PASSPHRASE).close()  # the close did not vouch for it: checked
    assert len(calls) == 3


# --- finding 2: the sealed state cannot be removed or rolled back silently ---------------------

def _raw(path):
    return lmdb.open(str(path), subdir=False, max_dbs=32)


def _meta_state(path) -> bytes | None:
    env = _raw(path)
    with env.begin() as txn:
        value = txn.get(b"state", db=env.open_db(b"t0", txn=txn, create=False))
    env.close()
    return value


def _put_state(path, value: bytes | None) -> None:
    env = _raw(path)
    meta = env.open_db(b"t0")
    with env.begin(write=True) as txn:
        if value is None:
            txn.delete(b"state", db=meta)
        else:
            txn.put(b"state", value, db=meta)
    env.close()


def test_a_deleted_state_is_refused_and_never_reuses_document_numbers(tmp_path):
    path = tmp_path / "s.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add_many([{"id": f"id-{i}", "content": f"memory {i}"} for i in range(3)], now=1.0)
    _put_state(path, None)
    for kwargs in ({}, {"verify": True}, {"readonly": True}):
        with pytest.raises(CorruptFileError, match="state"):
            engram.open(path, passphrase=PASSPHRASE, **kwargs)
    with engram.open(path, passphrase=PASSPHRASE, repair=True) as db:
        assert "state" in {p.kind for p in db.verify(fix=True)}
    with engram.open(path, passphrase=PASSPHRASE, verify=True) as db:
        db.add("a new memory", id="new")
        assert db.get("id-0").content == "memory 0" and db.get("new").content == "a new memory"
        assert db.verify() == []


def test_an_older_state_put_back_is_refused_and_never_overwrites(tmp_path):
    path = tmp_path / "r.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("first", id="a")
    old_state = _meta_state(path)
    with engram.open(path, passphrase=PASSPHRASE) as db:
        db.add("second", id="b")
    _put_state(path, old_state)
    for kwargs in ({}, {"verify": True}):
        with pytest.raises(CorruptFileError, match="outside engramdb"):
            engram.open(path, passphrase=PASSPHRASE, **kwargs)
    # Even past the binding (repair), an add under the stale counters refuses to overwrite "b".
    with engram.open(path, passphrase=PASSPHRASE, repair=True) as db:
        with pytest.raises(CorruptFileError, match="collide"):
            db.add("third", id="c")
        assert db.get("b").content == "second"
        db.verify(fix=True)
    with engram.open(path, passphrase=PASSPHRASE, verify=True) as db:
        db.add("third", id="c")
        assert [db.get(i).content for i in "abc"] == ["first", "second", "third"]


def test_find_checks_that_the_record_is_the_one_asked_for(tmp_engram):
    db = tmp_engram
    db.add("alpha", id="a")
    db.add("beta", id="b")
    with db._store.transaction() as txn:  # the id map of "a" now points at "b"'s record
        txn.put("ids", db._id_key("a"), txn.get("ids", db._id_key("b")))
    with pytest.raises(CorruptFileError, match="another memory"):
        db.get("a")
    assert db.get("b").content == "beta"
    db.verify(fix=True)
    assert db.get("a").content == "alpha"


# --- finding 3: a writer's file cannot be compacted or replaced under it -------------------------

_WRITER = textwrap.dedent("""
    import sys
    import engramdb
    db = engramdb.open(sys.argv[1], passphrase=sys.argv[2])
    for line in sys.stdin:
        n = int(line)
        try:
            db.add_many([{"id": f"m{n + i}", "content": f"memory {n + i}"} for i in range(100)])
            print("ok", flush=True)
        except engramdb.EngramError as exc:
            print("error", type(exc).__name__, flush=True)
    db.close()
""")


def _env() -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return {**os.environ, "ENGRAM_TEST_WEAK_KDF": "1", "PYTHONPATH": root}


def _writer(path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _WRITER, str(path), PASSPHRASE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=_env())


def _ask(proc: subprocess.Popen, n: int) -> str:
    proc.stdin.write(f"{n}\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()


def test_deleting_maint_does_not_let_another_process_compact_under_a_writer(tmp_path):
    path = tmp_path / "w.engram"
    engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF).close()
    writer = _writer(path)
    try:
        assert _ask(writer, 0) == "ok"
        os.unlink(str(path) + "-maint")
        compactor = subprocess.run([sys.executable, "-c", textwrap.dedent("""
            import sys
            import engramdb
            with engramdb.open(sys.argv[1], passphrase=sys.argv[2]) as db:
                try:
                    db.compact()
                    print("compacted")
                except engramdb.AlreadyOpenError:
                    print("refused")
        """), str(path), PASSPHRASE], capture_output=True, text=True, env=_env(), timeout=120)
        assert compactor.stdout.strip() == "refused", compactor.stderr
        dump = io.StringIO()
        with engram.open(tmp_path / "d.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) as other:
            other.add("from a dump")
            other.dump(dump)
        with pytest.raises(AlreadyOpenError):  # restore --force cannot replace it either
            engramdb.restore(dump.getvalue(), path, force=True, passphrase=PASSPHRASE, kdf=TEST_KDF)
        assert not os.path.exists(str(path) + ".restore-tmp")
        assert _ask(writer, 100) == "ok"
    finally:
        writer.stdin.close()
        assert writer.wait(timeout=60) == 0
    with engram.open(path, passphrase=PASSPHRASE, verify=True) as db:
        assert len(db) == 200 and db.verify() == []


def test_a_commit_into_a_replaced_file_fails(tmp_path):
    path = tmp_path / "x.engram"
    other = tmp_path / "other.engram"
    engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF).close()
    with engram.open(other, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("the other file's memory", id="o")
    writer = _writer(path)
    try:
        assert _ask(writer, 0) == "ok"
        os.replace(other, path)  # replaced by a plain rename, outside engramdb's locks
        assert _ask(writer, 100) == "error StoreError"
    finally:
        writer.stdin.close()
        assert writer.wait(timeout=60) == 0
    with engram.open(path, passphrase=PASSPHRASE) as db:
        assert db.ids() == ["o"]


def test_a_store_error_for_a_replaced_file_has_a_hint(tmp_engram, tmp_path):
    tmp_engram.add("x", id="x")
    os.rename(tmp_engram.path, tmp_path / "moved.engram")
    with pytest.raises(StoreError, match="replaced or removed") as info:
        tmp_engram.add("y", id="y")
    assert "open the file again" in info.value.hint
    os.rename(tmp_path / "moved.engram", tmp_engram.path)


# --- finding 4: a record rolled back in place -----------------------------------------------------

def test_a_record_rolled_back_in_place_is_found_by_verify_and_a_verified_open(tmp_path):
    """The documented guarantee (spec/encryption.md): a read does not check a record against
    the state digest; verify() and open(verify=True) do."""
    path = tmp_path / "p.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("a" * 200, id="x")
    env = _raw(path)
    with env.begin() as txn:
        old = txn.get((1).to_bytes(8, "big"), db=env.open_db(b"t1", txn=txn, create=False))
    env.close()
    with engram.open(path, passphrase=PASSPHRASE) as db:
        db.update("x", content="b" * 200)  # same length: the new envelope has the old one's size
    env = _raw(path)
    with env.begin() as txn:
        new = txn.get((1).to_bytes(8, "big"), db=env.open_db(b"t1", txn=txn, create=False))
    env.close()
    assert len(old) == len(new)
    data = path.read_bytes()
    assert data.count(new) == 1
    path.write_bytes(data.replace(new, old))  # patched in place: no commit, same commit id
    with engram.open(path, passphrase=PASSPHRASE) as db:
        assert db.get("x").content == "a" * 200  # a plain read does not see it (documented)
        problems = db.verify()
    assert [p.kind for p in problems if p.kind == "digest"] == ["digest"]
    assert "digest differs" in " ".join(p.detail for p in problems)
    with pytest.raises(CorruptFileError, match="digest differs"):
        engram.open(path, passphrase=PASSPHRASE, verify=True)


# --- finding 5: KDF caps ----------------------------------------------------------------------------

@pytest.mark.parametrize("t, m_kib", [(20, 4 * 1024 * 1024), (20, 1024 * 1024), (11, 64 * 1024),
                                      (3, 1024 * 1024), (2, 1024 * 1024 + 1)])
def test_kdf_parameters_beyond_the_cap_are_refused_before_running(t, m_kib):
    from engramdb.crypto import KDFParams, derive_kek
    from engramdb.errors import WeakKDFError

    with pytest.raises(WeakKDFError, match="exceed the cap"):
        derive_kek("pw", b"s" * 16, KDFParams(t=t, m_kib=m_kib, p=1))


def test_kdf_cap_applies_to_file_and_dump_headers(tmp_path):
    import struct

    import msgpack

    from engramdb.aaak import decrypt_dump, encrypt_dump
    from engramdb.errors import WeakKDFError

    path = tmp_path / "k.engram"
    engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF).close()
    env = _raw(path)
    meta = env.open_db(b"t0")
    with env.begin(write=True) as txn:
        header = msgpack.unpackb(txn.get(b"header", db=meta), raw=False)
        header["slots"][0]["kdf"].update(t=20, m=1024 * 1024)
        data = msgpack.packb(header, use_bin_type=True)
        txn.put(b"header", data, db=meta)
        txn.put(b"header.bak", data, db=meta)
        import hashlib
        txn.put(b"header.sha256", hashlib.sha256(data).digest(), db=meta)
    env.close()
    with pytest.raises(WeakKDFError):
        engram.open(path, passphrase=PASSPHRASE)
    out = io.BytesIO()
    encrypt_dump("FILE:||||v3|dump\n", out, "pw", kdf=TEST_KDF)
    sealed = bytearray(out.getvalue())
    sealed[10:14] = struct.pack(">I", 20)  # t, as the encrypted dump header stores it
    sealed[14:18] = struct.pack(">I", 1024 * 1024)
    with pytest.raises(WeakKDFError):
        decrypt_dump(io.BytesIO(bytes(sealed)), "pw")


# --- findings 6 and 7: temporary files and sidecars ---------------------------------------------------

_UMASK_RUN = textwrap.dedent("""
    import io, os, stat, sys
    os.umask(0)
    import engramdb, engramdb.engram as engram
    from engramdb import store
    from click.testing import CliRunner
    from engramdb.cli import cli
    work = sys.argv[1]
    seen = {}
    real_replace = os.replace
    def watching_replace(src, dst, *a, **k):  # every temporary file, as it is renamed into place
        seen[os.path.basename(src)] = stat.S_IMODE(os.stat(src).st_mode)
        return real_replace(src, dst, *a, **k)
    os.replace = watching_replace
    from engramdb.crypto import KDFParams
    kdf = KDFParams.for_tests()
    path = os.path.join(work, "u.engram")
    with engram.open(path, passphrase="pw", kdf=kdf) as db:
        db.add("x", id="x")
        db.export_key(os.path.join(work, "u.key"))
        dump = io.StringIO()
        db.dump(dump)
        db.compact()
    engramdb.restore(dump.getvalue(), os.path.join(work, "r.engram"), passphrase="pw", kdf=kdf)
    engramdb.restore(dump.getvalue(), os.path.join(work, "r.engram"), passphrase="pw", kdf=kdf, force=True)
    env = {"ENGRAM_PASSPHRASE": "pw", "ENGRAM_TEST_WEAK_KDF": "1"}
    result = CliRunner().invoke(cli, ["dump", path, "-o", os.path.join(work, "u.aaak")], env=env)
    assert result.exit_code == 0, result.output
    for name in sorted(os.listdir(work)):
        seen[name] = stat.S_IMODE(os.stat(os.path.join(work, name)).st_mode)
    print(" ".join(f"{name}={mode:o}" for name, mode in sorted(seen.items())))
""")


def test_every_file_and_temporary_file_is_created_0600_under_umask_000(tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    out = subprocess.run([sys.executable, "-c", _UMASK_RUN, str(work)], capture_output=True, text=True,
                         env=_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    modes = dict(item.split("=") for item in out.stdout.split())
    for name in ("u.engram", "u.engram-lock", "u.engram-maint", "u.engram.compact-tmp", "u.key", "r.engram",
                 "r.engram.restore-tmp", "u.aaak", "u.aaak.partial"):
        assert modes.get(name) == "600", (name, modes)
    assert set(modes.values()) == {"600"}, modes


def compact_and_die(emit, path: str) -> None:
    """Compact, and be killed (SIGKILL) while the copy is being written."""
    import signal

    db = engram.open(path, passphrase=PASSPHRASE)

    def dying_copyfd(lmdb_env, fd, compact=True):
        lmdb_env.copyfd(fd, compact=compact)  # the copy is written...
        emit(f"mode {os.fstat(fd).st_mode & 0o777:o}")
        os.kill(os.getpid(), signal.SIGKILL)  # ...and the process dies before the rename

    env = db._store._env
    env.env = _CopyKiller(env.env, dying_copyfd)  # py-lmdb's Environment is a C type: wrap it
    db.compact()


class _CopyKiller:
    def __init__(self, env, copyfd):
        self._env = env
        self._copyfd = copyfd

    def copyfd(self, fd, compact=True):
        return self._copyfd(self._env, fd, compact)

    def __getattr__(self, name):
        return getattr(self._env, name)


def test_a_compaction_killed_mid_copy_leaves_a_0600_copy_that_the_next_open_removes(fork_server, tmp_path):
    path = tmp_path / "k.engram"
    build(path, n=10)
    lines, code, signum = fork_server.call("compact_and_die", str(path))
    assert signum == 9 and lines == ["mode 600"], (lines, code, signum)
    tmp = str(path) + ".compact-tmp"
    assert os.path.exists(tmp) and os.stat(tmp).st_mode & 0o777 == 0o600
    with engram.open(path, passphrase=PASSPHRASE) as db:
        assert not os.path.exists(tmp)
        assert len(db) == 15 and db.verify() == []


@pytest.mark.parametrize("sidecar", ["-maint", "-lock"])
def test_a_symlinked_sidecar_is_refused_and_its_target_untouched(tmp_path, sidecar):
    path = tmp_path / "s.engram"
    engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF).close()
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious data" * 100)
    os.unlink(str(path) + sidecar)
    os.symlink(victim, str(path) + sidecar)
    with pytest.raises(StoreError, match="symbolic link") as info:
        engram.open(path, passphrase=PASSPHRASE)
    assert "rm " in info.value.hint
    assert victim.read_bytes() == b"precious data" * 100
    assert os.path.islink(str(path) + sidecar)  # left for the user to look at


def test_a_sidecar_that_is_not_a_regular_file_is_refused(tmp_path):
    path = tmp_path / "d.engram"
    engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF).close()
    os.unlink(str(path) + "-maint")
    os.mkfifo(str(path) + "-maint")
    with pytest.raises(StoreError, match="not a regular file"):
        engram.open(path, passphrase=PASSPHRASE)
    with pytest.raises(StoreError, match="not a regular file"):
        engram.open(path, passphrase=PASSPHRASE, readonly=True)  # opened without O_RDWR: must not hang
    os.unlink(str(path) + "-maint")
    os.mkfifo(str(path) + ".compact-tmp")  # a leftover the first opener looks at
    with engram.open(path, passphrase=PASSPHRASE) as db:
        assert len(db) == 0
    assert os.path.exists(str(path) + ".compact-tmp")  # not ours to remove


# --- finding 9: compact and other threads' reads ----------------------------------------------------

def test_compact_waits_for_reads_of_other_threads_on_the_same_handle(tmp_path):
    import threading

    path = tmp_path / "t.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF, timeout=0.5) as db:
        db.add_many([{"id": f"m{i}", "content": f"memory {i}"} for i in range(50)])
        inside, release, errors = threading.Event(), threading.Event(), []

        def reader():
            try:
                with db._store.read() as txn:
                    inside.set()
                    release.wait(10)
                    txn.count("nodes")
            except EngramError as exc:
                errors.append(exc)

        thread = threading.Thread(target=reader)
        thread.start()
        inside.wait(10)
        with pytest.raises(AlreadyOpenError, match="other threads are reading"):
            db.compact()  # waited 0.5 s for the read, then refused; the reader is unharmed
        release.set()
        thread.join()
        assert errors == []

        results: list = []
        readers = [threading.Thread(target=lambda: results.append(len(db.scan(tags=None) and db.ids())))
                   for _ in range(4)]
        for r in readers:
            r.start()
        db.compact()  # reads that begin meanwhile wait for it
        for r in readers:
            r.join()
        assert results == [50] * 4 and db.verify() == []


# --- finding 10: somebody else's LMDB file --------------------------------------------------------

@pytest.mark.parametrize("verify", [False, True])
def test_an_lmdb_file_of_another_program_with_empty_tables_is_refused(tmp_path, verify):
    path = tmp_path / "other.engram"
    env = lmdb.open(str(path), subdir=False, max_dbs=4)
    table = env.open_db(b"theirs")
    with env.begin(write=True) as txn:
        txn.put(b"k", b"v", db=table)
        txn.delete(b"k", db=table)
        txn.drop(table, delete=True)  # their tables are gone; the file still has their commits
    env.close()
    before = path.read_bytes()
    with pytest.raises(engramdb.ForeignFileError):
        engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF, verify=verify)
    assert path.read_bytes() == before


def test_an_lmdb_file_nobody_ever_committed_to_is_adopted(tmp_path):
    path = tmp_path / "blank.engram"
    lmdb.open(str(path), subdir=False).close()
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("fine")
        assert len(db) == 1


# --- finding 11: the digest message says what differs ---------------------------------------------

def test_the_digest_message_says_whether_the_count_or_the_digest_differs(tmp_engram):
    db = tmp_engram
    db.add_many([{"id": f"m{i}", "content": f"memory {i}"} for i in range(5)])
    with db._store.read() as txn:
        state = txn.state
    from engramdb.verify import _digest_mismatch

    count, digest = state.digests["nodes"]
    assert _digest_mismatch("nodes", (count, digest), [count, digest]) is None
    assert "5 entries as the sealed state counts, but their digest differs" in \
        _digest_mismatch("nodes", (count, digest + 1), [count, digest])
    assert "4 entries, but the sealed state counts 5" in _digest_mismatch("nodes", (4, digest), [count, digest])


# --- issue 12, item 12: timeouts and BusyError -------------------------------------------------

_TXN_HOLDER = textwrap.dedent("""
    import sys
    import engramdb
    db = engramdb.open(sys.argv[1], passphrase=sys.argv[2])
    with db.transaction() as tx:
        tx.add("held", id="held")
        print("holding", flush=True)
        sys.stdin.readline()
    db.close()
""")


def test_a_held_write_transaction_gives_busy_error_after_the_timeout(tmp_path):
    import time

    from click.testing import CliRunner

    from engramdb.cli import cli
    from engramdb.errors import BusyError

    path = tmp_path / "b.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("first", id="first")
    holder = subprocess.Popen([sys.executable, "-c", _TXN_HOLDER, str(path), PASSPHRASE], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=_env())
    try:
        assert holder.stdout.readline().strip() == "holding"
        with engram.open(path, passphrase=PASSPHRASE, readonly=True, timeout=0) as reader:
            assert reader.ids() == ["first"]  # reads never wait
        with engram.open(path, passphrase=PASSPHRASE, timeout=0.3) as db:  # an open does not wait (18d54a8)
            assert db.ids() == ["first"]
            start = time.monotonic()
            with pytest.raises(BusyError) as info:
                db.add("second", id="second")
            assert time.monotonic() - start >= 0.3
        assert "timeout" in info.value.hint and isinstance(info.value, EngramError)
        result = CliRunner().invoke(cli, ["--timeout", "0.2", "add", str(path), "text"],
                                    env={"ENGRAM_PASSPHRASE": PASSPHRASE, "ENGRAM_TEST_WEAK_KDF": "1"})
        assert result.exit_code != 0 and "timeout" in result.output, result.output
    finally:
        holder.communicate("\n", timeout=60)
    with engram.open(path, passphrase=PASSPHRASE, timeout=0) as db:
        assert sorted(db.ids()) == ["first", "held"]


def test_a_write_through_an_open_handle_times_out_too(tmp_path):
    from engramdb.errors import BusyError

    path = tmp_path / "h.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF, timeout=0.2) as db:
        holder = subprocess.Popen([sys.executable, "-c", _TXN_HOLDER, str(path), PASSPHRASE],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env())
        try:
            assert holder.stdout.readline().strip() == "holding"
            with pytest.raises(BusyError):
                db.add("blocked", id="blocked")
        finally:
            holder.communicate("\n", timeout=60)
        db.add("after", id="after")
        assert sorted(db.ids()) == ["after", "held"]


def test_timeout_must_be_a_non_negative_number(tmp_path):
    from engramdb.errors import ValidationError

    for bad in (-1, "5", True, float("nan")):
        with pytest.raises(ValidationError):
            engram.open(tmp_path / "t.engram", passphrase=PASSPHRASE, kdf=TEST_KDF, timeout=bad)



def test_an_infinite_timeout_waits_as_long_as_it_takes(tmp_path):
    """timeout=float("inf") (what `--timeout inf` means) or any wait longer than the locks can
    take raised a raw OverflowError at open and in compact(): it is None, wait as long as it
    takes (a fleet run passed it through, every file an error row blaming the job)."""
    import threading

    for wait in (float("inf"), threading.TIMEOUT_MAX * 2, 1e300):
        with engram.open(tmp_path / "i.engram", passphrase=PASSPHRASE, kdf=TEST_KDF, timeout=wait) as db:
            db.add("kept", id=f"m{wait:g}")
            with db.transaction() as tx:
                tx.add("in a transaction")
            db.compact()
            assert f"m{wait:g}" in db.ids()

# --- issue 12, item 13: leftovers of killed commands ----------------------------------------------

def test_a_killed_restore_leaves_files_the_next_open_removes(tmp_path):
    target = tmp_path / "r.engram"
    engram.open(target, passphrase=PASSPHRASE, kdf=TEST_KDF).close()
    tmp = str(target) + ".restore-tmp"
    engram.open(tmp, passphrase=PASSPHRASE, kdf=TEST_KDF).close()  # as a killed restore leaves it
    assert all(os.path.exists(tmp + s) for s in ("", "-lock", "-maint"))
    with engram.open(target, passphrase=PASSPHRASE):
        assert not any(os.path.exists(tmp + s) for s in ("", "-lock", "-maint"))


def test_a_restore_in_progress_is_never_removed_by_another_opener(tmp_path):
    target = tmp_path / "r.engram"
    engram.open(target, passphrase=PASSPHRASE, kdf=TEST_KDF).close()
    tmp = str(target) + ".restore-tmp"
    in_progress = engram.open(tmp, passphrase=PASSPHRASE, kdf=TEST_KDF)  # holds its lock, as restore does
    try:
        in_progress.add("being restored")
        holder = subprocess.run([sys.executable, "-c", textwrap.dedent("""
            import sys, engramdb
            engramdb.open(sys.argv[1], passphrase=sys.argv[2]).close()
        """), str(target), PASSPHRASE], capture_output=True, text=True, env=_env(), timeout=60)
        assert holder.returncode == 0, holder.stderr
        assert os.path.exists(tmp)
        dump = io.StringIO()
        with engram.open(tmp_path / "d.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) as other:
            other.dump(dump)
        with pytest.raises(AlreadyOpenError, match="in progress"):
            engramdb.restore(dump.getvalue(), target, force=True, passphrase=PASSPHRASE, kdf=TEST_KDF)
        assert len(in_progress) == 1
    finally:
        in_progress.close()


def test_a_partial_dump_is_removed_by_the_next_dump_but_not_while_in_progress(tmp_path):
    import fcntl

    from click.testing import CliRunner

    from engramdb.cli import cli

    path = tmp_path / "p.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("a memory")
    out = tmp_path / "out.aaak"
    partial = str(out) + ".partial"
    env = {"ENGRAM_PASSPHRASE": PASSPHRASE, "ENGRAM_TEST_WEAK_KDF": "1"}
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT, 0o600)  # another dump's file in progress (locked)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        result = CliRunner().invoke(cli, ["dump", str(path), "-o", str(out)], env=env)
        assert result.exit_code != 0 and "another engramdb command" in result.output
        assert os.path.exists(partial) and not out.exists()
    finally:
        os.close(fd)
    # unlocked now, as a killed dump leaves it (0 bytes): the next dump removes it and succeeds
    result = CliRunner().invoke(cli, ["dump", str(path), "-o", str(out)], env=env)
    assert result.exit_code == 0, result.output
    assert out.read_text().startswith("FILE:||||v3|dump") and not os.path.exists(partial)


def test_the_cli_verify_reports_and_fixes_what_an_open_refuses(tmp_path):
    from click.testing import CliRunner

    from engramdb.cli import cli

    path = tmp_path / "v.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("kept", id="k")
    _put_state(path, _meta_state(path))  # a commit made outside engramdb
    env = {"ENGRAM_PASSPHRASE": PASSPHRASE, "ENGRAM_TEST_WEAK_KDF": "1"}
    runner = CliRunner()
    refused = runner.invoke(cli, ["get", str(path), "k"], env=env)
    assert refused.exit_code == 1 and "verify --fix" in refused.output
    report = runner.invoke(cli, ["verify", str(path)], env=env)
    assert report.exit_code == 1 and "state: " in report.output
    assert runner.invoke(cli, ["verify", "--fix", str(path)], env=env).exit_code == 0
    assert runner.invoke(cli, ["verify", str(path)], env=env).output.strip() == "ok"
    with engram.open(path, passphrase=PASSPHRASE, verify=True) as db:
        assert db.get("k").content == "kept"


def test_atomic_file_replaces_only_on_success_and_respects_a_file_in_progress(tmp_path):
    import fcntl

    from engramdb.errors import AlreadyOpenError
    from engramdb.store import atomic_file

    target = tmp_path / "t.out"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_file(str(target)) as fh:
        fh.write(b"half")
        raise RuntimeError("interrupted")
    assert target.read_bytes() == b"old" and not os.path.exists(str(target) + ".partial")

    with atomic_file(str(target), "w", encoding="utf-8") as fh:
        assert os.stat(fh.fileno()).st_mode & 0o777 == 0o600
        fh.write("new")
    assert target.read_text() == "new"

    partial = str(target) + ".partial"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT, 0o600)  # another writer's file, locked
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(AlreadyOpenError), atomic_file(str(target)):
            pass
        assert os.path.exists(partial)
    finally:
        os.close(fd)


def test_a_fleet_dump_removes_a_killed_runs_partial_file(tmp_path):
    """The fleet's local dumps go through the same atomic writer as `dump -o` (one copy of it)."""
    from engramdb import fleet

    path = tmp_path / "f.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("a memory")
        leftover = tmp_path / "f.aaak.partial"
        leftover.write_bytes(b"")  # what a killed dump leaves: unlocked
        result = fleet._write_dump(db, str(path), str(tmp_path))
    assert result["dump"] == str(tmp_path / "f.aaak") and result["records"] >= 1
    assert not leftover.exists() and (tmp_path / "f.aaak").read_text().startswith("FILE:")


def test_a_structurally_damaged_file_is_not_sent_back_to_verify(tmp_path):
    # regression: `engramdb verify` on such a file hinted "run `engramdb verify FILE`"
    path = tmp_path / "s.engram"
    build(path)
    data = bytearray(path.read_bytes())
    for page in leaf_pages(bytes(data)):
        data[page * PAGE + 16:page * PAGE + 18] = (0xFFF0).to_bytes(2, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match="structural check") as err:
        engram.open(path, passphrase=PASSPHRASE)
    assert "`engramdb verify" not in err.value.hint and "restore" in err.value.hint
