"""The `simulated` backend: an in-process model of a Kubernetes cluster (runtime.md §4).

Applied workloads get pods; pods request `nvidia.com/gpu` and are scheduled onto nodes of the
cluster's node shapes (honouring node affinity on `nvca.nvcf.nvidia.io/instance-type`), then move
through the phases and conditions a kubelet reports, on the configured delays. Nothing runs in
the background: every call first brings the model up to the injected clock's `now`, and pod
status is computed from each pod's timeline, so a fake clock can jump arbitrarily far.

Fault injection through pod-template annotations: `sim.nvcf.io/fault` (ImagePullBackOff,
CrashLoopBackOff, Unschedulable, NeverReady, FailAfterReady), `sim.nvcf.io/ready-after` and
`sim.nvcf.io/fail-after` (durations such as `3s`, `500ms`, `2m`).
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import json
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from service.backends.protocol import (
    AdapterError,
    Capacity,
    InstanceSpec,
    NodeShape,
    ShapeCapacity,
    check_namespace,
    object_metadata,
)
from service.backends.scheduling import gpu_request, node_affinity_matches
from service.core.jsoncopy import copy_json
from service.core.kube import (
    CLIQUE_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    INSTANCE_TYPE_LABEL,
    is_nvlink,
)
from service.health.observed import ObjectRef, ObservedState, format_time

Clock = Callable[[], datetime]

FAULT_ANNOTATION = "sim.nvcf.io/fault"
READY_AFTER_ANNOTATION = "sim.nvcf.io/ready-after"
FAIL_AFTER_ANNOTATION = "sim.nvcf.io/fail-after"
FAULTS = frozenset(
    {"ImagePullBackOff", "CrashLoopBackOff", "Unschedulable", "NeverReady", "FailAfterReady"}
)
DEFAULT_FAIL_AFTER = 5.0
PROGRESS_DEADLINE_DEFAULT = 600.0
CRASH_BACKOFF_CAP = 300.0  # kubelet's maximum container restart back-off

# Kubernetes' "safe" alphabet for generated name suffixes (no vowels, no look-alikes).
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_WORKLOAD_KINDS = frozenset({"Deployment", "ReplicaSet", "StatefulSet", "Job", "Pod"})


def parse_duration(text: str) -> float:
    """`3s`, `500ms`, `2m`, `1h` or a bare number of seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"invalid duration {text!r}: expected e.g. 3s, 500ms, 2m, 1h")
    value = float(match.group(1))
    return value * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[match.group(2) or "s"]


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class SimulationDelays:
    """How long the simulated scheduler, image pulls and readiness take (seconds)."""

    schedule_seconds: float = 0.5
    pull_seconds: float = 1.0
    ready_seconds: float = 2.0

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> SimulationDelays:
        """From the catalog's `simulation: {scheduleSeconds, pullSeconds, readySeconds}`."""
        data = data or {}
        default = cls()
        return cls(
            schedule_seconds=float(data.get("scheduleSeconds", default.schedule_seconds)),
            pull_seconds=float(data.get("pullSeconds", default.pull_seconds)),
            ready_seconds=float(data.get("readySeconds", default.ready_seconds)),
        )


def _map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _suffix(seed: str, length: int) -> str:
    digest = hashlib.sha256(seed.encode()).digest()
    return "".join(_NAME_ALPHABET[b % len(_NAME_ALPHABET)] for b in digest[:length])


@dataclass
class _Node:
    name: str
    gpu: str
    gpus: int
    labels: dict[str, str]
    allocated: int = 0

    @property
    def free(self) -> int:
        return self.gpus - self.allocated


@dataclass
class _SimPod:
    name: str
    uid: str
    seq: int
    owner_kind: str
    owner_name: str
    owner_uid: str
    labels: dict[str, str]
    annotations: dict[str, str]
    spec: dict[str, Any]
    created_at: datetime
    gpus: int
    fault: str | None
    ready_after: float
    fail_after: float
    node: str | None = None
    scheduled_at: datetime | None = None
    unschedulable_since: datetime | None = None
    schedule_message: str = ""
    released: bool = False
    removed: bool = False  # no longer in its namespace (deleted, replaced or overwritten)
    matching: tuple[int, ...] | None = None  # indices of nodes its affinity allows (cached)

    @property
    def restart_policy(self) -> str:
        return str(self.spec.get("restartPolicy") or "Always")

    @property
    def in_job(self) -> bool:
        return self.owner_kind == "Job"


@dataclass
class _Workload:
    kind: str
    name: str
    uid: str
    created_at: datetime
    template_key: str
    pods: list[str] = field(default_factory=list)
    replica_set: str = ""  # Deployments: the name of the ReplicaSet it created
    replica_set_uid: str = ""


@dataclass
class _Namespace:
    instance: InstanceSpec
    created_at: datetime
    objects: dict[ObjectRef, dict[str, Any]] = field(default_factory=dict)
    workloads: dict[ObjectRef, _Workload] = field(default_factory=dict)
    pods: dict[str, _SimPod] = field(default_factory=dict)
    generation: int = 0


@dataclass(frozen=True)
class _Timeline:
    """What a scheduled pod's main containers look like at one moment."""

    phase: str
    state: dict[str, Any]
    ready: bool
    ready_since: datetime
    restart_count: int = 0
    last_state: dict[str, Any] | None = None
    not_ready_reason: str = "ContainersNotReady"


def _ts(value: datetime) -> str:
    return format_time(value)


def _secs(value: float) -> timedelta:
    return timedelta(seconds=value)


class SimulatedAdapter:
    """A simulated cluster with `BackendAdapter`'s interface; safe for concurrent tasks."""

    def __init__(
        self,
        name: str,
        *,
        provider: str,
        nodes: Sequence[NodeShape],
        delays: SimulationDelays | None = None,
        clock: Clock | None = None,
        attributes: Iterable[str] = (),
    ) -> None:
        self.name = name
        self.provider = provider.upper()
        self.delays = delays or SimulationDelays()
        self._clock = clock or _utc_now
        self._lock = asyncio.Lock()
        self._namespaces: dict[str, _Namespace] = {}
        self._seq = 0
        nvlink = is_nvlink(attributes)
        self._nodes: list[_Node] = []
        self._shapes = list(nodes)
        # Scheduler state, so that a call costs what the pods it concerns cost, not the cluster:
        # pods not yet looked at by the scheduler, by (created_at, seq); pods that did not fit,
        # retried only after GPUs were freed; bound pods that will finish, by finishing time.
        self._queued: list[tuple[datetime, int, _SimPod]] = []
        self._waiting: dict[int, _SimPod] = {}
        self._finishing: list[tuple[datetime, int, _SimPod]] = []
        self._gpus_freed = False
        self._matching_cache: dict[str, tuple[int, ...]] = {}
        for shape in self._shapes:
            for i in range(shape.count):
                node_name = f"{name}-{shape.gpu.lower()}-{shape.gpus_per_node}x-{i}"
                labels = {
                    "kubernetes.io/hostname": node_name,
                    INSTANCE_TYPE_LABEL: f"{self.provider}.GPU.{shape.gpu.upper()}",
                    GPU_PRODUCT_LABEL: shape.gpu.upper(),
                    "nvidia.com/gpu.count": str(shape.gpus_per_node),
                }
                if nvlink:
                    labels[CLIQUE_LABEL] = f"{name}-{shape.gpu.lower()}.0"
                self._nodes.append(_Node(node_name, shape.gpu.upper(), shape.gpus_per_node, labels))
        self._node_index = {n.name: i for i, n in enumerate(self._nodes)}

    # ------------------------------------------------------------------ public interface

    async def apply(self, instance: InstanceSpec, objects: list[dict[str, Any]]) -> None:
        async with self._lock:
            now = self._now()
            self._advance(now)
            ns = self._namespaces.get(instance.namespace)
            if ns is None:
                ns = _Namespace(instance=instance, created_at=now)
            for obj in objects:
                self._check(instance, obj)
            self._namespaces[instance.namespace] = ns
            for obj in objects:
                ref = ObjectRef.from_k8s(obj)
                stored = copy_json(obj)
                _map(stored.setdefault("metadata", {}))["namespace"] = instance.namespace
                ns.objects[ref] = stored
                if ref.kind in _WORKLOAD_KINDS:
                    self._reconcile_workload(ns, ref, stored, now)
            self._advance(now)

    async def observe(self, instance: InstanceSpec) -> ObservedState:
        async with self._lock:
            now = self._now()
            self._advance(now)
            ns = self._namespaces.get(instance.namespace)
            if ns is None:
                return ObservedState()
            objects, events = self._snapshot(ns, now)
            selector: dict[str, str] | None = None
            if instance.worker_service is not None:
                service = ns.objects.get(ObjectRef("Service", instance.worker_service))
                spec = _map(service.get("spec")) if service else {}
                selector = {str(k): str(v) for k, v in _map(spec.get("selector")).items()}
            return ObservedState.from_k8s(
                objects, events=events, expected=ns.objects.keys(), worker_selector=selector
            )

    async def delete(self, instance: InstanceSpec) -> bool:
        async with self._lock:
            now = self._now()
            self._advance(now)
            ns = self._namespaces.pop(instance.namespace, None)
            if ns is not None:
                for pod in ns.pods.values():
                    self._remove(pod)
                    self._release(pod)
            # Freed GPUs go to pods that were waiting for them, as the scheduler would.
            self._advance(now)
            return True

    async def capacity(self) -> Capacity:
        async with self._lock:
            self._advance(self._now())
            free = self._free_after_queued_pods()
            shapes: list[ShapeCapacity] = []
            index = 0
            for shape in self._shapes:
                shapes.append(
                    ShapeCapacity(
                        shape.gpu.upper(),
                        shape.gpus_per_node,
                        tuple(free[index : index + shape.count]),
                    )
                )
                index += shape.count
            return Capacity(tuple(shapes))

    async def objects(self, instance: InstanceSpec) -> list[dict[str, Any]]:
        """The instance namespace's objects with their status, as `kubectl get -o json` shows."""
        async with self._lock:
            now = self._now()
            self._advance(now)
            ns = self._namespaces.get(instance.namespace)
            # snapshots share nested parts with the stored state: the caller gets its own copy
            return copy_json(self._snapshot(ns, now)[0]) if ns is not None else []

    async def aclose(self) -> None:
        return None

    # ------------------------------------------------------------------ apply

    def _now(self) -> datetime:
        now = self._clock()
        return now if now.tzinfo is not None else now.replace(tzinfo=UTC)

    def _check(self, instance: InstanceSpec, obj: Any) -> None:
        metadata = object_metadata(obj)
        check_namespace(instance, metadata)
        if obj["kind"] in _WORKLOAD_KINDS:
            annotations = _map(_map(self._template(obj).get("metadata")).get("annotations"))
            fault = annotations.get(FAULT_ANNOTATION)
            if fault is not None and fault not in FAULTS:
                raise AdapterError(
                    f"unknown {FAULT_ANNOTATION} {fault!r} on {obj['kind']}/{metadata['name']}; "
                    f"expected one of {', '.join(sorted(FAULTS))}",
                    retryable=False,
                )
            for key in (READY_AFTER_ANNOTATION, FAIL_AFTER_ANNOTATION):
                if key in annotations:
                    try:
                        parse_duration(str(annotations[key]))
                    except ValueError as exc:
                        raise AdapterError(str(exc), retryable=False) from exc

    @staticmethod
    def _template(obj: Mapping[str, Any]) -> dict[str, Any]:
        if obj.get("kind") == "Pod":
            return {"metadata": _map(obj.get("metadata")), "spec": _map(obj.get("spec"))}
        return _map(_map(obj.get("spec")).get("template"))

    def _uid(self, ns: _Namespace, *parts: object) -> str:
        seed = "/".join([self.name, ns.instance.namespace, str(ns.generation), *map(str, parts)])
        return str(uuid.uuid5(uuid.NAMESPACE_URL, seed))

    def _reconcile_workload(
        self, ns: _Namespace, ref: ObjectRef, obj: dict[str, Any], now: datetime
    ) -> None:
        spec = _map(obj.get("spec"))
        if ref.kind == "Pod":
            replicas = 1
        elif ref.kind == "Job":
            replicas = int(spec.get("parallelism", 1) or 0)
        else:
            replicas = int(spec.get("replicas", 1) if spec.get("replicas") is not None else 1)
        template = self._template(obj)
        key = json.dumps([replicas, template], sort_keys=True, default=str)
        existing = ns.workloads.get(ref)
        if existing is not None and existing.template_key == key:
            return  # unchanged: server-side apply is a no-op for the pods
        if existing is not None:
            for pod_name in existing.pods:
                pod = ns.pods.pop(pod_name, None)
                if pod is not None:
                    self._remove(pod)
                    self._release(pod)
        ns.generation += 1
        workload = _Workload(ref.kind, ref.name, self._uid(ns, ref), now, key)
        ns.workloads[ref] = workload
        metadata = _map(template.get("metadata"))
        labels = {str(k): str(v) for k, v in _map(metadata.get("labels")).items()}
        owner_name, owner_uid = ref.name, workload.uid
        if ref.kind == "Deployment":
            template_hash = _suffix(key, 10)
            workload.replica_set = f"{ref.name}-{template_hash}"
            workload.replica_set_uid = self._uid(ns, "ReplicaSet", workload.replica_set)
            labels["pod-template-hash"] = template_hash
            owner_name, owner_uid = workload.replica_set, workload.replica_set_uid
        elif ref.kind == "Job":
            labels.update(
                {
                    "batch.kubernetes.io/controller-uid": workload.uid,
                    "batch.kubernetes.io/job-name": ref.name,
                    "controller-uid": workload.uid,
                    "job-name": ref.name,
                }
            )
        for i in range(replicas):
            if ref.kind == "Pod":
                pod_name = ref.name
            elif ref.kind == "StatefulSet":
                pod_name = f"{ref.name}-{i}"
            else:
                pod_name = f"{owner_name}-{_suffix(f'{owner_uid}/{i}', 5)}"
            pod_labels = dict(labels)
            if ref.kind == "StatefulSet":
                pod_labels["statefulset.kubernetes.io/pod-name"] = pod_name
            self._create_pod(ns, workload, pod_name, pod_labels, template, now)

    def _create_pod(
        self,
        ns: _Namespace,
        workload: _Workload,
        pod_name: str,
        labels: dict[str, str],
        template: Mapping[str, Any],
        now: datetime,
    ) -> None:
        metadata = _map(template.get("metadata"))
        annotations = {str(k): str(v) for k, v in _map(metadata.get("annotations")).items()}
        spec = copy_json(_map(template.get("spec")))
        if workload.kind == "Deployment":
            owner = ("ReplicaSet", workload.replica_set, workload.replica_set_uid)
        elif workload.kind == "Pod":
            owner = ("", "", "")
        else:
            owner = (workload.kind, workload.name, workload.uid)
        ready_after = annotations.get(READY_AFTER_ANNOTATION)
        fail_after = annotations.get(FAIL_AFTER_ANNOTATION)
        self._seq += 1
        pod = _SimPod(
            name=pod_name,
            uid=self._uid(ns, "Pod", pod_name),
            seq=self._seq,
            owner_kind=owner[0],
            owner_name=owner[1],
            owner_uid=owner[2],
            labels=labels,
            annotations=annotations,
            spec=spec,
            created_at=now,
            gpus=gpu_request(spec),
            fault=annotations.get(FAULT_ANNOTATION),
            ready_after=(parse_duration(ready_after) if ready_after else self.delays.ready_seconds),
            fail_after=parse_duration(fail_after) if fail_after else DEFAULT_FAIL_AFTER,
        )
        overwritten = ns.pods.get(pod_name)
        if overwritten is not None:
            self._remove(overwritten)  # dropped from the model, as before; GPUs not returned
        ns.pods[pod_name] = pod
        workload.pods.append(pod_name)
        heapq.heappush(self._queued, (pod.created_at, pod.seq, pod))

    # ------------------------------------------------------------------ scheduling

    def _remove(self, pod: _SimPod) -> None:
        """The pod left its namespace: the scheduler forgets it (its queue entries go lazily)."""
        pod.removed = True
        self._waiting.pop(pod.seq, None)

    def _release(self, pod: _SimPod) -> None:
        if pod.node is not None and not pod.released:
            self._nodes[self._node_index[pod.node]].allocated -= pod.gpus
            pod.released = True
            if pod.gpus:
                self._gpus_freed = True

    def _advance(self, now: datetime) -> None:
        """Bring the model to `now`: free GPUs of finished pods, then schedule waiting pods.

        Equivalent to going through every pod in (created_at, seq) order, without doing so:
        finished pods come off a heap by finishing time; pods the scheduler has not looked at
        come off a heap once eligible; pods that did not fit are retried only when GPUs were
        freed since they last failed (otherwise they would fail again, unchanged), merged in
        creation order with the newly eligible ones.
        """
        finishing = self._finishing
        while finishing and finishing[0][0] <= now:
            pod = heapq.heappop(finishing)[2]
            if not pod.removed:
                self._release(pod)
        delay = _secs(self.delays.schedule_seconds)
        queued = self._queued
        fresh: list[_SimPod] = []
        while queued and (queued[0][2].removed or queued[0][0] + delay <= now):
            pod = heapq.heappop(queued)[2]
            if not pod.removed:
                fresh.append(pod)
        retry = self._gpus_freed and bool(self._waiting)
        self._gpus_freed = False
        if not fresh and not retry:
            return
        candidates: Iterable[_SimPod] = fresh
        max_free = 0
        if retry:
            waiting = sorted(self._waiting.values(), key=lambda p: (p.created_at, p.seq))
            candidates = heapq.merge(waiting, fresh, key=lambda p: (p.created_at, p.seq))
            max_free = max((n.free for n in self._nodes), default=0)
        for pod in candidates:
            eligible = pod.created_at + delay
            if pod.unschedulable_since is not None:  # a retry
                if now < eligible:  # only with a clock that went back: try again next time
                    self._gpus_freed = True
                    continue
                if pod.gpus > max_free:
                    continue  # cannot fit anywhere; failing again would change nothing
            node, message = self._pick_node(pod)
            if node is None:
                pod.unschedulable_since = pod.unschedulable_since or eligible
                pod.schedule_message = message
                if pod.fault != "Unschedulable":  # that fault never schedules: no retries
                    self._waiting[pod.seq] = pod
                continue
            self._waiting.pop(pod.seq, None)
            node.allocated += pod.gpus
            pod.node = node.name
            # Retried pods bind when room appeared; `now` is the call that freed it.
            pod.scheduled_at = eligible if pod.unschedulable_since is None else now
            finished = self._terminal_at(pod)
            if finished is not None:
                heapq.heappush(finishing, (finished, pod.seq, pod))

    def _matching(self, pod: _SimPod) -> tuple[int, ...]:
        """Indices of the nodes the pod's node selector and affinity allow, in node order."""
        if pod.matching is None:
            key = repr((pod.spec.get("nodeSelector"), pod.spec.get("affinity")))
            matching = self._matching_cache.get(key)
            if matching is None:
                matching = tuple(
                    i
                    for i, n in enumerate(self._nodes)
                    if node_affinity_matches(pod.spec, n.labels)
                )
                if len(self._matching_cache) >= 1024:
                    self._matching_cache.clear()
                self._matching_cache[key] = matching
            pod.matching = matching
        return pod.matching

    def _free_after_queued_pods(self) -> list[int]:
        """Free GPUs per node once pods the scheduler has not looked at yet are placed.

        Without this, an instance applied a moment ago would not count against capacity until
        its pods are bound, and placement could promise the same GPUs twice.
        """
        free = [n.free for n in self._nodes]
        queued = sorted(
            entry
            for entry in self._queued
            if not entry[2].removed
            and entry[2].node is None
            and entry[2].unschedulable_since is None
            and entry[2].fault != "Unschedulable"
        )
        for _, _, pod in queued:
            best: int | None = None
            for i in self._matching(pod):
                if free[i] >= pod.gpus and (best is None or free[i] < free[best]):
                    best = i
            if best is not None:
                free[best] -= pod.gpus
        return free

    def _pick_node(self, pod: _SimPod) -> tuple[_Node | None, str]:
        total = len(self._nodes)
        if pod.fault == "Unschedulable":
            return None, (
                f"0/{total} nodes are available: {total} node(s) didn't match Pod's node "
                f"affinity/selector. preemption: 0/{total} nodes are available: {total} "
                "Preemption is not helpful for scheduling."
            )
        matching = self._matching(pod)
        # Best fit keeps whole nodes free for full-node and multi-node instance types; ties go
        # to the first node (indices ascend, so a strict `<` keeps the earliest).
        best: _Node | None = None
        for i in matching:
            node = self._nodes[i]
            if node.free >= pod.gpus and (best is None or node.free < best.free):
                best = node
        if best is not None:
            return best, ""
        parts = []
        if len(matching):
            parts.append(f"{len(matching)} Insufficient {GPU_RESOURCE}")
        if total - len(matching):
            parts.append(
                f"{total - len(matching)} node(s) didn't match Pod's node affinity/selector"
            )
        return None, (
            f"0/{total} nodes are available: {', '.join(parts)}. preemption: 0/{total} nodes are "
            f"available: {len(matching)} No preemption victims found for incoming pod, "
            f"{total - len(matching)} Preemption is not helpful for scheduling."
        )

    # ------------------------------------------------------------------ pod timelines

    def _crashes(self, pod: _SimPod) -> bool:
        if pod.fault == "CrashLoopBackOff":
            return True
        # A Job's pods are expected to run to completion; any "unhealthy" fault fails them.
        return pod.in_job and pod.fault in ("NeverReady", "FailAfterReady")

    def _run_seconds(self) -> float:
        return max(self.delays.ready_seconds, 0.1)

    def _init_done_at(self, pod: _SimPod) -> datetime:
        assert pod.scheduled_at is not None
        has_init = bool(_list(pod.spec.get("initContainers")))
        return pod.scheduled_at + _secs(self.delays.pull_seconds if has_init else 0.0)

    def _started_at(self, pod: _SimPod) -> datetime:
        return self._init_done_at(pod) + _secs(self.delays.pull_seconds)

    def _terminal_at(self, pod: _SimPod) -> datetime | None:
        """When the pod reaches Succeeded or Failed, if it ever does."""
        if pod.scheduled_at is None or pod.fault in ("ImagePullBackOff", "Unschedulable"):
            return None
        start = self._started_at(pod)
        if self._crashes(pod):
            return start + _secs(self._run_seconds()) if pod.restart_policy == "Never" else None
        if pod.in_job:
            return start + _secs(pod.ready_after)
        return None

    def _first_ready_at(self, pod: _SimPod) -> datetime | None:
        if pod.scheduled_at is None or pod.fault not in (None, "FailAfterReady"):
            return None
        start = self._started_at(pod)
        return start if pod.in_job else start + _secs(pod.ready_after)

    def _job_failed_at(self, pod: _SimPod) -> datetime | None:
        if not pod.in_job or pod.scheduled_at is None or not self._crashes(pod):
            return None
        return self._started_at(pod) + _secs(self._run_seconds())

    def _main_timeline(
        self, pod: _SimPod, now: datetime, started: datetime, namespace: str
    ) -> _Timeline:
        scheduled = pod.scheduled_at or started
        image = self._image(pod)
        if now < started:
            creating = {"waiting": {"reason": "ContainerCreating"}}
            return _Timeline("Pending", creating, False, scheduled)
        if pod.fault == "ImagePullBackOff":
            backoff = now >= started + _secs(max(self.delays.pull_seconds, 1.0))
            if backoff:
                waiting = {
                    "reason": "ImagePullBackOff",
                    "message": f'Back-off pulling image "{image}"',
                }
            else:
                waiting = {"reason": "ErrImagePull", "message": _pull_error(image)}
            state: dict[str, Any] = {"waiting": waiting}
            return _Timeline("Pending", state, False, scheduled)
        running = {"running": {"startedAt": _ts(started)}}
        if self._crashes(pod):
            return self._crash_timeline(pod, now, started, namespace)
        if pod.in_job:
            done = started + _secs(pod.ready_after)
            if now < done:
                return _Timeline("Running", running, True, started)
            state = {
                "terminated": {
                    "exitCode": 0,
                    "reason": "Completed",
                    "startedAt": _ts(started),
                    "finishedAt": _ts(done),
                }
            }
            return _Timeline("Succeeded", state, False, done, not_ready_reason="PodCompleted")
        if pod.fault == "NeverReady":
            return _Timeline("Running", running, False, scheduled)
        ready_at = started + _secs(pod.ready_after)
        if now < ready_at:
            return _Timeline("Running", running, False, scheduled)
        if pod.fault == "FailAfterReady":
            failed_at = ready_at + _secs(pod.fail_after)
            if now >= failed_at:
                return _Timeline("Running", running, False, failed_at)
        return _Timeline("Running", running, True, ready_at)

    def _crash_timeline(
        self, pod: _SimPod, now: datetime, started: datetime, namespace: str
    ) -> _Timeline:
        run = self._run_seconds()
        crashed_at = started + _secs(run)
        terminated = {
            "terminated": {
                "exitCode": 1,
                "reason": "Error",
                "startedAt": _ts(started),
                "finishedAt": _ts(crashed_at),
            }
        }
        if now < crashed_at:
            return _Timeline("Running", {"running": {"startedAt": _ts(started)}}, False, started)
        if pod.restart_policy == "Never":
            return _Timeline("Failed", terminated, False, crashed_at, not_ready_reason="PodFailed")
        base = min(10.0, run)
        restarts = 0
        run_start, run_end = started, crashed_at
        while True:
            backoff = min(base * 2**restarts, CRASH_BACKOFF_CAP)
            next_start = run_end + _secs(backoff)
            last = {
                "terminated": {
                    "exitCode": 1,
                    "reason": "Error",
                    "startedAt": _ts(run_start),
                    "finishedAt": _ts(run_end),
                }
            }
            if now < next_start:
                message = (
                    f"back-off {human_seconds(backoff)} restarting failed container="
                    f"{self._container_name(pod)} pod={pod.name}_{namespace}({pod.uid})"
                )
                state = {"waiting": {"reason": "CrashLoopBackOff", "message": message}}
                return _Timeline("Running", state, False, started, restarts + 1, last)
            restarts += 1
            run_start, run_end = next_start, next_start + _secs(run)
            if now < run_end:
                state = {"running": {"startedAt": _ts(run_start)}}
                return _Timeline("Running", state, False, started, restarts, last)

    @staticmethod
    def _image(pod: _SimPod) -> str:
        containers = _list(pod.spec.get("containers"))
        return str(_map(containers[0]).get("image", "")) if containers else ""

    @staticmethod
    def _container_name(pod: _SimPod) -> str:
        containers = _list(pod.spec.get("containers"))
        return str(_map(containers[0]).get("name", "")) if containers else ""

    # ------------------------------------------------------------------ snapshots

    def _snapshot(
        self, ns: _Namespace, now: datetime
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        objects: list[dict[str, Any]] = []
        events: list[dict[str, Any]] = []
        pod_objects: dict[str, dict[str, Any]] = {}
        for pod in ns.pods.values():
            obj, pod_events = self._pod_object(ns, pod, now)
            pod_objects[pod.name] = obj
            events.extend(pod_events)
        for ref, stored in ns.objects.items():
            # Shallow: what changes below is the top level and the metadata; snapshots are only
            # read (observe) or deep-copied for callers (objects).
            obj = {**stored, "metadata": dict(stored.get("metadata") or {})}
            metadata = obj["metadata"]
            metadata.setdefault("uid", self._uid(ns, "object", ref))
            metadata.setdefault("creationTimestamp", _ts(ns.created_at))
            workload = ns.workloads.get(ref)
            if workload is not None and ref.kind != "Pod":
                metadata["uid"] = workload.uid
                metadata["creationTimestamp"] = _ts(workload.created_at)
                pods = [ns.pods[name] for name in workload.pods if name in ns.pods]
                statuses = [pod_objects[p.name] for p in pods]
                obj["status"], extra = self._controller_status(
                    ns, ref, obj, workload, pods, statuses, now
                )
                events.extend(extra)
                if ref.kind == "Deployment":
                    objects.append(self._replica_set(ns, workload, obj, statuses))
            if ref.kind != "Pod":
                objects.append(obj)
        objects.extend(pod_objects.values())
        return objects, events

    def _event(
        self,
        ns: _Namespace,
        kind: str,
        name: str,
        reason: str,
        message: str,
        first: datetime,
        last: datetime,
        count: int = 1,
    ) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{name}.{_suffix(f'{kind}/{name}/{reason}', 16)}",
                "namespace": ns.instance.namespace,
            },
            "involvedObject": {
                "apiVersion": "apps/v1"
                if kind in ("Deployment", "ReplicaSet", "StatefulSet")
                else "v1",
                "kind": kind,
                "name": name,
                "namespace": ns.instance.namespace,
            },
            "type": "Warning",
            "reason": reason,
            "message": message,
            "firstTimestamp": _ts(first),
            "lastTimestamp": _ts(max(first, last)),
            "count": max(count, 1),
            "source": {
                "component": "kubelet" if reason != "FailedScheduling" else "default-scheduler"
            },
        }

    def _pod_object(
        self, ns: _Namespace, pod: _SimPod, now: datetime
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        metadata: dict[str, Any] = {
            "name": pod.name,
            "namespace": ns.instance.namespace,
            "uid": pod.uid,
            "labels": dict(pod.labels),
            "annotations": dict(pod.annotations),
            "creationTimestamp": _ts(pod.created_at),
        }
        if pod.owner_kind:
            metadata["ownerReferences"] = [
                {
                    "apiVersion": "batch/v1" if pod.owner_kind == "Job" else "apps/v1",
                    "kind": pod.owner_kind,
                    "name": pod.owner_name,
                    "uid": pod.owner_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
        spec = dict(pod.spec)  # only top-level keys are set below
        spec.setdefault("restartPolicy", "Always")
        status, events = self._pod_status(ns, pod, now)
        if pod.node is not None:
            spec["nodeName"] = pod.node
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": spec,
            "status": status,
        }, events

    def _pod_status(
        self, ns: _Namespace, pod: _SimPod, now: datetime
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        events: list[dict[str, Any]] = []
        status: dict[str, Any] = {"phase": "Pending", "qosClass": "Burstable"}
        if pod.unschedulable_since is not None:
            until = pod.scheduled_at or now
            events.append(
                self._event(
                    ns,
                    "Pod",
                    pod.name,
                    "FailedScheduling",
                    pod.schedule_message,
                    pod.unschedulable_since,
                    until,
                )
            )
        if pod.node is None or pod.scheduled_at is None:
            if pod.unschedulable_since is not None:
                status["conditions"] = [
                    _condition(
                        "PodScheduled",
                        "False",
                        pod.unschedulable_since,
                        "Unschedulable",
                        pod.schedule_message,
                    )
                ]
            return status, events

        scheduled = pod.scheduled_at
        node_index = self._node_index[pod.node]
        status.update(
            hostIP=f"10.0.0.{node_index + 1}",
            podIP=f"10.244.{node_index}.{pod.seq % 250 + 2}",
            startTime=_ts(scheduled),
        )
        containers = [_map(c) for c in _list(pod.spec.get("containers"))]
        inits = [_map(c) for c in _list(pod.spec.get("initContainers"))]
        init_done = self._init_done_at(pod)
        conditions = [_condition("PodScheduled", "True", scheduled)]
        if inits and now < init_done:
            status["initContainerStatuses"] = [
                _container_status(
                    c,
                    {"running": {"startedAt": _ts(scheduled)}}
                    if i == 0
                    else {"waiting": {"reason": "PodInitializing"}},
                )
                for i, c in enumerate(inits)
            ]
            status["containerStatuses"] = [
                _container_status(c, {"waiting": {"reason": "PodInitializing"}}) for c in containers
            ]
            names = ", ".join(str(c.get("name", "")) for c in inits)
            conditions += [
                _condition(
                    "Initialized",
                    "False",
                    scheduled,
                    "ContainersNotInitialized",
                    f"containers with incomplete status: [{names}]",
                ),
                *_readiness_conditions(False, scheduled, "ContainersNotReady", containers),
            ]
            status["conditions"] = conditions
            return status, events
        if inits:
            status["initContainerStatuses"] = [
                _container_status(
                    c,
                    {
                        "terminated": {
                            "exitCode": 0,
                            "reason": "Completed",
                            "startedAt": _ts(scheduled),
                            "finishedAt": _ts(init_done),
                        }
                    },
                )
                for c in inits
            ]
        conditions.append(_condition("Initialized", "True", init_done))
        started = self._started_at(pod)
        line = self._main_timeline(pod, now, started, ns.instance.namespace)
        status["phase"] = line.phase
        status["containerStatuses"] = [
            _container_status(c, line.state, line.ready, line.restart_count, line.last_state)
            for c in containers
        ]
        conditions += _readiness_conditions(
            line.ready, line.ready_since, line.not_ready_reason, containers
        )
        status["conditions"] = conditions
        if line.phase == "Failed":
            status["reason"] = "Error"
        events.extend(self._pod_events(ns, pod, now, started, line))
        return status, events

    def _pod_events(
        self, ns: _Namespace, pod: _SimPod, now: datetime, started: datetime, line: _Timeline
    ) -> list[dict[str, Any]]:
        if now < started:
            return []
        image = self._image(pod)
        if pod.fault == "ImagePullBackOff":
            return [
                self._event(
                    ns,
                    "Pod",
                    pod.name,
                    "Failed",
                    f'Failed to pull image "{image}": {_pull_error(image)}',
                    started,
                    now,
                ),
                self._event(
                    ns,
                    "Pod",
                    pod.name,
                    "BackOff",
                    f'Back-off pulling image "{image}"',
                    started,
                    now,
                ),
            ]
        if self._crashes(pod) and line.restart_count:
            crashed = started + _secs(self._run_seconds())
            return [
                self._event(
                    ns,
                    "Pod",
                    pod.name,
                    "BackOff",
                    f"Back-off restarting failed container {self._container_name(pod)} in pod "
                    f"{pod.name}_{ns.instance.namespace}({pod.uid})",
                    crashed,
                    now,
                    line.restart_count,
                )
            ]
        unhealthy_since: datetime | None = None
        if pod.fault == "NeverReady" and not pod.in_job:
            unhealthy_since = started
        elif (
            pod.fault == "FailAfterReady"
            and not pod.in_job
            and not line.ready
            and now >= started + _secs(pod.ready_after)
        ):
            unhealthy_since = line.ready_since
        if unhealthy_since is None:
            return []
        return [
            self._event(
                ns,
                "Pod",
                pod.name,
                "Unhealthy",
                "Readiness probe failed: HTTP probe failed with statuscode: 503",
                unhealthy_since,
                now,
            )
        ]

    # ------------------------------------------------------------------ controllers

    def _controller_status(
        self,
        ns: _Namespace,
        ref: ObjectRef,
        obj: Mapping[str, Any],
        workload: _Workload,
        pods: list[_SimPod],
        statuses: list[dict[str, Any]],
        now: datetime,
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        ready = sum(1 for s in statuses if _is_ready(s))
        count = len(statuses)
        if ref.kind == "Job":
            return self._job_status(ns, ref, workload, pods, statuses, now)
        if ref.kind == "StatefulSet":
            return {
                "observedGeneration": 1,
                "replicas": count,
                "readyReplicas": ready,
                "currentReplicas": count,
                "updatedReplicas": count,
                "availableReplicas": ready,
            }, []
        status: dict[str, Any] = {
            "observedGeneration": 1,
            "replicas": count,
            "readyReplicas": ready,
            "availableReplicas": ready,
        }
        if ref.kind == "ReplicaSet":
            status["fullyLabeledReplicas"] = count
            return status, []
        status["updatedReplicas"] = count
        if count - ready:
            status["unavailableReplicas"] = count - ready
        deadline = float(
            _map(obj.get("spec")).get("progressDeadlineSeconds", PROGRESS_DEADLINE_DEFAULT)
        )
        ready_times = [self._first_ready_at(p) for p in pods]
        complete_at = (
            max((t for t in ready_times if t is not None), default=workload.created_at)
            if all(t is not None and t <= now for t in ready_times)
            else None
        )
        rs = workload.replica_set
        if complete_at is not None:
            progressing = _condition(
                "Progressing",
                "True",
                complete_at,
                "NewReplicaSetAvailable",
                f'ReplicaSet "{rs}" has successfully progressed.',
            )
        elif now >= workload.created_at + _secs(deadline):
            progressing = _condition(
                "Progressing",
                "False",
                workload.created_at + _secs(deadline),
                "ProgressDeadlineExceeded",
                f'ReplicaSet "{rs}" has timed out progressing.',
            )
        else:
            progressing = _condition(
                "Progressing",
                "True",
                workload.created_at,
                "ReplicaSetUpdated",
                f'ReplicaSet "{rs}" is progressing.',
            )
        available = (
            _condition(
                "Available",
                "True",
                workload.created_at,
                "MinimumReplicasAvailable",
                "Deployment has minimum availability.",
            )
            if ready >= count
            else _condition(
                "Available",
                "False",
                workload.created_at,
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.",
            )
        )
        status["conditions"] = [available, progressing]
        return status, []

    def _job_status(
        self,
        ns: _Namespace,
        ref: ObjectRef,
        workload: _Workload,
        pods: list[_SimPod],
        statuses: list[dict[str, Any]],
        now: datetime,
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        phases = [str(s["status"].get("phase")) for s in statuses]
        status: dict[str, Any] = {
            "startTime": _ts(workload.created_at),
            "active": sum(1 for p in phases if p in ("Pending", "Running")),
            "ready": sum(1 for s in statuses if _is_ready(s)),
            "succeeded": phases.count("Succeeded"),
            "failed": phases.count("Failed"),
            "terminating": 0,
            "uncountedTerminatedPods": {},
        }
        failed_times = [
            t for t in (self._job_failed_at(p) for p in pods) if t is not None and t <= now
        ]
        if failed_times:
            at = min(failed_times)
            message = "Job has reached the specified backoff limit"
            status["active"] = 0
            status["failed"] = max(status["failed"], 1)
            status["conditions"] = [
                _condition("FailureTarget", "True", at, "BackoffLimitExceeded", message),
                _condition("Failed", "True", at, "BackoffLimitExceeded", message),
            ]
            return status, [
                self._event(ns, "Job", ref.name, "BackoffLimitExceeded", message, at, now)
            ]
        if pods and all(p == "Succeeded" for p in phases):
            done = max(t for t in (self._terminal_at(p) for p in pods) if t is not None)
            status["completionTime"] = _ts(done)
            status["conditions"] = [
                _condition(
                    "SuccessCriteriaMet",
                    "True",
                    done,
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                ),
                _condition(
                    "Complete",
                    "True",
                    done,
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                ),
            ]
        return status, []

    def _replica_set(
        self,
        ns: _Namespace,
        workload: _Workload,
        deployment: Mapping[str, Any],
        statuses: list[dict[str, Any]],
    ) -> dict[str, Any]:
        spec = _map(deployment.get("spec"))
        ready = sum(1 for s in statuses if _is_ready(s))
        return {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": workload.replica_set,
                "namespace": ns.instance.namespace,
                "uid": workload.replica_set_uid,
                "creationTimestamp": _ts(workload.created_at),
                "labels": dict(
                    _map(_map(spec.get("template")).get("metadata")).get("labels") or {}
                ),
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": workload.name,
                        "uid": workload.uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {"replicas": len(statuses), "template": spec.get("template")},
            "status": {
                "replicas": len(statuses),
                "fullyLabeledReplicas": len(statuses),
                "readyReplicas": ready,
                "availableReplicas": ready,
                "observedGeneration": 1,
            },
        }


def human_seconds(seconds: float) -> str:
    """Go-style duration as kubelet prints back-off (`10s`, `1m20s`, `5m0s`)."""
    whole = round(seconds)
    if whole < 60:
        return f"{seconds:g}s" if seconds < 1 else f"{whole}s"
    minutes, secs = divmod(whole, 60)
    return f"{minutes}m{secs}s"


def _pull_error(image: str) -> str:
    return (
        f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": '
        f'"{image}": not found'
    )


def _condition(
    type_: str, status: str, at: datetime, reason: str = "", message: str = ""
) -> dict[str, Any]:
    cond: dict[str, Any] = {
        "type": type_,
        "status": status,
        "lastProbeTime": None,
        "lastTransitionTime": _ts(at),
    }
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    return cond


def _readiness_conditions(
    ready: bool, since: datetime, reason: str, containers: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    if ready:
        return [_condition("ContainersReady", "True", since), _condition("Ready", "True", since)]
    names = ", ".join(str(c.get("name", "")) for c in containers)
    message = "" if reason == "PodCompleted" else f"containers with unready status: [{names}]"
    return [
        _condition("ContainersReady", "False", since, reason, message),
        _condition("Ready", "False", since, reason, message),
    ]


def _container_status(
    container: Mapping[str, Any],
    state: dict[str, Any],
    ready: bool = False,
    restart_count: int = 0,
    last_state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    running = "running" in state
    image = str(container.get("image", ""))
    out: dict[str, Any] = {
        "name": str(container.get("name", "")),
        "image": image,
        "imageID": ""
        if "waiting" in state
        else f"{image}@sha256:{hashlib.sha256(image.encode()).hexdigest()}",
        "ready": ready,
        "restartCount": restart_count,
        "started": running,
        "state": state,
        "lastState": last_state or {},
    }
    return out


def _is_ready(pod: Mapping[str, Any]) -> bool:
    for cond in _list(_map(pod.get("status")).get("conditions")):
        if _map(cond).get("type") == "Ready":
            return _map(cond).get("status") == "True"
    return False
