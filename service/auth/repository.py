"""Every SQL statement of accounts and API keys (service.py holds the use cases; the request's
transaction commits)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.models import Account, ApiKey


async def account_by_id(session: AsyncSession, account_id: str) -> Account | None:
    return await session.get(Account, account_id)


async def all_accounts(session: AsyncSession) -> Sequence[Account]:
    """Every configured account, by id."""
    return (await session.execute(select(Account).order_by(Account.id))).scalars().all()


async def add_account(
    session: AsyncSession,
    account_id: str,
    *,
    name: str | None,
    admin_client_ids: list[str] | None,
    limits: dict[str, int] | None,
) -> Account:
    row = Account(id=account_id, name=name, admin_client_ids=admin_client_ids, limits=limits)
    session.add(row)
    await session.flush()
    return row


async def delete_account(session: AsyncSession, row: Account) -> None:
    await session.delete(row)


async def suspended_accounts(session: AsyncSession) -> dict[str, str]:
    """The reason of each suspended account, by id."""
    stmt = select(Account.id, Account.suspended_reason).where(Account.suspended_reason.is_not(None))
    return {str(i): str(r) for i, r in (await session.execute(stmt)).all()}


async def accounts_limits(session: AsyncSession) -> dict[str, dict[str, Any]]:
    """The limits of each account that has limits of its own, by id."""
    stmt = select(Account.id, Account.limits).where(Account.limits.is_not(None))
    return {str(i): dict(v) for i, v in (await session.execute(stmt)).all() if v}


async def ensure_account(session: AsyncSession, account_id: str) -> None:
    if await session.get(Account, account_id) is None:
        session.add(Account(id=account_id))
        await session.flush()


async def lock_account(session: AsyncSession, account_id: str) -> None:
    """Serialise the quota checks of one account until the transaction ends, in one
    statement: an upsert of its row (created if missing) takes the row lock on PostgreSQL and
    the write lock on SQLite."""
    dialect = session.get_bind().dialect.name
    insert = pg_insert if dialect == "postgresql" else sqlite_insert
    await session.execute(
        insert(Account)
        .values(id=account_id)
        .on_conflict_do_update(index_elements=[Account.id], set_={"id": account_id})
    )


async def count_keys(session: AsyncSession, account_id: str) -> int:
    stmt = select(func.count()).select_from(ApiKey).where(ApiKey.account_id == account_id)
    return int((await session.execute(stmt)).scalar_one())


async def any_key(session: AsyncSession) -> bool:
    return (await session.execute(select(ApiKey.id).limit(1))).first() is not None


async def key_by_hash(session: AsyncSession, key_hash: str) -> ApiKey | None:
    return (
        await session.execute(select(ApiKey).where(ApiKey.key_hash == key_hash))
    ).scalar_one_or_none()


async def key_by_id(session: AsyncSession, key_id: uuid.UUID) -> ApiKey | None:
    return await session.get(ApiKey, key_id)


async def keys_of(session: AsyncSession, account_id: str) -> Sequence[ApiKey]:
    """The account's keys, oldest first."""
    stmt = (
        select(ApiKey).where(ApiKey.account_id == account_id).order_by(ApiKey.created_at, ApiKey.id)
    )
    return (await session.execute(stmt)).scalars().all()


async def delete_key(session: AsyncSession, row: ApiKey) -> None:
    await session.delete(row)
