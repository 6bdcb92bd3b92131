"""This replica's measurements of the versions under a canary release (docs/rollouts.md).

`Measured.add` is told of every request a worker answered or that failed (metrics.py, from the
one place a request finishes); it counts only the versions of the releases under way, so its
memory is bounded by those. Every `NVCF_CANARY_INTERVAL` seconds `FiguresPublisher` adds the
counts to the release's current step (deployments/canary_figures.py) and learns which versions
are under a release now.
"""

from __future__ import annotations

import logging
import uuid

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.core.loops import LoopService
from service.deployments.canary_figures import Tally, report, watched

log = logging.getLogger("nvcf.invocation.figures")


class Measured:
    """Counts of the watched versions since the last report."""

    def __init__(self) -> None:
        self.watched: frozenset[uuid.UUID] = frozenset()
        self._tallies: dict[uuid.UUID, Tally] = {}

    def add(self, version_id: uuid.UUID, failed: bool, seconds: float) -> None:
        if version_id not in self.watched:
            return
        tally = self._tallies.get(version_id)
        if tally is None:
            tally = self._tallies[version_id] = Tally()
        tally.add(failed, seconds)

    def take(self) -> dict[uuid.UUID, Tally]:
        taken, self._tallies = self._tallies, {}
        return taken


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
        self.measured.watched = frozenset(releases)
