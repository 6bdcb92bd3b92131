"""A task as stored: its specification, its status with the timestamps of its clocks, its
timeline (`TaskEvent`) and the results its container reported (`TaskResult`).

Every clock is kept as a timestamp of the row (created, launched, running, stop requested,
kill due), so a restarted server decides exactly as the one before it.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from service.core.db import Base, UTCDateTime, UUIDStr


class TaskStatus(StrEnum):
    """NVCT's TaskStatusEnum."""

    QUEUED = "QUEUED"
    LAUNCHED = "LAUNCHED"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    CANCELED = "CANCELED"
    ERRORED = "ERRORED"
    EXCEEDED_MAX_RUNTIME_DURATION = "EXCEEDED_MAX_RUNTIME_DURATION"
    EXCEEDED_MAX_QUEUED_DURATION = "EXCEEDED_MAX_QUEUED_DURATION"


ACTIVE = (TaskStatus.QUEUED, TaskStatus.LAUNCHED, TaskStatus.RUNNING)
ON_CLUSTER = (TaskStatus.LAUNCHED, TaskStatus.RUNNING)
TERMINAL = tuple(s for s in TaskStatus if s not in ACTIVE)


class Task(Base):
    __tablename__ = "tasks"
    __table_args__ = (
        Index("ix_tasks_account_created", "account_id", "created_at", "id"),
        Index("ix_tasks_status", "status"),
        Index("ix_tasks_teardown", "teardown_pending"),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), primary_key=True)
    account_id: Mapped[str] = mapped_column(String(128))
    name: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(40))
    description: Mapped[str | None] = mapped_column(String(256))
    tags: Mapped[list[Any]] = mapped_column(JSON, default=list)
    gpu: Mapped[str] = mapped_column(String(64))
    instance_type: Mapped[str] = mapped_column(String(128))
    backend: Mapped[str | None] = mapped_column(String(128))
    clusters: Mapped[list[Any] | None] = mapped_column(JSON)
    #: the catalog clusters placement may use, resolved at creation
    candidate_clusters: Mapped[list[Any]] = mapped_column(JSON, default=list)
    configuration: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    helm_validation_policy: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    container_image: Mapped[str | None] = mapped_column(Text)
    container_args: Mapped[str | None] = mapped_column(Text)
    container_environment: Mapped[list[Any] | None] = mapped_column(JSON)
    models: Mapped[list[Any] | None] = mapped_column(JSON)
    resources: Mapped[list[Any] | None] = mapped_column(JSON)
    helm_chart: Mapped[str | None] = mapped_column(Text)
    #: a helm task's rendered objects (the charts pipeline's output), applied as they are
    objects: Mapped[list[Any] | None] = mapped_column(JSON)
    result_handling: Mapped[str] = mapped_column(String(16))
    results_location: Mapped[str | None] = mapped_column(String(512))
    max_runtime_seconds: Mapped[float | None] = mapped_column(Float)
    max_queued_seconds: Mapped[float] = mapped_column(Float)
    #: created_at + maxQueuedDuration: when a task still queued ends
    queued_until: Mapped[datetime] = mapped_column(UTCDateTime())
    grace_seconds: Mapped[float] = mapped_column(Float)
    telemetries: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    secret_names: Mapped[list[Any]] = mapped_column(JSON, default=list)
    #: the secrets as one encrypted JSON object (never returned, logged or in an event)
    secrets_ciphertext: Mapped[str | None] = mapped_column(Text)
    secrets_generation: Mapped[int] = mapped_column(Integer, default=0)
    secrets_delivered: Mapped[int] = mapped_column(Integer, default=0)
    cluster: Mapped[str | None] = mapped_column(String(128))
    percent_complete: Mapped[int | None] = mapped_column(Integer)
    result_name: Mapped[str | None] = mapped_column(String(190))
    progress_metadata: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    health_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    launched_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    running_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    #: cancel or delete asked the container to stop; it is killed at `kill_at`
    stop_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    kill_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    #: deleted by its owner: gone from the API, the row stays until the cluster is clean
    deleted: Mapped[bool] = mapped_column(Boolean, default=False)
    #: its objects are still on `cluster` and must be removed
    teardown_pending: Mapped[bool] = mapped_column(Boolean, default=False)
    #: its containers' last lines, read as its objects left the cluster (deployments/logs/keep)
    kept_logs: Mapped[list[Any] | None] = mapped_column(JSON)
    #: the replica following its lines for its telemetry (a lease, until `log_follower_until`)
    #: and the time stamp of the last line it sent: a replica taking over goes on from there
    log_follower: Mapped[str | None] = mapped_column(String(64))
    log_follower_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    log_sent: Mapped[str | None] = mapped_column(String(64))


class TaskEvent(Base):
    __tablename__ = "task_events"
    __table_args__ = (Index("ix_task_events_task_created", "task_id", "created_at", "id"),)

    id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), primary_key=True)
    task_id: Mapped[uuid.UUID] = mapped_column(
        UUIDStr(), ForeignKey("tasks.id", ondelete="CASCADE")
    )
    account_id: Mapped[str] = mapped_column(String(128))
    message: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class TaskResult(Base):
    """A result the container reported by name; with UPLOAD, where it was pushed."""

    __tablename__ = "task_results"
    __table_args__ = (Index("ix_task_results_task_created", "task_id", "created_at", "id"),)

    id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), primary_key=True)
    task_id: Mapped[uuid.UUID] = mapped_column(
        UUIDStr(), ForeignKey("tasks.id", ondelete="CASCADE")
    )
    account_id: Mapped[str] = mapped_column(String(128))
    name: Mapped[str] = mapped_column(String(190))
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    percent_complete: Mapped[int] = mapped_column(Integer)
    #: UPLOAD: the pushed artifact (None until pushed, and always with NONE)
    reference: Mapped[str | None] = mapped_column(Text)
    digest: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
