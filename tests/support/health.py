"""Builders of observed states for the health machine's tests: pods, containers, controllers
and warning events as a backend would report them, on a fixed clock (`T0`, `at`)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from service.health import (
    Condition,
    ContainerState,
    ContainerStatus,
    Controller,
    Event,
    HealthMode,
    HealthTimeouts,
    InstanceCondition,
    ObservedState,
    Pod,
)

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
DEFAULTS = HealthTimeouts()
WORKER: HealthMode = "StatusByWorkerReadiness"
MODES: tuple[HealthMode, ...] = ("default", WORKER)
RS = ("ReplicaSet", "web-5d4f8c")
STANDALONE = ("", "")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def container(
    name: str = "main",
    *,
    waiting: str = "",
    running: bool = False,
    exit_code: int | None = None,
    restarts: int = 0,
    ready: bool = False,
    last_exit: int | None = None,
    init: bool = False,
) -> ContainerStatus:
    if waiting:
        state = ContainerState("waiting", reason=waiting, message=f"{waiting} details")
    elif exit_code is not None:
        state = ContainerState(
            "terminated", reason="Error" if exit_code else "Completed", exit_code=exit_code
        )
    elif running:
        state = ContainerState("running", started_at=T0)
    else:
        state = ContainerState("waiting", reason="ContainerCreating")
    last = (
        None
        if last_exit is None
        else ContainerState("terminated", reason="Error", exit_code=last_exit)
    )
    return ContainerStatus(
        name,
        ready=ready,
        restart_count=restarts,
        state=state,
        last_state=last,
        image="nvcr.io/org/app:1",
        init=init,
    )


def pod(
    name: str = "web-0",
    *,
    scheduled: bool = True,
    initialized: bool = True,
    ready: bool = False,
    phase: str | None = None,
    containers: tuple[ContainerStatus, ...] | None = None,
    init: tuple[ContainerStatus, ...] = (),
    restart_policy: str = "Always",
    worker: bool = True,
    reason: str = "",
    message: str = "",
    owner: tuple[str, str] = RS,
    created: datetime = T0,
    launched: datetime | None = None,
    ready_changed: datetime | None = None,
) -> Pod:
    """A pod as the kubelet reports it. `launched` is its `startTime` (default: `created` once
    scheduled); `ready_changed` the `lastTransitionTime` of its Ready condition (absent by
    default, as in a status that omits it)."""
    conditions: list[Condition] = []
    if scheduled:
        conditions.append(Condition("PodScheduled", "True"))
        conditions.append(Condition("Initialized", "True" if initialized else "False"))
        ready_status = "True" if ready else "False"
        conditions.append(Condition("ContainersReady", ready_status))
        conditions.append(
            Condition(
                "Ready",
                ready_status,
                "" if ready else "ContainersNotReady",
                "" if ready else "containers with unready status: [main]",
                ready_changed,
            )
        )
    else:
        conditions.append(
            Condition(
                "PodScheduled",
                "False",
                "Unschedulable",
                "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
            )
        )
    if phase is None:
        phase = "Running" if scheduled and initialized and containers is None else "Pending"
        if containers is not None and any(
            c.state and c.state.kind == "running" for c in containers
        ):
            phase = "Running"
    if containers is None:
        containers = (container(running=scheduled and initialized, ready=ready),)
    return Pod(
        name=name,
        uid=f"uid-{name}",
        phase=phase,
        owner_kind=owner[0],
        owner_name=owner[1],
        labels={"app": "web"},
        reason=reason,
        message=message,
        conditions=tuple(conditions),
        init_container_statuses=init,
        container_statuses=containers,
        restart_policy=restart_policy,
        created=created,
        start_time=(launched or created) if scheduled else None,
        node_name="node-0" if scheduled else "",
        worker=worker,
    )


def deployment(
    name: str = "web",
    *,
    desired: int = 1,
    ready: int = 1,
    available: int | None = None,
    created: int | None = None,
    min_ready: int = 0,
    conditions: tuple[Condition, ...] = (),
) -> Controller:
    """A Deployment with `desired` replicas, `created` pods (default: all) of which `ready` are
    ready and `available` (default: the ready ones) available."""
    return Controller(
        "Deployment",
        name,
        desired_replicas=desired,
        replicas=desired if created is None else created,
        ready_replicas=ready,
        available_replicas=ready if available is None else available,
        min_ready_seconds=min_ready,
        conditions=conditions,
    )


def job(
    name: str = "warmup",
    *,
    active: int = 0,
    succeeded: int = 0,
    failed: int = 0,
    condition: str = "",
    owner: tuple[str, str] = STANDALONE,
) -> Controller:
    """A Job; `condition` is `Complete` or `Failed` once it has finished."""
    conditions: tuple[Condition, ...] = ()
    if condition == "Failed":
        conditions = (
            Condition(
                "Failed",
                "True",
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
            ),
        )
    elif condition:
        conditions = (Condition(condition, "True"),)
    return Controller(
        "Job",
        name,
        active=active,
        succeeded=succeeded,
        failed=failed,
        conditions=conditions,
        owner_kind=owner[0],
        owner_name=owner[1],
    )


def warning(reason: str, message: str, kind: str = "Pod", name: str = "web-0") -> Event:
    return Event(reason, message, kind, name, first_time=T0, last_time=T0)


def state(
    *pods: Pod, controllers: tuple[Controller, ...] = (), events: tuple[Event, ...] = (), **kw: Any
) -> ObservedState:
    return ObservedState(pods=pods, controllers=controllers, events=events, **kw)


def roundtrip(cond: InstanceCondition) -> InstanceCondition:
    """What the reconciler reads back from the database after a restart."""
    return InstanceCondition.from_json(json.loads(json.dumps(cond.to_json())))


#: a container that has restarted once (its last run ended with exit code 137)
RESTARTED_ONCE = (container(running=True, restarts=1, last_exit=137),)
