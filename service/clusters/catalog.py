"""The cluster catalog: file schema (operations.md §3), loading with line-accurate errors,
offered instance types per group and GPU (runtime.md §2), and the deployment-spec resolver
(api.md §3.1).
"""

from __future__ import annotations

import difflib
import re
import types
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
)
from pydantic_core import PydanticCustomError

from service.clusters.instance_types import (
    CSPS,
    InstanceType,
    InstanceTypeError,
    normalize_csp,
    normalize_gpu,
    offered_instance_types,
    parse_instance_type,
)
from service.core.errors import FieldError
from service.core.kube import normalize_attributes

BUILTIN_SOURCE = "built-in catalog (service/clusters/default_catalog.yaml)"
# Fixed namespaces so ids survive restarts and re-deploys of the same catalog.
_GROUP_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "urn:nvcf-server:cluster-group")
_CLUSTER_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "urn:nvcf-server:cluster")

_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")
_QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?")

Loc = tuple[str | int, ...]


# ---------------------------------------------------------------------------------------------
# File schema


def _check_name(value: str) -> str:
    if not _NAME.fullmatch(value):
        raise PydanticCustomError(
            "name",
            "{value} is not a valid name: use 1-63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit",
            {"value": repr(value)},
        )
    return value


def _check_provider(value: Any) -> Any:
    if isinstance(value, str):
        csp = normalize_csp(value)
        if csp is None:
            raise PydanticCustomError(
                "provider",
                "unknown provider {value} (allowed: {allowed})",
                {"value": repr(value), "allowed": ", ".join(CSPS)},
            )
        return csp
    return value


def _check_gpu(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_]+", value):
        raise PydanticCustomError(
            "gpu",
            "GPU name {value} may contain only letters, digits and '_'",
            {"value": repr(value)},
        )
    return normalize_gpu(value)


def _quantity(value: Any) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str) and not _QUANTITY.fullmatch(value):
        raise PydanticCustomError(
            "quantity",
            "{value} is not a Kubernetes quantity such as 64, 500m or 512Gi",
            {"value": repr(value)},
        )
    return value


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


Name = Annotated[str, AfterValidator(_check_name)]
NonEmpty = Annotated[str, Field(min_length=1)]
PositiveInt = Annotated[int, Field(strict=True, gt=0)]
Seconds = Annotated[float, Field(ge=0)]
Quantity = Annotated[str, BeforeValidator(_quantity)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class NodeShape(_Model):
    """`count` identical nodes with `gpus_per_node` GPUs of model `gpu` each."""

    gpu: Annotated[str, AfterValidator(_check_gpu)]
    gpus_per_node: PositiveInt = Field(alias="gpusPerNode")
    count: PositiveInt
    cpu: Quantity | None = None
    memory: Quantity | None = None


class SimulationSettings(_Model):
    """Delays of the simulated adapter's pod lifecycle, in seconds."""

    schedule_seconds: Seconds = Field(default=0.5, alias="scheduleSeconds")
    pull_seconds: Seconds = Field(default=1.0, alias="pullSeconds")
    ready_seconds: Seconds = Field(default=1.0, alias="readySeconds")


class KubernetesSettings(_Model):
    """How to reach a real cluster: a kubeconfig file (and context), or in-cluster config."""

    kubeconfig: NonEmpty | None = None
    context: NonEmpty | None = None
    in_cluster: bool = Field(default=False, alias="inCluster")


class Cluster(_Model):
    name: Name
    adapter: Annotated[Literal["simulated", "kubernetes"], BeforeValidator(_lower)]
    provider: Annotated[str, BeforeValidator(_check_provider)]
    region: NonEmpty
    k8s_version: NonEmpty | None = Field(default=None, alias="k8sVersion")
    # Compared case-insensitively everywhere; known ones stored in their canonical spelling.
    attributes: Annotated[list[NonEmpty], AfterValidator(normalize_attributes)] = Field(
        default_factory=list
    )
    availability_zones: list[NonEmpty] = Field(default_factory=list, alias="availabilityZones")
    nodes: list[NodeShape] = Field(min_length=1)
    simulation: SimulationSettings = Field(default_factory=SimulationSettings)
    kubernetes: KubernetesSettings | None = None

    @property
    def id(self) -> uuid.UUID:
        return uuid.uuid5(_CLUSTER_NAMESPACE, self.name.lower())

    def offered_instance_types(self) -> list[InstanceType]:
        """Every type the cluster's node shapes offer, in node-shape order, without repeats."""
        seen: dict[str, InstanceType] = {}
        for shape in self.nodes:
            for it in offered_instance_types(
                self.provider, shape.gpu, shape.gpus_per_node, shape.count
            ):
                seen.setdefault(it.name, it)
        return list(seen.values())

    def offers(self, instance_type: InstanceType) -> bool:
        return any(it.name == instance_type.name for it in self.offered_instance_types())

    def capacity(self, instance_type: InstanceType) -> int:
        """How many instances of the type fit on the empty cluster (0 if not offered).

        `_kx` takes k GPUs of one node; `_Gx.x<k>` takes k whole nodes.
        """
        if not self.offers(instance_type):
            return 0
        shapes = [s for s in self.nodes if s.gpu == instance_type.gpu]
        if instance_type.is_multi_node:
            nodes = sum(s.count for s in shapes if s.gpus_per_node == instance_type.gpus_per_node)
            return nodes // instance_type.nodes
        return sum(
            s.count * (s.gpus_per_node // instance_type.gpus_per_node)
            for s in shapes
            if s.gpus_per_node >= instance_type.gpus_per_node
        )


class ClusterGroup(_Model):
    """A "backend": a named set of clusters a deployment specification can target."""

    name: Name
    clusters: list[Cluster] = Field(min_length=1)

    @property
    def id(self) -> uuid.UUID:
        return uuid.uuid5(_GROUP_NAMESPACE, self.name.lower())


class CatalogFile(_Model):
    cluster_groups: list[ClusterGroup] = Field(alias="clusterGroups", min_length=1)


# ---------------------------------------------------------------------------------------------
# The catalog and its lookups


class CatalogError(Exception):
    """A catalog that cannot be used; `problems` has one `file:line: path: message` each."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
        super().__init__(f"invalid cluster catalog {source} ({count}):\n" + "\n".join(problems))


@dataclass(frozen=True)
class Offering:
    """One instance type a group offers for a GPU, the clusters offering it, and whether it
    is the GPU's default in that group."""

    instance_type: InstanceType
    clusters: tuple[Cluster, ...]
    default: bool


class Catalog:
    """The validated catalog with lookups; names of groups, clusters and GPUs are matched
    case-insensitively."""

    def __init__(self, spec: CatalogFile, source: str = "<data>") -> None:
        problems = _cross_check(spec.model_dump(by_alias=True, exclude_unset=True))
        if problems:
            raise CatalogError(
                source, [f"{source}: {_format_path(loc)}: {m}" for loc, m in problems]
            )
        self.spec = spec
        self.source = source
        self.groups: tuple[ClusterGroup, ...] = tuple(spec.cluster_groups)
        self._groups = {g.name.lower(): g for g in self.groups}
        self._clusters = {c.name.lower(): (g, c) for g in self.groups for c in g.clusters}
        self._offerings = {g.name.lower(): _offerings_of(g) for g in self.groups}

    @classmethod
    def from_data(cls, data: Any, source: str = "<data>") -> Catalog:
        """Validate parsed YAML/JSON data (no line numbers); raises CatalogError."""
        problems = _problems(data, source, lambda loc: None)
        if problems:
            raise CatalogError(source, problems)
        return cls(CatalogFile.model_validate(data), source)

    def group(self, name: str) -> ClusterGroup | None:
        return self._groups.get(name.lower())

    def cluster(self, name: str) -> Cluster | None:
        found = self._clusters.get(name.lower())
        return found[1] if found else None

    def group_of(self, cluster: Cluster | str) -> ClusterGroup:
        name = cluster if isinstance(cluster, str) else cluster.name
        return self._clusters[name.lower()][0]

    @property
    def clusters(self) -> tuple[Cluster, ...]:
        return tuple(c for g in self.groups for c in g.clusters)

    def gpus(self, group: str) -> list[str]:
        """GPU names the group offers, in catalog order (empty for an unknown group)."""
        return list(self._offerings.get(group.lower(), {}))

    def groups_offering(self, gpu: str) -> list[ClusterGroup]:
        return [g for g in self.groups if self.offerings(g.name, gpu)]

    def offerings(self, group: str, gpu: str) -> list[Offering]:
        """Instance types the group offers for the GPU: single-node ones by size, then
        multi-node ones by node count (empty for an unknown group or GPU)."""
        return self._offerings.get(group.lower(), {}).get(normalize_gpu(gpu), [])

    def offering(self, group: str, gpu: str, instance_type: InstanceType | str) -> Offering | None:
        name = instance_type if isinstance(instance_type, str) else instance_type.name
        return next(
            (o for o in self.offerings(group, gpu) if o.instance_type.name.lower() == name.lower()),
            None,
        )

    def default_instance_type(self, group: str, gpu: str) -> InstanceType | None:
        return next((o.instance_type for o in self.offerings(group, gpu) if o.default), None)


def _offerings_of(group: ClusterGroup) -> dict[str, list[Offering]]:
    by_gpu: dict[str, dict[str, tuple[InstanceType, list[Cluster]]]] = {}
    for cluster in group.clusters:
        for it in cluster.offered_instance_types():
            _, clusters = by_gpu.setdefault(it.gpu, {}).setdefault(it.name, (it, []))
            clusters.append(cluster)
    out: dict[str, list[Offering]] = {}
    for gpu, offered in by_gpu.items():
        # Stable sort: equal shapes from different providers keep catalog order.
        ordered = sorted(offered.values(), key=lambda p: (p[0].nodes, p[0].gpus_per_node))
        out[gpu] = [
            Offering(it, tuple(clusters), default=i == 0)
            for i, (it, clusters) in enumerate(ordered)
        ]
    return out


# ---------------------------------------------------------------------------------------------
# Loading


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
    problems += _problems(data, source, line_of)
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
                    f"{source}:{line}: {_format_path(path)}: duplicate key {key!r} "
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
    for group in _dicts(data.get("clusterGroups") if isinstance(data, dict) else None):
        for cluster in _dicts(group.get("clusters")):
            k8s = cluster.get("kubernetes")
            if isinstance(k8s, dict) and isinstance(k8s.get("kubeconfig"), str):
                p = Path(k8s["kubeconfig"]).expanduser()
                k8s["kubeconfig"] = str(p if p.is_absolute() else base_dir / p)


def _problems(data: Any, source: str, line_of: Callable[[Loc], int | None]) -> list[str]:
    found: list[tuple[Loc, str]] = []
    try:
        CatalogFile.model_validate(data)
    except ValidationError as exc:
        for e in exc.errors(include_url=False):
            loc: Loc = tuple(p for p in e["loc"] if isinstance(p, str | int))
            found.append(_describe(loc, e))
    found += _cross_check(data)
    out: list[tuple[int, str]] = []
    for loc, message in found:
        line = line_of(loc)
        where = f"{source}:{line}" if line is not None else source
        path = _format_path(loc[:-1] if _names_field(message) else loc)
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


def _format_path(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _dicts(value: Any) -> Iterable[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _cross_check(data: Any) -> list[tuple[Loc, str]]:
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
            group_names.setdefault(name.lower(), _format_path(gloc))
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
        seen.setdefault(name.lower(), _format_path(loc))

    adapter = _lower(cluster.get("adapter"))
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
    for ni, shape in enumerate(_dicts(cluster.get("nodes"))):
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


# ---------------------------------------------------------------------------------------------
# Deployment specification resolution


@dataclass(frozen=True)
class ResolvedTarget:
    """Where a deployment specification may run: its group, canonical GPU name, instance
    type (the default one when the spec had none) and the clusters placement may use."""

    group: ClusterGroup
    gpu: str
    instance_type: InstanceType
    clusters: tuple[Cluster, ...]


def resolve_spec(
    catalog: Catalog,
    spec: Mapping[str, Any],
    *,
    is_helm: bool,
    path: str = "deploymentSpecifications[0]",
) -> ResolvedTarget | list[FieldError]:
    """Check one deployment specification against the catalog (no I/O).

    Returns the target, or every problem found as FieldErrors under `path`.
    """
    errors: list[FieldError] = []

    def fail(field: str, message: str) -> None:
        errors.append(FieldError(f"{path}.{field}", message))

    gpu_raw = spec.get("gpu")
    gpu: str | None = None
    if not isinstance(gpu_raw, str) or not gpu_raw.strip():
        fail("gpu", "is required: the GPU model to run on, e.g. L40S")
    else:
        gpu = normalize_gpu(gpu_raw.strip())

    instance_type: InstanceType | None = None
    it_raw = spec.get("instanceType")
    if it_raw is not None:
        try:
            instance_type = parse_instance_type(it_raw)
        except InstanceTypeError as exc:
            fail("instanceType", str(exc))
    if instance_type and gpu and instance_type.gpu != gpu:
        fail(
            "instanceType",
            f"instance type {instance_type.name!r} is for GPU {instance_type.gpu}, "
            f"but 'gpu' is {gpu_raw!r}",
        )
    if instance_type and instance_type.is_multi_node and not is_helm:
        fail(
            "instanceType",
            f"multi-node instance type {instance_type.name!r} ({instance_type.nodes} nodes) "
            "is only available to helm functions; container functions run on one node, "
            f"e.g. {instance_type.csp}.GPU.{instance_type.gpu}_{instance_type.gpus_per_node}x",
        )

    wanted_clusters = _names(spec, "clusters", fail)
    regions = _names(spec, "regions", fail)
    zones = _names(spec, "availabilityZones", fail)
    attributes = _names(spec, "attributes", fail)

    backend = spec.get("backend")
    candidates: list[ClusterGroup] = list(catalog.groups)
    if backend is not None:
        group = catalog.group(backend) if isinstance(backend, str) else None
        if wanted_clusters:
            fail(
                "backend",
                "'backend' and 'clusters' cannot be used together: the clusters already "
                "determine their group; remove one of them",
            )
        if group is None:
            fail(
                "backend",
                f"unknown cluster group {backend!r}; available: "
                + ", ".join(g.name for g in catalog.groups),
            )
        else:
            candidates = [group]
    elif wanted_clusters:
        for i, name in enumerate(wanted_clusters):
            if catalog.cluster(name) is None:
                fail(
                    f"clusters[{i}]",
                    f"unknown cluster {name!r}; available: "
                    + ", ".join(c.name for c in catalog.clusters),
                )
        named = {catalog.group_of(n).name for n in wanted_clusters if catalog.cluster(n)}
        candidates = [g for g in catalog.groups if g.name in named]

    if gpu is None or any(not e.field.startswith(f"{path}.instanceType") for e in errors):
        return errors

    offering_gpu = [g for g in candidates if catalog.offerings(g.name, gpu)]
    if not offering_gpu:
        offered = list(dict.fromkeys(x for g in candidates for x in catalog.gpus(g.name)))
        fail(
            "gpu",
            f"GPU {gpu_raw!r} is not offered by {_groups_phrase(candidates, backend, catalog)}; "
            f"offered GPUs: {', '.join(offered) or 'none'}",
        )
    if errors:
        return errors

    targets: list[tuple[ClusterGroup, Offering]] = []
    for g in offering_gpu:
        if instance_type is not None:
            found = catalog.offering(g.name, gpu, instance_type)
        else:
            found = next((o for o in catalog.offerings(g.name, gpu) if o.default), None)
        if found is not None:
            targets.append((g, found))
    if not targets:
        assert instance_type is not None  # every GPU a group offers has a default type
        offered_by = "; ".join(
            f"{g.name}: "
            + ", ".join(
                o.instance_type.name
                for o in catalog.offerings(g.name, gpu)
                if is_helm or not o.instance_type.is_multi_node
            )
            for g in offering_gpu
        )
        fail(
            "instanceType",
            f"instance type {instance_type.name!r} is not offered for GPU {gpu} by "
            f"{_groups_phrase(offering_gpu, backend, catalog)}; offered: {offered_by}",
        )
        return errors

    first_failure: FieldError | None = None
    for g, offering in targets:
        result = _narrow(path, offering, g, wanted_clusters, regions, zones, attributes)
        if isinstance(result, FieldError):
            first_failure = first_failure or result
            continue
        return ResolvedTarget(
            group=g, gpu=gpu, instance_type=offering.instance_type, clusters=result
        )
    assert first_failure is not None
    return [first_failure]


def _names(spec: Mapping[str, Any], key: str, fail: Callable[[str, str], None]) -> list[str]:
    value = spec.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        fail(key, "must be a list of non-empty strings")
        return []
    return list(value)


def _groups_phrase(groups: list[ClusterGroup], backend: Any, catalog: Catalog) -> str:
    if backend is None and len(groups) == len(catalog.groups):
        return "any cluster group"
    names = ", ".join(repr(g.name) for g in groups)
    return f"cluster group {names}" if len(groups) == 1 else f"cluster groups {names}"


def _narrow(
    path: str,
    offering: Offering,
    group: ClusterGroup,
    wanted: list[str],
    regions: list[str],
    zones: list[str],
    attributes: list[str],
) -> tuple[Cluster, ...] | FieldError:
    """The offering's clusters passing every filter, or an error naming the filter that
    removed the last ones (and what the remaining candidates have instead)."""
    name = offering.instance_type.name
    clusters = list(offering.clusters)
    where = f"{name} in cluster group {group.name!r}"

    def listing(describe: Callable[[Cluster], str]) -> str:
        return ", ".join(f"{c.name} ({describe(c)})" for c in clusters)

    if wanted:
        keep = [c for c in clusters if c.name.lower() in {w.lower() for w in wanted}]
        if not keep:
            return FieldError(
                f"{path}.clusters",
                f"none of the clusters {', '.join(wanted)} offers {name}; it is offered by: "
                + ", ".join(c.name for c in clusters),
            )
        clusters = keep
    if regions:
        keep = [c for c in clusters if c.region.lower() in {r.lower() for r in regions}]
        if not keep:
            return FieldError(
                f"{path}.regions",
                f"no cluster offering {where} is in region {' or '.join(regions)}; "
                f"candidate clusters: {listing(lambda c: c.region)}",
            )
        clusters = keep
    if zones:
        wanted_zones = {z.lower() for z in zones}
        keep = [c for c in clusters if wanted_zones & {z.lower() for z in c.availability_zones}]
        if not keep:
            return FieldError(
                f"{path}.availabilityZones",
                f"no cluster offering {where} is in availability zone {' or '.join(zones)}; "
                "candidate clusters: "
                + listing(lambda c: ", ".join(c.availability_zones) or "no zones declared"),
            )
        clusters = keep
    if attributes:
        required = {a.lower() for a in attributes}
        keep = [c for c in clusters if required <= {a.lower() for a in c.attributes}]
        if not keep:
            return FieldError(
                f"{path}.attributes",
                f"no cluster offering {where} has all the attributes {', '.join(attributes)}; "
                "candidate clusters: "
                + listing(lambda c: ", ".join(c.attributes) or "no attributes"),
            )
        clusters = keep
    return tuple(clusters)
