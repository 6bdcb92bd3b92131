"""Every SQL statement of telemetry endpoints (service.py holds the use cases; the request's
transaction commits)."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from service.core.db import for_update
from service.observability.models import Telemetry


async def by_id(session: AsyncSession, telemetry_id: uuid.UUID) -> Telemetry | None:
    return await session.get(Telemetry, telemetry_id)


async def lock(session: AsyncSession, telemetry_id: uuid.UUID) -> Telemetry | None:
    """The telemetry as it is now, no other writer changing it (nor a function version or task
    naming it, `by_ids(held=True)`) until the transaction ends."""
    stmt = for_update(select(Telemetry).where(Telemetry.id == telemetry_id))
    return (await session.execute(stmt)).scalar_one_or_none()


async def by_ids(
    session: AsyncSession, account_id: str, ids: Collection[uuid.UUID], *, held: bool = False
) -> Sequence[Telemetry]:
    """The account's telemetries among `ids` (another account's are not found); `held`: as
    they are now, none deleted until the transaction ends (locked in id order)."""
    stmt = select(Telemetry).where(Telemetry.account_id == account_id, Telemetry.id.in_(ids))
    if held:
        stmt = for_update(stmt.order_by(Telemetry.id), share=True)
    return (await session.execute(stmt)).scalars().all()


async def find(session: AsyncSession, account_id: str, name: str) -> Telemetry | None:
    stmt = select(Telemetry).where(Telemetry.account_id == account_id, Telemetry.name == name)
    return (await session.execute(stmt)).scalar_one_or_none()


async def count(session: AsyncSession, account_id: str) -> int:
    stmt = select(func.count()).select_from(Telemetry).where(Telemetry.account_id == account_id)
    return int((await session.execute(stmt)).scalar_one())


async def of_account(session: AsyncSession, account_id: str) -> Sequence[Telemetry]:
    """The account's telemetries, oldest first (at most the quota: NVCF lists them whole)."""
    stmt = (
        select(Telemetry)
        .where(Telemetry.account_id == account_id)
        .order_by(Telemetry.created_at, Telemetry.id)
    )
    return (await session.execute(stmt)).scalars().all()


async def delete(session: AsyncSession, telemetry: Telemetry) -> None:
    await session.delete(telemetry)
