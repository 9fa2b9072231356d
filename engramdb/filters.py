"""One meaning and one name for every filter over memories (issue 12, bug 15).

``Engram.scan``, ``Engram.recall`` (and so ``recall_context``) and the CLI's ``list``,
``recall`` and ``context`` take the same filters, built here:

* ``after``, ``before``: date bounds, each a Unix timestamp, a ``datetime.date``, a
  ``datetime.datetime`` (naive means UTC) or an ISO string: ``"2023"``, ``"2023-05"``,
  ``"2023-05-01"`` or a full ISO date-time (:func:`parse_time`, the one date parser of
  every ``after``/``before``). A memory with a ``resolved_date`` (the date its text is
  about) is kept when that date is within them as zettel-compress compares dates (ISO
  text at the bound's precision, both ends inclusive: ``after="2023-05"`` keeps
  ``2023-05-01``); any other memory when it was created at or after ``after`` and
  strictly before ``before``.
* ``tiers``: the memory is in one of these tiers (a memory has one tier).
* ``tags``: the memory has *all* of these tags; ``any_tags``: at least one of them.
* ``flags``: the memory has *all* of these flags; ``any_flags``: at least one of them.
* ``source``: ``node.source`` equals this.

A filter given as None does not filter; an empty list for ``any_tags``/``any_flags``
matches nothing, for ``tags``/``flags`` everything. One string stands for a list of one
(``tags="people"`` is ``tags=["people"]``).
"""
from __future__ import annotations

import datetime as _dt
import math
import numbers
import re
from collections.abc import Iterable, Sequence

from .compress.recall import resolved_in_range
from .errors import ValidationError
from .index.synonyms import parse_date
from .records import ALL_FLAGS, TIERS, Node

__all__ = ["Filter", "NameSet", "TimeBound", "parse_time"]

# A date bound (``after=``/``before=``): a Unix timestamp, a date or datetime, or an ISO 8601
# string ("2023", "2023-05", "2023-05-01", "2023-05-01T12:00:00+00:00"); see parse_time.
TimeBound = float | str | _dt.date
# A filter's set of names (tiers, tags, flags): one name, or any iterable of names.
NameSet = str | Iterable[str]

_TIME_HINT = ("e.g. after='2023-05-01' (or '2023', '2023-05', '2023-05-01T12:00:00+00:00'), "
              "after=datetime.date(2023, 5, 1), or a Unix timestamp")


def parse_time(value: object, name: str = "time") -> float | None:
    """``value`` as a Unix timestamp (None stays None); see the module docstring for the forms.

    Raises:
        ValidationError: anything else (the message names ``name``).
    """
    if value is None:
        return None
    if isinstance(value, _dt.datetime):
        aware = value.replace(tzinfo=_dt.timezone.utc) if value.tzinfo is None else value
        return aware.timestamp()
    if isinstance(value, _dt.date):
        return _dt.datetime(value.year, value.month, value.day, tzinfo=_dt.timezone.utc).timestamp()
    # any real number (a NumPy or pandas integer too: they are not ints), but not a bool
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        partial = {4: "%Y", 7: "%Y-%m"}.get(len(text))
        try:
            parsed = _dt.datetime.strptime(text, partial) if partial else _dt.datetime.fromisoformat(text)
        except ValueError:
            pass
        else:
            return parse_time(parsed, name)
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    raise ValidationError(f"{name} must be a timestamp, a date, a datetime or an ISO date string, got {shown}",
                          hint=_TIME_HINT)


_EXTENDED_DATE = re.compile(r"[0-9]{4}(-[0-9]{2}(-[0-9]{2})?)?")


def _iso_bound(value: TimeBound) -> str:
    """A date bound as ISO text for comparing with a ``resolved_date``: a string as given (a
    datetime string cut to its date), a date or datetime as its date, a timestamp as its UTC date.
    A string in another form ``parse_time`` takes (ISO basic ``20230501``, a week date
    ``2023-W18``, ...) is its date in the extended form: compared as text, ``20230501`` or
    ``2023-W18`` would not sort with ``2023-05-03``."""
    if isinstance(value, str):
        text = value.strip()
        cut = text[:10] if len(text) > 10 else text
        if not _EXTENDED_DATE.fullmatch(cut):
            try:
                return _dt.datetime.fromisoformat(text).date().isoformat()
            except ValueError:
                pass
        return cut
    if isinstance(value, _dt.datetime):
        utc = value.astimezone(_dt.timezone.utc) if value.tzinfo is not None else value
        return utc.date().isoformat()
    if isinstance(value, _dt.date):
        return value.isoformat()
    try:
        return _dt.datetime.fromtimestamp(float(value), _dt.timezone.utc).date().isoformat()
    except (OverflowError, OSError, ValueError):  # beyond datetime's years: beyond every ISO date too
        return "9999-12-31" if value > 0 else "0000"


def _str_set(value: NameSet | None, name: str, allowed: Sequence[str] | None = None) -> frozenset[str] | None:
    if value is None:
        return None
    if isinstance(value, str):  # one value, never an iterable of letters
        value = (value,)
    try:
        items = tuple(value)
    except TypeError:
        raise ValidationError(f"{name} must be a list of strings", hint=f"e.g. {name}=['a', 'b']") from None
    for item in items:
        if not isinstance(item, str):
            raise ValidationError(f"{name} must be strings, got {type(item).__name__}",
                                  hint=f"e.g. {name}=['a', 'b']")
        if allowed is not None and item not in allowed:
            raise ValidationError(f"unknown {name.removeprefix('any_').rstrip('s')} {item!r}; "
                                  f"expected one of {', '.join(allowed)}",
                                  hint="check the spelling (a typo would match nothing)")
    return frozenset(items)


class Filter:
    """A predicate over nodes built from the filter arguments (see the module docstring).

    Raises:
        ValidationError: a malformed argument (checked at construction).
    """

    __slots__ = ("after", "before", "tiers", "tags", "any_tags", "flags", "any_flags", "source", "after_iso",
                 "before_iso")

    def __init__(self, *, after: TimeBound | None = None, before: TimeBound | None = None,
                 tiers: NameSet | None = None, tags: NameSet | None = None, any_tags: NameSet | None = None,
                 flags: NameSet | None = None, any_flags: NameSet | None = None, source: str | None = None) -> None:
        self.after = parse_time(after, "after")
        self.before = parse_time(before, "before")
        # parse_time returns None for None only
        self.after_iso = _iso_bound(after) if after is not None else None
        self.before_iso = _iso_bound(before) if before is not None else None
        self.tiers = _str_set(tiers, "tiers", TIERS)
        self.tags = _str_set(tags, "tags")
        self.any_tags = _str_set(any_tags, "any_tags")
        self.flags = _str_set(flags, "flags", ALL_FLAGS)
        self.any_flags = _str_set(any_flags, "any_flags", ALL_FLAGS)
        if source is not None and not isinstance(source, str):
            raise ValidationError("source must be a string", hint="e.g. source='notes.md'")
        self.source = source

    @property
    def active(self) -> bool:
        """Whether anything is filtered at all."""
        return any(getattr(self, name) is not None for name in self.__slots__)

    def __call__(self, node: Node) -> bool:
        if self.after is not None or self.before is not None:
            if node.resolved_date and parse_date(node.resolved_date) is not None:
                if not resolved_in_range(node.resolved_date.strip(), self.after_iso, self.before_iso):
                    return False
            elif (self.after is not None and node.created_at < self.after) or \
                    (self.before is not None and node.created_at >= self.before):
                return False
        if self.tiers is not None and node.tier not in self.tiers:
            return False
        if self.tags is not None and not self.tags.issubset(node.tags):
            return False
        if self.any_tags is not None and self.any_tags.isdisjoint(node.tags):
            return False
        if self.flags is not None and not self.flags.issubset(node.flags):
            return False
        if self.any_flags is not None and self.any_flags.isdisjoint(node.flags):
            return False
        if self.source is not None and node.source != self.source:
            return False
        return True
