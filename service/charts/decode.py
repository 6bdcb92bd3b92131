"""Split a rendered manifest into objects with bounded memory and time.

Documents over 1 MiB are reported (`object-too-large`) and never parsed. YAML aliases are
allowed, but the size of the tree they expand to is bounded before anything is constructed,
so a "billion laughs" document costs no more than its text (`yaml-alias-bomb`). Timestamps
stay strings, as Kubernetes reads them; the result is plain JSON data with nothing shared.

Speed (a chart renders hundreds of documents): parsing and composing run in libyaml when
PyYAML has it; a document without anchors (`&`) has no aliases, so the expansion walk is
skipped; plain documents (string keys; string, number, boolean and null scalars; no tags,
merge keys or aliases) are built by a direct walk that gives exactly what the general path
(PyYAML's constructor, then a JSON round trip) gives, which remains the path for the rest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import astuple, dataclass
from typing import Any

import yaml

from service.charts.findings import Finding, KubeObject, metadata, object_ref
from service.core.kube import HOOK_ANNOTATION

MAX_DOCUMENT_BYTES = 1024 * 1024
#: Expanded node budget per document: generous for real objects, tiny next to a bomb.
MAX_EXPANDED_NODES = 200_000

_SEPARATOR = re.compile(r"^---[ \t]*(?:#.*)?$", re.MULTILINE)
_SOURCE = re.compile(r"^# Source: (.+)$", re.MULTILINE)
_CONTENT_LINE = re.compile(r"^[^#\s]", re.MULTILINE)

_BaseLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BaseLoader):  # type: ignore[valid-type,misc]
    """Safe loader without timestamp resolution."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}

_STR = "tag:yaml.org,2002:str"
_SEQ = "tag:yaml.org,2002:seq"
_MAP = "tag:yaml.org,2002:map"
#: Scalar tags whose constructed values survive a JSON round trip unchanged.
_JSON_SCALARS = frozenset(
    ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool")
)
_NULL = "tag:yaml.org,2002:null"
#: Plain scalars seen so far → resolved tag (the resolver is a regex scan per scalar, and
#: manifests repeat the same keys and values over and over).
_RESOLVED: dict[str, str] = {}
_RESOLVED_MAX_ENTRIES = 50_000
_RESOLVED_MAX_VALUE = 128


_base_resolve: Callable[[Any, Any, Any, Any], str] = _BaseLoader.resolve


def _resolve(self: Any, kind: Any, value: Any, implicit: Any) -> str:
    """`Resolver.resolve` memoised for plain scalars (the loader has no path resolvers, so the
    tag of a plain scalar depends on its text alone)."""
    if kind is yaml.ScalarNode and implicit[0] and len(value) <= _RESOLVED_MAX_VALUE:
        tag = _RESOLVED.get(value)
        if tag is None:
            tag = _base_resolve(self, kind, value, implicit)
            if len(_RESOLVED) < _RESOLVED_MAX_ENTRIES:
                _RESOLVED[value] = tag
        return tag
    return _base_resolve(self, kind, value, implicit)


if not _Loader.yaml_path_resolvers:
    _Loader.resolve = _resolve


class _NotPlain(Exception):
    """The document needs the general constructor."""


def _plain(node: yaml.Node, loader: Any) -> Any:
    """Build a plain document directly; raises `_NotPlain` for anything else."""
    tag = node.tag
    if isinstance(node, yaml.ScalarNode):
        if tag == _STR:
            return node.value
        if tag in _JSON_SCALARS:
            value = loader.yaml_constructors[tag](loader, node)
            if isinstance(value, float) and value != value:
                raise _NotPlain  # NaN: leave it to the general path
            return value
        if tag == _NULL:
            return None
        raise _NotPlain
    if isinstance(node, yaml.MappingNode):
        if tag != _MAP:
            raise _NotPlain
        out: dict[str, Any] = {}
        for key, value in node.value:
            if key.tag != _STR or not isinstance(key, yaml.ScalarNode):
                raise _NotPlain  # merge keys, '=' keys, non-string keys
            out[key.value] = _plain(value, loader)
        return out
    if isinstance(node, yaml.SequenceNode) and tag == _SEQ:
        return [_plain(item, loader) for item in node.value]
    raise _NotPlain


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


def load_documents(text: str) -> list[Any]:
    """Parse every YAML document in `text` into JSON data, bounding alias expansion."""
    loader = _Loader(text)
    # Without an anchor there is no alias, so nothing to expand and nothing shared.
    anchors = "&" in text
    out: list[Any] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            if anchors and expanded_size(node, MAX_EXPANDED_NODES) > MAX_EXPANDED_NODES:
                raise DecodeError(
                    "yaml-alias-bomb",
                    f"document expands to more than {MAX_EXPANDED_NODES} YAML nodes "
                    "(alias expansion)",
                )
            if not anchors:
                try:
                    out.append(_plain(node, loader))
                    continue
                except (_NotPlain, RecursionError):
                    pass
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


def _has_content(chunk: str) -> bool:
    body = "\n".join(
        line for line in chunk.splitlines() if line.strip() and not line.startswith("#")
    )
    return bool(body.strip())


def split_documents(manifest: str) -> list[tuple[str | None, str]]:
    """Split a Helm manifest into `(source template, text)` chunks, dropping empty ones."""
    chunks: list[tuple[str | None, str]] = []
    for chunk in _SEPARATOR.split(manifest):
        # A line starting with neither '#' nor whitespace settles it without the line walk.
        if _CONTENT_LINE.search(chunk) is None and not _has_content(chunk):
            continue
        source = _SOURCE.search(chunk)
        chunks.append((source.group(1).strip() if source else None, chunk))
    return chunks


#: One decoded chunk in Helm's sort: (rank of its kind, its objects).
Entry = tuple[tuple[int, int, str], list[KubeObject]]
#: A hook object Helm leaves out of the manifest, with its template path.
Hook = tuple[str, KubeObject]


def decode_manifest(manifest: str) -> tuple[list[KubeObject], list[Finding]]:
    """Decode every document; oversized or malformed ones become error findings."""
    objects: list[KubeObject] = []
    findings: list[Finding] = []
    for source, chunk in split_documents(manifest):
        where = f" in {source}" if source else ""
        size = len(chunk.encode())
        if size > MAX_DOCUMENT_BYTES:
            findings.append(
                Finding(
                    "object-too-large",
                    "error",
                    None,
                    None,
                    f"a document{where} is {size} bytes, over the {MAX_DOCUMENT_BYTES} byte "
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


def helm_entries(manifest: str) -> tuple[list[Entry], list[Hook]]:
    """The chunks of a template-order render (`helm_engine.engine_manifest`), decoded and
    ranked for Helm's sort, and the hooks Helm leaves out of the manifest. Results of
    consecutive pieces of a manifest, split where a document starts, concatenate to the
    results of the whole.

    Helm decides the order (and whether a document is a hook) from its own parse of each
    document's head; when a document could read differently there or fails to decode, this
    raises `HelmOrderUncertain` and the caller asks Helm's install action instead.
    """
    entries: list[Entry] = []
    hooks: list[Hook] = []
    for source, chunk in split_documents(manifest):
        where = f" in {source}" if source else ""
        if len(chunk.encode()) > MAX_DOCUMENT_BYTES:
            raise HelmOrderUncertain(f"a document{where} is too large")
        try:
            docs = [doc for doc in load_documents(chunk) if doc is not None]
        except DecodeError as exc:
            raise HelmOrderUncertain(str(exc)) from None
        if len(docs) > 1 or (docs and not _helm_plain_head(docs[0])):
            raise HelmOrderUncertain(f"a document{where} is not plain for Helm")
        if not docs:
            continue
        if HOOK_ANNOTATION in _annotations(docs[0]):
            # Helm keeps a hook of a known kind apart and drops an unknown one: either
            # way it is not installed. Reported with its template, which must be known.
            if source is None:
                raise HelmOrderUncertain("a hook document without its template")
            hooks.append((source, docs[0]))
            continue
        entries.append((_install_rank(docs[0].get("kind") or ""), docs))
    return entries, hooks


@dataclass
class Decoded:
    """A render's manifest (or a piece of it cut where a document starts), decoded: the
    objects as entries for Helm's sort, the decode findings and the hooks left out. Pieces
    concatenate (`extend`) to the decoding of the whole."""

    entries: list[Entry]
    findings: list[Finding]
    hooks: list[Hook]

    @classmethod
    def of(cls, manifest: str, *, helm_order: bool) -> Decoded:
        """Decode a template-order render (`helm_entries`, which may raise
        `HelmOrderUncertain`) or an install-action render (`decode_manifest`, already in
        Helm's order: one entry)."""
        if helm_order:
            entries, hooks = helm_entries(manifest)
            return cls(entries, [], hooks)
        objects, findings = decode_manifest(manifest)
        return cls([(_install_rank(""), objects)], findings, [])

    def extend(self, other: Decoded) -> None:
        self.entries.extend(other.entries)
        self.findings.extend(other.findings)
        self.hooks.extend(other.hooks)

    def objects(self) -> list[KubeObject]:
        return helm_sorted(self.entries)

    def as_json(self) -> dict[str, Any]:
        return {
            "entries": [[list(rank), docs] for rank, docs in self.entries],
            "findings": [list(astuple(f)) for f in self.findings],
            "hooks": [[path, obj] for path, obj in self.hooks],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Decoded:
        """The inverse of `as_json` (raises KeyError, TypeError or ValueError on bad data)."""
        return cls(
            [((int(r[0]), int(r[1]), str(r[2])), list(docs)) for r, docs in data["entries"]],
            [Finding(*values) for values in data["findings"]],
            [(str(path), dict(obj)) for path, obj in data["hooks"]],
        )


def helm_sorted(entries: list[Entry]) -> list[KubeObject]:
    """The objects in Helm's install order (sorted() is stable, like sort.SliceStable)."""
    return [obj for _, docs in sorted(entries, key=lambda entry: entry[0]) for obj in docs]


class HelmOrderUncertain(Exception):
    """A template-order render holds a document whose reading by Helm's install action
    (order, hook or not, parse error) this module cannot vouch for."""


#: Helm's `releaseutil.InstallOrder` (v4.2): kind → rank; other kinds follow, by name.
INSTALL_ORDER = {
    kind: rank
    for rank, kind in enumerate(
        (
            "PriorityClass",
            "Namespace",
            "NetworkPolicy",
            "ResourceQuota",
            "LimitRange",
            "PodSecurityPolicy",
            "PodDisruptionBudget",
            "ServiceAccount",
            "Secret",
            "SecretList",
            "ConfigMap",
            "StorageClass",
            "PersistentVolume",
            "PersistentVolumeClaim",
            "CustomResourceDefinition",
            "ClusterRole",
            "ClusterRoleList",
            "ClusterRoleBinding",
            "ClusterRoleBindingList",
            "Role",
            "RoleList",
            "RoleBinding",
            "RoleBindingList",
            "Service",
            "DaemonSet",
            "Pod",
            "ReplicationController",
            "ReplicaSet",
            "Deployment",
            "HorizontalPodAutoscaler",
            "StatefulSet",
            "Job",
            "CronJob",
            "IngressClass",
            "Ingress",
            "APIService",
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
        )
    )
}


def _install_rank(kind: str) -> tuple[int, int, str]:
    rank = INSTALL_ORDER.get(kind)
    return (0, rank, "") if rank is not None else (1, 0, kind)


_SCALARS = (str, int, float, bool, type(None))
_HEAD_KEYS = {"apiversion": "apiVersion", "kind": "kind", "metadata": "metadata"}
_META_KEYS = {"name": "name", "annotations": "annotations"}


def _exact_keys(mapping: dict[str, Any], fields: dict[str, str]) -> bool:
    """No key that Go's encoding/json would take for a field (it matches names ignoring
    case) other than the field's exact name."""
    return all(fields.get(key.lower(), key) == key for key in mapping if isinstance(key, str))


def _helm_plain_head(doc: Any) -> bool:
    """Whether Helm's `SimpleHead` reading of `doc` is certainly ours. Helm decodes
    apiVersion, kind, metadata.name and metadata.annotations into Go strings (YAML scalars
    by their text, null as ""); anything else there fails its parse."""
    if not isinstance(doc, dict) or not _exact_keys(doc, _HEAD_KEYS):
        return False
    if not isinstance(doc.get("apiVersion"), str | None) or not isinstance(
        doc.get("kind"), str | None
    ):
        return False
    meta = doc.get("metadata")
    if meta is None:
        return True
    if not isinstance(meta, dict) or not _exact_keys(meta, _META_KEYS):
        return False
    if not isinstance(meta.get("name"), str | None):
        return False
    annotations = meta.get("annotations")
    if annotations is None:
        return True
    return isinstance(annotations, dict) and all(
        isinstance(value, _SCALARS) for value in annotations.values()
    )


def _annotations(obj: KubeObject) -> dict[str, Any]:
    annotations = metadata(obj).get("annotations")
    return annotations if isinstance(annotations, dict) else {}


def hook_findings(hook_templates: dict[str, str]) -> tuple[list[str], list[Finding]]:
    """`hook-skipped` warnings for each hook object in the templates Helm left out."""
    hooks = [
        (path, obj)
        for path in sorted(hook_templates)
        for obj in decode_manifest(hook_templates[path])[0]
        if HOOK_ANNOTATION in _annotations(obj)
    ]
    return skipped_hooks(hooks)


def skipped_hooks(hooks: Iterable[Hook]) -> tuple[list[str], list[Finding]]:
    """The refs of hook objects and a `hook-skipped` warning for each."""
    skipped: list[str] = []
    findings: list[Finding] = []
    for path, obj in hooks:
        ref = object_ref(obj)
        skipped.append(ref)
        hook = _annotations(obj).get(HOOK_ANNOTATION)
        findings.append(
            Finding(
                "hook-skipped",
                "warning",
                ref,
                "metadata.annotations.helm.sh/hook",
                f"hook {hook!r} from template {path} is not rendered and never executed",
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
