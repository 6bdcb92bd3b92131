"""Instance health state machine (runtime.md §5): observed state + previous condition + now → phase.

`evaluate` is pure: no clock, no I/O. Every timer start it needs is carried in the returned
`InstanceCondition` (and its JSON), so the reconciler can persist it and resume after a restart.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from service.core.settings import Settings
from service.health.observed import Controller, Event, ObjectRef, ObservedState, Pod, parse_time

HealthMode = Literal["default", "StatusByWorkerReadiness"]

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
_ALL_POD_CHECKS = frozenset(
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


class Phase(StrEnum):
    SCHEDULING = "Scheduling"
    STARTING = "Starting"
    RUNNING = "Running"
    DEGRADED = "Degraded"
    FAILED = "Failed"


#: the settings' defaults, read once: each default is written in service/core/settings.py only
_DEFAULTS = Settings.model_construct()


@dataclass(frozen=True)
class HealthTimeouts:
    """Seconds for each timeout of runtime.md §5 (defaults: the `NVCF_HEALTH_*` settings)."""

    pod_scheduling: float = _DEFAULTS.health_pod_scheduling_timeout
    image_pull: float = _DEFAULTS.health_image_pull_timeout
    restart_loop: float = _DEFAULTS.health_restart_loop_timeout
    init: float = _DEFAULTS.health_init_timeout
    worker_startup: float = _DEFAULTS.health_worker_startup_timeout
    worker_degradation: float = _DEFAULTS.health_worker_degradation_period
    pending: float = _DEFAULTS.health_pending_timeout
    failing_backoff: float = _DEFAULTS.health_failing_backoff
    #: how often a failing object is looked at again during its backoff (not a setting)
    failing_recheck: float = 30.0

    @classmethod
    def from_settings(cls, settings: Settings) -> HealthTimeouts:
        return cls(
            pod_scheduling=settings.health_pod_scheduling_timeout,
            image_pull=settings.health_image_pull_timeout,
            restart_loop=settings.health_restart_loop_timeout,
            init=settings.health_init_timeout,
            worker_startup=settings.health_worker_startup_timeout,
            worker_degradation=settings.health_worker_degradation_period,
            pending=settings.health_pending_timeout,
            failing_backoff=settings.health_failing_backoff,
            failing_recheck=min(30.0, settings.health_failing_backoff),
        )


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


def human_duration(seconds: float) -> str:
    """`90s`, `10m`, `1h 30m`, `0.5s` — for messages."""
    if seconds < 60:
        return f"{seconds:.3g}s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else ""]
    if not hours and secs:
        parts.append(f"{secs}s")
    return " ".join(p for p in parts if p)


class _Failure(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class _Run:
    """Bookkeeping of one evaluation: timers touched, deadlines, issues found."""

    def __init__(
        self, previous: InstanceCondition | None, now: datetime, timeouts: HealthTimeouts
    ) -> None:
        self.previous = previous
        self.now = now
        self.t = timeouts
        self.prev_timers: Mapping[str, datetime] = previous.timers if previous else {}
        self.timers: dict[str, datetime] = {}
        self.deadlines: list[datetime] = []
        self.issues: list[Observation] = []  # what keeps the instance from Running
        self.notes: list[Observation] = []  # informational only (worker-readiness mode)

    def expired(self, key: str, timeout: float, start: datetime | None = None) -> bool:
        """Keep (or start) timer `key`; True once `timeout` seconds have elapsed since it began.

        `start` is when the cluster says the condition began (a pod's launch, when its Ready
        condition went False): that clock is NVCF's, so it wins. Without one, the clock starts
        at the first evaluation that sees the condition and is carried in the condition's
        timers. Timers not touched in an evaluation are dropped: their condition has cleared.
        """
        begun = start if start is not None else (self.prev_timers.get(key) or self.now)
        self.timers[key] = begun
        deadline = begun + timedelta(seconds=timeout)
        if self.now >= deadline:
            return True
        self.deadlines.append(deadline)
        return False

    def result(
        self,
        phase: Phase,
        reason: str,
        message: str,
        *,
        ever_running: bool,
        ready_pods: frozenset[str],
    ) -> InstanceCondition:
        prev = self.previous
        since = prev.since if prev is not None and prev.phase is phase else self.now
        return InstanceCondition(
            phase=phase,
            reason=reason,
            message=message,
            since=since,
            ever_running=ever_running,
            ready_pods=ready_pods,
            timers=dict(self.timers),
            observations=tuple(self.issues + self.notes),
            next_check=min(self.deadlines) if self.deadlines else None,
        )

    def failed(
        self, failure: _Failure, *, ever_running: bool, ready_pods: frozenset[str]
    ) -> InstanceCondition:
        return InstanceCondition(
            phase=Phase.FAILED,
            reason=failure.reason,
            message=failure.message,
            since=self.now,
            ever_running=ever_running,
            ready_pods=ready_pods,
            observations=tuple(self.issues + self.notes),
        )


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
    run = _Run(previous, now, timeouts or HealthTimeouts())
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
    except _Failure as failure:
        return run.failed(failure, ever_running=ever_running, ready_pods=ready_pods)


def _unplaced(
    run: _Run, observed: ObservedState, ever_running: bool, ready_pods: frozenset[str]
) -> InstanceCondition:
    detail = observed.placement_message or "no cluster has free capacity for the instance"
    if run.expired("unplaced", run.t.pod_scheduling):
        limit = human_duration(run.t.pod_scheduling)
        raise _Failure(
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


def _live(pod: Pod) -> bool:
    """A pod that runs or will: not being deleted, not finished (Succeeded or Failed)."""
    return not pod.terminating and pod.phase not in ("Succeeded", "Failed")


@dataclass(frozen=True)
class _Scope:
    """What a CronJob runs: its Jobs and their pods are judged through the CronJob, which a
    failed run does not fail (NVCA reports a CronJob as succeeded whatever its runs did)."""

    cron_jobs: frozenset[str]
    cron_pods: frozenset[str]

    @classmethod
    def of(cls, observed: ObservedState) -> _Scope:
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


def _pod_failure(pod: Pod) -> Observation | None:
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


def _immediate_failures(
    observed: ObservedState, scope: _Scope
) -> tuple[list[Observation], list[Observation]]:
    """Conditions that fail an instance at once in default mode, in order of precedence, and
    the failures its controllers judge instead (notes: a Job retries its failed pods, a
    CronJob's failed run is not the instance's). ReplicaSet and StatefulSet pods are left to
    `_replacements`."""
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
                out.append(_pod_failure(pod) or Observation(str(pod.ref), "PodFailed", pod.name))
            continue
        failure = _pod_failure(pod)
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


def _replacements(
    run: _Run, observed: ObservedState, sink: list[Observation], enforce: bool
) -> None:
    """Failed pods of a ReplicaSet or StatefulSet are judged through their controller, which
    replaces them: a replaced one is only noted; one not replaced yet holds the instance back
    and fails it after the failing-objects backoff (re-checked every 30 s)."""
    for pod in observed.pods:
        if pod.terminating or pod.phase != "Failed" or pod.owner_kind not in REPLACING_OWNERS:
            continue
        if pod.reason == ADMISSION_REJECTED:
            continue  # an immediate failure (_immediate_failures)
        failure = _pod_failure(pod)
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
            and _live(p)
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
                raise _Failure("PodFailed", f"{detail}; {owner} did not replace it within {limit}")
            run.deadlines.append(run.now + timedelta(seconds=run.t.failing_recheck))


def _pod_checks(
    run: _Run,
    pod: Pod,
    was_ready: bool,
    enforced: Collection[str],
    sink: list[Observation],
) -> None:
    """Record what holds `pod` back into `sink`; raise _Failure when an enforced timer expires.

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
        sink.append(_pod_failure(pod) or Observation(ref, "PodFailed", f"pod {pod.name} failed"))
        return

    if not pod.scheduled:
        cond = pod.condition("PodScheduled")
        detail = (cond.message or cond.reason) if cond is not None else ""
        detail = detail or "waiting for the scheduler"
        reason = "Unschedulable" if cond is not None and cond.is_false else "PodPending"
        sink.append(Observation(ref, reason, f"pod {pod.name} is not scheduled: {detail}"))
        if check("scheduling", t.pod_scheduling, launched):
            limit = human_duration(t.pod_scheduling)
            raise _Failure(
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
            raise _Failure("ImagePullIssues", f"{message} (still failing {limit} after launch)")

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
            raise _Failure(
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
                raise _Failure(
                    "ContainersInRestartLoop", f"{message}, looping for more than {limit}"
                )

    if not pod.initialized:
        message = f"pod {pod.name} is initializing: init containers have not completed"
        sink.append(Observation(ref, "PodInitializing", message))
        if check("init", t.init, launched):
            limit = human_duration(t.init)
            raise _Failure("InitContainerStuck", f"{message} within {limit}")
    elif pod.phase in ("Pending", "Unknown"):
        sink.append(Observation(ref, "PodPending", f"pod {pod.name} is starting its containers"))
        if check("pending", t.init, launched):
            limit = human_duration(t.init)
            raise _Failure(
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
                raise _Failure("WorkerDegraded", f"{message} for more than {limit}")
        else:
            message = f"pod {pod.name} is running but has never been ready{detail}"
            sink.append(Observation(ref, "ContainersNotReady", message))
            if check("startup", t.worker_startup, launched):
                limit = human_duration(t.worker_startup)
                raise _Failure(
                    "WorkerStartupTimeout", f"pod {pod.name} did not become ready within {limit}"
                )


def _failing_objects(
    run: _Run, observed: ObservedState, sink: list[Observation], enforce: bool, scope: _Scope
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
            still_failing = pod is not None and _live(pod) and not pod.ready
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
                raise _Failure("FailingObjects", f"{message} (still failing after {limit})")
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


def _creating_pods(observed: ObservedState, ctrl: Controller) -> bool:
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


def _unsatisfied(run: _Run, observed: ObservedState, ctrl: Controller) -> Observation:
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


def _sorted(issues: list[Observation]) -> list[Observation]:
    return sorted(issues, key=lambda o: _ISSUE_RANK.get(o.reason, 9))


def _was_ready(pod: Pod, prev_ready: frozenset[str]) -> bool:
    """Seen Ready by an earlier evaluation, or Ready between two (its status says so)."""
    return pod.key in prev_ready or pod.was_ready_before


def _default_mode(
    run: _Run,
    observed: ObservedState,
    prev_ready: frozenset[str],
    ever_running: bool,
    ready_pods: frozenset[str],
) -> InstanceCondition:
    """Every rendered object counts; any terminal state or expired timer fails the instance.
    What a controller manages is judged through the controller."""
    scope = _Scope.of(observed)
    immediate, notes = _immediate_failures(observed, scope)
    run.notes.extend(notes)
    if immediate:
        run.issues.extend(immediate)
        raise _Failure(immediate[0].reason, immediate[0].message)

    _replacements(run, observed, run.issues, enforce=True)
    live = [p for p in observed.pods if _live(p)]
    judged = [p for p in live if p.name not in scope.cron_pods]
    for pod in live:
        if pod.name in scope.cron_pods:
            _pod_checks(run, pod, _was_ready(pod, prev_ready), (), run.notes)
        else:
            _pod_checks(run, pod, _was_ready(pod, prev_ready), _ALL_POD_CHECKS, run.issues)
    _failing_objects(run, observed, run.issues, True, scope)
    controllers = [c for c in observed.controllers if not scope.cron_run(c.kind, c.name)]
    for ctrl in controllers:
        if not ctrl.satisfied:
            run.issues.append(_unsatisfied(run, observed, ctrl))
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
        raise _Failure(
            "ObjectsTimedOutPending", f"objects still not ready after {limit}: {first.message}"
        )
    if ever_running:
        phase = Phase.DEGRADED
    elif (
        not judged
        or any(not p.scheduled for p in judged)
        or any(_creating_pods(observed, c) for c in controllers)
    ):
        phase = Phase.SCHEDULING
    else:
        phase = Phase.STARTING
    return run.result(
        phase, first.reason, first.message, ever_running=ever_running, ready_pods=ready_pods
    )


def _worker_mode(
    run: _Run,
    observed: ObservedState,
    prev_ready: frozenset[str],
    ever_running: bool,
    ready_pods: frozenset[str],
) -> InstanceCondition:
    """Only the inference worker's readiness counts; everything else is informational."""
    scope = _Scope.of(observed)
    immediate, notes = _immediate_failures(observed, scope)
    run.notes.extend(immediate + notes)
    _replacements(run, observed, run.notes, enforce=False)
    live = [p for p in observed.pods if _live(p)]
    workers = [p for p in live if p.worker]
    for pod in live:
        if pod.worker:
            # A worker that can never get a node can never become ready.
            _pod_checks(run, pod, _was_ready(pod, prev_ready), {"scheduling"}, run.issues)
        else:
            _pod_checks(run, pod, _was_ready(pod, prev_ready), (), run.notes)
    _failing_objects(run, observed, run.notes, False, scope)

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
                _pod_failure(pod) or Observation(str(pod.ref), "PodFailed", f"{pod.name} failed")
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
            raise _Failure(
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
        raise _Failure(
            "WorkerDegraded", f"the inference worker has not been ready for {limit}: {detail}"
        )
    return run.result(
        Phase.DEGRADED,
        "WorkerDegraded",
        f"the inference worker is not ready: {detail}",
        ever_running=True,
        ready_pods=ready_pods,
    )
