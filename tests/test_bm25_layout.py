"""Postings keyed segment first (directory version 3, spec/bm25.md "postings"): a commit's
new segment is one contiguous run of keys, so adding documents to a large file writes
pages in proportion to what it adds, not to the file; files keyed term first (versions 1
and 2) are read as they are and converted by the first writable open, answering the same."""
from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engramdb
import engramdb.engram as engram_mod
import engramdb.index.bm25 as bm
from conftest import GOLDEN, PASSPHRASE, TEST_KDF, golden_copy, postings_to_term_first
from engramdb.store import page_owners, pages_written

QUERIES = ["where did alice move", "tea preference", "berlin", "the full original text", "emoji newlines tabs",
           "zzz nothing"]


def _texts(n: int, seed: int) -> list[str]:
    """``n`` documents of 40-80 words drawn from a Zipf-like vocabulary of 30,000 words."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, 30_001)
    lengths = rng.integers(40, 81, size=n)
    picks = rng.choice(30_000, size=int(lengths.sum()), p=weights / weights.sum())
    out, pos = [], 0
    for length in lengths.tolist():
        out.append(" ".join(f"w{i}x" for i in picks[pos:pos + length].tolist()))
        pos += length
    return out


def _bm25(db, queries) -> list[list[tuple[int, float]]]:
    with db._store.read() as txn:
        return [db.indexes.bm25.search(txn, db.indexes.tokenizer(q), 10) for q in queries]


def _directory(db) -> dict:
    with db._store.read() as txn:
        return bm._unpack(txn.get("segments", bm.DIR_KEY))


def _assert_segment_first(db) -> None:
    """Every postings key is u32be(live per-term segment) | a blind listed in that segment's
    terms; a packed segment has its one record and no ``v`` record or postings."""
    with db._store.read() as txn:
        d = bm._Dir.decode(txn.get("segments", bm.DIR_KEY))
        listed = set()
        for segno in d.segs:
            terms = txn.get("segments", bm._seg_key(b"v", segno))
            packed = txn.get("segments", bm._seg_key(bm.PACKED_PREFIX, segno))
            assert (terms is None) == (segno in d.packed) == (packed is not None)
            if terms is not None:
                listed |= {bm._SEG.pack(segno) + terms[i:i + 16] for i in range(0, len(terms), 16)}
        keys = list(txn.keys("postings"))
    assert d.seg_first and set(keys) == listed and (keys or d.packed)


@pytest.mark.parametrize("packed", [True, False])
def test_adding_1000_documents_to_a_20k_file_writes_pages_for_what_it_adds(tmp_path, monkeypatch, packed):
    """A count of pages, not a time: the pages a commit of 1,000 new documents writes (page
    numbers not in use before it; LMDB copies every page it changes). Keyed term first,
    the new segment's ~12,000 blocks landed on every page of the postings table: 1,794 of
    1,845 pages at 20k documents (and about 4,000 at 1M). Segment first they are appended:
    about 250 pages, whatever the file's size; packed (a segment of at most
    SMALL_SEGMENT_DOCS documents is one record), about 110 pages of the segments table."""
    monkeypatch.setattr(bm, "PACK_SMALL", packed)
    path = tmp_path / "w.engram"
    with engram_mod.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add_many([{"id": f"d{i}", "content": t} for i, t in enumerate(_texts(20_000, 1))], now=0.0)
        before_answers = _bm25(db, ["w5x w77x", "w1234x w20x"])
    before = page_owners(str(path))
    tables = {name: sum(1 for owner in before.values() if owner == name) for name in set(before.values())}
    with engram_mod.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add_many([{"id": f"n{i}", "content": t} for i, t in enumerate(_texts(1000, 2))], now=0.0)
        assert _bm25(db, ["w5x w77x", "w1234x w20x"]) != before_answers  # the new documents are found
    written = pages_written(before, page_owners(str(path)))
    assert tables["postings"] > 800  # the file's postings table, for scale (filled in key order)
    if packed:  # the new segment's record (overflow pages), its documents and the directory
        assert written.get("postings", 0) == 0 and written["segments"] <= 160  # 111 measured
    else:
        assert written["postings"] <= 320  # 246 measured; 1,794 keyed term first
        assert written.get("segments", 0) <= 64  # the new segment's records and the directory
    assert written["nodes"] <= 160  # 1,000 records appended in docno order
    # ids are blinded (random) keys: 1,000 of them touch at most ~1,000 leaf pages whatever
    # the file's size; at 20k all of its 343 pages, filled in key order by the bulk ingest,
    # so most split in two (592 written)
    assert written["ids"] <= 2 * tables["ids"] + 16
    assert sum(written.values()) <= 1_200  # 1,041 measured; 2,556 keyed term first



def test_the_golden_file_keyed_term_first_reads_then_converts_and_answers_identically(tmp_path):
    path = golden_copy(tmp_path)
    with engramdb.open(path, passphrase="golden-passphrase", readonly=True) as db:
        assert _directory(db)["v"] == 1
        with db._store.read() as txn:
            assert db.indexes.needs_migration(txn)
        bm25 = _bm25(db, QUERIES)
        recall = [[(h.id, h.score) for h in db.recall(q, top_k=5)] for q in QUERIES]
        assert bm25[0] and recall[0][0][0] == "move-berlin"
    with engramdb.open(path, passphrase="golden-passphrase") as db:  # writable: converts
        assert _directory(db)["v"] == 3
        _assert_segment_first(db)
        assert _bm25(db, QUERIES) == bm25  # bit-identical scores
        assert [[(h.id, h.score) for h in db.recall(q, top_k=5)] for q in QUERIES] == recall
        assert db.verify() == []
        buf = io.StringIO()
        db.dump(buf)
    assert buf.getvalue() == (GOLDEN / "store-v1.aaak").read_text(encoding="utf-8")
    with engramdb.open(path, passphrase="golden-passphrase") as db:  # nothing left to convert
        with db._store.read() as txn:
            assert not db.indexes.needs_migration(txn)
        db.add("a new memory in the converted file", id="new")
        assert db.recall("new memory converted", top_k=1)[0].id == "new"
        _assert_segment_first(db)
        assert db.verify() == []


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31), batches=st.lists(st.integers(1, 40), min_size=1, max_size=5),
       deletes=st.integers(0, 30))
def test_a_term_first_file_answers_the_same_read_written_and_converted(tmp_path_factory, seed, batches, deletes):
    """A file downgraded to the term-first layout answers bit-identically read-only, keeps
    its layout through writes made without the conversion (a repair open), and after the
    conversion of a writable open still answers what a rebuilt index answers."""
    path = tmp_path_factory.mktemp("tf") / "tf.engram"
    texts = _texts(sum(batches) + 20, seed)
    queries = [" ".join(t.split()[:3]) for t in texts[::7]][:12]
    with engram_mod.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        at = 0
        for size in batches:
            db.add_many([{"id": f"d{i}", "content": texts[i]} for i in range(at, at + size)], now=0.0)
            at += size
        if deletes:
            db.delete_many([f"d{i}" for i in range(0, at, max(1, at // deletes))])
        expected = _bm25(db, queries)
        db._store.write(postings_to_term_first)
        assert _directory(db)["v"] == 2
        assert _bm25(db, queries) == expected  # the same handle, its cache kept
    with engramdb.open(path, passphrase=PASSPHRASE, readonly=True) as db:
        assert _bm25(db, queries) == expected
    with engramdb.open(path, passphrase=PASSPHRASE, repair=True) as db:  # no conversion: writes keep the layout
        db.add_many([{"id": f"e{i}", "content": t} for i, t in enumerate(texts[at:at + 20])], now=0.0)
        db.delete("e0")
        assert _directory(db)["v"] == 2
        expected = _bm25(db, queries)
        assert db.verify() == []
    with engramdb.open(path, passphrase=PASSPHRASE) as db:
        assert _directory(db)["v"] == 3
        _assert_segment_first(db)
        assert _bm25(db, queries) == expected
        assert db.verify() == []
        db.merge_indexes(force=True)  # merging converted segments: the same answers
        assert _bm25(db, queries) == expected
        _assert_segment_first(db)


def test_an_unknown_directory_version_is_a_clear_error():
    data = bm._pack({"v": 5, "epoch": 0, "next": 1, "n": 0, "len": 0, "segs": [], "runs": []})
    with pytest.raises(engramdb.EngramError, match="unknown version") as info:
        bm._Dir.decode(data)
    assert "upgrade" in info.value.hint
