"""Whole numbers read from text a client, a worker or a remote server wrote (query parameters,
headers, path segments, ports, rate strings): one rule everywhere.

`str.isdigit()` is no check for that: it accepts `²` and `①`, which `int()` refuses, and `int()`
itself accepts `_`, spaces, signs and non-ASCII decimal digits, and refuses more than 4,300
digits. `natural` accepts ASCII digits only, of bounded length, and nothing else.
"""

from __future__ import annotations

#: digits of the longest number any caller reads (a 64-bit count has at most 19 or 20)
MAX_DIGITS = 18


def natural(text: str | bytes, *, max_digits: int = MAX_DIGITS) -> int | None:
    """`text` as a non-negative integer when it is 1 to `max_digits` ASCII digits (no sign,
    space, `_` or other character), else None: the caller says what it expected. (Bytes, as
    a header's value, are read alike.)"""
    if 0 < len(text) <= max_digits and text.isascii() and text.isdigit():
        return int(text)
    return None


def natural_in(text: str, low: int, high: int) -> int | None:
    """`natural(text)` when it lies from `low` to `high`, else None."""
    value = natural(text, max_digits=len(str(high)))
    return value if value is not None and low <= value <= high else None


__all__ = ["MAX_DIGITS", "natural", "natural_in"]
