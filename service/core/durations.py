"""ISO-8601 durations (`P30D`, `PT1H30M`, `PT0.5S`, `P1Y2M`), read with isodate.

One reading for every duration of the API: the designator form only (`P…Y…M…W…DT…H…M…S`),
never signed, naming at least one component. Callers word their own error messages.
"""

from __future__ import annotations

from datetime import timedelta

import isodate


class DurationError(ValueError):
    """Not an ISO-8601 duration this service accepts."""


def parse_duration(text: object) -> timedelta | isodate.Duration:
    """A timedelta, or an `isodate.Duration` when it has years or months (whose length depends
    on the date it is added to)."""
    # isodate also reads a sign, an empty time part ("PT", "P1DT") and the alternative form
    # ("P0001-02-03T00:00:00"); none of them is a duration here.
    if not isinstance(text, str) or not text.startswith("P") or text[-1] not in "YMWDHS":
        raise DurationError(f"not an ISO-8601 duration: {text!r}")
    try:
        return isodate.parse_duration(text)
    except (ValueError, ArithmeticError) as exc:  # ISO8601Error, or too large for timedelta
        raise DurationError(f"not an ISO-8601 duration: {text!r}") from exc


def parse_timedelta(text: object) -> timedelta:
    """A duration of fixed length: days, hours, minutes, seconds (weeks too), no years or
    months."""
    value = parse_duration(text)
    if not isinstance(value, timedelta):
        raise DurationError(f"years and months have no fixed length: {text!r}")
    return value
