"""Deployment request bodies (api.md §3.1–3.2), checked in one pass reporting EVERY violation.

The fields of a body are declared once by the request models in schemas.py (scaling numbers,
configuration, helmValidationPolicy) and checked by pydantic; the rules between fields and
against state run afterwards and add to the same list: maxInstances ≥ minInstances, the
helm-only fields, and the catalog (`resolve` on the specification's typed `TargetRequest`:
GPU, instance type syntax and offering, backend, clusters, regions, attributes, availability
zones — those fields are documented by the model but checked by the catalog).
`helmValidationPolicy` is parsed once, into both its stored form and the chart pipeline's
`ValidationPolicy`. Chart re-rendering for helm functions happens later (it needs I/O) in the
router. `validate_update` (PUT) accepts only the scaling fields and names any other field that would
change; `validate_patch` (PATCH) also accepts a new `configuration`/`helmValidationPolicy` (a
new revision, rendered by the router as at deploy).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from service.charts.policy import ValidationPolicy
from service.charts.schemas import HelmValidationPolicyIn
from service.charts.target import (
    not_permitted_message,
    permitted_clusters,
    stored_policy,
)
from service.clusters.catalog import Catalog, Cluster, ResolvedTarget, TargetRequest, resolve
from service.clusters.instance_types import InstanceType, InstanceTypeError, parse_instance_type
from service.core.errors import FieldError, ValidationFailed
from service.core.validation import failed, parse
from service.deployments.autoscale.policy import CUSTOM, PLATFORM
from service.deployments.autoscale.schemas import AutoscalingConfigurationIn
from service.deployments.schemas import (
    SPECS,
    DeploymentCreate,
    DeploymentUpdate,
    GpuSpecificationIn,
    GpuSpecificationPatch,
)

SCALING_FIELDS = ("minInstances", "maxInstances", "maxRequestConcurrency")
AUTOSCALING_FIELDS = ("autoscalingConfiguration", "autoscalingConfigurationPolicy")
#: PATCH fields that make a new revision (helm functions)
REVISION_FIELDS = ("configuration", "helmValidationPolicy")
#: Fields of a stored specification that PUT may repeat but never change.
FIXED_FIELDS = (
    "gpu",
    "instanceType",
    "backend",
    "clusters",
    "regions",
    "attributes",
    "availabilityZones",
    "preferredOrder",
    "configuration",
    "helmValidationPolicy",
)
HELM_ONLY = {
    "configuration": "is only for helm functions (Helm values overrides); this is a container "
    "function — remove it",
    "helmValidationPolicy": "is only for helm functions; this is a container function — remove it",
}


@dataclass
class ValidatedSpec:
    """One deployment specification, checked, normalised and resolved against the catalog."""

    index: int
    target: ResolvedTarget
    min_instances: int
    max_instances: int
    max_request_concurrency: int
    preferred_order: int
    clusters: list[str] | None
    regions: list[str] | None
    attributes: list[str] | None
    availability_zones: list[str] | None
    configuration: dict[str, Any] | None
    #: as stored (None when not given)
    helm_validation_policy: dict[str, Any] | None
    #: the same policy, parsed once for the chart pipeline
    policy: ValidationPolicy = field(default_factory=ValidationPolicy)

    @property
    def path(self) -> str:
        return f"{SPECS}[{self.index}]"


@dataclass(frozen=True)
class ScalingChange:
    """New scaling values for one stored specification (None = unchanged)."""

    spec_id: uuid.UUID
    min_instances: int | None = None
    max_instances: int | None = None
    max_request_concurrency: int | None = None
    #: the new (autoscalingConfigurationPolicy, stored autoscalingConfiguration), or None
    autoscaling: tuple[str, dict[str, Any] | None] | None = None


def _within(where: str, errors: list[FieldError]) -> bool:
    return any(e.field == where or e.field.startswith((f"{where}.", f"{where}[")) for e in errors)


def _min_max(path: str, min_instances: Any, max_instances: Any) -> list[FieldError]:
    if (
        isinstance(min_instances, int)
        and isinstance(max_instances, int)
        and max_instances < min_instances
    ):
        return [
            FieldError(
                f"{path}.maxInstances",
                f"must be ≥ minInstances ({min_instances}), got {max_instances}",
            )
        ]
    return []


def capacity_errors(
    path: str,
    instance_type: InstanceType,
    clusters: Sequence[Cluster],
    min_instances: Any,
    max_instances: Any,
) -> list[FieldError]:
    """minInstances/maxInstances beyond what the candidate clusters could ever hold (every
    node free) can never be met: refused, naming the room there is."""
    room = sum(c.capacity(instance_type) for c in clusters)
    names = ", ".join(c.name for c in clusters) or "none"
    prefix = f"{path}." if path else ""
    return [
        FieldError(
            f"{prefix}{field}",
            f"must be at most {room}: the candidate clusters ({names}) hold at most {room} "
            f"instances of {instance_type.name}, got {value}",
        )
        for field, value in (("minInstances", min_instances), ("maxInstances", max_instances))
        if isinstance(value, int) and not isinstance(value, bool) and value > room
    ]


def stored_capacity_errors(
    catalog: Catalog, spec: StoredSpec, change: ScalingChange, path: str = ""
) -> list[FieldError]:
    """`capacity_errors` for new scaling values of a stored specification."""
    try:
        instance_type = parse_instance_type(str(spec.fixed.get("instanceType")))
    except InstanceTypeError:
        return []
    clusters = [c for n in spec.candidate_clusters if (c := catalog.cluster(n)) is not None]
    return capacity_errors(
        path, instance_type, clusters, change.min_instances, change.max_instances
    )


def stored_policy_errors(
    catalog: Catalog, spec: StoredSpec, change: ScalingChange, path: str = ""
) -> list[FieldError]:
    """Raising the instances of a specification whose helmValidationPolicy no candidate
    cluster permits any more (the catalog changed since the deploy) is refused, naming the
    clusters: no new instance could be placed. Lowering them is always allowed."""
    grows = any(
        new is not None and new > old
        for new, old in (
            (change.min_instances, spec.min_instances),
            (change.max_instances, spec.max_instances),
        )
    )
    clusters = [c for n in spec.candidate_clusters if (c := catalog.cluster(n)) is not None]
    policy = stored_policy(spec.fixed.get("helmValidationPolicy"))
    if not grows or not clusters or permitted_clusters(catalog, clusters, policy):
        return []
    prefix = f"{path}." if path else ""
    return [
        FieldError(
            f"{prefix}helmValidationPolicy", not_permitted_message(catalog, clusters, policy)
        )
    ]


def _scaling_ok(path: str, bad: set[str]) -> bool:
    return not any(f"{path}.{key}" in bad for key in SCALING_FIELDS)


def _helm_only(
    spec: Mapping[str, Any], path: str, errors: list[FieldError], is_helm: bool
) -> list[FieldError]:
    """On a container function the helm-only fields are wrong whatever they hold: their own
    field violations are replaced by the one that says to remove them."""
    if is_helm:
        return errors
    for key, message in HELM_ONLY.items():
        if spec.get(key) is not None:
            where = f"{path}.{key}"
            errors = [e for e in errors if not _within(where, [e])]
            errors.append(FieldError(where, message))
    return errors


def validate_create(
    body: Any, *, catalog: Catalog, is_helm: bool, is_grpc: bool = False
) -> list[ValidatedSpec]:
    """Every specification of a POST body, resolved; raises ValidationFailed listing all
    violations of all specifications (`is_grpc`: a gRPC function, which no cluster reached
    through the API server's service proxy can serve)."""
    if not isinstance(body, Mapping):
        raise ValidationFailed.of([FieldError("body", f"must be a JSON object with '{SPECS}'")])
    model, errors = parse(DeploymentCreate, body)
    if any(e.field == SPECS for e in errors):
        raise ValidationFailed.of(errors)
    bad = failed(errors)
    targets: list[ResolvedTarget] = []
    for i, spec in enumerate(body[SPECS]):
        path = f"{SPECS}[{i}]"
        if not isinstance(spec, Mapping):
            continue
        if _scaling_ok(path, bad):
            errors += _min_max(path, spec.get("minInstances"), spec.get("maxInstances"))
        errors = _helm_only(spec, path, errors, is_helm)
        request = TargetRequest.from_spec(spec)
        resolved = resolve(catalog, request, is_helm=is_helm, path=path)
        if isinstance(resolved, list):
            errors.extend(resolved)
        else:
            if is_helm:
                resolved, refused = permitted_target(catalog, resolved, spec, path)
                errors.extend(refused)
            targets.append(resolved)
            if is_grpc:
                errors += _grpc_reachable(path, resolved.clusters)
            if _scaling_ok(path, bad):
                errors += capacity_errors(
                    path,
                    resolved.instance_type,
                    resolved.clusters,
                    spec.get("minInstances"),
                    spec.get("maxInstances"),
                )
    if errors:
        raise ValidationFailed.of(errors, what="deployment")
    assert model is not None
    return [
        _validated(i, spec, target)
        for i, (spec, target) in enumerate(
            zip(model.deployment_specifications, targets, strict=True)
        )
    ]


def _grpc_reachable(path: str, clusters: Sequence[Cluster]) -> list[FieldError]:
    proxied = [c.name for c in clusters if not c.carries_grpc]
    if not proxied:
        return []
    return [
        FieldError(
            path,
            "a gRPC function (inferenceUrl /gRPC) cannot run on "
            + ", ".join(proxied)
            + ": its workers are reached through the Kubernetes API server's service proxy "
            "(workerAccess apiServerProxy), which cannot carry gRPC; choose clusters whose "
            "workers are reached by cluster DNS (workerAccess serviceDns)",
        )
    ]


def _policy_in(spec: Mapping[str, Any]) -> ValidationPolicy:
    """The specification's helmValidationPolicy, Default when absent or malformed (a
    malformed one is reported by the field rules)."""
    raw = spec.get("helmValidationPolicy")
    if raw is None:
        return ValidationPolicy()
    try:
        return HelmValidationPolicyIn.model_validate(raw).policy()
    except ValidationError:
        return ValidationPolicy()


def permitted_target(
    catalog: Catalog, target: ResolvedTarget, spec: Mapping[str, Any], path: str
) -> tuple[ResolvedTarget, list[FieldError]]:
    """The target narrowed to the clusters that permit the specification's
    helmValidationPolicy (placement uses only those), or an error naming every candidate
    and what it permits when none does."""
    policy = _policy_in(spec)
    allowed = permitted_clusters(catalog, target.clusters, policy)
    if not allowed:
        message = not_permitted_message(catalog, target.clusters, policy)
        return target, [FieldError(f"{path}.helmValidationPolicy", message)]
    return dataclasses.replace(target, clusters=tuple(allowed)), []


def _validated(index: int, spec: GpuSpecificationIn, target: ResolvedTarget) -> ValidatedSpec:
    policy = spec.helm_validation_policy
    return ValidatedSpec(
        index=index,
        target=target,
        min_instances=spec.min_instances,
        max_instances=spec.max_instances,
        max_request_concurrency=spec.max_request_concurrency,
        preferred_order=spec.preferred_order,
        clusters=spec.clusters,
        regions=spec.regions,
        attributes=spec.attributes,
        availability_zones=spec.availability_zones,
        configuration=spec.configuration,
        helm_validation_policy=policy.stored() if policy else None,
        policy=policy.policy() if policy else ValidationPolicy(),
    )


@dataclass(frozen=True)
class StoredSpec:
    """What PUT compares a body specification against (the stored row, API names)."""

    id: uuid.UUID
    min_instances: int
    max_instances: int
    max_request_concurrency: int
    fixed: Mapping[str, Any]
    candidate_clusters: tuple[str, ...] = ()
    autoscaling_policy: str | None = None
    autoscaling_configuration: Mapping[str, Any] | None = None


def _autoscaling(
    path: str,
    policy: str | None,
    configuration: AutoscalingConfigurationIn | None,
    stored: StoredSpec,
    errors: list[FieldError],
) -> tuple[str, dict[str, Any] | None] | None:
    """The (policy, configuration) a body asks for, or None when it names neither; a
    contradiction goes to `errors`."""
    prefix = f"{path}." if path else ""
    if configuration is not None:
        if policy == PLATFORM:
            errors.append(
                FieldError(
                    f"{prefix}autoscalingConfiguration",
                    f"cannot be given with autoscalingConfigurationPolicy {PLATFORM}, which "
                    f"discards the custom configuration; send {CUSTOM} or leave the policy out",
                )
            )
            return None
        return CUSTOM, configuration.stored()
    if policy == CUSTOM:
        if stored.autoscaling_configuration is None:
            errors.append(
                FieldError(
                    f"{prefix}autoscalingConfiguration",
                    f"is required with autoscalingConfigurationPolicy {CUSTOM}: this GPU "
                    "specification has no custom configuration stored",
                )
            )
            return None
        return CUSTOM, dict(stored.autoscaling_configuration)
    if policy == PLATFORM:
        return PLATFORM, None
    return None


def _same(key: str, stored: Any, given: Any) -> bool:
    """Whether a PUT repeats a stored field; names (GPU, instance type, group) in any case."""
    if key in ("gpu", "backend"):
        return isinstance(given, str) and str(stored).lower() == given.lower()
    if key == "instanceType":
        try:
            return parse_instance_type(given).name.lower() == str(stored).lower()
        except (InstanceTypeError, TypeError):
            return False
    if key in ("clusters", "regions", "attributes", "availabilityZones"):
        return bool((stored or []) == given)
    if key == "helmValidationPolicy":
        try:
            return bool(HelmValidationPolicyIn.model_validate(given).stored() == stored)
        except ValidationError:
            return False
    return bool(stored == given)


def validate_update(body: Any, stored: Sequence[StoredSpec]) -> list[ScalingChange]:
    """A PUT body: each specification matched by `gpuSpecificationId` (or by position when
    there is one); only the scaling fields may differ. Raises ValidationFailed with all
    violations."""
    if not isinstance(body, Mapping):
        raise ValidationFailed.of([FieldError("body", f"must be a JSON object with '{SPECS}'")])
    _, errors = parse(DeploymentUpdate, body)
    if any(e.field == SPECS for e in errors):
        raise ValidationFailed.of(errors)
    bad = failed(errors)
    specs = body[SPECS]
    by_id = {s.id: s for s in stored}
    changes: list[ScalingChange] = []
    seen: set[uuid.UUID] = set()
    for i, spec in enumerate(specs):
        path = f"{SPECS}[{i}]"
        if not isinstance(spec, Mapping):
            continue
        target: StoredSpec | None = None
        raw_id = spec.get("gpuSpecificationId")
        if raw_id is not None:
            try:
                target = by_id.get(uuid.UUID(str(raw_id)))
            except ValueError:
                errors.append(FieldError(f"{path}.gpuSpecificationId", f"{raw_id!r} is not a UUID"))
                continue
            if target is None:
                errors.append(
                    FieldError(
                        f"{path}.gpuSpecificationId",
                        f"no GPU specification {raw_id} in this deployment; specifications "
                        "cannot be added — delete the deployment and deploy again",
                    )
                )
                continue
        elif len(stored) == 1 and len(specs) == 1:
            target = stored[0]
        else:
            errors.append(
                FieldError(
                    f"{path}.gpuSpecificationId",
                    "is required to match specifications when the deployment or the body has "
                    "more than one",
                )
            )
            continue
        if target.id in seen:
            errors.append(
                FieldError(f"{path}.gpuSpecificationId", "names the same specification twice")
            )
            continue
        seen.add(target.id)
        for key in FIXED_FIELDS:
            if (
                key in spec
                and spec[key] is not None
                and not _same(key, target.fixed.get(key), spec[key])
            ):
                how = (
                    "PATCH /v2/nvcf/deployments/{deploymentId}/gpu-specifications/"
                    f"{target.id} changes it as a new revision, rolled out without downtime"
                    if key in REVISION_FIELDS
                    else "delete the deployment and deploy again to change it"
                )
                errors.append(
                    FieldError(
                        f"{path}.{key}",
                        f"cannot be changed by PUT (is {target.fixed.get(key)!r}, got "
                        f"{spec[key]!r}); PUT changes only {', '.join(SCALING_FIELDS)} — {how}",
                    )
                )
        if not _scaling_ok(path, bad) or any(
            _within(f"{path}.{key}", errors) for key in AUTOSCALING_FIELDS
        ):
            continue
        min_i, max_i, concurrency = (spec.get(k) for k in SCALING_FIELDS)
        errors += _min_max(
            path,
            target.min_instances if min_i is None else min_i,
            target.max_instances if max_i is None else max_i,
        )
        config = spec.get("autoscalingConfiguration")
        autoscaling = _autoscaling(
            path,
            spec.get("autoscalingConfigurationPolicy"),
            AutoscalingConfigurationIn.model_validate(config) if config is not None else None,
            target,
            errors,
        )
        changes.append(ScalingChange(target.id, min_i, max_i, concurrency, autoscaling))
    if errors:
        raise ValidationFailed.of(errors, what="deployment update")
    return changes


@dataclass(frozen=True)
class RevisionChange:
    """A PATCH's new configuration and/or policy (None: keep the current one)."""

    configuration: dict[str, Any] | None
    configuration_given: bool
    #: as stored (None when not given) and parsed for the chart pipeline
    helm_validation_policy: dict[str, Any] | None
    policy: ValidationPolicy | None


def validate_patch(body: Any, stored: StoredSpec, *, is_helm: bool = True) -> ScalingChange:
    """A PATCH body: `{minInstances?, maxInstances?, autoscalingConfiguration?,
    autoscalingConfigurationPolicy?, configuration?, helmValidationPolicy?}` (at least one);
    the new revision's fields only for helm functions (`revision_change` reads them from a
    body this accepted)."""
    if not isinstance(body, Mapping):
        raise ValidationFailed.of([FieldError("body", "must be a JSON object")])
    model, errors = parse(GpuSpecificationPatch, body)
    revision_given = [k for k in REVISION_FIELDS if body.get(k) is not None]
    if (
        all(body.get(key) is None for key in ("minInstances", "maxInstances", *AUTOSCALING_FIELDS))
        and not revision_given
    ):
        raise ValidationFailed.of(
            [
                FieldError(
                    "body",
                    "give at least one of minInstances, maxInstances, "
                    + ", ".join((*AUTOSCALING_FIELDS, *REVISION_FIELDS)),
                )
            ]
        )
    if not is_helm:
        errors += [FieldError(k, HELM_ONLY[k]) for k in revision_given]
    autoscaling = None
    if model is not None:
        new_min = stored.min_instances if model.min_instances is None else model.min_instances
        new_max = stored.max_instances if model.max_instances is None else model.max_instances
        if new_max < new_min:
            where = "maxInstances" if model.max_instances is not None else "minInstances"
            errors.append(
                FieldError(where, f"maxInstances ({new_max}) must be ≥ minInstances ({new_min})")
            )
        autoscaling = _autoscaling(
            "",
            model.autoscaling_configuration_policy,
            model.autoscaling_configuration,
            stored,
            errors,
        )
    if errors or model is None:
        raise ValidationFailed.of(errors, what="GPU specification update")
    return ScalingChange(stored.id, model.min_instances, model.max_instances, None, autoscaling)


def revision_change(body: Any) -> RevisionChange | None:
    """The new configuration/policy of a PATCH body `validate_patch` accepted; None when it
    asks for no new revision."""
    if not isinstance(body, Mapping) or all(body.get(k) is None for k in REVISION_FIELDS):
        return None
    model, errors = parse(GpuSpecificationPatch, body)
    if model is None or errors:
        raise ValidationFailed.of(errors, what="GPU specification update")
    policy = model.helm_validation_policy
    return RevisionChange(
        configuration=model.configuration,
        configuration_given=model.configuration is not None,
        helm_validation_policy=policy.stored() if policy else None,
        policy=policy.policy() if policy else None,
    )
