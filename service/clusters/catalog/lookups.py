"""The validated cluster catalog and its lookups: groups and clusters by name, and the
instance types each group offers per GPU (runtime.md §2)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from service.clusters.catalog.problems import (
    CatalogError,
    cross_check,
    format_path,
    problems_of,
)
from service.clusters.catalog.schema import CatalogFile, Cluster, ClusterGroup, HelmValidation
from service.clusters.instance_types import InstanceType, normalize_gpu


@dataclass(frozen=True)
class Offering:
    """One instance type a group offers for a GPU, the clusters offering it, and whether it
    is the GPU's default in that group."""

    instance_type: InstanceType
    clusters: tuple[Cluster, ...]
    default: bool


TypeKey = tuple[str, str, str]


def type_label(key: TypeKey) -> str:
    group, version, kind = key
    return f"{group}/{version}.{kind}" if group else f"{version}.{kind}"


@dataclass(frozen=True)
class PolicyPermission:
    """The `helmValidationPolicy` requests one cluster accepts (its own `helmValidation`
    over its group's, field by field, over the defaults: `Default` only, no extra types).

    `Unrestricted` lifts every kind restriction, so a cluster permitting it also permits
    `Default` with any extra types.
    """

    policies: tuple[str, ...] = ("Default",)
    extra_types: frozenset[TypeKey] = frozenset()

    def permits(self, name: str, extra_types: Iterable[TypeKey] = ()) -> bool:
        if "Unrestricted" in self.policies:
            return True
        return name in self.policies and set(extra_types) <= self.extra_types

    def refused(self, name: str, extra_types: Iterable[TypeKey] = ()) -> list[str]:
        """What of the request this cluster does not permit, in words (empty: all of it)."""
        if self.permits(name, extra_types):
            return []
        if name not in self.policies:
            return [f"policy {name}"]
        return [type_label(t) for t in extra_types if t not in self.extra_types]

    def describe(self) -> str:
        """`Default only, no extra types`, `Default and Unrestricted`, ..."""
        if "Unrestricted" in self.policies:
            return " and ".join(self.policies)
        extra = ", ".join(sorted(type_label(t) for t in self.extra_types))
        return f"{' and '.join(self.policies)} only, " + (
            f"extra types {extra}" if extra else "no extra types"
        )


def _permission(group: HelmValidation | None, cluster: HelmValidation | None) -> PolicyPermission:
    policies: list[str] = ["Default"]
    extra: list[TypeKey] = []
    for layer in (group, cluster):
        if layer is None:
            continue
        if "allowed_policies" in layer.model_fields_set:
            policies = list(layer.allowed_policies)
        if "allowed_extra_types" in layer.model_fields_set:
            extra = [t.key for t in layer.allowed_extra_types]
    return PolicyPermission(tuple(dict.fromkeys(policies)), frozenset(extra))


class Catalog:
    """The validated catalog with lookups; names of groups, clusters and GPUs are matched
    case-insensitively."""

    def __init__(self, spec: CatalogFile, source: str = "<data>") -> None:
        problems = cross_check(spec.model_dump(by_alias=True, exclude_unset=True))
        if problems:
            raise CatalogError(
                source, [f"{source}: {format_path(loc)}: {m}" for loc, m in problems]
            )
        self.spec = spec
        self.source = source
        self.groups: tuple[ClusterGroup, ...] = tuple(spec.cluster_groups)
        self._groups = {g.name.lower(): g for g in self.groups}
        self._clusters = {c.name.lower(): (g, c) for g in self.groups for c in g.clusters}
        self._offerings = {g.name.lower(): _offerings_of(g) for g in self.groups}
        self._permissions = {
            c.name.lower(): _permission(g.helm_validation, c.helm_validation)
            for g in self.groups
            for c in g.clusters
        }

    @classmethod
    def from_data(cls, data: Any, source: str = "<data>") -> Catalog:
        """Validate parsed YAML/JSON data (no line numbers); raises CatalogError."""
        problems = problems_of(data, source, lambda loc: None)
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

    def permission(self, cluster: Cluster | str) -> PolicyPermission:
        """The helmValidationPolicy requests the cluster accepts (defaults for an unknown
        one: `Default` only)."""
        name = cluster if isinstance(cluster, str) else cluster.name
        return self._permissions.get(name.lower(), PolicyPermission())

    def permitting(
        self, clusters: Iterable[Cluster], name: str, extra_types: Iterable[TypeKey] = ()
    ) -> list[Cluster]:
        """The clusters among `clusters` that permit the policy `name` with `extra_types`."""
        extra = list(extra_types)
        return [c for c in clusters if self.permission(c).permits(name, extra)]

    @property
    def clusters(self) -> tuple[Cluster, ...]:
        return tuple(c for g in self.groups for c in g.clusters)

    def gpus(self, group: str) -> list[str]:
        """GPU names the group offers, in catalog order (empty for an unknown group)."""
        return list(self._offerings.get(group.lower(), {}))

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
