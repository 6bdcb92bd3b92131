"""Response shapes of the function registry (api.md §2.3); nulls are omitted on output."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from service.charts.schemas import HelmValidationPolicyIn
from service.core.durations import DurationError, parse_duration
from service.core.schemas import CamelModel, Timestamp
from service.core.validation import (
    DNS_1035_LABEL,
    Check,
    Expect,
    MaxItems,
    OneOf,
    RequestModel,
    int_between,
    matches,
)
from service.functions.models import FunctionVersion

NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9\-_]*$")
TAG_RE = re.compile(r"^[a-zA-Z0-9\-_:=]+$")
SECRET_NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$")
RATE_RE = re.compile(r"^[1-9]\d*-[SMHD](,\s*[1-9]\d*-[SMHD])*$")
URI_PATH_RE = re.compile(r"^[A-Za-z0-9\-._~!$&'()*+,;=:@/%]+$")
MAX_URI_PATH = 2048
API_BODY_FORMATS = ("CUSTOM", "PREDICT_V2")
FUNCTION_TYPES = ("DEFAULT", "STREAMING", "LLM")
HEALTH_PROTOCOLS = ("HTTP", "gRPC")
MAX_TAGS = 64
#: entries of containerEnvironment, secrets, models and resources per version
MAX_ENVIRONMENT = 256
MAX_SECRETS = 128
MAX_ARTIFACTS = 64
MAX_SECRET_VALUE = 32768


class KeyValue(CamelModel):
    key: str
    value: str


class Artifact(CamelModel):
    name: str
    version: str
    uri: str


class Health(CamelModel):
    protocol: str
    uri: str
    port: int
    timeout: str
    expected_status_code: int


class SecretName(CamelModel):
    name: str


class Finding(CamelModel):
    rule: str
    severity: str
    object: str | None = None
    field: str | None = None
    message: str


class ActiveInstance(CamelModel):
    instance_id: uuid.UUID
    phase: str
    instance_type: str
    gpu: str
    backend: str
    cluster: str | None = None
    created_at: Timestamp


class FunctionOut(CamelModel):
    id: uuid.UUID
    nca_id: str
    version_id: uuid.UUID
    name: str
    status: str
    inference_url: str
    inference_port: int | None = None
    container_image: str | None = None
    container_args: str | None = None
    container_environment: list[KeyValue] | None = None
    helm_chart: str | None = None
    helm_chart_service_name: str | None = None
    helm_chart_digest: str | None = None
    models: list[Artifact] | None = None
    resources: list[Artifact] | None = None
    api_body_format: str
    function_type: str
    health: Health
    health_uri: str | None = None
    description: str
    tags: list[str] = Field(default_factory=list)
    secrets: list[SecretName] | None = None
    rate_limit: dict[str, Any] | None = None
    findings: list[Finding] | None = None
    active_instances: list[ActiveInstance] | None = None
    created_at: Timestamp

    @classmethod
    def of(
        cls,
        v: FunctionVersion,
        *,
        details: bool = False,
        active_instances: Sequence[Any] | None = None,
    ) -> FunctionOut:
        """`active_instances` (rows with instance_id, phase, instance_type, gpu, backend,
        cluster, created_at) is shown only with `details`."""
        return cls(
            id=v.function_id,
            nca_id=v.account_id,
            version_id=v.id,
            name=v.name,
            status=v.status,
            inference_url=v.inference_url,
            inference_port=v.inference_port,
            container_image=v.container_image,
            container_args=v.container_args,
            container_environment=v.container_environment,
            helm_chart=v.helm_chart,
            helm_chart_service_name=v.helm_chart_service_name,
            helm_chart_digest=v.helm_chart_digest,
            models=v.models,
            resources=v.resources,
            api_body_format=v.api_body_format,
            function_type=v.function_type,
            health=v.health,
            health_uri=v.health_uri,
            description=v.description,
            tags=list(v.tags),
            secrets=[SecretName(name=str(n)) for n in v.secret_names] or None,
            rate_limit=v.rate_limit,
            findings=v.findings or None,
            active_instances=(
                [
                    ActiveInstance.model_validate(r, from_attributes=True)
                    for r in active_instances or ()
                ]
                if details
                else None
            ),
            created_at=v.created_at,
        )


class FunctionEnvelope(CamelModel):
    function: FunctionOut


class FunctionList(CamelModel):
    functions: list[FunctionOut]
    next_cursor: str | None = None


class FunctionIds(CamelModel):
    function_ids: list[uuid.UUID]


# --- request bodies: the single declaration of their fields, used to validate them --------


def _uri_path(value: str) -> str | None:
    if "://" in value:
        return f"must be a URI path such as '/echo', not an absolute URL ('{value}')"
    if not URI_PATH_RE.match(value):
        return f"'{value}' is not a valid URI path (no spaces, '?' or '#')"
    if len(value) > MAX_URI_PATH:
        return f"must be at most {MAX_URI_PATH} characters"
    return None


def _iso_duration(value: str) -> str | None:
    try:
        parse_duration(value)
    except DurationError:
        return f"'{value}' is not an ISO-8601 duration such as 'PT10S'"
    return None


def _rate_units(value: str) -> str | None:
    units = [part.strip().split("-")[1] for part in value.split(",")]
    dup = sorted({u for u in units if units.count(u) > 1})
    return f"'{value}' names the unit {', '.join(dup)} more than once" if dup else None


def _strings(value: Any) -> str | None:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return None
    return "must be a list of strings"


def _reserved_key(value: str) -> str | None:
    if value.upper().startswith("NVCF_"):
        return f"'{value}': keys starting with NVCF_ are reserved for the platform"
    return None


def _secret_size(value: str | dict[str, Any]) -> str | None:
    text = value if isinstance(value, str) else secret_text(value)
    if not 1 <= len(text) <= MAX_SECRET_VALUE:
        # Never quote the value: it is a secret.
        return f"must be 1 to {MAX_SECRET_VALUE} characters, got {len(text)}"
    return None


def secret_text(value: str | dict[str, Any]) -> str:
    """A secret's stored text: strings as given, objects as compact sorted JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


UriPath = Annotated[
    str,
    Field(min_length=1),
    Check(_uri_path, {"maxLength": MAX_URI_PATH, "pattern": URI_PATH_RE.pattern}),
]
Port = Annotated[StrictInt, int_between(1, 65535)]


class KeyValueIn(RequestModel):
    key: Annotated[str, Field(min_length=1, max_length=256), Check(_reserved_key)]
    value: str

    shape: ClassVar[str] = "with key and value"


class ArtifactIn(RequestModel):
    name: str = Field(min_length=1, max_length=1024)
    version: str = Field(min_length=1, max_length=1024)
    uri: str = Field(min_length=1, max_length=1024)

    shape: ClassVar[str] = "with name, version and uri"


class HealthIn(RequestModel):
    protocol: Annotated[str, OneOf(HEALTH_PROTOCOLS)]
    uri: UriPath
    port: Port
    timeout: Annotated[str, Check(_iso_duration, {"examples": ["PT10S"]})]
    expected_status_code: Annotated[StrictInt, int_between(100, 599)]


class SecretIn(RequestModel):
    name: Annotated[
        str,
        Field(min_length=1, max_length=48),
        matches(
            SECRET_NAME_RE.pattern,
            "'{value}' must start with a letter or digit and contain only letters, digits, "
            "'_', '.' and '-'",
        ),
    ]
    value: Annotated[
        str | dict[str, Any],
        Expect((str, dict), "must be a string or an object"),
        Check(_secret_size, {"description": f"1 to {MAX_SECRET_VALUE} characters (as JSON)"}),
    ]

    shape: ClassVar[str] = "with name and value"


class RateLimit(RequestModel):
    rate_limit: Annotated[
        str,
        Expect((str,), "must be a string such as '100-S'"),
        matches(
            RATE_RE.pattern,
            "'{value}' must be '<count>-<unit>' items separated by commas, unit S, M, H or D "
            "(e.g. '100-S,5000-H')",
        ),
        Check(_rate_units, {"examples": ["100-S"]}),
    ]
    exempted_nca_ids: Annotated[list[str], Check(_strings, before=True)] | None = None
    sync_check: StrictBool | None = None

    shape: ClassVar[str] = 'like {"rateLimit": "100-S"}'


Tag = Annotated[
    str,
    Field(min_length=1, max_length=128),
    matches(TAG_RE.pattern, "'{value}' may contain only letters, digits and '-', '_', ':', '='"),
]
#: `models` and `resources`
Artifacts = Annotated[
    list[ArtifactIn],
    MaxItems(MAX_ARTIFACTS),
    Expect((list,), "must be a list of {name, version, uri}"),
]
Tags = Annotated[list[Tag], MaxItems(MAX_TAGS), Expect((list,), "must be a list of strings")]
Description = Annotated[str, Field(max_length=256)]


class FunctionCreate(RequestModel):
    """Body of `POST /functions` and `POST /functions/{id}/versions`."""

    # Field rules are declared here; the rules between fields are in validation.py.

    name: Annotated[
        str,
        Field(min_length=1, max_length=128),
        matches(
            NAME_RE.pattern,
            "'{value}' must start with a letter or digit and contain only letters, "
            "digits, '-' and '_'",
        ),
    ]
    inference_url: UriPath
    inference_port: Port | None = None
    container_image: str | None = Field(default=None, min_length=1, max_length=1024)
    helm_chart: str | None = Field(
        default=None,
        min_length=1,
        max_length=2048,
        examples=["oci://reg.example.com/acme/charts/inference-test-1.0.0.tgz"],
    )
    helm_chart_service_name: (
        Annotated[
            str,
            matches(
                DNS_1035_LABEL,
                "'{value}' must be a DNS-1035 label: at most 63 lower-case letters, "
                "digits and '-', starting with a letter and ending with a letter or digit",
            ),
        ]
        | None
    ) = Field(default=None, description="required with helmChart, only allowed with it")
    helm_validation_policy: HelmValidationPolicyIn | None = Field(
        default=None,
        description="helm functions only: the policy the chart is checked with at creation "
        "(not stored; each deployment specification names its own); some catalog cluster "
        "must permit it",
    )
    container_args: str | None = Field(default=None, max_length=4096)
    container_environment: (
        Annotated[
            list[KeyValueIn],
            MaxItems(MAX_ENVIRONMENT),
            Expect((list,), "must be a list of {key, value}"),
        ]
        | None
    ) = None
    models: Artifacts | None = None
    resources: Artifacts | None = None
    api_body_format: Annotated[str, OneOf(API_BODY_FORMATS, "CUSTOM")] = "CUSTOM"
    function_type: Annotated[str, OneOf(FUNCTION_TYPES, "DEFAULT")] = "DEFAULT"
    health: HealthIn | None = None
    health_uri: UriPath | None = None
    description: Description | None = None
    tags: Tags | None = None
    secrets: (
        Annotated[
            list[SecretIn],
            MaxItems(MAX_SECRETS),
            Expect((list,), "must be a list of {name, value}"),
        ]
        | None
    ) = None
    rate_limit: RateLimit | None = None


class FunctionMetadataUpdate(RequestModel):
    """Body of `PUT /functions/{id}/versions/{versionId}` (at least one field)."""

    model_config = ConfigDict(json_schema_extra={"minProperties": 1})

    tags: Tags | None = None
    description: Description | None = None
    rate_limit: RateLimit | None = None


DOC_MODELS: tuple[type[BaseModel], ...] = (FunctionCreate, FunctionMetadataUpdate)
