"""Golden files of format 1.0: a store and its dump that every later version must read unchanged.

Made once by tests/golden/make_golden_store.py (never regenerated for a released format).
"""
from __future__ import annotations

import io

import engramdb
from conftest import GOLDEN, golden_copy

PASSPHRASE = "golden-passphrase"


def test_golden_store_opens_verifies_and_dumps_byte_identically(tmp_path):
    with engramdb.open(golden_copy(tmp_path), passphrase=PASSPHRASE, readonly=True, verify=True) as db:
        assert db.verify() == []
        buf = io.StringIO()
        db.dump(buf)
        assert buf.getvalue() == (GOLDEN / "store-v1.aaak").read_text(encoding="utf-8")
        assert db.get("ünïcödé-✓").content == "Emoji 🧠 and newlines\nand tabs\tare kept"
        assert db.archived("ünïcödé-✓").startswith("The full original text")
        assert "gone" not in db
        assert db.recall("where did alice move", top_k=1)[0].id == "move-berlin"


def test_golden_dump_restores_to_the_same_bytes(tmp_path):
    golden = (GOLDEN / "store-v1.aaak").read_text(encoding="utf-8")
    engramdb.restore(io.StringIO(golden), tmp_path / "r.engram", passphrase="new", kdf=engramdb.KDFParams.for_tests())
    with engramdb.open(tmp_path / "r.engram", passphrase="new") as db:
        buf = io.StringIO()
        db.dump(buf)
    assert buf.getvalue() == golden


def test_golden_store_stays_writable(tmp_path):
    with engramdb.open(golden_copy(tmp_path), passphrase=PASSPHRASE) as db:
        db.add("a new memory in an old file", id="new")
        assert db.recall("new memory old file", top_k=1)[0].id == "new"
        assert db.verify() == []
