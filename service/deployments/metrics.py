"""The deployment runtime's Prometheus metrics (docs/telemetry.md): the reconciler's passes and
units of work, the fleet gauges (function versions by status, instances by phase and
cluster), and the autoscaler's decisions and targets."""

from __future__ import annotations

import asyncio
import logging
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.deployments import repository as deployments_repository
from service.deployments.models import InstanceDesired
from service.functions import repository as functions_repository
from service.health.status import VersionStatus

log = logging.getLogger(__name__)

#: seconds: an idle pass is two index probes; a busy one places, applies and observes
PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
#: the phase label of an instance no longer wanted whose objects are still on its cluster
TERMINATING = "Terminating"
#: the cluster label of an instance not placed yet
UNPLACED = "none"


class ReconcileMetrics:
    """The reconciler's metric families, registered on `registry` (a private one by default,
    for reconcilers built outside an application)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry if registry is not None else CollectorRegistry()
        self.pass_seconds = Histogram(
            "nvcf_reconcile_pass_duration_seconds",
            "Reconciler passes (idle ones included), in seconds.",
            registry=registry,
            buckets=PASS_BUCKETS,
        )
        units = Counter(
            "nvcf_reconcile_units_total",
            "Units of work run by the reconciler (one batch of deployments each), by result; a "
            "failed batch is retried deployment by deployment, each retry a unit of its own.",
            ["result"],
            registry=registry,
        )
        self.units = {r: units.labels(r) for r in ("ok", "failed")}

    def unit_done(self, ok: bool) -> None:
        self.units["ok" if ok else "failed"].inc()


class FleetGauges:
    """`nvcf_function_versions{status}` and `nvcf_instances{phase,cluster}`, counted in the
    database when `/metrics` is scraped, at most once every `max_age` seconds.

    Why counted and not kept up to date by the one writer of state (transitions/): versions
    are also created and deleted by the functions service; a writer's transaction may roll back
    after the change; each replica sees only its own writes, while these gauges must say the
    same on every replica; and a restart would have to count anyway. Two GROUP BY statements
    answer exactly, with one row per status and per (phase, cluster) however large the fleet.
    Their cost grows with the tables, so it is bounded in rate instead: one refresh per
    `max_age` (`NVCF_METRICS_FLEET_CACHE_SECONDS`, 15 s), whatever the scrape rate and the
    number of scrapers, concurrent scrapes waiting for the one refresh in flight, and nothing at
    all when nobody scrapes. The instance count reads only live rows (wanted, or still applied)
    through the `desired` index, not the torn-down history. A failed refresh keeps the last
    values (and is logged): a scrape never fails because of it.

    Every replica reports the whole fleet: aggregate replicas with `max`, not `sum`.
    """

    def __init__(self, registry: CollectorRegistry, *, max_age: float) -> None:
        self.max_age = max_age
        self.versions = Gauge(
            "nvcf_function_versions",
            "Function versions by status (the whole fleet, as stored).",
            ["status"],
            registry=registry,
        )
        self.instances = Gauge(
            "nvcf_instances",
            "Instances wanted or still on a cluster, by phase (Terminating: no longer wanted, "
            "objects not yet deleted) and cluster (none: not placed yet).",
            ["phase", "cluster"],
            registry=registry,
        )
        for status in VersionStatus:
            self.versions.labels(status.value).set(0)
        self._instance_labels: set[tuple[str, str]] = set()
        self._refreshed_at: float | None = None
        self._lock = asyncio.Lock()
        #: database round trips made (tests read it to tell a cached answer from a fresh one)
        self.refreshes = 0

    def _fresh(self) -> bool:
        at = self._refreshed_at
        return at is not None and time.monotonic() - at < self.max_age

    async def refresh(self, sessionmaker: async_sessionmaker[AsyncSession]) -> None:
        """Count again unless the last count is younger than `max_age`."""
        if self._fresh():
            return
        async with self._lock:
            if self._fresh():  # another scrape refreshed while this one waited
                return
            try:
                versions, instances = await self._count(sessionmaker)
            except Exception:
                log.warning("counting the fleet for /metrics failed", exc_info=True)
                return
            finally:
                self._refreshed_at = time.monotonic()
            self.refreshes += 1
            self._publish(versions, instances)

    async def _count(
        self, sessionmaker: async_sessionmaker[AsyncSession]
    ) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
        async with sessionmaker() as session:
            versions = await functions_repository.count_versions_by_status(session)
            instance_rows = await deployments_repository.instance_counts(session)
            instances: dict[tuple[str, str], int] = {}
            for phase, cluster, desired, n in instance_rows:
                label = phase if desired == InstanceDesired.PRESENT else TERMINATING
                key = (str(label), str(cluster or UNPLACED))
                instances[key] = instances.get(key, 0) + int(n)
        return versions, instances

    def _publish(self, versions: dict[str, int], instances: dict[tuple[str, str], int]) -> None:
        for status in {s.value for s in VersionStatus} | versions.keys():
            self.versions.labels(status).set(versions.get(status, 0))
        # A series seen once stays, at zero when empty: it does not vanish between scrapes.
        self._instance_labels |= instances.keys()
        for labels in self._instance_labels:
            self.instances.labels(*labels).set(instances.get(labels, 0))


class AutoscaleMetrics:
    """The autoscaler's families: its decisions by direction, and the instances it wants per
    function version (set at each of its readings of a version)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry if registry is not None else CollectorRegistry()
        decisions = Counter(
            "nvcf_autoscale_decisions_total",
            "Scaling decisions of the autoscaler, by direction (up: more instances, down: fewer).",
            ["direction"],
            registry=registry,
        )
        self.decisions = {d: decisions.labels(d) for d in ("up", "down")}
        readings = Counter(
            "nvcf_autoscale_readings_total",
            "Readings of the load by the autoscaler, by signal: present, or missing (no "
            "invocation replica reported recently: every count is held, none read as zero).",
            ["signal"],
            registry=registry,
        )
        self.readings = {s: readings.labels(s) for s in ("present", "missing")}
        self.targets = Gauge(
            "nvcf_autoscale_target_instances",
            "Instances the autoscaler wants for a function version (summed over its GPU "
            "specifications), as of its last reading of the version on this replica.",
            ["function_id", "version_id"],
            registry=registry,
        )

    def read(self, signal: bool) -> None:
        self.readings["present" if signal else "missing"].inc()

    def decided(self, direction: str) -> None:
        self.decisions[direction].inc()

    def target(self, function_id: str, version_id: str, instances: int) -> None:
        self.targets.labels(function_id, version_id).set(instances)


__all__ = ["AutoscaleMetrics", "FleetGauges", "ReconcileMetrics"]
