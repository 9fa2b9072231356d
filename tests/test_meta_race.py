"""A real concurrent writer against the open's meta-page check (store.check_file_end).

tests/test_short_file.py tears a meta read by patching os.pread. Here one process commits
in a tight loop, each commit leaving the file shorter than its last page (so every open
walks the free list, spec/file-format.md "A file shorter than its last page"), while this
process opens and reads the file, and checks its end, over and over. Every open must
either succeed and show a whole committed state (the memories of the first n commits,
never fewer than an earlier open saw) or fail with the documented BusyError; a check of
the end must pass or raise BusyError (the file is sound: "truncated" or "damaged" is a
false alarm). The iterations are counted, not timed.
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.sharedctypes
import multiprocessing.synchronize
import os
import time

import engramdb.engram as engram
from engramdb import store
from engramdb.errors import BusyError

COMMITS = 120
READS = 1000  # at most; the reads stop once the writer is done
PSIZE = 4096
META_READS = 20  # raw meta reads per iteration (a few microseconds each)


def _text(i: int) -> str:
    return f"memory {i} written by the other process"


def _write(path: str, started: multiprocessing.synchronize.Event, reads: multiprocessing.sharedctypes.Synchronized) -> None:
    """COMMITS commits, each adding memory ``m{i}`` and leaving pages past the end of the file
    that LMDB lists free but never writes (a value allocated at the end and deleted again).
    Commit i waits for the reader's (i // 2)-th read, however loaded the machine, so the
    reads overlap the commits; otherwise the commits come back to back."""
    with engram.open(path, encrypted=False) as db:
        for i in range(COMMITS):
            for _ in range(60_000):  # a bound on the wait, should the reader be gone
                if reads.value >= i // 2:
                    break
                time.sleep(0.001)
            with db._store.transaction() as txn:
                # a run no free record holds (it grows): new pages at the end, never written
                txn._lt.put(b"meta-race", b"\0" * (64 + i) * PSIZE)
                txn._lt.delete(b"meta-race")
                db.add(_text(i), id=f"m{i}", now=1.0)
            started.set()


def _committed(db: engram.Engram, seen: int) -> int:
    """The number of commits ``db`` shows, checking that it shows exactly their memories."""
    ids = set(db.ids())
    n = len(ids)
    assert ids == {f"m{i}" for i in range(n)}, "not the memories of a prefix of the commits"
    assert n >= seen, f"an open saw {n} commits after an earlier one saw {seen}"
    if n:
        assert db.get(f"m{n - 1}").content == _text(n - 1)
    return n


def _meta_reads(fd: int, metas: dict[int, tuple[int, int, int, int]]) -> dict[int, tuple[int, int, int, int]]:
    """Read the committed meta a few times: the commit id never goes back, and one commit id
    always comes with the same meta (a torn read that slipped through would not)."""
    for _ in range(META_READS):
        try:
            meta = store._committed_meta(fd, 0)
        except BusyError:
            continue
        assert metas.setdefault(meta[1], meta) == meta, "one commit id, two metas"
        assert meta[1] == max(metas), "the commit id went back"
    return metas


def test_opens_during_a_writers_commits_see_a_whole_state_or_are_busy(tmp_path, monkeypatch):
    path = str(tmp_path / "race.engram")
    with engram.open(path, encrypted=False):
        pass
    ctx = multiprocessing.get_context("spawn")  # no fork of this process's open files and threads
    started, reads = ctx.Event(), ctx.Value("i", 0)
    writer = ctx.Process(target=_write, args=(path, started, reads))
    walks = []
    real_walk = store._free_pages_past

    def walk(*args):
        walks.append(args[2])
        return real_walk(*args)

    monkeypatch.setattr(store, "_free_pages_past", walk)
    writer.start()
    seen = opened = busy = checked = iterations = 0
    metas: dict[int, tuple[int, int, int, int]] = {}
    fd = os.open(path, os.O_RDONLY)
    try:
        assert started.wait(120), "the writer did not commit"
        while iterations < READS and writer.is_alive():
            iterations += 1
            metas = _meta_reads(fd, metas)
            try:
                store.check_file_end(path)  # unpinned: the meta may change under the walk
                checked += 1
            except BusyError:
                busy += 1
            try:
                with engram.open(path, encrypted=False, readonly=True) as db:
                    seen = _committed(db, seen)
                    opened += 1
            except BusyError:
                busy += 1
            with reads.get_lock():
                reads.value += 1
    finally:
        os.close(fd)
        reads.value = COMMITS  # a failed read lets the writer finish at once
        writer.join(120)
    assert writer.exitcode == 0
    # the reads overlapped the commits, and walked free lists of files the writer left short
    assert iterations >= (COMMITS - 1) // 2 and walks
    with engram.open(path, encrypted=False) as db:
        assert _committed(db, seen) == COMMITS
        assert db.verify() == []
    # BusyError is the rare case (five meta reads, three walks, all overtaken by commits)
    assert opened >= iterations // 2 and checked >= iterations // 2
    print(f"reads {iterations}: opens {opened}, checks {checked}, busy {busy}, walks {len(walks)}")
