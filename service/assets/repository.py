"""Database queries of assets (one statement each; the request's transaction commits)."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from datetime import datetime

from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from service.assets.models import Asset


async def count_live(session: AsyncSession, account_id: str, now: datetime) -> int:
    """The account's assets not yet expired (the `assets` quota)."""
    stmt = (
        select(func.count())
        .select_from(Asset)
        .where(Asset.account_id == account_id, Asset.expires_at > now)
    )
    return int((await session.execute(stmt)).scalar_one())


async def bytes_used(
    session: AsyncSession, account_id: str, now: datetime, *, besides: uuid.UUID | None = None
) -> int:
    """Bytes of the account's uploaded, unexpired assets (the `asset_bytes` quota), but for
    the asset `besides`."""
    stmt = select(func.coalesce(func.sum(Asset.size_bytes), 0)).where(
        Asset.account_id == account_id, Asset.expires_at > now, Asset.size_bytes.is_not(None)
    )
    if besides is not None:
        stmt = stmt.where(Asset.id != besides)
    return int((await session.execute(stmt)).scalar_one() or 0)


async def pending(
    session: AsyncSession,
    now: datetime,
    limit: int,
    *,
    account_id: str | None = None,
    created_before: datetime | None = None,
) -> Sequence[Asset]:
    """Unexpired assets whose upload is not yet confirmed: the account's, or every account's
    created before `created_before`; oldest first."""
    stmt = select(Asset).where(Asset.size_bytes.is_(None), Asset.expires_at > now)
    if account_id is not None:
        stmt = stmt.where(Asset.account_id == account_id)
    if created_before is not None:
        stmt = stmt.where(Asset.created_at < created_before)
    stmt = stmt.order_by(Asset.created_at, Asset.id).limit(limit)
    return (await session.execute(stmt)).scalars().all()


async def get(session: AsyncSession, asset_id: uuid.UUID) -> Asset | None:
    return await session.get(Asset, asset_id)


async def list_live(session: AsyncSession, account_id: str, now: datetime) -> Sequence[Asset]:
    """The account's unexpired assets, oldest first (at most its quota of them)."""
    stmt = (
        select(Asset)
        .where(Asset.account_id == account_id, Asset.expires_at > now)
        .order_by(Asset.created_at, Asset.id)
    )
    return (await session.execute(stmt)).scalars().all()


async def many(session: AsyncSession, ids: Collection[uuid.UUID]) -> dict[uuid.UUID, Asset]:
    if not ids:
        return {}
    rows = (await session.execute(select(Asset).where(Asset.id.in_(list(ids))))).scalars()
    return {row.id: row for row in rows}


async def expired(session: AsyncSession, now: datetime, limit: int) -> Sequence[uuid.UUID]:
    stmt = select(Asset.id).where(Asset.expires_at <= now).order_by(Asset.expires_at).limit(limit)
    return (await session.execute(stmt)).scalars().all()


async def delete_ids(session: AsyncSession, ids: Collection[uuid.UUID]) -> None:
    if ids:
        await session.execute(delete(Asset).where(Asset.id.in_(list(ids))))


async def remove(session: AsyncSession, asset: Asset) -> None:
    """Mark one loaded asset for removal (the flush or commit deletes its row)."""
    await session.delete(asset)
