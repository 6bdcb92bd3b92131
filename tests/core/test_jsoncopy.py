"""copy_json: a deep copy of JSON-shaped values."""

from __future__ import annotations

from typing import Any

from service.core.jsoncopy import copy_json


def test_copy_shares_nothing_mutable() -> None:
    original: dict[str, Any] = {"a": [1, {"b": "c"}], "d": {"e": None, "f": 1.5, "g": True}}
    copied = copy_json(original)
    assert copied == original
    copied["a"][1]["b"] = "changed"
    copied["d"]["h"] = 1
    assert original == {"a": [1, {"b": "c"}], "d": {"e": None, "f": 1.5, "g": True}}
