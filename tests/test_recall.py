"""recall / recall_context through the Engram facade: pipeline, filters, determinism, isolation."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import engramdb.engram as engram_mod
from engramdb.crypto import KDFParams
from engramdb.errors import ValidationError
from engramdb.records import Edge
from engramdb.tokens import estimate_tokens

NOW = 1_700_000_000.0
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FACTS = [
    ("move", "Caroline moved to New York for a new job in May 2023", "2023-05-08"),
    ("paint", "Melanie painted a sunrise over the lake", "2023-07-01"),
    ("adopt", "Caroline is researching adoption agencies", "2022-11-20"),
    ("wed", "Melanie and her husband celebrated their wedding anniversary", "2023-01-15"),
    ("race", "Melanie ran a charity race for mental health", "2023-05-20"),
    ("guitar", "Caroline plays the guitar and writes songs", None),
]


@pytest.fixture
def db(make_db):
    db = make_db()
    for id_, text, date in FACTS:
        db.add(text, id=id_, resolved_date=date, now=NOW)
    return db


def test_basic_ranking_and_explain(db):
    hits = db.recall("Where did Caroline move to?", top_k=3, explain=True)
    assert hits[0].id == "move"
    parts = hits[0].parts
    assert parts["bm25_rank"] == 1.0 and parts["bm25"] > 0 and parts["rrf"] > 0
    assert set(parts) >= {"bm25", "bm25_rank", "rrf", "tier", "superseded", "date"}
    assert db.recall("Where did Caroline move to?", top_k=3)[0].parts is None
    assert hits == sorted(hits, key=lambda h: (-h.score, h.docno))
    assert json.dumps([h.to_dict() for h in hits])  # JSON-ready


def test_synonyms_expand_the_query(db):
    assert [h.id for h in db.recall("relocate", top_k=2)] == ["move"]
    assert db.recall("relocate", top_k=2, expand_query=False) == []
    assert [h.id for h in db.recall("marriage", top_k=1)] == ["wed"]
    assert [h.id for h in db.recall("NYC", top_k=1)] == ["move"]


def test_date_proximity_breaks_otherwise_equal_scores(make_db):
    db = make_db()
    db.add("Melanie went to a concert", id="old", resolved_date="2021-03-01", now=NOW)
    db.add("Melanie went to a concert", id="new", resolved_date="2023-08-01", now=NOW)
    assert [h.id for h in db.recall("Melanie concert", top_k=2)] == ["old", "new"]  # tie: docno order
    hits = db.recall("Melanie concert in August 2023", top_k=2, explain=True)
    assert [h.id for h in hits] == ["new", "old"]
    assert hits[0].parts["date"] > hits[1].parts["date"] == 0.0


def test_filters(db, make_db):
    db.update("race", tier="cold", tags=("sport",), flags=("DECISION",))
    assert [h.id for h in db.recall("Melanie", tiers=["cold"])] == ["race"]
    assert [h.id for h in db.recall("Melanie", tags="sport")] == ["race"]
    assert [h.id for h in db.recall("Melanie", flags=["DECISION"])] == ["race"]
    assert db.recall("Melanie", after=NOW + 1) == []
    assert len(db.recall("Melanie", before=NOW + 1, top_k=10)) == 3
    with pytest.raises(ValidationError):
        db.recall("x", tiers=["lukewarm"])
    with pytest.raises(ValidationError):
        db.recall("x", flags=["NOPE"])
    with pytest.raises(ValidationError):
        db.recall("x", after="yesterday")
    with pytest.raises(ValidationError):
        db.recall("x", top_k=-1)
    with pytest.raises(ValidationError):
        db.recall(None)  # type: ignore[arg-type]
    assert db.recall("Melanie", top_k=0) == []


@pytest.mark.parametrize("native", [True, False], ids=["native", "pure"])
def test_a_top_k_beyond_a_c_size_answers_as_a_large_one(db, monkeypatch, native):
    # top_k=2**62 raised a raw OverflowError ("Python int too large to convert to C ssize_t")
    # from the C extension's query_top, where the pure path answered
    from engramdb import _accel
    if not native:
        monkeypatch.setattr(_accel, "NATIVE", None)
    expected = [(h.id, h.score) for h in db.recall("Melanie concert", top_k=1000)]
    assert expected
    for top_k in (2**62, 2**63, 2**64):
        assert [(h.id, h.score) for h in db.recall("Melanie concert", top_k=top_k)] == expected


def test_tier_boost_and_superseded_penalty(make_db):
    db = make_db()
    db.add("the meeting is on Monday", id="a", now=NOW)
    db.add("the meeting is on Monday", id="b", now=NOW)
    assert [h.id for h in db.recall("meeting monday", top_k=2, hops=False)] == ["a", "b"]
    db.add("correction: it was rescheduled", id="fix", now=NOW)
    db.link("fix", "a", "supersedes")
    hits = db.recall("meeting monday", top_k=2, hops=False, explain=True)
    assert [h.id for h in hits] == ["b", "a"]
    assert hits[1].parts["superseded"] < 1.0
    db.update("b", tier="archive")
    assert [h.id for h in db.recall("meeting monday", top_k=2, hops=False)] == ["b", "a"]  # 0.85 > 0.5


def test_one_hop_brings_linked_memories(make_db):
    db = make_db()
    db.add("Caroline adopted a puppy named Oscar", id="pup", now=NOW)
    db.add("He loves chasing tennis balls", id="balls", now=NOW)
    db.add("unrelated note about taxes", id="tax", now=NOW)
    assert [h.id for h in db.recall("Caroline puppy", top_k=3)] == ["pup"]
    db.link("pup", "balls", "related")
    hits = db.recall("Caroline puppy", top_k=3, explain=True)
    assert [h.id for h in hits] == ["pup", "balls"]
    assert hits[1].parts["hop:bm25"] > 0 and hits[1].parts["bm25"] == 0.0
    assert [h.id for h in db.recall("Caroline puppy", top_k=3, hops=False)] == ["pup"]


def test_a_hub_linked_to_many_matches_ranks_below_them(make_db):
    """Regression: the hop summed what every matching neighbour passed on, so a memory linked
    to 20 matches and matching nothing collected 0.9 x 20 of their scores and ranked first.
    Its gain is now capped at its best neighbour's score (times the hop's weight)."""
    db = make_db()
    db.add_space("hashed", dims=64)
    db.add_many([{"id": "hub", "content": "the central hub memory about zebras"}]
                + [{"id": f"n{i}", "content": f"leaf {i} about lions and tigers"} for i in range(20)])
    with db.transaction() as tx:
        for i in range(20):
            tx.link("hub", f"n{i}", "related")
    hits = db.recall("lions", top_k=21, explain=True)
    assert [h.id for h in hits][-1] == "hub" and len(hits) == 21
    hub, leaves = hits[-1], hits[:-1]
    assert hub.parts["bm25"] == 0.0 and 0 < hub.parts["hop:bm25"] <= 0.9 * max(h.parts["bm25"] for h in leaves)
    for key in [k for k in hub.parts if k.startswith("hop:vector:")]:
        space = key[len("hop:"):]
        assert hub.parts[key] <= 0.9 * max(h.parts.get(space, 0.0) for h in leaves)
    assert hits[0].id != "hub" and db.recall("lions", top_k=1, hops=False)[0].id != "hub"
    assert db.recall("zebras", top_k=1)[0].id == "hub"  # the hub's own match still leads


def test_the_hop_cap_leaves_a_chain_of_turns_unchanged():
    """Where no node collects more than its best neighbour's score (consecutive turns linked
    in a chain, as on LoCoMo), the capped hop gives the same floats as the plain sum."""
    from engramdb.index.graph import hop_row, spread
    from engramdb.recall import _spread_capped
    n = 12
    rows = {i: hop_row({j: 1.0 for j in (i - 1, i + 1) if 0 <= j < n}) for i in range(n)}
    seeds = {i: 1.0 + (i * 7919 % 13) / 3 for i in range(1, n - 1)}
    assert _spread_capped(rows, seeds) == spread(rows, seeds)
    star = {0: hop_row({1: 1.0}), 2: hop_row({1: 1.0}), 3: hop_row({1: 1.0, 4: 1.0})}
    assert _spread_capped(star, {0: 2.0, 2: 3.0, 3: 4.0}) == {1: 4.0, 4: 2.0}  # 2 + 3 + 2 = 7, capped at 4


def test_vectors_join_the_fusion(db):
    db.add_space("hashed", dims=128)
    assert db.spaces()["hashed"].auto
    hits = db.recall("guitar songs", top_k=2, explain=True)
    assert hits[0].id == "guitar"
    assert "vector:hashed" in hits[0].parts and hits[0].parts["vector_rank:hashed"] == 1.0


def test_touch_bumps_access_in_one_write_and_default_reads_do_not(db):
    before = db._store.last_txnid()
    db.recall("Caroline")
    assert db._store.last_txnid() == before  # the read path writes nothing
    hits = db.recall("Caroline", top_k=2, touch=True, now=NOW + 50)
    assert db._store.last_txnid() == before + 1  # one batched write
    for h in hits:
        assert h.node.access_count == 1 and h.node.last_accessed == NOW + 50
        assert db.get(h.id).access_count == 1


def test_readonly_handle_recalls(db, tmp_path):
    path = db.path
    db.close()
    ro = engram_mod.open(path, passphrase="correct horse battery staple", readonly=True)
    try:
        assert ro.recall("Caroline guitar", top_k=1)[0].id == "guitar"
        assert ro.recall("Caroline guitar", top_k=1)[0].node.access_count == 0
    finally:
        ro.close()


def test_touch_on_a_readonly_handle_is_refused_not_silently_dropped(db):
    """touch=True on a read-only handle returned the hits and recorded no access, and said
    nothing of it (recall's notes): it is a ReadOnlyError, for recall and recall_context."""
    from engramdb.errors import ReadOnlyError
    path = db.path
    db.close()
    ro = engram_mod.open(path, passphrase="correct horse battery staple", readonly=True)
    try:
        for call in (ro.recall, ro.recall_context):
            with pytest.raises(ReadOnlyError, match="touch=True") as info:
                call("Caroline guitar", top_k=1, touch=True)
            assert "readonly=False" in info.value.hint and "touch=False" in info.value.hint
    finally:
        ro.close()


def test_deleted_memories_are_never_returned(db):
    for id_, _, _ in FACTS[:3]:
        db.delete(id_)
    found = {h.id for h in db.recall("Caroline Melanie moved lake adoption", top_k=10)}
    assert found.isdisjoint({"move", "paint", "adopt"})
    db.merge_indexes(10, force=True)
    assert {h.id for h in db.recall("Caroline Melanie moved lake adoption", top_k=10)} == found


def test_no_plaintext_term_in_the_file(make_db):
    db = make_db()
    db.add_space("hashed", dims=32)
    db.add("the zyxwvquartz sentinel lives in aardvarkplum county", id="zzsentinelid", tags=("qqtagword",),
           entities=("Xylophonia",), now=NOW)
    db.link_tunnels()
    assert db.recall("zyxwvquartz")[0].id == "zzsentinelid"
    path = db.path
    db.close()
    with open(path, "rb") as fh:
        raw = fh.read().lower()
    for word in (b"zyxwvquartz", b"aardvarkplum", b"zzsentinelid", b"qqtagword", b"xylophonia", b"hashed",
                 b"sentinel"):
        assert word not in raw


def test_recall_context_merges_spans_under_budget_in_document_order(make_db):
    db = make_db()
    source = "".join(f"Sentence number {i} talks about topic{i}. " for i in range(40))
    starts = [source.index(f"Sentence number {i} ") for i in range(41) if i < 40] + [len(source)]

    def span(i, j):
        return starts[i], starts[j]

    db._store.write(lambda txn: txn.put("sources", db._store.blind(b"source", b"doc"), source.encode()))
    for n, (i, j) in enumerate([(30, 32), (2, 4), (3, 6), (10, 11)]):
        s, e = span(i, j)
        db.add(f"note about topic{i} and topic{j - 1}", id=f"z{n}", source="doc", source_start=s, source_end=e,
               now=NOW)
    db.add("a memory without a source about topic2", id="bare", now=NOW)
    ctx = db.recall_context("topic30 topic2 topic3 topic10", top_k=10, max_tokens=10_000, hops=False)
    texts = [p.text for p in ctx.passages if p.source == "doc"]
    # z1 [2,4) and z2 [3,6) overlap: one passage [2,6); emitted by offset
    # (spans end at their last sentence's full stop: the space after it is left out)
    assert [(p.start, p.end) for p in ctx.passages if p.source == "doc"] == [
        (a, b - 1) for a, b in (span(2, 6), span(10, 11), span(30, 32))]
    assert texts[0].startswith("Sentence number 2 ") and texts[0].endswith("topic5.")
    assert any(p.source == "" and p.text.startswith("a memory without") for p in ctx.passages)
    assert ctx.tokens == estimate_tokens(ctx.text)  # the text as returned, headings included
    assert all(p.heading.startswith("### doc (") for p in ctx.passages if p.source == "doc")
    # a tight budget admits in rank order and never exceeds it
    small = db.recall_context("topic30 topic2 topic3 topic10", top_k=10, max_tokens=15, hops=False)
    assert small.tokens <= 15 and small.passages
    assert db.recall_context("topic30", max_tokens=0).passages == ()
    only = db.recall_context("topic2", source="doc", hops=False)
    assert {p.source for p in only.passages} == {"doc"}
    with pytest.raises(ValidationError):
        db.recall_context("x", max_tokens=-1)


def _run(code: str, seed: str) -> str:
    env = dict(os.environ, PYTHONHASHSEED=seed, ENGRAM_TEST_WEAK_KDF="1", PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_recall_is_deterministic_across_processes_and_hash_seeds(tmp_path):
    code = f"""
        import engramdb.engram as em
        from engramdb.crypto import KDFParams
        db = em.open({str(tmp_path / 'det.engram')!r} + __import__('os').environ['PYTHONHASHSEED'],
                     passphrase='pw', kdf=KDFParams.for_tests())
        words = 'apple pear lake sunrise moved relocate job career wedding spouse new york nyc'.split()
        items = [dict(id='m%d' % i, content=' '.join(words[(i * 7 + j) % len(words)] for j in range(i % 5 + 1)),
                      entities=[words[i % 4]], created_at=1.0) for i in range(60)]
        db.add_many(items)
        db.add_space('h', dims=32)
        db.link_tunnels(now=1.0)
        for q in ['apple lake', 'moving to nyc', 'career', 'wedding spouse pear', 'zzz']:
            print(q, [(h.id, repr(h.score)) for h in db.recall(q, top_k=8, explain=True)])
        print(db.recall_context('apple career', max_tokens=30).text)
    """
    outputs = {_run(code, seed) for seed in ("0", "1", "4242")}
    assert len(outputs) == 1
    assert "m" in outputs.pop()


def test_a_second_process_commit_is_visible_to_a_long_lived_handle(make_db):
    db = make_db()
    db.add("first memory about apples", id="a1", now=NOW)
    assert [h.id for h in db.recall("apples")] == ["a1"]
    _run(f"""
        import engramdb.engram as em
        from engramdb.crypto import KDFParams
        db = em.open({db.path!r}, passphrase='correct horse battery staple', kdf=KDFParams.for_tests())
        db.add('second memory about apples and apples', id='a2')
        db.delete('a1')
        db.close()
    """, "0")
    assert [h.id for h in db.recall("apples")] == ["a2"]


def test_verify_finds_damaged_indexes_and_fix_rebuilds_them(make_db):
    db = make_db()
    for id_, text, date in FACTS:
        db.add(text, id=id_, resolved_date=date, now=NOW)
    db.add_space("hashed", dims=32)
    db.link("move", "adopt")
    before = [(h.id, h.score) for h in db.recall("Caroline moved", top_k=4)]
    store = db._store
    with store.read() as txn:
        posting = next(iter(txn.keys("segments", b"p")))  # a small segment's postings (packed: spec/bm25.md)
        vector_dir = next(k for k in txn.keys("vectors") if k.endswith(b"\x00\x00\x00\x00"))
        reverse = next(iter(txn.keys("edges", b"r")))

    def damage(txn):
        txn.delete("segments", posting)
        txn.delete("vectors", vector_dir)
        txn.delete("edges", reverse)

    store.write(damage)
    problems = [str(p) for p in db.verify()]
    assert any(p.startswith("index: bm25") for p in problems)
    assert any(p.startswith("index: vectors") for p in problems)
    assert any(p.startswith("index: edges") for p in problems)
    db.verify(fix=True)
    assert db.verify() == []
    assert [(h.id, h.score) for h in db.recall("Caroline moved", top_k=4)] == before


def test_concurrent_readers_while_a_writer_commits(make_db):
    import threading

    db = make_db()
    db.add_many([{"id": f"s{i}", "content": f"seed apples {i}"} for i in range(20)], now=NOW)
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader():
        try:
            while not stop.is_set():
                hits = db.recall("apples pears", top_k=5)
                assert len(hits) == 5 and hits == sorted(hits, key=lambda h: (-h.score, h.docno))
        except BaseException as exc:  # surfaced below, in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for i in range(30):
            db.add(f"pears and apples {i}", id=f"w{i}", now=NOW)
            if i % 7 == 0 and i < 20:
                db.delete(f"s{i}")
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    ids = [h.id for h in db.recall("pears", top_k=100)]
    assert ids == [f"w{i}" for i in range(30)]


def test_a_large_top_k_with_many_edges_stays_sparse(make_db):
    db = make_db()
    db.add_many([{"id": f"t{i}", "content": f"turn {i} about the garden"} for i in range(1500)], now=NOW)
    with db.transaction() as tx:
        for i in range(1499):
            db.indexes.graph.put(tx._txn, i + 1, i + 2,
                                 Edge(src=f"t{i}", dst=f"t{i + 1}", kind="related", weight=0.5))
    hits = db.recall("garden", top_k=1000)  # 8000 candidates: a dense adjacency would need GBs
    assert len(hits) == 1000 and hits == sorted(hits, key=lambda h: (-h.score, h.docno))


def test_forced_merge_leaves_no_tombstoned_data(make_db):
    """forget = delete + merge_indexes(force=True) + compact: no posting block or vector row
    of the deleted memory is left in the live tables."""
    from engramdb.index import bm25 as bm


    db = make_db()
    db.add_space("hashed", dims=16)
    db.add_many([{"id": "keep", "content": "keep this apple note"}, {"id": "gone", "content": "forget the zebra secret"},
                 {"id": "keep2", "content": "another apple memory"}], now=NOW)  # one segment, one block
    zebra = db.indexes.bm25.blind(db.indexes.tokenizer("zebra")[0])
    space = db._store.blind(b"space", b"hashed")
    with db._store.read() as txn:
        zebra_row = db.indexes.vectors.fetch(txn, 2, ["hashed"])["hashed"].tobytes()
    db.delete("gone")

    def vector_plaintext(txn):
        return b"".join(value for _, value in txn.items("vectors", space))

    def stored_terms(txn):  # the blinds of every live segment (per-term or packed: spec/bm25.md)
        bm25 = db.indexes.bm25
        d = bm._Dir.decode(txn.get("segments", bm.DIR_KEY))
        return {blind for segno in d.segs for blind, _ in bm25._segment_blocks(txn, d, segno)}

    with db._store.read() as txn:
        assert zebra in stored_terms(txn)  # tombstoned, still stored
        # a delete rewrites the vector block without the row: no tombstone, nothing to merge
        assert zebra_row not in vector_plaintext(txn)
        assert db.indexes.vectors.layout(txn)["hashed"] == {"blocks": 1, "rows": 2, "dead_rows": 0}
    db.merge_indexes(10, force=True)
    with db._store.read() as txn:
        assert zebra not in stored_terms(txn)
        d = bm._Dir.decode(txn.get("segments", bm.DIR_KEY))
        assert len(d.segs) == 1 and not d.dead_counts()
        assert db.indexes.vectors.layout(txn)["hashed"] == {"blocks": 1, "rows": 2, "dead_rows": 0}
        assert sorted(db.indexes.vectors._matrix(txn, "hashed")[0].tolist()) == [1, 3]
    assert {h.id for h in db.recall("apple zebra", top_k=5)} == {"keep", "keep2"}


def test_a_warm_memory_that_matches_best_stays_first(make_db):
    """Regression: the warm tier's factor (0.97) used to outweigh a whole RRF rank, so a hot
    memory reached only through a hop outranked the warm memory that matched the query."""
    db = make_db()
    db.add_space("hashed", dims=64)
    db.add_many([
        {"id": "move", "content": "Alice moved to Berlin in March 2023 to start a new job.", "tier": "warm"},
        {"id": "tea", "content": "Bob prefers tea over coffee"},
        {"id": "lead", "content": "Alice leads Project Atlas and decided on PostgreSQL."},
    ])
    db.link("move", "tea", "related", weight=0.5)
    assert db.recall("where did alice move", top_k=1)[0].id == "move"


def test_recall_context_trims_a_passage_bigger_than_the_budget(make_db):
    """Regression: a best passage larger than max_tokens was skipped whole, returning nothing."""
    db = make_db()
    long_text = " ".join(["filler words about nothing much"] * 40) + " Darcy proposed to Elizabeth at Hunsford. " \
        + " ".join(["more filler text follows here"] * 40)
    db.add(long_text, id="long", quote="Darcy proposed to Elizabeth at Hunsford.")
    context = db.recall_context("Darcy proposed", max_tokens=20)
    assert context.passages and context.tokens <= 20 and estimate_tokens(context.text) <= 20
    assert context.passages[0].text == "Darcy proposed to Elizabeth at Hunsford."  # whole sentences only
    assert db.recall_context("Darcy proposed", max_tokens=0).passages == ()


def test_recall_filters_accept_iso_date_strings(make_db):
    db = make_db()
    db.add("an old memory about tea", id="old", created_at=1_600_000_000.0)  # 2020-09
    db.add("a new memory about tea", id="new", created_at=1_700_000_000.0)  # 2023-11
    assert [h.id for h in db.recall("tea", after="2023-01-01")] == ["new"]
    assert [h.id for h in db.recall("tea", before="2021")] == ["old"]
    assert [h.id for h in db.recall("tea", after="2023-06")] == ["new"]
    with pytest.raises(ValidationError) as info:
        db.recall("tea", after="last tuesday")
    assert "ISO" in str(info.value) and "after='2023-05-01'" in info.value.hint


def test_recall_after_compact_never_serves_stale_cached_postings(make_db):
    """Compaction restarts LMDB's transaction ids, which label the per-handle posting caches:
    a cache built just before compacting could match the id of the first commit after it."""
    db = make_db()
    first = db.add("caroline apple painting apple apple melanie")
    before = db._store.last_txnid()
    assert [h.id for h in db.recall("apple")] == [first]  # caches labelled with `before`
    db.compact()
    while db._store.last_txnid() < before:  # walk the restarted ids up to the cached label
        db.update(first, importance=0.5)
    second = db.add("apple caroline apple nyc apple painting spouse")
    assert sorted(h.id for h in db.recall("apple")) == sorted([first, second])


def test_vector_scores_within_rounding_of_zero_are_no_evidence(tmp_path):
    """Regression (found by the stateful test): a cosine of ~1e-8, whose sign depends on how
    the vectors were blocked, counted as a vector hit after a rebuild but not incrementally."""
    path = tmp_path / "v.engram"

    def reopen(db=None):
        if db is not None:
            db.close()
        return engram_mod.open(path, passphrase="pw", kdf=KDFParams.for_tests())

    db = reopen()
    db.add_space("h", dims=16)
    db.add("caroline apple painting apple apple melanie 2023 apple painting wedding", id="m1")
    db.add_many([{"id": f"m{i}", "content": ""} for i in range(2, 6)])
    db = reopen(db)
    db.add("apple caroline the 2023 apple nyc apple the painting spouse", id="m6")
    db.add_many([{"id": f"m{i}", "content": c} for i, c in zip(range(7, 12), [
        "apple the", "apple apple apple apple apple apple apple wedding apple apple",
        "apple apple apple apple caroline spouse apple apple apple apple", "may apple apple", "apple spouse"])])
    db = reopen(db)
    db.delete("m6")
    db.update("m1", content="apple sunrise apple apple apple pear 2023 apple spouse moving")
    incremental = [(h.id, h.score) for h in db.recall("relocate nyc", top_k=6, hops=False)]
    db._store.write(db.indexes.rebuild)  # every index rebuilt from the records
    assert [(h.id, h.score) for h in db.recall("relocate nyc", top_k=6, hops=False)] == incremental
    db.close()


def _check_all_then_top(self, docnos, scores, limit):
    """The reference for _Run._passing_top: check every document, then take the top."""
    import numpy as np

    from engramdb.recall import _top_k

    ok = np.fromiter((self.node(int(d)) is not None for d in docnos), dtype=bool, count=docnos.size)
    return _top_k(docnos[ok], scores[ok], limit)


def test_filtered_recall_checks_best_first_and_equals_checking_every_match(make_db, monkeypatch):
    """A filter is checked on the best matches first, stopping once enough pass (each check
    decodes a node); the hits equal checking every match first, with ties, a filter that
    passes nearly everything and one that passes a few documents deep in the ranking."""
    import random

    from engramdb.recall import _Run

    rng = random.Random(5)
    db = make_db()
    words = ["apple", "river", "stone", "cloud", "ember", "maple"]
    db.add_many([{"id": f"m{i}", "content": " ".join(rng.choice(words) for _ in range(rng.randint(2, 6))),
                  "tags": ["rare" if i % 37 == 5 else "common", f"g{i % 29}"], "tier": "warm" if i % 11 == 0 else "hot",
                  "created_at": NOW + i, "last_accessed": NOW + i} for i in range(400)])
    queries = ["apple river", "stone", "cloud ember maple", "apple apple stone river"]
    filters = [{"tags": ["rare"]}, {"tags": ["common"]}, {"tiers": ["warm"]}, {"after": NOW + 390},
               {"tiers": ["hot"], "tags": ["rare"]}] + [{"tags": [f"g{g}"]} for g in range(0, 29, 3)]
    fast = [[(h.id, h.score) for h in db.recall(q, top_k=k, **f)] for q in queries for f in filters for k in (1, 7)]
    monkeypatch.setattr(_Run, "_passing_top", _check_all_then_top)
    slow = [[(h.id, h.score) for h in db.recall(q, top_k=k, **f)] for q in queries for f in filters for k in (1, 7)]
    assert fast == slow
    assert any(len(hits) == 7 for hits in fast) and all(hits for hits in fast)


def test_recall_context_names_an_option_it_does_not_take(make_db):
    # A typo (max_token=) reached recall() and raised TypeError "recall() got an unexpected
    # keyword argument", naming a function the caller never called.
    db = make_db()
    db.remember("Darcy proposed to Elizabeth at Hunsford.")
    with pytest.raises(ValidationError, match="max_token") as caught:
        db.recall_context("Darcy", max_token=50)
    assert "max_tokens" in caught.value.hint and "min_relevance" in caught.value.hint
    assert db.recall_context("Darcy", max_tokens=50, min_relevance=0.0, hops=False).passages


@pytest.mark.parametrize("loaded", [b"Alice moved to Berlin in May.", 5])
def test_a_source_loader_that_returns_no_text_is_a_validation_error(make_db, loaded):
    # bytes reached the sentence regex (TypeError: cannot use a string pattern on a bytes-like
    # object), an int len() (TypeError: object of type 'int' has no len())
    db = make_db()
    db.remember("Alice moved to Berlin.", source="doc", source_start=0, source_end=20)
    with pytest.raises(ValidationError, match="source_loader returned"):
        db.recall_context("Alice", source_loader=lambda txn, name: loaded)
    assert db.recall_context("Alice", source_loader=lambda txn, name: None).passages[0].text == \
        "Alice moved to Berlin."


def test_changing_a_hits_metadata_does_not_change_later_recalls(make_db):
    # regression: hits shared their metadata dict with the handle's node cache
    db = make_db("own.engram")
    db.add({"id": "a", "content": "hello world", "metadata": {"k": [1], "n": {"m": 1}}})
    hit = db.recall("hello")[0]
    hit.node.metadata["x"] = 1
    hit.node.metadata["k"].append(2)
    hit.node.metadata["n"]["m"] = 2
    assert db.recall("hello")[0].node.metadata == {"k": [1], "n": {"m": 1}}
    assert db.get("a").metadata == {"k": [1], "n": {"m": 1}}


@pytest.mark.parametrize("option", ["hops", "expand_query", "explain", "touch"])
def test_recall_switches_must_be_booleans(make_db, option):
    # taken by truthiness: hops="no" spread the scores, explain="false" explained
    db = make_db()
    db.add("hello world", id="a")
    for value in ("no", "false", 0, None):
        with pytest.raises(ValidationError, match=option):
            db.recall("hello", **{option: value})
        with pytest.raises(ValidationError, match=option):
            db.recall_context("hello", **{option: value})
    import numpy as np

    assert [h.id for h in db.recall("hello", **{option: np.bool_(False)})] == ["a"]


def test_recall_takes_numpy_numbers_for_its_counts_and_floor(make_db):
    # top_k=np.int64(3) (a pandas row's value) was refused: "top_k must be a non-negative integer"
    import numpy as np

    from engramdb.agent import MemoryHooks

    db = make_db()
    db.add("hello world", id="a")
    db.add("hello there", id="b")
    want = [h.id for h in db.recall("hello", top_k=1, min_relevance=0.0)]
    assert [h.id for h in db.recall("hello", top_k=np.int64(1), min_relevance=np.float32(0.0))] == want
    assert db.recall_context("hello", max_tokens=np.int32(50)).text == db.recall_context("hello", max_tokens=50).text
    hooks = MemoryHooks(db, top_k=np.int64(2), min_relevance=np.float64(0.0))
    assert (type(hooks.top_k), type(hooks.min_relevance)) == (int, float)
    for bad in ({"top_k": np.bool_(True)}, {"top_k": np.float64(1.0)}, {"min_relevance": np.bool_(False)}):
        with pytest.raises(ValidationError):
            db.recall("hello", **bad)
