"""Kubernetes quantities as the scheduler reads GPU counts (service/core/quantities.py)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from service.core.quantities import quantity, whole_quantity


@pytest.mark.parametrize(
    ("value", "expected"),
    [("2", 2), (2, 2), ("0", 0), ("1k", 1000), ("2.0", 2), ("-1", -1)],
)
def test_whole_quantities(value: Any, expected: int) -> None:
    assert whole_quantity(value) == expected


@pytest.mark.parametrize("value", [None, True, "", "x", "1.5", "500m", " 2", "1\nGi", {}, [1]])
def test_anything_else_counts_as_zero(value: Any) -> None:
    assert whole_quantity(value) == 0


def test_quantities_in_base_units() -> None:
    assert quantity("500m") == Decimal("0.5")
    assert quantity("512Gi") == 512 * 2**30
    assert quantity("lots") is None
