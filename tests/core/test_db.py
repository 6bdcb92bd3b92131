"""SQLite's write transactions take turns in arrival order (core/db.py `WriteGate`), and a read
marked `for_update` waits for its turn, so what it read is what the writer changes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import column, select, table, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.core.db import WriteGate, for_update, make_engine, make_sessionmaker
from tests.support.e2e import eventually


@pytest.fixture
async def gated(
    tmp_path: Path,
) -> AsyncIterator[tuple[WriteGate, async_sessionmaker[AsyncSession]]]:
    gate = WriteGate(timeout=5)
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'gate.db'}", write_gate=gate)
    async with engine.begin() as conn:
        await conn.execute(text("CREATE TABLE log (n INTEGER NOT NULL)"))
    try:
        yield gate, make_sessionmaker(engine)
    finally:
        await engine.dispose()


async def _write(maker: async_sessionmaker[AsyncSession], n: int) -> None:
    async with maker() as session:
        await session.execute(text("INSERT INTO log (n) VALUES (:n)"), {"n": n})
        await session.commit()


async def _queued(gate: WriteGate, count: int) -> None:
    async def check() -> bool:
        return gate.waiting >= count

    await eventually(check, seconds=10)


async def _written(maker: async_sessionmaker[AsyncSession]) -> list[int]:
    async with maker() as session:
        return list((await session.execute(text("SELECT n FROM log ORDER BY rowid"))).scalars())


async def test_writers_commit_in_the_order_they_asked(
    gated: tuple[WriteGate, async_sessionmaker[AsyncSession]],
) -> None:
    gate, maker = gated
    holder = maker()
    await holder.execute(text("INSERT INTO log (n) VALUES (0)"))  # holds the turn
    writers = []
    for n in range(1, 6):
        writers.append(asyncio.create_task(_write(maker, n)))
        await _queued(gate, n)
    # reads never wait for the writer
    assert await _written(maker) == []
    await holder.commit()
    await holder.close()
    await asyncio.gather(*writers)
    assert await _written(maker) == [0, 1, 2, 3, 4, 5]
    assert gate.waiting == 0


async def test_a_read_for_update_waits_for_the_writer_and_reads_what_it_committed(
    gated: tuple[WriteGate, async_sessionmaker[AsyncSession]],
) -> None:
    gate, maker = gated
    await _write(maker, 1)
    log = table("log", column("n"))
    holder = maker()
    await holder.execute(text("UPDATE log SET n = 2"))

    async def read_then_write() -> int:
        async with maker() as session:
            seen = int((await session.execute(for_update(select(log.c.n)))).scalar_one())
            await session.execute(text("UPDATE log SET n = :n"), {"n": seen + 10})
            await session.commit()
            return seen

    reader = asyncio.create_task(read_then_write())
    await _queued(gate, 1)
    # a plain read does not wait, and still sees what was committed before the writer
    assert await _written(maker) == [1]
    await holder.commit()
    await holder.close()
    assert await reader == 2
    assert await _written(maker) == [12]
    assert gate.waiting == 0


async def test_a_writer_cancelled_while_waiting_passes_its_turn_on(
    gated: tuple[WriteGate, async_sessionmaker[AsyncSession]],
) -> None:
    gate, maker = gated
    holder = maker()
    await holder.execute(text("INSERT INTO log (n) VALUES (0)"))
    leaving = asyncio.create_task(_write(maker, 1))
    await _queued(gate, 1)
    staying = asyncio.create_task(_write(maker, 2))
    await _queued(gate, 2)
    leaving.cancel()
    await holder.rollback()
    await holder.close()
    await staying
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert await _written(maker) == [2]
    await _write(maker, 3)  # the gate is free again
    assert await _written(maker) == [2, 3]


async def test_a_writer_waiting_too_long_fails_as_sqlite_would(tmp_path: Path) -> None:
    engine = make_engine(
        f"sqlite+aiosqlite:///{tmp_path / 'gate.db'}", write_gate=WriteGate(timeout=0.05)
    )
    maker = make_sessionmaker(engine)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("CREATE TABLE log (n INTEGER NOT NULL)"))
        async with maker() as holder:
            await holder.execute(text("INSERT INTO log (n) VALUES (0)"))
            with pytest.raises(OperationalError, match="database is locked"):
                await _write(maker, 1)
            await holder.commit()
        await _write(maker, 2)
        assert await _written(maker) == [0, 2]
    finally:
        await engine.dispose()
