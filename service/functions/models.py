"""Functions and function versions as stored. A version is immutable apart from its metadata."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Index, Integer, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from service.core.db import Base, UTCDateTime, UUIDStr, utcnow


class Function(Base):
    __tablename__ = "functions"

    id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), primary_key=True)
    account_id: Mapped[str] = mapped_column(String(128), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class FunctionVersion(Base):
    __tablename__ = "function_versions"
    __table_args__ = (
        Index("ix_function_versions_account_created", "account_id", "created_at", "id"),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), primary_key=True)
    function_id: Mapped[uuid.UUID] = mapped_column(
        UUIDStr(), ForeignKey("functions.id", ondelete="CASCADE"), index=True
    )
    account_id: Mapped[str] = mapped_column(String(128))
    name: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16), default="INACTIVE")
    inference_url: Mapped[str] = mapped_column(Text)
    inference_port: Mapped[int | None] = mapped_column(Integer)
    container_image: Mapped[str | None] = mapped_column(Text)
    #: NVCF's `utilsContainerImage` as given (not shown, as NVCF's function object does not)
    utils_container_image: Mapped[str | None] = mapped_column(Text)
    container_args: Mapped[str | None] = mapped_column(Text)
    container_environment: Mapped[list[Any] | None] = mapped_column(JSON)
    helm_chart: Mapped[str | None] = mapped_column(Text)
    helm_chart_service_name: Mapped[str | None] = mapped_column(String(63))
    helm_chart_digest: Mapped[str | None] = mapped_column(String(80))
    models: Mapped[list[Any] | None] = mapped_column(JSON)
    resources: Mapped[list[Any] | None] = mapped_column(JSON)
    api_body_format: Mapped[str] = mapped_column(String(16))
    function_type: Mapped[str] = mapped_column(String(16))
    health: Mapped[dict[str, Any]] = mapped_column(JSON)
    health_uri: Mapped[str | None] = mapped_column(Text)
    description: Mapped[str] = mapped_column(String(256))
    tags: Mapped[list[Any]] = mapped_column(JSON)
    rate_limit: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # NVCF's LlmInvocationConfigDto (LLM functions; the same on every version of a function)
    llm_invocation_config: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # NVCF's TelemetriesDto, as given
    telemetries: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    findings: Mapped[list[Any] | None] = mapped_column(JSON)
    # Names only, kept on the version so reads never touch the encrypted values.
    secret_names: Mapped[list[Any]] = mapped_column(JSON, default=list)
    # Bumped by every secrets update; instances record the generation they received, so the
    # reconciler delivers an update once and only to the instances that lack it.
    secrets_generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    secrets: Mapped[list[FunctionSecret]] = relationship(
        back_populates="version",
        cascade="all, delete-orphan",
        passive_deletes=True,
        lazy="raise",
        order_by="FunctionSecret.name",
    )


class VersionTag(Base):
    """One row per tag of a version, so the `tag` filter is an indexed lookup."""

    __tablename__ = "version_tags"

    version_id: Mapped[uuid.UUID] = mapped_column(
        UUIDStr(), ForeignKey("function_versions.id", ondelete="CASCADE"), primary_key=True
    )
    tag: Mapped[str] = mapped_column(String(128), primary_key=True, index=True)


class FunctionSecret(Base):
    """A secret value, encrypted with the service's secrets key; never returned."""

    __tablename__ = "function_secrets"

    version_id: Mapped[uuid.UUID] = mapped_column(
        UUIDStr(), ForeignKey("function_versions.id", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(48), primary_key=True)
    ciphertext: Mapped[str] = mapped_column(Text)

    version: Mapped[FunctionVersion] = relationship(back_populates="secrets")


class FunctionAuthorization(Base):
    """Another account a function is shared with (NVCF's authorized parties): to read it, and
    to invoke it. `version_id` None shares the whole function, versions made later included;
    otherwise only that version. An account is authorized at most once per level."""

    __tablename__ = "function_authorizations"
    __table_args__ = (
        Index(
            "uq_function_authorizations_function",
            "function_id",
            "account_id",
            unique=True,
            sqlite_where=text("version_id IS NULL"),
            postgresql_where=text("version_id IS NULL"),
        ),
        Index(
            "uq_function_authorizations_version",
            "version_id",
            "account_id",
            unique=True,
            sqlite_where=text("version_id IS NOT NULL"),
            postgresql_where=text("version_id IS NOT NULL"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), primary_key=True, default=uuid.uuid4)
    function_id: Mapped[uuid.UUID] = mapped_column(
        UUIDStr(), ForeignKey("functions.id", ondelete="CASCADE"), index=True
    )
    version_id: Mapped[uuid.UUID | None] = mapped_column(
        UUIDStr(), ForeignKey("function_versions.id", ondelete="CASCADE")
    )
    #: the authorized account (the owner is the function's)
    account_id: Mapped[str] = mapped_column(String(128), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
