"""The `kubernetes` backend (runtime.md §4): one real cluster, driven through `lightkube`.

Each instance lives in its own namespace `sr-<instanceId>`, labelled with the function, version,
instance and account ids and with `app.kubernetes.io/managed-by: <field manager>`. `apply`
server-side-applies (field manager `nvcf-control-plane`, `force=true`) the namespace and then
every object in dependency order; the namespace also records which objects were applied (the
`nvcf.nvidia.com/applied-objects` annotation), so `observe` knows what should exist even after
a restart of the service. `observe` LISTs the namespace's pods, controllers, warning events and
the other applied kinds and hands them to `ObservedState.from_k8s`. It is also a change feed
(backends/changes.py): once the reconciler starts it, it keeps a WATCH of pods, controllers
and warning events across namespaces (kube_watch.py) and marks the instance of every namespace
in which one changed. `delete` removes the
namespace with foreground propagation; `garbage_collect` removes namespaces of instances the
service no longer knows. `capacity` reads the nodes labelled `nvca.nvcf.nvidia.io/instance-type`
and their allocatable `nvidia.com/gpu`, minus what running pods request, and falls back to the
catalog's static node shapes when the service may not read nodes. `endpoint` addresses an
instance's inference worker by its Service: the cluster DNS name (`serviceDns`, for a control
plane running in the cluster) or the API server's service proxy (`apiServerProxy`, with the
adapter's own credentials), as the catalog's `workerAccess` says.

API paths are computed from a static table of the kinds the chart pipeline allows (helm.md §3)
plus the NVLink `ComputeDomain`; other kinds (a policy's `extraKubernetesTypes`) get their plural
the way apimachinery guesses it and are assumed namespaced. Every API-server or network failure
becomes an `AdapterError` whose message is the server's own (the `Status` object's `message`)."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import httpx2
from lightkube import ALL_NS
from lightkube import operators as ops

from service.backends.changes import ChangeLog, Changes
from service.backends.collector_pod import CollectorPod
from service.backends.collector_pod import inject as inject_collector
from service.backends.http1 import AnswerBounds, Http1Endpoint, Http1Pool
from service.backends.kube_watch import ClusterWatch, Watched
from service.backends.kubernetes.api import KubeApi
from service.backends.kubernetes.capacity import (
    Node,
    as_map,
    gpu_model,
    labels_of,
    node_usable,
    subtract_pods,
)
from service.backends.kubernetes.kinds import (
    EVENT,
    NAMESPACE,
    NODE,
    OBSERVED_KINDS,
    POD,
    SERVICE,
    KindInfo,
    apply_rank,
    kind_info,
    namespaced_resource,
)
from service.backends.kubernetes.logs import KubeLogReader
from service.backends.kubernetes.objects import (
    applied,
    namespace_body,
    prepare,
    terminating,
)
from service.backends.kubernetes.task_files import TaskFilesReader
from service.backends.logs import LogLine, LogRequest
from service.backends.protocol import (
    AdapterError,
    Capacity,
    InstanceSpec,
    NodeShape,
    ShapeCapacity,
)
from service.backends.worker import HttpxEndpoint, WorkerEndpoint, WorkerPort
from service.backends.worker_utils_pod import (
    ENTRYPOINT_SERVICE,
    WorkerUtilsPod,
    inject,
    inject_task,
)
from service.core.kube import (
    GPU_RESOURCE,
    INSTANCE_TYPE_LABEL,
    LABEL_INSTANCE_ID,
    MANAGED_BY_LABEL,
    NAMESPACE_PREFIX,
    instance_namespace,
)
from service.core.quantities import whole_quantity
from service.health.observed import ObjectRef, ObservedState, parse_time

WorkerAccess = Literal["serviceDns", "apiServerProxy"]


FIELD_MANAGER = "nvcf-control-plane"


DEFAULT_TIMEOUT = 10.0


class KubernetesAdapter:
    """`BackendAdapter` for one real cluster, reached through a kubeconfig or in-cluster config.

    The client is created on first use, so a missing kubeconfig surfaces as an `AdapterError`
    of the first call rather than at start-up. Safe for concurrent tasks of one event loop.
    """

    def __init__(
        self,
        name: str,
        *,
        kubeconfig: str | Path | None = None,
        context: str | None = None,
        in_cluster: bool = False,
        nodes: Sequence[NodeShape] = (),
        field_manager: str = FIELD_MANAGER,
        timeout: float = DEFAULT_TIMEOUT,
        worker_access: WorkerAccess | None = None,
        cluster_domain: str = "cluster.local",
        worker_bounds: AnswerBounds | None = None,
        worker_utils: WorkerUtilsPod | None = None,
        collector: CollectorPod | None = None,
    ) -> None:
        if in_cluster == (kubeconfig is not None):
            raise ValueError(
                f"cluster {name}: give either a kubeconfig path or in_cluster=True (not both)"
            )
        self.name = name
        self.kubeconfig = Path(kubeconfig) if kubeconfig is not None else None
        self.context = context
        self.in_cluster = in_cluster
        self.nodes = tuple(nodes)
        self.field_manager = field_manager
        self.timeout = timeout
        self.api = KubeApi(
            name,
            kubeconfig=self.kubeconfig,
            context=context,
            in_cluster=in_cluster,
            field_manager=field_manager,
            timeout=timeout,
        )
        #: how invocations reach workers: in-cluster DNS by default when running in the cluster
        self.worker_access: WorkerAccess = worker_access or (
            "serviceDns" if in_cluster else "apiServerProxy"
        )
        self.cluster_domain = cluster_domain
        self._worker_client: httpx2.AsyncClient | None = None
        self._dns_pool: Http1Pool | None = None
        self._worker_bounds = worker_bounds
        #: the sidecar added to the pod serving an HTTP function (worker_utils_pod.py): the
        #: invocation engine then sends it the signed URLs of the request's files
        self.worker_utils = worker_utils
        self.files_in_sidecar = worker_utils is not None
        #: the OpenTelemetry Collector added to the pods of a workload naming telemetries
        #: (collector_pod.py; None: none, telemetries are then not exported on this cluster)
        self.collector = collector
        self._changes = ChangeLog()
        watched = [Watched(namespaced_resource(info)) for info in OBSERVED_KINDS]
        watched.append(Watched(namespaced_resource(EVENT), (("type", "Warning"),)))
        self._watch = ClusterWatch(name, self.api.client, watched, self._changes)
        self._task_files = TaskFilesReader(
            self.api,
            self._proxy,
            timeout=timeout,
            result_timeout=(worker_utils.timeout_seconds if worker_utils else 3600.0) + 60.0,
        )

    # ------------------------------------------------------------------ public interface

    async def apply(self, instance: InstanceSpec, objects: list[dict[str, Any]]) -> None:
        """Server-side apply the namespace, then every object in dependency order. A task
        whose Job is suspended (asked to stop) has its sidecar released first, so that its pod
        stops within the grace period without lingering for a result."""
        if instance.task and any(_suspended(obj) for obj in objects):
            await self._task_files.release(instance)
        prepared = self._prepared(instance, objects)
        await self.api.apply(
            NAMESPACE, None, namespace_body(instance, prepared, self.field_manager)
        )
        for info, body in prepared:
            await self.api.apply(info, instance.namespace, body)

    async def update_objects(self, instance: InstanceSpec, objects: list[dict[str, Any]]) -> None:
        """Server-side apply `objects` into the instance namespace, as `apply` does, without
        touching the namespace or its record of applied objects: the kubelet refreshes a
        mounted Secret in running pods."""
        for info, body in self._prepared(instance, objects):
            await self.api.apply(info, instance.namespace, body)

    async def observe(self, instance: InstanceSpec) -> ObservedState:
        """The namespace's pods, controllers, warning events and applied objects."""
        namespace = await self.api.get(NAMESPACE, None, instance.namespace)
        if namespace is None:
            return ObservedState()
        expected = applied(namespace)
        kinds: dict[KindInfo, None] = dict.fromkeys(OBSERVED_KINDS)
        for api_version, kind, _ in expected:
            if (api_version, kind) != (NAMESPACE.api_version, NAMESPACE.kind):
                kinds[kind_info(api_version, kind)] = None
        if instance.worker_service is not None:
            kinds[SERVICE] = None
        listings = await self.api.gather(
            [self.api.list_objects(info, instance.namespace) for info in kinds]
            + [self.api.list_objects(EVENT, instance.namespace, fields={"type": "Warning"})]
        )
        objects = [obj for listing in listings[:-1] for obj in listing]
        selector: dict[str, str] | None = None
        if instance.worker_service is not None:
            service = next(
                (
                    o
                    for o in objects
                    if o.get("kind") == "Service"
                    and as_map(o.get("metadata")).get("name") == instance.worker_service
                ),
                {},
            )
            spec_selector = as_map(as_map(service.get("spec")).get("selector"))
            selector = {str(k): str(v) for k, v in spec_selector.items()}
        return ObservedState.from_k8s(
            objects,
            events=listings[-1],
            expected=[ObjectRef(kind, name) for _, kind, name in expected if kind != "Namespace"],
            worker_selector=selector,
        )

    async def delete(self, instance: InstanceSpec) -> bool:
        """Delete the namespace (foreground); True once the API server no longer has it. A
        task's sidecar is released first, so that its pod does not linger."""
        if instance.task:
            await self._task_files.release(instance)
        return await self.api.delete_namespace(instance.namespace)

    async def garbage_collect(
        self, known_instance_ids: Iterable[str], *, min_age_seconds: float = 0.0
    ) -> list[str]:
        """Delete `sr-*` namespaces this service labelled whose instance is not in the list.

        Namespaces younger than `min_age_seconds` are left alone: another replica may have
        created the instance after the caller read its list of known ids. Returns the
        namespaces whose deletion this call started (terminating ones are not returned).
        """
        known = set(known_instance_ids)
        cutoff = datetime.now(UTC) - timedelta(seconds=min_age_seconds)
        namespaces = await self.api.list_objects(
            NAMESPACE,
            None,
            labels={MANAGED_BY_LABEL: self.field_manager, LABEL_INSTANCE_ID: ops.exists()},
        )
        deleted: list[str] = []
        for ns in namespaces:
            metadata = as_map(ns.get("metadata"))
            name = str(metadata.get("name", ""))
            instance_id = labels_of(ns).get(LABEL_INSTANCE_ID, "")
            if (
                not name.startswith(NAMESPACE_PREFIX)
                or name != instance_namespace(instance_id)
                or instance_id in known
                or terminating(ns)
                or (parse_time(metadata.get("creationTimestamp")) or cutoff) > cutoff
            ):
                continue
            await self.api.delete_namespace(name, known_present=True)
            deleted.append(name)
        return sorted(deleted)

    async def capacity(self) -> Capacity:
        """Free GPUs per node shape from labelled nodes; the catalog's shapes without access."""
        try:
            nodes = await self.api.list_objects(
                NODE, None, labels={INSTANCE_TYPE_LABEL: ops.exists()}
            )
        except AdapterError as exc:
            if exc.status == 403:
                return self.static_capacity()
            raise
        usable: list[Node] = []
        for node in sorted(nodes, key=lambda n: str(as_map(n.get("metadata")).get("name", ""))):
            labels = labels_of(node)
            gpus = whole_quantity(
                as_map(as_map(node.get("status")).get("allocatable")).get(GPU_RESOURCE)
            )
            gpu = gpu_model(labels)
            if gpus <= 0 or not gpu or not node_usable(node):
                continue
            name = str(as_map(node.get("metadata")).get("name", ""))
            usable.append(Node(name, gpu, gpus, labels))
        if usable:
            await self._subtract_pods(usable)
        shapes: dict[tuple[str, int], list[int]] = {}
        for n in usable:
            shapes.setdefault((n.gpu, n.gpus), []).append(max(n.gpus - n.used, 0))
        return Capacity(
            tuple(
                ShapeCapacity(gpu, per_node, tuple(free))
                for (gpu, per_node), free in shapes.items()
            )
        )

    def static_capacity(self) -> Capacity:
        """The catalog's node shapes, every GPU free (used when nodes cannot be read)."""
        return Capacity(
            tuple(
                ShapeCapacity(s.gpu.upper(), s.gpus_per_node, (s.gpus_per_node,) * s.count)
                for s in self.nodes
            )
        )

    async def endpoint(self, instance: InstanceSpec, port: WorkerPort) -> WorkerEndpoint:
        """The worker's Service: by its cluster DNS name, or through the API server's
        service proxy (`/api/v1/namespaces/<ns>/services/<service>:<port>/proxy`)."""
        health_port = port.health_port or port.port
        if self.worker_access == "serviceDns":
            if self._dns_pool is None:
                self._dns_pool = Http1Pool(bounds=self._worker_bounds)
            host = f"{port.service}.{instance.namespace}.svc.{self.cluster_domain}"
            health = None
            if port.health_path is not None:
                health = f"http://{host}:{health_port}{port.health_path}"
            return Http1Endpoint(f"http://{host}:{port.port}", self._dns_pool, health_url=health)
        proxy = self._proxy()
        server = str(proxy.base_url).rstrip("/")
        prefix = f"{server}/api/v1/namespaces/{instance.namespace}/services/{port.service}"
        health = None
        if port.health_path is not None:
            health = f"{prefix}:{health_port}/proxy{port.health_path}"
        return HttpxEndpoint(
            f"{prefix}:{port.port}/proxy",
            proxy,
            health_url=health,
            unreachable=(httpx2.ConnectError, httpx2.ConnectTimeout),
            failed=httpx2.HTTPError,
            proxied=True,
        )

    async def task_progress(self, instance: InstanceSpec, *, max_bytes: int) -> bytes | None:
        """The task's progress file, from the sidecar of its pod (task_files.py)."""
        return await self._task_files.progress(instance, max_bytes)

    async def fetch_task_result(
        self, instance: InstanceSpec, name: str, into: str, *, max_bytes: int, max_files: int
    ) -> None:
        """A result's files, from the sidecar of the task's pod (task_files.py)."""
        await self._task_files.fetch(instance, name, Path(into), max_bytes, max_files)

    async def task_result_names(self, instance: InstanceSpec, *, max_names: int) -> list[str]:
        """The task's result directories, from the sidecar of its pod (task_files.py)."""
        return await self._task_files.result_names(instance, max_names)

    def logs(self, instance: InstanceSpec, request: LogRequest) -> AsyncIterator[LogLine]:
        """The pods' log subresource, container by container (backends/kubernetes/logs.py)."""
        proxy = self._proxy()

        async def pods() -> list[dict[str, Any]]:
            return await self.api.list_objects(POD, instance.namespace)

        reader = KubeLogReader(proxy, pods, self.api.failure, timeout=self.timeout)
        return reader.read(instance.namespace, request)

    def _proxy(self) -> httpx2.AsyncClient:
        """The client of the API server's proxies (made on first use)."""
        if self._worker_client is None:
            self._worker_client = self.api.proxy_client()
        return self._worker_client

    def watch_changes(self, wake: Callable[[], None]) -> None:
        """Start the watches (on the running event loop)."""
        self._changes.wake = wake
        self._watch.start()

    def take_changes(self, now: datetime) -> Changes:
        return self._changes.take()

    def next_change(self) -> datetime | None:
        return None  # changes arrive by WATCH, never by time alone

    async def aclose(self) -> None:
        await self._watch.aclose()
        await self.api.aclose()
        worker, self._worker_client = self._worker_client, None
        if worker is not None:
            await worker.aclose()
        pool, self._dns_pool = self._dns_pool, None
        if pool is not None:
            await pool.aclose()

    # ------------------------------------------------------------------ helpers

    def _with_sidecars(
        self, instance: InstanceSpec, objects: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """The objects with the worker-utils sidecar (`_with_sidecar`) and, for a workload
        naming telemetries, the collector in each of its pods with its ConfigMap and Secret
        (a copy; else `objects`)."""
        objects = self._with_sidecar(instance, objects)
        if self.collector is None or instance.telemetry is None:
            return objects
        copied = copy.deepcopy(objects)
        return copied if inject_collector(copied, instance.telemetry, self.collector) else objects

    def _with_sidecar(
        self, instance: InstanceSpec, objects: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """The objects with the worker-utils sidecar in the pod serving the function, or in
        the task's pod, when the adapter adds one and that pod is identifiable (a copy; else
        `objects`)."""
        if self.worker_utils is None or (instance.worker_port is None and not instance.task):
            return objects
        pod = self.worker_utils
        if instance.utils_image is not None:
            pod = dataclasses.replace(pod, image=instance.utils_image)
        copied = copy.deepcopy(objects)
        if instance.task:
            injected = inject_task(copied, pod)
        else:
            assert instance.worker_port is not None
            service = instance.worker_service or ENTRYPOINT_SERVICE
            injected = inject(copied, service, instance.worker_port, pod)
        return copied if injected else objects

    def _prepared(
        self, instance: InstanceSpec, objects: list[dict[str, Any]]
    ) -> list[tuple[KindInfo, dict[str, Any]]]:
        """The bodies to apply, in dependency order."""
        prepared = [prepare(instance, obj) for obj in self._with_sidecars(instance, objects)]
        prepared.sort(key=lambda item: apply_rank(item[0].api_version, item[0].kind))
        return prepared

    async def _subtract_pods(self, nodes: list[Node]) -> None:
        """Count what the cluster's live pods request against the nodes."""
        try:
            pods = await self.api.list_objects(
                POD, ALL_NS, fields={"status.phase": ops.not_in(["Succeeded", "Failed"])}
            )
        except AdapterError as exc:
            if exc.status == 403:
                return  # may read nodes but not pods: allocatable only
            raise
        subtract_pods(nodes, pods)


def adds_collector(adapter: object) -> bool:
    """Whether `adapter` adds the telemetry collector to the pods of workloads naming
    telemetries (a Kubernetes cluster with a collector image)."""
    return isinstance(adapter, KubernetesAdapter) and adapter.collector is not None


def _suspended(obj: Any) -> bool:
    return (
        isinstance(obj, dict)
        and obj.get("kind") == "Job"
        and as_map(obj.get("spec")).get("suspend") is True
    )
