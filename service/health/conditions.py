"""An instance's condition (runtime.md §5): its phase, what explains it and what the state
machine remembers between evaluations (`InstanceCondition`, persisted as JSON), and the
conditions the reconciler decides without observing pods: an instance whose cluster is
unavailable, whose instance type cannot be parsed, or whose backend call failed. Pure
functions of (reason, previous condition, now), like the state machine itself."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from service.health.observed import parse_time


class Phase(StrEnum):
    SCHEDULING = "Scheduling"
    STARTING = "Starting"
    RUNNING = "Running"
    DEGRADED = "Degraded"
    FAILED = "Failed"


@dataclass(frozen=True)
class Observation:
    """A notable fact about one object (`Pod/web-0`), e.g. why the instance is not running."""

    object: str
    reason: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"object": self.object, "reason": self.reason, "message": self.message}


@dataclass(frozen=True)
class InstanceCondition:
    """The health of one instance, plus what the machine must remember between evaluations.

    `timers` maps a check (e.g. `imagePull:<pod uid>`) to when its clock started: the pod's
    launch, or the first evaluation that saw the condition when the cluster reports no start.
    `ready_pods` are the pods seen Ready at least once; `ever_running` whether the instance
    reached Running. `observations` explain the phase (in StatusByWorkerReadiness mode they also
    list other objects' problems, which never fail the instance). `next_check` is the earliest
    moment a timer could change the outcome, for the reconciler to wake up.
    """

    phase: Phase
    reason: str
    message: str
    since: datetime
    ever_running: bool = False
    ready_pods: frozenset[str] = frozenset()
    timers: Mapping[str, datetime] = field(default_factory=dict)
    observations: tuple[Observation, ...] = ()
    next_check: datetime | None = None

    @property
    def needs_replacement(self) -> bool:
        """A failed instance is torn down (and replaced once its version has been ACTIVE)."""
        return self.phase is Phase.FAILED

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": self.phase.value,
            "reason": self.reason,
            "message": self.message,
            "since": self.since.isoformat(),
            "everRunning": self.ever_running,
            "readyPods": sorted(self.ready_pods),
            "timers": {k: v.isoformat() for k, v in sorted(self.timers.items())},
            "observations": [o.to_json() for o in self.observations],
            "nextCheck": self.next_check.isoformat() if self.next_check else None,
            "needsReplacement": self.needs_replacement,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> InstanceCondition:
        since = parse_time(data.get("since"))
        if since is None:
            raise ValueError("instance condition without a valid 'since'")
        timers: dict[str, datetime] = {}
        for key, value in dict(data.get("timers") or {}).items():
            parsed = parse_time(value)
            if parsed is not None:
                timers[str(key)] = parsed
        return cls(
            phase=Phase(data["phase"]),
            reason=str(data.get("reason", "")),
            message=str(data.get("message", "")),
            since=since,
            ever_running=bool(data.get("everRunning", False)),
            ready_pods=frozenset(str(p) for p in data.get("readyPods") or ()),
            timers=timers,
            observations=tuple(
                Observation(str(o["object"]), str(o["reason"]), str(o["message"]))
                for o in data.get("observations") or ()
            ),
            next_check=parse_time(data.get("nextCheck")),
        )


#: the timer of a retryable backend error (kept in the condition across evaluations)
BACKEND_TIMER = "backend"


def previous_condition(stored: dict[str, Any] | None) -> InstanceCondition | None:
    """The stored condition JSON as a condition; None when absent or unreadable."""
    if not stored:
        return None
    try:
        return InstanceCondition.from_json(stored)
    except (ValueError, KeyError, TypeError):
        return None


def failed(
    reason: str, message: str, now: datetime, previous: InstanceCondition | None
) -> InstanceCondition:
    """A terminal condition decided by the reconciler itself (e.g. `ClusterUnavailable`)."""
    return InstanceCondition(
        phase=Phase.FAILED,
        reason=reason,
        message=message,
        since=now,
        ever_running=previous.ever_running if previous else False,
        ready_pods=previous.ready_pods if previous else frozenset(),
        observations=(Observation("Instance", reason, message),),
    )


def backend_error(
    message: str,
    *,
    retryable: bool,
    previous: InstanceCondition | None,
    phase: Phase,
    now: datetime,
    failing_backoff: float,
) -> InstanceCondition:
    """A failed backend call: non-retryable errors fail the instance at once; retryable ones
    after the failing-objects backoff, counted from the first error of the streak."""
    if not retryable:
        return failed("BackendError", message, now, previous)
    began = (previous.timers.get(BACKEND_TIMER) if previous else None) or now
    if (now - began).total_seconds() >= failing_backoff:
        return failed(
            "BackendError", f"{message} (failing for {failing_backoff:g}s)", now, previous
        )
    base = previous or InstanceCondition(
        phase=phase, reason="BackendError", message=message, since=now
    )
    return dataclasses.replace(
        base,
        reason="BackendError",
        message=f"{message} (retrying)",
        timers={**base.timers, BACKEND_TIMER: began},
        next_check=began + timedelta(seconds=failing_backoff),
    )
