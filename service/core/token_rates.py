"""NVCF's token rate limit grammar: comma-separated `<count>-<unit>` items, count a positive
integer, unit S, M, H, D, W (a week) or MO (a month: 30 days, NVIDIA/nvcf PR #1658), no unit
twice. A model's `tokenRateLimit` and an account's input and output token limits use it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator

#: token rate units and their window in seconds
TOKEN_RATE_UNITS = {"S": 1, "M": 60, "H": 3600, "D": 86400, "W": 7 * 86400, "MO": 30 * 86400}
#: digits of a token count (a trillion tokens per window is plenty, and sums stay in int64)
MAX_TOKEN_DIGITS = 12
_ITEM = rf"[1-9][0-9]{{0,{MAX_TOKEN_DIGITS - 1}}}-(?:MO|[SMHDW])"
TOKEN_RATE_RE = re.compile(rf"^{_ITEM}(,\s*{_ITEM})*$")
MAX_TOKEN_RATE = 128


@dataclass(frozen=True, slots=True)
class TokenRate:
    """One `<count>-<unit>` item: at most `count` tokens per `seconds`."""

    count: int
    unit: str

    @property
    def seconds(self) -> int:
        return TOKEN_RATE_UNITS[self.unit]

    @property
    def text(self) -> str:
        return f"{self.count}-{self.unit}"


def token_rate_error(value: str) -> str | None:
    """Why `value` is not a token rate limit, or None (blank means no limit, as NVCF)."""
    if not value.strip():
        return None
    if len(value) > MAX_TOKEN_RATE:
        return f"must be at most {MAX_TOKEN_RATE} characters, got {len(value)}"
    if not TOKEN_RATE_RE.match(value):
        return (
            f"'{value}' must be comma-separated '<count>-<unit>' items, count a positive "
            f"integer of at most {MAX_TOKEN_DIGITS} digits, unit S, M, H, D, W or MO "
            "(e.g. '1000-S,5000-M')"
        )
    units = [part.strip().rsplit("-", 1)[1] for part in value.split(",")]
    order = list(TOKEN_RATE_UNITS)
    repeated = sorted({u for u in units if units.count(u) > 1}, key=order.index)
    if repeated:
        return f"'{value}' names the unit {', '.join(repeated)} more than once"
    return None


def parse_token_rates(value: object) -> tuple[TokenRate, ...]:
    """The items of a stored token rate limit, shortest window first; () for none or for a
    value that breaks the rules (stored values were checked when they were written)."""
    if not isinstance(value, str) or token_rate_error(value) is not None or not value.strip():
        return ()
    rates = []
    for part in value.split(","):
        count, _, unit = part.strip().rpartition("-")
        rates.append(TokenRate(int(count), unit))
    return tuple(sorted(rates, key=lambda r: r.seconds))


def _checked(value: str) -> str:
    error = token_rate_error(value)
    if error is not None:
        raise ValueError(error)
    return value


#: a setting holding a token rate limit ("" for none)
TokenRateText = Annotated[str, AfterValidator(_checked)]
