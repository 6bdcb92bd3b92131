"""Garbage collection of orphaned instance namespaces: its own loop service.

Adapters that can (`GarbageCollecting`, e.g. `kubernetes`) delete the `sr-*` namespaces they
labelled whose instance id is not in the database — after an older database was restored, or
an instance torn down while its cluster was missing from the catalog.

The id snapshot holds every Instance row of every cluster, whatever its state: a row is
committed before its cluster is recorded and before anything is applied, so every namespace
of a row that existed at snapshot time is spared. Rows created after the snapshot, by any
replica, are the only risk. The reconciler of this process creates none during a round: the
two share a lock, so a round runs between passes. For other replicas, the adapter spares
namespaces younger than `min_age`, and a
collected namespace whose instance exists right after collection is logged as an error (that
instance then typically fails on a missing object and is replaced). A failing round is logged
and never stops the loop; one cluster's failure does not affect the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from service.backends.protocol import AdapterError, GarbageCollecting
from service.clusters.adapters import AdapterRegistry
from service.core.kube import namespace_instance_id
from service.core.loops import LoopService
from service.deployments.reconcile.config import CollectorConfig
from service.deployments.reconcile.store import ReconcileStore

log = logging.getLogger("nvcf.gc")

HISTORY = 1000  # collected namespaces remembered in `NamespaceCollector.collected`


@dataclass
class GarbageReport:
    """One round: namespaces whose deletion started, per cluster, and the clusters where
    collection failed (with the reason)."""

    collected: dict[str, list[str]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


class NamespaceCollector(LoopService[str]):
    """Runs `collect()` every `config.period` seconds (0 disables the loop)."""

    def __init__(
        self,
        store: ReconcileStore,
        registry: AdapterRegistry,
        config: CollectorConfig | None = None,
        *,
        between_passes: asyncio.Lock | None = None,
    ) -> None:
        self.store = store
        self._between_passes = between_passes or asyncio.Lock()
        self.registry = registry
        self.config = config or CollectorConfig()
        self.last_report: GarbageReport | None = None
        #: (cluster, namespace) collected since start, newest last
        self.collected: list[tuple[str, str]] = []
        #: ids of other kinds of instance namespaces the collector must spare (tasks' ids,
        #: wired by the composition)
        self.also_known: list[Callable[[], Awaitable[frozenset[str]]]] = []
        super().__init__(
            "nvcf-namespace-gc",
            self.collect,
            self.config.period,
            log=log,
            failure="garbage collection failed",
        )

    async def collect(self) -> GarbageReport:
        """One round over every adapter that supports it, between reconciliation passes."""
        async with self._between_passes:
            return await self._collect()

    async def _collect(self) -> GarbageReport:
        collectors = [a for _, a in self.registry.items() if isinstance(a, GarbageCollecting)]
        report = GarbageReport()
        if not collectors:
            self.last_report = report
            return report
        known = await self.store.known_instance_ids()
        for more in self.also_known:
            known |= await more()
        await asyncio.gather(*(self._one(a, known, report) for a in collectors))
        for cluster, why in report.errors.items():
            log.warning("garbage collection on cluster %s failed: %s", cluster, why)
        collected = [(c, ns) for c, names in report.collected.items() for ns in names]
        for cluster, namespace in collected:
            log.warning(
                "garbage collection: deleting namespace %s on cluster %s (its instance is not "
                "in the database)",
                namespace,
                cluster,
            )
        if collected:
            self.collected = [*self.collected, *collected][-HISTORY:]
            await self._check(collected)
        self.last_report = report
        return report

    async def _one(
        self, adapter: GarbageCollecting, known: frozenset[str], report: GarbageReport
    ) -> None:
        try:
            async with asyncio.timeout(self.config.timeout):
                collected = await adapter.garbage_collect(
                    known, min_age_seconds=self.config.min_age
                )
        except asyncio.CancelledError:
            raise
        except AdapterError as exc:
            report.errors[adapter.name] = exc.message
        except TimeoutError:
            report.errors[adapter.name] = f"timed out after {self.config.timeout:g}s"
        except Exception as exc:
            log.exception("garbage collection on cluster %s failed", adapter.name)
            report.errors[adapter.name] = f"{type(exc).__name__}: {exc}"
        else:
            report.collected[adapter.name] = list(collected)

    async def _check(self, collected: Sequence[tuple[str, str]]) -> None:
        """Complain loudly about a collected namespace whose instance exists after all (created
        by another replica between the id snapshot and the adapter's listing)."""
        by_id: dict[uuid.UUID, tuple[str, str]] = {}
        for cluster, namespace in collected:
            with contextlib.suppress(ValueError, TypeError):
                by_id[uuid.UUID(namespace_instance_id(namespace))] = (cluster, namespace)
        if not by_id:
            return
        for inst_id in await self.store.existing_instances(list(by_id)):
            cluster, namespace = by_id[inst_id]
            log.error(
                "garbage collection raced with instance creation: namespace %s on cluster "
                "%s belongs to instance %s, created meanwhile",
                namespace,
                cluster,
                inst_id,
            )
