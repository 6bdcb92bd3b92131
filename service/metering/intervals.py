"""GPU intervals, written only by the one writer of instance and task state (deployments'
`transitions/`, tasks' `transitions.py`) in the transaction of the change they follow: an
interval is opened when its instance is created, started the first time the instance is ready
and ended once (its objects gone, failed, or its deployment removed). A statement that finds
the interval already started or ended changes nothing, so a replayed change never counts
twice."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from service.clusters.instance_types import InstanceTypeError, parse_instance_type
from service.metering import repository
from service.metering.models import GpuInterval


def gpus_of(instance_type: str) -> int:
    """GPUs one instance of the type holds (1 for a name that does not parse)."""
    try:
        parsed = parse_instance_type(instance_type)
    except InstanceTypeError:
        return 1
    return parsed.gpus_per_node * parsed.nodes


def open_instance(
    session: AsyncSession,
    *,
    instance_id: uuid.UUID,
    account_id: str,
    function_id: uuid.UUID,
    version_id: uuid.UUID,
    deployment_id: uuid.UUID,
    gpu: str,
    instance_type: str,
    created_at: datetime,
) -> None:
    """A new instance of a function version: its interval, not started."""
    session.add(
        GpuInterval(
            instance_id=instance_id,
            account_id=account_id,
            function_id=function_id,
            version_id=version_id,
            deployment_id=deployment_id,
            gpu=gpu,
            instance_type=instance_type,
            gpus=gpus_of(instance_type),
            created_at=created_at,
        )
    )


async def placed(session: AsyncSession, instance_id: uuid.UUID, cluster: str) -> None:
    await repository.set_cluster(session, instance_id, cluster)


async def started(session: AsyncSession, instance_id: uuid.UUID, at: datetime) -> None:
    """The instance is ready (Running): its interval starts, unless it started before."""
    await repository.set_started(session, instance_id, at)


async def ended(session: AsyncSession, instance_id: uuid.UUID, at: datetime) -> None:
    """The instance ended (failed, or its objects are gone): its interval closes, once."""
    await repository.set_ended(session, [instance_id], at)


async def deployment_removed(session: AsyncSession, deployment_id: uuid.UUID, at: datetime) -> None:
    """The deployment's records are removed: any interval of it still open closes."""
    await repository.set_deployment_ended(session, deployment_id, at)


def task_ended(
    session: AsyncSession,
    *,
    task_id: uuid.UUID,
    account_id: str,
    gpu: str,
    instance_type: str,
    cluster: str | None,
    launched_at: datetime,
    running_at: datetime | None,
    ended_at: datetime,
) -> None:
    """A task that was launched on a cluster ended: its whole interval in one row (a task's
    status changes to an end once; while it runs, its row in `tasks` is the open interval)."""
    session.add(
        GpuInterval(
            instance_id=task_id,
            account_id=account_id,
            task_id=task_id,
            gpu=gpu,
            instance_type=instance_type,
            cluster=cluster,
            gpus=gpus_of(instance_type),
            created_at=launched_at,
            started_at=running_at,
            ended_at=ended_at,
        )
    )
