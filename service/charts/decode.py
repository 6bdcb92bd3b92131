"""Split a rendered manifest into objects with bounded memory and time.

Documents over 1 MiB are reported (`object-too-large`) and never parsed. YAML aliases are
allowed, but the size of the tree they expand to is bounded before anything is constructed,
so a "billion laughs" document costs no more than its text (`yaml-alias-bomb`). Timestamps
stay strings, as Kubernetes reads them; the result is plain JSON data with nothing shared.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

import yaml

from service.charts.findings import Finding, KubeObject, object_ref

MAX_DOCUMENT_BYTES = 1024 * 1024
#: Expanded node budget per document: generous for real objects, tiny next to a bomb.
MAX_EXPANDED_NODES = 200_000

_SEPARATOR = re.compile(r"^---[ \t]*(?:#.*)?$", re.MULTILINE)
_SOURCE = re.compile(r"^# Source: (.+)$", re.MULTILINE)

_BaseLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BaseLoader):  # type: ignore[valid-type,misc]
    """Safe loader without timestamp resolution."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


class DecodeError(ValueError):
    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule = rule


def expanded_size(root: yaml.Node, budget: int) -> int:
    """Node count of the tree `root` expands to (aliases counted at every use).

    Shared nodes are memoised, so the walk is linear in the composed graph; the count stops
    growing meaningfully past `budget` and is compared by the caller.
    """
    memo: dict[int, int] = {}
    in_progress: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in memo:
            continue
        if isinstance(node, yaml.ScalarNode):
            memo[key] = 1
            continue
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                children.extend((k, v))
        if children_done:
            in_progress.discard(key)
            memo[key] = min(1 + sum(memo[id(c)] for c in children), budget + 1)
            continue
        if key in in_progress:
            return budget + 1  # a recursive alias expands without end
        in_progress.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in in_progress:
                return budget + 1
            if id(child) not in memo:
                stack.append((child, False))
    return memo.get(id(root), 0)


def load_documents(text: str, *, max_nodes: int = MAX_EXPANDED_NODES) -> list[Any]:
    """Parse every YAML document in `text` into JSON data, bounding alias expansion."""
    loader = _Loader(text)
    out: list[Any] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            if expanded_size(node, max_nodes) > max_nodes:
                raise DecodeError(
                    "yaml-alias-bomb",
                    f"document expands to more than {max_nodes} YAML nodes (alias expansion)",
                )
            data = loader.construct_document(node)
            # Round trip through JSON: unshares aliased subtrees, stringifies odd scalars.
            out.append(json.loads(json.dumps(data, default=str)))
    except yaml.YAMLError as exc:
        raise DecodeError("invalid-yaml", f"invalid YAML: {exc}") from None
    except RecursionError:
        raise DecodeError("invalid-yaml", "invalid YAML: nested too deeply") from None
    finally:
        loader.dispose()
    return out


def split_documents(manifest: str) -> list[tuple[str | None, str]]:
    """Split a Helm manifest into `(source template, text)` chunks, dropping empty ones."""
    chunks: list[tuple[str | None, str]] = []
    for chunk in _SEPARATOR.split(manifest):
        body = "\n".join(
            line for line in chunk.splitlines() if line.strip() and not line.startswith("#")
        )
        if not body.strip():
            continue
        source = _SOURCE.search(chunk)
        chunks.append((source.group(1).strip() if source else None, chunk))
    return chunks


def decode_manifest(
    manifest: str, *, max_document_bytes: int = MAX_DOCUMENT_BYTES
) -> tuple[list[KubeObject], list[Finding]]:
    """Decode every document; oversized or malformed ones become error findings."""
    objects: list[KubeObject] = []
    findings: list[Finding] = []
    for source, chunk in split_documents(manifest):
        where = f" in {source}" if source else ""
        size = len(chunk.encode())
        if size > max_document_bytes:
            findings.append(
                Finding(
                    "object-too-large",
                    "error",
                    None,
                    None,
                    f"a document{where} is {size} bytes, over the {max_document_bytes} byte "
                    "limit; it was not parsed",
                )
            )
            continue
        try:
            docs = load_documents(chunk)
        except DecodeError as exc:
            findings.append(Finding(exc.rule, "error", None, None, f"{exc}{where}"))
            continue
        for doc in docs:
            if doc is None:
                continue
            if not isinstance(doc, dict):
                findings.append(
                    Finding(
                        "invalid-object",
                        "error",
                        None,
                        None,
                        f"a document{where} is not a Kubernetes object (a mapping)",
                    )
                )
                continue
            objects.append(doc)
    return objects, findings


def hook_findings(hook_templates: dict[str, str]) -> tuple[list[str], list[Finding]]:
    """`hook-skipped` warnings for each hook object in the templates Helm left out."""
    skipped: list[str] = []
    findings: list[Finding] = []
    for path in sorted(hook_templates):
        objects, _ = decode_manifest(hook_templates[path])
        for obj in objects:
            meta = obj.get("metadata")
            annotations = meta.get("annotations") if isinstance(meta, dict) else None
            if not isinstance(annotations, dict) or "helm.sh/hook" not in annotations:
                continue
            ref = object_ref(obj)
            skipped.append(ref)
            findings.append(
                Finding(
                    "hook-skipped",
                    "warning",
                    ref,
                    "metadata.annotations.helm.sh/hook",
                    f"hook {annotations['helm.sh/hook']!r} from template {path} is not "
                    "rendered and never executed",
                )
            )
    return skipped, findings


def crd_names(crds: Iterable[dict[str, str]]) -> list[str]:
    """Object refs of the CRDs shipped in `crds/` directories (malformed ones by file)."""
    refs: list[str] = []
    for crd in crds:
        try:
            docs = load_documents(crd.get("data", ""))
        except DecodeError:
            docs = []
        named = [object_ref(d) for d in docs if isinstance(d, dict)]
        refs.extend(named or [crd.get("filename") or crd.get("name") or "?"])
    return refs
