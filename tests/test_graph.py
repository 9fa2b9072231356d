"""Typed edges keyed by docno, tunnels from shared entities/topics, personalised PageRank."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engramdb.engram import Transaction
from engramdb.errors import NotFoundError, ValidationError
from engramdb.index.graph import Graph, one_hop, personalized_pagerank, tunnel_tokens
from engramdb.records import Edge, Node


def _edge(a: str, b: str, kind: str = "related", weight: float = 1.0) -> Edge:
    return Edge(src=a, dst=b, kind=kind, weight=weight, created_at=1.0)


def test_put_get_delete_and_both_directions(store):
    g = Graph()
    store.write(lambda txn: g.put(txn, 1, 2, _edge("a", "b", weight=2.0)))
    store.write(lambda txn: g.put(txn, 3, 1, _edge("c", "a", kind="supersedes")))
    store.write(lambda txn: g.put(txn, 1, 2, _edge("a", "b", kind="tunnel", weight=0.5)))
    with store.read() as txn:
        assert g.get(txn, 1, 2, "related").weight == 2.0
        assert [(d, e.kind) for d, e, _ in g.outgoing(txn, 1)] == [(2, "tunnel"), (2, "related")]  # key order
        assert g.incoming(txn, 1) == [(3, "supersedes")]
        assert g.neighbours(txn, 1) == {2: 2.5}  # supersedes spreads no relevance
        assert g.neighbours(txn, 2) == {1: 2.5}
        assert g.superseded(txn, 1) and not g.superseded(txn, 3)
        assert g.verify(txn, [1, 2, 3]) == []
        assert g.verify(txn, [1, 2])  # node 3 is gone: a dangling edge
    assert store.write(lambda txn: g.delete(txn, 1, 2, "tunnel"))
    assert not store.write(lambda txn: g.delete(txn, 1, 2, "tunnel"))
    assert store.write(lambda txn: g.remove_node(txn, 1)) == 2
    with store.read() as txn:
        assert list(txn.keys("edges")) == []


def test_bad_edges(store):
    g = Graph()
    with pytest.raises(ValidationError):
        store.write(lambda txn: g.put(txn, 1, 1, _edge("a", "a")))
    with pytest.raises(ValidationError):
        store.write(lambda txn: g.delete(txn, 1, 2, "friendship"))


def test_repair_drops_dangling_and_restores_reverse_index(store):
    g = Graph()
    store.write(lambda txn: g.put(txn, 1, 2, _edge("a", "b")))
    store.write(lambda txn: g.put(txn, 2, 9, _edge("b", "z")))
    rev = store.write(lambda txn: [k for k in txn.keys("edges", b"r")])
    store.write(lambda txn: txn.delete("edges", rev[0]))
    with store.read() as txn:
        assert len(g.verify(txn, [1, 2])) == 2
    store.write(lambda txn: g.repair(txn, [1, 2]))
    with store.read() as txn:
        assert g.verify(txn, [1, 2]) == []
        assert [d for d, _, _ in g.outgoing(txn, 2)] == []


def test_tunnels_link_shared_entities_and_are_recomputed(store):
    g = Graph()
    nodes = [
        (1, Node(id="a", entities=("Caroline",), topics=("adoption",))),
        (2, Node(id="b", entities=("caroline",), topics=("adoption",))),
        (3, Node(id="c", entities=("Melanie",), topics=("painting",))),
        (4, Node(id="d", entities=("Melanie",), topics=("painting", "lake"))),
    ]
    store.write(lambda txn: g.put(txn, 1, 3, _edge("a", "c")))  # a user edge survives
    assert store.write(lambda txn: g.link_tunnels(txn, nodes)) == 2
    with store.read() as txn:
        tunnels = sorted((s, d, round(e.weight, 3)) for s in (1, 2, 3, 4) for d, e, derived in g.outgoing(txn, s)
                         if derived)
        assert tunnels == [(1, 2, 1.0), (3, 4, 0.667)]
    assert store.write(lambda txn: g.link_tunnels(txn, nodes[:3])) == 1
    with store.read() as txn:
        assert [d for d, _, _ in g.outgoing(txn, 1)] == [2, 3]
        assert [d for d, _, _ in g.outgoing(txn, 3)] == []
    assert tunnel_tokens(nodes[0][1]) == frozenset({"e:caroline", "t:adoption"})


def test_tunnels_keep_a_user_edge_of_kind_tunnel(make_db):
    # the derived edge replaced the user's (same key), and the next recomputation, with the
    # entities changed, deleted it: the user's edge was lost
    db = make_db()
    db.add("Alice works at Acme", id="a", entities=["Alice", "Acme"])
    db.add("Alice likes Acme", id="b", entities=["Alice", "Acme"])
    db.add("Alice again", id="c", entities=["Alice", "Acme"])
    db.link("a", "b", "tunnel", weight=0.5, label="mine")
    assert db.link_tunnels() == 2  # a-c and b-c; a-b is the user's
    edges = {e.dst: (e.label, e.weight) for e in db.edges("a")}
    assert edges == {"b": ("mine", 0.5), "c": ("shared entities/topics", 1.0)}
    db.update("b", entities=["Zed"])
    assert db.link_tunnels() == 1
    assert {e.dst: e.label for e in db.edges("a")} == {"b": "mine", "c": "shared entities/topics"}
    db.verify(fix=True)  # rebuilds the indexes, tunnels included
    assert {e.dst: e.label for e in db.edges("a")} == {"b": "mine", "c": "shared entities/topics"}


def _closed_form(adj: np.ndarray, seeds: np.ndarray, alpha: float) -> np.ndarray:
    n = len(seeds)
    s = seeds / seeds.sum()
    out = adj.sum(axis=1)
    trans = np.zeros_like(adj)
    for i in range(n):
        trans[i] = adj[i] / out[i] if out[i] > 0 else s  # dangling rows teleport to the seeds
    return alpha * np.linalg.solve(np.eye(n) - (1 - alpha) * trans.T, s)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 7).flatmap(lambda n: st.tuples(
    st.lists(st.lists(st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.0]), min_size=n, max_size=n), min_size=n, max_size=n),
    st.lists(st.sampled_from([0.0, 1.0, 3.0]), min_size=n, max_size=n).filter(lambda s: sum(s) > 0))))
def test_pagerank_equals_the_closed_form(case):
    adj, seeds = (np.asarray(x, dtype=np.float64) for x in case)
    np.fill_diagonal(adj, 0.0)
    got = personalized_pagerank(adj, seeds, alpha=0.15, iterations=500, tol=1e-14)
    want = _closed_form(adj, seeds, 0.15)
    assert np.allclose(got, want, atol=1e-9)
    assert got.sum() == pytest.approx(1.0)


def test_pagerank_rejects_bad_input():
    with pytest.raises(ValidationError):
        personalized_pagerank(np.zeros((2, 2)), np.zeros(2))
    with pytest.raises(ValidationError):
        personalized_pagerank(np.zeros((2, 3)), np.ones(2))
    with pytest.raises(ValidationError):
        personalized_pagerank(-np.ones((2, 2)), np.ones(2))


def test_engram_link_and_edges(make_db):
    db = make_db()
    db.add("one", id="a")
    db.add("two", id="b")
    db.link("a", "b", "supersedes", label="newer")
    assert [(e.dst, e.kind, e.label) for e in db.edges("a")] == [("b", "supersedes", "newer")]
    with pytest.raises(NotFoundError):
        db.link("a", "missing")
    with pytest.raises(ValidationError):
        db.link("a", "b", "friendship")
    db.delete("b")
    assert db.edges("a") == []  # edges of a deleted memory go with it


def test_transaction_link_batches_edges_in_one_commit(make_db):
    """Transaction.link is the public batched path (the LoCoMo adapter links every
    neighbouring turn with it): edges added with memories in the same block, visible via
    db.edges, verify clean, and all undone when the block raises."""
    db = make_db()
    with db.transaction() as tx:
        for i in range(5):
            tx.add(f"turn {i}", id=f"t{i}")
        for i in range(4):
            tx.link(f"t{i}", f"t{i + 1}", "related", weight=0.5, label="next", now=7.0)
        tx.link("t4", "t0", "supersedes", now=7.0)
    assert [(e.src, e.dst, e.kind, e.weight, e.label, e.created_at) for e in db.edges("t1")] == [
        ("t1", "t2", "related", 0.5, "next", 7.0)]
    assert [(e.dst, e.kind) for e in db.edges("t4")] == [("t0", "supersedes")]
    assert db.verify() == []
    with pytest.raises(RuntimeError), db.transaction() as tx:
        tx.add("late", id="t5")
        tx.link("t4", "t5", "related", now=7.0)
        tx.link("t0", "t2", "related", now=7.0)
        raise RuntimeError("abort")
    assert "t5" not in db
    assert [e.dst for e in db.edges("t0")] == ["t1"]  # the rolled-back edge is gone
    assert [e.kind for e in db.edges("t4")] == ["supersedes"]
    assert db.verify() == []
    with db.transaction() as tx:
        with pytest.raises(NotFoundError):
            tx.link("t0", "missing")
        with pytest.raises(ValidationError):
            tx.link("t0", "t0")
        with pytest.raises(ValidationError):
            tx.link("t0", "t1", "friendship")


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6).flatmap(lambda n: st.tuples(
    st.lists(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=n, max_size=n), min_size=n, max_size=n),
    st.lists(st.sampled_from([0.0, 1.0, 2.5]), min_size=n, max_size=n))))
def test_one_hop_is_the_first_pagerank_step(case):
    adj, seeds = (np.asarray(x, dtype=np.float64) for x in case)
    neighbours = {i: {j: float(adj[i, j]) for j in range(len(seeds)) if adj[i, j] > 0} for i in range(len(seeds))}
    got = one_hop(neighbours, {i: float(seeds[i]) for i in range(len(seeds))})
    want = np.zeros(len(seeds))
    for i in range(len(seeds)):
        out = adj[i].sum()
        if out > 0:
            want += seeds[i] * adj[i] / out  # P^T s, dense
    assert np.allclose([got.get(j, 0.0) for j in range(len(seeds))], want)
    assert set(got) <= {j for nb in neighbours.values() for j in nb}
    with pytest.raises(ValidationError):
        one_hop({0: {1: -1.0}}, {0: 1.0})


def _hop_row_before_session_8(neighbours):
    """hop_row as it was before huge stored weights were handled: the reference its results
    for ordinary weights must equal bit for bit."""
    if not neighbours:
        return ()
    dsts = sorted(neighbours)
    total = sum(neighbours[dst] for dst in dsts)
    if total <= 0:
        return ()
    return tuple((dst, neighbours[dst] / total) for dst in dsts)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.integers(0, 50), st.one_of(
    st.floats(0, 1e6), st.floats(0, 1e300), st.sampled_from([0.0, 1.0, 0.1, 1e-300, 5e-324])), max_size=12))
def test_the_hop_row_of_ordinary_weights_is_unchanged(neighbours):
    from engramdb.index.graph import hop_row

    assert hop_row(neighbours) == _hop_row_before_session_8(neighbours)


def test_link_refuses_a_weight_the_hop_cannot_sum(make_db):
    # link(a, c, weight=1e308) both ways made a's neighbour sum infinite: NaN shares, and the
    # hop silently added nothing
    db = make_db()
    db.add("one", id="a")
    db.add("two", id="b")
    for weight in (1e308, -1e308, 1.1e300, float("inf"), float("nan")):
        with pytest.raises(ValidationError, match="weight"):
            db.link("a", "b", weight=weight)
        with pytest.raises(ValidationError, match="weight"), db.transaction() as tx:
            tx.link("a", "b", weight=weight)
    assert db.edges("a") == []
    db.link("a", "b", weight=1e300)
    assert [e.weight for e in db.edges("a")] == [1e300]


def test_the_hop_spreads_over_huge_weights_stored_before_they_were_refused(make_db, now):
    def build(weight, stored_raw):
        db = make_db(f"w{weight:g}.engram")
        for i, text in enumerate(["alpha beta gamma", "unrelated words here", "other text entirely", "filler"]):
            db.add(text, id="abcd"[i], now=now)
        db.link("a", "b", weight=1.0, now=now)
        edges = [("a", "c"), ("c", "a")]
        if stored_raw:  # as an older version's link() stored them
            def put(txn):
                tx = Transaction(db, txn)
                for s, d in edges:
                    db.indexes.graph.put(txn, tx._docno(s), tx._docno(d), Edge(s, d, weight=weight, created_at=now))

            db._store.write(put)
        else:
            for s, d in edges:
                db.link(s, d, weight=weight, now=now)
        return [h.id for h in db.recall("alpha", top_k=5, now=now)]

    assert build(1e10, stored_raw=False) == ["a", "c", "b"]
    assert build(1e308, stored_raw=True) == ["a", "c", "b"]  # was ["a"]
    from engramdb.index.graph import hop_row

    assert hop_row({1: 1.5e308, 2: 1.5e308, 3: 0.0}) == ((1, 0.5), (2, 0.5), (3, 0.0))  # the sum overflows
    assert hop_row({1: float("inf"), 2: 1.0}) == ((1, 1.0), (2, 0.0))
