"""Resolving a deployment specification (api.md §3.1) against the catalog: its group, GPU,
instance type and the clusters placement may use, or every problem as FieldErrors."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from service.clusters.catalog.lookups import Catalog, Offering
from service.clusters.catalog.schema import Cluster, ClusterGroup
from service.clusters.instance_types import (
    InstanceType,
    InstanceTypeError,
    normalize_gpu,
    parse_instance_type,
)
from service.core.errors import FieldError


@dataclass(frozen=True)
class ResolvedTarget:
    """Where a deployment specification may run: its group, canonical GPU name, instance
    type (the default one when the spec had none) and the clusters placement may use."""

    group: ClusterGroup
    gpu: str
    instance_type: InstanceType
    clusters: tuple[Cluster, ...]


_LISTS = (
    ("clusters", "clusters"),
    ("regions", "regions"),
    ("availabilityZones", "availability_zones"),
    ("attributes", "attributes"),
)


@dataclass(frozen=True)
class TargetRequest:
    """Where one deployment specification asks to run, as typed values (API names in
    comments): `gpu` as given (`resolve` canonicalises it), `instance_type` parsed, `backend`
    a group name, and the `clusters`, `regions`, `availability_zones` (availabilityZones) and
    `attributes` filters, empty when not given.

    `unreadable` holds (API field, problem) for fields given in a form that could not be read;
    `from_spec` fills it, and `resolve` reports each where it checks that field, so every
    problem of a specification comes out in one pass and in one order.
    """

    gpu: str | None = None
    instance_type: InstanceType | None = None
    backend: str | None = None
    clusters: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()
    attributes: tuple[str, ...] = ()
    availability_zones: tuple[str, ...] = ()
    unreadable: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> TargetRequest:
        """The placement fields of a deployment specification from the request body."""
        unreadable: list[tuple[str, str]] = []
        instance_type: InstanceType | None = None
        it_raw = spec.get("instanceType")
        if it_raw is not None:
            try:
                instance_type = parse_instance_type(it_raw)
            except InstanceTypeError as exc:
                unreadable.append(("instanceType", str(exc)))
        lists: dict[str, tuple[str, ...]] = {}
        for key, attr in _LISTS:
            value = spec.get(key)
            if value is not None and (
                not isinstance(value, list) or not all(isinstance(v, str) and v for v in value)
            ):
                unreadable.append((key, "must be a list of non-empty strings"))
                value = None
            lists[attr] = tuple(value or ())
        backend = spec.get("backend")
        if backend is not None and not isinstance(backend, str):
            unreadable.append(("backend", f"unknown cluster group {backend!r}"))
            backend = None
        gpu = spec.get("gpu")
        return cls(
            gpu=gpu if isinstance(gpu, str) else None,
            instance_type=instance_type,
            backend=backend,
            unreadable=tuple(unreadable),
            **lists,
        )

    def problem(self, field: str) -> str | None:
        """Why the API field `field` could not be read, if it could not."""
        return next((message for key, message in self.unreadable if key == field), None)


def resolve_spec(
    catalog: Catalog,
    spec: Mapping[str, Any],
    *,
    is_helm: bool,
    path: str = "deploymentSpecifications[0]",
) -> ResolvedTarget | list[FieldError]:
    """`resolve` for a deployment specification as found in a request body."""
    return resolve(catalog, TargetRequest.from_spec(spec), is_helm=is_helm, path=path)


def resolve(
    catalog: Catalog,
    request: TargetRequest,
    *,
    is_helm: bool,
    path: str = "deploymentSpecifications[0]",
) -> ResolvedTarget | list[FieldError]:
    """Check one deployment specification against the catalog (no I/O).

    Returns the target, or every problem found as FieldErrors under `path` ("": the fields
    are at the top of the body).
    """
    errors: list[FieldError] = []

    def fail(field: str, message: str) -> None:
        errors.append(FieldError(_at(path, field), message))

    gpu_raw = request.gpu
    gpu: str | None = None
    if gpu_raw is None or not gpu_raw.strip():
        fail("gpu", "is required: the GPU model to run on, e.g. L40S")
    else:
        gpu = normalize_gpu(gpu_raw.strip())

    instance_type = request.instance_type
    unreadable_type = request.problem("instanceType")
    if unreadable_type is not None:
        fail("instanceType", unreadable_type)
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

    for key, _ in _LISTS:
        unreadable_list = request.problem(key)
        if unreadable_list is not None:
            fail(key, unreadable_list)
    wanted_clusters = request.clusters
    regions = request.regions
    zones = request.availability_zones
    attributes = request.attributes

    backend = request.backend
    unreadable_backend = request.problem("backend")
    candidates: list[ClusterGroup] = list(catalog.groups)
    if backend is not None or unreadable_backend is not None:
        group = catalog.group(backend) if backend is not None else None
        if wanted_clusters:
            fail(
                "backend",
                "'backend' and 'clusters' cannot be used together: the clusters already "
                "determine their group; remove one of them",
            )
        if group is None:
            fail(
                "backend",
                (unreadable_backend or f"unknown cluster group {backend!r}")
                + "; available: "
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

    if gpu is None or any(not e.field.startswith(_at(path, "instanceType")) for e in errors):
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


def _at(path: str, field: str) -> str:
    """A field under `path` ("" for a body's top level, as the dry-run has them)."""
    return f"{path}.{field}" if path else field


def _groups_phrase(groups: list[ClusterGroup], backend: str | None, catalog: Catalog) -> str:
    if backend is None and len(groups) == len(catalog.groups):
        return "any cluster group"
    names = ", ".join(repr(g.name) for g in groups)
    return f"cluster group {names}" if len(groups) == 1 else f"cluster groups {names}"


def _narrow(
    path: str,
    offering: Offering,
    group: ClusterGroup,
    wanted: tuple[str, ...],
    regions: tuple[str, ...],
    zones: tuple[str, ...],
    attributes: tuple[str, ...],
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
                _at(path, "clusters"),
                f"none of the clusters {', '.join(wanted)} offers {name}; it is offered by: "
                + ", ".join(c.name for c in clusters),
            )
        clusters = keep
    if regions:
        keep = [c for c in clusters if c.region.lower() in {r.lower() for r in regions}]
        if not keep:
            return FieldError(
                _at(path, "regions"),
                f"no cluster offering {where} is in region {' or '.join(regions)}; "
                f"candidate clusters: {listing(lambda c: c.region)}",
            )
        clusters = keep
    if zones:
        wanted_zones = {z.lower() for z in zones}
        keep = [c for c in clusters if wanted_zones & {z.lower() for z in c.availability_zones}]
        if not keep:
            return FieldError(
                _at(path, "availabilityZones"),
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
                _at(path, "attributes"),
                f"no cluster offering {where} has all the attributes {', '.join(attributes)}; "
                "candidate clusters: "
                + listing(lambda c: ", ".join(c.attributes) or "no attributes"),
            )
        clusters = keep
    return tuple(clusters)
