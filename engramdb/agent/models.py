"""Calling the user's model callables (extractor, summarizer, proposer): their failures are
reported as :class:`ValidationError` naming the callable, with the original exception as the
cause, so a caller catching ``EngramError`` around a hook catches a model's failure too."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from ..errors import EngramError, ValidationError

__all__ = ["call_model", "iterate_model"]

T = TypeVar("T")


def _failed(what: str, exc: Exception) -> ValidationError:
    return ValidationError(f"the {what} raised {type(exc).__name__}: {exc}",
                           hint=f"nothing of what it was called for was written; fix the {what} or call again "
                                "(its exception is this error's __cause__)")


def call_model(fn: Callable[[Any], T], arg: Any, what: str) -> T:
    """``fn(arg)``; an exception other than an ``EngramError`` becomes a ValidationError.

    Raises:
        ValidationError: ``fn`` raised.
    """
    try:
        return fn(arg)
    except EngramError:
        raise
    except Exception as exc:
        raise _failed(what, exc) from exc


def iterate_model(items: Iterable[T], what: str) -> Iterator[T]:
    """The items of what a model callable returned (a generator may raise while iterated).

    Raises:
        ValidationError: iterating raised.
    """
    iterator: Iterator[T] | None = None
    while True:
        try:
            if iterator is None:
                iterator = iter(items)
            item = next(iterator)
        except StopIteration:
            return
        except EngramError:
            raise
        except Exception as exc:
            raise _failed(what, exc) from exc
        yield item
