"""A task's GPU time (tasks/usage.py, metering/intervals.py): while it runs, its row is the
open span counted up to now; when it ends, its interval is stored once and the open span is
gone, so a restart of the loop in between counts nothing twice."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from service.metering.models import GpuInterval
from service.metering.usage import Grouping, account_usage
from service.tasks.models import TaskStatus
from service.tasks.usage import open_spans
from tests.support.tasks import ACCOUNT, TaskHarness, script


async def gpu_seconds(h: TaskHarness, since_hours: float = 1) -> float:
    async with h.maker() as session:
        groups = await account_usage(
            session,
            ACCOUNT,
            by=Grouping.FUNCTION,
            since=h.clock.now - timedelta(hours=since_hours),
            until=h.clock.now,
            now=h.clock.now,
            open_spans=await open_spans(session, ACCOUNT),
        )
    return sum(g.gpu_seconds for g in groups)


async def test_a_task_is_metered_from_running_to_its_end_once(h: TaskHarness) -> None:
    tid = await h.create(
        containerEnvironment=script(steps=[{"after": 30, "percent": 100}], exitAfter=1)
    )
    await h.run(2)
    task = await h.task(tid)
    assert task.status == TaskStatus.RUNNING and task.running_at is not None
    await h.run(10)
    running = (h.clock.now - task.running_at).total_seconds()
    assert await gpu_seconds(h) == pytest.approx(running, rel=0.01)

    h.restart()  # a new server process: the open span is read from the task again
    await h.run(60)
    task = await h.task(tid)
    assert task.status == TaskStatus.COMPLETED and task.finished_at is not None
    async with h.maker() as session:
        [row] = (await session.execute(select(GpuInterval))).scalars().all()
        assert await open_spans(session, ACCOUNT) == []
    assert (row.started_at, row.ended_at, row.gpus) == (task.running_at, task.finished_at, 1)
    assert task.running_at is not None
    lived = (task.finished_at - task.running_at).total_seconds()
    assert await gpu_seconds(h) == pytest.approx(lived, rel=0.01)
    h.clock.advance(600)
    assert await gpu_seconds(h) == pytest.approx(lived, rel=0.01)
