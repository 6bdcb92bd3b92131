"""The dry-run of the chart pipeline (`POST /helm/validate`, charts/router.py; helm.md §6):
the request checked, its target resolved as a deploy resolves it, and the chart checked for
every candidate cluster.

Bad requests (URL grammar, missing fields, policy shape, target fields the catalog refuses, a
policy no target cluster permits) are 400 listing every violation: the fields are declared and
checked by the request model (schemas.py), the catalog rules run after and add to the same
list. Registry failures are 400/502 as at creation; a chart that breaks rules is a 200 with
`valid: false`.

The target fields are a deployment specification's and are resolved as a deploy resolves them
(`clusters.catalog.resolve`; `gpu` may be left to `instanceType`), then narrowed to the
clusters that permit the `helmValidationPolicy`; the chart is checked for every candidate as
a deploy checks it (`ChartPipeline.validate_for_clusters`: multi-node, NVLink, schema and
capabilities of each target). Naming only `clusters`/`cluster` or `backend` targets those
clusters without an instance type. Without a target the response lists the checks it could not
apply (`checksNotApplied`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.charts.pipeline import PLACEHOLDER_INSTANCE_ID, ChartPipeline
from service.charts.policy import ValidationPolicy
from service.charts.schemas import HelmValidateRequest, HelmValidationPolicyIn
from service.charts.target import not_permitted_message, permitted_clusters
from service.clusters.catalog import Catalog, Cluster, TargetRequest, resolve
from service.clusters.instance_types import InstanceType
from service.core.errors import FieldError, ValidationFailed
from service.core.kube import instance_namespace
from service.core.validation import failed, parse

#: The deployment-specification fields that name a target (and the older `cluster`).
TARGET_FIELDS = (
    "gpu",
    "instanceType",
    "backend",
    "clusters",
    "regions",
    "attributes",
    "availabilityZones",
    "cluster",
)


@dataclass
class DryRun:
    """A validated dry-run request."""

    helm_chart: str
    service_name: str
    inference_port: int
    configuration: dict[str, Any] | None
    policy: ValidationPolicy
    instance_type: InstanceType | None
    #: candidate clusters permitting the policy; empty without a target
    clusters: list[Cluster]
    not_applied: list[dict[str, str]] = field(default_factory=list)


@dataclass
class _Target:
    clusters: list[Cluster] = field(default_factory=list)
    instance_type: InstanceType | None = None
    errors: list[FieldError] = field(default_factory=list)


def _legacy_field(error: FieldError) -> FieldError:
    """`cluster` given as the one-element `clusters`: its errors are about `cluster`."""
    if error.field == "clusters" or error.field.startswith("clusters["):
        return FieldError("cluster", error.message)
    return error


def _clusters_only(catalog: Catalog, request: TargetRequest) -> _Target:
    """A target of named clusters or a cluster group, without a GPU or instance type."""
    out = _Target()
    for key in ("clusters", "backend", "regions", "attributes", "availabilityZones"):
        problem = request.problem(key)
        if problem is not None:
            out.errors.append(FieldError(key, problem))
    for key, value in (
        ("regions", request.regions),
        ("attributes", request.attributes),
        ("availabilityZones", request.availability_zones),
    ):
        if value:
            out.errors.append(
                FieldError(key, "narrows the clusters offering a GPU: give gpu or instanceType")
            )
    if request.backend is not None and request.clusters:
        out.errors.append(
            FieldError(
                "backend",
                "'backend' and 'clusters' cannot be used together: the clusters already "
                "determine their group; remove one of them",
            )
        )
    elif request.backend is not None:
        group = catalog.group(request.backend)
        if group is None:
            known = ", ".join(g.name for g in catalog.groups)
            out.errors.append(
                FieldError(
                    "backend", f"unknown cluster group {request.backend!r}; available: {known}"
                )
            )
        else:
            out.clusters = list(group.clusters)
    for i, name in enumerate(request.clusters):
        cluster = catalog.cluster(name)
        if cluster is None:
            known = ", ".join(c.name for c in catalog.clusters)
            out.errors.append(
                FieldError(f"clusters[{i}]", f"unknown cluster {name!r}; available: {known}")
            )
        elif cluster not in out.clusters:
            out.clusters.append(cluster)
    return out


def _target(catalog: Catalog, body: Mapping[str, Any], bad: set[str]) -> _Target:
    """The candidate clusters (and instance type) the body's target fields name, resolved as
    a deployment specification's; `bad` are the fields that already broke a field rule."""
    if all(body.get(key) is None for key in TARGET_FIELDS):
        return _Target()
    spec = {key: body.get(key) for key in TARGET_FIELDS if key != "cluster"}
    legacy = body.get("cluster") is not None
    if legacy:
        if body.get("clusters") is not None:
            return _Target(
                errors=[FieldError("cluster", "give 'clusters' or the older 'cluster', not both")]
            )
        if "cluster" in bad:
            return _Target()
        spec["clusters"] = [body["cluster"]]
    request = TargetRequest.from_spec(spec)
    if request.gpu is None and spec.get("gpu") is None and request.instance_type is not None:
        spec["gpu"] = request.instance_type.gpu  # the dry-run may leave the GPU to the type
        request = TargetRequest.from_spec(spec)
    if spec.get("gpu") is None and spec.get("instanceType") is None:
        found = _clusters_only(catalog, request)
    else:
        resolved = resolve(catalog, request, is_helm=True, path="")
        if isinstance(resolved, list):
            if spec.get("gpu") is None:  # an unreadable instanceType said it already
                resolved = [e for e in resolved if e.field != "gpu"]
            found = _Target(errors=resolved)
        else:
            found = _Target(list(resolved.clusters), resolved.instance_type)
    if legacy:
        found.errors = [_legacy_field(e) for e in found.errors]
    return found


def _policy(body: Mapping[str, Any]) -> ValidationPolicy:
    raw = body.get("helmValidationPolicy")
    if raw is None:
        return ValidationPolicy()
    try:
        return HelmValidationPolicyIn.model_validate(raw).policy()
    except ValueError:  # pydantic's ValidationError; reported by the field rules
        return ValidationPolicy()


def _not_applied(dry: DryRun, default_kube_version: str) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    if not dry.clusters:
        out += [
            {
                "check": "capabilities",
                "reason": "no target cluster: rendered with Kubernetes "
                f"{default_kube_version} (NVCF_DEFAULT_KUBE_VERSION) and its standard API "
                "versions, not a cluster's",
            },
            {
                "check": "schema",
                "reason": "no target cluster: objects were validated against the Kubernetes "
                f"{default_kube_version} schema, not a cluster's version",
            },
            {
                "check": "cluster-policy",
                "reason": "no target cluster: helmValidationPolicy was checked against every "
                "catalog cluster (at least one permits it), not the clusters a deploy targets",
            },
            {
                "check": "nvlink",
                "reason": "no target cluster: whether it is NVLinkOptimized is unknown, so no "
                "NVLink mutations, multi-node severity or NVLink-annotation warnings",
            },
            {
                "check": "install-preview",
                "reason": "no target cluster: objects are shown before install-time mutations",
            },
        ]
    if dry.instance_type is None:
        out.append(
            {
                "check": "multi-node-full-node",
                "reason": "no instanceType (nor gpu): the multi-node full-node checks need it",
            }
        )
    return out


async def parse_dry_run(body: Any, catalog: Catalog, default_kube_version: str) -> DryRun:
    """Check every field (the request model), then the target and policy against the catalog;
    raise one 400 listing all violations."""
    if not isinstance(body, dict):
        raise ValidationFailed.of([FieldError("body", "must be a JSON object")])
    model, errors = parse(HelmValidateRequest, body)
    target = _target(catalog, body, failed(errors))
    errors += target.errors
    policy = _policy(body)
    policy_ok = not any(f.startswith("helmValidationPolicy") for f in failed(errors))
    if not target.errors and policy_ok:
        candidates: Sequence[Cluster] = target.clusters or catalog.clusters
        permitted = permitted_clusters(catalog, candidates, policy)
        if not permitted:
            message = not_permitted_message(catalog, candidates, policy)
            errors.append(FieldError("helmValidationPolicy", message))
        elif target.clusters:
            target.clusters = permitted
    if errors or model is None:
        raise ValidationFailed.of(errors)
    dry = DryRun(
        helm_chart=model.helm_chart,
        service_name=model.helm_chart_service_name,
        inference_port=model.inference_port,
        configuration=model.configuration,
        policy=policy,
        instance_type=target.instance_type,
        clusters=target.clusters,
    )
    dry.not_applied = _not_applied(dry, default_kube_version)
    return dry


async def dry_run(
    session: AsyncSession,
    account_id: str,
    dry: DryRun,
    pipeline: ChartPipeline,
    catalog: Catalog,
) -> dict[str, Any]:
    """The chart checked for each candidate cluster (`ChartPipeline.validate_for_clusters`),
    its objects as the first would install them, and the checks not applied; nothing stored."""
    namespace = instance_namespace(PLACEHOLDER_INSTANCE_ID) if dry.clusters else None
    result = await pipeline.validate_for_clusters(
        session,
        account_id,
        clusters=dry.clusters,
        helm_chart=dry.helm_chart,
        service_name=dry.service_name,
        inference_port=dry.inference_port,
        configuration=dry.configuration,
        policy=dry.policy,
        instance_type=dry.instance_type,
        namespace=namespace,
    )
    if dry.clusters and result.valid:
        first = dry.clusters[0]
        result.objects = pipeline.install_preview(
            result.objects,
            cluster=first,
            backend=catalog.group_of(first).name,
            instance_type=dry.instance_type,
            account_id=account_id,
        )
    out = result.as_dict()
    default = pipeline.default_kube_version
    if dry.clusters:
        out["targetClusters"] = [c.name for c in dry.clusters]
        versions = (c.k8s_version or default for c in dry.clusters)
        out["kubeVersions"] = list(dict.fromkeys(versions))
    else:
        out["kubeVersions"] = [default]
    out["checksNotApplied"] = dry.not_applied
    return out
