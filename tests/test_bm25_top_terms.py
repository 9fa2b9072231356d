"""``top()``'s adds and selection for two or more terms in one C call, ``top_terms``, against
its numpy twin ``bm25._top_numpy`` (spec/bm25.md, "Queries"): the same docnos (uint64), in
the same order, with the same score bits, whatever the runs' dtypes, codes, ties, repeated
candidates and the looked-up term; the accumulator zero again afterwards, on errors too.
(The long-lived handle against a fresh one on the pure path, with adds, updates, deletes
and merges between queries: tests/test_bm25_native_loop.py and test_bm25_fresh.py.)

Skip without the extension unless ENGRAMDB_REQUIRE_NATIVE=1, as tests/test_native.py does."""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engramdb import _accel
from engramdb.index import bm25

NATIVE = _accel.load({})
if NATIVE is None and os.environ.get("ENGRAMDB_REQUIRE_NATIVE") == "1":
    raise RuntimeError("ENGRAMDB_REQUIRE_NATIVE=1 but engramdb._native is not built")
needs_native = pytest.mark.skipif(NATIVE is None, reason="engramdb._native is not built")

DOC_DTYPES = [np.int64, np.uint32]  # a delta's docnos; a long base run's (_Run)
CODE_DTYPES = [None, np.uint8, np.uint16, np.uint32]  # per posting (a delta); pair codes (_code_dtype)


def _terms(data: st.DataObject, rng: np.random.Generator, n_docs: int) -> list[list[tuple[Any, Any, Any]]]:
    """2-5 terms of 1-2 non-empty runs each (as _Term.runs: a base run and a delta): a
    term's docnos distinct across its runs, increasing in each; values positive, drawn from
    few distinct ones (ties) or wide ones."""
    terms = []
    for _ in range(data.draw(st.integers(2, 5))):
        size = data.draw(st.integers(1, min(n_docs, 120)))
        docnos = np.sort(rng.choice(n_docs, size=size, replace=False))
        cut = data.draw(st.integers(0, size - 1))
        runs = []
        for part in (docnos[:cut], docnos[cut:]):
            if not part.size:
                continue
            dtype = data.draw(st.sampled_from(DOC_DTYPES))
            code_dtype = data.draw(st.sampled_from(CODE_DTYPES))
            nvalues = part.size if code_dtype is None else data.draw(st.integers(1, 40))
            if data.draw(st.booleans()):
                values = rng.choice([0.5, 1.25, 2.0, 3.0], size=nvalues)  # ties
            else:
                values = rng.random(nvalues) * 10.0 ** rng.integers(-3, 3, nvalues) + 1e-9
            codes = None if code_dtype is None else rng.integers(0, nvalues, part.size).astype(code_dtype)
            runs.append((part.astype(dtype), codes, values))
        terms.append(runs)
    return terms


@needs_native
@settings(max_examples=400, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2 ** 32 - 1), k=st.integers(1, 40), n_docs=st.integers(1, 300))
def test_top_terms_is_the_numpy_selection(data: st.DataObject, seed: int, k: int, n_docs: int) -> None:
    rng = np.random.default_rng(seed)
    terms = _terms(data, rng, n_docs)
    longest = data.draw(st.integers(-1, len(terms) - 1))
    best = None
    if longest >= 0:
        # the looked-up term's best: usually some of its docnos (repeating other terms'), at
        # times a docno it does not hold (scores 0.0 where no other term adds)
        own = np.concatenate([r[0].astype(np.int64) for r in terms[longest]])
        best = rng.choice(own, size=min(k, own.size), replace=False)
        if data.draw(st.booleans()):
            best = np.append(best, rng.integers(0, n_docs, 2))
    acc_native = np.zeros(n_docs + data.draw(st.integers(0, 5)))
    acc_numpy = acc_native.copy()
    assert NATIVE is not None
    got_d, got_s = NATIVE.top_terms(acc_native, terms, longest, best, k, np.empty, np.uint64)
    want_d, want_s = bm25._top_numpy(acc_numpy, terms, longest, best, k, 0.0)
    assert got_d.dtype == want_d.dtype == np.uint64 and got_s.dtype == want_s.dtype == np.float64
    assert got_d.tolist() == want_d.tolist()
    assert got_s.tobytes() == want_s.tobytes()
    assert not acc_native.any() and not acc_numpy.any()


@needs_native
def test_top_terms_adds_a_repeated_candidate_once_in_term_order() -> None:
    """Named example: docno 3 is a candidate three times (two other terms and the looked-up
    term's best); it gets each term's part once, summed in term order, and is listed once."""
    assert NATIVE is not None
    vals = np.array([0.1, 0.2, 0.7])
    terms = [[(np.array([1, 3]), None, np.array([0.1, 0.1]))],
             [(np.array([2, 3, 5, 9], np.uint32), np.array([0, 1, 1, 2], np.uint8), vals)],
             [(np.array([3, 4]), None, np.array([0.3, 0.05]))]]
    acc = np.zeros(10)
    docnos, scores = NATIVE.top_terms(acc, terms, 1, np.array([9, 3]), 3, np.empty, np.uint64)
    assert docnos.tolist() == [9, 3, 1]
    assert scores.tolist() == [0.7, (0.1 + 0.2) + 0.3, 0.1]
    assert not acc.any()
    want = bm25._top_numpy(np.zeros(10), terms, 1, np.array([9, 3]), 3, 0.0)
    assert want[0].tolist() == docnos.tolist() and want[1].tobytes() == scores.tobytes()


@needs_native
def test_top_terms_refuses_bad_input_and_leaves_the_accumulator_zero() -> None:
    assert NATIVE is not None
    run = (np.array([1, 2]), None, np.ones(2))
    ok = [[run], [(np.array([2, 3]), np.array([0, 1], np.uint8), np.ones(2))]]
    acc = np.zeros(8)
    bad: list[tuple[tuple[Any, ...], type[Exception], str]] = [
        ((acc, ok, -1, None, 0), ValueError, "k must be positive"),
        ((acc, ok, 2, np.array([1]), 3), ValueError, "longest"),
        ((acc, ok, 0, None, 3), ValueError, "longest"),
        ((acc, ok, -1, np.array([1]), 3), ValueError, "longest"),
        ((acc, [[run], [(np.array([9]), None, np.ones(1))]], -1, None, 3), ValueError, "beyond the accumulator"),
        ((acc, [[run], [(np.array([-1]), None, np.ones(1))]], -1, None, 3), ValueError, "beyond the accumulator"),
        ((acc, ok, 0, np.array([8]), 3), ValueError, "beyond the accumulator"),
        # a bad code after the first term was added: the slots it touched are zeroed again
        ((acc, [[run], [(np.array([2, 3]), np.array([0, 5], np.uint8), np.ones(2))]], -1, None, 3), ValueError,
         "code is beyond"),
        ((acc, [[run], [(np.array([2, 3]), np.array([0, 5], np.uint8), np.ones(2))]], 1, np.array([3]), 3),
         ValueError, "code is beyond"),
        ((acc, [[run], [(np.array([2, 3]), np.array([0], np.uint8), np.ones(2))]], -1, None, 3), ValueError,
         "one code per docno"),
        ((acc, [[run], [(np.array([2, 3]), None, np.ones(3))]], -1, None, 3), ValueError, "one value per docno"),
        ((acc, [[run], [(np.array([2, 3]), None)]], -1, None, 3), TypeError, "a run is a"),
        ((acc, [[run], 5], -1, None, 3), TypeError, "sequence"),
        ((acc, 5, -1, None, 3), TypeError, "sequence"),
        ((acc, [[run], [(np.array([2.0]), None, np.ones(1))]], -1, None, 3), TypeError, "integer"),
        ((acc, [[run], [(np.array([2]), None, np.ones(1, np.float32))]], -1, None, 3), TypeError, "dtype|float64"),
        ((acc, ok, 0, np.array([1.0]), 3), TypeError, "integer"),
        ((acc.astype(np.float32), ok, -1, None, 3), TypeError, "dtype|float64"),
        ((np.zeros(16)[::2], ok, -1, None, 3), TypeError, "writable"),
        ((bytes(64), ok, -1, None, 3), TypeError, "writable"),
    ]
    for args, error, message in bad:
        with pytest.raises(error, match=message):
            NATIVE.top_terms(*args, np.empty, np.uint64)
        assert not acc.any(), (args, message)
    with pytest.raises(TypeError, match="empty"):
        NATIVE.top_terms(acc, ok, -1, None, 3, np.empty, np.float64)  # not uint64 docnos
    assert not acc.any()
    with pytest.raises(ZeroDivisionError):
        NATIVE.top_terms(acc, ok, -1, None, 3, lambda *a: 1 / 0, np.uint64)  # the allocator's error propagates
    assert not acc.any()
