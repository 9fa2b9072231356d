"""Writes tests/golden/store-v1.engram and tests/golden/store-v1.aaak (format 1.0).

    ENGRAM_TEST_WEAK_KDF=1 python tests/golden/make_golden_store.py

Run once per released format version; never regenerate an existing version's files:
every later engramdb must open, verify and dump store-v1.engram to exactly
store-v1.aaak, and restore store-v1.aaak to the same bytes (tests/test_golden_store.py).
The store uses the test-only KDF profile and the passphrase below.
"""
from __future__ import annotations

import io
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PASSPHRASE = "golden-passphrase"
NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z
DOC = """Project Atlas kickoff, 2026-01-01

Alice leads Project Atlas. We decided to use PostgreSQL for the ledger because it is reliable.
Bob worried about the migration timeline; the vendor contract ends in March 2026.

Carol from finance approved the budget. Never store credentials in the repository.
"""


def build(path: str) -> None:
    import engramdb

    with engramdb.open(path, passphrase=PASSPHRASE, kdf=engramdb.KDFParams.for_tests()) as db:
        db.add_space("hashed", dims=64)  # the built-in embedder: no model needed
        db.add_space("user", dims=3, model="golden-model", normalize=False)
        db.add_many([
            {"id": "pref-tea", "content": "Bob prefers tea over coffee | \"always\"", "tags": ["people", "bob"],
             "importance": 0.25, "metadata": {"n": 1, "f": 0.1, "raw": b"\x00\xff", "list": [None, True]},
             "embeddings": {"user": [0.5, -1.25, 3.0]}},
            {"id": "move-berlin", "content": "Alice moved to Berlin in March 2023 to start a new job.",
             "tags": ["people"], "tier": "warm", "access_count": 3, "pinned": True, "resolved_date": "2023-03",
             "emotions": ["hope"], "flags": ["PIVOT"], "source": "notes"},
            {"id": "ünïcödé-✓", "content": "Emoji 🧠 and newlines\nand tabs\tare kept", "tier": "cold"},
        ], now=NOW)
        db.ingest(DOC, title="Atlas kickoff", chunk_size=160, now=NOW)
        db.link("move-berlin", "pref-tea", "related", weight=0.5, label="friends", now=NOW)
        db.link("pref-tea", "ünïcödé-✓", "supersedes", now=NOW, valid_from=NOW, valid_to=NOW + 86400)
        with db.transaction() as tx:
            tx.set_archived("ünïcödé-✓", "The full original text before archiving. " * 5)
        db.delete(db.add("to be deleted", id="gone", now=NOW))


def main() -> None:
    os.environ.setdefault("ENGRAM_TEST_WEAK_KDF", "1")
    sys.path.insert(0, str(HERE.parents[1]))
    import engramdb

    store, dump = HERE / "store-v1.engram", HERE / "store-v1.aaak"
    if store.exists() or dump.exists():
        sys.exit("golden files exist; a released format's golden files are never regenerated")
    work = tempfile.mkdtemp()
    try:
        build(os.path.join(work, "g.engram"))
        with engramdb.open(os.path.join(work, "g.engram"), passphrase=PASSPHRASE) as db:
            db.compact()
            buf = io.StringIO()
            db.dump(buf)
        shutil.copyfile(os.path.join(work, "g.engram"), store)
        dump.write_text(buf.getvalue(), encoding="utf-8", newline="\n")
    finally:
        shutil.rmtree(work)
    print(f"wrote {store} ({store.stat().st_size} bytes) and {dump}")


if __name__ == "__main__":
    main()
