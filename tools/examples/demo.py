"""A two-minute tour of engramdb on the bundled sample memories.

    ENGRAM_PASSPHRASE=demo-passphrase python tools/examples/demo.py demo.engram

Creates an encrypted .engram file (or reopens it), adds the sample memories once,
reads them back, answers two questions with recall, and shows that the raw file
holds none of their text.
"""
from __future__ import annotations

import os
import sys
from importlib import resources

import engramdb


def main(path: str) -> None:
    passphrase = os.environ.get("ENGRAM_PASSPHRASE") or "demo-passphrase"
    sample = resources.files("engramdb").joinpath("data/sample_memories.txt").read_text("utf-8")
    lines = [line for line in sample.splitlines() if line.strip()]
    with engramdb.open(path, passphrase=passphrase) as db:
        if len(db) == 0:
            ids = db.add_many({"id": f"sample-{n:02d}", "content": text, "tags": ["sample"]}
                              for n, text in enumerate(lines))
            print(f"added {len(ids)} memories to {path} (encrypted: {db.encrypted})")
        for node in db.scan(tags=["sample"]):
            print(f"  {node.id}: {node.content}")
        first = db.get("sample-00")
        db.update(first.id, importance=0.9)
        print(f"updated {first.id}: importance {first.importance} -> {db.get(first.id).importance}")
        for question in ("Where did Alice move?", "what did we decide about authentication"):
            best = db.recall(question, top_k=1)[0]
            print(f"recall {question!r} -> {best.id}: {best.node.content}")
        problems = db.verify()
        print(f"verify: {problems if problems else 'ok'}")
    with open(path, "rb") as fh:
        raw = fh.read()
    leaked = [word for word in ("Alice", "Berlin", "JWT", "sample-00") if word.encode() in raw]
    print(f"plaintext found in the raw file: {leaked or 'none'}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "demo.engram")
