"""Shared fixtures: a cheap KDF profile, a fixed clock, and files that must verify clean on teardown.

The cheap profile is enabled through the explicit test-only switch ``ENGRAM_TEST_WEAK_KDF``,
set here before anything opens a file; tests of the floor remove it with ``monkeypatch``.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

os.environ["ENGRAM_TEST_WEAK_KDF"] = "1"

import pytest
from hypothesis import strategies as st

import engramdb.engram as engram_mod
from engramdb.crypto import KDFParams, Sealer
from engramdb.errors import ReadOnlyError, WrongPassphraseError
from engramdb.index import bm25
from engramdb.records import ALL_EMOTIONS, ALL_FLAGS, ARCHIVE_KEY, TIERS, Node
from engramdb.store import Store

PASSPHRASE = "correct horse battery staple"
NOW = 1_700_000_000.0
TEST_KDF = KDFParams.for_tests()
GOLDEN = Path(__file__).resolve().parent / "golden"
GOLDEN_PASSPHRASE = "golden-passphrase"
RAW_KEY = b"\x07" * 32  # the data key of the `store` fixture, for a test that reopens its file


def golden_copy(tmp_path: Path) -> Path:
    """A writable copy of tests/golden/store-v1.engram (the first layout, written by the first
    release; opened with GOLDEN_PASSPHRASE)."""
    target = tmp_path / "golden.engram"
    shutil.copyfile(GOLDEN / "store-v1.engram", target)
    return target


@pytest.fixture
def store(tmp_path):
    """A raw sealed :class:`~engramdb.store.Store` (no KDF, a fixed data key) for the index
    tests that write below the facade (the file is ``tmp_path / "raw.engram"``, its key
    ``RAW_KEY``); a module that needs another store defines its own."""
    s = Store.open(tmp_path / "raw.engram")
    s.sealer = Sealer(RAW_KEY)
    yield s
    s.close()


@pytest.fixture
def now() -> float:
    """A fixed clock for every timestamp a test writes."""
    return NOW


@pytest.fixture
def make_db(tmp_path):
    """``make_db(name="t.engram", **open_kwargs)`` opens (creating) an encrypted file with the
    cheap KDF. Every handle still open at teardown must verify with no problems."""
    opened = []

    def factory(name: str = "t.engram", **kwargs):
        kwargs.setdefault("passphrase", PASSPHRASE if kwargs.get("encrypted", True) and "key" not in kwargs
                          else None)
        kwargs.setdefault("kdf", TEST_KDF)
        db = engram_mod.open(tmp_path / name, **kwargs)
        opened.append(db)
        return db

    yield factory
    problems = []
    for db in opened:
        if not db._store._closed:
            problems += [str(p) for p in db.verify()]
            db.close()
    assert problems == []


@pytest.fixture
def tmp_engram(make_db):
    """One open encrypted file, verified clean on teardown."""
    return make_db()


def unpack_segments(txn) -> None:
    """Rewrite a file's packed BM25 segments as per-term records (a ``v`` term list and a
    ``postings`` record per term, the same blocks): the layout of directory version 3, which
    engramdb wrote before small segments were packed (and writes with ``PACK_SMALL`` off)."""
    d = bm25._Dir.decode(txn.get("segments", bm25.DIR_KEY))
    for segno in sorted(d.packed):
        packed = bm25._Packed(txn.pop("segments", bm25._seg_key(bm25.PACKED_PREFIX, segno)))
        blinds = packed.blinds()
        txn.insert_many("postings", [(d.posting_key(b, segno), packed.block(b)) for b in blinds])
        txn.put("segments", bm25._seg_key(b"v", segno), b"".join(blinds))
    d.packed.clear()
    txn.put("segments", bm25.DIR_KEY, d.encode())


def rebuilt_answers(store, live, queries) -> list:
    """What a BM25 index built from scratch on ``live`` answers to ``queries`` (top 25 each,
    then its stats), in a write that is rolled back: the reference the incremental index
    must equal."""
    fresh = bm25.SegmentedBM25(store.blind, store.last_txnid)
    out = []

    class _Done(Exception):
        pass

    def rebuild(txn):
        fresh.rebuild(txn, live)
        out.append([fresh.search(txn, q, 25) for q in queries] + [fresh.stats(txn)])
        raise _Done

    with pytest.raises(_Done):
        store.write(rebuild)
    return out[0]


def postings_to_term_first(txn) -> None:
    """Rewrite a file's BM25 postings in the layout of directory version 2, keyed
    ``blind | segno`` (what files written before 2026-12-01 hold): a test-made old file."""
    unpack_segments(txn)
    d = bm25._Dir.decode(txn.get("segments", bm25.DIR_KEY))
    assert d.seg_first
    txn.rekey("postings", lambda key: key[4:] + key[:4])
    d.version = 2
    txn.put("segments", bm25.DIR_KEY, d.encode())


def opens(path, **keys) -> bool:
    """Whether ``keys`` (passphrase=, key=, ...) open the store at ``path``."""
    try:
        engram_mod.open(path, readonly=True, **keys).close()
    except WrongPassphraseError:
        return False
    return True


NOBODY = 65534


def unprivileged(fn: Callable[[], int]) -> int:
    """``fn()``'s exit code, run in a child without root's powers over permissions
    (90 when it raised, 93 a ReadOnlyError: a test never sees the child's output)."""
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            if os.geteuid() == 0:
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            code = fn()
        except BaseException as exc:
            code = 90 + (3 if isinstance(exc, ReadOnlyError) else 0)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status), status
    return os.WEXITSTATUS(status)


# --- hypothesis strategies shared by the round-trip tests ----------------------------

_text = st.text(max_size=40)
_texts = st.lists(_text, max_size=5)
_tags = st.lists(_text.filter(str.strip), max_size=5)  # the write API refuses an empty or blank tag
_floats = st.floats(allow_nan=False, allow_infinity=False)
_f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), _floats, _text,
                       st.binary(max_size=20))
metadata_values = st.recursive(
    _json_leaf,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(_text, children, max_size=4)),
    max_leaves=20,
)


# The write API refuses the archive's reserved entry (records.ARCHIVE_KEY), and hypothesis
# draws string constants found in the code under test, so it does find it: a red run.
_metadata_keys = _text.filter(lambda key: key != ARCHIVE_KEY)


@st.composite
def nodes(draw) -> Node:
    """Arbitrary valid nodes: unicode, empty fields, large content, nested metadata, embeddings."""
    content = draw(st.one_of(st.text(max_size=200), st.text(min_size=3000, max_size=6000),
                             st.just(""), st.just("x" * 200_000)))
    return Node(
        id=draw(st.text(min_size=1, max_size=60)),
        content=content,
        entities=draw(_texts), topics=draw(_texts), quote=draw(_text), weight=draw(_floats),
        flags=draw(st.lists(st.sampled_from(ALL_FLAGS), max_size=3)),
        emotions=draw(st.lists(st.sampled_from(ALL_EMOTIONS), max_size=3)),
        source_start=draw(st.none() | st.integers(0, 2**63 - 1)),
        source_end=draw(st.none() | st.integers(0, 2**63 - 1)),
        resolved_date=draw(st.none() | _text), tier=draw(st.sampled_from(TIERS)),
        importance=draw(st.floats(0, 1)), created_at=draw(_floats), last_accessed=draw(_floats),
        access_count=draw(st.integers(0, 2**63 - 1)), pinned=draw(st.booleans()), tags=draw(_tags),
        source=draw(_text), metadata=draw(st.dictionaries(_metadata_keys, metadata_values, max_size=5)),
        embeddings=draw(st.dictionaries(st.text(min_size=1, max_size=10),
                                        st.lists(_f32, min_size=1, max_size=16), max_size=2)),
    )


# --- a fork server: fresh subprocesses without paying the interpreter start-up each time ----

_SERVER = r"""
import json, os, sys, traceback
os.environ["ENGRAM_TEST_WEAK_KDF"] = "1"
sys.path.insert(0, sys.argv[1])
import importlib
module = importlib.import_module(sys.argv[2])
importlib.import_module("conftest").warm_up()
out = sys.stdout.fileno()
for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            getattr(module, request["fn"])(lambda text: os.write(out, (text + "\n").encode()), *request["args"])
        except BaseException as exc:
            os.write(out, ("EXC " + type(exc).__module__ + "." + type(exc).__name__ + " "
                           + repr(str(exc))[:300] + "\n").encode())
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
    os.write(out, ("EXIT %d %d %d\n" % (pid, code, signum)).encode())
"""


def warm_up() -> None:
    """Pay first-use costs (lazy imports inside numpy and the indexes) once in the fork
    server, so a child's first transaction is as fast as its later ones. The store is
    closed again before any fork: children inherit no environment."""
    import shutil
    import tempfile

    work = tempfile.mkdtemp(prefix="engram-warm-")
    try:
        with engram_mod.open(os.path.join(work, "w.engram"), passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
            with db.transaction() as tx:
                tx.add(id="w", content="warm up the indexes", tags=["t"], now=NOW)
            db.update("w", importance=0.9)
            db.delete("w")
            db.verify()
    finally:
        shutil.rmtree(work, ignore_errors=True)


class ForkServer:
    """A fresh interpreter that imports a test module once, then forks one child per request.

    A child runs ``module.fn(emit, *args)``; ``emit(text)`` sends a line back. The child
    opens any store itself (it inherits no handle: the server never opens one), and a
    child killed by a signal is reported, so a crash is a test failure, not a dead pytest.
    """

    def __init__(self, module: str) -> None:
        import subprocess
        import sys

        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER, os.path.dirname(__file__), module],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, env=env,
        )

    def start(self, fn: str, *args) -> None:
        import json

        self.proc.stdin.write(json.dumps({"fn": fn, "args": list(args)}) + "\n")
        self.proc.stdin.flush()

    def readline(self) -> str:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the fork server died")
        return line.rstrip("\n")

    def finish(self) -> tuple[list[str], int, int]:
        """Lines emitted by the current child, its exit code and the signal that killed it (0: none)."""
        lines = []
        while True:
            line = self.readline()
            if line.startswith("EXIT "):
                _, _pid, code, signum = line.split()
                return lines, int(code), int(signum)
            lines.append(line)

    def call(self, fn: str, *args) -> tuple[list[str], int, int]:
        self.start(fn, *args)
        return self.finish()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()


@pytest.fixture
def fork_server(request):
    """``fork_server`` forks children of the requesting test module (its functions take ``emit``)."""
    server = ForkServer(request.module.__name__)
    yield server
    server.close()


class Killed(Exception):
    """What :func:`kill_at_write` raises: a maintenance pass stopped as by a kill."""


def tool_transcript(task: str, tools: list[str], failed: tuple[int, ...] = ()) -> list[dict]:
    """An agent transcript (Anthropic-style blocks) that calls ``tools`` in order, the calls
    numbered in ``failed`` returning errors: what the procedural graph records."""
    msgs: list[dict] = [{"role": "user", "content": task}]
    for i, name in enumerate(tools):
        msgs.append({"role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": name, "input": {}}]})
        msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": "out",
                                                  "is_error": i in failed}]})
    msgs.append({"role": "assistant", "content": "done"})
    return msgs


def kill_at_write(phase: str, done: int, total: int) -> None:
    """A ``maintain(progress=...)`` callback that stops the pass once its plan is stored,
    before any batch is written (an interrupted pass, left for the next call to finish)."""
    if phase == "write":
        raise Killed
