"""Sampling the server's own counters into a bounded time series per function version.

Every `period` seconds the sampler reads the metric families this process already keeps for
Prometheus (invocations by outcome, their latency histogram, queue depth and requests in
flight, the autoscaler's target; prometheus_client's public `collect()`), plus one grouped
query of Running instances per version, and appends one point per version: the requests and
errors of the interval (counter deltas), p50/p99 of the interval's latencies (from the
histogram's bucket deltas, the upper bound of the bucket the quantile falls in), and the
gauges. An hour of points is kept per version, for at most `MAX_VERSIONS` versions (the least
recently active are dropped). Counts are this process's: each replica has its own series.

A point is stored only when it differs from its version's previous one carried forward (no
requests, the same gauges): a settled fleet stores nothing per period, and a read fills the
periods in between. After the first sample, Running instances are counted again only for the
versions with an instance written since the previous sample: a sample of a settled fleet reads
no instance row and visits only the versions this process served.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from prometheus_client import CollectorRegistry
from sqlalchemy import String, func, select, type_coerce
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.core.db import utcnow
from service.core.loops import LoopService
from service.core.schemas import iso_z
from service.deployments.models import Deployment, DeploymentHistory, Instance, InstanceDesired
from service.health.machine import Phase

log = logging.getLogger("nvcf.timeseries")

KEEP_SECONDS = 3600.0
MAX_VERSIONS = 10_000
REQUESTS = "nvcf_invocation_requests"
LATENCY = "nvcf_invocation_duration_seconds"
QUEUE = "nvcf_invocation_queue_depth"
IN_FLIGHT = "nvcf_invocation_in_flight"
TARGET = "nvcf_autoscale_target_instances"
ERRORS = frozenset({"errored", "failed", "timeout", "rejected"})


@dataclass
class _Counters:
    """A version's cumulative counters at the last sample."""

    requests: float = 0.0
    errors: float = 0.0
    buckets: dict[float, float] = field(default_factory=dict)


@dataclass
class _Reading:
    requests: float = 0.0
    errors: float = 0.0
    buckets: dict[float, float] = field(default_factory=dict)
    queue: float = 0.0
    in_flight: float = 0.0
    target: float | None = None


def quantile(deltas: Mapping[float, float], q: float) -> float | None:
    """The upper bound of the bucket holding quantile `q` of cumulative bucket counts."""
    ordered = sorted(deltas.items())
    if not ordered or ordered[-1][1] <= 0:
        return None
    wanted = q * ordered[-1][1]
    for bound, count in ordered:
        if count >= wanted:
            return bound
    return ordered[-1][0]


def read_registry(registry: CollectorRegistry) -> dict[str, _Reading]:
    """This process's counters and gauges, by version id."""
    out: dict[str, _Reading] = {}

    def of(labels: Mapping[str, str]) -> _Reading | None:
        vid = labels.get("version_id")
        return out.setdefault(vid, _Reading()) if vid else None

    for family in registry.collect():
        for sample in family.samples:
            reading = of(sample.labels)
            if reading is None:
                continue
            if sample.name == REQUESTS + "_total":
                reading.requests += sample.value
                if sample.labels.get("outcome") in ERRORS:
                    reading.errors += sample.value
            elif sample.name == LATENCY + "_bucket":
                le = sample.labels.get("le", "+Inf")
                bound = float("inf") if le == "+Inf" else float(le)
                reading.buckets[bound] = reading.buckets.get(bound, 0.0) + sample.value
            elif sample.name == QUEUE:
                reading.queue += sample.value
            elif sample.name == IN_FLIGHT:
                reading.in_flight += sample.value
            elif sample.name == TARGET:
                reading.target = sample.value
    return out


async def running_instances(
    session: AsyncSession, changed_since: datetime | None = None
) -> dict[str, int]:
    """Running instances per version id (one grouped query); with `changed_since`, only of
    the versions with an instance written since then (the single writer stamps `updated_at`
    on every change of phase or wanted state) or a deployment removed since then, 0 for those
    with none Running any more."""
    version_id = type_coerce(Deployment.version_id, String())  # the stored text, as is
    joined = select(version_id).join(Instance, Instance.deployment_id == Deployment.id)
    out: dict[str, int] = {}
    versions: list[str] | None = None
    if changed_since is not None:
        changed = joined.where(Instance.updated_at >= changed_since).distinct()
        removed = select(type_coerce(DeploymentHistory.version_id, String())).where(
            DeploymentHistory.removed_at >= changed_since
        )  # a removed deployment's instance rows are gone with it
        versions = list((await session.execute(changed.union(removed))).scalars())
        if not versions:
            return out
        out = dict.fromkeys(versions, 0)
    count = (
        joined.add_columns(func.count(Instance.id))
        .where(Instance.desired == InstanceDesired.PRESENT, Instance.phase == Phase.RUNNING.value)
        .group_by(Deployment.version_id)
    )
    for chunk in [None] if versions is None else _chunks(versions):
        stmt = count if chunk is None else count.where(version_id.in_(chunk))
        out.update({vid: n for vid, n in (await session.execute(stmt)).all()})
    return out


def _chunks(items: list[str], size: int = 500) -> list[list[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


#: what a point carries besides its time, in order
_FIELDS = (
    "requests",
    "errors",
    "latencyP50",
    "latencyP99",
    "queueDepth",
    "inFlight",
    "running",
    "target",
)
_Values = tuple[Any, ...]


def _idle_after(values: _Values) -> _Values:
    """The point that follows `values` when nothing happened: no requests, the same gauges."""
    return (0, 0, None, None, *values[4:])


class TimeSeries(LoopService[str]):
    """The points of every version seen, and the sampler that adds them."""

    def __init__(
        self,
        registry: CollectorRegistry,
        sessionmaker: async_sessionmaker[AsyncSession] | None,
        *,
        period: float = 10.0,
    ) -> None:
        self.registry = registry
        self.sessionmaker = sessionmaker
        self.period = period
        keep = max(1, int(KEEP_SECONDS / max(period, 0.001)))
        #: the times of the samples of the last hour; the next sample's number
        self._ticks: deque[str] = deque(maxlen=keep)
        self._tick = 0
        #: per version, its changes: (sample number, values), oldest first
        self._points: OrderedDict[str, deque[tuple[int, _Values]]] = OrderedDict()
        self._last: dict[str, _Counters] = {}
        #: Running instances per version (those with any), as last counted
        self._running: dict[str, int] = {}
        self._sampled: datetime | None = None
        self._margin = timedelta(seconds=max(period, 1.0))
        super().__init__(
            "nvcf-timeseries",
            self.sample,
            period,
            log=log,
            failure="sampling the per-version time series failed",
        )

    @property
    def stored(self) -> int:
        """Points stored, over every version (one per change, not per period)."""
        return sum(len(changes) for changes in self._points.values())

    def points(self, version_id: str) -> list[dict[str, Any]]:
        """One point per sample of the last hour since the version was first seen."""
        changes = self._points.get(version_id, ())
        first_kept = self._tick - len(self._ticks)
        out: list[dict[str, Any]] = []
        pending = iter(changes)
        upcoming = next(pending, None)
        current: tuple[int, _Values] | None = None
        for tick in range(first_kept, self._tick):
            while upcoming is not None and upcoming[0] <= tick:
                current, upcoming = upcoming, next(pending, None)
            if current is None:
                continue  # not seen yet
            number, values = current
            values = values if number == tick else _idle_after(values)
            out.append(
                {"at": self._ticks[tick - first_kept], **dict(zip(_FIELDS, values, strict=True))}
            )
        return out

    async def sample(self, now: datetime | None = None) -> None:
        at = now or utcnow()
        readings = read_registry(self.registry)
        running: dict[str, int] = {}
        if self.sessionmaker is not None:
            # after the first sample, only versions whose instances were written since the
            # previous one (a period earlier still: a write stamped before it may have
            # committed after it, and replicas' clocks differ)
            since = None if self._sampled is None else self._sampled - self._margin
            async with self.sessionmaker() as session:
                running = await running_instances(session, since)
        self._sampled = at
        self.add(readings, running, at)

    def add(
        self, readings: Mapping[str, _Reading], running: Mapping[str, int], at: datetime
    ) -> None:
        """One sample: this process's counters and gauges, and the Running instances of the
        versions that may have changed since the previous sample (the others keep theirs)."""
        tick = self._tick
        self._tick += 1
        self._ticks.append(iso_z(at))
        first_kept = self._tick - len(self._ticks)
        for vid, n in running.items():
            if n:
                self._running[vid] = n
            else:
                self._running.pop(vid, None)
        for vid in set(readings) | set(running):
            reading = readings.get(vid, _Reading())
            changes = self._points.get(vid)
            last = self._last.get(vid, _Counters())
            requests = max(0.0, reading.requests - last.requests)
            if requests or reading.errors != last.errors:
                deltas = {
                    b: max(0.0, c - last.buckets.get(b, 0.0)) for b, c in reading.buckets.items()
                }
                latency = [quantile(deltas, q) if requests else None for q in (0.5, 0.99)]
                self._last[vid] = _Counters(reading.requests, reading.errors, dict(reading.buckets))
            else:
                latency = [None, None]
            values: _Values = (
                int(requests),
                int(max(0.0, reading.errors - last.errors)),
                *(None if v == float("inf") else v for v in latency),  # inf: unknown
                int(reading.queue),
                int(reading.in_flight),
                self._running.get(vid, 0),
                int(reading.target) if reading.target is not None else None,
            )
            if changes is not None and _idle_after(changes[-1][1]) == values:
                continue  # what a read carries forward anyway
            if changes is None:
                changes = self._points[vid] = deque()
            changes.append((tick, values))
            # the newest change before the hour's first sample still gives the hour its values
            while len(changes) > 1 and changes[1][0] <= first_kept:
                changes.popleft()
            self._points.move_to_end(vid)
        while len(self._points) > MAX_VERSIONS:
            vid, _ = self._points.popitem(last=False)
            self._last.pop(vid, None)

    def versions(self) -> Iterable[str]:
        return self._points.keys()


__all__ = ["TimeSeries", "quantile", "read_registry", "running_instances"]
