"""One backend adapter per catalog cluster (runtime.md §4).

The catalog is this package's; the adapters know nothing of it. `simulated` clusters get an
in-process `SimulatedAdapter`; `kubernetes` clusters get a `KubernetesAdapter`, imported lazily
so a server without the Kubernetes client libraries still runs its simulated clusters. A
cluster whose adapter cannot be built is kept as *unavailable* with the reason: placement
skips it and instances placed on it fail with a message naming the cluster.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from service.backends.collector_pod import CollectorPod
from service.backends.http1 import AnswerBounds
from service.backends.protocol import BackendAdapter, NodeShape
from service.backends.simulated.adapter import SimulatedAdapter
from service.backends.simulated.model import SimulationDelays
from service.backends.worker_utils_pod import WorkerUtilsPod
from service.clusters.catalog import Catalog, Cluster
from service.core.settings import Settings

if TYPE_CHECKING:
    from service.backends.kubernetes import KubernetesAdapter

log = logging.getLogger("nvcf.backends")

Clock = Callable[[], datetime]


class AdapterRegistry:
    """Adapters by cluster name (case-insensitive), plus the clusters that have none."""

    def __init__(
        self,
        adapters: Mapping[str, BackendAdapter],
        unavailable: Mapping[str, str] | None = None,
    ) -> None:
        self._adapters = {name.lower(): a for name, a in adapters.items()}
        self._unavailable = {name.lower(): why for name, why in (unavailable or {}).items()}

    @classmethod
    def from_catalog(
        cls,
        catalog: Catalog,
        *,
        clock: Clock | None = None,
        worker_bounds: AnswerBounds | None = None,
        worker_utils: WorkerUtilsPod | None = None,
        collector: CollectorPod | None = None,
    ) -> AdapterRegistry:
        """Build every cluster's adapter; `clock` drives simulated clusters (tests use a fake),
        `worker_bounds` bound the worker answers their HTTP/1.1 clients read, `worker_utils`
        is the sidecar Kubernetes clusters add to function pods, `collector` the one they add
        to the pods of workloads naming telemetries (None: none)."""
        adapters: dict[str, BackendAdapter] = {}
        unavailable: dict[str, str] = {}
        for cluster in catalog.clusters:
            try:
                adapters[cluster.name] = build_adapter(
                    cluster,
                    clock=clock,
                    worker_bounds=worker_bounds,
                    worker_utils=worker_utils,
                    collector=collector,
                )
            except Exception as exc:  # any failure leaves the other clusters usable
                reason = f"cluster {cluster.name} is unavailable: {_describe(exc)}"
                log.error("%s", reason)
                unavailable[cluster.name] = reason
        return cls(adapters, unavailable)

    def get(self, cluster: str) -> BackendAdapter | None:
        return self._adapters.get(cluster.lower())

    def unavailable_reason(self, cluster: str) -> str | None:
        """Why the cluster has no adapter; a generic reason for a name the catalog lacks."""
        key = cluster.lower()
        if key in self._adapters:
            return None
        return self._unavailable.get(key, f"cluster {cluster} is not in the cluster catalog")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._adapters)

    def items(self) -> Iterable[tuple[str, BackendAdapter]]:
        return self._adapters.items()

    async def aclose(self) -> None:
        for name, adapter in self._adapters.items():
            try:
                await adapter.aclose()
            except Exception:
                log.exception("closing the adapter of cluster %s failed", name)


def worker_utils_pod(settings: Settings) -> WorkerUtilsPod | None:
    """The worker-utils sidecar Kubernetes clusters add to function pods, with the bounds of
    the settings (`NVCF_WORKER_UTILS_IMAGE` empty: none)."""
    if not settings.worker_utils_image:
        return None
    return WorkerUtilsPod(
        image=settings.worker_utils_image,
        max_asset_bytes=settings.asset_max_bytes,
        max_result_bytes=settings.asset_result_max_bytes,
        max_result_files=settings.asset_result_max_files,
        timeout_seconds=settings.asset_upload_timeout_seconds,
        worker_timeout_seconds=settings.invoke_worker_timeout_seconds,
    )


def collector_pod(settings: Settings) -> CollectorPod | None:
    """The OpenTelemetry Collector sidecar Kubernetes clusters add to the pods of workloads
    naming telemetries (`NVCF_TELEMETRY_COLLECTOR_IMAGE` empty: none)."""
    image = settings.telemetry_collector_image
    return CollectorPod(image=image) if image else None


def build_adapter(
    cluster: Cluster,
    *,
    clock: Clock | None = None,
    worker_bounds: AnswerBounds | None = None,
    worker_utils: WorkerUtilsPod | None = None,
    collector: CollectorPod | None = None,
) -> BackendAdapter:
    """The adapter of one catalog cluster; raises when it cannot be built."""
    if cluster.adapter == "simulated":
        sim = cluster.simulation
        return SimulatedAdapter(
            cluster.name,
            provider=cluster.provider,
            nodes=[NodeShape(n.gpu, n.gpus_per_node, n.count) for n in cluster.nodes],
            delays=SimulationDelays(
                schedule_seconds=sim.schedule_seconds,
                pull_seconds=sim.pull_seconds,
                ready_seconds=sim.ready_seconds,
            ),
            clock=clock,
            attributes=cluster.attributes,
            upstream=sim.upstream,
            worker_bounds=worker_bounds,
            worker_utils=sim.worker_utils,
        )
    return adapter_for_cluster(
        cluster, worker_bounds=worker_bounds, worker_utils=worker_utils, collector=collector
    )


def adapter_for_cluster(cluster: Cluster, **options: Any) -> KubernetesAdapter:
    """The adapter for a catalog cluster with `adapter: kubernetes`.

    `options` are passed on to `KubernetesAdapter` (e.g. `timeout`, `field_manager`).
    """
    if cluster.adapter != "kubernetes" or cluster.kubernetes is None:
        raise ValueError(f"cluster {cluster.name} is not a kubernetes cluster")
    try:
        module = importlib.import_module("service.backends.kubernetes")
    except ImportError as exc:
        raise RuntimeError(f"the kubernetes adapter cannot be loaded ({exc})") from exc
    settings = cluster.kubernetes
    adapter: KubernetesAdapter = module.KubernetesAdapter(
        cluster.name,
        kubeconfig=None if settings.in_cluster else settings.kubeconfig,
        context=settings.context,
        in_cluster=settings.in_cluster,
        worker_access=settings.worker_access,
        cluster_domain=settings.cluster_domain,
        nodes=[NodeShape(s.gpu, s.gpus_per_node, s.count) for s in cluster.nodes],
        **options,
    )
    return adapter


def _describe(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


__all__ = ["AdapterRegistry", "adapter_for_cluster", "build_adapter"]
