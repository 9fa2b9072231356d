"""The file as a whole: round trips through close and reopen, leakage, modes, handles, fork,
compaction, epochs and key changes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import lmdb
import pytest
from conftest import NOW, PASSPHRASE, TEST_KDF, nodes
from hypothesis import HealthCheck, given, settings

import engramdb.engram as engram
from engramdb import codec
from engramdb.errors import (
    AlreadyOpenError, ClosedError, DuplicateIdError, ForkError, NotFoundError, ReadOnlyError, WrongPassphraseError,
)
from engramdb.records import Node


def raw_values(path, table: int) -> dict[bytes, bytes]:
    env = lmdb.open(str(path), subdir=False, max_dbs=32, readonly=True, lock=False)
    db = env.open_db(b"t%d" % table, create=False)
    with env.begin() as txn:
        items = dict(txn.cursor(db=db))
    env.close()
    return items


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(node=nodes())
def test_node_round_trip_through_store_with_reopen(tmp_path, node):
    path = tmp_path / f"rt{uuid.uuid4().hex}.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        for space, vector in sorted(node.embeddings.items()):
            db.add_space(space, dims=len(vector), normalize=False, auto=False)
        assert db.add(node) == node.id
        assert db.get(node.id) == node
    with engram.open(path, passphrase=PASSPHRASE, readonly=True) as db:
        assert db.get(node.id) == node
        assert node.id in db
        assert db.verify() == []


def test_plaintext_round_trip_with_reopen(tmp_path):
    path = tmp_path / "plain.engram"
    node = Node(id="ü-1", content="plain text", metadata={"a": [1, {"b": None}]}, embeddings={"e": [0.5, 1.0]})
    with engram.open(path, encrypted=False) as db:
        db.add_space("e", dims=2, normalize=False, auto=False)
        db.add(node)
    with engram.open(path, encrypted=False) as db:
        assert db.get(node.id) == node
        assert db.verify() == []
        assert not db.info()["encrypted"]


def test_api_basics(tmp_engram, now):
    db = tmp_engram
    a = db.remember("alpha", tags=["x"], now=now)
    ids = db.add_many([{"content": "beta", "tier": "warm"}, "gamma"], now=now + 1)
    assert len(db) == 3 and a in db and "missing" not in db and 5 not in db
    assert db.update(a, importance=0.9).importance == 0.9
    with pytest.raises(DuplicateIdError):
        db.add("again", id=a)
    with pytest.raises(DuplicateIdError):
        db.add_many([{"id": "same"}, {"id": "same"}])
    assert "same" not in db  # add_many is all or nothing
    assert [n.id for n in db.scan(tier="warm")] == [ids[0]]
    assert [n.id for n in db.scan(tags=["x"])] == [a]
    assert [n.id for n in db.scan(after=now + 0.5)] == ids
    assert db.delete(a) and not db.delete(a, missing_ok=True)
    with pytest.raises(NotFoundError):
        db.get(a)
    assert db.get(a, None) is None
    assert [n.id for n in db] == ids


def test_transaction_rolls_back_on_error(tmp_engram):
    db = tmp_engram
    db.add("keep", id="keep")
    with pytest.raises(RuntimeError), db.transaction() as tx:
        tx.add("lost", id="lost")
        tx.update("keep", content="changed")
        raise RuntimeError("boom")
    assert "lost" not in db and db.get("keep").content == "keep"


def test_file_modes_are_0600(tmp_path):
    old = os.umask(0)  # even a permissive umask must not widen them
    try:
        with engram.open(tmp_path / "m.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
            db.add("x")
            db.export_key(tmp_path / "m.key")
    finally:
        os.umask(old)
    for name in ("m.engram", "m.engram-lock", "m.engram-maint", "m.key"):
        assert os.stat(tmp_path / name).st_mode & 0o777 == 0o600, name


def test_durable_lmdb_flags(tmp_engram):
    flags = tmp_engram._store._env.env.flags()
    assert flags["subdir"] is False and flags["sync"] and flags["metasync"]
    assert not flags["writemap"] and not flags["map_async"] and flags["meminit"] and flags["lock"]


def test_sentinel_words_never_reach_the_files(tmp_path):
    words = [f"zqx{i:04d}sentinel{chr(0x3b1 + i % 20)}" for i in range(1000)]
    path = tmp_path / "s.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        batch = []
        for i in range(0, 1000, 4):
            w = words[i:i + 4]
            batch.append({"id": w[0], "content": f"the word {w[1]} appears here", "tags": [w[2]],
                          "metadata": {w[3]: w[3], "k": [w[3]]}, "entities": [w[1]], "source": w[2]})
        db.add_many(batch, now=NOW)
        db.update(words[0], quote=words[1])
        db.delete(words[4])
        db.add_recovery_key()
        db.rekey("another passphrase " + words[5], kdf=TEST_KDF)
    data = b"".join((path.parent / name).read_bytes() for name in ("s.engram", "s.engram-lock", "s.engram-maint"))
    leaks = [w for w in words if w.encode() in data or w.lower().encode() in data
             or w.encode("utf-16-le") in data]
    assert leaks == []
    assert b"sentinel" not in data and b"another passphrase" not in data


def test_same_process_double_open_shares_the_environment(tmp_path):
    path = tmp_path / "d.engram"
    a = engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF)
    b = engram.open(path, passphrase=PASSPHRASE)
    assert a._store._env is b._store._env
    a.add("from a", id="a")
    assert b.get("a").content == "from a"
    with pytest.raises(AlreadyOpenError):
        engram.open(path, passphrase=PASSPHRASE, readonly=True)
    a.close()
    a.close()  # idempotent
    with pytest.raises(ClosedError):
        a.get("a")
    b.add("from b", id="b")
    assert len(b) == 2
    b.close()
    with engram.open(path, passphrase=PASSPHRASE, readonly=True) as ro:
        with pytest.raises(AlreadyOpenError):
            engram.open(path, passphrase=PASSPHRASE)
        with pytest.raises(ReadOnlyError):
            ro.add("no")
        assert len(ro) == 2


def test_fork_child_using_parent_handle_gets_fork_error(tmp_engram):
    db = tmp_engram
    db.add("before fork", id="p")
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            db.get("p")
        except ForkError:
            code = 0
        except BaseException:
            code = 3
        try:
            db.add("child", id="c")
        except ForkError:
            pass
        except BaseException:
            code = 4
        db.close()  # must not close the parent's environment
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert db.get("p").content == "before fork"
    db.add("after fork", id="q")
    assert "c" not in db


def test_fork_child_can_open_the_file_itself(tmp_engram):
    db = tmp_engram
    db.add("x", id="x")
    pid = os.fork()
    if pid == 0:
        try:
            with engram.open(db.path, passphrase=PASSPHRASE) as own:
                own.add("from child", id="child")
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert db.get("child").content == "from child"


def test_fork_with_an_open_transaction_refuses_to_reopen_in_the_child(tmp_engram):
    db = tmp_engram
    db.add("x", id="x")
    with db._store.read():
        pid = os.fork()
        if pid == 0:
            try:
                engram.open(db.path, passphrase=PASSPHRASE)
                os._exit(2)
            except ForkError:
                os._exit(0)
            except BaseException:
                os._exit(3)
        _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    db.add("y", id="y")


HOLDER = """
import os, sys
os.environ["ENGRAM_TEST_WEAK_KDF"] = "1"
import engramdb.engram as engram
db = engram.open(sys.argv[1], passphrase=sys.argv[2])
print("open", flush=True)
sys.stdin.read()
db.close()
"""


def test_compact_refuses_while_another_process_has_the_file_open(tmp_engram):
    db = tmp_engram
    db.add("x")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, db.path, PASSPHRASE],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(AlreadyOpenError):
            db.compact()
        db.add("still usable")
    finally:
        holder.stdin.close()
        assert holder.wait(timeout=30) == 0
    db.compact()
    assert len(db) == 2


def test_compact_refuses_a_second_handle_in_this_process(tmp_engram):
    other = engram.open(tmp_engram.path, passphrase=PASSPHRASE)
    with pytest.raises(AlreadyOpenError):
        tmp_engram.compact()
    other.close()
    tmp_engram.compact()


def test_compact_removes_deleted_data_from_the_bytes(tmp_path):
    path = tmp_path / "c.engram"
    sentinel = "deletedsentinel-7f3a"
    with engram.open(path, encrypted=False) as db:  # plaintext: the sentinel is visible until compacted
        db.add_many([f"filler {i} " * 20 for i in range(200)])
        db.add(f"secret {sentinel}", id="victim", tags=[sentinel])
        db.delete("victim")
        db.add_many([f"more {i}" for i in range(5)])
        assert sentinel.encode() in path.read_bytes()
        size = os.path.getsize(path)
        db.compact()
        assert sentinel.encode() not in path.read_bytes()
        assert os.path.getsize(path) <= size
        assert len(db) == 205 and db.verify() == []
        db.add("after compact", id="after")
    with engram.open(path, encrypted=False) as db:
        assert db.get("after").content == "after compact" and db.verify() == []
    assert not os.path.exists(str(path) + ".compact-tmp")


def test_compact_removes_the_deleted_envelope_and_old_key_wrap(tmp_path):
    path = tmp_path / "c.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add_many([f"filler {i}" for i in range(100)])
        db.add("victim", id="victim")
    values = raw_values(path, 1)
    victim_envelope = values[max(values)]  # the last docno
    old_wrap = codec.unpack(raw_values(path, 0)[b"header"])["slots"][0]["wrapped"]
    with engram.open(path, passphrase=PASSPHRASE) as db:
        db.delete("victim")
        db.rekey("new passphrase", kdf=TEST_KDF)
    data = path.read_bytes()
    assert data.count(victim_envelope) >= 1 and data.count(old_wrap) >= 1  # still in free pages
    with engram.open(path, passphrase="new passphrase") as db:
        db.compact()
        assert len(db) == 100
    data = path.read_bytes()
    assert data.count(victim_envelope) == 0
    assert data.count(old_wrap) == 0


def test_epoch_rollover(tmp_engram):
    db = tmp_engram
    db._store.epoch_limit = 100
    for start in range(0, 1000, 50):
        db.add_many([{"id": f"e{i}", "content": f"value {i}"} for i in range(start, start + 50)])
    path = db.path
    db.close()
    epochs = {int.from_bytes(v[1:5], "big") for t in range(1, 3) for v in raw_values(path, t).values()}
    assert len(epochs) >= 10
    with engram.open(path, passphrase=PASSPHRASE) as again:
        assert again.info()["commit_seq"] > 20
        assert [again.get(f"e{i}").content for i in range(1000)] == [f"value {i}" for i in range(1000)]
        assert again.verify() == []
        with again._store.read() as txn:
            state = txn.state
        assert state.epoch >= max(epochs) and state.sealed <= 100  # the counters survive a reopen
        again.add("next", id="next")
    epochs_after = {int.from_bytes(v[1:5], "big") for v in raw_values(path, 1).values()}
    assert max(epochs_after) >= max(epochs)  # never back to an exhausted epoch


def test_rekey_rewraps_without_reencrypting(tmp_path):
    path = tmp_path / "k.engram"
    with engram.open(path, passphrase="old", kdf=TEST_KDF) as db:
        ids = db.add_many([f"memory {i}" for i in range(50)])
        recovery = db.add_recovery_key()
    before = raw_values(path, 1)
    with engram.open(path, passphrase="old") as db:
        db.rekey("new", kdf=TEST_KDF)
    assert raw_values(path, 1) == before  # byte-identical ciphertexts: nothing re-encrypted
    with pytest.raises(WrongPassphraseError):
        engram.open(path, passphrase="old")
    for kwargs in ({"passphrase": "new"}, {"key": recovery}, {"key": recovery.lower()}):
        with engram.open(path, **kwargs) as db:
            assert [db.get(i).content for i in ids] == [f"memory {i}" for i in range(50)]
            assert db.verify() == []
    with pytest.raises(WrongPassphraseError):
        engram.open(path, key=os.urandom(32))


def test_raw_key_instead_of_passphrase(tmp_path):
    key = os.urandom(32)
    path = tmp_path / "raw.engram"
    with engram.open(path, key=key) as db:
        db.add("keyed", id="k")
    with engram.open(path, key=key) as db:
        assert db.get("k").content == "keyed"
    with pytest.raises(WrongPassphraseError):
        engram.open(path, passphrase="anything")


def test_unclean_shutdown_is_detected_and_verified(tmp_path):
    path = tmp_path / "u.engram"
    engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF).close()
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), PASSPHRASE],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "open"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdin.close()
    proc.stdout.close()
    with engram.open(path, passphrase=PASSPHRASE) as db:
        assert db.info()["unclean_shutdown"] is True
    with engram.open(path, passphrase=PASSPHRASE) as db:
        assert db.info()["unclean_shutdown"] is False


def test_fork_while_another_thread_holds_the_registry_lock(tmp_engram):
    """Regression: the child inherited a held registry lock and hung in open()."""
    import threading

    from engramdb import store

    db = tmp_engram
    db.add("x", id="x")
    held, release = threading.Event(), threading.Event()

    def hold():
        with store._registry_lock:
            held.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(10)
    try:
        pid = os.fork()
        if pid == 0:
            signal.alarm(10)  # a hang becomes a SIGALRM death instead of a stuck test
            try:
                with engram.open(db.path, passphrase=PASSPHRASE) as own:
                    os._exit(0 if own.get("x").content == "x" else 2)
            except BaseException:
                os._exit(3)
    finally:
        release.set()
        thread.join()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def test_scrub_zeroes_what_no_record_uses_and_keeps_every_record(tmp_path):
    """Regression: compact() left a deleted record's bytes in the unused tail of an overflow
    page (LMDB reuses freed page buffers without clearing them), ~1 run in 10."""
    import struct

    import lmdb

    from engramdb.store import scrub_unused_bytes

    path = str(tmp_path / "raw.lmdb")
    records = {b"big-%d" % i: bytes([65 + i]) * (3000 + 500 * i) for i in range(3)}
    records.update({b"small-%02d" % i: b"value %d" % i for i in range(40)})
    env = lmdb.open(path, subdir=False, map_size=1 << 22)
    with env.begin(write=True) as txn:
        for key, value in records.items():
            txn.put(key, value)
    env.close()
    sentinel = b"deleted-sentinel"
    with open(path, "r+b") as fh:
        data = bytearray(fh.read())
        psize = struct.unpack_from("<I", data, 40)[0]
        planted = 0
        for pgno in range(2, len(data) // psize):
            base = pgno * psize
            flags, lower, upper = struct.unpack_from("<HHH", data, base + 10)
            if flags & 0x04 and lower == 1 and upper == 0:  # a one-page overflow run: plant in its tail
                data[base + psize - len(sentinel):base + psize] = sentinel
                planted += 1
            elif flags & 0x02 and upper - lower > len(sentinel):  # a leaf page's gap
                data[base + lower:base + lower + len(sentinel)] = sentinel
                planted += 1
        assert planted >= 2
        fh.seek(0)
        fh.write(data)
    fd = os.open(path, os.O_RDWR)
    try:
        assert scrub_unused_bytes(fd) > 0
    finally:
        os.close(fd)
    with open(path, "rb") as fh:
        assert sentinel not in fh.read()
    env = lmdb.open(path, subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        assert dict(txn.cursor()) == records
    env.close()
