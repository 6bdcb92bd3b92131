"""Instance health machine: every timeout row and immediate failure of runtime.md §5, both modes."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from service.health import (
    Condition,
    ContainerState,
    ContainerStatus,
    Controller,
    Event,
    HealthMode,
    HealthTimeouts,
    InstanceCondition,
    ObjectRef,
    ObservedState,
    Phase,
    Pod,
    evaluate,
)

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
DEFAULTS = HealthTimeouts()
WORKER: HealthMode = "StatusByWorkerReadiness"


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
) -> Pod:
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
        owner_kind="ReplicaSet",
        owner_name="web-5d4f8c",
        labels={"app": "web"},
        reason=reason,
        message=message,
        conditions=tuple(conditions),
        init_container_statuses=init,
        container_statuses=containers,
        restart_policy=restart_policy,
        created=T0,
        start_time=T0 if scheduled else None,
        node_name="node-0" if scheduled else "",
        worker=worker,
    )


def deployment(
    name: str = "web", *, desired: int = 1, ready: int = 1, conditions: tuple[Condition, ...] = ()
) -> Controller:
    return Controller(
        "Deployment",
        name,
        desired_replicas=desired,
        replicas=desired,
        ready_replicas=ready,
        available_replicas=ready,
        conditions=conditions,
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


# --------------------------------------------------------------------------- timeouts table

# (row, observed state, timeout seconds, phase while waiting, reason while waiting, failure reason)
TIMEOUT_ROWS: list[tuple[str, ObservedState, float, Phase, str, str]] = [
    (
        "pod scheduling",
        state(pod(scheduled=False)),
        DEFAULTS.pod_scheduling,
        Phase.SCHEDULING,
        "Unschedulable",
        "PodStuckScheduling",
    ),
    (
        "image pull",
        state(pod(containers=(container(waiting="ImagePullBackOff"),))),
        DEFAULTS.image_pull,
        Phase.STARTING,
        "ImagePullBackOff",
        "ImagePullIssues",
    ),
    (
        "image pull (ErrImagePull on an init container)",
        state(
            pod(
                initialized=False,
                init=(container("fetch", waiting="ErrImagePull", init=True),),
                containers=(container(waiting="PodInitializing"),),
            )
        ),
        DEFAULTS.image_pull,
        Phase.STARTING,
        "ImagePullBackOff",
        "ImagePullIssues",
    ),
    (
        "restart loop",
        state(
            pod(
                containers=(container(waiting="CrashLoopBackOff", restarts=3, last_exit=1),),
                phase="Running",
            )
        ),
        DEFAULTS.restart_loop,
        Phase.STARTING,
        "CrashLoopBackOff",
        "ContainersInRestartLoop",
    ),
    (
        "init stuck",
        state(
            pod(
                initialized=False,
                init=(container("migrate", running=True, init=True),),
                containers=(container(waiting="PodInitializing"),),
            )
        ),
        DEFAULTS.init,
        Phase.STARTING,
        "PodInitializing",
        "InitContainerStuck",
    ),
    (
        "worker startup",
        state(pod(ready=False)),
        DEFAULTS.worker_startup,
        Phase.STARTING,
        "ContainersNotReady",
        "WorkerStartupTimeout",
    ),
    (
        "pending (a controller never gets all replicas)",
        state(pod(ready=True), controllers=(deployment(desired=2, ready=1),)),
        DEFAULTS.pending,
        Phase.STARTING,
        "ObjectsNotReady",
        "ObjectsTimedOutPending",
    ),
    (
        "failing-objects backoff",
        state(
            pod(ready=False),
            events=(
                warning(
                    "FailedMount",
                    'MountVolume.SetUp failed for volume "model" : secret "hf-token" not found',
                ),
            ),
        ),
        DEFAULTS.failing_backoff,
        Phase.STARTING,
        "FailingObjects",
        "FailingObjects",
    ),
]


@pytest.mark.parametrize(
    ("observed", "timeout", "waiting_phase", "waiting_reason", "failure"),
    [row[1:] for row in TIMEOUT_ROWS],
    ids=[row[0] for row in TIMEOUT_ROWS],
)
def test_timeout_not_exceeded_then_exceeded(
    observed: ObservedState, timeout: float, waiting_phase: Phase, waiting_reason: str, failure: str
) -> None:
    first = evaluate(observed, None, T0)
    assert first.phase is waiting_phase
    assert first.reason == waiting_reason

    before = evaluate(observed, roundtrip(first), at(timeout - 1))
    assert before.phase is waiting_phase, before.message
    assert before.reason == waiting_reason
    assert not before.needs_replacement
    assert before.next_check is not None and before.next_check <= at(timeout)

    after = evaluate(observed, roundtrip(before), at(timeout + 1))
    assert after.phase is Phase.FAILED
    assert after.reason == failure
    assert after.needs_replacement
    assert "web-0" in after.message or "Deployment web" in after.message


def test_worker_degradation_after_having_been_ready() -> None:
    ready = evaluate(state(pod(ready=True)), None, T0)
    assert ready.phase is Phase.RUNNING

    not_ready = state(pod(ready=False))
    degraded = evaluate(not_ready, ready, at(10))
    assert (degraded.phase, degraded.reason) == (Phase.DEGRADED, "WorkerDegraded")
    assert "web-0 was ready and is now not ready" in degraded.message

    still = evaluate(not_ready, roundtrip(degraded), at(10 + DEFAULTS.worker_degradation - 1))
    assert still.phase is Phase.DEGRADED
    assert still.since == degraded.since

    failed = evaluate(not_ready, roundtrip(still), at(10 + DEFAULTS.worker_degradation + 1))
    assert (failed.phase, failed.reason) == (Phase.FAILED, "WorkerDegraded")
    assert failed.needs_replacement


def test_degraded_instance_that_recovers_is_running_again_and_its_timer_restarts() -> None:
    running = evaluate(state(pod(ready=True)), None, T0)
    degraded = evaluate(state(pod(ready=False)), running, at(100))
    recovered = evaluate(state(pod(ready=True)), degraded, at(1000))
    assert recovered.phase is Phase.RUNNING
    again = evaluate(state(pod(ready=False)), recovered, at(2000))
    # a fresh degradation period starts at 2000, not at 100
    assert (
        evaluate(state(pod(ready=False)), again, at(2000 + DEFAULTS.worker_degradation - 1)).phase
        is Phase.DEGRADED
    )


def test_image_pull_timer_restarts_when_the_problem_clears() -> None:
    pulling = state(pod(containers=(container(waiting="ErrImagePull"),)))
    creating = state(pod(containers=(container(waiting="ContainerCreating"),)))
    first = evaluate(pulling, None, T0)
    cleared = evaluate(creating, first, at(50))
    again = evaluate(pulling, cleared, at(100))
    assert evaluate(pulling, again, at(150)).phase is Phase.STARTING
    assert evaluate(pulling, again, at(161)).reason == "ImagePullIssues"


def test_a_restarted_container_that_is_ready_again_is_not_a_restart_loop() -> None:
    healthy = state(
        pod(
            ready=True, containers=(container(running=True, ready=True, restarts=5, last_exit=137),)
        )
    )
    first = evaluate(healthy, None, T0)
    assert evaluate(healthy, first, at(DEFAULTS.restart_loop * 3)).phase is Phase.RUNNING


def test_stale_failed_mount_event_does_not_count_once_the_pod_is_ready() -> None:
    observed = state(
        pod(ready=True), events=(warning("FailedMount", "timed out waiting for the condition"),)
    )
    first = evaluate(observed, None, T0)
    assert evaluate(observed, first, at(DEFAULTS.failing_backoff * 10)).phase is Phase.RUNNING


def test_failing_objects_are_rechecked_every_30_seconds() -> None:
    observed = state(
        pod(), events=(warning("FailedAttachVolume", "Multi-Attach error for volume pvc-1"),)
    )
    cond = evaluate(observed, None, T0)
    assert cond.next_check == at(DEFAULTS.failing_recheck)


def test_custom_timeouts_are_honoured() -> None:
    quick = HealthTimeouts(image_pull=0.5)
    pulling = state(pod(containers=(container(waiting="ImagePullBackOff"),)))
    first = evaluate(pulling, None, T0, quick)
    assert evaluate(pulling, first, at(0.4), quick).phase is Phase.STARTING
    assert evaluate(pulling, first, at(0.6), quick).reason == "ImagePullIssues"


# --------------------------------------------------------------------------- immediate failures

IMMEDIATE: list[tuple[str, ObservedState, str, str]] = [
    (
        "pod Failed (admission)",
        state(
            pod(
                ready=False,
                phase="Failed",
                reason="UnexpectedAdmissionError",
                message="Allocate failed due to no healthy devices present",
            ),
            pod("web-1", ready=True),
        ),
        "PodFailed",
        "UnexpectedAdmissionError",
    ),
    (
        "restartPolicy Never container exited non-zero",
        state(
            pod(
                restart_policy="Never",
                phase="Running",
                containers=(container(exit_code=2), container("side", running=True)),
            ),
            pod("web-1", ready=True),
        ),
        "ContainerFailed",
        "exited with code 2",
    ),
    (
        "Deployment ProgressDeadlineExceeded",
        state(
            pod(ready=True),
            controllers=(
                deployment(
                    conditions=(
                        Condition(
                            "Progressing",
                            "False",
                            "ProgressDeadlineExceeded",
                            'ReplicaSet "web-5d4f8c" has timed out progressing.',
                        ),
                    )
                ),
            ),
        ),
        "ProgressDeadlineExceeded",
        "timed out progressing",
    ),
    (
        "Deployment Progressing=False (other reason)",
        state(
            pod(ready=True),
            controllers=(deployment(conditions=(Condition("Progressing", "False"),)),),
        ),
        "DeploymentNotProgressing",
        "Deployment web",
    ),
    (
        "Deployment ReplicaFailure",
        state(
            pod(ready=True),
            controllers=(
                deployment(
                    conditions=(
                        Condition(
                            "ReplicaFailure",
                            "True",
                            "FailedCreate",
                            'pods "web-5d4f8c-x" is forbidden: exceeded quota',
                        ),
                    )
                ),
            ),
        ),
        "ReplicaFailure",
        "exceeded quota",
    ),
    (
        "ReplicaSet ReplicaFailure",
        state(
            pod(ready=True),
            controllers=(
                Controller(
                    "ReplicaSet",
                    "web-5d4f8c",
                    ready_replicas=1,
                    conditions=(
                        Condition("ReplicaFailure", "True", "FailedCreate", "quota exceeded"),
                    ),
                ),
            ),
        ),
        "ReplicaFailure",
        "ReplicaSet web-5d4f8c",
    ),
    (
        "Job Failed",
        state(
            pod(ready=True),
            controllers=(
                Controller(
                    "Job",
                    "warmup",
                    conditions=(
                        Condition(
                            "Failed",
                            "True",
                            "BackoffLimitExceeded",
                            "Job has reached the specified backoff limit",
                        ),
                    ),
                ),
            ),
        ),
        "JobFailed",
        "Job warmup failed (BackoffLimitExceeded)",
    ),
    (
        "warning event FailedCreate",
        state(
            pod(ready=True),
            events=(
                warning(
                    "FailedCreate", "Error creating: pods is forbidden", "ReplicaSet", "web-5d4f8c"
                ),
            ),
        ),
        "FailedCreate",
        "ReplicaSet web-5d4f8c",
    ),
    (
        "warning event FailedUpdate",
        state(
            pod(ready=True), events=(warning("FailedUpdate", "update failed", "StatefulSet", "db"),)
        ),
        "FailedUpdate",
        "StatefulSet db",
    ),
    (
        "warning event ReplicaSetCreateError",
        state(
            pod(ready=True),
            events=(
                warning(
                    "ReplicaSetCreateError", "Failed to create new replica set", "Deployment", "web"
                ),
            ),
        ),
        "ReplicaSetCreateError",
        "Deployment web",
    ),
    (
        "forbidden message on a tracked object",
        state(
            pod(ready=True),
            events=(
                warning(
                    "FailedCreatePodSandBox",
                    'serviceaccounts "default" is forbidden: User cannot get resource',
                ),
            ),
        ),
        "Forbidden",
        "web-0",
    ),
    (
        "rendered object missing",
        state(
            pod(ready=True),
            expected=frozenset({ObjectRef("Service", "web"), ObjectRef("ConfigMap", "settings")}),
            present=frozenset({ObjectRef("Service", "web")}),
        ),
        "ObjectMissing",
        "ConfigMap/settings",
    ),
]


@pytest.mark.parametrize(
    ("observed", "reason", "in_message"), [r[1:] for r in IMMEDIATE], ids=[r[0] for r in IMMEDIATE]
)
def test_immediate_failure_in_default_mode(
    observed: ObservedState, reason: str, in_message: str
) -> None:
    result = evaluate(observed, None, T0)
    assert result.phase is Phase.FAILED
    assert result.reason == reason
    assert in_message in result.message
    assert result.needs_replacement


@pytest.mark.parametrize(
    ("observed", "reason", "in_message"), [r[1:] for r in IMMEDIATE], ids=[r[0] for r in IMMEDIATE]
)
def test_other_objects_never_fail_in_worker_readiness_mode(
    observed: ObservedState, reason: str, in_message: str
) -> None:
    # the failing pod of the first two rows is not the inference worker here
    observed = replace(observed, pods=tuple(replace(p, worker=p.ready) for p in observed.pods))
    result = evaluate(observed, None, T0, mode=WORKER)
    assert result.phase is Phase.RUNNING
    assert reason in [o.reason for o in result.observations]
    later = evaluate(observed, result, at(DEFAULTS.pending * 2), mode=WORKER)
    assert later.phase is Phase.RUNNING


# --------------------------------------------------------------------------- phases and lifecycle


def test_scheduling_starting_running_and_since() -> None:
    cond = evaluate(state(pod(scheduled=False)), None, T0)
    assert cond.phase is Phase.SCHEDULING and cond.since == T0
    cond = evaluate(state(pod(containers=(container(waiting="ContainerCreating"),))), cond, at(5))
    assert cond.phase is Phase.STARTING and cond.since == at(5)
    cond = evaluate(state(pod(ready=False)), cond, at(9))
    assert cond.phase is Phase.STARTING and cond.since == at(5)
    cond = evaluate(state(pod(ready=True)), cond, at(12))
    assert (cond.phase, cond.since, cond.ever_running) == (Phase.RUNNING, at(12), True)
    assert cond.next_check is None


def test_no_pods_yet_is_scheduling() -> None:
    cond = evaluate(state(controllers=(deployment(ready=0),)), None, T0)
    assert cond.phase is Phase.SCHEDULING


def test_completed_job_pods_do_not_hold_the_instance_back() -> None:
    done = pod(
        "warmup-x7k2p",
        phase="Succeeded",
        ready=False,
        containers=(container(exit_code=0),),
        worker=False,
        restart_policy="Never",
    )
    job = Controller("Job", "warmup", succeeded=1, conditions=(Condition("Complete", "True"),))
    cond = evaluate(state(done, pod(ready=True), controllers=(job, deployment())), None, T0)
    assert cond.phase is Phase.RUNNING


def test_failed_is_terminal() -> None:
    failed = evaluate(state(pod(phase="Failed", reason="Evicted")), None, T0)
    assert failed.phase is Phase.FAILED
    assert evaluate(state(pod(ready=True)), failed, at(60)) is failed


def test_unplaced_instance_waits_for_capacity_then_fails() -> None:
    waiting = ObservedState.unplaced(
        "no cluster of nvcf-default has a free H100 node for NCP.GPU.H100_8x"
    )
    first = evaluate(waiting, None, T0)
    assert (first.phase, first.reason) == (Phase.SCHEDULING, "AwaitingCapacity")
    assert (
        evaluate(waiting, roundtrip(first), at(DEFAULTS.pod_scheduling - 1)).phase
        is Phase.SCHEDULING
    )
    failed = evaluate(waiting, roundtrip(first), at(DEFAULTS.pod_scheduling + 1))
    assert failed.reason == "PodStuckScheduling"
    assert "NCP.GPU.H100_8x" in failed.message


def test_restart_safety_timers_survive_persistence() -> None:
    pulling = state(pod(containers=(container(waiting="ImagePullBackOff"),)))
    first = evaluate(pulling, None, T0)
    # a reconciler restarted 50s later reads the stored condition and must not restart the clock
    stored = roundtrip(evaluate(pulling, first, at(50)))
    assert stored.timers["imagePull:uid-web-0"] == T0
    assert evaluate(pulling, stored, at(61)).reason == "ImagePullIssues"


def test_condition_json_is_plain_json() -> None:
    cond = evaluate(state(pod(scheduled=False)), None, T0)
    data = json.loads(json.dumps(cond.to_json()))
    assert data["phase"] == "Scheduling"
    assert data["needsReplacement"] is False
    assert data["observations"][0]["object"] == "Pod/web-0"
    assert InstanceCondition.from_json(data) == cond


# --------------------------------------------------------------------------- worker readiness mode


def test_worker_mode_runs_once_the_worker_is_ready_even_if_a_sidecar_is_broken() -> None:
    sidecar = pod(
        "otel-0",
        worker=False,
        containers=(container(waiting="CrashLoopBackOff", restarts=7, last_exit=137),),
        phase="Running",
    )
    observed = state(pod(ready=True), sidecar)
    cond = evaluate(observed, None, T0, mode=WORKER)
    assert cond.phase is Phase.RUNNING
    assert ("Pod/otel-0", "CrashLoopBackOff") in [(o.object, o.reason) for o in cond.observations]
    assert (
        evaluate(observed, cond, at(DEFAULTS.restart_loop * 10), mode=WORKER).phase is Phase.RUNNING
    )


def test_worker_mode_startup_timeout_applies_to_first_readiness() -> None:
    pulling = state(pod(containers=(container(waiting="ImagePullBackOff"),)))
    first = evaluate(pulling, None, T0, mode=WORKER)
    assert first.phase is Phase.STARTING
    # the image-pull timeout does not apply in this mode, only the worker startup one
    mid = evaluate(pulling, roundtrip(first), at(DEFAULTS.worker_startup - 1), mode=WORKER)
    assert mid.phase is Phase.STARTING
    assert mid.reason == "ImagePullBackOff"
    failed = evaluate(pulling, roundtrip(mid), at(DEFAULTS.worker_startup + 1), mode=WORKER)
    assert (failed.phase, failed.reason) == (Phase.FAILED, "WorkerStartupTimeout")


def test_worker_mode_without_worker_pods_times_out_at_startup() -> None:
    observed = state(pod("job-abc12", worker=False, ready=True))
    first = evaluate(observed, None, T0, mode=WORKER)
    assert first.phase is Phase.SCHEDULING
    failed = evaluate(observed, first, at(DEFAULTS.worker_startup + 1), mode=WORKER)
    assert failed.reason == "WorkerStartupTimeout"


def test_worker_mode_unschedulable_worker_fails_after_pod_scheduling_timeout() -> None:
    observed = state(pod(scheduled=False))
    first = evaluate(observed, None, T0, mode=WORKER)
    assert first.phase is Phase.SCHEDULING
    assert (
        evaluate(observed, first, at(DEFAULTS.pod_scheduling - 1), mode=WORKER).phase
        is Phase.SCHEDULING
    )
    assert (
        evaluate(observed, first, at(DEFAULTS.pod_scheduling + 1), mode=WORKER).reason
        == "PodStuckScheduling"
    )


def test_worker_mode_degraded_then_replaced() -> None:
    running = evaluate(state(pod(ready=True)), None, T0, mode=WORKER)
    not_ready = state(pod(ready=False))
    degraded = evaluate(not_ready, running, at(60), mode=WORKER)
    assert (degraded.phase, degraded.reason) == (Phase.DEGRADED, "WorkerDegraded")
    before = evaluate(
        not_ready, roundtrip(degraded), at(60 + DEFAULTS.worker_degradation - 1), mode=WORKER
    )
    assert before.phase is Phase.DEGRADED
    after = evaluate(
        not_ready, roundtrip(before), at(60 + DEFAULTS.worker_degradation + 1), mode=WORKER
    )
    assert (after.phase, after.reason, after.needs_replacement) == (
        Phase.FAILED,
        "WorkerDegraded",
        True,
    )


def test_worker_mode_recovery_clears_degradation() -> None:
    running = evaluate(state(pod(ready=True)), None, T0, mode=WORKER)
    degraded = evaluate(state(pod(ready=False)), running, at(60), mode=WORKER)
    back = evaluate(state(pod(ready=True)), degraded, at(600), mode=WORKER)
    assert back.phase is Phase.RUNNING
    assert "workerDegraded" not in back.timers


# --------------------------------------------------------------------------- real Kubernetes JSON

IMAGE_PULL_POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "mini-service-7c9d6b5f4-q2x8z",
        "namespace": "sr-0f4c",
        "uid": "4c1b2f0e-8a55-4a7e-9d43-2b1b3c9d7e11",
        "creationTimestamp": "2025-03-01T12:00:00Z",
        "labels": {"app.kubernetes.io/name": "mini-service", "pod-template-hash": "7c9d6b5f4"},
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": "mini-service-7c9d6b5f4",
                "uid": "x",
                "controller": True,
            }
        ],
    },
    "spec": {
        "restartPolicy": "Always",
        "nodeName": "gpu-node-3",
        "containers": [{"name": "triton", "image": "nvcr.io/bad/image:1"}],
    },
    "status": {
        "phase": "Pending",
        "startTime": "2025-03-01T12:00:02Z",
        "conditions": [
            {
                "type": "PodReadyToStartContainers",
                "status": "True",
                "lastTransitionTime": "2025-03-01T12:00:04Z",
            },
            {"type": "Initialized", "status": "True", "lastTransitionTime": "2025-03-01T12:00:02Z"},
            {
                "type": "Ready",
                "status": "False",
                "reason": "ContainersNotReady",
                "message": "containers with unready status: [triton]",
                "lastTransitionTime": "2025-03-01T12:00:02Z",
            },
            {
                "type": "ContainersReady",
                "status": "False",
                "reason": "ContainersNotReady",
                "message": "containers with unready status: [triton]",
                "lastTransitionTime": "2025-03-01T12:00:02Z",
            },
            {
                "type": "PodScheduled",
                "status": "True",
                "lastTransitionTime": "2025-03-01T12:00:02Z",
            },
        ],
        "containerStatuses": [
            {
                "name": "triton",
                "image": "nvcr.io/bad/image:1",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "started": False,
                "state": {
                    "waiting": {
                        "reason": "ImagePullBackOff",
                        "message": 'Back-off pulling image "nvcr.io/bad/image:1"',
                    }
                },
                "lastState": {},
            }
        ],
    },
}

FAILED_MOUNT_EVENT: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Event",
    "metadata": {"name": "mini-service-7c9d6b5f4-q2x8z.17f2a", "namespace": "sr-0f4c"},
    "involvedObject": {
        "kind": "Pod",
        "name": "mini-service-7c9d6b5f4-q2x8z",
        "namespace": "sr-0f4c",
    },
    "reason": "FailedMount",
    "message": 'MountVolume.SetUp failed for volume "cfg" : configmap "cfg" not found',
    "type": "Warning",
    "count": 4,
    "firstTimestamp": "2025-03-01T12:00:03Z",
    "lastTimestamp": "2025-03-01T12:01:10Z",
}


def test_kubernetes_json_is_parsed_into_the_model() -> None:
    observed = ObservedState.from_k8s(
        [IMAGE_PULL_POD],
        events=[FAILED_MOUNT_EVENT],
        worker_selector={"app.kubernetes.io/name": "mini-service"},
    )
    (p,) = observed.pods
    assert (p.owner_kind, p.owner_name, p.node_name, p.worker) == (
        "ReplicaSet",
        "mini-service-7c9d6b5f4",
        "gpu-node-3",
        True,
    )
    assert p.scheduled and p.initialized and not p.ready
    assert p.container_statuses[0].waiting_reason == "ImagePullBackOff"
    assert p.created == T0
    (ev,) = observed.events
    assert (ev.reason, ev.involved, ev.count, ev.last_time) == (
        "FailedMount",
        ObjectRef("Pod", "mini-service-7c9d6b5f4-q2x8z"),
        4,
        at(70),
    )
    first = evaluate(observed, None, T0)
    assert evaluate(observed, first, at(61)).reason == "ImagePullIssues"


def test_kubernetes_json_deployment_and_events_k8s_io_event() -> None:
    deployment_json = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "mini-service", "creationTimestamp": "2025-03-01T12:00:00Z"},
        "spec": {"replicas": 2},
        "status": {
            "replicas": 2,
            "readyReplicas": 1,
            "conditions": [
                {
                    "type": "ReplicaFailure",
                    "status": "True",
                    "reason": "FailedCreate",
                    "message": 'pods "mini-service-7c9d6b5f4-a" is forbidden: exceeded quota',
                }
            ],
        },
    }
    new_style_event = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "regarding": {"kind": "ReplicaSet", "name": "mini-service-7c9d6b5f4"},
        "reason": "FailedCreate",
        "note": "Error creating: pods is forbidden",
        "type": "Warning",
        "eventTime": "2025-03-01T12:00:05.000000Z",
    }
    observed = ObservedState.from_k8s([deployment_json], events=[new_style_event])
    (dep,) = observed.controllers
    assert (dep.desired_replicas, dep.ready_replicas, dep.ready) == (2, 1, False)
    assert observed.events[0].involved == ObjectRef("ReplicaSet", "mini-service-7c9d6b5f4")
    assert evaluate(observed, None, T0).reason == "ReplicaFailure"
