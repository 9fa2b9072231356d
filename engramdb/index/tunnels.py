"""Tunnel linking: pair up items whose token sets overlap, deterministically.

A *tunnel* joins two items (zettels, nodes) that share entities or topics. This module is
the generic, pure part of that: it works on ``list[frozenset[str]]`` and returns index
pairs with their Jaccard score. ``compress`` uses it for zettel tunnels (with its own
entity/topic scorer), the search layer for node tunnels.

The contract (spec/compress.md, "Tunnels"):

* A link needs ``score >= threshold`` *and* ``score > 0``: items that share nothing are
  never linked, whatever the threshold.
* Each item keeps at most ``top_k`` links. Links are accepted greedily from the best
  score down, ties broken by ``(i, j)``, so the result does not depend on input order
  beyond the indices themselves.
* Up to ``lsh_min`` items, candidates are every pair that shares a token (an inverted
  index: exact, perfect recall). Above it, candidates come from MinHash signatures
  banded for LSH (Broder 1997; Indyk & Motwani 1998), which is roughly linear but may
  miss weak pairs: with 32 bands of 2 rows a pair at Jaccard 0.3 becomes a candidate
  with probability ~0.95, at 0.45 ~0.998; candidates whose MinHash estimate is more
  than :data:`ESTIMATE_MARGIN` below the threshold are dropped (so ~0.9 of the pairs
  right at 0.3 are found), and every remaining candidate is verified exactly.
* Everything is seeded and uses integer arithmetic (CRC-32 token hashes, multiply-shift
  hashing on uint64), so the output is identical across processes, ``PYTHONHASHSEED``
  values and machines.
"""
from __future__ import annotations

import hashlib
import zlib
from itertools import chain
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Iterable, Sequence

import numpy as np
from numpy.typing import NDArray

from ..errors import ValidationError

__all__ = [
    "DEFAULT_SEED",
    "ESTIMATE_MARGIN",
    "LSH_MIN_ITEMS",
    "Link",
    "TokenSets",
    "candidate_pairs",
    "greedy_links",
    "jaccard",
    "link_ids",
    "link_sets",
    "lsh_pairs",
    "minhash_signatures",
    "select_links",
]

DEFAULT_SEED = 0x3777AAA1
LSH_MIN_ITEMS = 500
NUM_HASHES = 64
ROWS_PER_BAND = 2
# A band bucket shared by more than BUCKET_CAP items is "hot": its key is a very common
# token that says little about similarity, like a stop word. Such a bucket pairs each
# member only with its next HOT_BUCKET_CHAIN members in index order, so one hot token
# cannot bring back the O(n^2) blow-up LSH exists to avoid, while a large group of true
# near-duplicates still gets linked as a chain.
BUCKET_CAP = 64
HOT_BUCKET_CHAIN = 2

_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_LOW7 = np.uint64(0x7F7F7F7F7F7F7F7F)
_ONES = np.uint64(0x0101010101010101)
# Candidates whose MinHash estimate is more than this below the threshold are dropped
# before exact scoring: with 64 hashes the estimate's standard deviation at J = 0.3 is
# ~0.057, so a true pair exactly at the threshold survives with probability ~0.96 and
# one at 0.35 with > 0.99, while most weak candidates (the bulk of the work) go.
ESTIMATE_MARGIN = 0.1


@dataclass(frozen=True, order=True)
class Link:
    """A link between items ``i < j`` with its similarity ``score``."""

    i: int
    j: int
    score: float


def jaccard(a: frozenset[str] | set[str], b: frozenset[str] | set[str]) -> float:
    """Jaccard similarity ``|a & b| / |a | b|``; 0.0 when either set is empty."""
    if not a or not b:
        return 0.0
    inter = len(a & b)
    if inter == 0:
        return 0.0
    return inter / (len(a) + len(b) - inter)


def _hash_constants(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    # blake2b rather than a numpy RNG: numpy only promises bit-stream stability for the
    # raw generator, not for the distribution methods, across versions.
    a = np.empty(count, dtype=np.uint64)
    b = np.empty(count, dtype=np.uint64)
    for k in range(count):
        digest = hashlib.blake2b(f"{seed}:{k}".encode(), digest_size=16).digest()
        a[k] = int.from_bytes(digest[:8], "little") | 1  # odd multiplier
        b[k] = int.from_bytes(digest[8:], "little")
    return a, b


_CONSTANTS: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}


def _constants(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    key = (count, seed)
    if key not in _CONSTANTS:
        _CONSTANTS[key] = _hash_constants(count, seed)
    return _CONSTANTS[key]


def _check_sets(sets: Sequence[Iterable[str]]) -> list[frozenset[str]]:
    if isinstance(sets, (str, bytes)):
        raise ValidationError("sets must be a sequence of token sets, not a string",
                              hint="pass one frozenset of tokens per item")
    out = []
    for k, s in enumerate(sets):
        if isinstance(s, (str, bytes)):
            raise ValidationError(
                f"item {k} is a string, not a set of tokens",
                hint="pass one frozenset of tokens per item, e.g. frozenset(text.split())",
            )
        try:
            out.append(s if type(s) is frozenset else frozenset(s))
        except TypeError as exc:
            raise ValidationError(f"item {k} is not a set of tokens: {exc}",
                                  hint="pass one frozenset of strings per item") from exc
    return out


def _token_hash(token: str) -> int:
    try:
        return zlib.crc32(token.encode("utf-8", "surrogatepass"))
    except AttributeError:
        raise ValidationError(
            f"tokens must be strings, got {type(token).__name__}", hint="convert tokens with str() before linking"
        ) from None


class _Prepared:
    """Token sets as integer arrays (CSR over the non-empty sets), built once."""

    def __init__(self, sets: Sequence[frozenset[str]]) -> None:
        self.n = len(sets)
        rows = [idx for idx, s in enumerate(sets) if s]
        self.rows = np.asarray(rows, dtype=np.int64)
        self.row_of = np.full(self.n, -1, dtype=np.int64)
        self.row_of[self.rows] = np.arange(len(rows), dtype=np.int64)
        # token order inside a frozenset depends on the hash seed; nothing below does
        flat_tokens = list(chain.from_iterable(sets[idx] for idx in rows))
        self.vocab = {t: k for k, t in enumerate(dict.fromkeys(flat_tokens))}
        self.flat = np.fromiter(map(self.vocab.__getitem__, flat_tokens), dtype=np.int64, count=len(flat_tokens))
        self.sizes = np.fromiter((len(sets[idx]) for idx in rows), dtype=np.int64, count=len(rows))
        self.starts = np.cumsum(self.sizes) - self.sizes
        self._keys: np.ndarray | None = None

    def signatures(self, num_hashes: int, seed: int) -> np.ndarray:
        sig = np.full((self.n, num_hashes), 0xFFFFFFFF, dtype=np.uint32)
        if not len(self.rows):
            return sig
        hashes = np.fromiter(map(_token_hash, self.vocab), dtype=np.uint64, count=len(self.vocab))
        a, b = _constants(num_hashes, seed)
        # multiply-shift hashing: the high 32 bits of (a*h + b) mod 2**64 (uint64 wraps);
        # one hash function at a time keeps the working set in cache (2.5x faster than
        # one (tokens x hashes) matrix)
        permuted = ((a[:, None] * hashes[None, :] + b[:, None]) >> _SHIFT32).astype(np.uint32)
        mins = np.empty((len(self.rows), num_hashes), dtype=np.uint32)
        for k in range(num_hashes):
            mins[:, k] = np.minimum.reduceat(permuted[k][self.flat], self.starts)
        sig[self.rows] = mins
        return sig

    def keys(self) -> np.ndarray:
        """Sorted ``row * V + token`` membership keys."""
        if self._keys is None:
            v = max(len(self.vocab), 1)
            owner = np.repeat(np.arange(len(self.rows), dtype=np.int64), self.sizes)
            self._keys = np.sort(owner * v + self.flat)
        return self._keys

    def jaccard(self, i: np.ndarray, j: np.ndarray) -> np.ndarray:
        """Exact Jaccard of the set pairs ``(i[k], j[k])``, vectorized (0 if one is empty)."""
        i = np.asarray(i, dtype=np.int64)
        j = np.asarray(j, dtype=np.int64)
        out = np.zeros(len(i), dtype=np.float64)
        full = (self.row_of[i] >= 0) & (self.row_of[j] >= 0) if len(i) else np.zeros(0, dtype=bool)
        if full.any():
            out[full] = self._jaccard_full(i[full], j[full])
        return out

    def _jaccard_full(self, i: np.ndarray, j: np.ndarray) -> np.ndarray:
        ri, rj = self.row_of[i], self.row_of[j]
        li, lj = self.sizes[ri], self.sizes[rj]
        first = np.cumsum(li) - li
        within = np.arange(int(li.sum()), dtype=np.int64) - np.repeat(first, li)
        tokens = self.flat[np.repeat(self.starts[ri], li) + within]
        query = np.repeat(rj, li) * max(len(self.vocab), 1) + tokens
        keys = self.keys()
        pos = np.minimum(np.searchsorted(keys, query), len(keys) - 1)
        inter = np.add.reduceat((keys[pos] == query).astype(np.int64), first)
        jaccard: NDArray[np.float64] = inter / (li + lj - inter)
        return jaccard


def minhash_signatures(
    sets: Sequence[frozenset[str]], *, num_hashes: int = NUM_HASHES, seed: int = DEFAULT_SEED
) -> np.ndarray:
    """MinHash signatures, one row of ``num_hashes`` uint32 values per set.

    An empty set gets the all-``0xFFFFFFFF`` row (callers should not band it).

    Raises:
        ValidationError: ``num_hashes`` is not a positive integer, or a token is not a string.
    """
    if isinstance(num_hashes, bool) or not isinstance(num_hashes, int) or num_hashes < 1:
        raise ValidationError("num_hashes must be a positive integer", hint="the default is 64")
    return _Prepared(_check_sets(sets)).signatures(num_hashes, seed)


def _lsh_arrays(sig: np.ndarray, rows: int, bucket_cap: int, chain: int, keep: np.ndarray, n: int) -> np.ndarray:
    """Unique candidate pair codes ``i * n + j`` (sorted) for the rows ``keep`` of ``sig``."""
    codes: list[np.ndarray] = []
    m = sig.shape[0]
    if m < 2:
        return np.empty(0, dtype=np.int64)
    wide = sig.astype(np.uint64)
    for band in range(sig.shape[1] // rows):
        key = wide[:, band * rows]
        for r in range(1, rows):
            # rows=2 packs both 32-bit values exactly; more rows mix with a multiplier
            col = wide[:, band * rows + r]
            key = (key << _SHIFT32) | col if r == 1 else (key * _GOLDEN) ^ col
        order = np.argsort(key, kind="stable")
        sorted_key = key[order]
        members = keep[order]
        # size of the bucket each sorted position belongs to
        starts = np.flatnonzero(np.concatenate(([True], sorted_key[1:] != sorted_key[:-1])))
        sizes = np.diff(np.append(starts, m))
        size_at = np.repeat(sizes, sizes)
        # every bucket pairs each member with its next `chain` members ...
        for d in range(1, chain + 1):
            if d >= m:
                break
            same = sorted_key[:-d] == sorted_key[d:]
            codes.append(_pair_codes(members[:-d][same], members[d:][same], n))
        # ... and buckets of up to `bucket_cap` members pair everyone: only their
        # positions (whole buckets, still contiguous) take part in the longer shifts
        sel = (size_at > chain + 1) & (size_at <= bucket_cap)
        if sel.any():
            sub_key, sub_members = sorted_key[sel], members[sel]
            for d in range(chain + 1, int(size_at[sel].max())):
                same = sub_key[:-d] == sub_key[d:]
                codes.append(_pair_codes(sub_members[:-d][same], sub_members[d:][same], n))
    if not codes:
        return np.empty(0, dtype=np.int64)
    merged = np.sort(np.concatenate(codes))
    if merged.size == 0:
        return merged
    return merged[np.concatenate(([True], merged[1:] != merged[:-1]))]


def _pair_codes(a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    codes: NDArray[np.int64] = np.minimum(a, b) * n + np.maximum(a, b)
    return codes


def _check_banding(sig: np.ndarray, rows: int) -> None:
    if sig.ndim != 2 or isinstance(rows, bool) or not isinstance(rows, int) or rows < 1 or sig.shape[1] % rows:
        raise ValidationError(
            "signatures must be an (n, k) matrix with k a multiple of rows",
            hint="use minhash_signatures() and the default rows=2",
        )


def _estimate_filter(sig: np.ndarray, codes: np.ndarray, n: int, min_estimate: float) -> np.ndarray:
    if min_estimate <= 0.0 or codes.size == 0:
        return codes
    i = codes // n
    j = codes % n
    # The fraction of agreeing MinHash rows estimates the Jaccard similarity. Rows are
    # compared by their low byte, eight at a time in a uint64 (SWAR zero-byte count):
    # a byte can agree by chance (1/256), which only keeps a few extra candidates, and
    # every candidate is scored exactly afterwards.
    k = sig.shape[1]
    fp = np.zeros((sig.shape[0], -(-k // 8) * 8), dtype=np.uint8)
    fp[:, :k] = sig & 0xFF
    words = fp.view(np.uint64)
    if k % 8:
        words = words.copy()
        # padding bytes are zero on both sides: count them as disagreeing below
    agree = np.zeros(codes.size, dtype=np.int64)
    for w in range(words.shape[1]):
        x = words[i, w] ^ words[j, w]
        y = ~(((x & _LOW7) + _LOW7) | x | _LOW7)  # high bit set exactly in each zero byte
        agree += ((y >> np.uint64(7)) * _ONES >> np.uint64(56)).astype(np.int64)
    agree -= fp.shape[1] - k  # the zero padding always "agrees"
    need = min_estimate * k
    kept: NDArray[np.int64] = codes[agree >= need]
    return kept


def lsh_pairs(
    signatures: np.ndarray,
    *,
    rows: int = ROWS_PER_BAND,
    bucket_cap: int = BUCKET_CAP,
    chain: int = HOT_BUCKET_CHAIN,
    skip: Sequence[bool] | None = None,
    min_estimate: float = 0.0,
) -> list[tuple[int, int]]:
    """Candidate pairs ``(i, j)``, ``i < j``, that share at least one LSH band, sorted.

    Args:
        signatures: ``(n, k)`` MinHash matrix from :func:`minhash_signatures`.
        rows: rows per band; ``k`` must be a multiple of it.
        bucket_cap: buckets up to this size yield all their pairs.
        chain: in a larger ("hot") bucket each member pairs only with its next
            ``chain`` members in index order.
        skip: optional per-item flags; flagged items (empty sets) get no candidates.
        min_estimate: drop pairs whose MinHash similarity estimate is below this.

    Raises:
        ValidationError: the signatures are not an ``(n, k)`` integer matrix dividing into
            bands, ``skip`` does not have one flag per row, or a parameter is out of range.
    """
    try:
        sig = np.asarray(signatures, dtype=np.uint32)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValidationError(f"signatures must be a uint32 matrix: {exc}",
                              hint="use minhash_signatures()") from exc
    _check_banding(sig, rows)
    for name, value, lo in (("bucket_cap", bucket_cap, 2), ("chain", chain, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise ValidationError(f"{name} must be an integer >= {lo}", hint="keep the defaults")
    if isinstance(min_estimate, bool) or not isinstance(min_estimate, (int, float)) or not 0 <= min_estimate <= 1:
        raise ValidationError("min_estimate must be a number in [0, 1]", hint="the default is 0.0")
    n = sig.shape[0]
    keep = np.arange(n, dtype=np.int64)
    if skip is not None:
        flags = np.asarray(skip, dtype=bool)
        if flags.shape != (n,):
            raise ValidationError("skip must hold one flag per signature row")
        keep = keep[~flags]
    codes = _lsh_arrays(sig[keep], rows, bucket_cap, chain, keep, n)
    codes = _estimate_filter(sig, codes, n, min_estimate)
    return [(int(c) // n, int(c) % n) for c in codes.tolist()]


def candidate_pairs(
    sets: Sequence[Iterable[str]],
    *,
    lsh_min: int = LSH_MIN_ITEMS,
    seed: int = DEFAULT_SEED,
    min_estimate: float = 0.0,
) -> list[tuple[int, int]]:
    """Pairs ``(i, j)``, ``i < j``, worth scoring, sorted.

    Up to ``lsh_min`` items: every pair sharing at least one token (exact). Above it:
    MinHash/LSH candidates (approximate recall, see the module docstring), minus the
    pairs whose MinHash estimate is below ``min_estimate``.

    Raises:
        ValidationError: an item is not a set of strings.
    """
    _check_search(lsh_min, seed, min_estimate)
    return _candidates(_check_sets(sets), lsh_min, seed, min_estimate)


def _lsh_codes(prep: _Prepared, seed: int, min_estimate: float) -> np.ndarray:
    sig = prep.signatures(NUM_HASHES, seed)
    codes = _lsh_arrays(sig[prep.rows], ROWS_PER_BAND, BUCKET_CAP, HOT_BUCKET_CHAIN, prep.rows, prep.n)
    return _estimate_filter(sig, codes, prep.n, min_estimate)


def _candidates(items: list[frozenset[str]], lsh_min: int, seed: int, min_estimate: float) -> list[tuple[int, int]]:
    n = len(items)
    if n > lsh_min:
        codes = _lsh_codes(_Prepared(items), seed, min_estimate)
        return [(c // n, c % n) for c in codes.tolist()]
    postings: dict[str, list[int]] = {}
    for idx, s in enumerate(items):
        for token in s:
            postings.setdefault(token, []).append(idx)
    pairs: set[tuple[int, int]] = set()
    for members in postings.values():
        m = len(members)
        if m < 2:
            continue
        for x in range(m):
            i = members[x]
            for y in range(x + 1, m):
                pairs.add((i, members[y]))  # postings are built in index order: i < j
    return sorted(pairs)


class TokenSets:
    """Token sets prepared once: candidate pairs and exact Jaccard as numpy arrays.

    For callers that score pairs themselves (compress combines entity and topic
    similarity): ``i, j = ts.candidates(); scores = ts.jaccard(i, j)``.

    Raises:
        ValidationError: an item is not a set of strings.
    """

    def __init__(self, sets: Sequence[Iterable[str]]) -> None:
        self.items = _check_sets(sets)
        self._prep = _Prepared(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def candidates(
        self, *, lsh_min: int = LSH_MIN_ITEMS, seed: int = DEFAULT_SEED, min_estimate: float = 0.0
    ) -> tuple[np.ndarray, np.ndarray]:
        """Candidate pairs as sorted int64 arrays ``(i, j)``, ``i < j`` (see :func:`candidate_pairs`).

        Raises:
            ValidationError: a parameter is out of range.
        """
        _check_search(lsh_min, seed, min_estimate)
        n = len(self.items)
        if n > lsh_min:
            codes = _lsh_codes(self._prep, seed, min_estimate)
        else:
            pairs = _candidates(self.items, lsh_min, seed, min_estimate)
            codes = np.asarray([a * n + b for a, b in pairs], dtype=np.int64)
        return codes // max(n, 1), codes % max(n, 1)

    def jaccard(self, i: np.ndarray, j: np.ndarray) -> np.ndarray:
        """Exact Jaccard similarity of each pair ``(i[k], j[k])`` (float64; 0 if a set is empty)."""
        return self._prep.jaccard(i, j)


def select_links(
    scored: Iterable[tuple[int, int, float]], n: int, *, threshold: float, top_k: int
) -> list[Link]:
    """Greedy top-k selection: best scores first, at most ``top_k`` links per item.

    Returns the accepted links sorted by ``(i, j)``.
    """
    ranked = sorted(
        (s for s in scored if s[2] > 0.0 and s[2] >= threshold),
        key=lambda s: (-s[2], s[0], s[1]),
    )
    return greedy_links(ranked, n, top_k)


def greedy_links(ranked: Iterable[tuple[int, int, float]], n: int, top_k: int) -> list[Link]:
    """:func:`select_links` for pairs already filtered and ranked best first."""
    used = [0] * n
    accepted: list[Link] = []
    for i, j, score in ranked:
        if used[i] < top_k and used[j] < top_k:
            used[i] += 1
            used[j] += 1
            accepted.append(Link(i, j, score))
    accepted.sort()
    return accepted


def _check_search(lsh_min: Any, seed: Any, min_estimate: Any = 0.0) -> None:
    if isinstance(lsh_min, bool) or not isinstance(lsh_min, int) or lsh_min < 0:
        raise ValidationError("lsh_min must be a non-negative integer", hint="the default is 500")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValidationError("seed must be an integer", hint="the default is DEFAULT_SEED")
    if isinstance(min_estimate, bool) or not isinstance(min_estimate, (int, float)) or not 0 <= min_estimate <= 1:
        raise ValidationError("min_estimate must be a number in [0, 1]", hint="the default is 0.0")


def _check_params(threshold: float, top_k: int) -> None:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
        raise ValidationError("threshold must be a number in [0, 1]", hint="the default is 0.3")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValidationError("top_k must be a non-negative integer", hint="the default is 3")


def link_sets(
    sets: Sequence[Iterable[str]],
    *,
    threshold: float = 0.3,
    top_k: int = 3,
    lsh_min: int = LSH_MIN_ITEMS,
    seed: int = DEFAULT_SEED,
    score: Callable[[int, int], float] | None = None,
) -> list[Link]:
    """Link items by token-set similarity.

    Args:
        sets: one token set per item (any iterable of strings; a ``str`` is rejected).
        threshold: minimum score for a link (a link also needs a score above 0).
        top_k: maximum links per item.
        lsh_min: above this many items, candidates come from MinHash/LSH.
        seed: the MinHash seed.
        score: optional ``score(i, j)`` replacing plain Jaccard of the two sets;
            candidates still come from the sets.

    Returns:
        Links ``(i, j, score)`` with ``i < j``, sorted by ``(i, j)``.

    Raises:
        ValidationError: bad parameters or an item that is not a set of strings.
    """
    _check_params(threshold, top_k)
    _check_search(lsh_min, seed)
    items = _check_sets(sets)
    # A custom scorer may rank pairs above their plain Jaccard, so only plain Jaccard
    # can use the MinHash estimate as a pre-filter.
    margin = max(0.0, threshold - ESTIMATE_MARGIN) if score is None else 0.0
    if score is None and len(items) > lsh_min:
        return _link_lsh(items, threshold, top_k, seed, margin)
    pairs = _candidates(items, lsh_min, seed, margin)
    scored: Iterable[tuple[int, int, float]]
    if score is None:
        exact: list[tuple[int, int, float]] = []
        for i, j in pairs:  # jaccard() inlined: this loop runs once per candidate
            a, b = items[i], items[j]
            inter = len(a & b)
            if inter:
                exact.append((i, j, inter / (len(a) + len(b) - inter)))
        scored = exact
    else:
        scored = ((i, j, float(score(i, j))) for i, j in pairs)
    return select_links(scored, len(items), threshold=threshold, top_k=top_k)


def _link_lsh(items: list[frozenset[str]], threshold: float, top_k: int, seed: int, margin: float) -> list[Link]:
    """The LSH path of :func:`link_sets` with plain Jaccard, scored in numpy."""
    prep = _Prepared(items)
    codes = _lsh_codes(prep, seed, margin)
    n = prep.n
    i, j = codes // n, codes % n
    score = prep.jaccard(i, j)
    keep = (score > 0.0) & (score >= threshold)
    i, j, score = i[keep], j[keep], score[keep]
    order = np.lexsort((j, i, -score))  # best score first, then (i, j)
    return greedy_links(zip(i[order].tolist(), j[order].tolist(), score[order].tolist()), n, top_k)


def link_ids(
    items: Sequence[tuple[str, Iterable[str]]],
    *,
    threshold: float = 0.3,
    top_k: int = 3,
    lsh_min: int = LSH_MIN_ITEMS,
    seed: int = DEFAULT_SEED,
) -> list[tuple[str, str, float]]:
    """:func:`link_sets` over ``(id, tokens)`` pairs, returning ``(id_a, id_b, score)``.

    ``id_a`` is the id of the earlier item in ``items``.

    Raises:
        ValidationError: bad parameters, duplicate ids, or tokens that are not strings.
    """
    ids = [item[0] for item in items]
    if len(set(ids)) != len(ids):
        raise ValidationError("duplicate ids given to link_ids", hint="pass each item once")
    links = link_sets([item[1] for item in items], threshold=threshold, top_k=top_k, lsh_min=lsh_min, seed=seed)
    return [(ids[link.i], ids[link.j], link.score) for link in links]
