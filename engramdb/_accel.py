"""The optional C extension, ``engramdb._native``, or None.

``pip install .`` builds the extension with the machine's C compiler and OpenSSL's
libcrypto (setup.py; it is optional, so an install without them still succeeds). It
batches the bulk-write path's crypto calls (AES-256-GCM seals, HMAC-SHA256 blind keys,
state-digest terms) over OpenSSL's EVP API, and runs the bulk tokenizer's word scan, the
node objects and records of a bulk load, a segment's postings and posting blocks, and the
BM25 top-k scorer's per-run add into its accumulator and a term's best documents: the
same algorithms and the same bytes as the pure-Python path, which runs when the extension
is missing or when the environment variable ``ENGRAMDB_PURE_PYTHON=1`` is set before
engramdb is imported.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

PURE_ENV = "ENGRAMDB_PURE_PYTHON"

Pairs = Sequence[tuple[bytes, bytes]]


class Native(NamedTuple):
    """The extension's functions (engramdb/_native.c describes each)."""

    seal_many: Callable[[bytes, bytes, bytes, bytes, Pairs], list[bytes]]
    hmac_many: Callable[[bytes, bytes, Sequence[bytes], int], list[bytes]]
    state_sum: Callable[[bytes, bytes, Pairs], bytes]
    scan_texts: Callable[[Sequence[str | bytes], bytes], tuple[list[str], bytes, bytes]]
    keep_tokens: Callable[[bytes, bytes, bytes], tuple[bytes, bytes]]
    plain_records: Callable[[Sequence[dict[str, object]], tuple[str, ...], tuple[object, ...], int], list[bytes | None]]
    new_nodes: Callable[..., list[Any]]
    posting_blocks: Callable[[Any, Any, Any, int], tuple[list[bytes], list[int]] | None]
    count_postings: Callable[[Any, Any, Any, Any, int], tuple[bytes, bytes, bytes]]
    columns_pass: Callable[[Sequence[Any], tuple[tuple[str, int, int], ...]], bool]
    accumulate: Callable[[Any, Any, Any, Any], None]
    pair_values: Callable[[Any, Sequence[tuple[Any, Any, float, float]], float, float, float], None]
    frontier_best: Callable[[Any, Any, Any, Any, Any, Any, int, Any, Any], int]
    best_runs: Callable[[Sequence[tuple[Any, Any, Any]], int, Any, Any], int]
    concat_postings: Callable[[Sequence[tuple[Any, Any, Any]], Any, Any, Any], bool]
    term_holders: Callable[[bytes, Sequence[tuple[int, Any]], tuple[int, ...], tuple[int, ...], dict[int, int]],
                           tuple[tuple[int, ...], tuple[int, ...]]]
    idf_values: Callable[[Any, int, Sequence[int]], list[float]]
    term_values: Callable[[Any, int, float, float, float, Sequence[tuple[int, float, Any, Any, Any, Any]],
                           Callable[[int], Any]], list[tuple[Any, Any]]]
    fresh_delta: Callable[[bytes, Any, Any, Any, Sequence[Any], Callable[..., Any], Any],
                          tuple[Any, Any, Any, tuple[int, ...], bool]]
    top_terms: Callable[[Any, Sequence[Sequence[tuple[Any, Any, Any]]], int, Any, int, Callable[..., Any], Any],
                        tuple[Any, Any]]
    query_top: Callable[..., tuple[Any, Any]]
    query_found: Callable[..., list[tuple[Any, float]]]


def load(environ: dict[str, str] | None = None) -> Native | None:
    """The extension, unless ``ENGRAMDB_PURE_PYTHON`` is set (to anything but ``0``) or it
    is not built."""
    env = os.environ if environ is None else environ
    if env.get(PURE_ENV, "").strip() not in ("", "0"):
        return None
    try:
        from ._native import (accumulate, best_runs, columns_pass, concat_postings, count_postings, frontier_best,
                              hmac_many, idf_values, keep_tokens, new_nodes, pair_values, plain_records, posting_blocks,
                              query_found, query_top, scan_texts, seal_many, state_sum, term_holders, term_values,
                              fresh_delta, top_terms)
    except ImportError:
        return None
    return Native(seal_many, hmac_many, state_sum, scan_texts, keep_tokens, plain_records, new_nodes, posting_blocks,
                  count_postings, columns_pass, accumulate, pair_values, frontier_best, best_runs, concat_postings,
                  term_holders, idf_values, term_values, fresh_delta, top_terms, query_top, query_found)


# What new Sealers use (tests swap it to run both paths in one process).
NATIVE: Native | None = load()
