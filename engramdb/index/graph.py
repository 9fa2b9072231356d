"""Typed edges between memories, tunnels, and personalised PageRank.

Layout of the ``edges`` table (values sealed; keys hold only docnos and a kind number):

``b"f" | src u64 | kind u8 | dst u64`` -> msgpack ``[src_id, dst_id, kind, weight, label,
created_at, valid_from, valid_to, derived]``
``b"r" | dst u64 | kind u8 | src u64`` -> ``b""`` (the reverse index, for incoming edges)

``kind`` is the position in :data:`engramdb.records.EDGE_KINDS`. ``derived`` marks
tunnel edges computed from the nodes' entities and topics (:func:`link_tunnels`); they
are recomputed by a rebuild, while user edges are kept.
"""
from __future__ import annotations

import math
import sys
import struct
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from collections.abc import Iterable, Mapping, Sequence

import msgpack
import numpy as np
from numpy.typing import NDArray

from ..errors import CorruptFileError, ValidationError
from ..records import EDGE_KINDS, Edge
from .tunnels import link_sets

if TYPE_CHECKING:  # annotations only
    from ..store import Txn

__all__ = [
    "TUNNEL_THRESHOLD",
    "TUNNEL_TOP_K",
    "Graph",
    "hop_row",
    "one_hop",
    "personalized_pagerank",
    "spread",
    "tunnel_tokens",
]

TUNNEL_THRESHOLD = 0.3
TUNNEL_TOP_K = 3
TUNNEL_LABEL = "shared entities/topics"
_KEY = struct.Struct(">cQBQ")


def _kind_no(kind: str) -> int:
    try:
        return EDGE_KINDS.index(kind)
    except ValueError:
        raise ValidationError(f"edge kind must be one of {', '.join(EDGE_KINDS)}, got {kind!r}") from None


def tunnel_tokens(node: Any) -> frozenset[str]:
    """The set a node's tunnels are computed from: its entities and topics, lowercased."""
    return frozenset([f"e:{e.lower()}" for e in node.entities] + [f"t:{t.lower()}" for t in node.topics])


def personalized_pagerank(adjacency: np.ndarray, seeds: np.ndarray, *, alpha: float = 0.15,
                          iterations: int = 30, tol: float = 1e-10) -> np.ndarray:
    """Personalised PageRank by power iteration.

    ``p = alpha * s + (1 - alpha) * P^T p`` where ``P`` is ``adjacency`` row-normalised
    (a dangling row teleports back to the seeds) and ``s`` the normalised seed vector.

    Args:
        adjacency: ``(n, n)`` non-negative weights, ``adjacency[i, j]`` for edge i -> j.
        seeds: ``(n,)`` non-negative restart weights (not all zero).
        alpha: restart probability.
        iterations: maximum power iterations.
        tol: stop when the L1 change falls below this.

    Returns:
        The stationary distribution (sums to 1).

    Raises:
        ValidationError: shapes disagree, negative weights, or all-zero seeds.
    """
    adjacency = np.asarray(adjacency, dtype=np.float64)
    seeds = np.asarray(seeds, dtype=np.float64)
    n = seeds.shape[0]
    if adjacency.shape != (n, n) or np.any(adjacency < 0) or np.any(seeds < 0) or seeds.sum() <= 0:
        raise ValidationError("PageRank needs an (n, n) non-negative adjacency and non-zero seeds")
    s = seeds / seeds.sum()
    out = adjacency.sum(axis=1)
    dangling = out == 0
    trans = np.divide(adjacency, out[:, None], out=np.zeros_like(adjacency), where=~dangling[:, None])
    p = s.copy()
    for _ in range(iterations):
        nxt = alpha * s + (1 - alpha) * (trans.T @ p + p[dangling].sum() * s)
        if np.abs(nxt - p).sum() < tol:
            p = nxt
            break
        p = nxt
    stationary: NDArray[np.float64] = p
    return stationary


def one_hop(neighbours: Mapping[int, Mapping[int, float]], seeds: Mapping[int, float]) -> dict[int, float]:
    """The mass one step of personalised PageRank moves from ``seeds``: ``P^T s``.

    ``P`` is the row-normalised edge weights (``neighbours[src][dst]``); a seed without
    edges passes nothing on. This is the first-order term of :func:`personalized_pagerank`
    (the walk's first hop), which is what recall's one-hop expansion needs: each node
    receives, from every seed, the seed's score times the share of the seed's edge weight
    pointing at it. Sparse (cost proportional to the seeds' edges); sums run in ascending
    (seed, neighbour) order, so the floats are the same in every process.

    Raises:
        ValidationError: a negative weight.
    """
    return spread({src: hop_row(nb) for src, nb in neighbours.items() if src in seeds}, seeds)


def hop_row(neighbours: Mapping[int, float]) -> tuple[tuple[int, float], ...]:
    """One row of ``P`` for :func:`spread`: ``(dst, weight / total)`` in ``dst`` order
    (empty when the weights sum to 0). The total is summed in ``dst`` order.

    Raises:
        ValidationError: a negative weight.
    """
    if not neighbours:
        return ()
    if any(w < 0 for w in neighbours.values()):
        raise ValidationError("edge weights must be non-negative")
    dsts = sorted(neighbours)
    total = sum(neighbours[dst] for dst in dsts)
    if total <= 0:
        return ()
    if total == math.inf:
        # weights past MAX_WEIGHT (stored before link() refused them): inf / inf would make the
        # shares NaN and the hop add nothing. Scaled by the largest (an infinite one takes the
        # whole row, split evenly); a finite total, every ordinary row, never comes here.
        top = max(neighbours.values())
        neighbours = {dst: (w == math.inf) * 1.0 if top == math.inf else w / top for dst, w in neighbours.items()}
        total = sum(neighbours[dst] for dst in dsts)
    return tuple((dst, neighbours[dst] / total) for dst in dsts)


def spread(rows: Mapping[int, Sequence[tuple[int, float]]], seeds: Mapping[int, float]) -> dict[int, float]:
    """:func:`one_hop` over rows prepared by :func:`hop_row` (what recall caches per node)."""
    moved: dict[int, float] = {}
    get = moved.get
    for src in sorted(seeds):
        row = rows.get(src)
        if row:
            score = seeds[src]
            for dst, share in row:
                moved[dst] = get(dst, 0.0) + score * share
    return moved


def _edge_value(edge: Edge, derived: bool) -> bytes:
    return msgpack.packb([edge.src, edge.dst, edge.kind, edge.weight, edge.label, edge.created_at,
                          edge.valid_from, edge.valid_to, derived], use_bin_type=True)


def _edge_from(data: bytes) -> tuple[Edge, bool]:
    try:
        src, dst, kind, weight, label, created, vfrom, vto, derived = msgpack.unpackb(data, raw=False)
        return Edge(src=src, dst=dst, kind=kind, weight=weight, label=label, created_at=created,
                    valid_from=vfrom, valid_to=vto), bool(derived)
    except (ValueError, TypeError, ValidationError, msgpack.UnpackException) as exc:
        raise CorruptFileError("an edge record is malformed", hint="run `engramdb verify FILE`") from exc


def _edge_weight(data: bytes) -> float:
    """The weight of an edge record, without building the :class:`Edge` (the hop reads
    hundreds per query); :func:`_edge_from` checks the same shape and weight.

    Raises:
        CorruptFileError: the record is malformed.
    """
    try:
        fields = msgpack.unpackb(data, raw=False)
        weight = fields[3]
        if len(fields) != 9 or isinstance(weight, bool) or not isinstance(weight, (int, float)) \
                or not math.isfinite(weight):
            raise ValueError
        return float(weight)
    except (ValueError, TypeError, IndexError, KeyError, msgpack.UnpackException) as exc:
        raise CorruptFileError("an edge record is malformed", hint="run `engramdb verify FILE`") from exc


# link() refuses weights above this: the hop sums a node's edge weights, and 1e8 edges of this
# weight still sum to a finite number
MAX_WEIGHT = 1e300


class Graph:
    """Edge storage over a store transaction (stateless; safe to share)."""

    def link(self, txn: Txn, src: int, dst: int, edge: Edge) -> None:
        """:meth:`put` of a user's edge, whose weight must be at most :data:`MAX_WEIGHT` either way
        (edges restored or derived are stored as they come).

        Raises:
            ValidationError: the weight is out of range, an unknown kind, or ``src == dst``.
        """
        if not abs(edge.weight) <= MAX_WEIGHT:
            raise ValidationError(f"edge weight {edge.weight!r} is out of range (at most {MAX_WEIGHT:g} either way)",
                                  hint="weights are relative to each other: scale them down, e.g. into 0..1")
        self.put(txn, src, dst, edge)

    def put(self, txn: Txn, src: int, dst: int, edge: Edge, *, derived: bool = False) -> None:
        """Store ``edge`` from docno ``src`` to docno ``dst`` (replacing one of the same kind).

        Raises:
            ValidationError: an unknown kind, or an edge from a node to itself.
        """
        if src == dst:
            raise ValidationError("an edge cannot link a memory to itself")
        k = _kind_no(edge.kind)
        txn.put("edges", _KEY.pack(b"f", src, k, dst), _edge_value(edge, derived))
        txn.put("edges", _KEY.pack(b"r", dst, k, src), b"")

    def delete(self, txn: Txn, src: int, dst: int, kind: str) -> bool:
        """Remove one edge; True when it existed.

        Raises:
            ValidationError: an unknown kind.
        """
        k = _kind_no(kind)
        found: bool = txn.delete("edges", _KEY.pack(b"f", src, k, dst))
        txn.delete("edges", _KEY.pack(b"r", dst, k, src))
        return found

    def get(self, txn: Txn, src: int, dst: int, kind: str) -> Edge | None:
        """The edge (src, kind, dst), or None.

        Raises:
            ValidationError: an unknown kind.
        """
        data = txn.get("edges", _KEY.pack(b"f", src, _kind_no(kind), dst))
        return None if data is None else _edge_from(data)[0]

    def outgoing(self, txn: Txn, src: int) -> list[tuple[int, Edge, bool]]:
        """(dst docno, edge, derived) of every edge leaving ``src``, in key order."""
        out = []
        for key, value in txn.items("edges", b"f" + struct.pack(">Q", src)):
            _, _, _, dst = _KEY.unpack(key)
            edge, derived = _edge_from(value)
            out.append((dst, edge, derived))
        return out

    def incoming(self, txn: Txn, dst: int) -> list[tuple[int, str]]:
        """(src docno, kind) of every edge arriving at ``dst``, in key order."""
        out = []
        for key in txn.keys("edges", b"r" + struct.pack(">Q", dst)):
            _, _, k, src = _KEY.unpack(key)
            out.append((src, EDGE_KINDS[k] if k < len(EDGE_KINDS) else "related"))
        return out

    def neighbours(self, txn: Txn, docno: int) -> dict[int, float]:
        """Undirected neighbour weights of ``docno`` (both directions, summed per neighbour).

        ``supersedes`` and ``contradicts`` edges do not spread relevance and are skipped.
        """
        weights: dict[int, float] = {}
        skip = (_kind_no("supersedes"), _kind_no("contradicts"))
        for key, value in txn.items("edges", b"f" + struct.pack(">Q", docno)):
            _, _, k, dst = _KEY.unpack(key)
            weight = _edge_weight(value)
            if k not in skip and weight > 0:
                weights[dst] = weights.get(dst, 0.0) + weight
        for key in txn.keys("edges", b"r" + struct.pack(">Q", docno)):
            _, _, k, src = _KEY.unpack(key)
            if k in skip:
                continue
            data = txn.get("edges", _KEY.pack(b"f", src, k, docno))
            if data is not None:
                weight = _edge_weight(data)
                if weight > 0:
                    weights[src] = weights.get(src, 0.0) + weight
        # a sum of huge weights (stored before link() refused them) can overflow: keep it the
        # largest float, which hop_row still scales (inf would take the whole row)
        return {k: w if w < math.inf else sys.float_info.max for k, w in sorted(weights.items())}

    def superseded(self, txn: Txn, docno: int) -> bool:
        """Whether some live memory supersedes ``docno``."""
        return any(kind == "supersedes" for _, kind in self.incoming(txn, docno))

    def remove_node(self, txn: Txn, docno: int) -> int:
        """Delete every edge touching ``docno``; returns how many edges went."""
        n = 0
        for key in list(txn.keys("edges", b"f" + struct.pack(">Q", docno))):
            _, src, k, dst = _KEY.unpack(key)
            txn.delete("edges", key)
            txn.delete("edges", _KEY.pack(b"r", dst, k, src))
            n += 1
        for key in list(txn.keys("edges", b"r" + struct.pack(">Q", docno))):
            _, dst, k, src = _KEY.unpack(key)
            txn.delete("edges", key)
            txn.delete("edges", _KEY.pack(b"f", src, k, dst))
            n += 1
        return n

    def move_edges(self, txn: Txn, old: int, new: int, new_id: str) -> int:
        """Give every edge of docno ``old`` to docno ``new`` (id ``new_id``), as the
        maintenance pass does for a duplicate it removes; returns how many ``new`` took.

        An edge between the two is dropped (no self-link). Where ``new`` has an edge of
        that kind with that neighbour in that direction already, one stays: a user's edge
        over a derived one (derived ones are recomputed; :meth:`link_tunnels` keeps the
        user's too), else the higher weight, on a tie ``new``'s own. A derived edge goes
        from the lower docno to the higher, where :meth:`link_tunnels` puts it.
        """
        moves: list[tuple[int, int, Edge, bool]] = []
        for key, value in txn.items("edges", b"f" + struct.pack(">Q", old)):
            dst = _KEY.unpack(key)[3]
            edge, derived = _edge_from(value)
            moves.append((new, dst, replace(edge, src=new_id), derived))
        for key in txn.keys("edges", b"r" + struct.pack(">Q", old)):
            _, _, k, src = _KEY.unpack(key)
            data = txn.get("edges", _KEY.pack(b"f", src, k, old))
            if data is not None:  # a reverse key without its edge: verify reports it, nothing to move
                edge, derived = _edge_from(data)
                moves.append((src, new, replace(edge, dst=new_id), derived))
        self.remove_node(txn, old)
        taken = 0
        for src, dst, edge, derived in moves:
            if src == dst:
                continue
            if derived and src > dst:
                src, dst, edge = dst, src, replace(edge, src=edge.dst, dst=edge.src)
            held = txn.get("edges", _KEY.pack(b"f", src, _kind_no(edge.kind), dst))
            if held is not None:
                kept, kept_derived = _edge_from(held)
                if (not kept_derived, kept.weight) >= (not derived, edge.weight):
                    continue
            self.put(txn, src, dst, edge, derived=derived)
            taken += 1
        return taken

    def link_tunnels(self, txn: Txn, nodes: Sequence[tuple[int, Any]], *, now: float = 0.0,
                     threshold: float = TUNNEL_THRESHOLD, top_k: int = TUNNEL_TOP_K) -> int:
        """Recompute every derived tunnel edge from the nodes' entities and topics.

        Uses :func:`engramdb.index.tunnels.link_sets` (exact below 500 nodes, seeded
        MinHash/LSH above), so the result is the same in every process. Each link is
        stored once, from the lower docno to the higher, weighted by its Jaccard score,
        unless a user edge of kind ``tunnel`` holds that place: the user's edge is kept
        (a derived edge there would replace it, and the next recomputation delete it).

        Returns:
            The number of derived tunnel edges now stored.
        """
        nodes = sorted(nodes, key=lambda item: item[0])
        self.drop_derived(txn)
        sets = [tunnel_tokens(node) for _, node in nodes]
        links = link_sets(sets, threshold=threshold, top_k=top_k)
        tunnel = _kind_no("tunnel")
        stored = 0
        for link in links:
            (a, na), (b, nb) = nodes[link.i], nodes[link.j]
            if txn.get("edges", _KEY.pack(b"f", a, tunnel, b)) is not None:
                continue  # every derived edge is gone: this one is the user's
            self.put(txn, a, b, Edge(src=na.id, dst=nb.id, kind="tunnel", weight=link.score,
                                     label=TUNNEL_LABEL, created_at=now), derived=True)
            stored += 1
        return stored

    def drop_derived(self, txn: Txn) -> None:
        """Delete every derived (tunnel) edge."""
        doomed = []
        for key, value in txn.items("edges", b"f"):
            _, derived = _edge_from(value)
            if derived:
                doomed.append(key)
        for key in doomed:
            _, src, k, dst = _KEY.unpack(key)
            txn.delete("edges", key)
            txn.delete("edges", _KEY.pack(b"r", dst, k, src))

    def verify(self, txn: Txn, live: Iterable[int] | NodeIds, ids: Mapping[int, str] | None = None) -> list[str]:
        """Edges pointing at missing nodes, edges naming other ids than their nodes' (when
        ``ids`` is given, or ``live`` is a :class:`NodeIds`), or a forward/reverse index
        mismatch. Streams the edges: memory stays small whatever their number."""
        nodes = live if isinstance(live, NodeIds) else NodeIds.of(live, ids)
        problems: list[str] = []
        dangling = n_fwd = fwd_sum = 0
        batch: list[tuple[int, int, str, str]] = []

        def check() -> int:
            src, dst, src_ok, dst_ok = nodes.check([b[0] for b in batch], [b[1] for b in batch],
                                                   [b[2] for b in batch], [b[3] for b in batch])
            both = src & dst
            problems.extend(f"edges: the edge {batch[i][0]}->{batch[i][1]} names ids that do not match its nodes"
                            for i in np.flatnonzero(both & ~(src_ok & dst_ok)).tolist())
            batch.clear()
            return int((~both).sum())

        try:
            for key, value in txn.items("edges", b"f"):
                _, src, k, dst = _KEY.unpack(key)
                edge, _ = _edge_from(value)
                n_fwd += 1
                fwd_sum += hash((src, k, dst))
                batch.append((src, dst, edge.src, edge.dst))
                if len(batch) >= 4096:
                    dangling += check()
            if batch:
                dangling += check()
        except (CorruptFileError, struct.error) as exc:
            return [f"edges: {exc}"]
        n_rev = rev_sum = 0
        for key in txn.keys("edges", b"r"):
            _, dst, k, src = _KEY.unpack(key)
            n_rev += 1
            rev_sum += hash((src, k, dst))
        if dangling:
            problems.append(f"edges: {dangling} edges point at memories that no longer exist")
        if (n_fwd, fwd_sum) != (n_rev, rev_sum):  # only then both sides are held, to count what differs
            fwd = {(s, k, d) for _, s, k, d in map(_KEY.unpack, txn.keys("edges", b"f"))}
            rev = {(s, k, d) for _, d, k, s in map(_KEY.unpack, txn.keys("edges", b"r"))}
            problems.append(f"edges: the reverse index disagrees with the edges ({len(fwd ^ rev)} entries)")
        return problems

    def repair(self, txn: Txn, live: Iterable[int], ids: Mapping[int, str] | None = None) -> None:
        """Drop dangling edges, rebuild the reverse index from the forward edges, and (with
        ``ids``: docno -> the record's id) make each edge name the ids of the memories it
        links, as :meth:`verify` checks (an edge value that does not decode is left as it is)."""
        live_set = set(live)
        for key in list(txn.keys("edges", b"r")):
            txn.delete("edges", key)
        for key in list(txn.keys("edges", b"f")):
            _, src, k, dst = _KEY.unpack(key)
            if src in live_set and dst in live_set:
                txn.put("edges", _KEY.pack(b"r", dst, k, src), b"")
                if ids is not None:
                    self._rename_ends(txn, key, ids[src], ids[dst])
            else:
                txn.delete("edges", key)

    @staticmethod
    def _rename_ends(txn: Txn, key: bytes, src_id: str, dst_id: str) -> None:
        try:
            edge, derived = _edge_from(txn.get("edges", key) or b"")
        except CorruptFileError:
            return
        if (edge.src, edge.dst) != (src_id, dst_id):
            txn.put("edges", key, _edge_value(replace(edge, src=src_id, dst=dst_id), derived))


class NodeIds:
    """The live docnos (increasing) and the hash of each one's id, for :meth:`Graph.verify`:
    ~16 bytes per memory instead of a set and a dict of them. ``hashes`` None: ids unknown."""

    def __init__(self, docnos: NDArray[np.uint64], hashes: NDArray[np.int64] | None) -> None:
        self.docnos, self.hashes = docnos, hashes

    @classmethod
    def of(cls, live: Iterable[int], ids: Mapping[int, str] | None = None) -> NodeIds:
        docnos = np.array(sorted(set(live)), dtype=np.uint64)
        if ids is None:
            return cls(docnos, None)
        return cls(docnos, np.array([hash(ids.get(d)) for d in docnos.tolist()], dtype=np.int64))

    def check(self, srcs: Sequence[int], dsts: Sequence[int], src_ids: Sequence[str],
              dst_ids: Sequence[str]) -> tuple[NDArray[np.bool_], NDArray[np.bool_], NDArray[np.bool_], NDArray[np.bool_]]:
        """For edges src -> dst naming src_ids -> dst_ids: whether each end is live, and
        whether its id matches (always true without ``hashes``)."""
        out = []
        for docnos, names in ((srcs, src_ids), (dsts, dst_ids)):
            want = np.array(docnos, dtype=np.uint64)
            pos = np.minimum(np.searchsorted(self.docnos, want), max(self.docnos.size - 1, 0))
            found = self.docnos[pos] == want if self.docnos.size else np.zeros(want.size, bool)
            same = (self.hashes[pos] == np.array([hash(n) for n in names], dtype=np.int64)
                    if self.hashes is not None and self.docnos.size else np.ones(want.size, bool))
            out += [found, same]
        return out[0], out[2], out[1], out[3]
