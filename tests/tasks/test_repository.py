"""A task read for update (`get_for_update`) is the task as it is now, and no other writer
changes it before the transaction ends: an owner's delete racing the loop that ends the task
answers, leaves the task's end as the loop wrote it and counts its GPU time once. A task
created while a telemetry it names is deleted waits for the delete and is refused."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import func, select

from service.core.db import make_sessionmaker
from service.core.errors import ValidationFailed
from service.metering.models import GpuInterval
from service.observability import service as telemetry_service
from service.tasks import repository, transitions
from service.tasks.models import TaskStatus
from tests.support.races import Writers, writers
from tests.support.tasks import ACCOUNT, TaskHarness, script
from tests.support.telemetries import OTLP

RUNS_ON = script(steps=[{"after": 1, "percent": 10}], exitAfter=None)


class Race:
    def __init__(self, writers: Writers, h: TaskHarness) -> None:
        self.writers, self.h = writers, h

    async def running_task(self) -> uuid.UUID:
        tid = await self.h.create(containerEnvironment=RUNS_ON)
        await self.h.run(3)
        assert (await self.h.task(tid)).status == TaskStatus.RUNNING
        return tid

    async def end_by_the_loop(self, tid: uuid.UUID) -> None:
        async with self.h.maker() as session, session.begin():
            task = await repository.get_for_update(session, tid)
            assert task is not None
            transitions.move(
                session, task, TaskStatus.ERRORED, self.h.clock.now, "Task errored", error="x"
            )

    async def after_the_race(self, tid: uuid.UUID) -> None:
        """The task ended as the loop wrote it, deleted, with one GPU interval."""
        task = await self.h.task(tid)
        assert task.status == TaskStatus.ERRORED and task.deleted
        events = await self.h.events(tid)
        assert "Task errored" in events
        assert not any("deleted by its owner" in e for e in events)
        async with self.h.maker() as session:
            count = await session.scalar(
                select(func.count()).select_from(GpuInterval).where(GpuInterval.task_id == tid)
            )
        assert count == 1


@pytest.fixture
async def race(database_url: str) -> AsyncIterator[Race]:
    async with writers(database_url) as found:
        yield Race(found, TaskHarness.build(make_sessionmaker(found.engine)))


async def test_a_delete_that_read_the_task_before_the_loop_ended_it_sees_its_end(
    race: Race,
) -> None:
    h = race.h
    tid = await race.running_task()
    async with h.maker() as session, session.begin():
        # the request holds the task as it read it (RUNNING) when the loop's transaction commits
        read = await h.tasks.owned(session, ACCOUNT, tid)
        assert read.status == TaskStatus.RUNNING
        await race.end_by_the_loop(tid)
        await h.tasks.delete(session, ACCOUNT, tid)
        assert read.status == TaskStatus.ERRORED
    await race.after_the_race(tid)


async def test_a_delete_arriving_while_the_loop_holds_the_task_waits_for_its_end(
    race: Race,
) -> None:
    h = race.h
    tid = await race.running_task()
    async with h.maker() as loop_session, loop_session.begin():
        task = await repository.get_for_update(loop_session, tid)
        assert task is not None

        async def delete() -> None:
            async with h.maker() as session, session.begin():
                await h.tasks.delete(session, ACCOUNT, tid)

        deleting = asyncio.create_task(delete())
        await race.writers.until_waiting()
        transitions.move(
            loop_session, task, TaskStatus.ERRORED, h.clock.now, "Task errored", error="x"
        )
    await deleting
    await race.after_the_race(tid)


async def test_a_task_created_while_the_telemetry_it_names_is_deleted_is_refused(
    race: Race,
) -> None:
    h = race.h
    async with h.maker() as session, session.begin():
        spec = await telemetry_service.validate_create(OTLP, ())
        telemetry = await telemetry_service.create(
            session, account_id=ACCOUNT, spec=spec, box=h.box
        )
    async with h.maker() as deleting:
        await telemetry_service.delete(deleting, ACCOUNT, telemetry.id, repository.telemetry_users)
        creating = asyncio.create_task(h.create(telemetries={"logsTelemetryId": str(telemetry.id)}))
        await race.writers.until_waiting()
        await deleting.commit()
    with pytest.raises(ValidationFailed) as refused:
        await creating
    assert [e.field for e in refused.value.errors or []] == ["telemetries.logsTelemetryId"]
    async with h.maker() as session:
        assert await repository.telemetry_users(session, ACCOUNT, telemetry.id) == []
