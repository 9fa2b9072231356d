"""The options ``compress`` accepts, validated once into a frozen value.

Unknown option names raise :class:`ValidationError` (a typo such as ``chunksize=`` must
not be silently ignored), and every value is checked here so the pipeline below can
trust it.
"""
from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass, fields
from typing import Any
from collections.abc import Iterable, Mapping

from ..errors import ValidationError
from .dates import parse_date
from .zc import ALL_FIXES

__all__ = ["CompressOptions", "parse_options"]

_HINT = "see engramdb.compress.compress for the options and their ranges"


@dataclass(frozen=True)
class CompressOptions:
    """Validated ``compress`` options (see :func:`engramdb.compress.compress`)."""

    chunk_size: int = 800
    chunk_overlap: int = 100
    date: str | None = None
    title: str | None = None
    min_entity_frequency: int = 1
    stop_words: tuple[str, ...] = ()
    temperature: float = 0.5
    tunnel_threshold: float = 0.3
    tunnel_top_k: int = 3
    dedupe: bool = False
    dedupe_threshold: float = 0.9
    verbose_labels: bool = False
    keep_source: bool = True
    fixes: tuple[str, ...] = ALL_FIXES
    method: str = "zettel-compress"


OPTION_NAMES = tuple(f.name for f in fields(CompressOptions))


def _int(name: str, value: object, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValidationError(f"{name} must be an integer >= {lo}, got {value!r}", hint=_HINT)
    return value


def _num(name: str, value: object, lo: float, hi: float, *, open_lo: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValidationError(f"{name} must be a finite number, got {value!r}", hint=_HINT)
    value = float(value)
    if value > hi or value < lo or (open_lo and value == lo):
        bracket = "(" if open_lo else "["
        raise ValidationError(f"{name} must be in {bracket}{lo}, {hi}], got {value!r}", hint=_HINT)
    return value


def _bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValidationError(f"{name} must be True or False, got {value!r}", hint=_HINT)
    return value


def _opt_str(name: str, value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise ValidationError(f"{name} must be a string or None, got {type(value).__name__}", hint=_HINT)


def _date(value: object) -> str | None:
    # a datetime is a date too; take its calendar day
    if isinstance(value, _dt.datetime):
        return value.date().isoformat()
    if isinstance(value, _dt.date):
        return value.isoformat()
    value = _opt_str("date", value)
    # a date the parser cannot read would silently anchor nothing: a typo must not pass
    if value is not None and parse_date(value) is None:
        raise ValidationError(
            f"date {value!r} is not a date",
            hint="use YYYY-MM-DD, YYYY-MM or YYYY (e.g. 2023-05-08), an English date such as "
            "'8 May 2023' or 'May 8, 2023', or a datetime.date",
        )
    return value


def _words(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ValidationError("stop_words must be a list of words, not a single string", hint=_HINT)
    out = []
    for word in value:
        if not isinstance(word, str):
            raise ValidationError(f"stop_words must contain strings, got {type(word).__name__}", hint=_HINT)
        out.append(word.lower())
    return tuple(sorted(set(out)))


METHODS = ("zettel-compress", "refined")


def _choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValidationError(f"{name} must be one of {', '.join(choices)}, got {value!r}", hint=_HINT)
    return str(value)


def _fixes(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ValidationError("fixes must be a list of fix names, not a single string",
                              hint=f"known fixes: {', '.join(ALL_FIXES)}; () gives zettel-compress 1.0.0 exactly")
    out = set()
    for name in value:
        if name not in ALL_FIXES:
            raise ValidationError(f"unknown fix {name!r}",
                                  hint=f"known fixes: {', '.join(ALL_FIXES)}; () gives zettel-compress 1.0.0 exactly")
        out.add(name)
    return tuple(f for f in ALL_FIXES if f in out)


def parse_options(options: Mapping[str, Any], *, allowed: Iterable[str] = OPTION_NAMES) -> CompressOptions:
    """Validate ``options`` (keyword arguments of ``compress``) into :class:`CompressOptions`.

    Raises:
        ValidationError: an unknown option name, a value out of range, or a ``date``
            the date parser cannot read.
    """
    allowed = tuple(allowed)
    unknown = sorted(k for k in options if k not in allowed)
    if unknown:
        raise ValidationError(
            f"unknown compress option(s): {', '.join(unknown)}",
            hint=f"valid options: {', '.join(allowed)}",
        )
    d = dict(options)
    chunk_size = _int("chunk_size", d.get("chunk_size", 800), 1)
    # the default overlap (100) shrinks with a small chunk_size rather than failing on
    # an option the caller never set
    chunk_overlap = _int("chunk_overlap", d.get("chunk_overlap", min(100, chunk_size // 2)), 0)
    if chunk_overlap >= chunk_size:
        raise ValidationError(
            f"chunk_overlap ({chunk_overlap}) must be smaller than chunk_size ({chunk_size})", hint=_HINT
        )
    return CompressOptions(
        chunk_size=chunk_size,
        chunk_overlap=chunk_overlap,
        date=_date(d.get("date")),
        title=_opt_str("title", d.get("title")),
        min_entity_frequency=_int("min_entity_frequency", d.get("min_entity_frequency", 1), 1),
        stop_words=_words(d.get("stop_words")),
        temperature=_num("temperature", d.get("temperature", 0.5), 0.0, 100.0, open_lo=True),
        tunnel_threshold=_num("tunnel_threshold", d.get("tunnel_threshold", 0.3), 0.0, 1.0),
        tunnel_top_k=_int("tunnel_top_k", d.get("tunnel_top_k", 3), 0),
        dedupe=_bool("dedupe", d.get("dedupe", False)),
        dedupe_threshold=_num("dedupe_threshold", d.get("dedupe_threshold", 0.9), 0.0, 1.0, open_lo=True),
        verbose_labels=_bool("verbose_labels", d.get("verbose_labels", False)),
        keep_source=_bool("keep_source", d.get("keep_source", True)),
        fixes=_fixes(d.get("fixes", CompressOptions.fixes)),
        method=_choice("method", d.get("method", "zettel-compress"), METHODS),
    )
