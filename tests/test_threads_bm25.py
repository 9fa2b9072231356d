"""One handle shared by threads: queries write the read path's caches without a lock while
other threads iterate them (a new state carrying entries over, runs dropped, a term's memo of
best documents, the commit listeners, the vector caches). A loop in Python bytecode over a
live dict or set fails ("changed size during iteration") when another thread inserts between
two of its steps: a user's query or commit would raise.

The deterministic tests make that insert happen at exactly that moment: a hook the loop
itself calls (a mapping's ``__contains__``, a key's comparison, a set's iterator) does what
the other thread would do there. The old code raised; answers must equal a fresh handle's.
The last test runs real threads against a committing handle."""
from __future__ import annotations

import sys
import threading
import weakref
from typing import Any

import numpy as np
import pytest
import zstandard

from engramdb import _accel, codec

from engramdb.index import bm25 as bm25_mod
from engramdb.index.bm25 import MERGE_FACTOR, SMALL_SEGMENT_DOCS, TERM_TOP_CACHED, SegmentedBM25
from engramdb.index.vectors import _SpaceCache

WORDS = [f"w{i}" for i in range(30)]


def _doc(rng: np.random.Generator, n: int = 10) -> list[str]:
    return [WORDS[int(i)] for i in rng.zipf(1.3, size=n) % len(WORDS)]


def _fresh(store) -> SegmentedBM25:
    return SegmentedBM25(store.blind, store.last_txnid)


def _called_from(name: str) -> bool:
    """Whether the hook calling this runs inside function ``name`` (directly, or in one of its
    comprehensions or generator expressions)."""
    frame = sys._getframe(2)  # 0: here, 1: the hook, 2: the code that triggered the hook
    if frame.f_code.co_name in ("<listcomp>", "<genexpr>", "<setcomp>", "<dictcomp>"):
        frame = frame.f_back
    return frame is not None and frame.f_code.co_name == name


class _Segs(dict):
    """A directory's segment map whose membership test runs ``hook`` when called from inside
    ``where`` (a stand-in for the thread switch that lets another thread run there)."""

    def __init__(self, segs: dict, where: str, hook) -> None:
        super().__init__(segs)
        self.where, self.hook = where, hook

    def __contains__(self, key: object) -> bool:
        if _called_from(self.where):
            self.hook()
        return super().__contains__(key)


class _Committed(int):
    """A directory's ``committed`` mark whose comparisons (``run < committed``: the reflected
    ``__gt__`` of an int subclass runs first) call ``hook`` inside ``_drop_old_runs``."""

    hook: Any = None

    def __gt__(self, other: object) -> bool:
        if _called_from("_drop_old_runs"):
            type(self).hook()
        return int(self) > other  # type: ignore[operator]


def _once(fn):
    """``fn`` run at the first call only (what the other thread does once); ``.fired`` says
    whether it ran."""
    def hook() -> None:
        if not hook.fired:
            hook.fired = True
            fn()
    hook.fired = False
    return hook


# --- a new read state carries the previous one's term sets over -----------------------------


@pytest.mark.parametrize("which", ["terms_of", "fresh"])
def test_switch_survives_a_query_adding_to_the_previous_states_maps(store, which):
    """``_switch`` copies the small segments' term sets (``terms_of``) and this handle's
    written columns (``fresh``) from the previous state while a query on that state, in
    another thread, adds the entry of a segment it had not looked at yet (``_terms_of``). The
    add happens between two steps of the copy's loop: the old code raised RuntimeError."""
    rng = np.random.default_rng(1)
    idx = _fresh(store)
    for i in range(4):  # four small segments this handle wrote: fresh columns and term sets
        store.write(lambda txn, i=i: idx.apply(txn, [(i + 1, _doc(rng) + ["w1"])], []))
    query = ["w0", "w1", "w2"]
    with store.read() as txn:
        idx.search(txn, query, 5)
    prev = idx._dir
    assert prev is not None and len(prev.terms_of) == 4 and len(prev.fresh) == 4
    segno = max(prev.terms_of)
    # that segment's entries are not made yet: the other thread's query makes them mid-copy
    entries = (prev.fresh.pop(segno), prev.terms_of.pop(segno))

    def insert() -> None:  # as _terms_of does: fresh first, then the term set
        prev.fresh[segno] = entries[0]
        prev.terms_of[segno] = entries[1]

    hook = _once(insert)
    n = [0]

    def on_contains() -> None:
        # the first generator of _switch copies terms_of, the second fresh
        code = sys._getframe(2).f_code  # 0: here, 1: __contains__, 2: the caller
        if code.co_name == "<genexpr>":
            seen.add(code.co_firstlineno)
            if len(seen) == (1 if which == "terms_of" else 2):
                n[0] += 1
                hook()

    seen: set[int] = set()
    switch = idx._switch

    def hooked(d, sid):
        d.segs = _Segs(d.segs, "_switch", on_contains)
        switch(d, sid)
        d.segs = dict(d.segs)

    idx._switch = hooked  # type: ignore[method-assign]
    other = _fresh(store)  # another handle commits: the next query switches to its state
    store.write(lambda txn: other.apply(txn, [(10, ["w0", "w2", "zz"])], []))
    with store.read() as txn:
        got = {k: idx.search(txn, query, k) for k in (1, 5, 70)}
        assert hook.fired
        assert got == {k: _fresh(store).search(txn, query, k) for k in (1, 5, 70)}
    del idx._switch
    # the new state carries the live segments' entries over (a later one is only looked up again)
    assert idx._dir is not prev and set(idx._dir.terms_of) <= set(idx._dir.segs)
    store.write(lambda txn: idx.apply(txn, [(11, ["w1"])], [2]))
    with store.read() as txn:
        assert idx.search(txn, query, 7) == _fresh(store).search(txn, query, 7)


# --- decoded tombstone runs dropped while queries add runs ----------------------------------


def _handle_with_stale_runs(store):
    """A handle whose caches hold tombstone runs and dead unions of two segments that the
    next state (a full merge, committed by another handle) no longer has."""
    rng = np.random.default_rng(2)
    idx, writer = _fresh(store), _fresh(store)
    store.write(lambda txn: writer.apply(txn, [(i, _doc(rng) + ["w1"]) for i in range(1, 6)], []))
    store.write(lambda txn: writer.apply(txn, [(i, _doc(rng) + ["w1"]) for i in range(6, 11)], []))
    store.write(lambda txn: writer.apply(txn, [], [1, 6]))
    query = ["w0", "w1"]
    with store.read() as txn:
        idx.search(txn, query, 5)
    assert len(idx._runs) == 2 and len(idx._dead_union) == 2
    store.write(lambda txn: writer.merge(txn, force=True))
    return idx, query


@pytest.mark.parametrize("where", ["runs", "dead_union"])
@pytest.mark.parametrize("other", ["query", "drop"])
def test_dropping_old_runs_survives_other_threads(store, where, other):
    """``_drop_old_runs`` scans the decoded runs (``_runs``) and dead unions
    (``_dead_union``) while another thread either queries the previous state, adding an
    entry (``_run``, ``_dead``), or drops the same old entries itself (``_put_directory``
    calls it without the lock, ``_switch`` under it). Either happens between two steps of
    the scan: the old code raised RuntimeError (and, with a copy alone, KeyError on the
    entry the other thread had deleted)."""
    idx, query = _handle_with_stale_runs(store)
    table = idx._runs if where == "runs" else idx._dead_union
    key = max(table)
    value = table.pop(key)  # not made yet: the other thread's query makes it mid-scan
    state: dict[str, Any] = {}

    def act() -> None:
        if other == "query":
            table[key] = value
        else:
            table[key] = value  # it was there when the other thread's drop began
            idx._drop_old_runs(state["d"])

    hook = _once(act)
    switch = idx._switch

    def hooked(d, sid):
        state["d"] = d
        if where == "runs":
            _Committed.hook = hook
            d.committed = _Committed(d.committed)
        else:
            d.segs = _Segs(d.segs, "_drop_old_runs", hook)
        try:
            switch(d, sid)
        finally:
            d.committed, d.segs = int(d.committed), dict(d.segs)
            _Committed.hook = None

    idx._switch = hooked  # type: ignore[method-assign]
    with store.read() as txn:
        got = idx.search(txn, query, 5)
        assert hook.fired
        assert got == _fresh(store).search(txn, query, 5)
    del idx._switch
    if other == "drop":  # the merged-away segments' runs are gone
        assert not idx._runs and not idx._dead_union


# --- a term's memo of best documents, shared by the threads querying it ----------------------


class _DepthKey:
    """A key of a term's best-documents memo whose comparison with the asked depth runs
    ``hook`` (the other thread memoising its depth meanwhile); it is never a match."""

    def __init__(self, hook) -> None:
        self.hook = hook

    def __ge__(self, other: object) -> bool:
        self.hook()
        return False


def _big_handle(store):
    rng = np.random.default_rng(3)
    idx = _fresh(store)
    docs = [(i + 1, _doc(rng) + (["w1"] if i % 3 else [])) for i in range(SMALL_SEGMENT_DOCS + 50)]
    store.write(lambda txn: idx.apply(txn, docs, []))
    return idx


def test_best_survives_another_thread_memoising_a_depth(store):
    """``_Term.best`` looks for a memoised depth at least ``k`` while another thread,
    querying the same term in the same state, stores its depth (``memo[depth] = got``): the
    old code's generator over the live memo raised RuntimeError."""
    idx = _big_handle(store)
    with store.read() as txn:
        want = _fresh(store).search(txn, ["w1"], 5)
        term, = idx._weighted(txn, ["w1"])
        term.best(5)
        memo = term.best_memo
        got = memo.pop(TERM_TOP_CACHED)  # the other thread's result, stored mid-loop
        hook = _once(lambda: memo.__setitem__(TERM_TOP_CACHED, got))
        memo[_DepthKey(hook)] = got
        assert idx.search(txn, ["w1"], 5) == want
        assert hook.fired


def test_ranked_survives_another_thread_memoising_a_depth(store, monkeypatch):
    """``_Term.ranked`` (top()'s floor, for a query of several terms) scans the same memo:
    the old code's generator over it raised RuntimeError when another thread stored a depth.
    The floor is on the numpy path only (the C extension's top_terms needs none): run it."""
    monkeypatch.setattr(_accel, "NATIVE", None)
    idx = _big_handle(store)
    query = ["w0", "w1", "w2"]
    with store.read() as txn:
        want = _fresh(store).search(txn, query, 5)
        hooks = []
        for term in idx._weighted(txn, query):
            memo = term.best_memo
            got = term.best(TERM_TOP_CACHED)
            memo.clear()
            hook = _once(lambda memo=memo, got=got: memo.__setitem__(TERM_TOP_CACHED, got))
            memo[_DepthKey(hook)] = got
            hooks.append(hook)
        assert idx.search(txn, query, 5) == want
        assert any(h.fired for h in hooks)


# --- the commit listeners and the vector caches --------------------------------------------


class _Listeners(weakref.WeakSet):
    """The listener set, with a hook between two steps of its (Python) iterator."""

    hook: Any = None

    def __iter__(self):
        for i, item in enumerate(super().__iter__()):
            yield item
            if i == 0 and self.hook is not None:
                self.hook()


def test_commit_notifies_listeners_while_another_thread_registers_one(make_db):
    """After a commit, the process's caches are told what changed while a query of another
    handle creates its node cache (``on_commit`` adds to the listener set): the old code
    iterated the WeakSet in Python and raised RuntimeError after the commit."""
    db = make_db()
    for i in range(5):
        db.add(f"note {i} about apples and pears")
    db.recall("apples")  # the handle's node cache listens
    env = db._store._env
    listeners = _Listeners(env.listeners)
    env.listeners = listeners
    other = make_db()  # another handle of the same file, its node cache not made yet
    assert other._store._env is env
    hook = listeners.hook = _once(lambda: other.indexes.node_cache)

    class Early:  # a listener told first (the fix notifies from a copy: the add may come meanwhile)
        def purge(self, changes, state=None) -> None:
            hook()

    early = Early()
    env.listeners.add(early)
    db.add("a note about pears")
    assert hook.fired and other.indexes.node_cache in set(env.listeners)
    env.listeners.discard(early)
    want = [(h.id, h.score) for h in make_db().recall("pears")]
    assert [(h.id, h.score) for h in db.recall("pears")] == want
    assert [(h.id, h.score) for h in other.recall("pears")] == want


class _HookCache(_SpaceCache):
    """A space's cache whose ``last`` is reset through a hook (rebuild resets every cache)."""

    __slots__ = ("hook",)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "last" and getattr(self, "hook", None) is not None:
            self.hook()
        super().__setattr__(name, value)


def test_vector_rebuild_survives_a_query_caching_a_space(make_db):
    """Adding an ``auto`` space rebuilds the vectors, resetting every space's cache, while a
    query of the same handle in another thread caches a space it had not searched yet
    (``_cache``): the old code's loop over the live dict raised RuntimeError."""
    db = make_db()
    for i in range(6):
        db.add(f"memory {i} on rivers and boats")
    db.add_space("a", dims=32)
    db.add_space("b", dims=16)
    db.recall("rivers")
    vectors = db.indexes.vectors
    caches = vectors._caches
    assert "a" in caches and "b" in caches
    b = caches.pop("b")  # not searched yet: the other thread's query caches it mid-loop
    spy = _HookCache()
    spy.hook = _once(lambda: caches.__setitem__("b", b))
    caches["~spy"] = spy
    db.add_space("c", dims=8)
    assert spy.hook.fired
    del caches["~spy"]
    want = [(h.id, h.score) for h in make_db().recall("boats on rivers")]
    assert [(h.id, h.score) for h in db.recall("boats on rivers")] == want


# --- zstd contexts ---------------------------------------------------------------------------


def test_each_thread_compresses_and_decompresses_with_its_own_zstd_objects(monkeypatch):
    """python-zstandard's compressors and decompressors must not be used by two threads at
    once: with one module-wide decompressor, the stress test below read sound posting blocks
    as "a posting block does not decompress" (CorruptFileError). Each thread that decodes a
    block or a record, or encodes one, now makes and uses its own."""
    made: list[Any] = []

    def spy(real):
        class Spy:
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                self.inner, self.users = real(*args, **kwargs), set()
                made.append(self)

            def compress(self, *args: Any, **kwargs: Any) -> bytes:
                self.users.add(threading.get_ident())
                return self.inner.compress(*args, **kwargs)

            def decompress(self, *args: Any, **kwargs: Any) -> bytes:
                self.users.add(threading.get_ident())
                return self.inner.decompress(*args, **kwargs)
        return Spy

    monkeypatch.setattr(zstandard, "ZstdCompressor", spy(zstandard.ZstdCompressor))
    monkeypatch.setattr(zstandard, "ZstdDecompressor", spy(zstandard.ZstdDecompressor))
    docnos = np.arange(1, 3000, 3, dtype=np.uint64)
    tfs = np.ones(docnos.size, np.uint64)
    text = "a long archived text " * 400
    together = threading.Barrier(2)
    got: list[Any] = []

    def work() -> None:
        block = bm25_mod.encode_block(docnos, tfs)
        assert block[0] == bm25_mod.BLOCK_ZSTD
        got.append((bm25_mod.decode_block(block), codec.unpack_archive(codec.pack_archive(text))))
        together.wait(30)  # both threads alive at once: their idents differ

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(got) == 2
    for (d, t), text_back in got:
        assert np.array_equal(d, docnos) and np.array_equal(t, tfs) and text_back == text
    users = [spy_.users for spy_ in made if spy_.users]
    assert len(users) >= 4 and all(len(u) == 1 for u in users)  # 2 threads x (bm25, codec) at least
    assert len(set().union(*users)) == 2


# --- real threads ----------------------------------------------------------------------------


def test_readers_query_while_the_handle_commits(store):
    """Reader threads query one handle while it commits adds, updates and deletes (automatic
    merges included) and, now and then, a full merge; every answer equals a fresh handle's at
    the same snapshot. Thread switches are forced often (a tiny switch interval). Counts
    work, not time."""
    rng = np.random.default_rng(7)
    idx = _fresh(store)
    base = [(i + 1, _doc(rng) + (["w1"] if i % 2 else [])) for i in range(SMALL_SEGMENT_DOCS + 100)]
    store.write(lambda txn: idx.apply(txn, base, []))
    queries = [["w1"], ["w0"], ["w3"], ["w0", "w1"], ["w1", "w2", "w5"], ["w4", "w7", "w9", "w1"]]
    ks = [1, 5, TERM_TOP_CACHED + 6]
    done = threading.Event()
    failures: list[BaseException] = []
    answered = [0] * 3

    def reader(n: int) -> None:
        r = np.random.default_rng(100 + n)
        try:
            while not done.is_set():
                q = queries[int(r.integers(len(queries)))]
                k = ks[int(r.integers(len(ks)))]
                with store.read() as txn:
                    got = idx.search(txn, q, k)
                    mass = {t: m for t, (m, _) in idx.idf_mass(txn, q).items()}
                    fresh = _fresh(store)
                    if got != fresh.search(txn, q, k):
                        raise AssertionError(f"{q} top {k} differs from a fresh handle's")
                    if mass != {t: m for t, (m, _) in fresh.idf_mass(txn, q).items()}:
                        raise AssertionError(f"{q}: idf masses differ from a fresh handle's")
                answered[n] += 1
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)
            done.set()

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    threads = [threading.Thread(target=reader, args=(n,), daemon=True) for n in range(3)]
    try:
        for t in threads:
            t.start()
        nxt = len(base) + 1
        live = [d for d, _ in base]
        for step in range(10 * MERGE_FACTOR):
            if failures:
                break
            added = [(nxt + j, _doc(rng, 6)) for j in range(int(rng.integers(1, 4)))]
            nxt += len(added)
            gone = [live.pop(int(rng.integers(len(live)))) for _ in range(int(rng.integers(0, 3)))]
            updated = [(live[int(rng.integers(len(live)))], _doc(rng, 5))] if step % 4 == 0 else []
            added += [u for u in updated if u[0] not in {a for a, _ in added}]
            removed = gone + [d for d, _ in updated]
            store.write(lambda txn, added=added, removed=removed: idx.apply(txn, added, removed))
            live += [d for d, _ in added if d not in live]
            if step % 40 == 39:
                store.write(lambda txn: idx.merge(txn, force=True))
        # let the readers see the last state too
        target = sum(answered) + 30
        while not failures and sum(answered) < target and all(t.is_alive() for t in threads):
            threading.Event().wait(0.01)
    finally:
        done.set()
        for t in threads:
            t.join(30)
        sys.setswitchinterval(old_interval)
    if failures:
        raise failures[0]
    assert not any(t.is_alive() for t in threads)
    assert all(n > 0 for n in answered), answered
