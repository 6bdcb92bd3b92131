"""The backend adapter interface (runtime.md §4) and the values it exchanges.

An adapter drives one cluster: it applies an instance's objects into the namespace
`sr-<instanceId>` (and updates some of them in place: the Secret of secrets), observes them,
deletes them, reports free GPU capacity, and says where an instance's inference worker
answers (`endpoint`, backends/worker.py) and what its containers printed (`logs`,
the `logs` module of each adapter's package). Adapters that can also collect orphaned namespaces
implement `GarbageCollecting`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from service.backends.collector_pod import TelemetrySidecar
from service.backends.logs import LogLine, LogRequest
from service.backends.worker import WorkerEndpoint, WorkerPort
from service.core.kube import instance_namespace
from service.health.observed import ObservedState


class AdapterError(Exception):
    """The backend refused or failed an operation; `message` is the backend's own wording.

    `retryable` is False when repeating the call cannot help (e.g. an invalid object).
    """

    def __init__(self, message: str, *, retryable: bool = True, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.status = status


@dataclass(frozen=True)
class InstanceSpec:
    """One function instance as a backend sees it.

    `worker_service` is the Service whose pods are the inference worker (`helmChartServiceName`);
    None makes every pod a worker.
    """

    instance_id: str
    function_id: str
    version_id: str
    instance_type: str  # e.g. "NCP.GPU.H100_1x"
    gpu: str
    gpus_per_node: int
    nodes: int = 1
    cluster: str = ""
    deployment_id: str = ""
    nca_id: str = ""
    worker_service: str | None = None
    #: the inference port of an HTTP function (None: a gRPC one): the pod serving it gets
    #: the worker-utils sidecar where the adapter adds one (worker_utils_pod.py)
    worker_port: int | None = None
    #: the function's own image for that sidecar (`utilsContainerImage`); None: the platform's
    utils_image: str | None = None
    #: a task (docs/tasks.md) rather than a function instance: `instance_id` is the task's id,
    #: its objects hold a batch/v1 Job that runs to completion, and the adapter gives the task
    #: container's files to the platform (`TaskFiles`)
    task: bool = False
    #: the OpenTelemetry Collector of a workload naming telemetries, where the adapter adds
    #: one (Kubernetes: backends/collector_pod.py); its keys are never in a repr
    telemetry: TelemetrySidecar | None = field(default=None, compare=False)

    @property
    def namespace(self) -> str:
        return instance_namespace(self.instance_id)


@dataclass(frozen=True)
class NodeShape:
    """A group of identical nodes: GPU model, GPUs per node and how many such nodes."""

    gpu: str
    gpus_per_node: int
    count: int


@dataclass(frozen=True)
class ShapeCapacity:
    """Free GPUs of one node shape, node by node."""

    gpu: str
    gpus_per_node: int
    free_per_node: tuple[int, ...] = ()

    @property
    def count(self) -> int:
        return len(self.free_per_node)

    @property
    def free(self) -> int:
        return sum(self.free_per_node)

    @property
    def free_whole_nodes(self) -> int:
        return sum(1 for f in self.free_per_node if f == self.gpus_per_node)


@dataclass(frozen=True)
class Capacity:
    """Free capacity of a cluster, per node shape."""

    shapes: tuple[ShapeCapacity, ...] = field(default_factory=tuple)

    def free_gpus(self, gpu: str | None = None) -> int:
        """Free GPUs in total, or of one GPU model (case-insensitive)."""
        return sum(s.free for s in self._of(gpu))

    def fits(self, gpu: str, gpus_per_node: int, nodes: int = 1) -> bool:
        """Whether an instance of `<gpu>_<gpus_per_node>x[.x<nodes>]` fits right now.

        Single node: one node with that many free GPUs. Multi-node: that many whole free nodes
        of a shape with exactly `gpus_per_node` GPUs.
        """
        if nodes <= 1:
            return any(f >= gpus_per_node for s in self._of(gpu) for f in s.free_per_node)
        whole = sum(s.free_whole_nodes for s in self._of(gpu) if s.gpus_per_node == gpus_per_node)
        return whole >= nodes

    def _of(self, gpu: str | None) -> Sequence[ShapeCapacity]:
        if gpu is None:
            return self.shapes
        return [s for s in self.shapes if s.gpu.upper() == gpu.upper()]


def object_metadata(obj: Any) -> dict[str, Any]:
    """The metadata of an object to apply, refusing (as the API server words it) one without
    kind, apiVersion or name."""
    if not isinstance(obj, dict) or not obj.get("kind") or not obj.get("apiVersion"):
        raise AdapterError("Object 'Kind' is missing in the object", retryable=False)
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict) or not metadata.get("name"):
        raise AdapterError(
            f"{obj['kind']} in version {obj['apiVersion']!r} cannot be handled: "
            "resource name may not be empty",
            retryable=False,
        )
    return metadata


def check_namespace(instance: InstanceSpec, metadata: dict[str, Any]) -> None:
    """Refuse an object whose namespace is set to another than the instance's."""
    namespace = metadata.get("namespace")
    if namespace not in (None, instance.namespace):
        raise AdapterError(
            "the namespace of the provided object does not match the namespace sent on the "
            f"request ({namespace!r} vs {instance.namespace!r})",
            retryable=False,
        )


@runtime_checkable
class BackendAdapter(Protocol):
    """What the reconciler needs from a cluster. Every method may raise AdapterError."""

    name: str

    async def apply(self, instance: InstanceSpec, objects: list[dict[str, Any]]) -> None:
        """Create or update the instance's objects (idempotent, like server-side apply)."""
        ...

    async def update_objects(self, instance: InstanceSpec, objects: list[dict[str, Any]]) -> None:
        """Apply `objects` over an instance already applied (its Secret of secrets on a
        rotation), leaving its other objects, its pods and the record of what was applied
        alone."""
        ...

    async def observe(self, instance: InstanceSpec) -> ObservedState:
        """Pods, controllers, warning events and present objects of the instance namespace."""
        ...

    async def delete(self, instance: InstanceSpec) -> bool:
        """Start removing everything of the instance; True once it is fully gone."""
        ...

    async def capacity(self) -> Capacity:
        """Free GPUs per node shape."""
        ...

    async def endpoint(self, instance: InstanceSpec, port: WorkerPort) -> WorkerEndpoint:
        """Where the instance's inference worker (the Service `port.service` on `port.port`)
        and its health check answer, as seen from this process. Cheap: no network call."""
        ...

    def logs(self, instance: InstanceSpec, request: LogRequest) -> AsyncIterator[LogLine]:
        """The lines the instance's containers printed (each adapter's `logs` module); an
        instance the cluster does not run has none. With `request.follow` the iterator ends when the
        containers end; the caller may stop iterating at any time."""
        ...

    async def aclose(self) -> None:
        """Release clients and connections."""
        ...


@runtime_checkable
class TaskFiles(Protocol):
    """Optional capability: an adapter that can read a running task's files (docs/tasks.md):
    the progress file at `NVCT_PROGRESS_FILE_PATH` and a result's directory
    `NVCT_RESULTS_DIR/<name>`. The simulated cluster reads them on this machine; on Kubernetes
    the worker-utils sidecar of the task's pod serves them."""

    name: str

    async def task_progress(self, instance: InstanceSpec, *, max_bytes: int) -> bytes | None:
        """The progress file as the container wrote it, or None while there is none; an
        AdapterError (not retryable) when it is larger than `max_bytes`."""
        ...

    async def fetch_task_result(
        self, instance: InstanceSpec, name: str, into: str, *, max_bytes: int, max_files: int
    ) -> None:
        """Copy the files under `NVCT_RESULTS_DIR/<name>` into the local directory `into`
        (relative paths kept); an AdapterError (not retryable) when the result is missing or
        passes a bound."""
        ...

    async def task_result_names(self, instance: InstanceSpec, *, max_names: int) -> list[str]:
        """The names of the directories under `NVCT_RESULTS_DIR`, oldest first (at most
        `max_names`): every checkpoint the container wrote, also one it reported for a
        shorter time than the platform reads the progress file."""
        ...


@runtime_checkable
class GarbageCollecting(Protocol):
    """Optional capability: an adapter that can delete what it created for instances the
    service no longer knows (e.g. after an older database was restored)."""

    name: str

    async def garbage_collect(
        self, known_instance_ids: Iterable[str], *, min_age_seconds: float = 0.0
    ) -> list[str]:
        """Start deleting instance namespaces whose id is not in `known_instance_ids` and that
        are older than `min_age_seconds`; returns the namespaces whose deletion started."""
        ...
