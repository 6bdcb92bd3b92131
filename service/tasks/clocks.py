"""Pure decisions over (task, observation, now): the queued and runtime deadlines, the
progress file's rules (percentComplete 1-100 and non-decreasing, the heartbeat, 100 completes),
how the container ended, and the grace period of a stop. docs/tasks.md states them for
container authors."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from service.backends.worker_utils_pod import RESULT_NAME, RESULT_NAME_RULE
from service.health.observed import ObservedState, parse_time
from service.tasks.models import TaskStatus

#: NVCT: `lastUpdatedAt` more than this behind and not 100 -> ERRORED
HEARTBEAT_TIMEOUT = timedelta(minutes=5)
#: bytes of the progress file read at most
MAX_PROGRESS_BYTES = 64 * 1024
#: waiting reasons of the task container that end it (it cannot start)
FATAL_WAITING = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerError")


@dataclass(frozen=True)
class Progress:
    percent: int
    name: str | None
    metadata: dict[str, Any]
    last_updated_at: datetime


@dataclass(frozen=True)
class Clock:
    """What the decisions read of a task (its row's timestamps and limits)."""

    task_id: str
    status: TaskStatus
    created_at: datetime
    launched_at: datetime | None
    running_at: datetime | None
    max_queued: timedelta
    max_runtime: timedelta | None
    percent: int | None
    last_heartbeat_at: datetime | None


@dataclass(frozen=True)
class Container:
    """The task container as the cluster shows it."""

    started: bool = False
    waiting_reason: str = ""
    waiting_message: str = ""
    exit_code: int | None = None
    reason: str = ""  # the terminated state's or the pod's reason (OOMKilled, DeadlineExceeded)
    gone: bool = False  # the task's objects are no longer on the cluster


@dataclass(frozen=True)
class Decision:
    status: TaskStatus | None = None
    message: str = ""
    error: str | None = None
    progress: Progress | None = None
    events: tuple[str, ...] = field(default_factory=tuple)


#: the event of a task's move to RUNNING
STARTED = "Task container started"


def queued_expired(clock: Clock, now: datetime) -> bool:
    return queued_past(clock.created_at, clock.max_queued, now)


def queued_past(created_at: datetime, max_queued: timedelta, now: datetime) -> bool:
    """Whether a task created at `created_at` has waited its `maxQueuedDuration` by `now`."""
    return now >= created_at + max_queued


def parse_progress(raw: bytes, task_id: str) -> Progress | str:
    """The progress file, or why it is not one."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return "the progress file is not JSON"
    if not isinstance(data, dict):
        return "the progress file must hold a JSON object"
    problems: list[str] = []
    given_id = data.get("taskId")
    if given_id is not None and given_id != task_id:
        problems.append(f"taskId {str(given_id)[:64]!r} is not this task's id")
    percent = data.get("percentComplete")
    if isinstance(percent, bool) or not isinstance(percent, int) or not 1 <= percent <= 100:
        problems.append(
            f"percentComplete must be a whole number from 1 to 100, got {percent!r}"[:200]
        )
    name = data.get("name")
    if name is not None and (not isinstance(name, str) or not RESULT_NAME.fullmatch(name)):
        problems.append(f"name must be {RESULT_NAME_RULE}")
    metadata = data.get("metadata", {})
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        problems.append("metadata must be an object")
    updated = data.get("lastUpdatedAt")
    when = parse_time(updated) if isinstance(updated, str) else None
    if when is None:
        problems.append("lastUpdatedAt must be an RFC 3339 timestamp")
    if problems:
        return "; ".join(problems)
    assert isinstance(percent, int) and when is not None and isinstance(metadata, dict)
    return Progress(percent, name, metadata, when)


def container_of(observed: ObservedState, container: str) -> Container:
    """The task container's state from what the cluster shows (its Job's one pod)."""
    if observed.is_empty:
        return Container(gone=True)
    # a helm task's chart may run other pods beside its Job's: the Job's pod is the task
    pods = [p for p in observed.pods if p.owner_kind == "Job"] or list(observed.pods)
    if not pods:
        return Container()
    pod = pods[-1]
    statuses = pod.container_statuses
    status = next((c for c in statuses if c.name == container), statuses[0] if statuses else None)
    if status is None or status.state is None:
        if pod.phase == "Failed":
            return Container(started=True, exit_code=1, reason=pod.reason or "Failed")
        return Container()
    state = status.state
    if state.kind == "waiting":
        return Container(waiting_reason=state.reason, waiting_message=state.message)
    if state.kind == "running":
        return Container(started=True)
    return Container(
        started=True,
        exit_code=state.exit_code if state.exit_code is not None else 1,
        reason=state.reason or pod.reason,
    )


def decide(
    clock: Clock, container: Container, raw_progress: bytes | None, now: datetime
) -> Decision:
    """What happens to a launched or running task now."""
    progress: Progress | None = None
    if raw_progress is not None:
        parsed = parse_progress(raw_progress, clock.task_id)
        if isinstance(parsed, str):
            return _errored(f"malformed progress: {parsed}")
        if clock.percent is not None and parsed.percent < clock.percent:
            return _errored(
                f"percentComplete went down from {clock.percent} to {parsed.percent}: it must "
                "never decrease"
            )
        progress = parsed
    if progress is not None and progress.percent == 100:
        return Decision(
            TaskStatus.COMPLETED, "Task completed (percentComplete 100)", None, progress
        )
    if container.exit_code is not None:
        return Decision(*_ended(container), progress=progress)
    if container.gone and clock.status is TaskStatus.RUNNING:
        return Decision(
            TaskStatus.ERRORED,
            "Task errored: its objects are gone from the cluster",
            "the task's objects are gone from the cluster",
            progress,
        )
    if container.waiting_reason in FATAL_WAITING:
        why = f"{container.waiting_reason}: {container.waiting_message}".rstrip(": ")
        return Decision(TaskStatus.ERRORED, f"Task errored: {why}", why, progress)
    started = clock.running_at or (now if container.started else None)
    if clock.max_runtime is not None and started is not None and now >= started + clock.max_runtime:
        return Decision(
            TaskStatus.EXCEEDED_MAX_RUNTIME_DURATION,
            "Task ran longer than its maxRuntimeDuration",
            "exceeded maxRuntimeDuration",
            progress,
        )
    if clock.status is TaskStatus.LAUNCHED and not container.started:
        if queued_expired(clock, now):
            return Decision(
                TaskStatus.EXCEEDED_MAX_QUEUED_DURATION,
                "Task did not start within its maxQueuedDuration",
                "exceeded maxQueuedDuration before starting",
                progress,
            )
        return Decision(progress=progress)
    heartbeat = progress.last_updated_at if progress is not None else clock.last_heartbeat_at
    since = heartbeat or started
    if since is not None and now - since > HEARTBEAT_TIMEOUT:
        why = f"no heartbeat (progress lastUpdatedAt) since {since.isoformat()}"
        return Decision(TaskStatus.ERRORED, f"Task errored: {why}", why, progress)
    if clock.status is TaskStatus.LAUNCHED:
        return Decision(TaskStatus.RUNNING, STARTED, None, progress)
    return Decision(progress=progress)


def progress_refused(message: str) -> Decision:
    """The adapter refused (for good) to read the progress file: the task errors in its
    words."""
    return _errored(f"its progress file could not be read: {message}")


def _errored(why: str) -> Decision:
    return Decision(TaskStatus.ERRORED, f"Task errored: {why}", why)


def _ended(container: Container) -> tuple[TaskStatus, str, str]:
    code, reason = container.exit_code, container.reason
    if reason == "OOMKilled":
        why = f"the container was killed for running out of memory (OOMKilled, exit code {code})"
        return TaskStatus.ERRORED, f"Task errored: {why}", why
    if reason == "DeadlineExceeded":
        why = "the Job's activeDeadlineSeconds (maxRuntimeDuration) passed"
        return TaskStatus.EXCEEDED_MAX_RUNTIME_DURATION, f"Task stopped: {why}", why
    if code != 0:
        why = f"the container exited with code {code}" + (f" ({reason})" if reason else "")
        return TaskStatus.ERRORED, f"Task errored: {why}", why
    why = "the container exited without reporting percentComplete 100"
    return TaskStatus.ERRORED, f"Task errored: {why}", why
