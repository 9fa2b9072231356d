"""The one token counter behind every budget (spec/recall.md, "Token budgets").

``recall_context``, ``inject_context`` and :func:`estimate_tokens` share it; each of the
first two takes ``count_tokens=`` (any callable ``str -> int``, e.g. a model's own
tokenizer) and treats its budget as a hard limit *under that counter*: the text returned
is measured whole, as returned, never as a sum of its pieces.
"""
from __future__ import annotations

from typing import Any
from collections.abc import Callable

import numpy as np

from .errors import ValidationError

__all__ = ["estimate_tokens", "token_counter"]

Counter = Callable[[str], int]


def estimate_tokens(text: str) -> int:
    """Token estimate: ``ceil(max(1.3 * words, chars / 4))`` in integer arithmetic.

    Close to (and for English prose rarely below) what LLM tokenizers count. The character
    floor keeps dense runs without spaces (AAAK lines, URLs, code) from hiding from a
    budget.

    Raises:
        ValidationError: ``text`` is not a string.
    """
    if not isinstance(text, str):
        raise ValidationError(f"estimate_tokens takes a str, got {type(text).__name__}",
                              hint="pass the text to count")
    words = len(text.split())
    return max(-(-13 * words // 10), -(-len(text) // 4))


def token_counter(count_tokens: Any = None) -> Counter:
    """``count_tokens`` checked, or :func:`estimate_tokens` for ``None``: a counter that raises
    :class:`ValidationError` (not the user's exception) when the user's function fails or
    returns something other than a non-negative int.

    Raises:
        ValidationError: ``count_tokens`` is not callable.
    """
    if count_tokens is None or count_tokens is estimate_tokens:
        return estimate_tokens
    if not callable(count_tokens):
        raise ValidationError("count_tokens must be a function str -> int", hint="e.g. lambda s: len(enc.encode(s))")

    def count(text: str) -> int:
        try:
            n = count_tokens(text)
        except Exception as exc:
            raise ValidationError(f"count_tokens raised {type(exc).__name__}: {exc}",
                                  hint="count_tokens must accept any string") from exc
        if isinstance(n, np.integer):  # a NumPy count (mask.sum()) is an int too, as recall's counts are
            n = int(n)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValidationError(f"count_tokens must return a non-negative int, got {n!r}",
                                  hint="return len(...) of the tokens")
        return n

    return count
