"""What the task loop reads of a task and carries between the steps of one pass: the task as
an instance of its cluster, its clocks, what a look at it showed (`Seen`), what taking it off
its cluster left (`Removed`); and the bounded walk that looks at a pass's tasks together."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from service.backends.protocol import InstanceSpec
from service.clusters.instance_types import parse_instance_type
from service.tasks.clocks import Clock, Decision
from service.tasks.models import Task, TaskStatus

#: tasks a pass observes or takes down at once
CONCURRENCY = 16
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Seen:
    """What one pass saw of a task, to be written with the others': the rules' decision, the
    secrets generation it was looking at, and whether the container had started."""

    task_id: uuid.UUID
    decision: Decision
    generation: int
    started: bool


@dataclass(frozen=True)
class Removed:
    """A task's objects taken off its cluster: the event saying how, and the last lines of
    its containers (`deployments.logs.keep.last_lines`), kept for its logs route."""

    message: str
    kept: list[dict[str, Any]]


def instance_of(task: Task) -> InstanceSpec:
    it = parse_instance_type(task.instance_type)
    return InstanceSpec(
        instance_id=str(task.id),
        function_id="",
        version_id="",
        instance_type=task.instance_type,
        gpu=it.gpu,
        gpus_per_node=it.gpus_per_node,
        nodes=it.nodes,
        cluster=task.cluster or "",
        nca_id=task.account_id,
        task=True,
    )


def clock_of(task: Task) -> Clock:
    return Clock(
        task_id=str(task.id),
        status=TaskStatus(task.status),
        created_at=task.created_at,
        launched_at=task.launched_at,
        running_at=task.running_at,
        max_queued=timedelta(seconds=task.max_queued_seconds),
        max_runtime=timedelta(seconds=task.max_runtime_seconds)
        if task.max_runtime_seconds is not None
        else None,
        percent=task.percent_complete,
        last_heartbeat_at=task.last_heartbeat_at,
    )


async def each(items: Sequence[T], work: Callable[[T], Awaitable[R]]) -> list[R]:
    """`work` on every item, at most `CONCURRENCY` at a time; the results in order."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(item: T) -> R:
        async with gate:
            return await work(item)

    async with asyncio.TaskGroup() as group:
        running = [group.create_task(one(item)) for item in items]
    return [r.result() for r in running]


def task_id_of(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


def progressed(task: Task, decision: Decision) -> bool:
    """Whether the progress file says something the task's row does not."""
    p = decision.progress
    return p is not None and (
        p.percent != task.percent_complete
        or p.last_updated_at != task.last_heartbeat_at
        or (p.name is not None and p.name != task.result_name)
        or p.metadata != (task.progress_metadata or {})
    )
