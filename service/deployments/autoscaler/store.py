"""Every SQL statement of the autoscaler: the deployments worth a reading, their row locks,
Running counts and the autoscaler's memory (compare-and-set); the load of live replicas is read
through deployments' load signal (load_signal.py).

Which deployments are read: those of versions with load (or a request within the idle period)
reported by a live replica, and those whose target is above a minimum (they may scale down);
a fleet idle at its minimums costs three small queries per reading, whatever its size.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from datetime import datetime

from sqlalchemy import ColumnElement, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import selectinload

from service.deployments.autoscale.decide import Load
from service.deployments.load_signal import reported_load
from service.deployments.models import (
    AutoscaleState,
    Deployment,
    DeploymentDesired,
    DeploymentSpec,
    Instance,
    InstanceDesired,
)
from service.health.machine import Phase


class AutoscaleStore:
    def __init__(self, sessionmaker: async_sessionmaker[AsyncSession]) -> None:
        self.sessionmaker = sessionmaker

    async def loads(
        self, fresh_since: datetime, requests_since: datetime
    ) -> dict[uuid.UUID, Load] | None:
        """Each version's load summed over the replicas that reported since `fresh_since`;
        None when no replica did (no signal at all). Only versions with something in flight or
        waiting, or a request since `requests_since`, are answered: any other has no load on
        any of them (and nothing to decide unless it is above its minimum)."""
        async with self.sessionmaker() as session:
            return await reported_load(session, fresh_since, requests_since)

    async def candidates(
        self, versions: Collection[uuid.UUID], *, only: bool = False
    ) -> list[uuid.UUID]:
        """Live deployments of `versions`, and (unless `only`) those with a spec above its
        minimum."""
        cond: ColumnElement[bool] = Deployment.version_id.in_(list(versions))
        if not only:
            # the terms of models.ABOVE_MINIMUM: a read of its partial index, not of every spec
            above = (
                select(DeploymentSpec.deployment_id)
                .where(
                    DeploymentSpec.target_instances.is_not(None),
                    DeploymentSpec.target_instances > DeploymentSpec.min_instances,
                )
                .scalar_subquery()
            )
            cond = or_(cond, Deployment.id.in_(above))
        async with self.sessionmaker() as session:
            rows = await session.execute(
                select(Deployment.id)
                .where(Deployment.desired == DeploymentDesired.DEPLOYED, cond)
                .order_by(Deployment.id)
            )
            return list(rows.scalars())

    @staticmethod
    async def lock(
        session: AsyncSession, ids: Sequence[uuid.UUID], *, skip_locked: bool
    ) -> list[Deployment]:
        """The live deployments with their specs (not their objects), row-locked in id order
        (PostgreSQL; SQLite has one writer)."""
        stmt = (
            select(Deployment)
            .where(Deployment.id.in_(list(ids)), Deployment.desired == DeploymentDesired.DEPLOYED)
            .order_by(Deployment.id)
            .with_for_update(skip_locked=skip_locked)
            .options(selectinload(Deployment.specs).defer(DeploymentSpec.objects))
            .execution_options(populate_existing=True)
        )
        return list((await session.execute(stmt)).scalars())

    @staticmethod
    async def running(session: AsyncSession, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
        """Running, wanted instances per specification of the deployments."""
        rows = await session.execute(
            select(Instance.spec_id, func.count())
            .where(
                Instance.deployment_id.in_(list(ids)),
                Instance.desired == InstanceDesired.PRESENT,
                Instance.phase == Phase.RUNNING.value,
            )
            .group_by(Instance.spec_id)
        )
        return {sid: int(n) for sid, n in rows.all()}

    @staticmethod
    async def states(
        session: AsyncSession, ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, AutoscaleState]:
        rows = await session.execute(
            select(AutoscaleState).where(AutoscaleState.deployment_id.in_(list(ids)))
        )
        return {s.deployment_id: s for s in rows.scalars()}

    @staticmethod
    async def save(
        session: AsyncSession,
        deployment: Deployment,
        previous: AutoscaleState | None,
        state: dict[str, object],
        now: datetime,
    ) -> bool:
        """Store the memory if nobody changed it since it was read (compare-and-set on
        `revision`); whether it was stored."""
        if previous is None:
            dialect = session.get_bind().dialect.name
            insert = pg_insert if dialect == "postgresql" else sqlite_insert
            result = await session.execute(
                insert(AutoscaleState)
                .values(
                    deployment_id=deployment.id,
                    version_id=deployment.version_id,
                    revision=1,
                    state=state,
                    updated_at=now,
                )
                .on_conflict_do_nothing(index_elements=[AutoscaleState.deployment_id])
            )
            return bool(getattr(result, "rowcount", 0))
        result = await session.execute(
            update(AutoscaleState)
            .where(
                AutoscaleState.deployment_id == deployment.id,
                AutoscaleState.revision == previous.revision,
            )
            .values(revision=previous.revision + 1, state=state, updated_at=now)
            .execution_options(synchronize_session=False)
        )
        return bool(getattr(result, "rowcount", 0))
