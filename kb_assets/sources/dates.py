"""The one date parser: every date a document states (front matter, ADR / PEP headers, file names, work items)
and every date a query filter names is read here, so an index and its filters agree on what a date is.

Spellings read, each only when year, month and day are all present (a bare "3" or "July" is no date):
ISO and year-first (2017-07-14, 2024/07/17, 2017.07.14, 2017-07-14T10:00:00Z), compact 20260131, day-first
numeric (14.07.2017, 14/07/2017, 14-07-2017: day first, as in most of the world; 07/14/2017 still reads as
July 14 because 14 cannot be a month), and month names (05-Jul-2001, 5 July 2001, July 5, 2001). The date is
found inside a longer value ("2017-07-14 (revised)", "Created: 5 July 2001"); the first recognisable one
wins. dateutil interprets what the patterns found (calendar checks: 2026-02-30 is no date).
"""
from __future__ import annotations

import datetime as dt
import re
from typing import Any

_MONTH = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.?"
_YEAR = r"(?:19|20)\d{2}"
# (pattern, day-first) in priority order: the first pattern that matches anywhere decides.
_PATTERNS: tuple[tuple[re.Pattern[str], bool], ...] = (
    (re.compile(rf"(?<!\d)({_YEAR}[-/.][01]?\d[-/.][0-3]?\d)(?!\d)"), False),
    (re.compile(rf"(?<!\d)([0-3]?\d[-\s/.]{_MONTH}[-\s/.,]+{_YEAR})(?!\d)", re.I), True),
    (re.compile(rf"\b({_MONTH}\s+[0-3]?\d(?:st|nd|rd|th)?,?\s+{_YEAR})(?!\d)", re.I), False),
    (re.compile(rf"(?<![\d.])([0-3]?\d[./-][01]?\d[./-]{_YEAR})(?!\d)"), True),
    (re.compile(rf"(?<!\d)({_YEAR}[01]\d[0-3]\d)(?!\d)"), False),
)


def parse_date(value: Any) -> dt.date | None:
    """The date a value states, or None."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    s = str(value).strip()
    if not s or len(s) > 200:
        return None
    if len(s) == 10 and s[4] == "-" and s[7] == "-":
        try:    # ISO YYYY-MM-DD, as the index stores dates: what the first pattern and dateutil read, ~50x faster
            d = dt.date.fromisoformat(s)
            if 1900 <= d.year < 2100:
                return d
        except ValueError:
            pass
    for rx, dayfirst in _PATTERNS:
        m = rx.search(s)
        if m:
            # imported here: dateutil.parser brings dateutil.tz (~17 ms), which a pass that reads no date
            # (a delete, a rename) or only ISO dates never needs
            from dateutil import parser as _dateutil

            try:
                return _dateutil.parse(m.group(1), dayfirst=dayfirst, yearfirst=not dayfirst).date()
            except (ValueError, OverflowError):
                return None
    return None


def normalize_date(value: Any) -> str | None:
    """parse_date as ISO text (YYYY-MM-DD), as document metadata stores it."""
    d = parse_date(value)
    return d.isoformat() if d else None
