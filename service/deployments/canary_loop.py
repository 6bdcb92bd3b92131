"""The loop that carries the canary releases under way (docs/rollouts.md, "Canary releases").

Every `NVCF_CANARY_INTERVAL` seconds it reads the RUNNING releases and, for each, the figures
of the canary and the stable version over the current step (canary_figures.py, what every
replica measured) and whether the canary has a Running instance; `decide` (canary.py, pure)
says what happens, and a change is written by the one writer (transitions/canary.py, a
compare-and-set: replicas running this loop together take each decision once). Everything it
needs is in the database, so a restart resumes at the same step with what was measured of it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.core.db import run_after_commit, utcnow
from service.core.events import Events
from service.core.loops import LoopService
from service.deployments import repository, transitions
from service.deployments.canary import Decision, Figures, Phase, decide
from service.deployments.canary_figures import figures_of
from service.deployments.models import CanaryRelease
from service.functions.events import AccessChanged

log = logging.getLogger("nvcf.canary")

Clock = Callable[[], datetime]


async def figures(session: AsyncSession, release: CanaryRelease) -> tuple[Figures, Figures]:
    """The canary's and the stable version's figures over the release's current step."""
    canary = await figures_of(session, release.id, release.step, release.canary_version_id)
    stable = await figures_of(session, release.id, release.step, release.stable_version_id)
    return canary, stable


async def has_running(session: AsyncSession, release: CanaryRelease) -> bool:
    deployment = await repository.live_deployment(session, release.canary_version_id)
    return deployment is not None and bool(await repository.running_routes(session, deployment.id))


class CanaryLoop(LoopService[str]):
    """Decides the RUNNING releases (see the module docstring). Each decision announces the
    function's new split (`AccessChanged`: the route tables re-read it) and runs `on_change`
    after its commit (wakes the reconciler: a rollback may undeploy the canary)."""

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        *,
        period: float,
        events: Events | None = None,
        on_change: Callable[[], None] = lambda: None,
        clock: Clock = utcnow,
    ) -> None:
        super().__init__(
            "nvcf-canary", self.round, period, log=log, failure="a canary release round failed"
        )
        self.sessionmaker = sessionmaker
        self.events = events
        self.on_change = on_change
        self.clock = clock

    async def round(self) -> list[Decision]:
        """One reading of every RUNNING release; the decisions written."""
        async with self.sessionmaker() as session:
            ids = await repository.running_release_ids(session)
        written = []
        for release_id in ids:
            async with self.sessionmaker() as session, session.begin():
                release = await repository.canary_release(session, release_id)
                if release is None or release.phase != Phase.RUNNING.value:
                    continue
                canary, stable = await figures(session, release)
                now = self.clock()
                decision = decide(
                    transitions.plan_of(release),
                    transitions.state_of(release),
                    canary,
                    stable,
                    running=await has_running(session, release),
                    now=now,
                )
                if not await transitions.decided(session, release, decision, canary, stable, now):
                    continue
                if self.events is not None:
                    await self.events.publish(session, AccessChanged(release.function_id))
            run_after_commit(session)
            log.info("canary release %s: %s", release.id, decision.reason)
            written.append(decision)
            self.on_change()
        return written
