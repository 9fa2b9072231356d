"""What a store holds, for ``Engram.stats()`` and ``engramdb stats``.

One read snapshot: memories per tier, flag, tag and source (plus how many are archived and
pinned), entries and bytes per table, the index's segments and vector blocks, and the last
maintenance pass. Takes an open ``Engram`` (duck-typed; this package never imports the facade).
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from ..index import iter_nodes
from ..records import ALL_FLAGS, TIERS
from ..store import TABLES, Txn
from .run import read_last_pass

__all__ = ["last_maintenance", "stats"]


def last_maintenance(txn: Txn) -> dict[str, Any] | None:
    """When the last maintenance pass ran and what it did (its counts), or None when no pass
    has run: the record the pass leaves (:func:`engramdb.maintenance.run.read_last_pass`)."""
    found = read_last_pass(txn)
    return None if found is None else dict(found)


def _sorted_counts(counter: Counter[str]) -> dict[str, int]:
    """Most frequent first, then by name: a stable order for text and JSON output."""
    return dict(sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))


def stats(engram: Any) -> dict[str, Any]:
    """The store's statistics (see :meth:`engramdb.Engram.stats` for the keys).

    Raises:
        CorruptFileError: a record does not decode (run ``engramdb verify FILE``).
    """
    tiers: Counter[str] = Counter(dict.fromkeys(TIERS, 0))
    flags: Counter[str] = Counter()
    tags: Counter[str] = Counter()
    sources: Counter[str] = Counter()
    archived = pinned = total = 0
    store = engram._store
    with store.read() as txn:
        for _, node in iter_nodes(txn):
            total += 1
            tiers[node.tier] += 1
            flags.update(node.flags)
            tags.update(node.tags)
            if node.source:
                sources[node.source] += 1
            archived += node.archived
            pinned += node.pinned
        tables = {t: {"entries": txn.count(t), "bytes": txn.table_bytes(t)} for t in TABLES}
        indexes = engram.indexes
        index = {"bm25": indexes.bm25.layout(txn), "vectors": indexes.vectors.layout(txn)}
        last = last_maintenance(txn)
    return {
        "memories": total,
        "archived": archived,
        "pinned": pinned,
        "tiers": {t: tiers[t] for t in (*TIERS, *sorted(set(tiers) - set(TIERS)))},
        "flags": {f: flags[f] for f in (*ALL_FLAGS, *sorted(set(flags) - set(ALL_FLAGS))) if flags[f]},
        "tags": _sorted_counts(tags),
        "sources": _sorted_counts(sources),
        "tables": tables,
        "file_size": store.env_info()["file_size"],
        "index": index,
        "last_maintenance": last,
    }
