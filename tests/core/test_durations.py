"""ISO-8601 durations as the API reads them (service/core/durations.py)."""

from __future__ import annotations

from datetime import timedelta

import isodate
import pytest

from service.core.durations import DurationError, parse_duration, parse_timedelta


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("P30D", timedelta(days=30)),
        ("PT1S", timedelta(seconds=1)),
        ("P1DT2H3M4S", timedelta(days=1, hours=2, minutes=3, seconds=4)),
        ("PT1M30S", timedelta(seconds=90)),
        ("PT0.5S", timedelta(seconds=0.5)),
        ("P2W", timedelta(weeks=2)),
        ("P0D", timedelta(0)),
    ],
)
def test_fixed_length_durations(text: str, expected: timedelta) -> None:
    assert parse_timedelta(text) == expected
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "P", "PT", "P1DT", "-P1D", "+P1D", "p30d", " P30D", "PT10S\n", "30d", "P1D2H",
     "P0001-01-01T00:00:00", "P00010101T000000", "P99999999999D", None, 30],
)  # fmt: skip
def test_what_is_not_a_duration(text: object) -> None:
    with pytest.raises(DurationError):
        parse_duration(text)


def test_years_and_months_are_durations_without_a_fixed_length() -> None:
    duration = parse_duration("P1Y2M3W4D")
    assert isinstance(duration, isodate.Duration)
    assert duration.years == 1
    with pytest.raises(DurationError, match="no fixed length"):
        parse_timedelta("P1M")
