"""Which accounts the operator suspended, and why, and the limits it set accounts (the rates
every request reads, limits.py): every process reads the accounts table at most every
`REFRESH_SECONDS` (so a suspension or a new limit reaches every replica within that), and the
process that suspends, resumes or changes a limit knows at once. Only accounts suspended or
with limits of their own are kept."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.auth import repository
from service.core.errors import Forbidden

REFRESH_SECONDS = 2.0


class AccountSuspended(Forbidden):
    type_slug = "account-suspended"
    title = "Account Suspended"

    @classmethod
    def of(cls, account_id: str, reason: str) -> AccountSuspended:
        return cls(detail=f"account '{account_id}' is suspended: {reason}")


class Suspensions:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions
        self._reasons: dict[str, str] = {}
        self._limits: dict[str, dict[str, Any]] = {}
        self._fresh_until = 0.0
        self._lock = asyncio.Lock()

    async def check(self, account_id: str, *, read: bool = True) -> None:
        """Refuse (403 with the reason) a suspended account. Without `read` (a fast path that
        must not wait) only what this process already knows."""
        if read and time.monotonic() >= self._fresh_until:
            async with self._lock:
                if time.monotonic() >= self._fresh_until:
                    await self._refresh()
        reason = self._reasons.get(account_id)
        if reason is not None:
            raise AccountSuspended.of(account_id, reason)

    def own_limits(self, account_id: str) -> Mapping[str, Any]:
        """The limits the operator set the account, as this process last read them (the
        caller's `check` just refreshed them)."""
        return self._limits.get(account_id, {})

    def note_limits(self, account_id: str, limits: Mapping[str, Any] | None) -> None:
        """This process changed (or deleted: None) an account's limits."""
        if limits:
            self._limits[account_id] = dict(limits)
        else:
            self._limits.pop(account_id, None)

    def note(self, account_id: str, reason: str | None) -> None:
        """This process suspended (`reason`) or resumed (None) an account."""
        if reason is None:
            self._reasons.pop(account_id, None)
        else:
            self._reasons[account_id] = reason

    async def _refresh(self) -> None:
        async with self._sessions() as session:
            self._reasons = await repository.suspended_accounts(session)
            self._limits = await repository.accounts_limits(session)
        self._fresh_until = time.monotonic() + REFRESH_SECONDS
