"""The task loop's queue, read in SQL in its fair order (accounts take turns, oldest waiting
first; FIFO within one) on SQLite and PostgreSQL: the same order as queue.py's `fair_order`,
an account held back reads none of its later tasks, and a pass reads as many rows from a queue
of 20,000 tasks as from one of 100."""

from __future__ import annotations

import functools
import inspect
import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import insert, select

from service.tasks import repository
from service.tasks.models import Task, TaskStatus
from service.tasks.queue import Waiting, fair_order
from tests.support.tasks import TaskHarness, script

HANG = script(steps=[{"after": 1, "percent": 5}], exitAfter=None)
TWO_GPUS = {"gpu": "H100", "instanceType": "NCP.GPU.H100_2x"}


async def queue(h: TaskHarness, accounts: list[str], minutes: list[int]) -> list[Waiting]:
    """Queued tasks, the i-th of `accounts[i]` created `minutes[i]` minutes in (copies of one
    task, inserted in one statement)."""
    model = await h.create()
    async with h.maker() as session:
        row = await session.get(Task, model)
        assert row is not None
        base = {c.key: getattr(row, c.key) for c in Task.__table__.columns}
    start = base["created_at"]
    rows = []
    for account, minute in zip(accounts, minutes, strict=True):
        created = start + timedelta(minutes=minute)
        rows.append(
            {
                **base,
                "id": uuid.uuid4(),
                "account_id": account,
                "created_at": created,
                "updated_at": created,
                "queued_until": created + timedelta(days=7),
            }
        )
    async with h.maker() as session, session.begin():
        await session.execute(insert(Task), rows)
        await session.delete(await session.get(Task, model))
    return [Waiting(r["id"], r["account_id"], r["created_at"]) for r in rows]


async def test_the_queue_read_in_turn_is_fair_order_and_skips_held_accounts(
    h: TaskHarness,
) -> None:
    accounts = ["a", "b", "a", "c", "b", "a", "c", "d", "a"]
    minutes = [5, 3, 1, 4, 9, 7, 2, 2, 0]
    waiting = await queue(h, accounts, minutes)
    now = h.clock()
    got: list[uuid.UUID] = []
    after = None
    async with h.maker() as session:
        while page := await repository.queued_in_turn(session, now, 2, after=after):
            got += [task_id for task_id, _, _ in page]
            after = page[-1][2]
        held = await repository.queued_in_turn(session, now, 100, held={"a", "c"})
    assert got == [w.task_id for w in fair_order(waiting)]
    assert [t for t, _, _ in held] == [
        w.task_id for w in fair_order(waiting) if w.account_id in "bd"
    ]


def counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows (items) each task repository read returns, from now on."""
    read: list[int] = []
    for name, fn in inspect.getmembers(repository, inspect.iscoroutinefunction):

        def wrapped(fn: Any) -> Any:
            @functools.wraps(fn)
            async def counted(*args: Any, **kwargs: Any) -> Any:
                out = await fn(*args, **kwargs)
                if isinstance(out, list | tuple | dict):
                    read.append(len(out))
                return out

            return counted

        monkeypatch.setattr(repository, name, wrapped(fn))
    return read


@pytest.mark.parametrize("n", [100, 20_000])
async def test_a_pass_reads_as_many_queued_rows_from_a_long_queue_as_from_a_short_one(
    h: TaskHarness, monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    busy = await h.create(containerEnvironment=HANG, gpuSpecification=TWO_GPUS)
    await h.run()  # it holds both GPUs
    accounts = [f"account-{i % 50}" for i in range(n)]
    await queue(h, accounts, list(range(n)))
    read = counting(monkeypatch)
    h.clock.advance(1)
    await h.run()
    assert (await h.task(busy)).status == TaskStatus.RUNNING
    async with h.maker() as session:
        queued = (await session.execute(select(Task.id).where(Task.status == "QUEUED"))).all()
    assert len(queued) == n  # none placed: no room
    # the tasks on the cluster, one page of the queue in turn and its rows: not the queue
    assert sum(read) <= 3 * 16 + 8, read
