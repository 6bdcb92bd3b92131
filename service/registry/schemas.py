"""Request and response shapes of the registry credentials API (api.md §5).

The password is write-only: it is in the request models and in no response model. The request
models declare every field rule once: pydantic checks the bodies with them (service.py) and the
OpenAPI document shows them.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from pydantic import ConfigDict, Field

from service.core.schemas import CamelModel, Timestamp
from service.core.validation import Check, RequestModel, Rules, never_null
from service.registry.hostnames import normalize_hostname
from service.registry.models import HOSTNAME_MAX, RegistryCredential

USERNAME_MAX = 255
PASSWORD_MAX = 4096
DESCRIPTION_MAX = 256


class RegistryCredentialOut(CamelModel):
    id: uuid.UUID
    registry_hostname: str
    username: str
    description: str | None = None
    created_at: Timestamp
    updated_at: Timestamp

    @classmethod
    def of(cls, c: RegistryCredential) -> RegistryCredentialOut:
        return cls(
            id=c.id,
            registry_hostname=c.registry_hostname,
            username=c.username,
            description=c.description,
            created_at=c.created_at,
            updated_at=c.updated_at,
        )


class RegistryCredentialEnvelope(CamelModel):
    registry_credential: RegistryCredentialOut


class RegistryCredentialList(CamelModel):
    registry_credentials: list[RegistryCredentialOut]
    next_cursor: str | None = None


# --- request bodies: the single declaration of their fields, used to validate them --------


def _hostname(value: str) -> tuple[str, list[str]]:
    normal, problems = normalize_hostname(value)
    return (normal if normal is not None else value), problems


def _username(value: str) -> tuple[str, list[str]]:
    problems: list[str] = []
    if not value.isprintable():
        problems.append("must contain only printable characters (no control characters)")
    if value != value.strip():
        problems.append("must not start or end with whitespace")
    if ":" in value:
        problems.append("must not contain ':' (it cannot be sent in HTTP basic auth)")
    return value, problems


def _password(value: str) -> str | None:
    # Never put the value, or anything derived from it (not even its length), into a message.
    if len(value) > PASSWORD_MAX:
        return f"must be at most {PASSWORD_MAX} characters"
    if any(ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 for ch in value):
        return "must not contain control characters such as line breaks or tabs"
    return None


def _not_null(value: Any) -> str | None:
    return "cannot be null; leave the field out to keep its value" if value is None else None


Hostname = Annotated[
    str,
    Rules(_hostname, {"minLength": 1, "maxLength": HOSTNAME_MAX}),
    Field(
        description="host[:port], no scheme, path or user info; stored lower-cased",
        examples=["nvcr.io", "registry.example.com:5000"],
    ),
]
Username = Annotated[
    str,
    Field(min_length=1, max_length=USERNAME_MAX, examples=["$oauthtoken"]),
    Rules(_username, {"description": "printable, no ':', no leading or trailing whitespace"}),
]
Password = Annotated[
    str,
    Field(min_length=1, description="write-only; stored encrypted, never returned"),
    Check(_password, {"maxLength": PASSWORD_MAX}),
]
#: "" (and, in PATCH, null) means no description
Description = Annotated[str, Field(max_length=DESCRIPTION_MAX)]
#: PATCH: absent keeps the value; null is refused (only the description can be removed)
_NotNull = Check(_not_null, before=True)


class RegistryCredentialCreate(RequestModel):
    """Body of `POST /registry-credentials`."""

    registry_hostname: Hostname
    username: Username
    password: Password = Field(repr=False)
    description: Description | None = None


class RegistryCredentialUpdate(RequestModel):
    """Body of `PATCH /registry-credentials/{id}`: any non-empty subset of the create fields.

    `description: null` (or "") removes the description.
    """

    model_config = ConfigDict(json_schema_extra={"minProperties": 1})

    registry_hostname: Annotated[Hostname | None, _NotNull] = Field(
        default=None, json_schema_extra=never_null
    )
    username: Annotated[Username | None, _NotNull] = Field(
        default=None, json_schema_extra=never_null
    )
    password: Annotated[Password | None, _NotNull] = Field(
        default=None, repr=False, json_schema_extra=never_null
    )
    description: Description | None = None
