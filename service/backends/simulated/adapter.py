"""`SimulatedAdapter`: the simulated cluster behind `BackendAdapter`'s interface. It stores
applied objects per instance namespace, creates the pods of workloads, and hands them to the
scheduler; observe/objects render the namespace's status at the clock's `now`.

It is a change feed (backends/changes.py): the scheduler's decisions, the steps of each pod's
timeline (`timeline.next_change`) and fault annotations (`annotate_pods`) mark the instance
whose simulated state changed, so the reconciler re-observes only those.

`endpoint` answers with the built-in simulated worker (simulated/worker.py, in process), or,
when the cluster names an `upstream` server, with that real server for every instance.
"""

from __future__ import annotations

import asyncio
import heapq
import json
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from service.backends.changes import ChangeLog, Changes
from service.backends.http1 import AnswerBounds, Http1Endpoint, Http1Pool
from service.backends.logs import LogLine, LogRequest
from service.backends.protocol import (
    AdapterError,
    Capacity,
    InstanceSpec,
    NodeShape,
    ShapeCapacity,
)
from service.backends.scheduling import gpu_request
from service.backends.simulated.checks import check_object, pod_template, task_script
from service.backends.simulated.logs import SimulatedLogBook, Snapshot
from service.backends.simulated.model import (
    DEFAULT_FAIL_AFTER,
    FAIL_AFTER_ANNOTATION,
    FAULT_ANNOTATION,
    FAULT_INSTANCES_ANNOTATION,
    FAULTS,
    PROGRESS_DEADLINE_DEFAULT,
    READY_AFTER_ANNOTATION,
    WORKLOAD_KINDS,
    Clock,
    Namespace,
    SimPod,
    SimulationDelays,
    Workload,
    as_map,
    name_suffix,
    object_uid,
    parse_duration,
    utc_now,
)
from service.backends.simulated.scheduler import Scheduler
from service.backends.simulated.status import StatusRenderer, min_ready_seconds
from service.backends.simulated.tasks import (
    TaskScript,
    progress_at,
    result_problem,
    results_at,
    write_result,
)
from service.backends.simulated.timeline import PodTimeline, next_change
from service.backends.simulated.worker import (
    SimulatedEndpoint,
    SimulatedWorkers,
    mounted_secret_names,
)
from service.backends.worker import HttpxEndpoint, WorkerEndpoint, WorkerPort, network_client
from service.core.jsoncopy import copy_json
from service.core.kube import instance_namespace, is_nvlink
from service.core.numbers import natural
from service.health.observed import ObjectRef, ObservedState


def _http_address(upstream: str) -> str:
    """An upstream's address as its endpoints take it: a gRPC server (`grpc://`, `grpcs://`)
    is reached over HTTP/2 at the same host and port (`http://`: h2c, `https://`: TLS)."""
    for scheme, http in (("grpc://", "http://"), ("grpcs://", "https://")):
        if upstream.startswith(scheme):
            return http + upstream.removeprefix(scheme)
    return upstream


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
        upstream: str | None = None,
        worker_bounds: AnswerBounds | None = None,
        worker_utils: bool = False,
    ) -> None:
        self.name = name
        #: its workers (the built-in one, an `upstream` server) run on the server's machine:
        #: the invocation engine hands them per-request asset and output directories
        #: (service/assets); unless the upstream is a worker-utils sidecar, which makes them
        #: as in a Kubernetes pod
        self.files_on_this_machine = not worker_utils
        self.files_in_sidecar = worker_utils
        self._worker_bounds = worker_bounds
        #: a real server answering for every instance of the cluster (None: the built-in one)
        self.upstream = _http_address(upstream.rstrip("/")) if upstream else None
        self._logbook = SimulatedLogBook()
        self._workers = SimulatedWorkers(self._runs, self._secret_names, self._printed)
        #: the secret names each namespace's pods read, computed once per change of it
        self._secret_names_of: dict[str, list[str]] = {}
        #: (version id, workload) -> the namespaces a `fault-instances` fault was given to
        self._faulted: dict[tuple[str, str], list[str]] = {}
        self._pool: Http1Pool | None = None
        self._https: Any = None
        self.provider = provider.upper()
        self.delays = delays or SimulationDelays()
        self._clock = clock or utc_now
        self._lock = asyncio.Lock()
        self._namespaces: dict[str, Namespace] = {}
        self._seq = 0
        self._shapes = list(nodes)
        timeline = PodTimeline(self.delays)
        self._timeline = timeline
        self._scheduler = Scheduler(
            name,
            self.provider,
            self._shapes,
            nvlink=is_nvlink(attributes),
            timeline=timeline,
        )
        self._status = StatusRenderer(name, timeline, self._scheduler.node_index)
        self._timeline = timeline
        self._changes = ChangeLog()
        #: (when, namespace): the next step of each namespace's timeline; `_step_at` holds
        #: the current one (heap entries that differ from it are stale)
        self._steps: list[tuple[datetime, str]] = []
        self._step_at: dict[str, datetime] = {}

    # ------------------------------------------------------------------ public interface

    async def apply(self, instance: InstanceSpec, objects: list[dict[str, Any]]) -> None:
        async with self._lock:
            now = self._now()
            self._advance(now)
            ns = self._namespaces.get(instance.namespace)
            if ns is None:
                ns = Namespace(instance=instance, created_at=now)
            for obj in objects:
                check_object(instance, obj, self.delays.ready_seconds)
            self._namespaces[instance.namespace] = ns
            self._secret_names_of.pop(instance.namespace, None)
            for obj in objects:
                ref = ObjectRef.from_k8s(obj)
                stored = copy_json(obj)
                as_map(stored.setdefault("metadata", {}))["namespace"] = instance.namespace
                ns.objects[ref] = stored
                if ref.kind in WORKLOAD_KINDS:
                    self._reconcile_workload(ns, ref, stored, now)
                if ref.kind == "Job" and as_map(stored.get("spec")).get("suspend") is True:
                    self._stop_job(ns, ref, now)
            self._advance(now)
            self._schedule_step(ns, now)

    async def update_objects(self, instance: InstanceSpec, objects: list[dict[str, Any]]) -> None:
        """Replace objects of an applied instance in place (its Secret on a rotation): pods
        keep running and read the new contents, as a kubelet refreshes a mounted Secret."""
        async with self._lock:
            ns = self._namespaces.get(instance.namespace)
            if ns is None:
                raise AdapterError(
                    f"namespace {instance.namespace} not found on cluster {self.name}",
                    status=404,
                )
            for obj in objects:
                check_object(instance, obj, self.delays.ready_seconds)
                if obj["kind"] in WORKLOAD_KINDS:
                    raise AdapterError(
                        f"update_objects does not take workloads ({obj['kind']})",
                        retryable=False,
                    )
            for obj in objects:
                stored = copy_json(obj)
                as_map(stored.setdefault("metadata", {}))["namespace"] = instance.namespace
                ns.objects[ObjectRef.from_k8s(obj)] = stored
            self._secret_names_of.pop(instance.namespace, None)

    async def observe(self, instance: InstanceSpec) -> ObservedState:
        async with self._lock:
            now = self._now()
            self._advance(now)
            ns = self._namespaces.get(instance.namespace)
            if ns is None:
                return ObservedState()
            objects, events = self._status.snapshot(ns, now)
            selector: dict[str, str] | None = None
            if instance.worker_service is not None:
                service = ns.objects.get(ObjectRef("Service", instance.worker_service))
                spec = as_map(service.get("spec")) if service else {}
                selector = {str(k): str(v) for k, v in as_map(spec.get("selector")).items()}
            return ObservedState.from_k8s(
                objects, events=events, expected=ns.objects.keys(), worker_selector=selector
            )

    async def delete(self, instance: InstanceSpec) -> bool:
        async with self._lock:
            now = self._now()
            self._advance(now)
            ns = self._namespaces.pop(instance.namespace, None)
            self._secret_names_of.pop(instance.namespace, None)
            self._step_at.pop(instance.namespace, None)
            self._workers.health_paths.pop(instance.namespace, None)
            self._logbook.forget(instance.namespace)
            self._workers.torn_down(instance.namespace)
            if ns is not None:
                for pod in ns.pods.values():
                    self._scheduler.remove(pod)
                    self._scheduler.release(pod)
            # Freed GPUs go to pods that were waiting for them, as the scheduler would.
            self._advance(now)
        return True

    async def capacity(self) -> Capacity:
        async with self._lock:
            self._advance(self._now())
            free = self._scheduler.free_after_queued_pods()
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
            return copy_json(self._status.snapshot(ns, now)[0]) if ns is not None else []

    async def endpoint(self, instance: InstanceSpec, port: WorkerPort) -> WorkerEndpoint:
        """The upstream server when the cluster names one; else the built-in worker, which
        refuses connections for instances this cluster does not run."""
        if self.upstream:
            health = self.upstream + port.health_path if port.health_path is not None else None
            if self.upstream.startswith("http://"):
                if self._pool is None:
                    self._pool = Http1Pool(bounds=self._worker_bounds)
                return Http1Endpoint(self.upstream, self._pool, health_url=health)
            if self._https is None:
                self._https = network_client()
            return HttpxEndpoint(self.upstream, self._https, health_url=health)
        base = f"http://{port.service}.{instance.namespace}:{port.port}"
        health = None
        if port.health_path is not None:
            self._workers.health_paths[instance.namespace] = port.health_path
            health = f"http://{port.service}.{instance.namespace}:{port.health_port or port.port}"
            health += port.health_path
        return SimulatedEndpoint(
            self._workers, instance.namespace, base, health, health_path=port.health_path
        )

    def logs(self, instance: InstanceSpec, request: LogRequest) -> AsyncIterator[LogLine]:
        """What the instance's containers printed (backends/simulated/logs.py)."""
        return self._logbook.read(instance.namespace, request, self._timeline, self._log_snapshot)

    async def _log_snapshot(self, namespace: str) -> Snapshot | None:
        async with self._lock:
            now = self._now()
            self._scheduler.advance(now)
            ns = self._namespaces.get(namespace)
            return Snapshot(now, list(ns.pods.values())) if ns is not None else None

    def _printed(self, namespace: str, text: str) -> None:
        self._logbook.print(namespace, self._now(), text)

    async def annotate_pods(self, instance_id: str, annotations: Mapping[str, str | None]) -> int:
        """Set (None: remove) annotations on the running pods of an instance, as `kubectl
        annotate pod` would; `sim.nvcf.io/fault` changes the pods' fault from now on. The
        number of pods annotated (0: the instance is not on this cluster)."""
        fault_given = FAULT_ANNOTATION in annotations
        fault = annotations.get(FAULT_ANNOTATION)
        if fault is not None and fault not in FAULTS:
            expected = ", ".join(sorted(FAULTS))
            raise AdapterError(
                f"unknown {FAULT_ANNOTATION} {fault!r}; expected one of {expected}",
                retryable=False,
            )
        async with self._lock:
            now = self._now()
            self._advance(now)
            ns = self._namespaces.get(instance_namespace(instance_id))
            if ns is None:
                return 0
            for pod in ns.pods.values():
                for key, value in annotations.items():
                    if value is None:
                        pod.annotations.pop(key, None)
                    else:
                        pod.annotations[key] = value
                if fault_given:
                    pod.fault = fault
            self._changes.mark(ns.instance.instance_id)
            self._schedule_step(ns, now)
            return len(ns.pods)

    # ------------------------------------------------------------------ task files

    async def task_progress(self, instance: InstanceSpec, *, max_bytes: int) -> bytes | None:
        """The task container's progress file as of now (simulated/tasks.py)."""
        state = await self._task_state(instance)
        data = progress_at(instance.instance_id, *state) if state else None
        if data is not None and len(data) > max_bytes:
            raise AdapterError(
                f"the progress file is larger than {max_bytes} bytes", retryable=False
            )
        return data

    async def fetch_task_result(
        self, instance: InstanceSpec, name: str, into: str, *, max_bytes: int, max_files: int
    ) -> None:
        state = await self._task_state(instance)
        if state is None:
            raise AdapterError(f"task {instance.instance_id} has no files here", retryable=False)
        script, started, at, _ = state
        files = results_at(script, started, at).get(name)
        problem = result_problem(name, files, max_bytes, max_files)
        if problem is not None:
            raise AdapterError(problem, retryable=False)
        assert files is not None
        await asyncio.to_thread(write_result, files, Path(into))

    async def task_result_names(self, instance: InstanceSpec, *, max_names: int) -> list[str]:
        state = await self._task_state(instance)
        if state is None:
            return []
        script, started, at, _ = state
        return list(results_at(script, started, at))[:max_names]

    async def _task_state(
        self, instance: InstanceSpec
    ) -> tuple[TaskScript, datetime, datetime, datetime | None] | None:
        """The task container's script, start, the moment its files are as of (now, or its
        exit) and its stop request; None when its container never started."""
        async with self._lock:
            now = self._now()
            self._advance(now)
            ns = self._namespaces.get(instance.namespace)
            pod = next((p for p in ns.pods.values() if p.script), None) if ns else None
            if pod is None or pod.scheduled_at is None or pod.fault is not None:
                return None
            started = self._timeline.started_at(pod)
            if now < started:
                return None
            script, stop_at = pod.script, pod.stop_at
            assert script is not None
            end = script.ends(started, stop_at)
            return script, started, min(now, end[0]) if end is not None else now, stop_at

    def _stop_job(self, ns: Namespace, ref: ObjectRef, now: datetime) -> None:
        """A suspended Job: its running pods are asked to stop (SIGTERM), once."""
        workload = ns.workloads.get(ref)
        for pod_name in workload.pods if workload else []:
            pod = ns.pods.get(pod_name)
            if pod is not None and pod.stop_at is None:
                pod.stop_at = now
                self._scheduler.ends_changed(pod)
        self._changes.mark(ns.instance.instance_id)

    # ------------------------------------------------------------------ change feed

    def watch_changes(self, wake: Callable[[], None]) -> None:
        self._changes.wake = wake

    def take_changes(self, now: datetime) -> Changes:
        """The instances whose simulated state changed by `now`: scheduler decisions, fault
        annotations, and timeline steps that came due."""
        now = now if now.tzinfo is not None else now.replace(tzinfo=UTC)
        self._advance(now)
        steps = self._steps
        while steps and steps[0][0] <= now:
            when, name = heapq.heappop(steps)
            if self._step_at.get(name) != when:
                continue  # superseded
            del self._step_at[name]
            ns = self._namespaces.get(name)
            if ns is not None:
                self._changes.mark(ns.instance.instance_id)
                self._schedule_step(ns, now)
        return self._changes.take()

    def next_change(self) -> datetime | None:
        steps = self._steps
        while steps and self._step_at.get(steps[0][1]) != steps[0][0]:
            heapq.heappop(steps)  # superseded
        times = [steps[0][0]] if steps else []
        eligible = self._scheduler.next_eligible()
        if eligible is not None:
            times.append(eligible)
        return min(times, default=None)

    def _advance(self, now: datetime) -> None:
        """Bring the scheduler to `now`; the namespaces of pods it bound (or found
        unschedulable) changed."""
        self._scheduler.advance(now)
        decided = self._scheduler.decided
        if not decided:
            return
        self._scheduler.decided = []
        for pod in decided:
            ns = self._namespaces.get(pod.namespace)
            if ns is not None and not pod.removed:
                self._changes.mark(ns.instance.instance_id)
                self._schedule_step(ns, now)

    def _schedule_step(self, ns: Namespace, now: datetime) -> None:
        """Remember when the namespace's rendered state changes next by time alone."""
        name = ns.instance.namespace
        when = self._next_step(ns, now)
        if when is None:
            self._step_at.pop(name, None)
        elif self._step_at.get(name) != when:
            self._step_at[name] = when
            heapq.heappush(self._steps, (when, name))

    def _next_step(self, ns: Namespace, now: datetime) -> datetime | None:
        times = [t for t in (next_change(self._timeline, p, now) for p in ns.pods.values()) if t]
        for ref, workload in ns.workloads.items():
            if ref.kind not in ("Deployment", "ReplicaSet", "StatefulSet"):
                continue
            obj = ns.objects.get(ref) or {}
            min_ready = timedelta(seconds=min_ready_seconds(obj))
            pods = [ns.pods[p] for p in workload.pods if p in ns.pods]
            ready = [self._timeline.first_ready_at(p) for p in pods]
            available = [t + min_ready for t in ready if t is not None]
            times += available
            if ref.kind == "Deployment":
                spec = as_map(obj.get("spec"))
                deadline = workload.created_at + timedelta(
                    seconds=float(spec.get("progressDeadlineSeconds", PROGRESS_DEADLINE_DEFAULT))
                )
                if len(available) < len(ready) or any(t > deadline for t in available):
                    times.append(deadline)
        return min((t for t in times if t > now), default=None)

    def _runs(self, namespace: str) -> bool:
        return namespace in self._namespaces

    def _secret_names(self, namespace: str) -> list[str]:
        """The secret names the namespace's pods read from a mounted `secrets.json` (read on
        every answer of the worker: kept until the namespace's objects change)."""
        names = self._secret_names_of.get(namespace)
        if names is None:
            ns = self._namespaces.get(namespace)
            if ns is None:
                return []
            names = mounted_secret_names(ns.objects, ns.pods.values())
            self._secret_names_of[namespace] = names
        return list(names)

    async def aclose(self) -> None:
        await self._workers.grpc_echo.aclose()
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.aclose()
        https, self._https = self._https, None
        if https is not None:
            await https.aclose()

    # ------------------------------------------------------------------ apply

    def _now(self) -> datetime:
        now = self._clock()
        return now if now.tzinfo is not None else now.replace(tzinfo=UTC)

    def _reconcile_workload(
        self, ns: Namespace, ref: ObjectRef, obj: dict[str, Any], now: datetime
    ) -> None:
        spec = as_map(obj.get("spec"))
        if ref.kind == "Pod":
            replicas = 1
        elif ref.kind == "Job":
            replicas = int(spec.get("parallelism", 1) or 0)
        else:
            replicas = int(spec.get("replicas", 1) if spec.get("replicas") is not None else 1)
        template = pod_template(obj)
        key = json.dumps([replicas, template], sort_keys=True, default=str)
        existing = ns.workloads.get(ref)
        if existing is not None and existing.template_key == key:
            return  # unchanged: server-side apply is a no-op for the pods
        if existing is not None:
            for pod_name in existing.pods:
                pod = ns.pods.pop(pod_name, None)
                if pod is not None:
                    self._scheduler.remove(pod)
                    self._scheduler.release(pod)
        ns.generation += 1
        workload = Workload(ref.kind, ref.name, object_uid(self.name, ns, ref), now, key)
        ns.workloads[ref] = workload
        metadata = as_map(template.get("metadata"))
        labels = {str(k): str(v) for k, v in as_map(metadata.get("labels")).items()}
        owner_name, owner_uid = ref.name, workload.uid
        if ref.kind == "Deployment":
            template_hash = name_suffix(key, 10)
            workload.replica_set = f"{ref.name}-{template_hash}"
            workload.replica_set_uid = object_uid(self.name, ns, "ReplicaSet", workload.replica_set)
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
                pod_name = f"{owner_name}-{name_suffix(f'{owner_uid}/{i}', 5)}"
            pod_labels = dict(labels)
            if ref.kind == "StatefulSet":
                pod_labels["statefulset.kubernetes.io/pod-name"] = pod_name
            self._create_pod(ns, workload, pod_name, pod_labels, template, now)

    def _fault(
        self, ns: Namespace, workload: Workload, annotations: Mapping[str, str]
    ) -> str | None:
        """The pod's fault: with `fault-instances: N`, only in the first N instances of the
        function version (per workload) this cluster starts."""
        fault = annotations.get(FAULT_ANNOTATION)
        limit = annotations.get(FAULT_INSTANCES_ANNOTATION)
        if fault is None or limit is None:
            return fault
        given = self._faulted.setdefault((ns.instance.version_id, workload.name), [])
        if ns.instance.namespace in given:
            return fault
        if len(given) < (natural(str(limit), max_digits=9) or 0):
            given.append(ns.instance.namespace)
            return fault
        return None

    def _create_pod(
        self,
        ns: Namespace,
        workload: Workload,
        pod_name: str,
        labels: dict[str, str],
        template: Mapping[str, Any],
        now: datetime,
    ) -> None:
        metadata = as_map(template.get("metadata"))
        annotations = {str(k): str(v) for k, v in as_map(metadata.get("annotations")).items()}
        spec = copy_json(as_map(template.get("spec")))
        if workload.kind == "Deployment":
            owner = ("ReplicaSet", workload.replica_set, workload.replica_set_uid)
        elif workload.kind == "Pod":
            owner = ("", "", "")
        else:
            owner = (workload.kind, workload.name, workload.uid)
        ready_after = annotations.get(READY_AFTER_ANNOTATION)
        fail_after = annotations.get(FAIL_AFTER_ANNOTATION)
        self._seq += 1
        pod = SimPod(
            name=pod_name,
            uid=object_uid(self.name, ns, "Pod", pod_name),
            seq=self._seq,
            owner_kind=owner[0],
            owner_name=owner[1],
            owner_uid=owner[2],
            labels=labels,
            annotations=annotations,
            spec=spec,
            created_at=now,
            gpus=gpu_request(spec),
            fault=self._fault(ns, workload, annotations),
            namespace=ns.instance.namespace,
            ready_after=(parse_duration(ready_after) if ready_after else self.delays.ready_seconds),
            fail_after=parse_duration(fail_after) if fail_after else DEFAULT_FAIL_AFTER,
            script=(
                task_script(template, self.delays.ready_seconds)
                if ns.instance.task and workload.kind == "Job"
                else None
            ),
        )
        overwritten = ns.pods.get(pod_name)
        if overwritten is not None:
            # dropped from the model, as before; GPUs not returned
            self._scheduler.remove(overwritten)
        ns.pods[pod_name] = pod
        workload.pods.append(pod_name)
        self._scheduler.enqueue(pod)
