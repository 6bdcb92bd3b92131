"""Invocation and token counts (metering/counts.py): kept in memory, added to the database in
batches; two replicas and a restart add up exactly (as meters, and as apps serving LLM
calls), and a batch whose commit's outcome was lost, written again, adds nothing twice."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session

from service.core.db import make_engine, make_sessionmaker
from service.metering.counts import MAX_REQUEST_TOKENS, Meter
from service.metering.usage import Grouping, account_usage
from tests.support.app import AppClient, ClientFactory, SettingsFactory
from tests.support.invocation import FAST, deployed, invocation_app, write_catalog
from tests.support.openai_worker import OpenAIWorker

LLM_FN: dict[str, Any] = {
    "name": "tiny-llm",
    "inferenceUrl": "/",
    "functionType": "LLM",
    "models": [{"name": "tiny/chat", "llmConfig": {"uris": ["/v1/chat/completions"]}}],
}
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


async def test_two_app_replicas_and_a_restart_meter_every_call_once(
    client_factory: ClientFactory, make_settings: SettingsFactory, tmp_path: Path
) -> None:
    worker = OpenAIWorker().start()  # one model server both replicas' instances reach
    try:
        await _replicas(client_factory, make_settings, tmp_path, worker.url)
    finally:
        worker.stop()


async def _replicas(
    client_factory: ClientFactory, make_settings: SettingsFactory, tmp_path: Path, upstream: str
) -> None:
    first = await invocation_app(client_factory, tmp_path, upstream=upstream)
    fn = await deployed(first, **LLM_FN)

    async def replica(name: str) -> AppClient:
        return await client_factory(
            make_settings(
                data_dir=tmp_path / name,
                clusters_file=write_catalog(tmp_path, upstream=upstream),
                reconciler_enabled=False,
                **FAST,
            )
        )

    second = await replica("replica-2")
    given = taken = 0

    async def call(app: AppClient, n: int) -> None:
        nonlocal given, taken
        for i in range(n):
            resp = await app.post(
                "/v2/nvcf/llm/v1/chat/completions",
                json={
                    "model": f"{fn['id']}/tiny/chat",
                    "messages": [{"role": "user", "content": "w " * (1 + i % 4)}],
                },
            )
            assert resp.status_code == 200, resp.text
            given += resp.json()["usage"]["prompt_tokens"]
            taken += resp.json()["usage"]["completion_tokens"]

    await call(first, 60)
    await call(second, 40)
    await meter_of(first).stop()  # the first replica shuts down: its counts are added
    restarted = await replica("replica-1-restarted")
    await call(restarted, 50)
    await call(second, 10)
    for app in (second, restarted):
        await meter_of(app).flush()
    await meter_of(second).flush()  # again, nothing new
    rows = (await second.get("/v2/nvcf/usage", params={"by": "model"})).json()["usage"]
    [row] = [r for r in rows if r["model"] == "tiny/chat"]
    assert (row["invocations"], row["inputTokens"], row["outputTokens"]) == (160, given, taken)


def meter_of(app: AppClient) -> Meter:
    found = app.app.state.invocation.engine.metrics.meter
    assert isinstance(found, Meter)
    return found
