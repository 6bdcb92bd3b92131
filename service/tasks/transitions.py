"""The one writer of a task's status: every change writes the status, its timestamps and a
`TaskEvent` in the caller's transaction. Nothing else assigns `Task.status`
(tests/tasks/test_transitions.py holds every module to it)."""

from __future__ import annotations

import logging
import secrets
import time
import uuid
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from service.metering import intervals
from service.tasks.models import ACTIVE, ON_CLUSTER, TERMINAL, Task, TaskEvent, TaskStatus

log = logging.getLogger("nvcf.tasks")

#: the statuses each status may move to
ALLOWED: dict[TaskStatus, frozenset[TaskStatus]] = {
    TaskStatus.QUEUED: frozenset(
        {
            TaskStatus.LAUNCHED,
            TaskStatus.CANCELED,
            TaskStatus.ERRORED,
            TaskStatus.EXCEEDED_MAX_QUEUED_DURATION,
        }
    ),
    TaskStatus.LAUNCHED: frozenset(TERMINAL) | {TaskStatus.RUNNING},
    TaskStatus.RUNNING: frozenset(TERMINAL) - {TaskStatus.EXCEEDED_MAX_QUEUED_DURATION},
}


class TransitionRefused(Exception):
    """The task is not in a status that may move to the one asked for."""


_last_ns = 0


def ordered_id() -> uuid.UUID:
    """A new id that sorts after every id this process made before (nanoseconds, then random
    bits): rows written at the same instant of a task's clock keep their order in lists."""
    global _last_ns
    _last_ns = max(time.time_ns(), _last_ns + 1)
    return uuid.UUID(int=(_last_ns << 64) | secrets.randbits(64))


def event(session: AsyncSession, task: Task, message: str, now: datetime) -> None:
    """Add a line to the task's timeline without changing its status (its last change
    moves to it, so no later line of its timeline comes before it)."""
    now = _not_before(task, now)
    task.updated_at = now
    session.add(
        TaskEvent(
            id=ordered_id(),
            task_id=task.id,
            account_id=task.account_id,
            message=message,
            created_at=now,
        )
    )


def touch(task: Task, now: datetime) -> None:
    """The task changed at `now` without a line of its own (its progress, say): its last change
    moves to it, never back (a pass's clock was read at its start, and another writer may have
    changed the task since)."""
    task.updated_at = _not_before(task, now)


def create(session: AsyncSession, task: Task, now: datetime) -> None:
    """A new task enters the queue."""
    task.status = TaskStatus.QUEUED.value
    task.created_at = task.updated_at = now
    task.queued_until = now + timedelta(seconds=task.max_queued_seconds)
    session.add(task)
    event(session, task, "Task created and queued", now)


def move(
    session: AsyncSession,
    task: Task,
    to: TaskStatus,
    now: datetime,
    message: str,
    *,
    error: str | None = None,
) -> None:
    """Change the task's status to `to` with its timestamps and an event; `error` is the
    reason shown in `healthInfo`."""
    current = TaskStatus(task.status)
    now = _not_before(task, now)
    if to not in ALLOWED.get(current, frozenset()):
        raise TransitionRefused(f"task {task.id} is {current.value}: cannot become {to.value}")
    task.status = to.value
    task.updated_at = now
    if to is TaskStatus.LAUNCHED:
        task.launched_at = now
    elif to is TaskStatus.RUNNING:
        task.running_at = now
    if to in TERMINAL:
        task.finished_at = now
        # its objects leave the cluster (a canceled one's after its grace period)
        task.teardown_pending = current in ON_CLUSTER
        if current in ON_CLUSTER:
            intervals.task_ended(
                session,
                task_id=task.id,
                account_id=task.account_id,
                gpu=task.gpu,
                instance_type=task.instance_type,
                cluster=task.cluster,
                launched_at=task.launched_at or now,
                running_at=task.running_at,
                ended_at=now,
            )
    if error is not None:
        task.health_error = error
    event(session, task, message, now)
    log.info("task %s: %s -> %s (%s)", task.id, current.value, to.value, message)


def _not_before(task: Task, now: datetime) -> datetime:
    """`now`, or the task's last change when that is later: a pass reads its clock once, so a
    task created or changed during the pass would otherwise get times before its own."""
    last: datetime | None = task.updated_at
    return now if last is None or now >= last else last


def is_active(task: Task) -> bool:
    return TaskStatus(task.status) in ACTIVE
