"""A byte-bounded least-recently-used cache for decoded data (postings, nodes, vectors).

Each cache of an open handle has its own limit, ``cache_mb`` of :func:`engramdb.open` (see
README, "Memory"). Entries are charged the size their owner reports (for numpy arrays,
``nbytes`` plus :data:`ENTRY_OVERHEAD`); putting an entry evicts the least recently used
ones until the total fits. An entry larger than the whole limit is not kept at all.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

__all__ = ["ENTRY_OVERHEAD", "LRUCache", "mb_to_bytes"]

# Bytes charged per entry on top of its reported size (the key, the dict slot, small objects).
ENTRY_OVERHEAD = 200


def mb_to_bytes(cache_mb: float | None, default_mb: float) -> int:
    """``cache_mb`` (MiB; None: ``default_mb``) as a byte count (negative counts as 0)."""
    mb = default_mb if cache_mb is None else float(cache_mb)
    return max(0, int(mb * 2**20))


class LRUCache:
    """A thread-safe mapping bounded by the total size of its entries.

    Args:
        max_bytes: the limit; 0 keeps nothing.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = int(max_bytes)
        self._data: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.evictions = 0

    @property
    def nbytes(self) -> int:
        """The bytes charged for the entries held now (never above :attr:`max_bytes`)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value under ``key`` (now the most recently used), or ``default``."""
        with self._lock:
            item = self._data.get(key)
            if item is None:
                return default
            self._data.move_to_end(key)
            return item[0]

    def put(self, key: Hashable, value: Any, nbytes: int) -> None:
        """Store ``value`` charged ``nbytes`` (+ :data:`ENTRY_OVERHEAD`), evicting the least
        recently used entries to fit; a value larger than the limit is not stored."""
        size = int(nbytes) + ENTRY_OVERHEAD
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if size > self.max_bytes:
                return
            self._data[key] = (value, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, dropped) = self._data.popitem(last=False)
                self._bytes -= dropped
                self.evictions += 1

    def pop(self, key: Hashable, default: Any = None) -> Any:
        """Remove and return the value under ``key`` (``default`` when absent)."""
        with self._lock:
            item = self._data.pop(key, None)
            if item is None:
                return default
            self._bytes -= item[1]
            return item[0]

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._data.clear()
            self._bytes = 0

    def keys(self) -> list[Hashable]:
        """The keys, least recently used first (a copy)."""
        with self._lock:
            return list(self._data)
