"""Seeded generator of the AAAK golden files in this folder.

Run from the repository root::

    python tests/golden/make_small_aaak.py

It (re)writes ``small.aaak`` (a store dump) and ``small_result.aaak`` (a compress
result). Both are pinned: ``tests/test_aaak_golden.py`` checks that every later version
reads them and writes them back byte-identically, and that this script still produces
the same bytes. Never regenerate them to make a failing test pass: a difference means
the format changed, which needs a new AAAK version and new golden files next to these.

Made with engramdb AAAK v3 (format version 1), seed 20261130, 2026-11-30.
"""
from __future__ import annotations

import io
import pathlib
import random
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from engramdb.aaak import encode, write_dump  # noqa: E402
from engramdb.records import (  # noqa: E402
    ALL_EMOTIONS, ALL_FLAGS, EDGE_KINDS, TIERS, CompressResult, Edge, EntityIndex, Node, Tunnel, Zettel,
)

SEED = 20261130
WORDS = ["auth", "JWT", "tokens", "deploy", "Redis", "cache", "pipe|line", 'say "hi"', "back\\slash",
         "semi;colon", "a=b", "c,d", "x+y", "日本語", "émigré", "🎉", "tab\there", "new\nline", "nul\x00"]
NAMES = ["Alice", "Bob", "Carol", "O'Brien", "Jean-Luc", "Ünïcødé"]
SPACES = [
    {"name": "minilm", "model": "sentence-transformers/all-MiniLM-L6-v2", "dims": 4, "dtype": "float32",
     "normalized": True},
    {"name": "tiny", "model": "test/tiny", "dims": 2, "dtype": "float16", "normalized": False, "metric": "dot"},
]


def _phrase(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def build_store() -> dict:
    """The logical content of small.aaak, as keyword arguments for write_dump."""
    rng = random.Random(SEED)
    nodes = []
    for i in range(8):
        embeddings = {}
        for space in SPACES:
            if rng.random() < 0.7:
                embeddings[space["name"]] = [rng.uniform(-1, 1) for _ in range(space["dims"])]
        nodes.append(Node(
            id=f"{rng.getrandbits(64):016x}" if i else "E",
            content=_phrase(rng, 12) + ("\n\n" + _phrase(rng, 6) if i % 3 == 0 else ""),
            entities=rng.sample(NAMES, rng.randint(0, 3)),
            topics=rng.sample(WORDS, rng.randint(0, 3)),
            quote=_phrase(rng, 5),
            weight=rng.random(),
            flags=rng.sample(ALL_FLAGS, rng.randint(0, 2)),
            emotions=rng.sample(ALL_EMOTIONS, rng.randint(0, 2)),
            source_start=i * 100 if i % 2 else None,
            source_end=i * 100 + 99 if i % 2 else None,
            resolved_date=f"2026-06-1{i}" if i % 4 == 1 else None,
            tier=TIERS[i % len(TIERS)],
            importance=round(rng.random(), 3),
            created_at=1_780_000_000.0 + i * 3600.5,
            last_accessed=1_780_000_000.0 + i * 7200.25,
            access_count=rng.randint(0, 50),
            pinned=i == 2,
            tags=rng.sample(["work", "personal", "a,b", ""], rng.randint(0, 2)),
            source=rng.choice(["chat", "import:trace-lite", ""]),
            metadata={"turn": i, "score": rng.random(), "raw": bytes([i, 255]), "$ref": None,
                      "nested": {"list": [1, 2.0, "three", True]}} if i % 2 == 0 else {},
            embeddings=embeddings,
        ))
    nodes.sort(key=lambda n: n.id)
    ids = [n.id for n in nodes]
    edges = []
    for j in range(10):
        src, dst = rng.sample(ids, 2)
        edges.append(Edge(src, dst, EDGE_KINDS[j % len(EDGE_KINDS)], round(rng.random(), 4), _phrase(rng, 2),
                          1_780_000_000.0 + j, None if j % 3 else 1_780_000_100.0,
                          1_790_000_000.0 if j % 4 == 0 else None))
    archive = sorted((ids[k], "original: " + _phrase(rng, 20)) for k in (1, 5))
    procedures = [{"name": "deploy", "steps": ["build", "test", "ship"], "retries": 3},
                  {"name": "rotate keys", "every_days": 30.5, 1: b"\x01\x02"}]
    return {
        "settings": {"tokenizer": {"lowercase": True, "stemmer": "english", "stopwords": ["a", "the"],
                                   "min_len": 2}, "bm25": {"k1": 1.2, "b": 0.75}},
        "meta": {"store_id": "5f0c1d9e7a2b4c3d", "seq": 17, "created_by": "engramdb golden generator"},
        "spaces": SPACES, "nodes": nodes, "edges": edges, "archive": archive, "procedures": procedures,
    }


def build_result() -> CompressResult:
    """The compress result of small_result.aaak."""
    rng = random.Random(SEED + 1)
    index = EntityIndex({"Alice": "ALC", "Bob": "BOB", "Ünïcødé": "UNI"},
                        {"ALC": "Alice", "BOB": "Bob", "UNI": "Ünïcødé"})
    zettels = [
        Zettel(f"{i + 1:03d}", rng.sample(["Alice", "Bob", "Ünïcødé", "Zed"], 2), rng.sample(WORDS, 2),
               _phrase(rng, 6), rng.random(), rng.sample(ALL_EMOTIONS, 1), rng.sample(ALL_FLAGS, 1),
               i * 50 if i else None, i * 50 + 49 if i else None, "2026-06-12" if i == 2 else None)
        for i in range(5)
    ]
    tunnels = [Tunnel("001", "002", "ALC+BOB"), Tunnel("003", "005", "pipe|label")]
    meta = {"date": "2026-06-12", "title": "Auth | Design", "input_length": 1234, "chunk_count": 5}
    return CompressResult(zettels, tunnels, index, meta)


def render() -> dict[str, bytes]:
    out = io.StringIO()
    write_dump(out, **build_store())
    return {"small.aaak": out.getvalue().encode("utf-8"),
            "small_result.aaak": encode(build_result()).encode("utf-8")}


if __name__ == "__main__":
    for name, data in render().items():
        (HERE / name).write_bytes(data)
        print(f"wrote {HERE / name} ({len(data)} bytes)")
