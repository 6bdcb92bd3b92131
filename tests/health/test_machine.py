"""Instance health machine: every timeout row and immediate failure of runtime.md §5, both modes."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from service.health import (
    Condition,
    Controller,
    HealthMode,
    HealthTimeouts,
    InstanceCondition,
    ObjectRef,
    ObservedState,
    Phase,
    evaluate,
)
from tests.support.health import (
    DEFAULTS,
    MODES,
    RESTARTED_ONCE,
    STANDALONE,
    T0,
    WORKER,
    at,
    container,
    deployment,
    job,
    pod,
    roundtrip,
    state,
    warning,
)

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
        "standalone pod Failed (admission)",
        state(
            pod(
                ready=False,
                phase="Failed",
                reason="UnexpectedAdmissionError",
                message="Allocate failed due to no healthy devices present",
                owner=STANDALONE,
            ),
            pod("web-1", ready=True),
        ),
        "PodFailed",
        "UnexpectedAdmissionError",
    ),
    (
        "standalone restartPolicy Never pod whose container exited non-zero",
        state(
            pod(
                restart_policy="Never",
                phase="Running",
                containers=(container(exit_code=2), container("side", running=True)),
                owner=STANDALONE,
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
        "Job Failed after its pods failed: judged through the Job, not the pods",
        state(
            pod(
                "warmup-a",
                phase="Failed",
                restart_policy="Never",
                containers=(container(exit_code=1),),
                owner=("Job", "warmup"),
            ),
            pod(ready=True),
            controllers=(job(failed=7, condition="Failed"),),
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
        "admission/quota refusal of a create (any reason, any controller)",
        state(
            pod(ready=True),
            events=(
                warning(
                    "FailedCreatePodGroup",
                    'Error creating: pods "lws-0" is forbidden: exceeded quota: gpu-quota',
                    "LeaderWorkerSet",
                    "lws",
                ),
            ),
        ),
        "FailedCreatePodGroup",
        "LeaderWorkerSet lws",
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
    failed = evaluate(state(pod(phase="Failed", reason="Evicted", owner=STANDALONE)), None, T0)
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


# ------------------------------------------------------------------------- 1. "forbidden" warnings

REGISTRY_403 = (
    'Failed to pull image "nvcr.io/org/app:1": failed to authorize: failed to fetch oauth '
    "token: unexpected status from GET request to https://nvcr.io/proxy_auth: 403 Forbidden"
)

# (row, observed, seconds after which default mode fails it or None, reason first, failure)
NOT_AT_ONCE: list[tuple[str, ObservedState, float | None, str, str]] = [
    (
        "FailedMount of a forbidden secret: failing-objects backoff",
        state(
            pod(),
            events=(
                warning(
                    "FailedMount",
                    'MountVolume.SetUp failed for volume "hf-token" : secrets "hf-token" is '
                    'forbidden: User "system:node:gpu-1" cannot get resource "secrets"',
                ),
            ),
        ),
        DEFAULTS.failing_backoff,
        "FailingObjects",
        "FailingObjects",
    ),
    (
        "registry 403 Forbidden while pulling: image-pull timeout",
        state(
            pod(containers=(container(waiting="ErrImagePull"),)),
            events=(warning("Failed", REGISTRY_403),),
        ),
        DEFAULTS.image_pull,
        "ImagePullBackOff",
        "ImagePullIssues",
    ),
    (
        "forbidden sandbox warning on a ready pod: informational",
        state(
            pod(ready=True),
            events=(
                warning(
                    "FailedCreatePodSandBox",
                    'serviceaccounts "default" is forbidden: User cannot get resource',
                ),
            ),
        ),
        None,
        "Ready",
        "",
    ),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("observed", "fails_after", "reason", "failure"),
    [r[1:] for r in NOT_AT_ONCE],
    ids=[r[0] for r in NOT_AT_ONCE],
)
def test_forbidden_warnings_do_not_fail_at_once(
    mode: HealthMode, observed: ObservedState, fails_after: float | None, reason: str, failure: str
) -> None:
    first = evaluate(observed, None, T0, mode=mode)
    assert first.phase is not Phase.FAILED, first.message
    if mode == "default":
        assert first.reason == reason
    end = fails_after if fails_after is not None else DEFAULTS.failing_backoff * 10
    before = evaluate(observed, roundtrip(first), at(end - 1), mode=mode)
    assert before.phase is not Phase.FAILED, before.message
    after = evaluate(observed, roundtrip(before), at(end + 1), mode=mode)
    if mode == "default" and fails_after is not None:
        assert (after.phase, after.reason) == (Phase.FAILED, failure)
    else:
        assert after.phase is not Phase.FAILED, after.message


# --------------------------------------------------------------------------- 2. clocks from launch

# A pod launched at T0 whose problem is first seen `seen` seconds later still fails at launch +
# timeout. (row, observed, seen, timeout, reason while waiting, failure in default mode,
# failure in worker-readiness mode, where only the worker's startup timeout applies)
CLOCK_ROWS: list[tuple[str, ObservedState, float, float, str, str, str | None]] = [
    (
        "image pull, first seen 50 s after launch",
        state(pod(containers=(container(waiting="ImagePullBackOff"),))),
        50,
        DEFAULTS.image_pull,
        "ImagePullBackOff",
        "ImagePullIssues",
        None,
    ),
    (
        "CreateContainerConfigError, like an image pull",
        state(pod(containers=(container(waiting="CreateContainerConfigError"),))),
        30,
        DEFAULTS.image_pull,
        "CreateContainerConfigError",
        "ContainerCreateIssues",
        None,
    ),
    (
        "CreateContainerError, like an image pull",
        state(pod(containers=(container(waiting="CreateContainerError"),))),
        0,
        DEFAULTS.image_pull,
        "CreateContainerError",
        "ContainerCreateIssues",
        None,
    ),
    (
        "restart loop, first seen 590 s after launch",
        state(
            pod(
                containers=(container(waiting="CrashLoopBackOff", restarts=3, last_exit=1),),
                phase="Running",
                ready_changed=T0,
            )
        ),
        590,
        DEFAULTS.restart_loop,
        "CrashLoopBackOff",
        "ContainersInRestartLoop",
        None,
    ),
    (
        "restarts of a container that is ready again count",
        state(
            pod(
                containers=(
                    container(running=True, ready=True, restarts=4, last_exit=137),
                    container("side", running=True),
                ),
                ready_changed=T0,
            )
        ),
        300,
        DEFAULTS.restart_loop,
        "CrashLoopBackOff",
        "ContainersInRestartLoop",
        None,
    ),
    (
        "init containers stuck, first seen 7000 s after launch",
        state(
            pod(
                initialized=False,
                init=(container("migrate", running=True, init=True),),
                containers=(container(waiting="PodInitializing"),),
            )
        ),
        7000,
        DEFAULTS.init,
        "PodInitializing",
        "InitContainerStuck",
        "WorkerStartupTimeout",
    ),
    (
        "pod still Pending after the init timeout",
        state(pod(containers=(container(waiting="ContainerCreating"),))),
        7000,
        DEFAULTS.init,
        "PodPending",
        "PodStuckPending",
        "WorkerStartupTimeout",
    ),
    (
        "never ready, first seen 7000 s after launch",
        state(pod(ready_changed=T0)),
        7000,
        DEFAULTS.worker_startup,
        "ContainersNotReady",
        "WorkerStartupTimeout",
        "WorkerStartupTimeout",
    ),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("observed", "seen", "timeout", "reason", "failure", "worker_failure"),
    [r[1:] for r in CLOCK_ROWS],
    ids=[r[0] for r in CLOCK_ROWS],
)
def test_pod_clocks_start_at_the_pod_launch(
    mode: HealthMode,
    observed: ObservedState,
    seen: float,
    timeout: float,
    reason: str,
    failure: str,
    worker_failure: str | None,
) -> None:
    first = evaluate(observed, None, at(seen), mode=mode)
    assert first.phase is Phase.STARTING, first.message
    if mode == "default":
        assert first.reason == reason
    before = evaluate(observed, roundtrip(first), at(timeout - 1), mode=mode)
    assert before.phase is Phase.STARTING, before.message
    after = evaluate(observed, roundtrip(before), at(timeout + 1), mode=mode)
    expected = failure if mode == "default" else worker_failure
    if expected is None:
        assert after.phase is Phase.STARTING, after.message
    else:
        assert (after.phase, after.reason) == (Phase.FAILED, expected), after.message


def test_worker_mode_startup_runs_from_the_worker_pod_launch() -> None:
    # created at T0, scheduled and launched only at 500 s
    first = evaluate(state(pod(scheduled=False)), None, T0, mode=WORKER)
    assert first.phase is Phase.SCHEDULING
    launched = state(pod(launched=at(500), ready_changed=at(500)))
    mid = evaluate(launched, roundtrip(first), at(600), mode=WORKER)
    assert mid.phase is Phase.STARTING
    end = 500 + DEFAULTS.worker_startup
    before = evaluate(launched, roundtrip(mid), at(end - 1), mode=WORKER)
    assert before.phase is Phase.STARTING, before.message
    after = evaluate(launched, roundtrip(before), at(end + 1), mode=WORKER)
    assert (after.phase, after.reason) == (Phase.FAILED, "WorkerStartupTimeout")


def test_a_ready_pod_is_not_in_a_restart_loop_however_often_it_restarted() -> None:
    ready = state(
        pod(ready=True, containers=(container(running=True, ready=True, restarts=9),)),
        controllers=(deployment(),),
    )
    assert evaluate(ready, None, at(DEFAULTS.restart_loop * 3)).phase is Phase.RUNNING


# --------------------------------------------------------------------------- 3. ready in between


@pytest.mark.parametrize("mode", MODES)
def test_ready_between_two_observations_is_judged_by_the_degradation_period(
    mode: HealthMode,
) -> None:
    # launched at T0, seen never ready at 60 s; seen again at 7100 s, its Ready condition
    # having gone False at 7000 s: it was ready in between, unseen
    starting = evaluate(state(pod(ready_changed=T0)), None, at(60), mode=mode)
    assert starting.phase is Phase.STARTING
    flapped = state(pod(ready_changed=at(7000)))
    seen = evaluate(flapped, roundtrip(starting), at(7100), mode=mode)
    assert seen.phase is (Phase.STARTING if mode == "default" else Phase.DEGRADED)
    assert seen.reason == "WorkerDegraded"
    end = 7000 + DEFAULTS.worker_degradation
    before = evaluate(flapped, roundtrip(seen), at(end - 1), mode=mode)
    assert (before.phase, before.reason) == (seen.phase, "WorkerDegraded"), before.message
    after = evaluate(flapped, roundtrip(before), at(end + 1), mode=mode)
    assert (after.phase, after.reason) == (Phase.FAILED, "WorkerDegraded")


# (row, pod, failure when first seen 7300 s after launch, past the startup timeout, or None)
EARLIER_READINESS: list[tuple[str, Any, str | None]] = [
    ("Ready went False after launch", pod(ready_changed=at(7000)), None),
    ("a restarted container, no Ready timestamp", pod(containers=RESTARTED_ONCE), None),
    ("Ready False since launch (within 1 s)", pod(ready_changed=at(1)), "WorkerStartupTimeout"),
    (
        "restarted, but Ready False since launch",
        pod(containers=RESTARTED_ONCE, ready_changed=at(0.5)),
        "WorkerStartupTimeout",
    ),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("observed_pod", "failure"),
    [r[1:] for r in EARLIER_READINESS],
    ids=[r[0] for r in EARLIER_READINESS],
)
def test_earlier_readiness_is_read_from_the_pod_status(
    mode: HealthMode, observed_pod: Any, failure: str | None
) -> None:
    cond = evaluate(state(observed_pod), None, at(7300), mode=mode)
    if failure is None:
        assert cond.phase is not Phase.FAILED and cond.reason == "WorkerDegraded", cond.message
        later = evaluate(state(observed_pod), roundtrip(cond), at(7300 + 60), mode=mode)
        assert later.reason == "WorkerDegraded"
    else:
        assert (cond.phase, cond.reason) == (Phase.FAILED, failure)


# --------------------------------------------------------------------------- 4. controllers judge

REPLICA_SET = Controller(
    "ReplicaSet",
    "web-5d4f8c",
    replicas=1,
    ready_replicas=1,
    available_replicas=1,
    owner_kind="Deployment",
    owner_name="web",
)


def evicted(name: str, owner: tuple[str, str] = ("ReplicaSet", "web-5d4f8c")) -> Any:
    return pod(
        name,
        phase="Failed",
        reason="Evicted",
        message="The node was low on resource: memory.",
        containers=(container(exit_code=137),),
        owner=owner,
    )


def shut_down(name: str) -> Any:
    """A ReplicaSet's pod ended by a graceful node shutdown (an eviction is only noted)."""
    return pod(
        name,
        phase="Failed",
        reason="Terminated",
        message="Pod was terminated in response to imminent node shutdown.",
        containers=(container(exit_code=137),),
    )


def job_pod(name: str, job_name: str = "warmup", *, failed: bool = False) -> Any:
    return pod(
        name,
        phase="Failed" if failed else "Succeeded",
        restart_policy="Never",
        containers=(container(exit_code=1 if failed else 0),),
        owner=("Job", job_name),
        worker=False,
    )


# (row, observed, object of the failure that is only noted)
JUDGED_BY_CONTROLLER: list[tuple[str, ObservedState, str]] = [
    (
        "evicted pod its ReplicaSet has replaced",
        state(
            evicted("web-old"),
            pod("web-new", ready=True),
            controllers=(deployment(), REPLICA_SET),
        ),
        "Pod/web-old",
    ),
    (
        "Job that succeeded after a failed pod, within its backoffLimit",
        state(
            job_pod("warmup-a", failed=True),
            job_pod("warmup-b"),
            pod(ready=True),
            controllers=(deployment(), job(succeeded=1, failed=1, condition="Complete")),
        ),
        "Pod/warmup-a",
    ),
    (
        "failed run of a CronJob",
        state(
            job_pod("nightly-2900-x", "nightly-2900", failed=True),
            pod(ready=True),
            controllers=(
                deployment(),
                Controller("CronJob", "nightly"),
                job("nightly-2900", failed=7, condition="Failed", owner=("CronJob", "nightly")),
            ),
        ),
        "Job/nightly-2900",
    ),
    (
        "running CronJob run",
        state(
            pod("nightly-2901-y", owner=("Job", "nightly-2901"), worker=False),
            pod(ready=True),
            controllers=(
                deployment(),
                Controller("CronJob", "nightly"),
                job("nightly-2901", active=1, owner=("CronJob", "nightly")),
            ),
        ),
        "",
    ),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("observed", "noted"),
    [r[1:] for r in JUDGED_BY_CONTROLLER],
    ids=[r[0] for r in JUDGED_BY_CONTROLLER],
)
def test_what_a_controller_manages_is_judged_through_it(
    mode: HealthMode, observed: ObservedState, noted: str
) -> None:
    cond = evaluate(observed, None, T0, mode=mode)
    assert cond.phase is Phase.RUNNING, cond.message
    if noted:
        assert noted in [o.object for o in cond.observations]
    later = evaluate(observed, roundtrip(cond), at(DEFAULTS.pending * 2), mode=mode)
    assert later.phase is Phase.RUNNING, later.message


# (row, observed: a failed pod its controller has not replaced yet)
NOT_REPLACED: list[tuple[str, ObservedState]] = [
    ("ReplicaSet pod", state(shut_down("web-old"), controllers=(deployment(ready=0),))),
    (
        "StatefulSet pod, one of two",
        state(
            evicted("db-0", ("StatefulSet", "db")),
            pod("db-1", ready=True, owner=("StatefulSet", "db")),
            controllers=(
                Controller(
                    "StatefulSet",
                    "db",
                    desired_replicas=2,
                    replicas=2,
                    ready_replicas=1,
                    available_replicas=1,
                ),
            ),
        ),
    ),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("observed", [r[1] for r in NOT_REPLACED], ids=[r[0] for r in NOT_REPLACED])
def test_a_failed_pod_not_yet_replaced_fails_after_the_failing_objects_backoff(
    mode: HealthMode, observed: ObservedState
) -> None:
    first = evaluate(observed, None, T0, mode=mode)
    assert first.phase is not Phase.FAILED, first.message
    if mode == "default":
        assert first.reason == "PodFailed" and "waiting for" in first.message
        assert first.next_check == at(DEFAULTS.failing_recheck)
    before = evaluate(observed, roundtrip(first), at(DEFAULTS.failing_backoff - 1), mode=mode)
    assert before.phase is not Phase.FAILED, before.message
    after = evaluate(observed, roundtrip(before), at(DEFAULTS.failing_backoff + 1), mode=mode)
    if mode == "default":
        assert (after.phase, after.reason) == (Phase.FAILED, "PodFailed")
        assert "did not replace it within 1m 30s" in after.message
    else:
        assert after.phase is not Phase.FAILED, after.message


# --------------------------------------------------------------------------- 5. what holds Running


def test_a_running_job_holds_the_instance_until_it_completes() -> None:
    retrying = state(
        pod(ready=True),
        job_pod("warmup-a", failed=True),
        pod("warmup-b", ready=True, owner=("Job", "warmup"), worker=False, restart_policy="Never"),
        controllers=(deployment(), job(active=1, failed=1)),
    )
    first = evaluate(retrying, None, T0)
    assert (first.phase, first.reason) == (Phase.STARTING, "ObjectsNotReady")
    assert "Job warmup has not completed yet: 1 active" in first.message
    done = state(
        pod(ready=True),
        job_pod("warmup-a", failed=True),
        job_pod("warmup-b"),
        controllers=(deployment(), job(succeeded=1, failed=1, condition="Complete")),
    )
    assert evaluate(done, roundtrip(first), at(30)).phase is Phase.RUNNING
    # in worker-readiness mode only the worker counts
    assert evaluate(retrying, None, T0, mode=WORKER).phase is Phase.RUNNING


def test_replicas_count_once_available_after_min_ready_seconds() -> None:
    ready = pod(ready=True, ready_changed=at(100))
    rs = replace(REPLICA_SET, available_replicas=0)
    waiting = state(ready, controllers=(deployment(available=0, min_ready=30), rs))
    cond = evaluate(waiting, None, at(110))
    assert (cond.phase, cond.reason) == (Phase.STARTING, "ObjectsNotReady")
    assert "0/1 available replicas (1 ready" in cond.message
    assert cond.next_check == at(130)
    available = state(ready, controllers=(deployment(min_ready=30), REPLICA_SET))
    assert evaluate(available, roundtrip(cond), at(130)).phase is Phase.RUNNING


def test_a_stateful_set_counts_available_replicas() -> None:
    db = Controller(
        "StatefulSet", "db", desired_replicas=1, replicas=1, ready_replicas=1, available_replicas=0
    )
    cond = evaluate(
        state(pod("db-0", ready=True, owner=("StatefulSet", "db")), controllers=(db,)), None, T0
    )
    assert (cond.phase, cond.reason) == (Phase.STARTING, "ObjectsNotReady")
    assert "StatefulSet db has 0/1 available replicas" in cond.message


def sts(policy: str, replicas: int) -> Controller:
    return Controller(
        "StatefulSet", "db", desired_replicas=3, replicas=replicas, pod_management_policy=policy
    )


# (row, observed, phase in default mode)
CREATING_ROWS: list[tuple[str, ObservedState, Phase]] = [
    (
        "Deployment created 1 of 2 pods",
        state(pod(), controllers=(deployment(desired=2, created=1, ready=0),)),
        Phase.SCHEDULING,
    ),
    (
        "Deployment whose current ReplicaSet created its pod",
        state(
            pod(),
            controllers=(deployment(created=0, ready=0), replace(REPLICA_SET, ready_replicas=0)),
        ),
        Phase.STARTING,
    ),
    (
        "Deployment created both pods",
        state(pod(), pod("web-1"), controllers=(deployment(desired=2, ready=0),)),
        Phase.STARTING,
    ),
    (
        "Parallel StatefulSet created 1 of 3 pods",
        state(pod("db-0", owner=("StatefulSet", "db")), controllers=(sts("Parallel", 1),)),
        Phase.SCHEDULING,
    ),
    (
        "OrderedReady StatefulSet creates one pod at a time",
        state(pod("db-0", owner=("StatefulSet", "db")), controllers=(sts("OrderedReady", 1),)),
        Phase.STARTING,
    ),
    (
        "Job without a running pod yet",
        state(pod(ready=True), controllers=(deployment(), job())),
        Phase.SCHEDULING,
    ),
]


@pytest.mark.parametrize(
    ("observed", "phase"), [r[1:] for r in CREATING_ROWS], ids=[r[0] for r in CREATING_ROWS]
)
def test_scheduling_while_a_controller_has_created_fewer_pods_than_it_runs(
    observed: ObservedState, phase: Phase
) -> None:
    assert evaluate(observed, None, T0).phase is phase


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
    # the image-pull clock runs from the pod's startTime (12:00:02), not from T0
    assert evaluate(observed, first, at(61)).reason == "ImagePullBackOff"
    assert evaluate(observed, first, at(62)).reason == "ImagePullIssues"


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
