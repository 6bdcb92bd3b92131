"""A request that met another transaction (a deadlock, a lock wait that timed out, SQLite's busy
database) is answered 503 with Retry-After and changes nothing; any other database error is
still the server's own (500)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from service.core.db import is_contention, make_engine
from service.core.problem import PROBLEM, install_problem_handlers


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    if database_url.startswith("sqlite"):
        # no write gate and no busy wait: the holder's lock is met at once
        made = create_async_engine(database_url, connect_args={"timeout": 0})
    else:
        made = make_engine(database_url)
    async with made.begin() as conn:
        await conn.execute(text("CREATE TABLE counters (id INTEGER PRIMARY KEY, n INTEGER)"))
        await conn.execute(text("INSERT INTO counters (id, n) VALUES (1, 0), (2, 0)"))
    try:
        yield made
    finally:
        await made.dispose()


async def _lock(conn: AsyncConnection, row: int) -> None:
    """Take `row`'s write lock inside `conn`'s open transaction (SQLite: the database's)."""
    if conn.dialect.name == "postgresql":
        await conn.execute(text("SET LOCAL lock_timeout = '200ms'"))
    await conn.execute(text("UPDATE counters SET n = n + 1 WHERE id = :id"), {"id": row})


def _app(engine: AsyncEngine) -> FastAPI:
    app = FastAPI()
    install_problem_handlers(app)

    @app.post("/bump")
    async def bump() -> dict[str, int]:
        async with engine.begin() as conn:
            await conn.execute(text("INSERT INTO counters (id, n) VALUES (3, 0)"))
            await _lock(conn, 1)
        return {"bumped": 1}

    @app.post("/broken")
    async def broken() -> dict[str, int]:
        async with engine.begin() as conn:
            await conn.execute(text("SELECT n FROM no_such_table"))
        return {}

    return app


async def _counters(engine: AsyncEngine) -> list[tuple[int, int]]:
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT id, n FROM counters ORDER BY id"))
        return [(r[0], r[1]) for r in rows]


async def test_a_request_that_meets_another_transaction_is_a_503_and_changes_nothing(
    engine: AsyncEngine,
) -> None:
    transport = httpx.ASGITransport(app=_app(engine))
    async with (
        httpx.AsyncClient(transport=transport, base_url="http://t") as client,
        engine.connect() as holder,
    ):
        await holder.begin()
        await _lock(holder, 1)
        resp = await client.post("/bump")
        await holder.rollback()
        assert resp.status_code == 503, resp.text
        assert resp.headers["content-type"] == PROBLEM
        assert resp.headers["retry-after"] == "1"
        assert "send it again" in resp.json()["detail"]
        assert await _counters(engine) == [(1, 0), (2, 0)]  # the insert was rolled back too

        resp = await client.post("/bump")  # sent again once the other transaction ended
        assert resp.status_code == 200, resp.text
        assert await _counters(engine) == [(1, 1), (2, 0), (3, 0)]


async def test_any_other_database_error_is_still_the_servers(engine: AsyncEngine) -> None:
    transport = httpx.ASGITransport(app=_app(engine), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        resp = await client.post("/broken")
    assert resp.status_code == 500


# SQLite has one writer at a time: its transactions cannot deadlock
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_a_deadlock_is_contention(engine: AsyncEngine) -> None:
    both_hold = asyncio.Barrier(2)

    async def cross(first: int, second: int) -> None:
        async with engine.begin() as conn:
            await conn.execute(text("SET LOCAL deadlock_timeout = '50ms'"))
            await conn.execute(text("UPDATE counters SET n = 1 WHERE id = :id"), {"id": first})
            await both_hold.wait()
            await conn.execute(text("UPDATE counters SET n = 1 WHERE id = :id"), {"id": second})

    outcomes = await asyncio.gather(cross(1, 2), cross(2, 1), return_exceptions=True)
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(errors) == 1, outcomes  # PostgreSQL ends one of the two, the other commits
    assert isinstance(errors[0], DBAPIError) and is_contention(errors[0]), errors[0]
