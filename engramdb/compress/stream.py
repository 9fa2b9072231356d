"""``CompressStream``: incremental compression of a message stream.

Each ``push`` compresses one message into zettels at once; ``snapshot`` returns a
:class:`~engramdb.records.CompressResult` at any time. The whole state is a pure
function of the pushed texts (decay counts pushes, not seconds), so replaying the same
pushes gives a byte-identical snapshot.

* Entity codes never change once assigned; new names are coded in sorted order.
* Pronouns in a message can refer to names from earlier messages, and a session header
  ("[2023-05-08] Session 3") dates the messages after it.
* ``half_life_turns``: a zettel's raw weight halves every that many pushes.
* ``max_zettels``: after each push the lowest decayed weights are evicted (oldest push,
  then oldest id, first on ties), so ``size <= max_zettels`` always holds.
* ``dedupe=True``: a message that near-duplicates a kept zettel (token-set Jaccard at or
  above ``dedupe_threshold``) refreshes it (its recency, its weight if higher, and the
  union of entities, topics, emotions and flags) instead of adding a new zettel.

Zettels of a stream have no source offsets: every push has its own text.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any

from ..errors import ValidationError
from ..index.tunnels import jaccard
from ..records import ALL_EMOTIONS, ALL_FLAGS, CompressResult, EntityIndex, Zettel
from .dates import PartialDate
from .entities import assign_codes
from .links import build_tunnels, dedupe_tokens
from .options import parse_options
from .pipeline import analyze, zettel_id
from .recall import check_recall_options, recall_result
from .weights import blend_centrality, decay_factor, normalize_weights, round2

__all__ = ["CompressStream"]


@dataclass(eq=False)
class _Kept:
    zettel: Zettel  # weight holds the raw (un-normalized) weight
    turn: int
    serial: int
    tokens: frozenset[str]
    prefix: tuple[str, ...] = ()


def _token_order(token: str) -> tuple[int, str]:
    return zlib.crc32(token.encode("utf-8", "surrogatepass")), token


def _prefix(tokens: frozenset[str], threshold: float) -> tuple[str, ...]:
    """Prefix filtering (Chaudhuri et al. 2006): two sets with Jaccard >= ``threshold``
    share a token among the first ``|A| - ceil(threshold * |A|) + 1`` tokens of each, in
    one fixed global order. The order is by CRC-32, not alphabetical, so a token common
    to every message (a speaker's name) sits in few prefixes."""
    if not tokens:
        return ()
    need = max(1, math.ceil(threshold * len(tokens) - 1e-9))  # rounding down only widens it
    return tuple(sorted(tokens, key=_token_order)[: len(tokens) - need + 1])


class CompressStream:
    """Incremental, bounded, deterministic compression of pushed messages.

    Args:
        half_life_turns: recency half-life in pushes (``None``: no decay).
        max_zettels: cap on kept zettels (``None``: no cap).
        **compress_options: the options of :func:`engramdb.compress.compress`.

    Raises:
        ValidationError: an unknown or invalid option.
    """

    def __init__(
        self, half_life_turns: float | None = None, max_zettels: int | None = None, **compress_options: Any
    ) -> None:
        if half_life_turns is not None and (
            isinstance(half_life_turns, bool) or not isinstance(half_life_turns, (int, float))
            or not math.isfinite(half_life_turns) or half_life_turns <= 0
        ):
            raise ValidationError("half_life_turns must be a positive number or None", hint="e.g. 20")
        if max_zettels is not None and (
            isinstance(max_zettels, bool) or not isinstance(max_zettels, int) or max_zettels < 1
        ):
            raise ValidationError("max_zettels must be a positive integer or None", hint="e.g. 500")
        self._opts = parse_options(compress_options)
        self._half_life = None if half_life_turns is None else float(half_life_turns)
        self._cap = max_zettels
        self._index = EntityIndex()
        self._kept: list[_Kept] = []
        self._postings: dict[str, list[_Kept]] = {}  # prefix token -> kept zettels (dedupe)
        self._turn = 0
        self._serial = 0
        self._input_length = 0
        self._recent: list[str] = []
        self._session: PartialDate | None = None
        self._gender: dict[str, str] = {}

    @property
    def size(self) -> int:
        """How many zettels the stream keeps now."""
        return len(self._kept)

    def push(self, text: str) -> list[str]:
        """Compress one message into the stream.

        Returns:
            The ids of the zettels this push added or refreshed, in order.

        Raises:
            ValidationError: ``text`` is not a string.
        """
        if not isinstance(text, str):
            raise ValidationError(f"push takes a str, got {type(text).__name__}", hint="decode bytes first")
        self._turn += 1
        self._input_length += len(text)
        analysis = analyze(text, self._opts, recent=self._recent, session=self._session, gender=self._gender)
        self._recent, self._session = analysis.recent, analysis.session
        assign_codes(self._index, (name for z in analysis.zettels for name in z.entities))
        touched: list[str] = []
        for z in analysis.zettels:
            z.source_start = z.source_end = None
            tokens = dedupe_tokens(z)
            target = self._duplicate_of(tokens) if self._opts.dedupe else None
            if target is not None:
                self._refresh(target, z)
                if target.zettel.id not in touched:
                    touched.append(target.zettel.id)
                continue
            self._serial += 1
            z.id = zettel_id(self._serial)
            kept = _Kept(z, self._turn, self._serial, tokens)
            self._kept.append(kept)
            if self._opts.dedupe:
                self._post(kept)
            touched.append(z.id)
        self._evict()
        return touched

    def _post(self, kept: _Kept) -> None:
        kept.prefix = _prefix(kept.tokens, self._opts.dedupe_threshold)
        for token in kept.prefix:
            self._postings.setdefault(token, []).append(kept)

    def _unpost(self, kept: _Kept) -> None:
        for token in kept.prefix:
            posting = self._postings[token]
            posting.remove(kept)
            if not posting:
                del self._postings[token]
        kept.prefix = ()

    def _duplicate_of(self, tokens: frozenset[str]) -> _Kept | None:
        threshold = self._opts.dedupe_threshold
        seen: dict[int, _Kept] = {}
        for token in _prefix(tokens, threshold):
            for kept in self._postings.get(token, ()):
                seen[kept.serial] = kept
        best, best_score = None, 0.0
        size = len(tokens)
        for serial in sorted(seen):  # the most similar wins, the oldest on ties
            kept = seen[serial]
            other = len(kept.tokens)
            if min(size, other) < threshold * max(size, other):
                continue  # Jaccard <= smaller / larger
            score = jaccard(tokens, kept.tokens)
            if score >= threshold and score > best_score:
                best, best_score = kept, score
        return best

    def _refresh(self, kept: _Kept, new: Zettel) -> None:
        z = kept.zettel
        kept.turn = self._turn
        z.weight = max(z.weight, new.weight)
        z.entities = sorted(set(z.entities) | set(new.entities))
        z.topics = z.topics + [t for t in new.topics if t not in z.topics]
        emotions, flags = set(z.emotions) | set(new.emotions), set(z.flags) | set(new.flags)
        z.emotions = [e for e in ALL_EMOTIONS if e in emotions]
        z.flags = [f for f in ALL_FLAGS if f in flags]
        if new.resolved_date and not z.resolved_date:
            z.resolved_date = new.resolved_date
        self._unpost(kept)
        kept.tokens = dedupe_tokens(z)
        self._post(kept)

    def _decayed(self, kept: _Kept) -> float:
        return kept.zettel.weight * decay_factor(self._turn - kept.turn, self._half_life)

    def _evict(self) -> None:
        if self._cap is None or len(self._kept) <= self._cap:
            return
        ranked = sorted(self._kept, key=lambda k: (self._decayed(k), k.turn, k.serial))
        drop = {id(k) for k in ranked[: len(self._kept) - self._cap]}
        for k in self._kept:
            if id(k) in drop and k.prefix:
                self._unpost(k)
        self._kept = [k for k in self._kept if id(k) not in drop]

    def snapshot(self) -> CompressResult:
        """The stream as a :class:`~engramdb.records.CompressResult` (a copy)."""
        zettels = [
            Zettel(id=k.zettel.id, entities=list(k.zettel.entities), topics=list(k.zettel.topics),
                   quote=k.zettel.quote, weight=round2(self._decayed(k)), emotions=list(k.zettel.emotions),
                   flags=list(k.zettel.flags), resolved_date=k.zettel.resolved_date)
            for k in self._kept
        ]
        index = EntityIndex(dict(self._index.name_to_code), dict(self._index.code_to_name))
        opts = self._opts
        tunnels = build_tunnels(zettels, index, opts.tunnel_threshold, opts.tunnel_top_k, opts.verbose_labels)
        blend_centrality(zettels, tunnels)
        normalize_weights(zettels, opts.temperature)
        meta: dict[str, Any] = {"input_length": self._input_length, "chunk_count": len(zettels)}
        if opts.date is not None:
            meta["date"] = opts.date
        if opts.title is not None:
            meta["title"] = opts.title
        meta["warnings"] = []
        return CompressResult(zettels=zettels, tunnels=tunnels, entity_index=index, meta=meta)

    def recall(self, query: str, **options: Any) -> list[Zettel]:
        """Zettels of the current snapshot that match ``query``: :func:`engramdb.recall_result`
        on :meth:`snapshot` (the store's stemming, synonyms and date bonus).

        Args:
            query: free text.
            **options: those of :func:`engramdb.recall_result`: ``top_k=5``, ``hops=True``
                (tunnel expansion), ``expand_query=True``, ``after``, ``before`` (ISO date
                bounds on ``resolved_date``), ``tokenizer``.

        Raises:
            ValidationError: a bad query or option.
        """
        return recall_result(self.snapshot(), query, **check_recall_options(options))
