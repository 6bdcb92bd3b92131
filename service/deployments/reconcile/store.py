"""Every SQL statement of the reconciler: what is due, lease claims, instance rows, bulk
lease renewals and history trimming. Row *changes* with a timeline meaning go through
`service.deployments.transitions`; this module reads, locks and does bookkeeping writes.

A pass asks only for what is due (`deployments.due_at`, `instances.due_at`, both indexed), so
a pass with nothing due costs two index probes whatever the size of the fleet.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import selectinload

from service.core.changes import BOOKKEEPING, touching
from service.core.db import for_update
from service.deployments.models import (
    Deployment,
    DeploymentSpec,
    Instance,
    InstanceDesired,
    KeptLog,
)
from service.functions import repository as functions_repository
from service.functions.models import FunctionVersion

_CHUNK = 500  # ids per IN (...) list


@dataclass(frozen=True)
class DueInstance:
    """The light columns of an instance that is due, enough to decide how to handle it."""

    id: uuid.UUID
    deployment_id: uuid.UUID
    desired: str
    phase: str
    lease_owner: str | None
    lease_expires_at: datetime | None


def _chunks(ids: Sequence[uuid.UUID]) -> Iterable[list[uuid.UUID]]:
    for i in range(0, len(ids), _CHUNK):
        yield list(ids[i : i + _CHUNK])


class ReconcileStore:
    """The reconciler's queries, for one owner (its lease identity)."""

    def __init__(
        self, sessionmaker: async_sessionmaker[AsyncSession], owner: str, lease_seconds: float
    ) -> None:
        self.sessionmaker = sessionmaker
        self.owner = owner
        self.lease = timedelta(seconds=lease_seconds)

    # ---------------------------------------------------------------- pass-level reads

    async def due(self, now: datetime, limit: int) -> tuple[list[uuid.UUID], list[DueInstance]]:
        """Deployments due for a unit of work (oldest first, at most `limit`) and instances
        due for observation."""
        async with self.sessionmaker() as session:
            deployments = list(
                (
                    await session.execute(
                        select(Deployment.id)
                        .where(Deployment.due_at <= now)
                        .order_by(Deployment.due_at)
                        .limit(limit)
                    )
                ).scalars()
            )
            instances = [
                DueInstance(*row)
                for row in (
                    await session.execute(
                        select(
                            Instance.id,
                            Instance.deployment_id,
                            Instance.desired,
                            Instance.phase,
                            Instance.lease_owner,
                            Instance.lease_expires_at,
                        ).where(Instance.due_at <= now)
                    )
                ).all()
            ]
        return deployments, instances

    async def all_due(self, now: datetime) -> int:
        """Make every wanted instance due at `now`; how many."""
        async with self.sessionmaker() as session, session.begin():
            result = await session.execute(
                update(Instance)
                .where(Instance.desired == InstanceDesired.PRESENT)
                .values(due_at=now)
                .execution_options(synchronize_session=False, **BOOKKEEPING)
            )
            return int(getattr(result, "rowcount", 0) or 0)

    async def mark_due(self, ids: Sequence[uuid.UUID], now: datetime) -> None:
        """Make wanted instances due at `now` (their backend objects changed)."""
        async with self.sessionmaker() as session, session.begin():
            for chunk in _chunks(ids):
                await session.execute(
                    update(Instance)
                    .where(
                        Instance.id.in_(chunk),
                        Instance.desired == InstanceDesired.PRESENT,
                        Instance.due_at > now,
                    )
                    .values(due_at=now)
                    .execution_options(synchronize_session=False, **BOOKKEEPING)
                )

    async def resync_due(self, now: datetime, clusters: Sequence[str] | None = None) -> int:
        """Make every wanted instance due at `now` (of some clusters only) that this owner
        may drive (its own, unleased or expired): a full re-observation; how many."""
        stmt = update(Instance).where(
            Instance.desired == InstanceDesired.PRESENT,
            Instance.due_at > now,
            or_(
                Instance.lease_owner.is_(None),
                Instance.lease_owner == self.owner,
                Instance.lease_expires_at < now,
            ),
        )
        if clusters is not None:
            stmt = stmt.where(Instance.cluster.in_(list(clusters)))
        async with self.sessionmaker() as session, session.begin():
            result = await session.execute(
                stmt.values(due_at=now).execution_options(synchronize_session=False, **BOOKKEEPING)
            )
            return int(getattr(result, "rowcount", 0) or 0)

    async def known_instance_ids(self) -> frozenset[str]:
        """Every instance id in the database, of every cluster and state."""
        async with self.sessionmaker() as session:
            ids = (await session.execute(select(Instance.id))).scalars()
            return frozenset(str(i) for i in ids)

    async def existing_instances(self, ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
        async with self.sessionmaker() as session:
            found: list[uuid.UUID] = []
            for chunk in _chunks(ids):
                found += (
                    await session.execute(select(Instance.id).where(Instance.id.in_(chunk)))
                ).scalars()
            return found

    # ---------------------------------------------------------------- leases

    async def release_leases(self) -> None:
        """Give up this owner's leases so another replica can take over at once."""
        async with self.sessionmaker() as session, session.begin():
            await session.execute(
                update(Instance)
                .where(Instance.lease_owner == self.owner)
                .values(lease_owner=None, lease_expires_at=None)
                .execution_options(**BOOKKEEPING)
            )

    async def renew(self, due: Mapping[uuid.UUID, datetime], now: datetime) -> None:
        """Extend this owner's leases on re-observed instances and set when each is due next;
        one statement per distinct due time (nearly always one)."""
        by_due: dict[datetime, list[uuid.UUID]] = defaultdict(list)
        for inst_id, when in due.items():
            by_due[when].append(inst_id)
        expires = now + self.lease
        async with self.sessionmaker() as session, session.begin():
            for when, ids in by_due.items():
                for chunk in _chunks(ids):
                    await session.execute(
                        update(Instance)
                        .where(Instance.id.in_(chunk), Instance.lease_owner == self.owner)
                        .values(lease_expires_at=expires, due_at=when)
                        .execution_options(synchronize_session=False, **BOOKKEEPING)
                    )

    # ---------------------------------------------------------------- unit-level (in a session)

    async def lock_deployments(
        self,
        session: AsyncSession,
        ids: Sequence[uuid.UUID],
        *,
        skip_locked: bool,
        objects: bool = True,
    ) -> list[Deployment]:
        """The deployments with their specs as they are now, row-locked in id order (`FOR
        UPDATE [SKIP LOCKED]` on PostgreSQL, the write gate on SQLite, so a change committed
        between this read and the pass's first write is not missed). With `skip_locked`, those
        another replica holds are left out; without `objects`, the specs' objects are not
        loaded."""
        specs = selectinload(Deployment.specs)
        stmt = for_update(
            select(Deployment)
            .where(Deployment.id.in_(list(ids)))
            .order_by(Deployment.id)
            .options(specs if objects else specs.defer(DeploymentSpec.objects)),
            skip_locked=skip_locked,
        )
        return list((await session.execute(stmt)).scalars())

    async def versions(
        self, session: AsyncSession, deployments: Sequence[Deployment]
    ) -> dict[uuid.UUID, FunctionVersion]:
        return await functions_repository.versions_by_id(
            session, {d.version_id for d in deployments}
        )

    async def lock_versions(
        self, session: AsyncSession, version_ids: Iterable[uuid.UUID]
    ) -> dict[uuid.UUID, FunctionVersion]:
        """The versions that exist as they are now, row-locked in id order: taken before
        their deployments', the order of every writer of both (an API change locks the
        version, then its deployment), so a pass and a request never wait on each other."""
        return await functions_repository.lock_versions(session, set(version_ids))

    async def claim(
        self, session: AsyncSession, deployment_ids: Sequence[uuid.UUID], now: datetime
    ) -> None:
        """Lease every instance of the deployments that is free, expired or already ours."""
        await session.execute(
            update(Instance)
            .where(
                Instance.deployment_id.in_(list(deployment_ids)),
                or_(
                    Instance.lease_owner == self.owner,
                    Instance.lease_expires_at.is_(None),
                    Instance.lease_expires_at < now,
                ),
            )
            .values(lease_owner=self.owner, lease_expires_at=now + self.lease)
            .execution_options(synchronize_session=False, **BOOKKEEPING)
        )

    async def instances(
        self, session: AsyncSession, deployment_ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, list[Instance]]:
        """Instance rows per deployment, oldest first."""
        stmt = (
            select(Instance)
            .where(Instance.deployment_id.in_(list(deployment_ids)))
            .order_by(Instance.created_at, Instance.id)
            .execution_options(populate_existing=True)
        )
        out: dict[uuid.UUID, list[Instance]] = defaultdict(list)
        for row in (await session.execute(stmt)).scalars():
            out[row.deployment_id].append(row)
        return out

    async def trim_history(
        self, session: AsyncSession, rows: Iterable[Instance], keep: int
    ) -> list[uuid.UUID]:
        """Delete all but the newest `keep` torn-down instances among `rows` (one deployment);
        returns the deleted ids."""
        gone = sorted(
            (r for r in rows if r.desired != InstanceDesired.PRESENT and not r.applied),
            key=lambda r: (r.updated_at, r.created_at),
            reverse=True,
        )
        stale = [r.id for r in gone[keep:]]
        for chunk in _chunks(stale):
            await session.execute(
                delete(Instance)
                .where(Instance.id.in_(chunk))
                .execution_options(
                    synchronize_session=False, **touching({r.deployment_id for r in gone})
                )
            )
            await session.execute(delete(KeptLog).where(KeptLog.instance_id.in_(chunk)))
        return stale
