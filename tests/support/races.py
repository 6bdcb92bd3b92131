"""Two writers of the same rows, one held at the point that matters: an engine whose waiting
writers a test can see (the process's write gate on SQLite, lock waits on PostgreSQL), so it
waits on that state rather than on a sleep."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.core.db import WriteGate, make_engine
from tests.support.e2e import eventually


class Writers:
    """The engine of a test's database and what its writers wait for."""

    def __init__(self, engine: AsyncEngine, gate: WriteGate | None) -> None:
        self.engine, self.gate = engine, gate

    async def waiting(self) -> int:
        """Writers waiting for a lock: the gate's on SQLite, the database's on PostgreSQL."""
        if self.gate is not None:
            return self.gate.waiting
        async with self.engine.connect() as conn:
            found = await conn.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            )
        return int(found or 0)

    async def until_waiting(self, count: int = 1) -> None:
        """Return once `count` writers wait for a lock another transaction holds."""

        async def blocked() -> bool:
            return await self.waiting() >= count

        await self.until(blocked)

    async def until(self, check: Callable[[], Awaitable[bool]]) -> None:
        """Return once `check()` holds (e.g. a writer waits, or finished without waiting)."""
        await eventually(check, seconds=10)


@asynccontextmanager
async def writers(database_url: str) -> AsyncIterator[Writers]:
    """An engine of `database_url` (on SQLite with a gate of its own, to watch), disposed of
    at the end."""
    gate = WriteGate() if database_url.startswith("sqlite") else None
    engine = make_engine(database_url, write_gate=gate)
    try:
        yield Writers(engine, gate)
    finally:
        await engine.dispose()
