"""The account use cases: create, change limits, suspend, resume, delete."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.auth import repository as auth_repository
from service.auth.limits import limits_of
from service.auth.models import Account
from service.auth.suspensions import Suspensions
from service.core.db import utcnow
from service.core.errors import Conflict, FieldError, NotFound, ValidationFailed
from service.core.schemas import iso_z
from service.core.settings import Settings
from service.deployments.service import hold_deployments
from service.functions.service import count_functions
from service.registry.service import count_credentials


async def all_accounts(session: AsyncSession) -> Sequence[Account]:
    return await auth_repository.all_accounts(session)


async def get(session: AsyncSession, account_id: str) -> Account:
    row = await auth_repository.account_by_id(session, account_id)
    if row is None:
        raise NotFound(detail=f"account '{account_id}' not found")
    return row


async def create(
    session: AsyncSession,
    suspensions: Suspensions,
    account_id: str,
    *,
    name: str | None,
    admin_client_id: str | None,
    limits: dict[str, Any],
) -> Account:
    if await auth_repository.account_by_id(session, account_id) is not None:
        raise Conflict(detail=f"account '{account_id}' already exists")
    row = await auth_repository.add_account(
        session,
        account_id,
        name=name or None,
        admin_client_ids=[admin_client_id] if admin_client_id else None,
        limits=limits or None,
    )
    suspensions.note_limits(account_id, limits)
    return row


async def update(
    session: AsyncSession,
    suspensions: Suspensions,
    account_id: str,
    *,
    name: str | None,
    limits: dict[str, Any],
) -> Account:
    """Change the limits named (and the name); every other stays as it was."""
    row = await get(session, account_id)
    if name:
        row.name = name
    if limits:
        row.limits = {**(row.limits or {}), **limits}
    await session.flush()
    suspensions.note_limits(account_id, row.limits)
    return row


async def suspend(
    session: AsyncSession, suspensions: Suspensions, account_id: str, caller: str, reason: str
) -> Account:
    if account_id == caller:
        raise ValidationFailed.of(
            [
                FieldError(
                    "ncaId",
                    f"'{account_id}' is the caller's own account: suspending it would refuse "
                    "the very credential that resumes it",
                )
            ]
        )
    row = await get(session, account_id)
    row.suspended_reason = reason
    row.suspended_at = utcnow()
    await hold_deployments(session, account_id, True, f"account suspended: {reason}")
    await session.flush()
    suspensions.note(account_id, reason)
    return row


async def resume(session: AsyncSession, suspensions: Suspensions, account_id: str) -> Account:
    row = await get(session, account_id)
    row.suspended_reason = None
    row.suspended_at = None
    await hold_deployments(session, account_id, False, "account resumed")
    await session.flush()
    suspensions.note(account_id, None)
    return row


async def delete(session: AsyncSession, suspensions: Suspensions, account_id: str) -> None:
    """Delete an account owning nothing live (its keys go with it); else 409: suspend it."""
    row = await get(session, account_id)
    owned = {
        "functions": await count_functions(session, account_id),
        "registry credentials": await count_credentials(session, account_id),
    }
    live = [f"{n} {what}" for what, n in owned.items() if n]
    if live:
        raise Conflict(
            detail=f"account '{account_id}' owns {' and '.join(live)}: delete them first, "
            "or suspend the account instead"
        )
    await auth_repository.delete_account(session, row)
    await session.flush()
    suspensions.note_limits(account_id, None)


def dto(row: Account, settings: Settings) -> dict[str, Any]:
    """NVCF's AccountDto, with the platform's limits and the suspension."""
    out: dict[str, Any] = {
        "ncaId": row.id,
        "adminClientIds": [str(c) for c in row.admin_client_ids or []],
        "name": row.name or row.id,
        **limits_of(row, settings),
        "suspended": row.suspended_reason is not None,
    }
    if row.suspended_reason is not None:
        out["suspendedReason"] = row.suspended_reason
    if row.suspended_at is not None:
        out["suspendedAt"] = iso_z(row.suspended_at)
    return out
