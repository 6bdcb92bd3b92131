"""Problems of catalog data, each `file:line: path: message`: pydantic's field errors
described for people editing YAML (unknown keys with suggestions, the kind of value found) and
the rules across fields (unique names, adapter settings, duplicate node shapes)."""

from __future__ import annotations

import difflib
import types
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from service.clusters.catalog.schema import CatalogFile, lower

Loc = tuple[str | int, ...]


class CatalogError(Exception):
    """A catalog that cannot be used; `problems` has one `file:line: path: message` each."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
        super().__init__(f"invalid cluster catalog {source} ({count}):\n" + "\n".join(problems))


def problems_of(data: Any, source: str, line_of: Callable[[Loc], int | None]) -> list[str]:
    """Every problem of the data, sorted by line; `line_of` gives the line of a path."""
    found: list[tuple[Loc, str]] = []
    try:
        CatalogFile.model_validate(data)
    except ValidationError as exc:
        for e in exc.errors(include_url=False):
            loc: Loc = tuple(p for p in e["loc"] if isinstance(p, str | int))
            found.append(_describe(loc, e))
    found += cross_check(data)
    out: list[tuple[int, str]] = []
    for loc, message in found:
        line = line_of(loc)
        where = f"{source}:{line}" if line is not None else source
        path = format_path(loc[:-1] if _names_field(message) else loc)
        out.append((line or 0, f"{where}: {path + ': ' if path else ''}{message}"))
    return [m for _, m in sorted(out, key=lambda p: p[0])]


_MISSING = "missing required field "
_UNKNOWN = "unknown field "


def _names_field(message: str) -> bool:
    # These messages name the field themselves, so the path shown stops at its parent.
    return message.startswith((_MISSING, _UNKNOWN))


def _describe(loc: Loc, error: Any) -> tuple[Loc, str]:
    kind = error["type"]
    if kind == "missing" and loc:
        return loc, f"{_MISSING}{loc[-1]!r}"
    if kind == "extra_forbidden" and loc:
        allowed = _allowed_keys(loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return loc, f"{_UNKNOWN}{loc[-1]!r} ({hint}allowed: {', '.join(allowed)})"
    if kind in {"model_type", "dict_type"}:
        got = _YAML_KINDS.get(type(error["input"]).__name__, "something else")
        if not loc:
            return loc, f"the catalog must be a mapping with 'clusterGroups', not {got}"
        return loc, f"must be a mapping of fields, not {got}"
    if kind == "list_type":
        got = _YAML_KINDS.get(type(error["input"]).__name__, "something else")
        return loc, f"must be a list, not {got}"
    if kind == "too_short":
        return loc, "must not be empty"
    if kind in {"int_type", "greater_than"} and loc and loc[-1] in {"count", "gpusPerNode"}:
        return loc, f"must be a positive integer, not {error['input']!r}"
    if kind == "string_type" and loc and loc[-1] == "k8sVersion":
        return loc, f'must be a string; quote the version, e.g. "1.30.0" (got {error["input"]!r})'
    message = error["msg"]
    if kind in {"literal_error", "string_type", "float_type", "greater_than_equal", "bool_type"}:
        message += f", not {error['input']!r}"
    return loc, message


_YAML_KINDS = {
    "list": "a list",
    "dict": "a mapping",
    "str": "a string",
    "int": "a number",
    "float": "a number",
    "bool": "a boolean",
    "NoneType": "null (nothing)",
}


def _allowed_keys(loc: Loc) -> list[str]:
    model: Any = CatalogFile
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return []
        field = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        if field is None:
            return []
        model = _unwrap(field.annotation)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return [f.alias or n for n, f in model.model_fields.items()]
    return []


def _unwrap(annotation: Any) -> Any:
    while True:
        origin = get_origin(annotation)
        if origin is list:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            annotation = next(a for a in get_args(annotation) if a is not type(None))
        else:
            return annotation


def format_path(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def dicts(value: Any) -> Iterable[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def cross_check(data: Any) -> list[tuple[Loc, str]]:
    """Rules across fields: unique names, adapter settings, duplicate node shapes.

    Works on the raw data so these are reported together with field-level problems.
    """
    problems: list[tuple[Loc, str]] = []
    groups = data.get("clusterGroups") if isinstance(data, dict) else None
    if not isinstance(groups, list):
        return problems
    group_names: dict[str, str] = {}
    cluster_names: dict[str, str] = {}
    for gi, group in enumerate(groups):
        if not isinstance(group, dict):
            continue
        gloc: Loc = ("clusterGroups", gi)
        name = group.get("name")
        if isinstance(name, str):
            if name.lower() in group_names:
                problems.append(
                    (
                        (*gloc, "name"),
                        f"duplicate cluster group name {name!r} (also "
                        f"{group_names[name.lower()]}; names are case-insensitive)",
                    )
                )
            group_names.setdefault(name.lower(), format_path(gloc))
        clusters = group.get("clusters")
        for ci, cluster in enumerate(clusters if isinstance(clusters, list) else []):
            if isinstance(cluster, dict):
                problems += _check_cluster(cluster, (*gloc, "clusters", ci), cluster_names)
    return problems


def _check_cluster(
    cluster: dict[str, Any], loc: Loc, seen: dict[str, str]
) -> list[tuple[Loc, str]]:
    problems: list[tuple[Loc, str]] = []
    name = cluster.get("name")
    if isinstance(name, str):
        if name.lower() in seen:
            problems.append(
                (
                    (*loc, "name"),
                    f"duplicate cluster name {name!r} (also {seen[name.lower()]}; cluster names "
                    "are unique across all groups and case-insensitive)",
                )
            )
        seen.setdefault(name.lower(), format_path(loc))

    adapter = lower(cluster.get("adapter"))
    k8s = cluster.get("kubernetes")
    if adapter == "kubernetes":
        if k8s is None:
            problems.append(
                (
                    loc,
                    "adapter 'kubernetes' needs a 'kubernetes' block: {kubeconfig, context} "
                    "or {inCluster: true}",
                )
            )
        elif isinstance(k8s, dict):
            in_cluster = k8s.get("inCluster") is True
            if in_cluster and k8s.get("kubeconfig") is not None:
                problems.append(
                    (
                        (*loc, "kubernetes", "kubeconfig"),
                        "'kubeconfig' and 'inCluster: true' exclude each other; keep one",
                    )
                )
            if not in_cluster and k8s.get("kubeconfig") is None:
                problems.append(
                    (
                        (*loc, "kubernetes"),
                        "'kubeconfig' (path of the kubeconfig file) is required unless "
                        "'inCluster: true'",
                    )
                )
        if "simulation" in cluster:
            problems.append(
                (
                    (*loc, "simulation"),
                    "'simulation' applies only to adapter 'simulated'; remove it",
                )
            )
    elif adapter == "simulated" and "kubernetes" in cluster:
        problems.append(
            (
                (*loc, "kubernetes"),
                "'kubernetes' applies only to adapter 'kubernetes'; remove it or set "
                "'adapter: kubernetes'",
            )
        )

    shapes: dict[tuple[str, int], int] = {}
    for ni, shape in enumerate(dicts(cluster.get("nodes"))):
        gpu, per_node = shape.get("gpu"), shape.get("gpusPerNode")
        if not isinstance(gpu, str) or not isinstance(per_node, int):
            continue
        key = (gpu.upper(), per_node)
        if key in shapes:
            problems.append(
                (
                    (*loc, "nodes", ni),
                    f"duplicate node shape {gpu} with {per_node} GPUs per node (also "
                    f"nodes[{shapes[key]}]); add the counts into one entry",
                )
            )
        shapes.setdefault(key, ni)
    return problems
