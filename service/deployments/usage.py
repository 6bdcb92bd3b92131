"""The instances quota's count as a maintained aggregate: `account_instances.deployed` is the
maxInstances summed over an account's live deployments, adjusted in the transaction that
deploys, rescales or undeploys (transitions/), so a deploy reads one row instead of summing
every live deployment of the account."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from service.deployments.models import AccountInstances, DeploymentSpec


async def adjust(session: AsyncSession, account_id: str, delta: int) -> None:
    """Add `delta` to the account's deployed maxInstances (one atomic upsert)."""
    if delta == 0:
        return
    dialect = session.get_bind().dialect.name
    insert = pg_insert if dialect == "postgresql" else sqlite_insert
    stmt = insert(AccountInstances).values(account_id=account_id, deployed=delta)
    await session.execute(
        stmt.on_conflict_do_update(
            index_elements=[AccountInstances.account_id],
            set_={"deployed": AccountInstances.deployed + delta},
        )
    )


async def deployed_instances(
    session: AsyncSession, account_id: str, *, excluding: Iterable[uuid.UUID] = ()
) -> int:
    """maxInstances summed over the account's live deployments, leaving out the
    specifications `excluding` (read by id): two primary-key reads."""
    total = await session.scalar(
        select(AccountInstances.deployed).where(AccountInstances.account_id == account_id)
    )
    skip = list(excluding)
    if skip:
        stmt = select(func.coalesce(func.sum(DeploymentSpec.max_instances), 0)).where(
            DeploymentSpec.id.in_(skip)
        )
        total = (total or 0) - int((await session.execute(stmt)).scalar_one())
    return int(total or 0)
