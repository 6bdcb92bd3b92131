"""The instances quota's count as a maintained aggregate: `account_instances.deployed` is the
maxInstances summed over an account's live deployments, adjusted in the transaction that
deploys, rescales or undeploys (transitions/), so a deploy reads one row instead of summing
every live deployment of the account."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from sqlalchemy.ext.asyncio import AsyncSession

from service.deployments import repository


async def adjust(session: AsyncSession, account_id: str, delta: int) -> None:
    """Add `delta` to the account's deployed maxInstances (one atomic upsert)."""
    if delta == 0:
        return
    await repository.add_deployed_instances(session, account_id, delta)


async def deployed_instances(
    session: AsyncSession, account_id: str, *, excluding: Iterable[uuid.UUID] = ()
) -> int:
    """maxInstances summed over the account's live deployments, leaving out the
    specifications `excluding` (read by id): two primary-key reads."""
    total = await repository.deployed_instances(session, account_id)
    skip = list(excluding)
    if skip:
        total = (total or 0) - await repository.max_instances_of(session, skip)
    return int(total or 0)
