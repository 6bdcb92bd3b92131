"""Which accounts the operator suspended, and why: every process reads the accounts table at
most every `REFRESH_SECONDS` (so a suspension reaches every replica within that), and the
process that suspends or resumes knows at once."""

from __future__ import annotations

import asyncio
import time

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

    def note(self, account_id: str, reason: str | None) -> None:
        """This process suspended (`reason`) or resumed (None) an account."""
        if reason is None:
            self._reasons.pop(account_id, None)
        else:
            self._reasons[account_id] = reason

    async def _refresh(self) -> None:
        async with self._sessions() as session:
            self._reasons = await repository.suspended_accounts(session)
        self._fresh_until = time.monotonic() + REFRESH_SECONDS
