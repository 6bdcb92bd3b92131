"""Deployment request bodies (api.md §3.1–3.2), checked in one pass reporting EVERY violation.

`validate_create` checks every field of every specification and resolves each one against the
cluster catalog (`resolve` on the specification's typed `TargetRequest`: GPU, instance type
syntax and offering, backend, clusters, regions, attributes, availability zones). Chart
re-rendering for helm functions happens later (it needs I/O) in the router. `validate_update`
(PUT) and `validate_patch` (PATCH) accept only the scaling fields and name any other field that
would change.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from service.clusters.catalog import Catalog, ResolvedTarget, TargetRequest, resolve
from service.clusters.instance_types import InstanceTypeError, parse_instance_type
from service.core.errors import FieldError, ValidationFailed

SPECS = "deploymentSpecifications"
MAX_REQUEST_CONCURRENCY = 16384
MAX_PREFERRED_ORDER = 99
POLICY_NAMES = ("Default", "Unrestricted")
SCALING_FIELDS = ("minInstances", "maxInstances", "maxRequestConcurrency")
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
    helm_validation_policy: dict[str, Any] | None

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


class _Errors:
    def __init__(self) -> None:
        self.items: list[FieldError] = []

    def add(self, field: str, message: str) -> None:
        self.items.append(FieldError(field, message))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_field(
    spec: Mapping[str, Any],
    key: str,
    path: str,
    errors: _Errors,
    *,
    low: int,
    high: int | None = None,
    required: bool = False,
    default: int | None = None,
) -> int | None:
    value = spec.get(key)
    rule = f"an integer ≥ {low}" if high is None else f"an integer from {low} to {high}"
    if value is None:
        if required:
            errors.add(f"{path}.{key}", f"is required: {rule}")
        return default
    if not _is_int(value):
        errors.add(f"{path}.{key}", f"must be {rule}, got {value!r}")
        return None
    if value < low or (high is not None and value > high):
        errors.add(f"{path}.{key}", f"must be {rule}, got {value}")
        return None
    return int(value)


def _check_min_max(
    path: str, errors: _Errors, min_instances: int | None, max_instances: int | None
) -> None:
    if min_instances is not None and max_instances is not None and max_instances < min_instances:
        errors.add(
            f"{path}.maxInstances",
            f"must be ≥ minInstances ({min_instances}), got {max_instances}",
        )


def normalize_policy(raw: Any, path: str, errors: _Errors) -> dict[str, Any] | None:
    """`helmValidationPolicy` with its name written as documented; problems go to `errors`."""
    where = f"{path}.helmValidationPolicy"
    if not isinstance(raw, Mapping):
        errors.add(where, "must be an object {name: Default|Unrestricted, extraKubernetesTypes}")
        return None
    out: dict[str, Any] = {}
    name = raw.get("name", "Default")
    canonical = next(
        (n for n in POLICY_NAMES if isinstance(name, str) and n.lower() == name.lower()), None
    )
    if canonical is None:
        errors.add(f"{where}.name", f"must be one of {', '.join(POLICY_NAMES)}, got {name!r}")
    else:
        out["name"] = canonical
    extra = raw.get("extraKubernetesTypes")
    types: list[dict[str, str]] = []
    if extra is not None:
        if not isinstance(extra, list):
            errors.add(f"{where}.extraKubernetesTypes", "must be a list of {group, version, kind}")
        else:
            for i, item in enumerate(extra):
                at = f"{where}.extraKubernetesTypes[{i}]"
                if not isinstance(item, Mapping):
                    errors.add(at, "must be an object {group, version, kind}")
                    continue
                ok = True
                group = item.get("group", "")
                if group is None:
                    group = ""
                if not isinstance(group, str):
                    errors.add(f"{at}.group", "must be a string (empty for the core group)")
                    ok = False
                for key in ("version", "kind"):
                    value = item.get(key)
                    if not isinstance(value, str) or not value:
                        errors.add(f"{at}.{key}", "is required: a non-empty string")
                        ok = False
                if ok:
                    types.append({"group": group, "version": item["version"], "kind": item["kind"]})
    out["extraKubernetesTypes"] = types
    return out


def _configuration(
    spec: Mapping[str, Any], path: str, errors: _Errors, *, is_helm: bool
) -> dict[str, Any] | None:
    value = spec.get("configuration")
    if value is None:
        return None
    if not is_helm:
        errors.add(
            f"{path}.configuration",
            "is only for helm functions (Helm values overrides); this is a container "
            "function — remove it",
        )
        return None
    if not isinstance(value, dict):
        errors.add(f"{path}.configuration", "must be a JSON object of Helm values overrides")
        return None
    return value


def _policy(
    spec: Mapping[str, Any], path: str, errors: _Errors, *, is_helm: bool
) -> dict[str, Any] | None:
    value = spec.get("helmValidationPolicy")
    if value is None:
        return None
    if not is_helm:
        errors.add(
            f"{path}.helmValidationPolicy",
            "is only for helm functions; this is a container function — remove it",
        )
        return None
    return normalize_policy(value, path, errors)


def _string_list(value: Any) -> list[str] | None:
    if isinstance(value, list) and all(isinstance(v, str) and v for v in value):
        return list(value)
    return None


def _specs_list(body: Any, errors: _Errors) -> list[Any] | None:
    if not isinstance(body, Mapping):
        errors.add("body", f"must be a JSON object with '{SPECS}'")
        return None
    specs = body.get(SPECS)
    if specs is None:
        errors.add(SPECS, "is required: a non-empty list of deployment specifications")
        return None
    if not isinstance(specs, list) or not specs:
        errors.add(SPECS, "must be a non-empty list of deployment specifications")
        return None
    return specs


def validate_create(body: Any, *, catalog: Catalog, is_helm: bool) -> list[ValidatedSpec]:
    """Every specification of a POST body, resolved; raises ValidationFailed listing all
    violations of all specifications."""
    errors = _Errors()
    specs = _specs_list(body, errors)
    if specs is None:
        raise ValidationFailed.of(errors.items)
    out: list[ValidatedSpec] = []
    for i, spec in enumerate(specs):
        path = f"{SPECS}[{i}]"
        if not isinstance(spec, Mapping):
            errors.add(path, "must be an object")
            continue
        before = len(errors.items)
        min_i = _int_field(spec, "minInstances", path, errors, low=0, required=True)
        max_i = _int_field(spec, "maxInstances", path, errors, low=1, required=True)
        _check_min_max(path, errors, min_i, max_i)
        concurrency = _int_field(
            spec,
            "maxRequestConcurrency",
            path,
            errors,
            low=1,
            high=MAX_REQUEST_CONCURRENCY,
            default=1,
        )
        order = _int_field(
            spec, "preferredOrder", path, errors, low=1, high=MAX_PREFERRED_ORDER, default=1
        )
        configuration = _configuration(spec, path, errors, is_helm=is_helm)
        policy = _policy(spec, path, errors, is_helm=is_helm)
        request = TargetRequest.from_spec(spec)
        resolved = resolve(catalog, request, is_helm=is_helm, path=path)
        if isinstance(resolved, list):
            errors.items.extend(resolved)
            continue
        if len(errors.items) > before:
            continue
        assert min_i is not None and max_i is not None
        assert concurrency is not None and order is not None
        out.append(
            ValidatedSpec(
                index=i,
                target=resolved,
                min_instances=min_i,
                max_instances=max_i,
                max_request_concurrency=concurrency,
                preferred_order=order,
                clusters=_string_list(spec.get("clusters")),
                regions=_string_list(spec.get("regions")),
                attributes=_string_list(spec.get("attributes")),
                availability_zones=_string_list(spec.get("availabilityZones")),
                configuration=configuration,
                helm_validation_policy=policy,
            )
        )
    if errors.items:
        raise ValidationFailed.of(errors.items, what="deployment")
    return out


@dataclass(frozen=True)
class StoredSpec:
    """What PUT compares a body specification against (the stored row, API names)."""

    id: uuid.UUID
    min_instances: int
    max_instances: int
    max_request_concurrency: int
    fixed: Mapping[str, Any]


def _same(key: str, stored: Any, given: Any) -> bool:
    if key in ("gpu", "backend"):
        return isinstance(given, str) and str(stored).lower() == given.lower()
    if key == "instanceType":
        try:
            return bool(parse_instance_type(given).name == stored)
        except (InstanceTypeError, TypeError):
            return False
    if key in ("clusters", "regions", "attributes", "availabilityZones"):
        return bool((stored or []) == given)
    if key == "helmValidationPolicy":
        scratch = _Errors()
        normalized = normalize_policy(given, "", scratch)
        return not scratch.items and normalized == stored
    return bool(stored == given)


def validate_update(body: Any, stored: Sequence[StoredSpec]) -> list[ScalingChange]:
    """A PUT body: each specification matched by `gpuSpecificationId` (or by position when
    there is one); only the scaling fields may differ. Raises ValidationFailed with all
    violations."""
    errors = _Errors()
    specs = _specs_list(body, errors)
    if specs is None:
        raise ValidationFailed.of(errors.items)
    by_id = {s.id: s for s in stored}
    changes: list[ScalingChange] = []
    seen: set[uuid.UUID] = set()
    for i, spec in enumerate(specs):
        path = f"{SPECS}[{i}]"
        if not isinstance(spec, Mapping):
            errors.add(path, "must be an object")
            continue
        target: StoredSpec | None = None
        raw_id = spec.get("gpuSpecificationId")
        if raw_id is not None:
            try:
                target = by_id.get(uuid.UUID(str(raw_id)))
            except ValueError:
                errors.add(f"{path}.gpuSpecificationId", f"{raw_id!r} is not a UUID")
                continue
            if target is None:
                errors.add(
                    f"{path}.gpuSpecificationId",
                    f"no GPU specification {raw_id} in this deployment; specifications "
                    "cannot be added — delete the deployment and deploy again",
                )
                continue
        elif len(stored) == 1 and len(specs) == 1:
            target = stored[0]
        else:
            errors.add(
                f"{path}.gpuSpecificationId",
                "is required to match specifications when the deployment or the body has "
                "more than one",
            )
            continue
        if target.id in seen:
            errors.add(f"{path}.gpuSpecificationId", "names the same specification twice")
            continue
        seen.add(target.id)
        for key in FIXED_FIELDS:
            if (
                key in spec
                and spec[key] is not None
                and not _same(key, target.fixed.get(key), spec[key])
            ):
                errors.add(
                    f"{path}.{key}",
                    f"cannot be changed on an existing deployment (is {target.fixed.get(key)!r}, "
                    f"got {spec[key]!r}); only {', '.join(SCALING_FIELDS)} can change — delete "
                    "the deployment and deploy again to change it",
                )
        before = len(errors.items)
        min_i = _int_field(spec, "minInstances", path, errors, low=0)
        max_i = _int_field(spec, "maxInstances", path, errors, low=1)
        concurrency = _int_field(
            spec, "maxRequestConcurrency", path, errors, low=1, high=MAX_REQUEST_CONCURRENCY
        )
        if len(errors.items) > before:
            continue
        _check_min_max(
            path,
            errors,
            target.min_instances if min_i is None else min_i,
            target.max_instances if max_i is None else max_i,
        )
        changes.append(ScalingChange(target.id, min_i, max_i, concurrency))
    if errors.items:
        raise ValidationFailed.of(errors.items, what="deployment update")
    return changes


def validate_patch(body: Any, stored: StoredSpec) -> ScalingChange:
    """A PATCH body `{minInstances?, maxInstances?}` (at least one)."""
    errors = _Errors()
    if not isinstance(body, Mapping):
        raise ValidationFailed.of([FieldError("body", "must be a JSON object")])
    if body.get("minInstances") is None and body.get("maxInstances") is None:
        raise ValidationFailed.of(
            [FieldError("body", "give at least one of minInstances, maxInstances")]
        )
    min_i = _int_field(body, "minInstances", "", errors, low=0)
    max_i = _int_field(body, "maxInstances", "", errors, low=1)
    items = [FieldError(e.field.lstrip("."), e.message) for e in errors.items]
    if not items:
        new_min = stored.min_instances if min_i is None else min_i
        new_max = stored.max_instances if max_i is None else max_i
        if new_max < new_min:
            field = "maxInstances" if max_i is not None else "minInstances"
            items.append(
                FieldError(
                    field,
                    f"maxInstances ({new_max}) must be ≥ minInstances ({new_min})",
                )
            )
    if items:
        raise ValidationFailed.of(items, what="GPU specification update")
    return ScalingChange(stored.id, min_i, max_i)
