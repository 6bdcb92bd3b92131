"""Instance health state machine (runtime.md §5): observed state + previous condition + now → phase.

`evaluate` is pure: no clock, no I/O. Every timer start it needs is carried in the returned
`InstanceCondition` (and its JSON), so the reconciler can persist it and resume after a restart.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from service.health.checks import (
    ALL_POD_CHECKS,
    Scope,
    creating_pods,
    failing_objects,
    immediate_failures,
    is_live,
    pod_checks,
    pod_failure,
    replacements,
    unsatisfied,
)
from service.health.conditions import InstanceCondition, Observation, Phase
from service.health.observed import ObservedState, Pod
from service.health.timers import Failure, HealthTimeouts, Run, human_duration

#: what an evaluation judges: every object, or only the inference worker's readiness
HealthMode = Literal["default", "StatusByWorkerReadiness"]

# Which pending issue best explains a not-yet-running instance (lower first).
_ISSUE_RANK = {
    "Unschedulable": 0,
    "PodFailed": 1,
    "ImagePullBackOff": 1,
    "CreateContainerError": 1,
    "CreateContainerConfigError": 1,
    "CrashLoopBackOff": 1,
    "FailingObjects": 1,
    "WorkerDegraded": 2,
    "PodInitializing": 3,
    "PodPending": 4,
    "ContainersNotReady": 5,
    "ObjectsNotReady": 6,
}


def evaluate(
    observed: ObservedState,
    previous: InstanceCondition | None,
    now: datetime,
    timeouts: HealthTimeouts | None = None,
    mode: HealthMode = "default",
) -> InstanceCondition:
    """The instance's condition at `now`. Failed is terminal: a failed `previous` is returned."""
    if previous is not None and previous.phase is Phase.FAILED:
        return previous
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)  # e.g. read back from SQLite, which drops the zone
    run = Run(previous, now, timeouts or HealthTimeouts())
    ever_running = previous.ever_running if previous else False
    prev_ready = previous.ready_pods if previous else frozenset()
    present = {p.key for p in observed.pods}
    ready_pods = frozenset(
        {p.key for p in observed.pods if p.ready and not p.terminating}
        | {k for k in prev_ready if k in present}
    )
    try:
        if not observed.placed:
            return _unplaced(run, observed, ever_running, ready_pods)
        if mode == "StatusByWorkerReadiness":
            return _worker_mode(run, observed, prev_ready, ever_running, ready_pods)
        return _default_mode(run, observed, prev_ready, ever_running, ready_pods)
    except Failure as failure:
        return run.failed(failure, ever_running=ever_running, ready_pods=ready_pods)


def _unplaced(
    run: Run, observed: ObservedState, ever_running: bool, ready_pods: frozenset[str]
) -> InstanceCondition:
    detail = observed.placement_message or "no cluster has free capacity for the instance"
    if run.expired("unplaced", run.t.pod_scheduling):
        limit = human_duration(run.t.pod_scheduling)
        raise Failure(
            "PodStuckScheduling", f"instance could not be placed within {limit}: {detail}"
        )
    run.issues.append(Observation("Instance", "AwaitingCapacity", detail))
    return run.result(
        Phase.SCHEDULING,
        "AwaitingCapacity",
        detail,
        ever_running=ever_running,
        ready_pods=ready_pods,
    )


def _sorted(issues: list[Observation]) -> list[Observation]:
    return sorted(issues, key=lambda o: _ISSUE_RANK.get(o.reason, 9))


def _was_ready(pod: Pod, prev_ready: frozenset[str]) -> bool:
    """Seen Ready by an earlier evaluation, or Ready between two (its status says so)."""
    return pod.key in prev_ready or pod.was_ready_before


def _default_mode(
    run: Run,
    observed: ObservedState,
    prev_ready: frozenset[str],
    ever_running: bool,
    ready_pods: frozenset[str],
) -> InstanceCondition:
    """Every rendered object counts; any terminal state or expired timer fails the instance.
    What a controller manages is judged through the controller."""
    scope = Scope.of(observed)
    immediate, notes = immediate_failures(observed, scope)
    run.notes.extend(notes)
    if immediate:
        run.issues.extend(immediate)
        raise Failure(immediate[0].reason, immediate[0].message)

    replacements(run, observed, run.issues, enforce=True)
    live = [p for p in observed.pods if is_live(p)]
    judged = [p for p in live if p.name not in scope.cron_pods]
    for pod in live:
        if pod.name in scope.cron_pods:
            pod_checks(run, pod, _was_ready(pod, prev_ready), (), run.notes)
        else:
            pod_checks(run, pod, _was_ready(pod, prev_ready), ALL_POD_CHECKS, run.issues)
    failing_objects(run, observed, run.issues, True, scope)
    controllers = [c for c in observed.controllers if not scope.cron_run(c.kind, c.name)]
    for ctrl in controllers:
        if not ctrl.satisfied:
            run.issues.append(unsatisfied(run, observed, ctrl))
    if not judged:
        run.issues.append(Observation("Instance", "PodPending", "no pods have been created yet"))

    workers = [p for p in judged if p.worker] or judged
    if not run.issues and any(p.ready for p in workers):
        return run.result(
            Phase.RUNNING,
            "Ready",
            "all objects are ready",
            ever_running=True,
            ready_pods=ready_pods,
        )

    run.issues = _sorted(run.issues)
    first = run.issues[0]
    if run.expired("pending", run.t.pending):
        limit = human_duration(run.t.pending)
        raise Failure(
            "ObjectsTimedOutPending", f"objects still not ready after {limit}: {first.message}"
        )
    if ever_running:
        phase = Phase.DEGRADED
    elif (
        not judged
        or any(not p.scheduled for p in judged)
        or any(creating_pods(observed, c) for c in controllers)
    ):
        phase = Phase.SCHEDULING
    else:
        phase = Phase.STARTING
    return run.result(
        phase, first.reason, first.message, ever_running=ever_running, ready_pods=ready_pods
    )


def _worker_mode(
    run: Run,
    observed: ObservedState,
    prev_ready: frozenset[str],
    ever_running: bool,
    ready_pods: frozenset[str],
) -> InstanceCondition:
    """Only the inference worker's readiness counts; everything else is informational."""
    scope = Scope.of(observed)
    immediate, notes = immediate_failures(observed, scope)
    run.notes.extend(immediate + notes)
    replacements(run, observed, run.notes, enforce=False)
    live = [p for p in observed.pods if is_live(p)]
    workers = [p for p in live if p.worker]
    for pod in live:
        if pod.worker:
            # A worker that can never get a node can never become ready.
            pod_checks(run, pod, _was_ready(pod, prev_ready), {"scheduling"}, run.issues)
        else:
            pod_checks(run, pod, _was_ready(pod, prev_ready), (), run.notes)
    failing_objects(run, observed, run.notes, False, scope)

    if workers and all(p.ready for p in workers):
        return run.result(
            Phase.RUNNING,
            "WorkerReady",
            "the inference worker is ready",
            ever_running=True,
            ready_pods=ready_pods,
        )

    failed = [p for p in observed.pods if p.worker and not p.terminating and p.phase == "Failed"]
    if not workers:
        if failed:
            pod = failed[0]
            run.issues.append(
                pod_failure(pod) or Observation(str(pod.ref), "PodFailed", f"{pod.name} failed")
            )
        else:
            run.issues.append(
                Observation(
                    "Instance", "PodPending", "no inference worker pod has been created yet"
                )
            )
    run.issues = _sorted(run.issues)
    first = run.issues[0] if run.issues else None
    detail = first.message if first else "the inference worker is not ready"
    # A worker that was Ready between two evaluations has run: it is judged as degraded.
    flapped = [p for p in workers if not p.ready and _was_ready(p, prev_ready)]
    if not ever_running and not flapped:
        launches = [p.start_time for p in workers if p.start_time is not None]
        if run.expired("workerStartup", run.t.worker_startup, min(launches, default=None)):
            limit = human_duration(run.t.worker_startup)
            raise Failure(
                "WorkerStartupTimeout",
                f"the inference worker did not become ready within {limit}: {detail}",
            )
        unscheduled = (not workers and not failed) or any(not p.scheduled for p in workers)
        phase = Phase.SCHEDULING if unscheduled else Phase.STARTING
        reason = first.reason if first else "ContainersNotReady"
        return run.result(phase, reason, detail, ever_running=False, ready_pods=ready_pods)

    since = [t for p in flapped if (t := p.not_ready_since) is not None]
    if run.expired("workerDegraded", run.t.worker_degradation, min(since, default=None)):
        limit = human_duration(run.t.worker_degradation)
        raise Failure(
            "WorkerDegraded", f"the inference worker has not been ready for {limit}: {detail}"
        )
    return run.result(
        Phase.DEGRADED,
        "WorkerDegraded",
        f"the inference worker is not ready: {detail}",
        ever_running=True,
        ready_pods=ready_pods,
    )


#: the machine's callers read its types from here (or from `service.health`)
__all__ = ["HealthMode", "HealthTimeouts", "InstanceCondition", "Observation", "Phase", "evaluate"]
