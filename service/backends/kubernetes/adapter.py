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

import asyncio
import copy
import dataclasses
import json
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, TypeVar

import httpx2
from lightkube import ALL_NS, AsyncClient, ConfigError, KubeConfig, SingleConfig
from lightkube import operators as ops
from lightkube.config.client_adapter import AsyncClient as lightkube_http_client
from lightkube.config.client_adapter import ConnectionParams
from lightkube.types import CascadeType, PatchType

from service.backends.changes import ChangeLog, Changes
from service.backends.http1 import AnswerBounds, Http1Endpoint, Http1Pool
from service.backends.kube_watch import ClusterWatch, Watched
from service.backends.kubernetes.capacity import (
    Node,
    as_map,
    count_pods,
    free_capacity,
    gpu_nodes,
    labels_of,
)
from service.backends.kubernetes.errors import CAUGHT, translate
from service.backends.kubernetes.kinds import (
    EVENT,
    NAMESPACE,
    NODE,
    OBSERVED_KINDS,
    POD,
    SERVICE,
    KindInfo,
    apply_rank,
    global_resource,
    kind_info,
    namespaced_resource,
)
from service.backends.kubernetes.logs import KubeLogReader
from service.backends.logs import LogLine, LogRequest
from service.backends.protocol import (
    AdapterError,
    Capacity,
    InstanceSpec,
    NodeShape,
    ShapeCapacity,
    check_namespace,
    object_metadata,
)
from service.backends.worker import (
    CONNECT_TIMEOUT,
    HttpxEndpoint,
    WorkerEndpoint,
    WorkerPort,
)
from service.backends.worker_utils_pod import ENTRYPOINT_SERVICE, WorkerUtilsPod, inject
from service.core.kube import (
    INSTANCE_TYPE_LABEL,
    LABEL_FUNCTION_ID,
    LABEL_INSTANCE_ID,
    LABEL_NCA_ID,
    LABEL_VERSION_ID,
    MANAGED_BY_LABEL,
    NAMESPACE_PREFIX,
    instance_namespace,
)
from service.health.observed import ObjectRef, ObservedState, parse_time

T = TypeVar("T")


WorkerAccess = Literal["serviceDns", "apiServerProxy"]


FIELD_MANAGER = "nvcf-control-plane"


APPLIED_ANNOTATION = "nvcf.nvidia.com/applied-objects"


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
        self._client: AsyncClient | None = None
        self._server = "in-cluster" if in_cluster else str(self.kubeconfig)
        #: how invocations reach workers: in-cluster DNS by default when running in the cluster
        self.worker_access: WorkerAccess = worker_access or (
            "serviceDns" if in_cluster else "apiServerProxy"
        )
        self.cluster_domain = cluster_domain
        self._config: SingleConfig | None = None
        self._worker_client: Any = None
        self._dns_pool: Http1Pool | None = None
        self._worker_bounds = worker_bounds
        #: the sidecar added to the pod serving an HTTP function (worker_utils_pod.py): the
        #: invocation engine then sends it the signed URLs of the request's files
        self.worker_utils = worker_utils
        self.files_in_sidecar = worker_utils is not None
        self._changes = ChangeLog()
        watched = [Watched(namespaced_resource(info)) for info in OBSERVED_KINDS]
        watched.append(Watched(namespaced_resource(EVENT), (("type", "Warning"),)))
        self._watch = ClusterWatch(name, self._api, watched, self._changes)

    # ------------------------------------------------------------------ public interface

    async def apply(self, instance: InstanceSpec, objects: list[dict[str, Any]]) -> None:
        """Server-side apply the namespace, then every object in dependency order."""
        prepared = [self._prepare(instance, obj) for obj in self._with_sidecar(instance, objects)]
        prepared.sort(key=lambda item: apply_rank(item[0].api_version, item[0].kind))
        await self._apply_one(NAMESPACE, None, self._namespace_body(instance, prepared))
        for info, body in prepared:
            await self._apply_one(info, instance.namespace, body)

    async def update_objects(self, instance: InstanceSpec, objects: list[dict[str, Any]]) -> None:
        """Server-side apply `objects` into the instance namespace, as `apply` does, without
        touching the namespace or its record of applied objects: the kubelet refreshes a
        mounted Secret in running pods."""
        prepared = [self._prepare(instance, obj) for obj in self._with_sidecar(instance, objects)]
        prepared.sort(key=lambda item: apply_rank(item[0].api_version, item[0].kind))
        for info, body in prepared:
            await self._apply_one(info, instance.namespace, body)

    async def observe(self, instance: InstanceSpec) -> ObservedState:
        """The namespace's pods, controllers, warning events and applied objects."""
        namespace = await self._get(NAMESPACE, None, instance.namespace)
        if namespace is None:
            return ObservedState()
        expected = _applied(namespace)
        kinds: dict[KindInfo, None] = dict.fromkeys(OBSERVED_KINDS)
        for api_version, kind, _ in expected:
            if (api_version, kind) != (NAMESPACE.api_version, NAMESPACE.kind):
                kinds[kind_info(api_version, kind)] = None
        if instance.worker_service is not None:
            kinds[SERVICE] = None
        listings = await self._gather(
            [self._list(info, instance.namespace) for info in kinds]
            + [self._list(EVENT, instance.namespace, fields={"type": "Warning"})]
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
        """Delete the namespace (foreground); True once the API server no longer has it."""
        return await self._delete_namespace(instance.namespace)

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
        namespaces = await self._list(
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
                or _terminating(ns)
                or (parse_time(metadata.get("creationTimestamp")) or cutoff) > cutoff
            ):
                continue
            await self._delete_namespace(name, known_present=True)
            deleted.append(name)
        return sorted(deleted)

    async def capacity(self) -> Capacity:
        """Free GPUs per node shape from labelled nodes; the catalog's shapes without access."""
        try:
            nodes = await self._list(NODE, None, labels={INSTANCE_TYPE_LABEL: ops.exists()})
        except AdapterError as exc:
            if exc.status == 403:
                return self.static_capacity()
            raise
        usable = gpu_nodes(nodes)
        if usable:
            await self._subtract_pods(usable)
        return free_capacity(usable)

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
        if self._worker_client is None:
            self._worker_client = self._proxy_client()
        server = str(self._worker_client.base_url).rstrip("/")
        prefix = f"{server}/api/v1/namespaces/{instance.namespace}/services/{port.service}"
        health = None
        if port.health_path is not None:
            health = f"{prefix}:{health_port}/proxy{port.health_path}"
        return HttpxEndpoint(
            f"{prefix}:{port.port}/proxy",
            self._worker_client,
            health_url=health,
            unreachable=(httpx2.ConnectError, httpx2.ConnectTimeout),
            failed=httpx2.HTTPError,
            proxied=True,
        )

    def logs(self, instance: InstanceSpec, request: LogRequest) -> AsyncIterator[LogLine]:
        """The pods' log subresource, container by container (backends/kubernetes/logs.py)."""
        if self._worker_client is None:
            self._worker_client = self._proxy_client()

        async def pods() -> list[dict[str, Any]]:
            return await self._list(POD, instance.namespace)

        def failure(exc: Exception, operation: str) -> AdapterError:
            return translate(exc, operation, self.name, self._server)

        reader = KubeLogReader(self._worker_client, pods, failure, timeout=self.timeout)
        return reader.read(instance.namespace, request)

    def _proxy_client(self) -> httpx2.AsyncClient:
        """A client of the API server with the adapter's credentials and no read timeout (an
        invocation may take long; its own deadline bounds it)."""
        config = self._config or self._load_config()
        self._config = config
        params = ConnectionParams(
            timeout=httpx2.Timeout(connect=CONNECT_TIMEOUT, read=None, write=60.0, pool=None)
        )
        try:
            return lightkube_http_client(config, params)
        except (OSError, ValueError) as exc:
            raise AdapterError(
                f"cluster {self.name}: cannot set up the Kubernetes client: {exc}",
                retryable=False,
            ) from exc

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
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
        worker, self._worker_client = self._worker_client, None
        if worker is not None:
            await worker.aclose()
        pool, self._dns_pool = self._dns_pool, None
        if pool is not None:
            await pool.aclose()

    # ------------------------------------------------------------------ apply helpers

    def _with_sidecar(
        self, instance: InstanceSpec, objects: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """The objects with the worker-utils sidecar in the pod serving the function, when
        the adapter adds one and that pod is identifiable (a copy; else `objects`)."""
        if self.worker_utils is None or instance.worker_port is None:
            return objects
        pod = self.worker_utils
        if instance.utils_image is not None:
            pod = dataclasses.replace(pod, image=instance.utils_image)
        copied = copy.deepcopy(objects)
        service = instance.worker_service or ENTRYPOINT_SERVICE
        if inject(copied, service, instance.worker_port, pod):
            return copied
        return objects

    def _prepare(self, instance: InstanceSpec, obj: Any) -> tuple[KindInfo, dict[str, Any]]:
        """Check one object and return its kind and the body to apply (a copy)."""
        object_metadata(obj)
        info = kind_info(str(obj["apiVersion"]), str(obj["kind"]))
        body = copy.deepcopy(obj)
        metadata = body["metadata"]
        if not info.namespaced:
            raise AdapterError(
                f"{info.kind}/{metadata['name']} is cluster-scoped; only namespaced objects are "
                f"installed into {instance.namespace}",
                retryable=False,
            )
        check_namespace(instance, metadata)
        metadata["namespace"] = instance.namespace
        for server_field in ("resourceVersion", "uid", "managedFields", "creationTimestamp"):
            metadata.pop(server_field, None)
        body.pop("status", None)
        return info, body

    def _namespace_body(
        self, instance: InstanceSpec, prepared: Sequence[tuple[KindInfo, dict[str, Any]]]
    ) -> dict[str, Any]:
        applied = sorted(
            {
                (info.api_version, info.kind, str(body["metadata"]["name"]))
                for info, body in prepared
            }
        )
        return {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": instance.namespace,
                "labels": {
                    MANAGED_BY_LABEL: self.field_manager,
                    LABEL_FUNCTION_ID: instance.function_id,
                    LABEL_VERSION_ID: instance.version_id,
                    LABEL_INSTANCE_ID: instance.instance_id,
                    LABEL_NCA_ID: instance.nca_id,
                },
                "annotations": {
                    APPLIED_ANNOTATION: json.dumps(
                        [list(a) for a in applied], separators=(",", ":")
                    )
                },
            },
        }

    async def _apply_one(self, info: KindInfo, namespace: str | None, body: dict[str, Any]) -> None:
        name = str(body["metadata"]["name"])
        what = f"applying {info.kind} {name}" + (f" in {namespace}" if namespace else "")
        client = self._api()
        if info.namespaced:
            await self._call(
                what,
                client.patch(
                    namespaced_resource(info),
                    name,
                    body,
                    namespace=namespace,
                    patch_type=PatchType.APPLY,
                    field_manager=self.field_manager,
                    force=True,
                ),
            )
        else:
            await self._call(
                what,
                client.patch(
                    global_resource(info),
                    name,
                    body,
                    patch_type=PatchType.APPLY,
                    field_manager=self.field_manager,
                    force=True,
                ),
            )

    # ------------------------------------------------------------------ read / delete helpers

    async def _get(self, info: KindInfo, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object, or None when the API server answers 404."""
        what = f"reading {info.kind} {name}"
        client = self._api()
        try:
            if info.namespaced:
                found: dict[str, Any] = await self._call(
                    what, client.get(namespaced_resource(info), name, namespace=namespace)
                )
            else:
                found = await self._call(what, client.get(global_resource(info), name))
        except AdapterError as exc:
            if exc.status == 404:
                return None
            raise
        return dict(found)

    async def _list(
        self,
        info: KindInfo,
        namespace: str | None,
        *,
        labels: dict[str, Any] | None = None,
        fields: dict[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """Every object of a kind (in a namespace, or all namespaces with `ALL_NS`).

        List items come without `kind`/`apiVersion`; they are filled in here.
        """
        where = "all namespaces" if namespace == ALL_NS else (namespace or "the cluster")
        return await self._call(
            f"listing {info.plural} in {where}", self._collect(info, namespace, labels, fields)
        )

    async def _collect(
        self,
        info: KindInfo,
        namespace: str | None,
        labels: dict[str, Any] | None,
        fields: dict[str, Any] | None,
    ) -> list[dict[str, Any]]:
        client = self._api()
        listing: AsyncIterable[Mapping[str, Any]]
        if info.namespaced:
            listing = client.list(
                namespaced_resource(info), namespace=namespace, labels=labels, fields=fields
            )
        else:
            listing = client.list(global_resource(info), labels=labels, fields=fields)
        out: list[dict[str, Any]] = []
        async for item in listing:
            obj = dict(item)
            obj["kind"] = info.kind
            obj["apiVersion"] = info.api_version
            out.append(obj)
        return out

    async def _delete_namespace(self, name: str, *, known_present: bool = False) -> bool:
        if not known_present:
            existing = await self._get(NAMESPACE, None, name)
            if existing is None:
                return True
            if _terminating(existing):
                return False
        try:
            await self._call(
                f"deleting namespace {name}",
                self._api().delete(
                    global_resource(NAMESPACE), name, cascade=CascadeType.FOREGROUND
                ),
            )
        except AdapterError as exc:
            if exc.status == 404:
                return True
            if exc.status == 409:  # already terminating
                return False
            raise
        return False

    async def _subtract_pods(self, nodes: list[Node]) -> None:
        """Count GPUs of bound pods, then of our not-yet-bound pods, against the nodes."""
        try:
            pods = await self._list(
                POD, ALL_NS, fields={"status.phase": ops.not_in(["Succeeded", "Failed"])}
            )
        except AdapterError as exc:
            if exc.status == 403:
                return  # may read nodes but not pods: allocatable only
            raise
        count_pods(nodes, pods)

    # ------------------------------------------------------------------ plumbing

    def _api(self) -> AsyncClient:
        if self._client is None:
            config = self._load_config()
            try:
                self._client = AsyncClient(
                    config, field_manager=self.field_manager, timeout=httpx2.Timeout(self.timeout)
                )
            except (OSError, ValueError) as exc:  # e.g. an unreadable CA or client certificate
                raise AdapterError(
                    f"cluster {self.name}: cannot set up the Kubernetes client: {exc}",
                    retryable=False,
                ) from exc
            self._server = config.cluster.server or self._server
        return self._client

    def _load_config(self) -> SingleConfig:
        try:
            if self.in_cluster:
                loaded = KubeConfig.from_service_account().get()
            else:
                assert self.kubeconfig is not None
                loaded = KubeConfig.from_file(self.kubeconfig).get(context_name=self.context)
        except (ConfigError, OSError, KeyError, ValueError, TypeError) as exc:
            source = "in-cluster service account" if self.in_cluster else str(self.kubeconfig)
            detail = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
            raise AdapterError(
                f"cluster {self.name}: cannot load the Kubernetes configuration from {source}: "
                f"{detail}",
                retryable=False,
            ) from exc
        if loaded is None:  # pragma: no cover - `get` raises when no context is set
            raise AdapterError(f"cluster {self.name}: no Kubernetes context", retryable=False)
        return loaded

    async def _call(self, operation: str, awaitable: Awaitable[T]) -> T:
        try:
            return await awaitable
        except AdapterError:
            raise
        except CAUGHT as exc:
            raise translate(exc, operation, self.name, self._server) from exc

    async def _gather(self, calls: Sequence[Awaitable[T]]) -> list[T]:
        results = await asyncio.gather(*calls, return_exceptions=True)
        out: list[T] = []
        for result in results:
            if isinstance(result, BaseException):
                raise result
            out.append(result)
        return out


def _terminating(namespace: Mapping[str, Any]) -> bool:
    metadata = as_map(namespace.get("metadata"))
    phase = as_map(namespace.get("status")).get("phase")
    return metadata.get("deletionTimestamp") is not None or phase == "Terminating"


def _applied(namespace: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """The `(apiVersion, kind, name)` triples recorded on the namespace by `apply`."""
    annotations = as_map(as_map(namespace.get("metadata")).get("annotations"))
    try:
        entries = json.loads(str(annotations.get(APPLIED_ANNOTATION) or "[]"))
    except ValueError:
        return []
    out: list[tuple[str, str, str]] = []
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, list) and len(entry) == 3 and all(isinstance(e, str) for e in entry):
            out.append((entry[0], entry[1], entry[2]))
    return out
