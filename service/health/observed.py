"""What a backend adapter observes for one instance: pods, controllers, warning events, objects.

Frozen, typed mirrors of the Kubernetes status fields the health machine reads, with
`from_k8s` constructors that take objects exactly as the API server returns them
(`kubectl get -o json`), so the simulated and the kubernetes adapter share one parser.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

ContainerStateKind = Literal["waiting", "running", "terminated", "unknown"]

CONTROLLER_KINDS = frozenset({"Deployment", "ReplicaSet", "StatefulSet", "Job", "CronJob"})

#: Kubernetes timestamps have whole seconds: a Ready condition that changed within this much of
#: the pod's `startTime` was set by the kubelet's first status (as NVCA reads it too).
READY_TRANSITION_SLACK = timedelta(seconds=1)


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp (`2024-05-01T10:00:00Z`, fractions allowed) as an aware datetime."""
    if not value or not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def format_time(value: datetime) -> str:
    """The RFC 3339 form Kubernetes writes (UTC, `Z`), keeping sub-seconds when present."""
    value = value.astimezone(UTC)
    text = value.isoformat(timespec="microseconds" if value.microsecond else "seconds")
    return text.replace("+00:00", "Z")


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _str_map(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in _map(value).items()}


@dataclass(frozen=True, order=True)
class ObjectRef:
    """A namespaced object by kind and name (`Deployment/web`)."""

    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"

    @classmethod
    def from_k8s(cls, obj: Mapping[str, Any]) -> ObjectRef:
        return cls(str(obj.get("kind", "")), str(_map(obj.get("metadata")).get("name", "")))


@dataclass(frozen=True)
class Condition:
    """One entry of `status.conditions` (pods, Deployments, ReplicaSets, Jobs…)."""

    type: str
    status: str  # "True" | "False" | "Unknown", as Kubernetes writes it
    reason: str = ""
    message: str = ""
    last_transition_time: datetime | None = None

    @property
    def is_true(self) -> bool:
        return self.status == "True"

    @property
    def is_false(self) -> bool:
        return self.status == "False"

    @classmethod
    def from_k8s(cls, obj: Mapping[str, Any]) -> Condition:
        return cls(
            type=str(obj.get("type", "")),
            status=str(obj.get("status", "Unknown")),
            reason=str(obj.get("reason") or ""),
            message=str(obj.get("message") or ""),
            last_transition_time=parse_time(obj.get("lastTransitionTime")),
        )


def find_condition(conditions: Iterable[Condition], type_: str) -> Condition | None:
    """The condition of that type, if the object reports one."""
    return next((c for c in conditions if c.type == type_), None)


@dataclass(frozen=True)
class ContainerState:
    """`state` / `lastState` of a container status: exactly one of waiting/running/terminated."""

    kind: ContainerStateKind
    reason: str = ""
    message: str = ""
    exit_code: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @classmethod
    def from_k8s(cls, obj: Mapping[str, Any]) -> ContainerState | None:
        kinds: tuple[ContainerStateKind, ...] = ("waiting", "running", "terminated")
        for kind in kinds:
            if kind in obj and obj[kind] is not None:
                body = _map(obj[kind])
                exit_code = body.get("exitCode")
                return cls(
                    kind=kind,
                    reason=str(body.get("reason") or ""),
                    message=str(body.get("message") or ""),
                    exit_code=None if exit_code is None else _int(exit_code),
                    started_at=parse_time(body.get("startedAt")),
                    finished_at=parse_time(body.get("finishedAt")),
                )
        return None


@dataclass(frozen=True)
class ContainerStatus:
    """One entry of `status.containerStatuses` or `status.initContainerStatuses`."""

    name: str
    ready: bool = False
    restart_count: int = 0
    state: ContainerState | None = None
    last_state: ContainerState | None = None
    started: bool | None = None
    image: str = ""
    init: bool = False

    @property
    def waiting_reason(self) -> str:
        return self.state.reason if self.state and self.state.kind == "waiting" else ""

    @property
    def completed(self) -> bool:
        """Terminated with exit code 0 (how a finished init container looks)."""
        return bool(self.state and self.state.kind == "terminated" and self.state.exit_code == 0)

    @classmethod
    def from_k8s(cls, obj: Mapping[str, Any], *, init: bool = False) -> ContainerStatus:
        started = obj.get("started")
        return cls(
            name=str(obj.get("name", "")),
            ready=bool(obj.get("ready", False)),
            restart_count=_int(obj.get("restartCount")),
            state=ContainerState.from_k8s(_map(obj.get("state"))),
            last_state=ContainerState.from_k8s(_map(obj.get("lastState"))),
            started=None if started is None else bool(started),
            image=str(obj.get("image", "")),
            init=init,
        )


def _controller_owner(metadata: Mapping[str, Any]) -> tuple[str, str]:
    owners = [_map(o) for o in _list(metadata.get("ownerReferences"))]
    owner = next((o for o in owners if o.get("controller")), owners[0] if owners else None)
    if owner is None:
        return "", ""
    return str(owner.get("kind", "")), str(owner.get("name", ""))


@dataclass(frozen=True)
class Pod:
    """A pod with the status fields that decide instance health.

    `worker` is True when the inference Service (`helmChartServiceName`) selects the pod.
    """

    name: str
    phase: str = "Pending"  # Pending | Running | Succeeded | Failed | Unknown
    uid: str = ""
    owner_kind: str = ""
    owner_name: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    reason: str = ""  # status.reason, e.g. UnexpectedAdmissionError, Evicted
    message: str = ""
    conditions: tuple[Condition, ...] = ()
    init_container_statuses: tuple[ContainerStatus, ...] = ()
    container_statuses: tuple[ContainerStatus, ...] = ()
    restart_policy: str = "Always"
    created: datetime | None = None
    start_time: datetime | None = None
    node_name: str = ""
    worker: bool = False
    terminating: bool = False

    @property
    def key(self) -> str:
        """Stable identity for timers; the uid, so a recreated StatefulSet pod starts afresh."""
        return self.uid or self.name

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef("Pod", self.name)

    @property
    def all_container_statuses(self) -> tuple[ContainerStatus, ...]:
        return self.init_container_statuses + self.container_statuses

    def condition(self, type_: str) -> Condition | None:
        return find_condition(self.conditions, type_)

    @property
    def scheduled(self) -> bool:
        cond = self.condition("PodScheduled")
        return bool(self.node_name) or (cond is not None and cond.is_true)

    @property
    def initialized(self) -> bool:
        cond = self.condition("Initialized")
        return cond is not None and cond.is_true

    @property
    def ready(self) -> bool:
        cond = self.condition("Ready")
        return cond is not None and cond.is_true

    @property
    def launched(self) -> datetime | None:
        """When the pod was launched, where NVCA starts a pod's clocks: `status.startTime`; for a
        pod the kubelet has not started, when the scheduler first refused it (`PodScheduled`
        False); otherwise its creation."""
        if self.start_time is not None:
            return self.start_time
        cond = self.condition("PodScheduled")
        if cond is not None and cond.is_false and cond.last_transition_time is not None:
            return cond.last_transition_time
        return self.created

    @property
    def was_ready_before(self) -> bool:
        """Whether the pod's own status shows that this not-ready pod was Ready earlier.

        The Ready condition changes only with its status, so a False condition whose
        `lastTransitionTime` is later than the pod's launch (beyond the kubelet's first status)
        went False after having been True. Without those timestamps, a container that has
        restarted (`restartCount` > 0 with a `lastState`) is taken as having run before.
        """
        cond = self.condition("Ready")
        if cond is None or cond.is_true:
            return False
        if cond.last_transition_time is not None and self.start_time is not None:
            return cond.last_transition_time > self.start_time + READY_TRANSITION_SLACK
        return any(
            c.restart_count > 0 and c.last_state is not None for c in self.container_statuses
        )

    @property
    def not_ready_since(self) -> datetime | None:
        """When a pod that was Ready became not ready, if its Ready condition says so."""
        cond = self.condition("Ready")
        if cond is None or cond.is_true or cond.last_transition_time is None:
            return None
        if self.start_time is None:
            return None
        if cond.last_transition_time <= self.start_time + READY_TRANSITION_SLACK:
            return None
        return cond.last_transition_time

    @classmethod
    def from_k8s(cls, obj: Mapping[str, Any], *, worker: bool = False) -> Pod:
        metadata = _map(obj.get("metadata"))
        spec = _map(obj.get("spec"))
        status = _map(obj.get("status"))
        owner_kind, owner_name = _controller_owner(metadata)
        return cls(
            name=str(metadata.get("name", "")),
            uid=str(metadata.get("uid", "")),
            phase=str(status.get("phase") or "Pending"),
            owner_kind=owner_kind,
            owner_name=owner_name,
            labels=_str_map(metadata.get("labels")),
            reason=str(status.get("reason") or ""),
            message=str(status.get("message") or ""),
            conditions=tuple(Condition.from_k8s(_map(c)) for c in _list(status.get("conditions"))),
            init_container_statuses=tuple(
                ContainerStatus.from_k8s(_map(c), init=True)
                for c in _list(status.get("initContainerStatuses"))
            ),
            container_statuses=tuple(
                ContainerStatus.from_k8s(_map(c)) for c in _list(status.get("containerStatuses"))
            ),
            restart_policy=str(spec.get("restartPolicy") or "Always"),
            created=parse_time(metadata.get("creationTimestamp")),
            start_time=parse_time(status.get("startTime")),
            node_name=str(spec.get("nodeName") or ""),
            worker=worker,
            terminating=metadata.get("deletionTimestamp") is not None,
        )


@dataclass(frozen=True)
class Controller:
    """A Deployment, ReplicaSet, StatefulSet, Job or CronJob with its counts and conditions."""

    kind: str
    name: str
    desired_replicas: int = 1  # spec.replicas (Job: spec.parallelism)
    replicas: int = 0
    ready_replicas: int = 0
    available_replicas: int = 0
    updated_replicas: int = 0
    conditions: tuple[Condition, ...] = ()
    owner_kind: str = ""
    owner_name: str = ""
    created: datetime | None = None
    min_ready_seconds: int = 0  # Deployment, ReplicaSet, StatefulSet
    pod_management_policy: str = "OrderedReady"  # StatefulSet only
    active: int = 0  # Job only
    succeeded: int = 0  # Job only
    failed: int = 0  # Job only
    backoff_limit: int = 6  # Job only (Kubernetes' default)
    completion_time: datetime | None = None  # Job only

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef(self.kind, self.name)

    def condition(self, type_: str) -> Condition | None:
        return find_condition(self.conditions, type_)

    @property
    def ready(self) -> bool:
        """Whether the controller reports every wanted replica ready (Jobs: not failed)."""
        if self.kind == "Job":
            return not self.job_failed
        return self.ready_replicas >= self.desired_replicas

    @property
    def job_failed(self) -> bool:
        """A Job whose `Failed` condition is True (e.g. `BackoffLimitExceeded`)."""
        failed = self.condition("Failed")
        return failed is not None and failed.is_true

    @property
    def job_complete(self) -> bool:
        """A Job whose `Complete` condition is True, or with a `completionTime`."""
        complete = self.condition("Complete")
        return self.completion_time is not None or (complete is not None and complete.is_true)

    @property
    def satisfied(self) -> bool:
        """Whether the controller has done what the instance waits for: a Job has completed;
        a Deployment, ReplicaSet or StatefulSet has every wanted replica *available* (ready
        for `minReadySeconds`, as the controller counts it). A CronJob always is: its runs
        come and go on a schedule."""
        if self.kind == "CronJob":
            return True
        if self.kind == "Job":
            return self.job_complete
        return self.available_replicas >= self.desired_replicas

    @property
    def creating_pods(self) -> bool:
        """Whether the controller has created fewer pods than it will run (the instance is
        still Scheduling): `status.replicas` below `spec.replicas` (an `OrderedReady`
        StatefulSet creates one pod at a time, so only its first is waited for); a Job that is
        neither finished nor running a pod."""
        if self.kind == "CronJob":
            return False
        if self.kind == "Job":
            return not (self.job_complete or self.job_failed) and self.active <= 0
        wanted = self.desired_replicas
        if self.kind == "StatefulSet" and self.pod_management_policy != "Parallel":
            wanted = min(wanted, 1)
        return self.replicas < wanted

    @classmethod
    def from_k8s(cls, obj: Mapping[str, Any]) -> Controller:
        kind = str(obj.get("kind", ""))
        metadata = _map(obj.get("metadata"))
        spec = _map(obj.get("spec"))
        status = _map(obj.get("status"))
        owner_kind, owner_name = _controller_owner(metadata)
        desired_key = "parallelism" if kind == "Job" else "replicas"
        desired = spec.get(desired_key)
        return cls(
            kind=kind,
            name=str(metadata.get("name", "")),
            desired_replicas=1 if desired is None else _int(desired, 1),
            replicas=_int(status.get("replicas")),
            ready_replicas=_int(status.get("readyReplicas")),
            available_replicas=_int(status.get("availableReplicas")),
            updated_replicas=_int(status.get("updatedReplicas")),
            conditions=tuple(Condition.from_k8s(_map(c)) for c in _list(status.get("conditions"))),
            owner_kind=owner_kind,
            owner_name=owner_name,
            created=parse_time(metadata.get("creationTimestamp")),
            min_ready_seconds=_int(spec.get("minReadySeconds")),
            pod_management_policy=str(spec.get("podManagementPolicy") or "OrderedReady"),
            active=_int(status.get("active")),
            succeeded=_int(status.get("succeeded")),
            failed=_int(status.get("failed")),
            backoff_limit=_int(spec.get("backoffLimit"), 6),
            completion_time=parse_time(status.get("completionTime")),
        )


@dataclass(frozen=True)
class Event:
    """A Kubernetes event about an object of the instance (core/v1 or events.k8s.io/v1)."""

    reason: str
    message: str
    involved_kind: str
    involved_name: str
    type: str = "Warning"
    first_time: datetime | None = None
    last_time: datetime | None = None
    count: int = 1

    @property
    def involved(self) -> ObjectRef:
        return ObjectRef(self.involved_kind, self.involved_name)

    @classmethod
    def from_k8s(cls, obj: Mapping[str, Any]) -> Event:
        # core/v1 uses involvedObject/message/*Timestamp; events.k8s.io/v1 uses
        # regarding/note/deprecated*Timestamp plus eventTime and series.
        involved = _map(obj.get("involvedObject") or obj.get("regarding"))
        series = _map(obj.get("series"))
        first = parse_time(
            obj.get("firstTimestamp") or obj.get("deprecatedFirstTimestamp") or obj.get("eventTime")
        )
        last = parse_time(
            obj.get("lastTimestamp")
            or obj.get("deprecatedLastTimestamp")
            or series.get("lastObservedTime")
            or obj.get("eventTime")
        )
        count = obj.get("count") or obj.get("deprecatedCount") or series.get("count") or 1
        return cls(
            reason=str(obj.get("reason") or ""),
            message=str(obj.get("message") or obj.get("note") or ""),
            involved_kind=str(involved.get("kind", "")),
            involved_name=str(involved.get("name", "")),
            type=str(obj.get("type") or "Normal"),
            first_time=first,
            last_time=last or first,
            count=_int(count, 1),
        )


def selector_matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Service-style equality selector; an empty selector selects nothing (as for Services)."""
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


@dataclass(frozen=True)
class ObservedState:
    """Everything observed for one instance at one moment.

    `expected` are the rendered objects the adapter applied; `present` what the cluster has.
    `placed` is False while no cluster had room for the instance (nothing applied yet).
    """

    pods: tuple[Pod, ...] = ()
    controllers: tuple[Controller, ...] = ()
    events: tuple[Event, ...] = ()
    expected: frozenset[ObjectRef] = frozenset()
    present: frozenset[ObjectRef] = frozenset()
    placed: bool = True
    placement_message: str = ""

    @property
    def missing(self) -> tuple[ObjectRef, ...]:
        """Rendered objects absent from the cluster, sorted."""
        seen = set(self.present)
        seen.update(p.ref for p in self.pods)
        seen.update(c.ref for c in self.controllers)
        return tuple(sorted(self.expected - seen))

    def controller(self, kind: str, name: str) -> Controller | None:
        """The observed controller of that kind and name, if any."""
        return next((c for c in self.controllers if c.kind == kind and c.name == name), None)

    @property
    def is_empty(self) -> bool:
        """Nothing of the instance exists on the cluster (e.g. a cluster that forgot it)."""
        return not (self.pods or self.controllers or self.present or self.expected)

    @classmethod
    def unplaced(cls, message: str = "") -> ObservedState:
        """The state of an instance still waiting for a cluster with free capacity."""
        return cls(placed=False, placement_message=message)

    @classmethod
    def from_k8s(
        cls,
        objects: Iterable[Mapping[str, Any]],
        *,
        events: Iterable[Mapping[str, Any]] = (),
        expected: Iterable[ObjectRef] = (),
        worker_selector: Mapping[str, str] | None = None,
    ) -> ObservedState:
        """Build the state from the namespace's objects and events as the API returns them.

        Pods selected by `worker_selector` (the inference Service's `spec.selector`) are the
        workers; without a selector every pod counts as a worker.
        """
        pods: list[Pod] = []
        controllers: list[Controller] = []
        present: set[ObjectRef] = set()
        for obj in objects:
            ref = ObjectRef.from_k8s(obj)
            present.add(ref)
            if ref.kind == "Pod":
                labels = _str_map(_map(obj.get("metadata")).get("labels"))
                worker = (
                    True if worker_selector is None else selector_matches(worker_selector, labels)
                )
                pods.append(Pod.from_k8s(obj, worker=worker))
            elif ref.kind in CONTROLLER_KINDS:
                controllers.append(Controller.from_k8s(obj))
        return cls(
            pods=tuple(pods),
            controllers=tuple(controllers),
            events=tuple(Event.from_k8s(e) for e in events),
            expected=frozenset(expected),
            present=frozenset(present),
        )
