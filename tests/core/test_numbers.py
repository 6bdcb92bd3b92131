"""Whole numbers read from text: ASCII digits only, of bounded length, nothing else."""

from __future__ import annotations

import pytest

from service.core.numbers import MAX_DIGITS, natural, natural_in

#: what `str.isdigit()` or `int()` accept and a number read from text must not be
NOT_NUMBERS = ["", "²", "①", "٣", "５", "1²", " 1", "1 ", "+1", "-1", "1_0", "1.0", "0x1", "1\n"]


@pytest.mark.parametrize("text", NOT_NUMBERS)
def test_anything_but_ascii_digits_is_no_number(text: str) -> None:
    assert natural(text) is None
    assert natural(text.encode()) is None
    assert natural_in(text, 0, 10) is None


def test_ascii_digits_are_read_up_to_the_bound() -> None:
    assert natural("0") == 0
    assert natural("007") == 7
    assert natural(b"42") == 42
    assert natural("9" * MAX_DIGITS) == int("9" * MAX_DIGITS)
    assert natural("9" * (MAX_DIGITS + 1)) is None
    assert natural("9" * 4301) is None  # more than int() reads: no ValueError
    assert natural("12345", max_digits=4) is None
    assert natural_in("65535", 1, 65535) == 65535
    assert natural_in("65536", 1, 65535) is None
    assert natural_in("0", 1, 65535) is None
