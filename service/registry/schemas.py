"""Request and response shapes of the registry credentials API (api.md §5).

The password is write-only: it is in the request documentation models and in no response model.
"""

from __future__ import annotations

import uuid

from pydantic import ConfigDict, Field

from service.core.schemas import CamelModel, Timestamp
from service.registry.models import RegistryCredential


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


class RegistryCredentialCreate(CamelModel):
    """Body of `POST /registry-credentials` (documentation; validated in `service`)."""

    registry_hostname: str = Field(
        max_length=260,
        description="host[:port], no scheme, path or user info; stored lower-cased",
        examples=["nvcr.io", "registry.example.com:5000"],
    )
    username: str = Field(min_length=1, max_length=255, examples=["$oauthtoken"])
    password: str = Field(
        min_length=1, max_length=4096, description="write-only; stored encrypted, never returned"
    )
    description: str | None = Field(default=None, max_length=256)


class RegistryCredentialUpdate(CamelModel):
    """Body of `PATCH /registry-credentials/{id}`: any non-empty subset of the create fields.

    `description: null` (or "") removes the description.
    """

    model_config = ConfigDict(json_schema_extra={"minProperties": 1})

    registry_hostname: str | None = Field(default=None, max_length=260)
    username: str | None = Field(default=None, min_length=1, max_length=255)
    password: str | None = Field(default=None, min_length=1, max_length=4096)
    description: str | None = Field(default=None, max_length=256)
