"""Instance health state machine (runtime.md §5): observed state + previous condition + now → phase.

`evaluate` is pure: no clock, no I/O. Every timer start it needs is carried in the returned
`InstanceCondition` (and its JSON), so the reconciler can persist it and resume after a restart.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from service.core.settings import Settings
from service.health.observed import ObservedState, Pod, parse_time

HealthMode = Literal["default", "StatusByWorkerReadiness"]

IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff"})
TERMINAL_EVENT_REASONS = frozenset({"FailedCreate", "FailedUpdate", "ReplicaSetCreateError"})
TRANSIENT_EVENT_REASONS = frozenset({"FailedMount", "FailedAttachVolume", "FailedMapVolume"})
RESTART_LOOP_THRESHOLD = 3

# Timer-guarded checks a pod can be subject to (names used for `enforced` below).
_ALL_POD_CHECKS = frozenset(
    {"scheduling", "imagePull", "restartLoop", "init", "notReady", "startup"}
)

# Which pending issue best explains a not-yet-running instance (lower first).
_ISSUE_RANK = {
    "Unschedulable": 0,
    "ImagePullBackOff": 1,
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

    `timers` maps a check (e.g. `imagePull:<pod uid>`) to when its condition was first seen;
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

        Timers not touched in an evaluation are dropped: their condition has cleared.
        """
        begun = self.prev_timers.get(key) or start or self.now
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


def _active(pod: Pod) -> bool:
    return not pod.terminating and pod.phase != "Succeeded"


def _immediate_failures(observed: ObservedState) -> list[Observation]:
    """Conditions that fail an instance at once in default mode, in order of precedence."""
    out: list[Observation] = []
    for ref in observed.missing:
        out.append(
            Observation(
                str(ref), "ObjectMissing", f"rendered object {ref} is missing from the cluster"
            )
        )
    for pod in observed.pods:
        if pod.terminating:
            continue
        if pod.phase == "Failed":
            why = f" ({pod.reason})" if pod.reason else ""
            detail = f": {pod.message}" if pod.message else ""
            out.append(
                Observation(str(pod.ref), "PodFailed", f"pod {pod.name} failed{why}{detail}")
            )
        elif pod.restart_policy == "Never":
            for c in pod.all_container_statuses:
                term = c.state if c.state and c.state.kind == "terminated" else c.last_state
                if term is not None and term.kind == "terminated" and term.exit_code:
                    why = f" ({term.reason})" if term.reason else ""
                    out.append(
                        Observation(
                            str(pod.ref),
                            "ContainerFailed",
                            f"container {c.name} of pod {pod.name} (restartPolicy Never) exited "
                            f"with code {term.exit_code}{why}",
                        )
                    )
                    break
    for ctrl in observed.controllers:
        subject = f"{ctrl.kind} {ctrl.name}"
        if ctrl.kind == "Deployment":
            progressing = ctrl.condition("Progressing")
            if progressing is not None and progressing.is_false:
                reason = progressing.reason or "DeploymentNotProgressing"
                detail = progressing.message or "is not progressing"
                out.append(Observation(str(ctrl.ref), reason, f"{subject}: {detail}"))
        if ctrl.kind in ("Deployment", "ReplicaSet"):
            failure = ctrl.condition("ReplicaFailure")
            if failure is not None and failure.is_true:
                detail = failure.message or failure.reason or "cannot create replicas"
                out.append(Observation(str(ctrl.ref), "ReplicaFailure", f"{subject}: {detail}"))
        if ctrl.kind == "Job":
            failed = ctrl.condition("Failed")
            if failed is not None and failed.is_true:
                why = f" ({failed.reason})" if failed.reason else ""
                detail = f": {failed.message}" if failed.message else ""
                out.append(
                    Observation(str(ctrl.ref), "JobFailed", f"{subject} failed{why}{detail}")
                )
    for ev in observed.events:
        if ev.type != "Warning":
            continue
        subject = f"{ev.involved_kind} {ev.involved_name}"
        if ev.reason in TERMINAL_EVENT_REASONS:
            out.append(Observation(str(ev.involved), ev.reason, f"{subject}: {ev.message}"))
        elif "forbidden" in ev.message.lower():
            out.append(
                Observation(str(ev.involved), "Forbidden", f"{subject}: {ev.reason}: {ev.message}")
            )
    return out


def _pod_checks(
    run: _Run,
    pod: Pod,
    was_ready: bool,
    enforced: Collection[str],
    sink: list[Observation],
) -> None:
    """Record what holds `pod` back into `sink`; raise _Failure when an enforced timer expires."""
    t = run.t
    ref = str(pod.ref)
    launched = pod.start_time or pod.created

    def check(name: str, timeout: float, start: datetime | None) -> bool:
        return name in enforced and run.expired(f"{name}:{pod.key}", timeout, start)

    if not pod.scheduled:
        cond = pod.condition("PodScheduled")
        detail = (cond.message or cond.reason) if cond is not None else ""
        detail = detail or "waiting for the scheduler"
        reason = "Unschedulable" if cond is not None and cond.is_false else "PodPending"
        sink.append(Observation(ref, reason, f"pod {pod.name} is not scheduled: {detail}"))
        if check("scheduling", t.pod_scheduling, pod.created):
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
        if check("imagePull", t.image_pull, None):
            limit = human_duration(t.image_pull)
            raise _Failure("ImagePullIssues", f"{message} (for more than {limit})")

    looping = [
        c
        for c in pod.all_container_statuses
        if c.restart_count >= RESTART_LOOP_THRESHOLD and not (c.ready or c.completed)
    ]
    if looping:
        c = looping[0]
        last = c.last_state
        code = f", last exit code {last.exit_code}" if last and last.exit_code is not None else ""
        message = f"container {c.name} of pod {pod.name} restarted {c.restart_count} times{code}"
        sink.append(Observation(ref, "CrashLoopBackOff", message))
        if check("restartLoop", t.restart_loop, None):
            limit = human_duration(t.restart_loop)
            raise _Failure("ContainersInRestartLoop", f"{message}, looping for more than {limit}")

    if not pod.initialized:
        message = f"pod {pod.name} is initializing: init containers have not completed"
        sink.append(Observation(ref, "PodInitializing", message))
        if check("init", t.init, launched):
            limit = human_duration(t.init)
            raise _Failure("InitContainerStuck", f"{message} within {limit}")
    elif not pod.ready:
        ready = pod.condition("Ready")
        detail = f": {ready.message}" if ready is not None and ready.message else ""
        if was_ready:
            message = f"pod {pod.name} was ready and is now not ready{detail}"
            sink.append(Observation(ref, "WorkerDegraded", message))
            if check("notReady", t.worker_degradation, None):
                limit = human_duration(t.worker_degradation)
                raise _Failure("WorkerDegraded", f"{message} for more than {limit}")
        elif pod.phase == "Running":
            message = f"pod {pod.name} is running but has never been ready{detail}"
            sink.append(Observation(ref, "ContainersNotReady", message))
            if check("startup", t.worker_startup, launched):
                limit = human_duration(t.worker_startup)
                raise _Failure(
                    "WorkerStartupTimeout", f"pod {pod.name} did not become ready within {limit}"
                )
        else:
            sink.append(
                Observation(ref, "PodPending", f"pod {pod.name} is starting its containers")
            )


def _failing_objects(
    run: _Run, observed: ObservedState, sink: list[Observation], enforce: bool
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
            still_failing = pod is not None and _active(pod) and not pod.ready
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
        sink.append(Observation(key, "FailingObjects", message))
        if enforce:
            if run.expired(f"failing:{key}", run.t.failing_backoff):
                limit = human_duration(run.t.failing_backoff)
                raise _Failure("FailingObjects", f"{message} (still failing after {limit})")
            run.deadlines.append(run.now + timedelta(seconds=run.t.failing_recheck))


def _sorted(issues: list[Observation]) -> list[Observation]:
    return sorted(issues, key=lambda o: _ISSUE_RANK.get(o.reason, 9))


def _default_mode(
    run: _Run,
    observed: ObservedState,
    prev_ready: frozenset[str],
    ever_running: bool,
    ready_pods: frozenset[str],
) -> InstanceCondition:
    """Every rendered object counts; any terminal state or expired timer fails the instance."""
    immediate = _immediate_failures(observed)
    if immediate:
        run.issues.extend(immediate)
        raise _Failure(immediate[0].reason, immediate[0].message)

    active = [p for p in observed.pods if _active(p)]
    for pod in active:
        _pod_checks(run, pod, pod.key in prev_ready, _ALL_POD_CHECKS, run.issues)
    _failing_objects(run, observed, run.issues, enforce=True)
    for ctrl in observed.controllers:
        if not ctrl.ready:
            run.issues.append(
                Observation(
                    str(ctrl.ref),
                    "ObjectsNotReady",
                    f"{ctrl.kind} {ctrl.name} has {ctrl.ready_replicas}/{ctrl.desired_replicas} "
                    "ready replicas",
                )
            )
    if not active:
        run.issues.append(Observation("Instance", "PodPending", "no pods have been created yet"))

    workers = [p for p in active if p.worker] or active
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
    elif not active or any(not p.scheduled for p in active):
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
    active = [p for p in observed.pods if _active(p)]
    workers = [p for p in active if p.worker]
    run.notes.extend(_immediate_failures(observed))
    for pod in active:
        if pod.worker:
            # A worker that can never get a node can never become ready.
            _pod_checks(run, pod, pod.key in prev_ready, {"scheduling"}, run.issues)
        else:
            _pod_checks(run, pod, pod.key in prev_ready, (), run.notes)
    _failing_objects(run, observed, run.notes, enforce=False)

    if workers and all(p.ready for p in workers):
        return run.result(
            Phase.RUNNING,
            "WorkerReady",
            "the inference worker is ready",
            ever_running=True,
            ready_pods=ready_pods,
        )

    if not workers:
        run.issues.append(
            Observation("Instance", "PodPending", "no inference worker pod has been created yet")
        )
    run.issues = _sorted(run.issues)
    first = run.issues[0] if run.issues else None
    detail = first.message if first else "the inference worker is not ready"
    if not ever_running:
        launched = [p.created for p in workers if p.created is not None]
        start = min([*launched, run.now])
        if run.expired("workerStartup", run.t.worker_startup, start):
            limit = human_duration(run.t.worker_startup)
            raise _Failure(
                "WorkerStartupTimeout",
                f"the inference worker did not become ready within {limit}: {detail}",
            )
        phase = (
            Phase.SCHEDULING
            if not workers or any(not p.scheduled for p in workers)
            else Phase.STARTING
        )
        reason = first.reason if first else "ContainersNotReady"
        return run.result(phase, reason, detail, ever_running=False, ready_pods=ready_pods)

    if run.expired("workerDegraded", run.t.worker_degradation):
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
