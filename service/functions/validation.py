"""Every rule of api.md §2.1–2.2, with ALL violations reported together.

Field rules (types, lengths, patterns, ranges) are declared once by the request models in
schemas.py and checked by pydantic; the rules between fields (exactly one of
containerImage/helmChart/models, helmChartServiceName only with helmChart, unique keys, the
chart URL) run here in one pass afterwards and add to the same list of violations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from service.charts.policy import ValidationPolicy
from service.charts.url import ChartUrlError, parse_chart_url
from service.core.errors import FieldError, ValidationFailed
from service.core.http import require_json_object
from service.core.validation import failed, parse
from service.functions.requests import (
    UTILS_SELECTORS,
    FunctionCreate,
    FunctionMetadataUpdate,
    secret_text,
)
from service.observability.references import canonical, reserved_port_errors


@dataclass
class FunctionSpec:
    """A validated, normalised create request."""

    name: str
    inference_url: str
    inference_port: int | None
    container_image: str | None
    container_args: str | None
    container_environment: list[dict[str, str]] | None
    helm_chart: str | None
    helm_chart_service_name: str | None
    models: list[dict[str, Any]] | None
    resources: list[dict[str, str]] | None
    api_body_format: str
    function_type: str
    health: dict[str, Any]
    health_uri: str | None
    description: str
    tags: list[str]
    secrets: list[tuple[str, str]] = field(default_factory=list)
    rate_limit: dict[str, Any] | None = None
    llm_invocation_config: dict[str, Any] | None = None
    telemetries: dict[str, Any] | None = None
    #: NVCF's `utilsContainerImage` as given (`PYTHON`, `GO` or an image: `utils_image`)
    utils_container_image: str | None = None
    #: the policy the chart is checked with at creation (helm functions; not stored)
    helm_validation_policy: ValidationPolicy = field(default_factory=ValidationPolicy)


@dataclass(frozen=True)
class ModelUpdate:
    """A model's `llmConfig` fields to set (None: kept)."""

    model_name: str
    token_rate_limit: str | None
    routing_method: str | None


@dataclass
class MetadataUpdate:
    tags: list[str] | None
    description: str | None
    rate_limit: dict[str, Any] | None
    model_updates: list[ModelUpdate] = field(default_factory=list)
    llm_invocation_config: dict[str, Any] | None = None


def _unique(
    body: dict[str, Any], list_key: str, key: str, bad: set[str], noun: str
) -> list[FieldError]:
    errors: list[FieldError] = []
    seen: set[str] = set()
    items = body.get(list_key)
    if not isinstance(items, list):  # the field's own error says what it should be
        return errors
    for i, item in enumerate(items):
        where = f"{list_key}[{i}].{key}"
        if not isinstance(item, dict) or not isinstance(item.get(key), str) or where in bad:
            continue
        value = item[key]
        if value in seen:
            errors.append(FieldError(where, f"'{value}' appears more than once; {noun}"))
        seen.add(value)
    return errors


def _cross_field(body: dict[str, Any], bad: set[str]) -> list[FieldError]:
    """The rules between fields; `bad` are the fields that already broke a field rule."""
    errors: list[FieldError] = []
    given = {k for k, v in body.items() if v is not None}
    if not given & {"containerImage", "helmChart", "models"}:
        errors.append(
            FieldError("containerImage", "one of containerImage, helmChart or models is required")
        )
    if "helmChart" in given:
        for other in ("containerImage", "containerArgs", "containerEnvironment"):
            if other in given:
                errors.append(FieldError(other, f"{other} cannot be used together with helmChart"))
        if "helmChartServiceName" not in given:
            errors.append(FieldError("helmChartServiceName", "is required with helmChart"))
        if "helmChart" not in bad:
            try:
                parse_chart_url(body["helmChart"])
            except ChartUrlError as exc:
                errors.extend(FieldError("helmChart", message) for message in exc.messages)
    elif "helmChartServiceName" in given:
        errors.append(FieldError("helmChartServiceName", "is only allowed together with helmChart"))
    if "helmChart" not in given and "helmValidationPolicy" in given:
        errors.append(FieldError("helmValidationPolicy", "is only allowed together with helmChart"))
    errors += _unique(body, "containerEnvironment", "key", bad, "keys must be unique")
    errors += _unique(body, "secrets", "name", bad, "names must be unique")
    errors += _unique(body, "models", "name", bad, "model names must be unique")
    errors += _llm_rules(body, bad)
    return errors


def _llm_rules(body: dict[str, Any], bad: set[str]) -> list[FieldError]:
    """NVCF's rules between functionType and models: an LLM function has models, each with
    llmConfig; another function's models have version and uri and no llmConfig."""
    kind = body.get("functionType")
    llm = isinstance(kind, str) and kind.upper() == "LLM"
    errors: list[FieldError] = []
    if "functionType" in bad:
        return errors
    models = body.get("models")
    if llm and not models and "models" not in bad:
        errors.append(
            FieldError("models", "is required when functionType is LLM: the models it serves")
        )
    if not llm and body.get("llmInvocationConfig") is not None:
        errors.append(FieldError("llmInvocationConfig", "is only allowed when functionType is LLM"))
    if not isinstance(models, list):
        return errors
    for i, model in enumerate(models):
        if not isinstance(model, dict) or f"models[{i}]" in bad:
            continue
        if llm and model.get("llmConfig") is None:
            errors.append(
                FieldError(f"models[{i}].llmConfig", "is required for an LLM function's models")
            )
        if not llm:
            errors.extend(
                FieldError(f"models[{i}].{key}", "is required unless functionType is LLM")
                for key in ("version", "uri")
                if model.get(key) is None
            )
            if model.get("llmConfig") is not None:
                errors.append(
                    FieldError(f"models[{i}].llmConfig", "is only allowed when functionType is LLM")
                )
    return errors


def _default_health(model: FunctionCreate) -> dict[str, Any]:
    grpc = model.inference_url.strip("/").lower() == "grpc"
    return {
        "protocol": "gRPC" if grpc else "HTTP",
        "uri": model.health_uri or "/v2/health/ready",
        "port": model.inference_port or 8000,
        "timeout": "PT10S",
        "expectedStatusCode": 200,
    }


def image_registry(reference: str) -> str:
    """The registry (`host[:port]`) an image reference names, as Docker decides it: a first
    component with a '.' or ':', or `localhost`; else Docker Hub."""
    first, slash, _ = reference.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first.lower()
    return "docker.io"


def utils_image(value: str | None) -> str | None:
    """The worker-utils sidecar image a function's `utilsContainerImage` names; None for the
    platform's own (unset, or NVCF's `PYTHON` / `GO`)."""
    return None if value is None or value in UTILS_SELECTORS else value


def image_repository(reference: str) -> str:
    """An image reference without its tag and digest, with its registry (`docker.io` for
    Docker Hub): `nvcr.io/nvidia/utils:1.0` -> `nvcr.io/nvidia/utils`."""
    name = reference.partition("@")[0]
    slash = name.rfind("/")
    if ":" in name[slash + 1 :]:
        name = name[: name.rindex(":")]
    registry = image_registry(name)
    if registry == "docker.io" and not name.startswith("docker.io/"):
        name = f"docker.io/{name if '/' in name else 'library/' + name}"
    return name


@dataclass(frozen=True)
class UtilsImages:
    """Where a function's worker-utilities image may come from (the operator's settings): a
    listed registry, or the repository of the operator's own image (any tag)."""

    registries: frozenset[str] = frozenset()
    own: str | None = None

    def refusal(self, image: str) -> str | None:
        registry = image_registry(image)
        if registry in self.registries:
            return None
        if self.own and image_repository(image) == image_repository(self.own):
            return None
        allowed = sorted(self.registries) + ([image_repository(self.own)] if self.own else [])
        return (
            f"registry '{registry}' is not among those allowed for the worker utilities image "
            f"({', '.join(allowed) or 'none'})"
        )


def _utils_image(body: dict[str, Any], bad: set[str], policy: UtilsImages) -> list[FieldError]:
    image = utils_image(body.get("utilsContainerImage"))
    if image is None or "utilsContainerImage" in bad:
        return []
    refusal = policy.refusal(image)
    return [] if refusal is None else [FieldError("utilsContainerImage", refusal)]


def _dedupe(tags: list[str] | None) -> list[str]:
    return list(dict.fromkeys(tags or ()))


def validate_create(raw: Any, *, utils_images: UtilsImages | None = None) -> FunctionSpec:
    """Validate a create-function / create-version body, or raise with every violation;
    `utils_images`: where a `utilsContainerImage` may come from (None: nowhere)."""
    body = require_json_object(raw)
    model, errors = parse(FunctionCreate, body)
    errors += _cross_field(body, failed(errors))
    errors += _utils_image(body, failed(errors), utils_images or UtilsImages())
    if model is not None and model.telemetries is not None:
        health_port = model.health.port if model.health is not None else None
        errors += reserved_port_errors(
            [("inferencePort", model.inference_port), ("health.port", health_port)]
        )
    if errors:
        raise ValidationFailed.of(errors)
    assert model is not None
    dump = model.model_dump(by_alias=True, exclude_none=True)
    return FunctionSpec(
        name=model.name,
        inference_url=model.inference_url,
        inference_port=model.inference_port,
        container_image=model.container_image,
        container_args=model.container_args,
        container_environment=dump.get("containerEnvironment"),
        helm_chart=model.helm_chart,
        helm_chart_service_name=model.helm_chart_service_name if model.helm_chart else None,
        models=dump.get("models"),
        resources=dump.get("resources"),
        api_body_format=model.api_body_format,
        function_type=model.function_type,
        health=dump.get("health") or _default_health(model),
        health_uri=model.health_uri,
        description=model.description if model.description is not None else model.name,
        tags=_dedupe(model.tags),
        secrets=[(s.name, secret_text(s.value)) for s in model.secrets or ()],
        rate_limit=dump.get("rateLimit"),
        llm_invocation_config=dump.get("llmInvocationConfig"),
        telemetries=canonical(dump.get("telemetries")),
        utils_container_image=model.utils_container_image,
        helm_validation_policy=(
            model.helm_validation_policy.policy()
            if model.helm_validation_policy is not None
            else ValidationPolicy()
        ),
    )


def validate_metadata_update(raw: Any) -> MetadataUpdate:
    body = require_json_object(raw)
    model, errors = parse(FunctionMetadataUpdate, body)
    given = [k for k in UPDATABLE if body.get(k) is not None]
    if not given or (given == ["modelUpdates"] and body["modelUpdates"] == []):
        names = ", ".join(UPDATABLE[:-1]) + f" or {UPDATABLE[-1]}"
        errors.insert(0, FieldError("body", f"at least one of {names} is required"))
    errors += _unique(body, "modelUpdates", "modelName", failed(errors), "names must be unique")
    if errors:
        raise ValidationFailed.of(errors)
    assert model is not None
    dump = model.model_dump(by_alias=True, exclude_none=True)
    return MetadataUpdate(
        tags=_dedupe(model.tags) if model.tags is not None else None,
        description=model.description,
        rate_limit=(
            model.rate_limit.model_dump(by_alias=True, exclude_none=True)
            if model.rate_limit
            else None
        ),
        model_updates=[
            ModelUpdate(u.model_name, u.llm_config.token_rate_limit, u.llm_config.routing_method)
            for u in model.model_updates or ()
        ],
        llm_invocation_config=dump.get("llmInvocationConfig"),
    )


#: the fields of an update (an empty modelUpdates counts as not given, as NVCF)
UPDATABLE = ("tags", "description", "rateLimit", "modelUpdates", "llmInvocationConfig")
