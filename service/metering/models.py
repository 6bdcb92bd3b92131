"""Metering as stored: an instance's GPU interval (`GpuInterval`, one row per instance or
task, written by the deployments' and the tasks' one writer of state) and the invocation and
token counts (`UsageCount`, per replica run, hour and key, added by batches)."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import BigInteger, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.core.db import Base, UTCDateTime, UUIDStr


class GpuInterval(Base):
    """One instance of a function (or one task) from its creation to its end: `started_at`
    is when it first became ready (None: never), `ended_at` when it ended (None: still on);
    each is written once."""

    __tablename__ = "gpu_intervals"
    __table_args__ = (
        Index("ix_gpu_intervals_account_created", "account_id", "created_at"),
        Index("ix_gpu_intervals_deployment", "deployment_id"),
    )

    instance_id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), primary_key=True)
    account_id: Mapped[str] = mapped_column(String(128))
    function_id: Mapped[uuid.UUID | None] = mapped_column(UUIDStr())
    version_id: Mapped[uuid.UUID | None] = mapped_column(UUIDStr())
    deployment_id: Mapped[uuid.UUID | None] = mapped_column(UUIDStr())
    task_id: Mapped[uuid.UUID | None] = mapped_column(UUIDStr())
    gpu: Mapped[str] = mapped_column(String(64))
    instance_type: Mapped[str] = mapped_column(String(128))
    cluster: Mapped[str | None] = mapped_column(String(128))
    #: GPUs the instance holds (its instance type's GPUs per node times its nodes)
    gpus: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class UsageCount(Base):
    """Invocations and tokens one replica run counted in one hour for one key. `batch` is the
    last batch added: a batch written again (its commit's outcome unknown) adds nothing."""

    __tablename__ = "usage_counts"
    __table_args__ = (Index("ix_usage_counts_account_hour", "account_id", "hour"),)

    replica: Mapped[str] = mapped_column(String(36), primary_key=True)
    hour: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    account_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    function_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    version_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    #: the model an LLM request named ("" for other invocations)
    model: Mapped[str] = mapped_column(String(256), primary_key=True)
    invocations: Mapped[int] = mapped_column(BigInteger)
    input_tokens: Mapped[int] = mapped_column(BigInteger)
    output_tokens: Mapped[int] = mapped_column(BigInteger)
    batch: Mapped[int] = mapped_column(BigInteger)
