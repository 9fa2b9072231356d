"""LoCoMo evidence-retrieval adapter: one encrypted engramdb file per conversation, answered by recall.

Run (from the repository root):

    python ../shared/tools/locomo_eval.py --baselines bm25s,bm25s_stem \
        --adapter tools/bench/locomo_adapter.py:make_retriever

Each turn becomes one memory: content ``"speaker: text"`` (plus the shared image's caption,
when the harness passes one), id = the turn's dia_id, ``resolved_date`` = the session date
(for recall's date-proximity bonus), tag = the session. Consecutive turns of a session are
linked by ``related`` edges so recall's one-hop expansion can bring the reply to a
question's matching turn. The file is encrypted with a random raw key (no KDF cost: this
measures retrieval, not key derivation) in a temporary directory removed at exit.
"""
from __future__ import annotations

import atexit
import datetime as dt
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import engramdb.engram as engram_mod
import itertools

_TMP = tempfile.mkdtemp(prefix="engram-locomo-")
atexit.register(shutil.rmtree, _TMP, True)
_DATE = re.compile(r"(\d{1,2}) (\w+),? (\d{4})")
_MONTHS = {m: i + 1 for i, m in enumerate(
    ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
     "november", "december"])}
NEIGHBOUR_WEIGHT = 0.5


def _iso(date_time: str) -> str | None:
    m = _DATE.search(date_time or "")
    if not m or m.group(2).lower() not in _MONTHS:
        return None
    return dt.date(int(m.group(3)), _MONTHS[m.group(2).lower()], int(m.group(1))).isoformat()


def build_store(turns: list[dict], *, link_neighbours: bool = True, space: bool | str = False) -> engram_mod.Engram:
    """One conversation as an encrypted store (temporary; removed at exit).

    ``space`` adds an embedding space, so recall also runs its vector retriever: ``True`` or
    ``"hashed"`` the built-in hashed TF-IDF space; any other non-empty string is a local
    sentence-transformers model directory (``LocalModelEmbedder``, the ``embed`` extra)
    that embeds every turn and every question in a space named ``model``."""
    path = os.path.join(_TMP, f"{turns[0]['sample_id']}-{len(os.listdir(_TMP))}.engram")
    db = engram_mod.open(path, key=os.urandom(32))
    vectors = None
    if space is True or space == "hashed":
        db.add_space("hashed", dims=256)
    elif space:
        from engramdb.index.vectors import LocalModelEmbedder

        embedder = LocalModelEmbedder(str(space))
        vectors = embedder([t["doc"] for t in turns])
        db.add_space("model", dims=int(vectors.shape[1]), model=os.path.basename(str(space).rstrip("/")),
                     embedder=embedder)
    db.add_many([{
        **({"embeddings": {"model": tuple(float(x) for x in vectors[i])}} if vectors is not None else {}),
        "id": t["dia_id"],
        "content": t["doc"],
        "resolved_date": _iso(t["date_time"]),
        "tags": [f"session-{t['session']}"],
        "created_at": float(t["turn_index"]),
        "last_accessed": float(t["turn_index"]),
    } for i, t in enumerate(turns)])
    if link_neighbours:
        with db.transaction() as tx:
            for a, b in itertools.pairwise(turns):
                if a["session"] == b["session"]:
                    tx.link(a["dia_id"], b["dia_id"], "related", weight=NEIGHBOUR_WEIGHT, now=0.0)
    return db


def make_retriever(turns: list[dict], *, hops: bool = True, link_neighbours: bool = True,
                   space: str | None = None) -> Callable[[str, int], list[str]]:
    """Index one conversation; return ``search(question, k) -> [dia_id, ...]``.

    ``space`` (default: the ``ENGRAM_LOCOMO_SPACE`` environment variable; empty = none) as
    in :func:`build_store`, so the same harness scores BM25-only and fused."""
    db = build_store(turns, link_neighbours=link_neighbours,
                     space=os.environ.get("ENGRAM_LOCOMO_SPACE", "") if space is None else space)
    order = [t["dia_id"] for t in turns]

    def search(question: str, k: int) -> list[str]:
        ids = [h.id for h in db.recall(question, top_k=k, hops=hops)]
        if len(ids) < k:  # nothing more matches: fill in conversation order, as the baselines do
            seen = set(ids)
            ids += [i for i in order if i not in seen][:k - len(ids)]
        return ids

    return search
