"""Power loss between the data pages and the meta page (reliability test plan T2.1, TH3's
snapshots). LMDB writes a commit's pages copy-on-write into pages the previous snapshot
does not use, fsyncs them, and only then writes the meta page. A power loss before the
meta write may therefore leave any subset of the new pages on disk under the old meta
pages. Every such file must open as exactly the previous commit: same memories, same
recall, verify clean. SIGKILL cannot produce these files (the page cache survives it), so
they are built from snapshots taken after each commit."""
from __future__ import annotations

import os
import random

from conftest import PASSPHRASE, TEST_KDF

import engramdb.engram as engram
from engramdb.errors import EngramError

PAGE = 4096


def _logical(path) -> tuple:
    with engram.open(path, passphrase=PASSPHRASE) as db:
        assert db.verify() == []
        nodes = tuple(sorted((n.id, n.content, n.tags) for n in db.scan()))
        recall = tuple(h.id for h in db.recall("alpha beta", top_k=5, hops=False))
    return nodes, recall


def _clear_sidecars(path) -> None:
    for suffix in ("-lock", "-maint"):
        if os.path.exists(str(path) + suffix):
            os.unlink(str(path) + suffix)


def _snapshots(tmp_path, rnd: random.Random) -> list[bytes]:
    """The file's bytes after each of 13 commits."""
    path = tmp_path / "p.engram"
    snapshots = []
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("alpha beta first", id="first", now=1.0)
        for step in range(12):
            snapshots.append(path.read_bytes())
            _commit(db, rnd, step)
        snapshots.append(path.read_bytes())
    return snapshots


def _commit(db, rnd: random.Random, step: int) -> None:
    """One commit (the model holds between consecutive commits only: a second one may
    reuse pages the first freed, which the snapshot before both still used)."""
    with db.transaction() as tx:
        for i in range(rnd.randint(1, 8)):
            tx.add(id=f"s{step}-{i}", content=f"alpha {rnd.choice(['beta', 'gamma', 'delta'])} {step} {i} "
                   + "x" * rnd.randint(0, 3000), tags=[str(step)], now=1.0)
        if step % 3 == 2:
            tx.delete(f"s{step - 1}-0")
        if step % 4 == 3:
            tx.update("first", content=f"alpha beta rewritten {step}")


def test_any_subset_of_a_commits_pages_under_the_old_meta_is_the_old_commit(tmp_path):
    rnd = random.Random(20261201)
    snapshots = _snapshots(tmp_path, rnd)
    hybrid = tmp_path / "h.engram"
    checked = 0
    for k in range(len(snapshots) - 1):
        old, new = snapshots[k], snapshots[k + 1]
        (tmp_path / "old.engram").write_bytes(old)
        expected = _logical(tmp_path / "old.engram")
        _clear_sidecars(tmp_path / "old.engram")
        changed = [p for p in range(2, len(new) // PAGE)
                   if new[p * PAGE:(p + 1) * PAGE] != old[p * PAGE:(p + 1) * PAGE]]
        assert changed, "each step writes pages"
        for _ in range(8):
            chosen = set(rnd.sample(changed, rnd.randint(1, len(changed))))
            data = bytearray(old[:2 * PAGE])  # the old meta pages: the new meta never reached the disk
            for p in range(2, max(len(old), len(new)) // PAGE):
                if p in chosen:
                    data += new[p * PAGE:(p + 1) * PAGE]
                elif p * PAGE < len(old):
                    data += old[p * PAGE:(p + 1) * PAGE]
                else:  # a page the commit appended that never reached the disk: a hole
                    data += bytes(PAGE)
            hybrid.write_bytes(bytes(data))
            _clear_sidecars(hybrid)
            assert _logical(hybrid) == expected, f"step {k}: pages {sorted(chosen)} of the next commit"
            checked += 1
    assert checked == 8 * 12


def test_a_new_meta_over_missing_pages_is_never_silently_wrong(tmp_path):
    """Out of LMDB's model (T2.2): the new meta page on disk but some of the commit's data
    pages not (a disk that reorders writes past an fsync). The file must be refused, or
    verify must report it, or it reads as exactly the new commit: never other data."""
    rnd = random.Random(7)
    snapshots = _snapshots(tmp_path, rnd)
    hybrid = tmp_path / "h.engram"
    outcomes = {"refused": 0, "reported": 0, "new": 0}
    for k in range(len(snapshots) - 1):
        old, new = snapshots[k], snapshots[k + 1]
        (tmp_path / "new.engram").write_bytes(new)
        expected = _logical(tmp_path / "new.engram")
        _clear_sidecars(tmp_path / "new.engram")
        changed = [p for p in range(2, len(new) // PAGE)
                   if p * PAGE >= len(old) or new[p * PAGE:(p + 1) * PAGE] != old[p * PAGE:(p + 1) * PAGE]]
        for _ in range(6):
            missing = set(rnd.sample(changed, rnd.randint(1, len(changed))))
            data = bytearray(new[:2 * PAGE])
            for p in range(2, len(new) // PAGE):
                if p not in missing:
                    data += new[p * PAGE:(p + 1) * PAGE]
                else:
                    data += old[p * PAGE:(p + 1) * PAGE] if p * PAGE < len(old) else bytes(PAGE)
            hybrid.write_bytes(bytes(data))
            _clear_sidecars(hybrid)
            try:
                with engram.open(hybrid, passphrase=PASSPHRASE) as db:
                    if db.verify():
                        outcomes["reported"] += 1
                        continue
                    nodes = tuple(sorted((n.id, n.content, n.tags) for n in db.scan()))
                    recall = tuple(h.id for h in db.recall("alpha beta", top_k=5, hops=False))
            except EngramError:
                outcomes["refused"] += 1
                continue
            assert (nodes, recall) == expected, f"step {k}: pages {sorted(missing)} missing, read as other data"
            outcomes["new"] += 1
    print(outcomes)
    assert outcomes["refused"] + outcomes["reported"] > 0
