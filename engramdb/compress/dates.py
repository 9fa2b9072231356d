"""Dates: absolute dates, session headers and relative expressions -> ISO strings.

A zettel's ``resolved_date`` is, in order of preference:

1. the most specific absolute date written in the chunk itself ("8 May 2023",
   "May 8, 2023", "2023-05-08", "June 2023", "in 2021"; a session header inside the
   chunk counts), the earliest one on ties;
2. a relative expression in the chunk ("yesterday", "last week", "3 days ago",
   "next Friday") resolved against the nearest preceding session header, else the
   nearest preceding absolute date in the document, else the ``date`` option;
3. the date of the session the chunk belongs to (the nearest preceding header), else
   the ``date`` option;
4. ``None``.

A relative expression keeps only the precision it carries: "yesterday", "N days ago",
"next Friday", "last week" give a day; "next month", "3 months ago" a month
(``YYYY-MM``); "last year" a year.

Output is ``YYYY-MM-DD``, ``YYYY-MM`` or ``YYYY``. Only calendar arithmetic from
:mod:`datetime` is used: no clock, no locale, so the result is deterministic.
"""
from __future__ import annotations

import datetime as _dt
import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from collections.abc import Collection

__all__ = ["DateIndex", "PartialDate", "find_headers", "parse_date", "to_iso"]

PartialDate = tuple[int, int | None, int | None]  # (year, month, day); month and day may be unknown

_MONTHS = {
    "january": 1, "jan": 1, "february": 2, "feb": 2, "march": 3, "mar": 3, "april": 4, "apr": 4,
    "may": 5, "june": 6, "jun": 6, "july": 7, "jul": 7, "august": 8, "aug": 8,
    "september": 9, "sept": 9, "sep": 9, "october": 10, "oct": 10, "november": 11, "nov": 11,
    "december": 12, "dec": 12,
}
_MONTH_RE = "|".join(sorted(_MONTHS, key=lambda m: (-len(m), m)))
_WEEKDAYS = {"monday": 0, "tuesday": 1, "wednesday": 2, "thursday": 3, "friday": 4, "saturday": 5, "sunday": 6}
_WEEKDAY_RE = "|".join(_WEEKDAYS)
_MIN_YEAR, _MAX_YEAR = 1900, 2100

# One pass over the text finds every absolute date; the alternatives are ordered from
# most to least specific so an overlapping less specific reading never wins.
_ABSOLUTE = re.compile(
    rf"\b(?:(?P<iy>\d{{4}})-(?P<im>\d{{2}})-(?P<id>\d{{2}})"
    rf"|(?P<dd>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?(?P<dm>{_MONTH_RE})\.?,?\s*(?P<dy>\d{{4}})"
    rf"|(?P<mm>{_MONTH_RE})\.?\s+(?P<md>\d{{1,2}})(?:st|nd|rd|th)?,?\s*(?P<my>\d{{4}})"
    rf"|(?P<ym>{_MONTH_RE})\.?,?\s+(?P<yy>\d{{4}})"
    rf"|(?:in|since|back\s+in|around|during|of|from)\s+(?P<by>\d{{4}}))\b",
    re.IGNORECASE,
)
_YEAR = re.compile(r"(?<!\d)\d{4}(?!\d)")
_WINDOW = 40
_RELATIVE = re.compile(
    rf"\b(?=[ytlnid0-9])(?:(?P<yesterday>yesterday)|(?P<today>today|tonight)|(?P<tomorrow>tomorrow)"
    rf"|(?P<dir>last|next|this)\s+(?P<unit>week|month|year|{_WEEKDAY_RE})"
    rf"|(?P<n>\d{{1,3}})\s+(?P<nunit>day|week|month)s?\s+(?P<way>ago|from\s+now|later)"
    rf"|in\s+(?P<inn>\d{{1,3}})\s+(?P<inunit>day|week|month)s?"
    rf"|the\s+(?P<bunit>week|{_WEEKDAY_RE})\s+(?P<ba>before|after))\b",
    re.IGNORECASE,
)
_TIME = re.compile(
    rf"\b(?:\d{{1,2}}[:.]\d{{2}}(?:[:.]\d{{2}})?(?:\s*[ap]\.?m\.?)?|\d{{1,2}}\s*[ap]\.?m\.?|on|at|{_WEEKDAY_RE})\b"
)
# every relative expression contains one of these words
_RELATIVE_WORDS = frozenset(
    ["yesterday", "today", "tonight", "tomorrow", "day", "days", "week", "weeks", "month", "months", "year", *_WEEKDAYS]
)
# A session header is a line of its own: "[2023-05-08] Session 3", "DATE: 8 May 2023",
# "## Session 2 (May 9, 2023)". Its date dates every chunk until the next header.
_HEADER = re.compile(
    r"^[ \t]*(?:\[(?P<bracket>[^\]\n]{4,40})\](?:[ \t]*session\b[^\n:]*)?"
    r"|(?:session[ \t]+)?date[ \t]*[:=][ \t]*(?P<field>[^\n]{4,60})"
    r"|#{1,6}[ \t]*session\b(?P<hash>[^\n]{0,80})"
    r"|session[ \t]+\d+[ \t]*[:\-\u2013\u2014(,][ \t]*(?P<plain>[^\n]{4,60}))[ \t]*$",
    re.IGNORECASE | re.MULTILINE,
)


def to_iso(d: PartialDate) -> str:
    """``(2023, 5, 8)`` -> ``"2023-05-08"``; month and day may be ``None``."""
    y, m, day = d
    if m is None:
        return f"{y:04d}"
    if day is None:
        return f"{y:04d}-{m:02d}"
    return f"{y:04d}-{m:02d}-{day:02d}"


def _valid(y: int, m: int | None, d: int | None) -> PartialDate | None:
    if not _MIN_YEAR <= y <= _MAX_YEAR:
        return None
    if m is None:
        return (y, None, None)
    if not 1 <= m <= 12:
        return None
    if d is None:
        return (y, m, None)
    try:
        _dt.date(y, m, d)
    except ValueError:
        return None
    return (y, m, d)


def _from_match(m: re.Match[str]) -> PartialDate | None:
    g = m.groupdict()
    if g["iy"]:
        return _valid(int(g["iy"]), int(g["im"]), int(g["id"]))
    if g["dd"]:
        return _valid(int(g["dy"]), _MONTHS[g["dm"].lower()], int(g["dd"]))
    if g["mm"]:
        return _valid(int(g["my"]), _MONTHS[g["mm"].lower()], int(g["md"]))
    if g["ym"]:
        return _valid(int(g["yy"]), _MONTHS[g["ym"].lower()], None)
    return _valid(int(g["by"]), None, None)


def _specificity(d: PartialDate) -> int:
    return (d[1] is not None) + (d[2] is not None)


def find_absolute(text: str, start: int = 0, end: int | None = None) -> list[tuple[int, PartialDate]]:
    """Every absolute date in ``text[start:end]`` as ``(offset, date)``, in text order."""
    end = len(text) if end is None else end
    out = []
    pos = start
    # every date form contains a 4-digit year and spans at most _WINDOW characters
    # before it (and "-MM-DD" after it), so the full pattern only runs near years
    for y in _YEAR.finditer(text, start, end):
        if y.end() <= pos:
            continue
        for m in _ABSOLUTE.finditer(text, max(pos, y.start() - _WINDOW), min(end, y.end() + 6)):
            if m.start() < pos:
                continue
            d = _from_match(m)
            if d is not None:
                out.append((m.start(), d))
            pos = m.end()
    return out


def parse_date(value: str) -> PartialDate | None:
    """Parse a ``date`` option or header field: ISO (``2023-05-08``, ``2023-05``,
    ``2023``) or any absolute form :func:`find_absolute` knows; ``None`` if unparseable."""
    value = value.strip()
    m = re.fullmatch(r"(\d{4})(?:-(\d{2})(?:-(\d{2}))?)?", value)
    if m:
        return _valid(int(m[1]), int(m[2]) if m[2] else None, int(m[3]) if m[3] else None)
    hits = find_absolute(value)
    if not hits:
        return None
    return max(hits, key=lambda h: (_specificity(h[1]), -h[0]))[1]


def _date_only(field: str) -> bool:
    """Whether ``field`` is a date with at most a weekday and a time around it."""
    rest = _ABSOLUTE.sub(" ", field)
    rest = _TIME.sub(" ", rest.lower())
    return not rest.strip(" \t,;@-\u2013\u2014")


def find_headers(text: str) -> list[tuple[int, PartialDate]]:
    """Session header lines with a parseable date, as ``(line offset, date)``.

    A bracketed or "Session N:" line must hold only a date (and optionally a weekday
    and a time): "[Most recently updated: September 6, 2021]" is not a session header.
    """
    out = []
    for m in _HEADER.finditer(text):
        field = m["bracket"] or m["field"] or m["hash"] or m["plain"] or ""
        if (m["bracket"] or m["plain"]) and not _date_only(field):
            continue
        d = parse_date(field) if field.strip() else None
        if d is not None:
            out.append((m.start() + (len(m[0]) - len(m[0].lstrip())), d))
    return out


def _add_days(d: PartialDate, n: int) -> PartialDate:
    if d[1] is None or d[2] is None:
        return d
    day = _dt.date(d[0], d[1], d[2]) + _dt.timedelta(days=n)
    return _valid(day.year, day.month, day.day) or d


def _add_months(d: PartialDate, n: int) -> PartialDate:
    """``d`` moved by ``n`` months, at month precision: "next month" said on 25 May means
    June, not 25 June, so the day is dropped (a year-only anchor moves by whole years)."""
    if d[1] is None:
        return _valid(d[0] + (n // 12 if n >= 0 else -((-n) // 12)), None, None) or d
    idx = d[1] - 1 + n
    return _valid(d[0] + idx // 12, idx % 12 + 1, None) or d


def _resolve_relative(m: re.Match[str], anchor: PartialDate) -> PartialDate | None:
    g = m.groupdict()
    if g["yesterday"]:
        return _add_days(anchor, -1)
    if g["today"]:
        return anchor
    if g["tomorrow"]:
        return _add_days(anchor, 1)
    if g["dir"]:
        direction, unit = g["dir"].lower(), g["unit"].lower()
        step = {"last": -1, "next": 1, "this": 0}[direction]
        if unit == "week":
            return _add_days(anchor, 7 * step)
        if unit == "month":
            return _add_months(anchor, step)
        if unit == "year":
            return _valid(anchor[0] + step, None, None)
        if anchor[1] is None or anchor[2] is None:
            return None
        delta = _WEEKDAYS[unit] - _dt.date(anchor[0], anchor[1], anchor[2]).weekday()
        if direction == "last" and delta >= 0:
            delta -= 7
        elif direction == "next" and delta <= 0:
            delta += 7
        return _add_days(anchor, delta)
    if g["n"]:
        n = int(g["n"]) * (-1 if g["way"].lower() == "ago" else 1)
        unit = g["nunit"].lower()
    elif g["inn"]:
        n, unit = int(g["inn"]), g["inunit"].lower()
    else:
        n, unit = (-1 if g["ba"].lower() == "before" else 1), g["bunit"].lower()
        if unit != "week":
            return _add_days(anchor, 7 * n)
    if unit == "day":
        return _add_days(anchor, n)
    if unit == "week":
        return _add_days(anchor, 7 * n)
    return _add_months(anchor, n)


@dataclass
class DateIndex:
    """Every date signal of one normalized text, scanned once; resolves chunks by span."""

    text: str
    absolute: list[tuple[int, PartialDate]]
    headers: list[tuple[int, PartialDate]]
    option: PartialDate | None

    def __post_init__(self) -> None:
        self._abs_pos = [a[0] for a in self.absolute]
        self._hdr_pos = [h[0] for h in self.headers]

    @classmethod
    def scan(cls, text: str, option: str | None = None) -> DateIndex:
        """Scan ``text`` once; ``option`` is the ``date`` option (unparseable -> ignored)."""
        return cls(
            text=text,
            absolute=find_absolute(text),
            headers=find_headers(text),
            option=parse_date(option) if option else None,
        )

    def header_offsets(self) -> list[int]:
        """Line offsets of the session headers (chunk hard breaks)."""
        return list(self._hdr_pos)

    def resolve(
        self, start: int, end: int, session: PartialDate | None = None, vocab: Collection[str] | None = None
    ) -> str | None:
        """The ``resolved_date`` of the chunk ``[start, end)`` (see the module docstring).

        ``session`` is the session date carried in from earlier text (a stream);
        ``vocab`` the chunk's lowercase words, if known (it lets most chunks skip the
        search for relative expressions).
        """
        lo, hi = bisect_left(self._abs_pos, start), bisect_left(self._abs_pos, end)
        best: PartialDate | None = None
        for _, d in self.absolute[lo:hi]:
            if best is None or _specificity(d) > _specificity(best):
                best = d
        if best is not None:
            return to_iso(best)
        k = bisect_right(self._hdr_pos, start)
        header = self.headers[k - 1][1] if k else session
        anchor = header or (self.absolute[lo - 1][1] if lo else None) or self.option
        if anchor is not None:
            m = None
            if vocab is None or not _RELATIVE_WORDS.isdisjoint(vocab):
                m = _RELATIVE.search(self.text, start, end)
            if m is not None:
                resolved = _resolve_relative(m, anchor)
                if resolved is not None:
                    return to_iso(resolved)
        fallback = header or self.option
        return to_iso(fallback) if fallback is not None else None

    def last_header(self, session: PartialDate | None = None) -> PartialDate | None:
        """The date of the last session header, else ``session``."""
        return self.headers[-1][1] if self.headers else session

