"""Invocation and token counts (metering/counts.py): kept in memory, added to the database in
batches; two replicas and a restart add up exactly, and a batch whose commit's outcome was
lost, written again, adds nothing twice."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session

from service.core.db import make_engine, make_sessionmaker
from service.metering.counts import MAX_REQUEST_TOKENS, Meter
from service.metering.usage import Grouping, account_usage

NOW = datetime(2026, 12, 7, 9, 30, tzinfo=UTC)
FN, VER = "00000000-0000-0000-0000-00000000000f", "00000000-0000-0000-0000-00000000000e"


@pytest.fixture
async def maker(database_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine = make_engine(database_url)
    try:
        yield make_sessionmaker(engine)
    finally:
        await engine.dispose()


async def totals(maker: async_sessionmaker[AsyncSession], account: str) -> list[Any]:
    async with maker() as session:
        groups = await account_usage(
            session,
            account,
            by=Grouping.MODEL,
            since=NOW - timedelta(hours=1),
            until=NOW + timedelta(hours=1),
            now=NOW,
        )
    return [(g.names["model"], g.invocations, g.input_tokens, g.output_tokens) for g in groups]


def calls(meter: Meter, n: int, model: str = "m") -> None:
    for _ in range(n):
        meter.invocation("acct", FN, VER, model)
        meter.tokens("acct", FN, VER, model, 3, 5)


async def test_two_replicas_and_a_restart_add_up_exactly(
    maker: async_sessionmaker[AsyncSession],
) -> None:
    a, b = Meter(maker, 5, clock=lambda: NOW), Meter(maker, 5, clock=lambda: NOW)
    calls(a, 10)
    calls(b, 7)
    await a.flush()
    await b.flush()
    calls(a, 1)
    await a.stop()  # a restart: the counts left are added at shutdown
    restarted = Meter(maker, 5, clock=lambda: NOW)
    calls(restarted, 2)
    await restarted.flush()
    await b.flush()  # nothing new: adds nothing
    assert await totals(maker, "acct") == [("m", 20, 60, 100)]


async def test_a_batch_written_again_after_a_lost_commit_outcome_adds_nothing_twice(
    maker: async_sessionmaker[AsyncSession],
) -> None:
    meter = Meter(maker, 5, clock=lambda: NOW)
    calls(meter, 4)
    lost = {"once": True}

    def outcome_lost(session: Session) -> None:
        if lost.pop("once", False):
            raise ConnectionError("the commit's answer never came")

    event.listen(Session, "after_commit", outcome_lost)
    try:
        with pytest.raises(ConnectionError):
            await meter.flush()  # committed, but the meter cannot know it
    finally:
        event.remove(Session, "after_commit", outcome_lost)
    calls(meter, 1)
    await meter.flush()  # the unsent batch first, under its own number; then the new one
    assert await totals(maker, "acct") == [("m", 5, 15, 25)]


async def test_a_workers_usage_is_bounded_per_request(
    maker: async_sessionmaker[AsyncSession],
) -> None:
    meter = Meter(maker, 5, clock=lambda: NOW)
    meter.invocation("acct", FN, VER, "m" * 1000)
    meter.tokens("acct", FN, VER, "m" * 1000, 10**30, -0)
    await meter.flush()
    assert await totals(maker, "acct") == [("m" * 256, 1, MAX_REQUEST_TOKENS, 0)]
