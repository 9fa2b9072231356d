"""Node records fill LMDB's pages: fresh docnos sort after every stored record, so new
records are appended (LMDB's append mode) instead of inserted at the end, which splits
the last page in two each time it fills (issue 15, "vectors with text": ~60-word records
left pages ~5/6 full). Page counts, never timings."""
from __future__ import annotations

import math
import random

import pytest
from conftest import PASSPHRASE, TEST_KDF

import engramdb.engram as engram
from engramdb.errors import CorruptFileError

WORDS = ["lake", "sunrise", "career", "york", "wedding", "painting", "group", "sweden", "guitar", "puppy",
         "harbour", "violin", "meeting", "thursday", "office", "garden"]
PAGE = 4096
LEAF_USABLE = PAGE - 16  # the page header
NODE_OVERHEAD = 8 + 2  # LMDB's node header and the page's pointer to it


def _texts(n: int, seed: int) -> list[str]:
    rnd = random.Random(seed)
    return [" ".join(rnd.choice(WORDS) for _ in range(rnd.randint(40, 80))) for _ in range(n)]


def _node_pages(db) -> tuple[int, int]:
    """(leaf pages of the nodes table, the fewest pages its records could fill)."""
    env = db._store._env
    with env.env.begin() as txn:
        leaves = txn.stat(env.dbs["nodes"])["leaf_pages"]
        sizes = [len(key) + len(value) + NODE_OVERHEAD for key, value in txn.cursor(db=env.dbs["nodes"])]
    return leaves, math.ceil(sum(sizes) / LEAF_USABLE)


@pytest.mark.parametrize("batch", [2000, 250])
def test_add_many_fills_node_pages(tmp_path, batch):
    texts = _texts(2000, 3)
    with engram.open(tmp_path / "f.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        for start in range(0, len(texts), batch):
            db.add_many([{"id": f"m{start + i}", "content": t} for i, t in enumerate(texts[start:start + batch])],
                        now=1.0)
        leaves, least = _node_pages(db)
        # whole records per page: at most one record's room (~600 bytes of 4 KiB) lost per page
        assert leaves <= math.ceil(least * 1.18), (leaves, least)
        assert db.get("m1234").content == texts[1234]


def test_one_at_a_time_fills_node_pages(tmp_path):
    texts = _texts(300, 4)
    with engram.open(tmp_path / "f.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        for i, text in enumerate(texts):
            db.add(text, id=f"m{i}", now=1.0)
        leaves, least = _node_pages(db)
        assert leaves <= math.ceil(least * 1.18), (leaves, least)
        assert [db.get(f"m{i}").content for i in (0, 150, 299)] == [texts[0], texts[150], texts[299]]


def test_a_record_behind_the_counter_is_still_refused(tmp_path):
    """Append mode keeps insert_many's guarantee: a key that is not new fails, nothing is written."""
    with engram.open(tmp_path / "f.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("first", id="a", now=1.0)

        def bad(txn):
            txn.insert_many("nodes", [(b"\x00" * 8, b"x")], append=True)  # sorts before docno 1's record

        with pytest.raises(CorruptFileError):
            db._store.write(bad)
        assert len(db) == 1 and db.get("a").content == "first"
