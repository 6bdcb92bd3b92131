"""Loading the catalog file: YAML read with the line of every path, duplicate keys caught,
relative kubeconfig paths resolved, and every problem reported as `file:line: path: message`."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from service.clusters.catalog.lookups import Catalog
from service.clusters.catalog.problems import (
    CatalogError,
    Loc,
    dicts,
    format_path,
    problems_of,
)
from service.clusters.catalog.schema import CatalogFile

BUILTIN_SOURCE = "built-in catalog (service/clusters/default_catalog.yaml)"


def load_catalog(path: Path | None) -> Catalog:
    """The catalog in the YAML file at `path`, or the built-in one for None.

    Raises CatalogError naming the file and line of every problem.
    """
    if path is None:
        text = resources.files("service.clusters").joinpath("default_catalog.yaml").read_text()
        return _load_text(text, BUILTIN_SOURCE, base_dir=None)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CatalogError(str(path), [f"{path}: cannot read the file: {reason}"]) from exc
    return _load_text(text, str(path), base_dir=Path(path).absolute().parent)


def check_catalog(path: Path) -> list[str]:
    """Problems of the catalog file, one `file:line: path: message` per line; empty if valid."""
    try:
        load_catalog(path)
    except CatalogError as exc:
        return exc.problems
    return []


def _load_text(text: str, source: str, base_dir: Path | None) -> Catalog:
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise CatalogError(source, [f"{source}{line}: not valid YAML: {exc.problem}"]) from exc
    except yaml.YAMLError as exc:
        raise CatalogError(source, [f"{source}: not valid YAML: {exc}"]) from exc
    if node is None:
        raise CatalogError(
            source, [f"{source}:1: the file is empty; expected a mapping with 'clusterGroups'"]
        )

    lines: dict[Loc, int] = {}
    problems = _walk(node, (), lines, source)

    def line_of(loc: Loc) -> int | None:
        for end in range(len(loc), -1, -1):
            if loc[:end] in lines:
                return lines[loc[:end]]
        return None

    if base_dir is not None:
        _resolve_kubeconfigs(data, base_dir)
    problems += problems_of(data, source, line_of)
    if problems:
        raise CatalogError(source, problems)
    return Catalog(CatalogFile.model_validate(data), source)


def _walk(node: yaml.Node, path: Loc, lines: dict[Loc, int], source: str) -> list[str]:
    """Record the line of every path (a key's own line for mapping values); report
    duplicate keys, which YAML loaders otherwise silently overwrite."""
    lines.setdefault(path, node.start_mark.line + 1)
    problems: list[str] = []
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            line = key_node.start_mark.line + 1
            if key in first:
                problems.append(
                    f"{source}:{line}: {format_path(path)}: duplicate key {key!r} "
                    f"(first at line {first[key]})"
                )
                continue
            first[key] = line
            lines[(*path, key)] = line
            problems += _walk(value_node, (*path, key), lines, source)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            problems += _walk(item, (*path, i), lines, source)
    return problems


def _resolve_kubeconfigs(data: Any, base_dir: Path) -> None:
    # A relative kubeconfig path means relative to the catalog file, not to the server's cwd.
    for group in dicts(data.get("clusterGroups") if isinstance(data, dict) else None):
        for cluster in dicts(group.get("clusters")):
            k8s = cluster.get("kubernetes")
            if isinstance(k8s, dict) and isinstance(k8s.get("kubeconfig"), str):
                p = Path(k8s["kubeconfig"]).expanduser()
                k8s["kubeconfig"] = str(p if p.is_absolute() else base_dir / p)
