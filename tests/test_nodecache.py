"""recall's cache of decoded nodes and edges (engramdb/index/nodecache.py) and the change log
that revalidates it (spec/file-format.md, "Change log"): a commit invalidates only what it
touched, in this process at once and in another process at its next read; a forgotten
memory leaves nothing in the cache; a tiny limit changes no result. Work is counted
(records decrypted), never timed."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import PASSPHRASE, TEST_KDF
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import engramdb.engram as engram_mod
from engramdb import store as store_mod
from engramdb.index.nodecache import NodeCache

WRITER = r"""
import json, os, sys
os.environ["ENGRAM_TEST_WEAK_KDF"] = "1"
import engramdb.engram as engram
from engramdb.errors import AlreadyOpenError
db = engram.open(sys.argv[1], passphrase=sys.argv[2])
for line in sys.stdin:
    op, args = json.loads(line)
    out = None
    if op == "add":
        out = db.add(args, now=1.0)
    elif op == "update":
        db.update(args["id"], **args["changes"])
    elif op == "delete":
        db.delete(args)
    elif op == "forget":
        try:
            db.forget(ids=args)
        except AlreadyOpenError:
            pass  # removed; the reader's handle keeps the file from being compacted
    elif op == "link":
        db.link(args[0], args[1], "related", weight=args[2], now=1.0)
    elif op == "tunnels":
        out = db.link_tunnels(now=1.0)
    print(json.dumps(out), flush=True)
db.close()
"""


class Writer:
    """Another process committing to the file, one command at a time."""

    def __init__(self, path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), PASSPHRASE], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def __call__(self, op: str, args=None):
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps([op, args]) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the writer process died on {op}"
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def with_cache(db, cache_mb):
    """Give the handle's indexes a node cache of ``cache_mb`` MiB; returns it."""
    cache = db.indexes._node_cache = NodeCache(db._store, db.indexes.graph, cache_mb)
    return cache


def answer(hits):
    return [(h.id, h.score, h.relevance, h.node) for h in hits]


def fresh_answer(path, query, **kw):
    """The recall of a new handle whose node cache holds nothing."""
    db = engram_mod.open(path, passphrase=PASSPHRASE)
    try:
        with_cache(db, 0)
        return answer(db.recall(query, **kw))
    finally:
        db.close()


TOPICS = ["cats", "dogs", "boats", "trains", "music"]
NAMES = ["Ada", "Bob", "Cy", "Dee", "Eve", "Fay"]


def seed(db, n=40):
    db.add_many([{"id": f"m{i}", "content": f"note {i} about {TOPICS[i % 5]} and {NAMES[i % 6]} word{i % 7}",
                  "entities": [NAMES[i % 6], NAMES[(i // 2) % 6]], "topics": [TOPICS[i % 5]]} for i in range(n)],
                now=1.0)
    assert db.link_tunnels(now=1.0) > 0


QUERIES = ["cats Ada", "boats word3", "trains Eve", "music dogs Bob", "note word1"]


def cached_ids(cache):
    return {value.id for (kind, _), (value, _) in cache._entries.items() if kind == "n" and value is not None}


# --- the change log -----------------------------------------------------------------------------


def test_change_log_lists_changed_docnos_not_new_ones(make_db):
    db = make_db()
    seed(db, 10)
    store = db._store
    with store.read() as txn:
        seq = txn.state.seq
    db.add("a new memory", id="new", now=1.0)
    with store.read() as txn:
        assert txn.changes_since(seq) == store_mod.Changes(frozenset(), frozenset())
        seq = txn.state.seq
    db.update("m3", content="changed")
    with store.read() as txn:
        docno3 = next(d for d, n in _nodes(txn) if n.id == "m3")
        assert txn.changes_since(seq) == store_mod.Changes(frozenset({docno3}), frozenset())
        seq = txn.state.seq
        neighbours = set(db.indexes.graph.neighbours(txn, docno3 - 1))
    db.delete("m2")  # its tunnel edges go too: their other ends' edge lists changed
    with store.read() as txn:
        changes = txn.changes_since(seq)
    assert changes.nodes == {docno3 - 1}
    assert changes.edges == neighbours | {docno3 - 1}
    assert changes.edges


def seq_of(db):
    with db._store.read() as txn:
        return txn.state.seq


def _nodes(txn):
    from engramdb.index import iter_nodes

    return list(iter_nodes(txn))


def test_change_log_is_pruned_and_a_cache_too_far_behind_starts_over(make_db, monkeypatch):
    monkeypatch.setattr(store_mod, "CHANGES_KEEP", 4)
    db = make_db()
    seed(db, 10)
    seq = seq_of(db)
    for i in range(3):
        db.update("m1", content=f"v{i}")
    with db._store.read() as txn:
        assert not txn.changes_since(seq).everything
    for i in range(3):
        db.update("m1", content=f"w{i}")
    with db._store.read() as txn:
        assert len(list(txn.keys("meta", store_mod.CHANGES_PREFIX))) == 4
        assert txn.changes_since(seq).everything  # the entries it needs are gone
        assert not txn.changes_since(txn.state.seq - 4).everything


def test_a_large_commit_is_logged_as_everything(make_db, monkeypatch):
    monkeypatch.setattr(store_mod, "CHANGES_MAX", 3)
    db = make_db()
    seed(db, 10)
    seq = seq_of(db)
    with db.transaction() as tx:
        for i in range(5):
            tx.update(f"m{i}", content=f"changed {i}")
    with db._store.read() as txn:
        assert txn.changes_since(seq).everything


def test_the_change_log_fuzz_oracle_can_fail(monkeypatch):
    """fuzz/fuzz_changes.py's oracle is not vacuous: an encoder that loses a docno is reported."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("fuzz_changes", Path(__file__).parent.parent / "fuzz" / "fuzz_changes.py")
    target = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(target)
    entry = store_mod.encode_changes(store_mod.Changes(frozenset({1, 2}), frozenset({3})))
    target.TestOneInput(entry)
    real = store_mod.encode_changes
    monkeypatch.setattr(store_mod, "encode_changes", lambda c: real(store_mod.Changes(c.nodes - {1}, c.edges)))
    with pytest.raises(AssertionError):
        target.TestOneInput(entry)


def test_the_change_log_keys_are_reserved(make_db):
    db = make_db()
    with pytest.raises(store_mod.StoreError):
        db._store.write(lambda txn: txn.put("meta", store_mod.CHANGES_PREFIX + b"\0" * 8, b"x"))


# --- work after a commit (counted, never timed) -------------------------------------------------


def test_a_one_memory_commit_decrypts_nothing_again(make_db, tmp_path):
    db = make_db()
    seed(db)
    cache = db.indexes.node_cache
    for q in QUERIES:
        db.recall(q, top_k=5)
    decoded, edges = cache.decoded, cache.edge_reads
    db.add("an unrelated memory about kites", id="kite", now=1.0)
    for q in QUERIES:
        assert answer(db.recall(q, top_k=5)) == fresh_answer(tmp_path / "t.engram", q, top_k=5)
    assert (cache.decoded, cache.edge_reads) == (decoded, edges)
    # an update re-reads exactly that memory
    hit = db.recall("cats Ada", top_k=5)[0]
    db.update(hit.id, content=hit.node.content + " cats cats")
    decoded = cache.decoded
    hits = db.recall("cats Ada", top_k=5)
    assert cache.decoded - decoded == 1
    assert hit.id in {h.id for h in hits}
    assert next(h for h in hits if h.id == hit.id).node.content.endswith("cats cats")


def test_reader_process_sees_the_writer_process(make_db, tmp_path):
    path = tmp_path / "t.engram"
    db = make_db()
    seed(db)
    cache = db.indexes.node_cache
    for q in QUERIES:
        db.recall(q, top_k=8)
    writer = Writer(path)
    try:
        decoded, edges = cache.decoded, cache.edge_reads
        writer("add", {"id": "x1", "content": "a memory about cats and kiwis from elsewhere"})
        for q in QUERIES:
            assert answer(db.recall(q, top_k=8)) == fresh_answer(path, q, top_k=8)
        # only the new memory is read (where it ranks): nothing cached before is read again
        # (its node once; its edges at most twice: its hop row and, when fusion walks it for
        # the boosts, its superseded flag)
        assert cache.decoded - decoded <= 1 and cache.edge_reads - edges <= 2
        assert db.recall("kiwis", top_k=1)[0].id == "x1"

        victim = db.recall("boats word3", top_k=8)[0]
        writer("update", {"id": victim.id, "changes": {"content": "now about zebras only"}})
        hits = db.recall("zebras", top_k=3)
        assert hits and hits[0].id == victim.id and hits[0].node.content == "now about zebras only"
        assert victim.id not in {h.id for h in db.recall("boats word3", top_k=8)} or all(
            h.node.content == "now about zebras only" for h in db.recall("boats word3", top_k=8) if h.id == victim.id)

        gone = db.recall("trains Eve", top_k=8)[0].id
        writer("delete", gone)
        assert gone not in {h.id for h in db.recall("trains Eve", top_k=8)}
        assert gone not in cached_ids(cache)

        forgotten = db.recall("music dogs Bob", top_k=8)[0]
        assert forgotten.id in cached_ids(cache)
        writer("forget", [forgotten.id])
        for q in QUERIES:
            got = db.recall(q, top_k=8)
            assert forgotten.id not in {h.id for h in got}
            assert answer(got) == fresh_answer(path, q, top_k=8)
        assert forgotten.id not in cached_ids(cache)
        assert all(forgotten.node.content != n.content for (k, _), (n, _) in cache._entries.items()
                   if k == "n" and n is not None)

        writer("link", ["m1", "m2", 5.0])
        writer("tunnels")
        for q in QUERIES:
            assert answer(db.recall(q, top_k=8)) == fresh_answer(path, q, top_k=8)
    finally:
        writer.close()


def test_this_process_commits_move_the_cache_on_without_reading_the_change_log(make_db, tmp_path, monkeypatch):
    """A commit of this process tells the cache the state it committed: the next recall
    reads no change-log entry (another process's commit still goes through the log), and
    its answers equal a fresh handle's, also after an update and a delete."""
    db = make_db()
    seed(db)
    for q in QUERIES:
        db.recall(q, top_k=5)
    reads = []
    real = store_mod.Txn.changes_since
    monkeypatch.setattr(store_mod.Txn, "changes_since", lambda txn, seq: reads.append(seq) or real(txn, seq))
    db.add("an unrelated memory about kites and cats", id="kite", now=1.0)
    hit = db.recall("cats Ada", top_k=5)[0]
    db.update(hit.id, content=hit.node.content + " boats boats")
    db.delete("m3")
    for q in QUERIES + ["kites cats"]:
        assert answer(db.recall(q, top_k=5)) == fresh_answer(tmp_path / "t.engram", q, top_k=5)
    assert reads == []
    other = Writer(tmp_path / "t.engram")
    try:
        other("add", {"content": "a boat from another process", "id": "far"})
    finally:
        other.close()
    assert answer(db.recall("boats", top_k=5)) == fresh_answer(tmp_path / "t.engram", "boats", top_k=5)
    assert len(reads) == 1


def test_forget_in_this_process_purges_the_cache_at_once(make_db):
    db = make_db()
    seed(db)
    cache = db.indexes.node_cache
    target = db.recall("cats Ada", top_k=3)[0].id
    assert target in cached_ids(cache)
    other = make_db("t.engram")  # a second handle of the same file in this process
    from engramdb.errors import AlreadyOpenError

    with pytest.raises(AlreadyOpenError):  # removed; the handles keep the file from being compacted
        other.forget(ids=[target])
    assert target not in cached_ids(cache)  # before any read of this handle


# --- bounds ---------------------------------------------------------------------------------------


def test_a_tiny_cache_stays_within_its_limit_and_changes_no_result(make_db, tmp_path):
    db = make_db()
    seed(db, 60)
    tiny = with_cache(db, 0.002)  # ~2 KB: a few entries
    words = [f"word{i}" for i in range(7)] + TOPICS + NAMES
    queries = [f"{a} {b}" for a in words[::2] for b in words[::4]]
    expected = {q: fresh_answer(tmp_path / "t.engram", q, top_k=6) for q in queries}
    evicted = False
    for q in queries:
        assert answer(db.recall(q, top_k=6)) == expected[q]
        assert tiny.nbytes <= tiny.max_bytes
        evicted = evicted or tiny.decoded > len(tiny)
    assert 0 < len(tiny) < 20 and evicted  # a few entries (recall reads every candidate's node)
    none = with_cache(db, 0)
    assert answer(db.recall(queries[0], top_k=6)) == expected[queries[0]] and len(none) == 0


# --- cached equals uncached over random operation sequences ---------------------------------------


class CachedRecall(RuleBasedStateMachine):
    """A long-lived reader handle (with a random cache limit) against commits of another
    process; after every step each query equals a fresh, cache-less handle's answer."""

    def __init__(self) -> None:
        super().__init__()
        self.db = None
        self.writer = None

    @initialize(limit=st.sampled_from([None, 0.002, 0.02]))
    def start(self, limit):
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="engram-nodecache-")
        self.path = f"{self.dir}/s.engram"
        self.db = engram_mod.open(self.path, passphrase=PASSPHRASE, kdf=TEST_KDF)
        seed(self.db, 12)
        with_cache(self.db, limit)
        self.ids = [f"m{i}" for i in range(12)]
        self.n = 0
        self.writer = Writer(self.path)

    @rule(topic=st.sampled_from(TOPICS), name=st.sampled_from(NAMES))
    def add(self, topic, name):
        self.n += 1
        self.ids.append(self.writer("add", {"id": f"x{self.n}", "content": f"added {topic} {name}",
                                            "entities": [name], "topics": [topic]}))

    @precondition(lambda self: self.ids)
    @rule(i=st.integers(0, 1000), topic=st.sampled_from(TOPICS))
    def update(self, i, topic):
        self.writer("update", {"id": self.ids[i % len(self.ids)], "changes": {"content": f"updated {topic}"}})

    @precondition(lambda self: len(self.ids) > 2)
    @rule(i=st.integers(0, 1000), forget=st.booleans())
    def remove(self, i, forget):
        victim = self.ids.pop(i % len(self.ids))
        if forget:
            self.writer("forget", [victim])
        else:
            self.writer("delete", victim)

    @precondition(lambda self: len(self.ids) > 2)
    @rule(i=st.integers(0, 1000), j=st.integers(0, 1000), w=st.floats(0.1, 5.0))
    def link(self, i, j, w):
        a, b = self.ids[i % len(self.ids)], self.ids[j % len(self.ids)]
        if a != b:
            self.writer("link", [a, b, w])

    @rule()
    def tunnels(self):
        self.writer("tunnels")

    @rule(q=st.sampled_from(QUERIES + ["added cats", "updated music Fay"]))
    def query_in_between(self, q):
        self.db.recall(q, top_k=5)  # reads (and caches) between commits

    @invariant()
    def equals_a_fresh_handle(self):
        if self.db is None:
            return
        for q in ("cats Ada", "updated trains", "added boats Eve"):
            assert answer(self.db.recall(q, top_k=5)) == fresh_answer(self.path, q, top_k=5)
        cache = self.db.indexes.node_cache
        assert cache.nbytes <= cache.max_bytes
        live = set(self.ids)
        assert cached_ids(cache) <= live

    def teardown(self):
        if self.writer is not None:
            self.writer.close()
        if self.db is not None:
            self.db.close()
        if self.db is not None:
            import shutil

            shutil.rmtree(self.dir, ignore_errors=True)


TestCachedRecall = CachedRecall.TestCase
TestCachedRecall.settings = settings(max_examples=5, stateful_step_count=10, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow])
