"""Conditions the reconciler decides without observing pods: an instance whose cluster is
unavailable, whose instance type cannot be parsed, or whose backend call failed. Pure
functions of (reason, previous condition, now), like the state machine itself."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any

from service.health.machine import InstanceCondition, Observation, Phase

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
