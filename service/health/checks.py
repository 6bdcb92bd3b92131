"""What holds an instance back, object by object (runtime.md §5): failed and not-ready pods,
controllers that could not create what they manage, failing objects, unsatisfied controllers.
Each check records what it finds in an evaluation's `Run` and raises `Failure` when the instance
fails, at once or when an enforced timer has expired.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

from service.health.conditions import Observation
from service.health.observed import Controller, Event, ObjectRef, ObservedState, Pod
from service.health.timers import Failure, Run, human_duration

IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff"})
#: a container the kubelet cannot create (bad command, missing ConfigMap/Secret key…): judged
#: like an image that cannot be pulled, after the same timeout
CREATE_CONTAINER_REASONS = frozenset({"CreateContainerError", "CreateContainerConfigError"})
#: warning events that fail the instance at once: a controller could not create or update
#: what it manages (NVCA's `parseErrorEventMessage`)
TERMINAL_EVENT_REASONS = frozenset({"FailedCreate", "FailedUpdate", "ReplicaSetCreateError"})
TRANSIENT_EVENT_REASONS = frozenset({"FailedMount", "FailedAttachVolume", "FailedMapVolume"})
RESTART_LOOP_THRESHOLD = 3
#: a pod the kubelet refused to admit (a device plugin could not give it its GPUs): fails the
#: instance at once, whoever owns the pod (helm-functions document, immediate failures)
ADMISSION_REJECTED = "UnexpectedAdmissionError"
#: a pod the kubelet evicted (node pressure): its ReplicaSet replaces it; alone it never fails
#: the instance (the ReplicaSet's own conditions say when replacing fails)
EVICTED = "Evicted"
#: controllers that replace a failed pod by a new one: they, not the pod, are judged
REPLACING_OWNERS = frozenset({"ReplicaSet", "StatefulSet"})
#: an admission webhook or a quota refusing a controller's create, whatever the event's reason
#: (`Error creating: pods "x" is forbidden: exceeded quota`, `create Pod db-0 in StatefulSet db
#: failed error: admission webhook "v" denied the request`)
_CREATE_REFUSED = re.compile(
    r"(error creating|create\b.*\bfailed)\b.*\b(forbidden|denied the request|exceeded quota)",
    re.IGNORECASE | re.DOTALL,
)

# Timer-guarded checks a pod can be subject to (names used for `enforced` below).
ALL_POD_CHECKS = frozenset(
    {
        "scheduling",
        "imagePull",
        "createContainer",
        "restartLoop",
        "init",
        "pending",
        "notReady",
        "startup",
    }
)


def is_live(pod: Pod) -> bool:
    """A pod that runs or will: not being deleted, not finished (Succeeded or Failed)."""
    return not pod.terminating and pod.phase not in ("Succeeded", "Failed")


@dataclass(frozen=True)
class Scope:
    """What a CronJob runs: its Jobs and their pods are judged through the CronJob, which a
    failed run does not fail (NVCA reports a CronJob as succeeded whatever its runs did)."""

    cron_jobs: frozenset[str]
    cron_pods: frozenset[str]

    @classmethod
    def of(cls, observed: ObservedState) -> Scope:
        jobs = frozenset(
            c.name for c in observed.controllers if c.kind == "Job" and c.owner_kind == "CronJob"
        )
        pods = frozenset(
            p.name for p in observed.pods if p.owner_kind == "Job" and p.owner_name in jobs
        )
        return cls(jobs, pods)

    def cron_run(self, kind: str, name: str) -> bool:
        return (kind == "Job" and name in self.cron_jobs) or (
            kind == "Pod" and name in self.cron_pods
        )


def pod_failure(pod: Pod) -> Observation | None:
    """A pod that has failed for good: phase `Failed` (evicted, admission refused…), or a
    `restartPolicy: Never` pod whose container exited non-zero."""
    if pod.phase == "Failed":
        why = f" ({pod.reason})" if pod.reason else ""
        detail = f": {pod.message}" if pod.message else ""
        return Observation(str(pod.ref), "PodFailed", f"pod {pod.name} failed{why}{detail}")
    if pod.restart_policy != "Never":
        return None
    for c in pod.all_container_statuses:
        term = c.state if c.state and c.state.kind == "terminated" else c.last_state
        if term is not None and term.kind == "terminated" and term.exit_code:
            why = f" ({term.reason})" if term.reason else ""
            return Observation(
                str(pod.ref),
                "ContainerFailed",
                f"container {c.name} of pod {pod.name} (restartPolicy Never) exited "
                f"with code {term.exit_code}{why}",
            )
    return None


def _terminal_event(ev: Event, tracked: frozenset[ObjectRef]) -> bool:
    """A controller could not create or update what it manages, or a rendered (tracked)
    object is refused as `forbidden`: fails the instance at once.

    Other warnings, "forbidden" ones about pods included (a `FailedMount` of a secret the
    kubelet may not read yet, a registry's `403 Forbidden` during a pull), are judged by what
    they hold back.
    """
    if ev.type != "Warning":
        return False
    if ev.reason in TERMINAL_EVENT_REASONS:
        return True
    if ev.involved_kind == "Pod":
        return False
    if ev.involved in tracked and "forbidden" in ev.message.lower():
        return True
    return _CREATE_REFUSED.search(ev.message) is not None


def immediate_failures(
    observed: ObservedState, scope: Scope
) -> tuple[list[Observation], list[Observation]]:
    """Conditions that fail an instance at once in default mode, in order of precedence, and
    the failures its controllers judge instead (notes: a Job retries its failed pods, a
    CronJob's failed run is not the instance's). ReplicaSet and StatefulSet pods are left to
    `replacements`."""
    out: list[Observation] = []
    notes: list[Observation] = []
    for ref in observed.missing:
        out.append(
            Observation(
                str(ref), "ObjectMissing", f"rendered object {ref} is missing from the cluster"
            )
        )
    for pod in observed.pods:
        if pod.terminating:
            continue
        if pod.owner_kind in REPLACING_OWNERS:
            if pod.phase == "Failed" and pod.reason == ADMISSION_REJECTED:
                out.append(pod_failure(pod) or Observation(str(pod.ref), "PodFailed", pod.name))
            continue
        failure = pod_failure(pod)
        if failure is None:
            continue
        if pod.owner_kind == "Job":
            notes.append(
                Observation(
                    failure.object,
                    failure.reason,
                    f"{failure.message} (Job {pod.owner_name} decides: it retries failed pods "
                    "up to its backoffLimit)",
                )
            )
        else:
            out.append(failure)  # a standalone pod: nothing will replace it
    for ctrl in observed.controllers:
        subject = f"{ctrl.kind} {ctrl.name}"
        if ctrl.kind == "Deployment":
            progressing = ctrl.condition("Progressing")
            if progressing is not None and progressing.is_false:
                reason = progressing.reason or "DeploymentNotProgressing"
                detail = progressing.message or "is not progressing"
                out.append(Observation(str(ctrl.ref), reason, f"{subject}: {detail}"))
        if ctrl.kind in ("Deployment", "ReplicaSet"):
            replica_failure = ctrl.condition("ReplicaFailure")
            if replica_failure is not None and replica_failure.is_true:
                detail = (
                    replica_failure.message or replica_failure.reason or "cannot create replicas"
                )
                out.append(Observation(str(ctrl.ref), "ReplicaFailure", f"{subject}: {detail}"))
        if ctrl.kind == "Job" and ctrl.job_failed:
            failed = ctrl.condition("Failed")
            why = f" ({failed.reason})" if failed is not None and failed.reason else ""
            detail = f": {failed.message}" if failed is not None and failed.message else ""
            message = f"{subject} failed{why}{detail}"
            if scope.cron_run("Job", ctrl.name):
                run_of = f" (a run of CronJob {ctrl.owner_name})"
                notes.append(Observation(str(ctrl.ref), "JobFailed", message + run_of))
            else:
                out.append(Observation(str(ctrl.ref), "JobFailed", message))
    for ev in observed.events:
        if not _terminal_event(ev, observed.expected):
            continue
        subject = f"{ev.involved_kind} {ev.involved_name}"
        obs = Observation(str(ev.involved), ev.reason or "FailedCreate", f"{subject}: {ev.message}")
        (notes if scope.cron_run(ev.involved_kind, ev.involved_name) else out).append(obs)
    return out, notes


def replacements(run: Run, observed: ObservedState, sink: list[Observation], enforce: bool) -> None:
    """Failed pods of a ReplicaSet or StatefulSet are judged through their controller, which
    replaces them: a replaced one is only noted; one not replaced yet holds the instance back
    and fails it after the failing-objects backoff (re-checked every 30 s)."""
    for pod in observed.pods:
        if pod.terminating or pod.phase != "Failed" or pod.owner_kind not in REPLACING_OWNERS:
            continue
        if pod.reason == ADMISSION_REJECTED:
            continue  # an immediate failure (immediate_failures)
        failure = pod_failure(pod)
        detail = failure.message if failure is not None else f"pod {pod.name} failed"
        owner = f"{pod.owner_kind} {pod.owner_name}"
        if pod.reason == EVICTED and pod.owner_kind == "ReplicaSet":
            run.notes.append(
                Observation(str(pod.ref), "PodEvicted", f"{detail}; {owner} replaces it")
            )
            continue
        ctrl = observed.controller(pod.owner_kind, pod.owner_name)
        wanted = ctrl.desired_replicas if ctrl is not None else 1
        siblings = sum(
            1
            for p in observed.pods
            if p is not pod
            and is_live(p)
            and (p.owner_kind, p.owner_name) == (pod.owner_kind, pod.owner_name)
        )
        ref = str(pod.ref)
        if siblings >= wanted:
            run.notes.append(Observation(ref, "PodFailed", f"{detail}; {owner} has replaced it"))
            continue
        sink.append(Observation(ref, "PodFailed", f"{detail}; waiting for {owner} to replace it"))
        if enforce:
            if run.expired(f"replaced:{pod.key}", run.t.failing_backoff):
                limit = human_duration(run.t.failing_backoff)
                raise Failure("PodFailed", f"{detail}; {owner} did not replace it within {limit}")
            run.deadlines.append(run.now + timedelta(seconds=run.t.failing_recheck))


def pod_checks(
    run: Run,
    pod: Pod,
    was_ready: bool,
    enforced: Collection[str],
    sink: list[Observation],
) -> None:
    """Record what holds `pod` back into `sink`; raise Failure when an enforced timer expires.

    The pod timers run from the pod's launch (`Pod.launched`), as NVCA's do: a problem first
    seen late in a pod's life may already be past its timeout. A pod that was Ready and is not
    any more is judged by the degradation period from when it became not ready.
    """
    t = run.t
    ref = str(pod.ref)
    launched = pod.launched

    def check(name: str, timeout: float, start: datetime | None) -> bool:
        return name in enforced and run.expired(f"{name}:{pod.key}", timeout, start)

    if pod.phase == "Failed":
        sink.append(pod_failure(pod) or Observation(ref, "PodFailed", f"pod {pod.name} failed"))
        return

    if not pod.scheduled:
        cond = pod.condition("PodScheduled")
        detail = (cond.message or cond.reason) if cond is not None else ""
        detail = detail or "waiting for the scheduler"
        reason = "Unschedulable" if cond is not None and cond.is_false else "PodPending"
        sink.append(Observation(ref, reason, f"pod {pod.name} is not scheduled: {detail}"))
        if check("scheduling", t.pod_scheduling, launched):
            limit = human_duration(t.pod_scheduling)
            raise Failure(
                "PodStuckScheduling",
                f"pod {pod.name} could not be scheduled within {limit}: {detail}",
            )
        return

    pulling = [c for c in pod.all_container_statuses if c.waiting_reason in IMAGE_PULL_REASONS]
    if pulling:
        c = pulling[0]
        detail = c.state.message if c.state and c.state.message else c.waiting_reason
        message = f"container {c.name} of pod {pod.name} cannot pull image {c.image}: {detail}"
        sink.append(Observation(ref, "ImagePullBackOff", message))
        if check("imagePull", t.image_pull, launched):
            limit = human_duration(t.image_pull)
            raise Failure("ImagePullIssues", f"{message} (still failing {limit} after launch)")

    creating = [
        c for c in pod.all_container_statuses if c.waiting_reason in CREATE_CONTAINER_REASONS
    ]
    if creating:
        c = creating[0]
        detail = c.state.message if c.state and c.state.message else c.waiting_reason
        message = f"container {c.name} of pod {pod.name} cannot be created: {detail}"
        sink.append(Observation(ref, c.waiting_reason, message))
        if check("createContainer", t.image_pull, launched):
            limit = human_duration(t.image_pull)
            raise Failure(
                "ContainerCreateIssues", f"{message} (still failing {limit} after launch)"
            )

    if not pod.ready:
        # A ready pod is running however often its containers restarted. One that is not counts
        # every restart, a container's that is ready again included (the init containers'
        # while the pod initializes, then the containers').
        statuses = pod.container_statuses if pod.initialized else pod.init_container_statuses
        looping = [c for c in statuses if c.restart_count >= RESTART_LOOP_THRESHOLD]
        if looping:
            c = looping[0]
            last = c.last_state
            code = (
                f", last exit code {last.exit_code}" if last and last.exit_code is not None else ""
            )
            message = (
                f"container {c.name} of pod {pod.name} restarted {c.restart_count} times{code}"
            )
            sink.append(Observation(ref, "CrashLoopBackOff", message))
            if check("restartLoop", t.restart_loop, launched):
                limit = human_duration(t.restart_loop)
                raise Failure(
                    "ContainersInRestartLoop", f"{message}, looping for more than {limit}"
                )

    if not pod.initialized:
        message = f"pod {pod.name} is initializing: init containers have not completed"
        sink.append(Observation(ref, "PodInitializing", message))
        if check("init", t.init, launched):
            limit = human_duration(t.init)
            raise Failure("InitContainerStuck", f"{message} within {limit}")
    elif pod.phase in ("Pending", "Unknown"):
        sink.append(Observation(ref, "PodPending", f"pod {pod.name} is starting its containers"))
        if check("pending", t.init, launched):
            limit = human_duration(t.init)
            raise Failure(
                "PodStuckPending", f"pod {pod.name} is still {pod.phase} {limit} after its launch"
            )
    elif not pod.ready:
        ready = pod.condition("Ready")
        detail = f": {ready.message}" if ready is not None and ready.message else ""
        if was_ready:
            message = f"pod {pod.name} was ready and is now not ready{detail}"
            sink.append(Observation(ref, "WorkerDegraded", message))
            if check("notReady", t.worker_degradation, pod.not_ready_since):
                limit = human_duration(t.worker_degradation)
                raise Failure("WorkerDegraded", f"{message} for more than {limit}")
        else:
            message = f"pod {pod.name} is running but has never been ready{detail}"
            sink.append(Observation(ref, "ContainersNotReady", message))
            if check("startup", t.worker_startup, launched):
                limit = human_duration(t.worker_startup)
                raise Failure(
                    "WorkerStartupTimeout", f"pod {pod.name} did not become ready within {limit}"
                )


def failing_objects(
    run: Run, observed: ObservedState, sink: list[Observation], enforce: bool, scope: Scope
) -> None:
    """Transient failures (FailedMount…): retried, and fatal after the failing-objects backoff."""
    pods = {p.name: p for p in observed.pods}
    seen: set[str] = set()
    for ev in observed.events:
        if ev.type != "Warning" or ev.reason not in TRANSIENT_EVENT_REASONS:
            continue
        if ev.involved_kind == "Pod":
            pod = pods.get(ev.involved_name)
            # The event outlives the problem: it only counts while its pod is still not ready.
            still_failing = pod is not None and is_live(pod) and not pod.ready
        else:
            last = ev.last_time or ev.first_time
            still_failing = last is None or (
                (run.now - last).total_seconds() <= run.t.failing_backoff
            )
        key = str(ev.involved)
        if not still_failing or key in seen:
            continue
        seen.add(key)
        message = f"{ev.involved_kind} {ev.involved_name}: {ev.reason}: {ev.message}"
        if scope.cron_run(ev.involved_kind, ev.involved_name):
            run.notes.append(Observation(key, "FailingObjects", message))
            continue
        sink.append(Observation(key, "FailingObjects", message))
        if enforce:
            if run.expired(f"failing:{key}", run.t.failing_backoff):
                limit = human_duration(run.t.failing_backoff)
                raise Failure("FailingObjects", f"{message} (still failing after {limit})")
            run.deadlines.append(run.now + timedelta(seconds=run.t.failing_recheck))


def _owned_pods(observed: ObservedState, ctrl: Controller) -> list[Pod]:
    """The pods a controller runs (a Deployment's through its ReplicaSets)."""
    owners = {(ctrl.kind, ctrl.name)}
    if ctrl.kind == "Deployment":
        owners |= {
            ("ReplicaSet", c.name)
            for c in observed.controllers
            if c.kind == "ReplicaSet" and (c.owner_kind, c.owner_name) == ("Deployment", ctrl.name)
        }
    return [p for p in observed.pods if (p.owner_kind, p.owner_name) in owners]


def creating_pods(observed: ObservedState, ctrl: Controller) -> bool:
    """Whether a controller has created fewer pods than it will run. A Deployment's own count
    lags its ReplicaSet's: one whose current ReplicaSet has created all its pods is done."""
    if ctrl.kind == "Deployment":
        current = [
            c
            for c in observed.controllers
            if c.kind == "ReplicaSet"
            and (c.owner_kind, c.owner_name) == ("Deployment", ctrl.name)
            and c.desired_replicas > 0
        ]
        if any(not rs.creating_pods for rs in current):
            return False
    return ctrl.creating_pods


def unsatisfied(run: Run, observed: ObservedState, ctrl: Controller) -> Observation:
    """Why a controller holds the instance out of Running (it is not `satisfied`)."""
    if ctrl.kind == "Job":
        message = (
            f"Job {ctrl.name} has not completed yet: {ctrl.active} active, {ctrl.succeeded} "
            f"succeeded, {ctrl.failed} failed (backoffLimit {ctrl.backoff_limit})"
        )
        return Observation(str(ctrl.ref), "ObjectsNotReady", message)
    message = (
        f"{ctrl.kind} {ctrl.name} has {ctrl.available_replicas}/{ctrl.desired_replicas} "
        "available replicas"
    )
    if ctrl.min_ready_seconds and ctrl.ready_replicas > ctrl.available_replicas:
        message += (
            f" ({ctrl.ready_replicas} ready; a replica is available once ready for "
            f"minReadySeconds {ctrl.min_ready_seconds})"
        )
        # wake up when the next ready pod has been ready for minReadySeconds
        wait = timedelta(seconds=ctrl.min_ready_seconds)
        ready_since = [
            cond.last_transition_time
            for p in _owned_pods(observed, ctrl)
            if (cond := p.condition("Ready")) is not None
            and cond.is_true
            and cond.last_transition_time is not None
        ]
        upcoming = [t + wait for t in ready_since if t + wait > run.now]
        if upcoming:
            run.deadlines.append(min(upcoming))
    return Observation(str(ctrl.ref), "ObjectsNotReady", message)
