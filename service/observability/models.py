"""A telemetry endpoint as stored: where to send, over which wire, what, and its key only as
SecretBox ciphertext; with the last outcome of an export to it."""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import JSON, BigInteger, Index, String, Text, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column

from service.core.db import Base, UTCDateTime, UUIDStr, utcnow

#: NVCF's limit on a secret's name, which is the telemetry's name
NAME_MAX = 48
ENDPOINT_MAX = 2048
ERROR_MAX = 512


class Provider(StrEnum):
    """NVCF's TelemetryProviderEnum, in its order."""

    PROMETHEUS = "PROMETHEUS"
    GRAFANA_CLOUD = "GRAFANA_CLOUD"
    SPLUNK = "SPLUNK"
    DATADOG = "DATADOG"
    SERVICENOW = "SERVICENOW"
    KRATOS = "KRATOS"
    KRATOS_THANOS = "KRATOS_THANOS"
    TIMESTREAM = "TIMESTREAM"
    VICTORIAMETRICS = "VICTORIAMETRICS"
    AZURE_MONITOR = "AZURE_MONITOR"
    OTEL_COLLECTOR = "OTEL_COLLECTOR"


class Protocol(StrEnum):
    """NVCF's TelemetryProtocolEnum."""

    HTTP = "HTTP"
    GRPC = "GRPC"


class Kind(StrEnum):
    """NVCF's TelemetryTypeEnum: what an endpoint receives."""

    LOGS = "LOGS"
    METRICS = "METRICS"
    TRACES = "TRACES"


class Telemetry(Base):
    """One telemetry endpoint of an account; its name is unique within the account."""

    __tablename__ = "telemetries"
    __table_args__ = (
        UniqueConstraint("account_id", "name", name="uq_telemetries_account_name"),
        Index("ix_telemetries_account_created", "account_id", "created_at", "id"),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), primary_key=True)
    account_id: Mapped[str] = mapped_column(String(128))
    #: `secret.name` of the request (NVCF: the secret's name is the telemetry's name)
    name: Mapped[str] = mapped_column(String(NAME_MAX))
    endpoint: Mapped[str] = mapped_column(String(ENDPOINT_MAX))
    protocol: Mapped[str] = mapped_column(String(8))
    provider: Mapped[str] = mapped_column(String(32))
    #: the Kind values, in Kind's order
    types: Mapped[list[Any]] = mapped_column(JSON)
    secret_ciphertext: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    #: the last export that the endpoint accepted, and the last it refused or never answered
    last_success_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_error_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_error: Mapped[str | None] = mapped_column(String(ERROR_MAX))
    #: signals an export to it failed to deliver, in all (spans; a metrics export counts one)
    dropped: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))

    @property
    def kinds(self) -> list[Kind]:
        return [k for k in Kind if k.value in self.types]

    def __repr__(self) -> str:  # never the ciphertext, let alone the key
        return (
            f"Telemetry(id={self.id}, account_id={self.account_id!r}, name={self.name!r}, "
            f"provider={self.provider!r}, endpoint={self.endpoint!r})"
        )
