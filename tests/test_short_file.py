"""A file shorter than its last page (spec/file-format.md, "A file shorter than its last page").

LMDB does not keep the data file as long as its last page number: pages a write transaction
allocates and frees again before it commits are listed free and never written. The open used
to refuse such a file as truncated (its user's data locked out); it now walks the free list
(store.check_file_end) and refuses only a file that lacks a page in use.

The short file is made for real by LMDB, not a binary fixture: an engramdb commit that adds a
memory also stores, in LMDB's main table, a value too large for any run of pages it reclaims
from the free list (so LMDB allocates it at the end of the file) and deletes it again (its
dirty overflow pages go back to LMDB's reclaimed list, which the commit saves to the free list,
and are never written). The main table is left as it was.
"""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys

import lmdb
import pytest
from conftest import PASSPHRASE, TEST_KDF
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engramdb.engram as engram
from engramdb import store
from engramdb.errors import BusyError, CorruptFileError, ForeignFileError
from engramdb.store import check_file_end, structural_problems

PSIZE = 4096
TEXTS = {f"id{i}": f"memory number {i} about the {'river' if i % 2 else 'mountain'} trip" for i in range(40)}


def lmdb_frontier(path) -> tuple[int, int]:
    """(last page number, file size) as the old check saw them (it refused when the file
    was shorter than (last page number + 1) * page size)."""
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    try:
        return env.info()["last_pgno"], os.path.getsize(path)
    finally:
        env.close()


def make_short(path, texts) -> int:
    """Leave the closed file ``path`` shorter than its last page, adding ``texts`` in the same
    commit (an engramdb commit, so the sealed state names it); returns the number of pages
    missing."""
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db, db._store.transaction() as txn:
        ltxn = txn._lt
        # the leaf this put touches is a page LMDB takes from the free list: from then on
        # the transaction has a reclaimed list, and freed dirty pages go back to it
        ltxn.put(b"short-file-test", b"\x00" * 256 * PSIZE)  # no free run that long: new pages
        ltxn.delete(b"short-file-test")  # the main table as it was
        for id_, text in texts.items():
            db.add(text, id=id_, now=1.0)
    last_pgno, size = lmdb_frontier(path)
    return last_pgno + 1 - size // PSIZE


def write_memories(path, texts) -> None:
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        for id_, text in texts.items():
            db.add(text, id=id_, now=1.0)  # one commit each: the free list has records to reclaim


def assert_memories(db, texts) -> None:
    assert sorted(db.ids()) == sorted(texts)
    for id_, text in texts.items():
        assert db.get(id_).content == text


@pytest.fixture(scope="module")
def short_file(tmp_path_factory):
    """A closed file holding TEXTS whose last pages are free and not in the file."""
    path = tmp_path_factory.mktemp("short") / "short.engram"
    write_memories(path, dict(list(TEXTS.items())[:-1]))
    assert make_short(path, dict(list(TEXTS.items())[-1:])) >= 200  # the deleted value's 257 pages, less the few the commit reused
    return path


@pytest.fixture
def short_copy(short_file, tmp_path):
    path = tmp_path / "s.engram"
    shutil.copyfile(short_file, path)
    return path


def test_short_file_opens_and_stays_usable(short_copy):
    path = short_copy
    last_pgno, size = lmdb_frontier(path)
    assert (last_pgno + 1) * PSIZE > size  # what the old check refused
    assert structural_problems(str(path)) == []  # LMDB's offline verifier: a sound file
    check_file_end(str(path))
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        assert_memories(db, TEXTS)
        assert db.verify() == []
        db.add("written after the short open", id="later", now=2.0)
        for i in range(40):  # enough commits to reuse free pages, some of them past the end
            db.add(f"more {i} " * 200, id=f"more{i}", now=2.0)
    texts = dict(TEXTS, later="written after the short open", **{f"more{i}": f"more {i} " * 200 for i in range(40)})
    for readonly in (False, True):  # a clean close: this open trusts the file and only checks its end
        with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF, readonly=readonly) as db:
            assert_memories(db, texts)
            assert db.verify() == []


def test_open_leaves_a_short_file_as_it_is(short_copy):
    before = os.path.getsize(short_copy)
    for readonly in (False, True):
        with engram.open(short_copy, passphrase=PASSPHRASE, kdf=TEST_KDF, readonly=readonly) as db:
            assert_memories(db, TEXTS)
        assert os.path.getsize(short_copy) == before


def test_a_file_cut_by_a_page_is_refused(tmp_path):
    path = tmp_path / "t.engram"
    write_memories(path, {"a": "alpha", "b": "beta"})
    size = os.path.getsize(path)
    for cut in (PSIZE, 2 * PSIZE, PSIZE // 2):
        damaged = tmp_path / f"cut{cut}.engram"
        shutil.copyfile(path, damaged)
        os.truncate(damaged, size - cut)
        with pytest.raises(CorruptFileError, match="truncated"):
            check_file_end(str(damaged))
        with pytest.raises(CorruptFileError):
            engram.open(damaged, passphrase=PASSPHRASE, kdf=TEST_KDF)


def free_root(path) -> int:
    with open(path, "rb") as fh:
        metas = []
        for n in (0, 1):
            fh.seek(n * PSIZE + 16 + 24 + 40)  # page header, mm_magic..mm_mapsize, MDB_db's md_root
            root = struct.unpack("<Q", fh.read(8))[0]
            fh.seek(n * PSIZE + 144)
            metas.append((struct.unpack("<Q", fh.read(8))[0], root))
    return max(metas)[1]


def test_short_file_cut_through_used_pages_is_refused(short_copy, tmp_path):
    """Every cut that removes a page in use is refused (the free list's own pages are the last
    ones LMDB wrote, so a cut through used pages removes them first), every other one opens;
    the meta pages stay intact (the slow path)."""
    size = os.path.getsize(short_copy)
    root = free_root(short_copy)
    refused = 0
    for pages in range(2, size // PSIZE):
        damaged = tmp_path / f"cut{pages}.engram"
        shutil.copyfile(short_copy, damaged)
        os.truncate(damaged, pages * PSIZE)
        problems = structural_problems(str(damaged))
        if not problems:  # every page cut was free: still a sound file
            check_file_end(str(damaged))
            continue
        with pytest.raises(CorruptFileError, match="truncated") as exc:
            check_file_end(str(damaged))
        refused += 1
        if pages <= root:
            assert f"page {root} of the free-page list is missing" in str(exc.value)
        os.remove(damaged)
    assert refused >= 3


def free_records(path):
    """(file offset, size) of each IDL of the file's free list (a one-page tree here)."""
    root = free_root(path)
    with open(path, "rb") as fh:
        fh.seek(root * PSIZE)
        page = fh.read(PSIZE)
    flags, lower = struct.unpack_from("<HH", page, 10)
    assert flags & 0x02  # a leaf: the file's free list fits one page
    for ptr in range(16, lower, 2):
        node = struct.unpack_from("<H", page, ptr)[0]
        lo, hi, node_flags, ksize = struct.unpack_from("<HHHH", page, node)
        start = root * PSIZE + node + 8 + ksize
        if node_flags & 0x01:  # F_BIGDATA: the IDL starts after the first overflow page's header
            start = struct.unpack_from("<Q", page, node + 8 + ksize)[0] * PSIZE + 16
        yield start, lo | hi << 16


def test_a_missing_page_the_free_list_does_not_list_is_refused(short_copy):
    """The free list intact and in the file, but one of the missing pages not listed free:
    a page in use is missing."""
    last_pgno, _ = lmdb_frontier(short_copy)
    with open(short_copy, "r+b") as fh:
        for start, size in free_records(short_copy):
            fh.seek(start)
            ids = list(struct.unpack(f"<{size // 8}Q", fh.read(size)))
            if last_pgno in ids[1:ids[0] + 1]:
                ids[ids.index(last_pgno, 1)] = 2  # page 2 listed instead (it is in the file)
                fh.seek(start)
                fh.write(struct.pack(f"<{size // 8}Q", *ids))
                break
        else:
            raise AssertionError("no free-list record lists the last page")
    with pytest.raises(CorruptFileError, match=f"truncated.*page {last_pgno} is in use"):
        check_file_end(str(short_copy))


def test_a_damaged_free_list_is_refused_as_corrupt(short_copy):
    root = free_root(short_copy)
    with open(short_copy, "r+b") as fh:
        fh.seek(root * PSIZE + 10)
        fh.write(struct.pack("<H", 0x10))  # the root's flags: P_META, not a B-tree page
    with pytest.raises(CorruptFileError, match="free-page list is damaged"):
        check_file_end(str(short_copy))
    with pytest.raises(CorruptFileError):
        engram.open(short_copy, passphrase=PASSPHRASE, kdf=TEST_KDF)


@pytest.mark.parametrize("ids", [(1, 1 << 40), (1, 1), (1 << 40,)], ids=["page past the end", "a meta page",
                                                                         "count too large"])
def test_a_free_list_record_out_of_range_is_refused(short_copy, ids):
    start, _ = next(free_records(short_copy))
    with open(short_copy, "r+b") as fh:
        fh.seek(start)
        fh.write(struct.pack(f"<{len(ids)}Q", *ids))
    with pytest.raises(CorruptFileError, match="free-page list is damaged"):
        check_file_end(str(short_copy))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.integers(min_value=0, max_value=1 << 20))
def test_any_cut_opens_with_all_data_or_is_refused(short_file, tmp_path, at):
    """Any truncation of the short file: it opens with every memory intact, or the open raises
    CorruptFileError / ForeignFileError; never another exception (nor a SIGBUS, which would
    kill the test process). The precise check agrees with LMDB's offline verifier."""
    cut = os.path.getsize(short_file) * at >> 20  # any byte offset, page-aligned or not
    path = tmp_path / f"cut{cut}.engram"
    shutil.copyfile(short_file, path)
    os.truncate(path, cut)
    try:
        if cut >= 2 * PSIZE:
            sound = structural_problems(str(path)) == []
            try:
                check_file_end(str(path))
                assert sound
            except CorruptFileError:
                assert not sound
        try:
            db = engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF)
        except (CorruptFileError, ForeignFileError):
            return
        with db:
            assert_memories(db, TEXTS)
            assert db.verify() == []
    finally:
        for suffix in ("", "-lock", "-maint"):
            if os.path.exists(f"{path}{suffix}"):
                os.remove(f"{path}{suffix}")


# --- a large free list (branch pages, an IDL in overflow pages), raw LMDB -------------------

def make_raw_short(path, ticks=3) -> None:
    """A plain LMDB file (no engramdb tables) that ends 1,000 pages before its last page and
    whose free list is a two-level tree with a record in overflow pages (its newest meta is
    meta page 0; one more tick: meta page 1)."""
    env = lmdb.open(str(path), subdir=False, map_size=1 << 28)
    try:
        with env.begin(write=True) as txn:
            for i in range(600):
                txn.put(b"k%05d" % i, bytes([i % 251]) * 1000)
            txn.put(b"big", b"b" * 1500 * PSIZE)
        with env.begin(write=True) as txn:
            txn.delete(b"big")  # a free-list record of 1,500 pages the commits below reclaim from
        for i in range(ticks):  # until no reader could see it
            with env.begin(write=True) as txn:
                txn.put(b"tick", b"%d" % i)
        reader = env.begin()  # keeps the records of the next commits in the free list: many leaves
        try:
            for i in range(150):
                with env.begin(write=True) as txn:
                    txn.delete(b"k%05d" % i)
            with env.begin(write=True) as txn:
                # reclaims from the big record (1,000 pages: longer than what is left of it)
                txn.put(b"short", b"\0" * 1000 * PSIZE)
                txn.delete(b"short")
        finally:
            reader.abort()
    finally:
        env.close()


def free_tree(path) -> tuple[int, int, int]:
    """(root, depth, overflow pages) of the committed meta's free tree."""
    with open(path, "rb") as fh:
        head = fh.read(2 * PSIZE)
    metas = [(struct.unpack_from("<Q", head, n * PSIZE + 144)[0],
              struct.unpack_from("<HQQQQQ", head, n * PSIZE + 46)) for n in (0, 1)]
    depth, _branch, _leaf, overflow, _entries, root = max(metas)[1]
    return root, depth, overflow


@pytest.fixture(scope="module")
def raw_short(tmp_path_factory):
    path = tmp_path_factory.mktemp("raw") / "raw.mdb"
    make_raw_short(path)
    last_pgno, size = lmdb_frontier(path)
    assert last_pgno + 1 - size // PSIZE >= 900
    _, depth, overflow = free_tree(path)
    assert depth >= 2 and overflow >= 2  # branch pages, and an IDL in overflow pages
    return path


@pytest.fixture
def raw_copy(raw_short, tmp_path):
    path = tmp_path / "r.mdb"
    shutil.copyfile(raw_short, path)
    return path


def test_a_large_free_list_is_walked(raw_copy):
    assert structural_problems(str(raw_copy)) == []
    check_file_end(str(raw_copy))
    env = lmdb.open(str(raw_copy), subdir=False, map_size=1 << 28)
    try:
        with env.begin(write=True) as txn:
            txn.put(b"after", b"a" * 3 * PSIZE)
        with env.begin() as txn:
            assert [key for key, _ in txn.cursor()] == [b"after"] + [b"k%05d" % i for i in range(150, 600)] \
                + [b"tick"]
            assert txn.get(b"k00599") == bytes([599 % 251]) * 1000
    finally:
        env.close()
    check_file_end(str(raw_copy))
    assert structural_problems(str(raw_copy)) == []


def overflow_page_of_free_list(path) -> int:
    """The first overflow page of a free-list record (one of the root's leaves holds it)."""
    root, _, _ = free_tree(path)
    with open(path, "rb") as fh:
        fh.seek(root * PSIZE)
        page = fh.read(PSIZE)
        lower = struct.unpack_from("<H", page, 12)[0]
        for ptr in range(16, lower, 2):
            lo, hi, flags = struct.unpack_from("<HHH", page, struct.unpack_from("<H", page, ptr)[0])
            fh.seek((lo | hi << 16 | flags << 32) * PSIZE)
            leaf = fh.read(PSIZE)
            for leaf_ptr in range(16, struct.unpack_from("<H", leaf, 12)[0], 2):
                node = struct.unpack_from("<H", leaf, leaf_ptr)[0]
                if struct.unpack_from("<H", leaf, node + 4)[0] & 0x01:
                    return struct.unpack_from("<Q", leaf, node + 16)[0]
    raise AssertionError("no free-list record in overflow pages")


def test_a_cut_through_the_free_list_is_refused(raw_copy, tmp_path):
    root, _, _ = free_tree(raw_copy)
    for page in (root, overflow_page_of_free_list(raw_copy)):
        cut = tmp_path / f"cut{page}.mdb"
        shutil.copyfile(raw_copy, cut)
        os.truncate(cut, page * PSIZE + PSIZE // 2)  # the page only partly in the file
        with pytest.raises(CorruptFileError, match=r"truncated.*of the free-page list is missing"):
            check_file_end(str(cut))
        assert structural_problems(str(cut)) != []


@pytest.mark.parametrize("child", ["itself", "a meta page", "past the last page"])
def test_a_damaged_branch_of_the_free_list_is_refused(raw_copy, child):
    root, _, _ = free_tree(raw_copy)
    last_pgno, _ = lmdb_frontier(raw_copy)
    target = {"itself": root, "a meta page": 1, "past the last page": last_pgno + 5}[child]
    with open(raw_copy, "r+b") as fh:
        fh.seek(root * PSIZE)
        page = bytearray(fh.read(PSIZE))
        node = struct.unpack_from("<H", page, 16)[0]
        struct.pack_into("<HHH", page, node, target & 0xFFFF, target >> 16 & 0xFFFF, target >> 32)
        fh.seek(root * PSIZE)
        fh.write(page)
    with pytest.raises(CorruptFileError, match="free-page list is damaged"):
        check_file_end(str(raw_copy))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.integers(min_value=0, max_value=1 << 20))
def test_the_check_agrees_with_lmdbs_verifier_at_any_cut(raw_short, tmp_path, at):
    """Cut anywhere after the meta pages, the file passes the precise check exactly when
    LMDB's offline verifier finds nothing wrong (it treats a missing page as legal only when
    it is free)."""
    cut = 2 * PSIZE + ((os.path.getsize(raw_short) - 2 * PSIZE) * at >> 20)
    path = tmp_path / f"cut{cut}.mdb"
    shutil.copyfile(raw_short, path)
    os.truncate(path, cut)
    sound = structural_problems(str(path)) == []
    try:
        check_file_end(str(path))
        assert sound
    except CorruptFileError:
        assert not sound
    finally:
        os.remove(path)


@pytest.mark.parametrize("size", [PSIZE, PSIZE + 200, 2 * PSIZE - 1])
def test_a_file_cut_inside_its_second_meta_page_is_reported_truncated(short_copy, size):
    """LMDB itself calls it "not an LMDB file" (its read of meta page 1 comes up short)."""
    os.truncate(short_copy, size)
    with pytest.raises(CorruptFileError, match="truncated: its second meta page is missing"):
        engram.open(short_copy, passphrase=PASSPHRASE, kdf=TEST_KDF)


# --- review fixes: the meta pages, a damaged overflow record, a race with another process ----

META_LEN = 152  # the page header and MDB_meta up to mm_txnid


def newest_meta(path) -> int:
    with open(path, "rb") as fh:
        head = fh.read(2 * PSIZE)
    return int(struct.unpack_from("<Q", head, 144)[0] < struct.unpack_from("<Q", head, PSIZE + 144)[0])


def test_a_file_whose_newest_meta_is_meta_page_1(tmp_path):
    """One more commit: the committed meta is meta page 1, whose last page is 1,000 pages
    past the one meta page 0 gives. Cut page by page from the end, the first cut refused is
    the first LMDB's verifier finds unsound (meta page 0 would accept cuts it refuses)."""
    path = tmp_path / "m1.mdb"
    make_raw_short(path, ticks=4)
    assert newest_meta(path) == 1
    _, depth, overflow = free_tree(path)
    assert depth >= 2 and overflow >= 2
    assert structural_problems(str(path)) == []
    check_file_end(str(path))
    whole = tmp_path / "whole.mdb"
    shutil.copyfile(path, whole)
    for pages in range(os.path.getsize(path) // PSIZE - 1, 1, -1):
        os.truncate(path, pages * PSIZE)
        try:
            check_file_end(str(path))
        except CorruptFileError as exc:
            assert "of the free-page list is missing" in str(exc)
            break
    else:
        raise AssertionError("no cut refused")
    assert structural_problems(str(path)) != []
    os.truncate(whole, (pages + 1) * PSIZE)  # one page longer: sound
    assert structural_problems(str(whole)) == []


def torn(page: bytes) -> bytes:
    """A meta page read while a commit rewrote it: a new txnid over old fields, here a last
    page number below the end of any file (it would end the check at once: nothing missing)."""
    return page[:136] + struct.pack("<QQ", 2, struct.unpack_from("<Q", page, 144)[0] + 1) + page[152:]


def tear_meta_reads(monkeypatch, path, tear) -> None:
    """os.pread as store sees it, returning a torn meta page on the reads ``tear`` picks."""
    real = os.pread
    reads = iter(range(1 << 30))

    def pread(fd, n, offset):
        data = real(fd, n, offset)
        if offset in (0, PSIZE) and n >= META_LEN and offset // PSIZE == newest_meta(path) and tear(next(reads)):
            return torn(data)
        return data

    monkeypatch.setattr(store.os, "pread", pread)


def cut_short(short_copy) -> None:
    """The short file cut by a page it uses: refused."""
    os.truncate(short_copy, os.path.getsize(short_copy) - PSIZE)
    with pytest.raises(CorruptFileError, match="truncated"):
        check_file_end(str(short_copy))


def test_a_torn_meta_read_is_read_again(short_copy, monkeypatch):
    cut_short(short_copy)
    tear_meta_reads(monkeypatch, short_copy, lambda n: n == 0)
    with pytest.raises(CorruptFileError, match="truncated"):
        check_file_end(str(short_copy))


def test_meta_reads_that_never_agree_are_not_trusted(short_copy, monkeypatch):
    cut_short(short_copy)
    tear_meta_reads(monkeypatch, short_copy, lambda n: n % 2 == 0)
    with pytest.raises(BusyError, match="meta pages kept changing"):
        check_file_end(str(short_copy))


def test_a_meta_older_than_the_pinned_snapshot_is_not_trusted(short_copy):
    """The committed meta cannot be older than a read transaction the caller holds."""
    with open(short_copy, "rb") as fh:
        head = fh.read(2 * PSIZE)
    txnid = max(struct.unpack_from("<Q", head, n * PSIZE + 144)[0] for n in (0, 1))
    check_file_end(str(short_copy), pinned=txnid)
    with pytest.raises(BusyError):
        check_file_end(str(short_copy), pinned=txnid + 1)


@pytest.mark.parametrize("field", ["magic", "flags", "version"])
@pytest.mark.parametrize("page", [0, 1])
def test_both_meta_pages_are_checked(short_copy, page, field):
    offset, value = {"magic": (16, b"\0\0\0\0"), "flags": (10, b"\x02\0"), "version": (20, b"\x07\0\0\0")}[field]
    with open(short_copy, "r+b") as fh:
        fh.seek(page * PSIZE + offset)
        fh.write(value)
    with pytest.raises(CorruptFileError, match=f"meta page {page} "):
        check_file_end(str(short_copy))


def overflow_record_node(path) -> tuple[int, int]:
    """(file offset of the leaf node, first overflow page) of a free-list record in overflow pages."""
    root, _, _ = free_tree(path)
    with open(path, "rb") as fh:
        fh.seek(root * PSIZE)
        page = fh.read(PSIZE)
        for ptr in range(16, struct.unpack_from("<H", page, 12)[0], 2):
            lo, hi, flags = struct.unpack_from("<HHH", page, struct.unpack_from("<H", page, ptr)[0])
            leaf_pg = lo | hi << 16 | flags << 32
            fh.seek(leaf_pg * PSIZE)
            leaf = fh.read(PSIZE)
            for leaf_ptr in range(16, struct.unpack_from("<H", leaf, 12)[0], 2):
                node = struct.unpack_from("<H", leaf, leaf_ptr)[0]
                if struct.unpack_from("<H", leaf, node + 4)[0] & 0x01:
                    return leaf_pg * PSIZE + node, struct.unpack_from("<Q", leaf, node + 16)[0]
    raise AssertionError("no free-list record in overflow pages")


@pytest.mark.parametrize("size", ["up to the last page", "4 GiB"])
def test_an_overflow_record_larger_than_lmdb_writes_is_damaged(raw_copy, size):
    """Its pages would be read (allocated) before anything else is checked, and pages past
    the end of the file would make it "truncated"."""
    node, first = overflow_record_node(raw_copy)
    last_pgno, _ = lmdb_frontier(raw_copy)
    value = {"up to the last page": (last_pgno + 1 - first) * PSIZE - 16, "4 GiB": (1 << 32) - 8}[size]
    with open(raw_copy, "r+b") as fh:
        fh.seek(node)
        fh.write(struct.pack("<HH", value & 0xFFFF, value >> 16))
    with pytest.raises(CorruptFileError, match=f"free-page list is damaged .*is {value} bytes long"):
        check_file_end(str(raw_copy))


COMMIT = """
import sys
import engramdb.engram as engram
from engramdb.crypto import KDFParams
with engram.open(sys.argv[1], passphrase=sys.argv[2], kdf=KDFParams.for_tests()) as db, db._store.transaction() as txn:
    txn._lt.put(b"race", b"\\0" * 300 * 4096)  # a new last page, the main table as it was
    txn._lt.delete(b"race")
    db.add("added by another process", id=sys.argv[3], now=3.0)
"""


def commit_before_the_walk(monkeypatch, path, id_="raced") -> list[tuple[int, int]]:
    """Another process commits between the meta read and the first walk of the free list;
    returns (last page, txnid of the meta) of each walk."""
    walks: list[tuple[int, int]] = []
    real_walk, real_meta = store._free_pages_past, store._committed_meta
    metas: list[int] = []

    def meta(fd, pinned):
        found = real_meta(fd, pinned)
        metas.append(found[1])
        return found

    def walk(fd, psize, last_pg, root, have):
        walks.append((last_pg, metas[-1]))
        if len(walks) == 1:
            subprocess.run([sys.executable, "-c", COMMIT, str(path), PASSPHRASE, id_], check=True, timeout=120)
        return real_walk(fd, psize, last_pg, root, have)

    monkeypatch.setattr(store, "_committed_meta", meta)
    monkeypatch.setattr(store, "_free_pages_past", walk)
    return walks


def test_a_commit_during_the_check_is_read_again(short_copy, monkeypatch):
    walks = commit_before_the_walk(monkeypatch, short_copy)
    check_file_end(str(short_copy))
    assert len(walks) == 2 and walks[1][1] > walks[0][1] and walks[1][0] > walks[0][0]
    assert structural_problems(str(short_copy)) == []


def test_a_commit_during_the_open_check_is_read_again(short_copy, monkeypatch):
    """The open holds a read transaction (the pin) while it checks: the walked meta is never
    older than it, and the commit in between is walked again; every memory is there."""
    walks = commit_before_the_walk(monkeypatch, short_copy)
    pins: list[int] = []
    real_check = store.check_file_end

    def check(path, *, pinned=0):
        pins.append(pinned)
        real_check(path, pinned=pinned)

    monkeypatch.setattr(store, "check_file_end", check)
    with engram.open(short_copy, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        assert_memories(db, dict(TEXTS, raced="added by another process"))
        assert db.verify() == []
    assert len(pins) == 1 and pins[0] > 0
    assert len(walks) == 2 and walks[0][1] == pins[0] and walks[1][1] > pins[0] and walks[1][0] > walks[0][0]


def test_a_walk_that_fails_after_a_commit_is_read_again_unless_pinned(short_copy, monkeypatch):
    """Without a pin a commit may reuse the free-list pages being read: a walk that finds them
    damaged, with a newer meta behind it, is walked again; with a pin, what it finds stands."""
    real_walk = store._free_pages_past
    for pinned, id_ in ((0, "raced"), (1, "raced again")):
        monkeypatch.setattr(store, "_free_pages_past", real_walk)
        walks = commit_before_the_walk(monkeypatch, short_copy, id_)

        def walk_damaged_first(*args, walks=walks, committing_walk=store._free_pages_past):
            found = committing_walk(*args)
            if len(walks) == 1:
                raise store._Damaged("a page reused by the commit")
            return found

        monkeypatch.setattr(store, "_free_pages_past", walk_damaged_first)
        if pinned:
            with pytest.raises(CorruptFileError, match="a page reused by the commit"):
                check_file_end(str(short_copy), pinned=pinned)
            assert len(walks) == 1
        else:
            check_file_end(str(short_copy))
            assert len(walks) == 2


def test_a_meta_that_changes_at_every_read_is_busy_unless_pinned(short_copy, monkeypatch):
    real_meta = store._committed_meta
    txnids = iter(range(10**6, 2 * 10**6))
    monkeypatch.setattr(store, "_committed_meta", lambda fd, pinned: real_meta(fd, pinned)[:1] + (next(txnids),)
                        + real_meta(fd, pinned)[2:])
    with pytest.raises(BusyError, match="kept committing"):
        check_file_end(str(short_copy))
    check_file_end(str(short_copy), pinned=1)  # the pinned snapshot's free list stays as it is
