"""Instance placement (runtime.md §3): which candidate cluster gets a new instance.

The candidates are the spec's `candidate_clusters` (already narrowed by group, `clusters`,
`regions`, `attributes` and the helmValidationPolicy the clusters permit at deploy time), less
those whose catalog entry no longer permits the spec's policy (`permitted_candidates`).
Placement keeps those with room for the instance type right now and prefers the one with the
most free GPUs of the model, the deploy-time order breaking ties. Free capacity comes from the
adapters once per reconciliation pass (`CapacityView`); every placement made in the pass is
subtracted locally so two instances placed in the same pass never count the same free GPUs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from service.backends.protocol import AdapterError, Capacity, ShapeCapacity
from service.charts.target import stored_policy
from service.clusters.adapters import AdapterRegistry
from service.clusters.catalog import Catalog


@dataclass(frozen=True)
class Placement:
    """The chosen cluster, or why there is none.

    `unavailable` is True when no candidate cluster has a working adapter at all — waiting
    cannot help, so the instance fails instead of waiting for capacity.
    """

    cluster: str | None
    message: str = ""
    unavailable: bool = False


class CapacityView:
    """Free capacity per cluster as seen by one pass, minus the pass's own placements."""

    def __init__(self, registry: AdapterRegistry) -> None:
        self._registry = registry
        self._capacity: dict[str, Capacity] = {}
        self._errors: dict[str, str] = {}
        #: reads in flight: concurrent units of one pass share them
        self._reading: dict[str, asyncio.Future[None]] = {}

    async def capacity(self, cluster: str) -> Capacity | str:
        """The cluster's free capacity, or a message saying why it is unknown."""
        key = cluster.lower()
        if key not in self._capacity and key not in self._errors:
            reading = self._reading.get(key)
            if reading is None:
                reading = self._reading[key] = asyncio.ensure_future(self._read(cluster, key))
            # a cancelled waiter must not cancel the read the others wait for
            await asyncio.shield(reading)
        if key in self._capacity:
            return self._capacity[key]
        return self._errors[key]

    async def _read(self, cluster: str, key: str) -> None:
        try:
            adapter = self._registry.get(cluster)
            if adapter is None:
                reason = self._registry.unavailable_reason(cluster)
                self._errors[key] = reason or f"cluster {cluster} is unknown"
                return
            try:
                self._capacity[key] = await adapter.capacity()
            except AdapterError as exc:
                self._errors[key] = f"cluster {cluster}: cannot read capacity: {exc.message}"
        finally:
            self._reading.pop(key, None)  # after a failure the next caller reads again

    def reserve(self, cluster: str, gpu: str, gpus_per_node: int, nodes: int = 1) -> bool:
        """Subtract one instance from the cached capacity; False if it no longer fits."""
        key = cluster.lower()
        cap = self._capacity.get(key)
        if cap is None or not cap.fits(gpu, gpus_per_node, nodes):
            return False
        shapes: list[ShapeCapacity] = []
        left = nodes
        for shape in cap.shapes:
            free = list(shape.free_per_node)
            if shape.gpu.upper() == gpu.upper() and left > 0:
                for i, f in enumerate(free):
                    if left == 0:
                        break
                    if nodes <= 1 and f >= gpus_per_node:
                        free[i] -= gpus_per_node
                        left = 0
                    elif (
                        nodes > 1
                        and shape.gpus_per_node == gpus_per_node
                        and f == shape.gpus_per_node
                    ):
                        free[i] = 0
                        left -= 1
            shapes.append(ShapeCapacity(shape.gpu, shape.gpus_per_node, tuple(free)))
        self._capacity[key] = Capacity(tuple(shapes))
        return True


def permitted_candidates(
    catalog: Catalog, candidates: Sequence[str], policy: Mapping[str, Any] | None
) -> list[str]:
    """The candidate clusters (names, order kept) whose catalog entry permits the spec's
    stored helmValidationPolicy; names the catalog no longer has are kept (placement says
    they are unknown)."""
    wanted = stored_policy(policy)
    keys = [t.key for t in wanted.extra_kubernetes_types]
    return [
        name
        for name in candidates
        if catalog.cluster(name) is None or catalog.permission(name).permits(wanted.name, keys)
    ]


async def place(
    view: CapacityView,
    candidates: Sequence[str],
    *,
    gpu: str,
    gpus_per_node: int,
    nodes: int = 1,
) -> Placement:
    """Pick a cluster for one instance of `<gpu>_<gpus_per_node>x[.x<nodes>]` and reserve it."""
    wanted = f"{gpus_per_node} x {gpu}" + (f" on each of {nodes} nodes" if nodes > 1 else "")
    if not candidates:
        return Placement(None, "the deployment specification has no candidate cluster", True)
    fitting: list[tuple[int, int, str]] = []
    problems: list[str] = []
    reachable = 0
    for index, name in enumerate(candidates):
        cap = await view.capacity(name)
        if isinstance(cap, str):
            problems.append(cap)
            continue
        reachable += 1
        if cap.fits(gpu, gpus_per_node, nodes):
            fitting.append((-cap.free_gpus(gpu), index, name))
        else:
            problems.append(f"cluster {name} has {cap.free_gpus(gpu)} free {gpu} GPUs")
    for _, _, name in sorted(fitting):
        if view.reserve(name, gpu, gpus_per_node, nodes):
            return Placement(name)
    if reachable == 0:
        return Placement(None, "; ".join(problems), True)
    detail = "; ".join(problems)
    return Placement(None, f"no candidate cluster has room for {wanted} ({detail})")


__all__ = ["CapacityView", "Placement", "permitted_candidates", "place"]
