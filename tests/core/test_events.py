"""The domain-event bus (service/core/events.py): handlers run in subscription order, those
`within` the publisher's transaction at once with its session, those `after_commit` only once
the request's transaction has committed; an event nobody subscribed to does nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.core.db import make_engine, make_sessionmaker, run_after_commit
from service.core.events import Events


@dataclass(frozen=True)
class Happened:
    what: str


@dataclass(frozen=True)
class Unheard:
    what: str


async def test_within_then_after_commit(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'e.db'}")
    seen: list[str] = []
    events = Events()

    async def first(session: AsyncSession, event: Happened) -> None:
        await session.execute(text("SELECT 1"))  # the publisher's session, usable
        seen.append(f"within 1 {event.what}")

    async def second(session: AsyncSession, event: Happened) -> None:
        seen.append(f"within 2 {event.what}")

    events.within(Happened, first)
    events.within(Happened, second)
    events.after_commit(Happened, lambda e: seen.append(f"after {e.what}"))
    try:
        async with make_sessionmaker(engine)() as session:
            await events.publish(session, Happened("x"))
            await events.publish(session, Unheard("y"))
            assert seen == ["within 1 x", "within 2 x"]
            await session.commit()
            run_after_commit(session)  # what the request's session dependency does
        assert seen == ["within 1 x", "within 2 x", "after x"]
    finally:
        await engine.dispose()


async def test_nothing_subscribed_leaves_the_session_untouched(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'e.db'}")
    try:
        async with make_sessionmaker(engine)() as session:
            await Events().publish(session, Happened("x"))
            # no after-commit callback: the request's transaction has nothing to commit
            assert not session.info
    finally:
        await engine.dispose()
