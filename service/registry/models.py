"""Registry credentials as stored: the password only as SecretBox ciphertext."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import Index, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from service.core.db import Base, UTCDateTime, UUIDStr, utcnow

# host (≤253) + ":" + port (≤5 digits); bracketed IPv6 literals are shorter.
HOSTNAME_MAX = 260


class RegistryCredential(Base):
    """One login of an account for one registry host[:port]; unique per (host, username)."""

    __tablename__ = "registry_credentials"
    __table_args__ = (
        UniqueConstraint(
            "account_id",
            "registry_hostname",
            "username",
            name="uq_registry_credentials_account_host_user",
        ),
        Index("ix_registry_credentials_account_created", "account_id", "created_at", "id"),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), primary_key=True)
    account_id: Mapped[str] = mapped_column(String(128))
    registry_hostname: Mapped[str] = mapped_column(String(HOSTNAME_MAX))
    username: Mapped[str] = mapped_column(String(255))
    password_ciphertext: Mapped[str] = mapped_column(Text)
    description: Mapped[str | None] = mapped_column(String(256))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    def __repr__(self) -> str:  # never the ciphertext, let alone the password
        return (
            f"RegistryCredential(id={self.id}, account_id={self.account_id!r}, "
            f"registry_hostname={self.registry_hostname!r}, username={self.username!r})"
        )
