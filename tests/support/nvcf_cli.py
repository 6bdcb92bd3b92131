"""nvcf-cli's registry-credential wire format, for API tests (read from NVIDIA's source:
src/clis/nvcf-cli/internal/client/registry.go and cmd/registry.go).

Requests are built exactly as the CLI marshals them (Go `encoding/json`: `omitempty` fields
left out, the secret named `credentials`, its value `base64.StdEncoding("user:password")`).
Responses are decoded as Go decodes them into the CLI's structs: object keys match struct
fields case-insensitively, unknown keys are ignored, null leaves the zero value, and a value
of the wrong JSON type (a string where the struct has a slice…) is an error, as
`json.Decoder.Decode` returns one and the CLI fails.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

#: the secret name nvcf-cli always sends
CLI_SECRET_NAME = "credentials"


def encode_secret(username: str, password: str) -> str:
    return base64.b64encode(f"{username}:{password}".encode()).decode()


def add_request(
    hostname: str,
    username: str,
    password: str,
    artifact_types: list[str],
    *,
    tags: list[str] | None = None,
    description: str = "",
    name: str = CLI_SECRET_NAME,
) -> dict[str, Any]:
    """`AddRegistryCredentialRequest` as `registry-credential add` marshals it."""
    body: dict[str, Any] = {
        "registryHostname": hostname,
        "secret": {"name": name, "value": encode_secret(username, password)},
        "artifactTypes": [t.upper() for t in artifact_types],
    }
    if tags:
        body["tags"] = tags
    if description:
        body["description"] = description
    return body


def update_request(
    username: str = "", password: str = "", artifact_types: list[str] | None = None
) -> dict[str, Any]:
    """`UpdateRegistryCredentialRequest` as `registry-credential update` marshals it."""
    body: dict[str, Any] = {}
    if username or password:
        body["secret"] = {"name": CLI_SECRET_NAME, "value": encode_secret(username, password)}
    if artifact_types:
        body["artifactTypeEnums"] = [t.upper() for t in artifact_types]
    return body


# --- Go's decoding of the CLI's response structs -----------------------------------------


class GoDecodeError(AssertionError):
    """What `json.Decoder.Decode` would report (the CLI then fails)."""


@dataclass(frozen=True)
class Slice:
    item: Any


@dataclass(frozen=True)
class Map:
    value: Any


@dataclass(frozen=True)
class Struct:
    name: str
    fields: dict[str, Any]


STRING = str

DETAILS = Struct(
    "RegistryCredentialDetailsDto",
    {
        "registryCredentialId": STRING,
        "ncaId": STRING,
        "registryCredentialName": STRING,
        "registryName": STRING,
        "registryHostname": STRING,
        "artifactTypes": Slice(STRING),
        "tags": Slice(STRING),
        "description": STRING,
        "provisionedBy": STRING,
        "lastUpdatedAt": STRING,
        "createdAt": STRING,
    },
)
DETAILS_RESPONSE = Struct("RegistryCredentialDetailsResponse", {"registryCredential": DETAILS})
LIST_RESPONSE = Struct(
    "ListRegistryCredentialDetailsResponse", {"registryCredentials": Slice(DETAILS)}
)
RECOGNIZED_RESPONSE = Struct(
    "RecognizedRegistriesResponse", {"recognizedRegistries": Map(Slice(Map(STRING)))}
)


def _zero(spec: Any) -> Any:
    if spec is STRING:
        return ""
    if isinstance(spec, Slice | Map):
        return None
    return {name: _zero(t) for name, t in spec.fields.items()}


def go_decode(spec: Any, value: Any, where: str = "") -> Any:
    """`value` (parsed JSON) decoded into `spec` as Go would; raises GoDecodeError."""
    where = where or getattr(spec, "name", "value")
    if value is None:  # null: the field keeps its zero value
        return _zero(spec)
    if spec is STRING:
        if not isinstance(value, str):
            raise GoDecodeError(f"json: cannot unmarshal {value!r} into Go value {where} string")
        return value
    if isinstance(spec, Slice):
        if not isinstance(value, list):
            raise GoDecodeError(f"json: cannot unmarshal {value!r} into Go value {where} slice")
        return [go_decode(spec.item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(spec, Map):
        if not isinstance(value, dict):
            raise GoDecodeError(f"json: cannot unmarshal {value!r} into Go value {where} map")
        return {k: go_decode(spec.value, v, f"{where}.{k}") for k, v in value.items()}
    if not isinstance(value, dict):
        raise GoDecodeError(f"json: cannot unmarshal {value!r} into Go struct {spec.name}")
    out = _zero(spec)
    for key, item in value.items():
        field = key if key in spec.fields else None
        if field is None:
            field = next((f for f in spec.fields if f.lower() == key.lower()), None)
        if field is not None:  # unknown keys are ignored
            out[field] = go_decode(spec.fields[field], item, f"{spec.name}.{field}")
    return out
