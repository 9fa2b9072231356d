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

import lmdb
import pytest
from conftest import PASSPHRASE, TEST_KDF
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engramdb.engram as engram
from engramdb.errors import CorruptFileError, ForeignFileError
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

def make_raw_short(path) -> None:
    """A plain LMDB file (no engramdb tables) that ends 1,000 pages before its last page and
    whose free list is a two-level tree with a record in overflow pages."""
    env = lmdb.open(str(path), subdir=False, map_size=1 << 28)
    try:
        with env.begin(write=True) as txn:
            for i in range(600):
                txn.put(b"k%05d" % i, bytes([i % 251]) * 1000)
            txn.put(b"big", b"b" * 1500 * PSIZE)
        with env.begin(write=True) as txn:
            txn.delete(b"big")  # a free-list record of 1,500 pages the commits below reclaim from
        for i in range(3):  # until no reader could see it
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
