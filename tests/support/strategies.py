"""Hypothesis strategies for request bodies, from the JSON schemas the OpenAPI document
declares (the pydantic request models): objects with their documented properties (each
present or not), strings within their lengths or patterns, integers within their bounds,
enums, lists within their sizes, references and unions. Values near and past every bound
are drawn too, since the service must refuse those cleanly."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import strategies as st

JSON_VALUES: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


def from_json_schema(
    schema: dict[str, Any], components: dict[str, Any], depth: int = 0
) -> st.SearchStrategy[Any]:
    """Values shaped by `schema` (roughly valid), mixed with arbitrary JSON."""
    return st.one_of(_shaped(schema, components, depth), JSON_VALUES)


def _shaped(
    schema: dict[str, Any], components: dict[str, Any], depth: int
) -> st.SearchStrategy[Any]:
    if depth > 6:
        return JSON_VALUES
    if "$ref" in schema:
        target = components[schema["$ref"].rsplit("/", 1)[-1]]
        return _shaped(target, components, depth + 1)
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            return st.one_of([_shaped(s, components, depth + 1) for s in schema[key]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"]) | st.text(max_size=8)
    if "const" in schema:
        return st.just(schema["const"])
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        return st.fixed_dictionaries(
            {},
            optional={
                name: from_json_schema(sub, components, depth + 1) for name, sub in props.items()
            },
        )
    if kind == "array":
        items = schema.get("items", {})
        low = schema.get("minItems", 0)
        high = schema.get("maxItems")
        size = min((high or 4) + 1, 6)
        return st.lists(_shaped(items, components, depth + 1), min_size=0, max_size=max(size, low))
    if kind == "string":
        return _strings(schema)
    if kind == "integer":
        low, high = schema.get("minimum"), schema.get("maximum")
        near = [v for b in (low, high) if b is not None for v in (b - 1, b, b + 1)]
        return st.integers(min_value=low, max_value=high) | st.sampled_from(
            [*near, 2**31, 2**63, -1]
        )
    if kind == "number":
        return st.floats(allow_nan=False, allow_infinity=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return JSON_VALUES


def _strings(schema: dict[str, Any]) -> st.SearchStrategy[str]:
    max_len = schema.get("maxLength", 64)
    options: list[st.SearchStrategy[str]] = [st.text(max_size=min(max_len + 2, 80))]
    pattern = schema.get("pattern")
    if pattern:
        try:
            re.compile(pattern)
            options.append(st.from_regex(pattern, fullmatch=True).filter(lambda s: len(s) < 300))
        except re.error:
            pass
    if "maxLength" in schema:
        options.append(st.just("a" * (max_len + 1)))
    return st.one_of(options)
