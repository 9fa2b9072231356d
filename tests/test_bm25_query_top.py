"""``top()`` for two or more terms in one C call, ``query_top`` (``_Term.of`` and the rest
of ``top``: the terms' values under the state, memoised on their postings, the looked-up
term, the accumulator and ``top_terms``), against the Python it replaces: the same answer
(docnos, order, score bits), the same memos (keys and value bits), nothing memoised for a
write transaction, and on every error the accumulator zero and the memos right (absent or
equal to ``_Term.of``'s). The long-lived handle against a fresh one on the pure path, with
adds, updates, deletes and merges between queries, own or another process's:
tests/test_bm25_native_loop.py.

And ``_found``'s loop in C, ``query_found``: the same (postings, weight) list as the Python
loop (the same cached entries, float weights), the same weight errors, errors passed on.

Skip without the extension unless ENGRAMDB_REQUIRE_NATIVE=1, as tests/test_native.py does."""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from engramdb import _accel
from engramdb.index import bm25
from engramdb.index.bm25 import SegmentedBM25

NATIVE = _accel.load({})
if NATIVE is None and os.environ.get("ENGRAMDB_REQUIRE_NATIVE") == "1":
    raise RuntimeError("ENGRAMDB_REQUIRE_NATIVE=1 but engramdb._native is not built")
pytestmark = pytest.mark.skipif(NATIVE is None, reason="engramdb._native is not built")

QUERIES: list[Any] = [["w0", "w1"], ["w2", "w9", "w30"], {"w0": 2.0, "w5": 0.5}, ["w3", "w3", "w11"], ["w1", "w39"],
                      ["w0", "w1", "w2", "w3", "w4", "w5"]]


@pytest.fixture
def built(store, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A store with a large segment and small ones (deltas), tombstones among both."""
    monkeypatch.setattr(bm25, "SMALL_SEGMENT_DOCS", 6)
    rng = np.random.default_rng(5)
    words = [f"w{i}" for i in range(40)]
    p = 1.0 / np.arange(1, len(words) + 1)
    p /= p.sum()

    def doc() -> list[str]:
        return [str(w) for w in rng.choice(words, size=int(rng.integers(2, 40)), p=p)]

    writer = SegmentedBM25(store.blind, store.last_txnid)
    store.write(lambda txn: writer.apply(txn, [(d, doc()) for d in range(1, 400)], []))
    for d in range(400, 420):
        store.write(lambda txn, d=d: writer.apply(txn, [(d, doc())], [d - 390] if d % 3 == 0 else []))
    return store


def _old(idx: SegmentedBM25, txn: Any, query: Any, k: int) -> tuple[Any, Any, list[Any]]:
    """What top() did before query_top (``_Term.of`` and its native tail), and the terms."""
    found, d = idx._found(txn, query)
    parts = bm25._Term.of(found, d.n_docs, d.total_len, not txn.write)
    sizes = [p.size for p in parts]
    longest = max(range(len(parts)), key=sizes.__getitem__)
    lookup = sizes[longest] > bm25.LOOKUP_RATIO * (sum(sizes) - sizes[longest])
    best = parts[longest].best(k)[0] if lookup else None
    acc = idx._accumulator(max(p.max_docno for p in parts) + 1)
    assert NATIVE is not None
    got = NATIVE.top_terms(acc, [p.runs for p in parts], longest if lookup else -1, best, k, np.empty, np.uint64)
    return got[0], got[1], found


def _call(idx: SegmentedBM25, txn: Any, terms: Any, depth: int, **over: Any) -> Any:
    d = idx._directory(txn)
    args: dict[str, Any] = dict(found=terms, n_docs=d.n_docs, total_len=d.total_len, cached=not txn.write,
                                loop=bm25._log1p_loop(NATIVE), k1=bm25.K1, b=bm25.B, ratio=bm25.LOOKUP_RATIO, k=depth,
                                acc=getattr(idx._local, "acc", None), grow=idx._accumulator,
                                best_of=bm25._lookup_best, empty=np.empty, uint64=np.uint64)
    args.update(over)
    assert NATIVE is not None
    return NATIVE.query_top(*args.values())


def _same_memos(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for (pa, wa), (pb, wb) in zip(a, b):
        assert wa == wb and list(pa.memo) == list(pb.memo)
        for key in pa.memo:
            for x, y in zip(pa.memo[key][:2], pb.memo[key][:2]):
                assert x.dtype == y.dtype and x.tobytes() == y.tobytes()


def _assert_zero(idx: SegmentedBM25) -> None:
    acc = getattr(idx._local, "acc", None)
    assert acc is None or not acc.any()


@pytest.mark.parametrize("ratio", [bm25.LOOKUP_RATIO, 0.0])
def test_query_top_is_term_of_and_top_terms(built, monkeypatch: pytest.MonkeyPatch, ratio: float) -> None:
    # ratio 0.0: every query looks its longest term up (best_of)
    monkeypatch.setattr(bm25, "LOOKUP_RATIO", ratio)
    new, old, pure = (SegmentedBM25(built.blind, built.last_txnid) for _ in range(3))
    with built.read() as txn:
        for _ in range(2):  # values computed, then memoised
            for query in QUERIES:
                for k in (1, 10, 300):
                    want_d, want_s, found_old = _old(old, txn, query, k)
                    found_new, _ = new._found(txn, query)
                    got_d, got_s = _call(new, txn, found_new, k)
                    assert got_d.dtype == np.uint64 and got_s.dtype == np.float64
                    assert got_d.tolist() == want_d.tolist() and got_s.tobytes() == want_s.tobytes(), (query, k)
                    _same_memos(found_new, found_old)
                    d = new._directory(txn)
                    assert all((d.n_docs, d.total_len, w) in p.memo for p, w in found_new)
                    saved = _accel.NATIVE
                    try:
                        _accel.NATIVE = None
                        want = pure.search(txn, query, k)
                    finally:
                        _accel.NATIVE = saved
                    assert new.search(txn, query, k) == want
                    _assert_zero(new)


def test_query_top_memoises_nothing_in_a_write_transaction(built) -> None:
    idx, old = SegmentedBM25(built.blind, built.last_txnid), SegmentedBM25(built.blind, built.last_txnid)

    def check(txn: Any) -> None:
        for query in QUERIES:
            want_d, want_s, _ = _old(old, txn, query, 10)
            found, _ = idx._found(txn, query)
            got_d, got_s = _call(idx, txn, found, 10)
            assert got_d.tolist() == want_d.tolist() and got_s.tobytes() == want_s.tobytes()
            assert all(not p.memo for p, _ in found)
    built.write(check)


def test_query_top_grows_the_accumulator_to_the_largest_docno(built) -> None:
    idx = SegmentedBM25(built.blind, built.last_txnid)
    asked: list[int] = []

    def grow(size: int) -> Any:
        asked.append(size)
        return idx._accumulator(size)

    with built.read() as txn:
        found, _ = idx._found(txn, ["w0", "w1"])
        top = max(int(a[-1]) for p, _ in found for a in (p.base.docnos, p.delta.docnos) if a.size)
        want = _call(idx, txn, found, 10, acc=None, grow=grow)
        assert asked == [top + 1]
        got = _call(idx, txn, found, 10, acc=np.zeros(top), grow=grow)  # one short
        assert asked == [top + 1, top + 1] and got[1].tobytes() == want[1].tobytes()
        _call(idx, txn, found, 10, acc=np.zeros(top + 1), grow=grow)  # long enough: kept
        assert asked == [top + 1, top + 1]


def test_query_top_errors_leave_the_accumulator_zero_and_the_memos_right(built, monkeypatch: pytest.MonkeyPatch) -> None:
    idx, ref = SegmentedBM25(built.blind, built.last_txnid), SegmentedBM25(built.blind, built.last_txnid)

    def boom(*args: Any) -> Any:
        raise ZeroDivisionError("boom")

    with built.read() as txn:
        query = ["w0", "w2", "w9"]
        _, _, found_ref = _old(ref, txn, query, 10)
        # raised after the values were computed and memoised: the memos are whole and right
        for over in ({"ratio": 0.0, "best_of": boom}, {"acc": None, "grow": boom},
                     {"acc": np.zeros(10 ** 4, np.float32)}, {"uint64": np.float64}, {"empty": boom}):
            found, _ = idx._found(txn, query)
            for p, _ in found:
                p.memo.clear()
            with pytest.raises((ZeroDivisionError, TypeError)):
                _call(idx, txn, found, 10, **over)
            _assert_zero(idx)
            if "empty" in over:  # term_values' own allocation failed: nothing memoised
                assert all(not p.memo for p, _ in found)
            else:
                _same_memos(found, found_ref)
        found, _ = idx._found(txn, query)
        for p, _ in found:
            p.memo.clear()
        bad: list[tuple[dict[str, Any], type[Exception], str]] = [
            ({"found": found[:1]}, ValueError, "two or more"),
            ({"found": []}, ValueError, "two or more"),
            ({"found": 5}, TypeError, "sequence"),
            ({"found": [found[0], (found[1][0], 1)]}, TypeError, "float weight"),
            ({"found": [found[0], found[1][0]]}, TypeError, "float weight"),
            ({"found": [found[0], (object(), 1.0)]}, AttributeError, "base"),
            ({"k": 0}, ValueError, "positive"),
            ({"n_docs": 0}, ValueError, "positive"),
            ({"n_docs": 1.5}, TypeError, "int"),
            ({"loop": None}, ValueError, "capsule|PyCapsule"),
        ]
        for over, error, message in bad:
            with pytest.raises(error, match=message):
                _call(idx, txn, found, 10, **over)
            assert all(not p.memo for p, _ in found), over
            _assert_zero(idx)
        assert idx.search(txn, query, 10) == ref.search(txn, query, 10)  # and the handle answers as before


def test_query_top_keeps_the_latest_states_memos_as_term_of_does(built) -> None:
    # a memo holding 4 states is cleared before the 5th is stored (_Term.of's bound)
    idx = SegmentedBM25(built.blind, built.last_txnid)
    with built.read() as txn:
        found, d = idx._found(txn, ["w0", "w1"])
        for p, _ in found:
            p.memo.clear()
            p.memo.update({(d.n_docs + i, d.total_len, 1.0): p.memo.get(0) for i in range(1, 5)})
        found[1][0].memo.pop((d.n_docs + 1, d.total_len, 1.0))  # 3 states: kept
        _call(idx, txn, found, 10)
        assert list(found[0][0].memo) == [(d.n_docs, d.total_len, 1.0)]
        assert len(found[1][0].memo) == 4 and (d.n_docs, d.total_len, 1.0) in found[1][0].memo


# --- query_found: the query's terms and their cached postings --------------------------------


def _found_both(idx: SegmentedBM25, txn: Any, query: Any) -> tuple[Any, Any]:
    """``_found`` with the extension (query_found) and on the Python loop, one handle."""
    got, _ = idx._found(txn, query)
    saved = _accel.NATIVE
    try:
        _accel.NATIVE = None
        want, _ = idx._found(txn, query)
    finally:
        _accel.NATIVE = saved
    return got, want


def test_query_found_is_the_python_loop(built) -> None:
    idx = SegmentedBM25(built.blind, built.last_txnid)
    queries = [*QUERIES, ["nowhere", "w0"], {"w1": 3, "w2": 0.25}, ["w0"] * 3, []]
    with built.read() as txn:
        for _ in range(2):  # entries built by the Python loop, then found marked in C
            for query in queries:
                idx._blinds.clear()  # blind() for each term, then the memo
                for _ in range(2):
                    got, want = _found_both(idx, txn, query)
                    assert [(id(p), w, type(w)) for p, w in got] == [(id(p), w, type(w)) for p, w in want]
    # a new state: every entry is caught up by _term_postings, then marked
    built.write(lambda txn: idx.apply(txn, [(10_000, ["w0", "w2", "zz"])], [3]))
    with built.read() as txn:
        fresh = SegmentedBM25(built.blind, built.last_txnid)
        for query in queries:
            got, _ = idx._found(txn, query)
            want, _ = fresh._found(txn, query)
            assert [(p.live, p.base.docnos.tolist(), p.delta.docnos.tolist(), w) for p, w in got] == \
                [(p.live, p.base.docnos.tolist(), p.delta.docnos.tolist(), w) for p, w in want]
            got2, want2 = _found_both(idx, txn, query)
            assert [id(p) for p, _ in got2] == [id(p) for p, _ in want2] == [id(p) for p, _ in got]


def test_query_found_checks_weights_as_the_python_loop(built) -> None:
    idx = SegmentedBM25(built.blind, built.last_txnid)
    with built.read() as txn:
        for w in (1, 2, 0.5, np.float64(2.0), 10**300):
            got, want = _found_both(idx, txn, {"w0": w, "w1": 1.0})
            assert [(id(p), v, type(v)) for p, v in got] == [(id(p), v, type(v)) for p, v in want]
        for w in (0, -1, 0.0, -0.5, float("nan"), float("inf"), True, "2", None, 10**400, np.int64(3)):
            errors = []
            for native in (NATIVE, None):
                saved = _accel.NATIVE
                try:
                    _accel.NATIVE = native
                    with pytest.raises(Exception) as info:
                        idx._found(txn, {"w0": 1.0, "w5": w})
                finally:
                    _accel.NATIVE = saved
                errors.append((type(info.value), str(info.value)))
            assert errors[0] == errors[1], w


def test_query_found_passes_errors_on(built, monkeypatch: pytest.MonkeyPatch) -> None:
    idx = SegmentedBM25(built.blind, built.last_txnid)

    def boom(*args: Any) -> Any:
        raise ZeroDivisionError("boom")

    with built.read() as txn:
        d = idx._directory(txn)
        args = [["w0", "w1"], {"w0": 1, "w1": 1}, bm25._check_weight, {}, idx.blind, idx._cache.get, d.serial,
                idx._term_postings, txn, d]
        assert NATIVE is not None
        assert len(NATIVE.query_found(*args)) == 2
        for at, value, error in ((4, boom, ZeroDivisionError), (5, boom, ZeroDivisionError),
                                 (7, boom, ZeroDivisionError), (1, {"w0": 1}, KeyError), (1, [], TypeError),
                                 (0, 5, TypeError), (3, None, TypeError)):
            bad = list(args)
            bad[at] = value
            if at == 7:
                bad[6] = -1  # no entry is marked for this state: every term asks term_postings
            with pytest.raises(error):
                NATIVE.query_found(*bad)
        assert [p for p, _ in NATIVE.query_found(*args)] == [p for p, _ in idx._found(txn, ["w0", "w1"])[0]]
