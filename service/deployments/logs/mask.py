"""Masking a function version's secret values in what its workers print.

A worker may print a secret it was given (an environment dump, a failing connection string);
no line leaves the service, nor is kept, with one in it. Values shorter than `MIN_MASKED`
characters are left alone (masking every `1` or `on` would garble every line); each line of a
multi-line value is masked on its own, as lines are read one by one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = "****"
MIN_MASKED = 4


class Masker:
    """Replaces every occurrence of the given secret values with `****`."""

    def __init__(self, values: Iterable[str]) -> None:
        parts = {
            part
            for value in values
            for part in value.splitlines()
            if len(part.strip()) >= MIN_MASKED
        }
        ordered = sorted(parts, key=len, reverse=True)  # the longest first: no partial leftovers
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def __call__(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(MASK, text)


NO_SECRETS = Masker(())
