"""Each replica's load per function version, published to the database for the autoscaler.

`LoadTracker` is told by the dispatcher (a `LoadListener`) whenever a version's load on this
replica changes: requests in flight, requests waiting. It integrates in-flight over time, so
a report carries the *average* in flight since the previous one (short requests between two
reports count), the requests waiting now, and the last time a request arrived (the sum of in
flight and waiting grew). When a request waits for a version with no Running instance, it
calls `on_cold` at once (the autoscaler wakes in this process) and asks for a report now.

`LoadPublisher` reports, every `NVCF_AUTOSCALE_LOAD_REPORT_SECONDS` (or at once when asked),
each version whose load changed or is not zero, through deployments' load signal
(deployments/load_signal.py, which owns the tables). A version idle on this replica costs
nothing per report. Every sixtieth report also forgets the replicas silent for longer than a
request lives (`NVCF_INVOKE_RESULT_TTL_SECONDS`), as the heartbeat sweep forgets them.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.core.db import utcnow
from service.core.loops import LoopService
from service.deployments.load_signal import LoadSample, report_load
from service.invocation.routing import Target

log = logging.getLogger("nvcf.invocation.load")

Clock = Callable[[], float]


@dataclass(eq=False, slots=True)
class VersionLoad:
    """One version's load on this replica, as the dispatcher last told it."""

    version_id: uuid.UUID
    in_flight: int = 0
    waiting: int = 0
    #: ∫ in_flight dt since the last report, and when in_flight last changed
    area: float = 0.0
    changed: float = 0.0
    reported: float = 0.0
    #: when a request last arrived (the tracker's clock: turned into a time at the report)
    last_request: float | None = None
    dirty: bool = True
    #: the last report said no load at all (no need to say it again)
    quiet: bool = False


class LoadTracker:
    """This replica's load per version (see the module docstring)."""

    def __init__(
        self,
        *,
        clock: Clock = time.monotonic,
        on_cold: Callable[[uuid.UUID], None] | None = None,
        on_version: Callable[[Target, VersionLoad], None] | None = None,
    ) -> None:
        self._clock = clock
        #: by version id as text (strings hash once; this is told twice per request)
        self._versions: dict[str, VersionLoad] = {}
        self.on_cold = on_cold
        #: told of each version's record as it is made (the metrics' gauges read it)
        self.on_version = on_version
        #: set when a report should go out now
        self.urgent = asyncio.Event()

    def __call__(self, target: Target, in_flight: int, waiting: int) -> None:
        now = self._clock()
        v = self._versions.get(target.vid)
        if v is None:
            v = self._versions[target.vid] = VersionLoad(
                target.version_id, changed=now, reported=now
            )
            if self.on_version is not None:
                self.on_version(target, v)
        before, was_waiting = v.in_flight, v.waiting
        v.area += before * (now - v.changed)
        v.changed = now
        v.in_flight = in_flight
        v.waiting = waiting
        v.dirty = True
        if in_flight + waiting > before + was_waiting:
            v.last_request = now
        if waiting and not was_waiting and not target.instances:
            self.urgent.set()  # a cold start: the first request waiting with no instance
            if self.on_cold is not None:
                self.on_cold(target.version_id)

    def snapshot(self) -> list[LoadSample]:
        """The versions to report: changed since the last report, or whose last report was
        not all zeros."""
        now = self._clock()
        wall = utcnow()
        out: list[LoadSample] = []
        for key, v in list(self._versions.items()):
            if not v.dirty and v.quiet:
                del self._versions[key]  # said: no load; a new request starts afresh
                continue
            v.area += v.in_flight * (now - v.changed)
            span = now - v.reported
            average = v.area / span if span > 0 else float(v.in_flight)
            last = None
            if v.last_request is not None:
                last = wall - timedelta(seconds=max(0.0, now - v.last_request))
            out.append(LoadSample(v.version_id, average, v.waiting, last))
            v.area, v.changed, v.reported, v.dirty = 0.0, now, now, False
            v.quiet = average == 0 and v.in_flight == 0 and v.waiting == 0
        return out


class LoadPublisher:
    """Reports a `LoadTracker` to the database (see the module docstring)."""

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        owner: str,
        tracker: LoadTracker,
        *,
        period: float,
        forget_after: timedelta = timedelta(days=1),
    ) -> None:
        self.sessionmaker = sessionmaker
        self.forget_after = forget_after
        self.owner = owner
        self.tracker = tracker
        self.period = period
        self.reports = 0
        self._job: LoopService[str] = LoopService(
            "nvcf-load-publisher",
            self.publish,
            period,
            log=log,
            failure="publishing the invocation load failed",
            wake=tracker.urgent,
        )

    def start(self) -> None:
        self._job.start()

    async def stop(self) -> None:
        await self._job.stop()

    async def publish(self) -> int:
        """One report; the number of version rows written."""
        samples = self.tracker.snapshot()
        prune = self.forget_after if self.reports % 60 == 0 else None
        async with self.sessionmaker() as session, session.begin():
            await report_load(session, self.owner, samples, utcnow(), prune=prune)
        self.reports += 1
        return len(samples)


__all__ = ["LoadPublisher", "LoadSample", "LoadTracker", "VersionLoad"]
