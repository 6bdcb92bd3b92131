"""Request and response shapes of the telemetry endpoints API (NVCF's TelemetryRequest,
TelemetryDto, UpdateTelemetrySecretRequest, TelemetriesDto).

The key is write-only: `secret.value` is in the request models and in no response model. The
field rules are declared once here; the rules between fields (which wire serves a provider)
are wires.py's, checked by service.py.
"""

from __future__ import annotations

import json
import uuid
from typing import Annotated, Any, ClassVar

from pydantic import Field

from service.core.schemas import MAX_SECRET_VALUE, SECRET_NAME_RE, CamelModel, Timestamp
from service.core.validation import Check, Expect, OneOf, RequestModel, matches
from service.observability.models import ENDPOINT_MAX, NAME_MAX, Kind, Protocol, Provider

PROVIDERS: tuple[str, ...] = tuple(p.value for p in Provider)
PROTOCOLS: tuple[str, ...] = tuple(p.value for p in Protocol)
KINDS: tuple[str, ...] = tuple(k.value for k in Kind)


def secret_text(value: str | dict[str, Any]) -> str:
    """A key's stored text: strings as given, objects as compact sorted JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _secret_size(value: str | dict[str, Any]) -> str | None:
    if not 1 <= len(secret_text(value)) <= MAX_SECRET_VALUE:
        return f"must be 1 to {MAX_SECRET_VALUE} characters"  # never a secret's length
    return None


def _no_blank(value: str) -> str | None:
    return "must not be blank" if not value.strip() else None


class TelemetrySecretIn(RequestModel):
    """`secret`: the telemetry's name (NVCF: the secret's name is the telemetry's) and its key:
    an API key or token, `instanceId:token` for GRAFANA_CLOUD, or client certificates
    `{clientKey, clientCert, caFile}` for the remote-write providers."""

    name: Annotated[
        str,
        Field(min_length=1, max_length=NAME_MAX, examples=["grafana-cloud"]),
        matches(
            SECRET_NAME_RE.pattern,
            "'{value}' must start with a letter or digit and contain only letters, digits, "
            "'_', '.' and '-'",
        ),
    ]
    value: Annotated[
        str | dict[str, Any],
        Expect((str, dict), "must be a string or an object"),
        Check(
            _secret_size,
            {"description": "write-only, stored encrypted; 1 to 32768 characters (as JSON)"},
        ),
    ] = Field(repr=False)

    shape: ClassVar[str] = "with name and value"
    null_when_missing: ClassVar[tuple[str, ...]] = ("name", "value")


Types = Annotated[
    list[Annotated[str, OneOf(KINDS)]],
    Expect((list,), f"must be a list of telemetry types ({', '.join(KINDS)})"),
    Field(min_length=1, max_length=len(KINDS)),
]


class TelemetryCreate(RequestModel):
    """Body of `POST /v2/nvcf/telemetries` (NVCF's TelemetryRequest)."""

    endpoint: Annotated[
        str,
        Field(
            min_length=1,
            max_length=ENDPOINT_MAX,
            description="the receiver's URL (OTLP, remote write); for DATADOG a site name "
            "such as datadoghq.com, or an intake URL",
            examples=["https://otlp-gateway-prod-us-west-0.grafana.net/otlp"],
        ),
        Check(_no_blank),
    ]
    protocol: Annotated[str, OneOf(PROTOCOLS)]
    provider: Annotated[str, OneOf(PROVIDERS)]
    types: Types
    secret: TelemetrySecretIn

    null_when_missing: ClassVar[tuple[str, ...]] = ("protocol", "provider")


class TelemetrySecretUpdate(RequestModel):
    """Body of `PUT /v2/nvcf/secrets/telemetries/{telemetryId}`: the new key. Its `name` must
    be the telemetry's (a telemetry is not renamed)."""

    secret: TelemetrySecretIn


# --- responses --------------------------------------------------------------------------


class TelemetryStatus(CamelModel):
    """The last outcome of an export to the endpoint (this server's addition)."""

    last_success_at: Timestamp | None = None
    last_error_at: Timestamp | None = None
    last_error: str | None = None
    #: signals not delivered to it (spans; one per failed metrics export); absent: none
    dropped: int | None = None


class TelemetryOut(CamelModel):
    """NVCF's TelemetryDto (never the key), with this server's `status`."""

    telemetry_id: uuid.UUID
    name: str
    endpoint: str
    protocol: str
    provider: str
    types: list[str]
    created_at: Timestamp
    status: TelemetryStatus


class TelemetryEnvelope(CamelModel):
    """NVCF's TelemetryResponse."""

    telemetry: TelemetryOut


class TelemetryList(CamelModel):
    """NVCF's ListTelemetryResponse."""

    telemetries: list[TelemetryOut]
