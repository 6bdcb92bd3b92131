"""Registry credentials as stored (NVCF's shape): the password only as SecretBox ciphertext.

A credential is one login (`username` + encrypted password, sent by clients as
`secret.value = base64("user:password")`) for one registry `host[:port]`, named by
`secret.name`, and usable for the artifact types it lists: `HELM` ones pull charts,
`CONTAINER` ones become the pull secrets of instances.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import JSON, ForeignKey, Index, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from service.core.db import Base, UTCDateTime, UUIDStr, utcnow

# host (≤253) + ":" + port (≤5 digits); bracketed IPv6 literals are shorter.
HOSTNAME_MAX = 260
#: NVCF's limit on a secret's name (`secret.name`, stored as registryCredentialName)
NAME_MAX = 48


class ArtifactType(StrEnum):
    """What a credential may be used to pull (NVCF's ArtifactTypeEnum), in NVCF's order."""

    CONTAINER = "CONTAINER"
    HELM = "HELM"
    MODEL = "MODEL"
    RESOURCE = "RESOURCE"


class ProvisionedBy(StrEnum):
    """Who made a credential: a tenant through the API (USER) or the operator (SYSTEM)."""

    SYSTEM = "SYSTEM"
    USER = "USER"


class RegistryCredential(Base):
    """One login of an account for one registry host[:port]; unique per (host, name)."""

    __tablename__ = "registry_credentials"
    __table_args__ = (
        UniqueConstraint(
            "account_id",
            "registry_hostname",
            "name",
            name="uq_registry_credentials_account_host_name",
        ),
        Index("ix_registry_credentials_account_created", "account_id", "created_at", "id"),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), primary_key=True)
    account_id: Mapped[str] = mapped_column(String(128))
    registry_hostname: Mapped[str] = mapped_column(String(HOSTNAME_MAX))
    #: `secret.name` of the request (registryCredentialName)
    name: Mapped[str] = mapped_column(String(NAME_MAX))
    username: Mapped[str] = mapped_column(String(255))
    password_ciphertext: Mapped[str] = mapped_column(Text)
    description: Mapped[str | None] = mapped_column(String(256))
    tags: Mapped[list[Any] | None] = mapped_column(JSON)
    provisioned_by: Mapped[str] = mapped_column(
        String(16), default=ProvisionedBy.USER.value, server_default=ProvisionedBy.USER.value
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    artifact_type_rows: Mapped[list[RegistryCredentialArtifactType]] = relationship(
        cascade="all, delete-orphan",
        passive_deletes=True,
        lazy="selectin",
    )

    @property
    def artifact_types(self) -> list[ArtifactType]:
        """The credential's artifact types in NVCF's order."""
        have = {row.artifact_type for row in self.artifact_type_rows}
        return [t for t in ArtifactType if t.value in have]

    def add_artifact_types(self, types: list[ArtifactType]) -> None:
        """Add the types it does not have yet (NVCF adds, never replaces)."""
        have = {row.artifact_type for row in self.artifact_type_rows}
        for t in types:
            if t.value not in have:
                self.artifact_type_rows.append(RegistryCredentialArtifactType(artifact_type=t))
                have.add(t.value)

    def __repr__(self) -> str:  # never the ciphertext, let alone the password
        return (
            f"RegistryCredential(id={self.id}, account_id={self.account_id!r}, "
            f"registry_hostname={self.registry_hostname!r}, name={self.name!r}, "
            f"username={self.username!r})"
        )


class RegistryCredentialArtifactType(Base):
    """One row per artifact type of a credential: the pull look-ups and the `artifactType`
    filter are indexed lookups."""

    __tablename__ = "registry_credential_artifact_types"

    credential_id: Mapped[uuid.UUID] = mapped_column(
        UUIDStr(),
        ForeignKey(
            "registry_credentials.id",
            ondelete="CASCADE",
            # the naming convention's name would be longer than PostgreSQL's 63 characters
            name="fk_registry_credential_artifact_types_credential",
        ),
        primary_key=True,
    )
    artifact_type: Mapped[str] = mapped_column(String(16), primary_key=True)
