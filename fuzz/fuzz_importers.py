"""Coverage-guided fuzzing of the importers (atheris / libFuzzer).

Run (see fuzz/README.md)::

    python fuzz/fuzz_importers.py /tmp/importers-new fuzz/corpus/importers -max_total_time=60

The first byte of an input picks how the rest is read by ``engramdb.importers.iter_import``:

    0  fmt=None: detect_format on the first bytes, then the matching reader, no passphrase
    1  fmt="terronex" with a passphrase (encrypted Terronex files reach the KDF and AES-GCM) and
       skip_bad_embeddings=True (Terronex 1.x and 2.x; bad embeddings are reported, not imported)
    2  fmt="jsonl"
    3  fmt="aaak"   (AAAK v1/v2/v3 result documents)

Oracle: anything other than an EngramError is a crash; every item yielded is a Node, an
Edge or an EntityTable; and the nodes accepted survive a JSONL round trip (``export_jsonl`` then
``iter_jsonl`` gives equal nodes), since that is how imported memories leave the store.

The Terronex key derivations are made cheap here (argon2id t=1, m=8 KiB; PBKDF2 with one
iteration): the real costs (t=3, m=64 MiB; 100,000 iterations) are fixed by the Terronex
format and would make each execution take 0.1-0.3 s. The code paths are the same.
"""
from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

if __name__ == "__main__":
    import atheris

    with atheris.instrument_imports(include=["engramdb"]):
        from engramdb import importers
        from engramdb.errors import EngramError
        from engramdb.records import Edge, Node
else:  # imported by tests/test_fuzz_regressions.py to replay the corpus without atheris
    from engramdb import importers
    from engramdb.errors import EngramError
    from engramdb.records import Edge, Node

PASSPHRASE = "fuzz-passphrase"  # fuzz/make_corpus.py encrypts the Terronex seeds with it
FMTS = (None, "terronex", "jsonl", "aaak")
NOW = 1_767_225_600.0


CHEAP_ARGON2 = {"time_cost": 1, "memory_cost": 8, "parallelism": 1}
CHEAP_PBKDF2_ITERATIONS = 1


@contextlib.contextmanager
def cheap_kdf() -> Iterator[None]:
    """Cheap Terronex KDF costs (see the module docstring); make_corpus.py seals with the same."""
    real = importers._TX_ARGON2, importers._TX_PBKDF2_ITERATIONS
    importers._TX_ARGON2, importers._TX_PBKDF2_ITERATIONS = CHEAP_ARGON2, CHEAP_PBKDF2_ITERATIONS
    try:
        yield
    finally:
        importers._TX_ARGON2, importers._TX_PBKDF2_ITERATIONS = real


def check_import(body: bytes, fmt: str | None) -> None:
    report = importers.ImportReport()
    try:
        items = list(importers.iter_import(
            io.BytesIO(body), fmt=fmt, passphrase=PASSPHRASE if fmt == "terronex" else None, now=NOW,
            skip_bad_embeddings=fmt == "terronex", report=report,
        ))
    except EngramError:
        return
    left_out = {nid for nid, _ in report.bad_embeddings}
    for item in items:  # a reported embedding is never imported
        assert not (isinstance(item, Node) and item.id in left_out and item.embeddings), item.id
    for item in items:
        assert isinstance(item, (Node, Edge, importers.EntityTable)), f"iter_import yielded a {type(item).__name__}"
    nodes = [item for item in items if isinstance(item, Node)]
    buf = io.StringIO()
    importers.export_jsonl(nodes, buf)
    again = list(importers.iter_jsonl(buf.getvalue(), now=NOW))
    assert again == nodes, "iter_jsonl(export_jsonl(nodes)) != nodes"


def TestOneInput(data: bytes) -> None:
    if not data:
        return
    check_import(data[1:], FMTS[data[0] % 4])


if __name__ == "__main__":
    with cheap_kdf():
        atheris.Setup(sys.argv, TestOneInput)
        atheris.Fuzz()
