"""Incremental equals rebuilt: after any sequence of adds, updates, deletes (one by one or
``delete_many``), merges, purges of deleted documents, reopen and compaction, every query (BM25, recall fusing BM25 with
an auto vector space, and exact search in a user space only some memories have a vector
in) answers exactly what indexes rebuilt from scratch answer."""
from __future__ import annotations

import shutil
import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, precondition, rule

import engramdb.engram as engram_mod
from conftest import postings_to_term_first
from engramdb.crypto import KDFParams
from engramdb.index import bm25

WORDS = ["apple", "pear", "moving", "moved", "relocate", "job", "career", "lake", "sunrise", "new", "york",
         "nyc", "the", "caroline", "melanie", "painting", "2023", "may", "wedding", "spouse"]
text = st.lists(st.sampled_from(WORDS), min_size=0, max_size=10).map(" ".join)
QUERIES = ["apple pear", "moving to new york", "career job", "caroline painting the lake", "wedding 2023",
           "sunrise", "relocate nyc", "zzz"]


class _Rebuilt(Exception):
    def __init__(self, answers):
        super().__init__("rolled back on purpose")
        self.answers = answers


def _answers(db):
    out = []
    for q in QUERIES:
        hits = db.recall(q, top_k=6, hops=False)
        out.append([(h.id, h.score) for h in hits])
    return out


def _bm25(db):
    with db._store.read() as txn:
        return [db.indexes.bm25.search(txn, db.indexes.tokenizer(q), 10) for q in QUERIES]


def _user_vector(n):
    """The vector of memory number ``n`` in the user space ``u`` (only even numbers have one)."""
    return [float(n % 7) - 3.0, float(n % 5) + 0.5, 1.0]


def _vectors(db):
    with db._store.read() as txn:
        return [db.indexes.vectors.search(txn, "u", _user_vector(n), 10) for n in (2, 3, 4)]


class IncrementalEqualsRebuilt(RuleBasedStateMachine):
    ids = Bundle("ids")

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="engram-stateful-")
        self.path = f"{self.dir}/s.engram"
        self.db = self._open()
        self.db.add_space("h", dims=16)  # an auto space: every memory also gets a vector
        self.db.add_space("u", dims=3, model="test", normalize=False)  # given by the caller, to some
        self.model: dict[str, str] = {}
        self.n = 0

    def _open(self):
        return engram_mod.open(self.path, passphrase="pw", kdf=KDFParams.for_tests())

    @rule(target=ids, content=text)
    def add(self, content):
        self.n += 1
        id_ = f"m{self.n}"
        vector = {"embeddings": {"u": _user_vector(self.n)}} if self.n % 2 == 0 else {}
        self.db.add(content, id=id_, now=1_700_000_000.0 + self.n, **vector)
        self.model[id_] = content
        return id_

    @rule(contents=st.lists(text, min_size=1, max_size=6))
    def add_many(self, contents):
        items = []
        for c in contents:
            self.n += 1
            items.append({"id": f"m{self.n}", "content": c})
            self.model[f"m{self.n}"] = c
        self.db.add_many(items, now=1_700_000_000.0)

    @rule(id_=ids, content=text)
    def update(self, id_, content):
        if id_ in self.model:
            self.db.update(id_, content=content)
            self.model[id_] = content

    @rule(id_=consumes(ids))
    def delete(self, id_):
        if id_ in self.model:
            self.db.delete(id_)
            del self.model[id_]

    @rule(picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=8), also_update=st.booleans(),
          content=text, bulk=st.booleans())
    def delete_many(self, picks, also_update, content, bulk):
        """Several deletes (and an update) in one transaction: one run of tombstones per
        segment; ``bulk``: through ``delete_many`` (records removed in key order, the indexes
        given only their vector spaces)."""
        live = sorted(self.model, key=lambda i: int(i[1:]))
        if not live:
            return
        victims = sorted({live[p % len(live)] for p in picks}, key=lambda i: int(i[1:]))
        with self.db.transaction() as tx:
            if also_update and len(victims) > 1:
                tx.update(victims[0], content=content)
                self.model[victims[0]] = content
                victims = victims[1:]
            if bulk:
                assert tx.delete_many(victims) == len(victims)
            for id_ in victims:
                if not bulk:
                    tx.delete(id_)
                del self.model[id_]

    @rule(steps=st.integers(1, 5), force=st.booleans())
    def merge(self, steps, force):
        self.db.merge_indexes(steps, force=force)

    @rule(steps=st.integers(1, 3))
    def purge(self, steps):
        """Deleted documents purged from the segments holding them (compact() does this),
        a tier group per step."""
        self.db._store.write(lambda txn: self.db.indexes.bm25.purge(txn, steps))

    @rule()
    def reopen(self):
        """A writable open; it converts postings keyed term first (spec/bm25.md, "postings")."""
        self.db.close()
        self.db = self._open()
        with self.db._store.read() as txn:
            assert not self.db.indexes.needs_migration(txn)

    @rule()
    def key_postings_term_first(self):
        """The file becomes one written before postings were keyed segment first: this handle
        (its caches kept) reads and writes it in that layout until a reopen converts it."""
        with self.db._store.read() as txn:
            data = txn.get("segments", bm25.DIR_KEY)
        if data is not None and bm25._Dir.decode(data).seg_first:
            self.db._store.write(postings_to_term_first)

    @precondition(lambda self: self.n % 3 == 0)
    @rule()
    def compact(self):
        self.db.compact()

    @invariant()
    def incremental_equals_rebuilt(self):
        incremental = _answers(self.db)
        bm25_inc = _bm25(self.db)
        vectors_inc = _vectors(self.db)
        for hits in incremental:
            assert {i for i, _ in hits} <= set(self.model)  # deleted memories never come back

        def rebuild(txn):
            self.db.indexes.rebuild(txn)
            raise _Rebuilt((_answers(self.db), _bm25(self.db), _vectors(self.db)))

        try:
            self.db._store.write(rebuild)
        except _Rebuilt as done:
            answers, bm25_rebuilt, vectors_rebuilt = done.answers
        assert incremental == answers
        assert bm25_inc == bm25_rebuilt
        assert vectors_inc == vectors_rebuilt

    def teardown(self):
        try:
            assert [str(p) for p in self.db.verify()] == []
        finally:
            self.db.close()
            shutil.rmtree(self.dir, ignore_errors=True)


IncrementalEqualsRebuilt.TestCase.settings = settings(max_examples=25, stateful_step_count=25, deadline=None)
TestIncrementalEqualsRebuilt = IncrementalEqualsRebuilt.TestCase
