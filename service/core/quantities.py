"""Kubernetes resource quantities (`2`, `500m`, `512Gi`), read with lightkube's parser."""

from __future__ import annotations

from decimal import Decimal
from typing import Any


def quantity(value: Any) -> Decimal | None:
    """`value` (a string, or a number as YAML or JSON gives it) in base units, or None when it
    is not a Kubernetes quantity."""
    if isinstance(value, bool):
        return None
    text = str(value)
    # lightkube stops at a line break and reads "1\nGi" as 1; the API server refuses it
    if any(c.isspace() for c in text):
        return None
    # imported here: lightkube's package loads its whole client (kubeconfig, httpx, YAML)
    from lightkube.utils.quantity import parse_quantity

    try:
        return parse_quantity(text)
    except ValueError:
        return None


def whole_quantity(value: Any) -> int:
    """A whole number of units, such as a GPU count (`"2"`, `2`); anything else counts as 0."""
    parsed = quantity(value)
    if parsed is None or parsed != parsed.to_integral_value():
        return 0
    return int(parsed)
