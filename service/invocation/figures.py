"""This replica's measurements of the versions under a canary release (docs/rollouts.md).

`Measured.add` is told of every request a worker answered or that failed (metrics.py, from the
one place a request finishes); it counts only the versions of the releases under way, so its
memory is bounded by those. Every `NVCF_CANARY_INTERVAL` seconds `FiguresPublisher` adds the
counts to the release's current step (deployments/canary_figures.py) and learns which versions
are under a release now.

On /metrics the same requests are `nvcf_canary_requests_total{outcome}` and
`nvcf_canary_duration_seconds`, labelled `function_id`, `version_id`, `role` (`canary`,
`stable`) and `weight` (the version's share when the request ended: a release has at most 20
steps, so at most that many series per version), and `nvcf_canary_weight` is each version's
share now.
"""

from __future__ import annotations

import contextlib
import logging
import uuid

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.core.loops import LoopService
from service.deployments.canary_figures import BOUNDS, Tally, Watched, report, watched

log = logging.getLogger("nvcf.invocation.figures")


#: the metric buckets: every fourth of the analysis's (1 ms to about 5 minutes)
_METRIC_BUCKETS = BOUNDS[::4]
_LABELS = ["function_id", "version_id", "role", "weight"]


class Measured:
    """Counts of the watched versions since the last report (see the module docstring)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        #: by the version's id as text (what the hot path has: `Target.vid`)
        self._watched: dict[str, Watched] = {}
        self._tallies: dict[str, Tally] = {}
        #: the label values each watched version's series were written with
        self._series: dict[str, set[tuple[str, str, str, str]]] = {}
        self.requests = Counter(
            "nvcf_canary_requests_total",
            "Requests of the versions under a canary release, by role, weight and outcome.",
            [*_LABELS, "outcome"],
            registry=registry,
        )
        self.latency = Histogram(
            "nvcf_canary_duration_seconds",
            "Time of the requests of the versions under a canary release, by role and weight.",
            _LABELS,
            registry=registry,
            buckets=_METRIC_BUCKETS,
        )
        self.weight = Gauge(
            "nvcf_canary_weight",
            "The share (%) of a function's traffic of each version under a canary release.",
            ["function_id", "version_id", "role"],
            registry=registry,
        )

    def watch(self, releases: dict[uuid.UUID, Watched]) -> None:
        """The versions under a release from now on (the publisher's last reading)."""
        versions = {str(v): w for v, w in releases.items()}
        for version_id, gone in self._watched.items():
            if version_id not in versions:  # its release ended: its series go
                self.weight.remove(str(gone.function_id), version_id, gone.role)
                for labels in self._series.pop(version_id, ()):
                    self.latency.remove(*labels)
                    for outcome in ("fulfilled", "errored"):
                        with contextlib.suppress(KeyError):
                            self.requests.remove(*labels, outcome)
        for version_id, w in versions.items():
            self.weight.labels(str(w.function_id), version_id, w.role).set(w.weight)
        self._watched = versions

    def add(self, version_id: str, failed: bool, seconds: float) -> None:
        w = self._watched.get(version_id)
        if w is None:
            return
        tally = self._tallies.get(version_id)
        if tally is None:
            tally = self._tallies[version_id] = Tally()
        tally.add(failed, seconds)
        labels = (str(w.function_id), version_id, w.role, str(w.weight))
        self._series.setdefault(version_id, set()).add(labels)
        self.requests.labels(*labels, "errored" if failed else "fulfilled").inc()
        self.latency.labels(*labels).observe(seconds)

    def take(self) -> dict[uuid.UUID, Tally]:
        taken, self._tallies = self._tallies, {}
        return {uuid.UUID(v): tally for v, tally in taken.items()}


class FiguresPublisher:
    """Reports `Measured` to the releases' figures (see the module docstring)."""

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        owner: str,
        measured: Measured,
        *,
        period: float,
    ) -> None:
        self.sessionmaker = sessionmaker
        self.owner = owner
        self.measured = measured
        self._job: LoopService[str] = LoopService(
            "nvcf-canary-figures",
            self.publish,
            period,
            log=log,
            failure="publishing the canary figures failed",
        )

    def start(self) -> None:
        self._job.start()

    async def stop(self) -> None:
        await self._job.stop()
        try:
            await self.publish()  # what was counted since the last report
        except Exception:
            log.exception("publishing the canary figures at stop failed")

    async def publish(self) -> None:
        """One report: the counts since the last one added to each release's current step."""
        tallies = self.measured.take()
        async with self.sessionmaker() as session, session.begin():
            releases = await watched(session)
            await report(session, self.owner, tallies, releases)
        self.measured.watch(releases)
