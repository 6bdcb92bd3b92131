"""Database queries of tasks (one statement each; the caller's transaction commits)."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Row, delete, func, literal, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncSession

from service.core.db import for_update
from service.core.pagination import Page, keyset_page
from service.tasks.models import ACTIVE, ON_CLUSTER, Task, TaskEvent, TaskResult, TaskStatus


async def get(session: AsyncSession, task_id: uuid.UUID) -> Task | None:
    return await session.get(Task, task_id)


async def get_for_update(session: AsyncSession, task_id: uuid.UUID) -> Task | None:
    """The task as it is now, no other writer changing it until the transaction ends."""
    stmt = for_update(select(Task).where(Task.id == task_id))
    return (await session.execute(stmt)).scalar_one_or_none()


async def many_for_update(
    session: AsyncSession, task_ids: Collection[uuid.UUID]
) -> dict[uuid.UUID, Task]:
    """The tasks among `task_ids` as they are now, by id, no other writer changing them until
    the transaction ends (locked in id order, so two writers cannot deadlock)."""
    if not task_ids:
        return {}
    stmt = for_update(select(Task).where(Task.id.in_(list(task_ids))).order_by(Task.id))
    return {t.id: t for t in (await session.execute(stmt)).scalars().all()}


async def of_account(
    session: AsyncSession, account_id: str, ids: Collection[uuid.UUID]
) -> Sequence[Task]:
    """The account's live tasks among `ids`, oldest first."""
    if not ids:
        return []
    stmt = (
        select(Task)
        .where(Task.account_id == account_id, Task.id.in_(list(ids)), Task.deleted.is_(False))
        .order_by(Task.created_at, Task.id)
    )
    return (await session.execute(stmt)).scalars().all()


async def page_of_account(
    session: AsyncSession, account_id: str, status: TaskStatus | None, page: Page
) -> tuple[list[Task], str | None]:
    stmt = select(Task).where(Task.account_id == account_id, Task.deleted.is_(False))
    if status is not None:
        stmt = stmt.where(Task.status == status.value)
    return await keyset_page(
        session,
        stmt,
        page,
        created=Task.created_at,
        ident=Task.id,
        cursor_of=lambda t: (t.created_at, t.id),
    )


async def count_held(session: AsyncSession, account_id: str) -> int:
    """Tasks the account holds, in any status (the `tasks` quota)."""
    stmt = (
        select(func.count())
        .select_from(Task)
        .where(Task.account_id == account_id, Task.deleted.is_(False))
    )
    return int((await session.execute(stmt)).scalar_one())


async def count_active(session: AsyncSession, account_id: str) -> int:
    """Tasks of the account queued, launched or running (the `active_tasks` quota)."""
    stmt = (
        select(func.count())
        .select_from(Task)
        .where(Task.account_id == account_id, Task.status.in_([s.value for s in ACTIVE]))
    )
    return int((await session.execute(stmt)).scalar_one())


async def active_of_account(session: AsyncSession, account_id: str) -> Sequence[Task]:
    stmt = select(Task).where(
        Task.account_id == account_id, Task.status.in_([s.value for s in ACTIVE])
    )
    return (await session.execute(stmt)).scalars().all()


async def launched_or_running(session: AsyncSession, account_id: str | None) -> Sequence[Task]:
    """The account's tasks (every account's: None) launched or running."""
    stmt = select(Task).where(Task.status.in_([s.value for s in ON_CLUSTER]))
    if account_id is not None:
        stmt = stmt.where(Task.account_id == account_id)
    return (await session.execute(stmt)).scalars().all()


async def queue_signature(
    session: AsyncSession,
) -> tuple[int, datetime | None, datetime | None]:
    """How many tasks are queued, the newest one's creation and the first queued deadline:
    while these and the clusters' capacity stay the same, a placement pass changes nothing."""
    stmt = select(func.count(), func.max(Task.created_at), func.min(Task.queued_until)).where(
        Task.status == TaskStatus.QUEUED.value
    )
    count, newest, first = (await session.execute(stmt)).one()
    return int(count), _aware(newest), _aware(first)


def _aware(value: datetime | None) -> datetime | None:
    """An aggregate's time (SQLite hands back naive UTC, or text)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


#: where a read of the queue in its turn goes on from: (turn, account's first creation,
#: account's first task) of the last task read
TurnKey = tuple[int, datetime, uuid.UUID]


async def queued_in_turn(
    session: AsyncSession,
    now: datetime,
    limit: int,
    *,
    held: Collection[str] = (),
    after: TurnKey | None = None,
) -> list[tuple[uuid.UUID, str, TurnKey]]:
    """(id, account, key) of the next `limit` queued tasks not past their maxQueuedDuration in
    the queue's fair order (queue.py's `fair_order`, in SQL): the n-th task of every account
    (created_at, id) before the (n+1)-th of any, accounts in the order of their oldest task;
    none of the accounts `held`, from after `after`. Window functions number each account's
    tasks, so only the rows returned are read into the pass, however long the queue."""
    account, in_account = Task.account_id, (Task.created_at, Task.id)
    ranked = select(
        Task.id.label("id"),
        Task.account_id.label("account_id"),
        func.row_number().over(partition_by=account, order_by=in_account).label("turn"),
        func.min(Task.created_at).over(partition_by=account).label("first_at"),
        func.first_value(Task.id, type_=Task.id.type)
        .over(partition_by=account, order_by=in_account)
        .label("first_id"),
    ).where(Task.status == TaskStatus.QUEUED.value, Task.queued_until > now)
    if held:
        ranked = ranked.where(Task.account_id.not_in(list(held)))
    q = ranked.subquery()
    key = (q.c.turn, q.c.first_at, q.c.first_id)
    stmt = select(q.c.id, q.c.account_id, *key).order_by(*key).limit(limit)
    if after is not None:
        turn, first_at, first_id = after
        stmt = stmt.where(
            tuple_(*key)
            > tuple_(
                literal(turn),
                literal(first_at, Task.created_at.type),
                literal(first_id, Task.id.type),
            )
        )
    return [
        (task_id, account_id, (int(turn), _aware(first_at) or first_at, first_id))
        for task_id, account_id, turn, first_at, first_id in (await session.execute(stmt)).all()
    ]


async def queued_expired(session: AsyncSession, now: datetime, limit: int) -> list[uuid.UUID]:
    """Up to `limit` queued tasks past their maxQueuedDuration (`queued_until`), first
    expired first."""
    stmt = (
        select(Task.id)
        .where(Task.status == TaskStatus.QUEUED.value, Task.queued_until <= now)
        .order_by(Task.queued_until, Task.id)
        .limit(limit)
    )
    return list((await session.execute(stmt)).scalars().all())


async def many(session: AsyncSession, task_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, Task]:
    """The tasks among `task_ids`, by id."""
    if not task_ids:
        return {}
    stmt = select(Task).where(Task.id.in_(list(task_ids)))
    return {t.id: t for t in (await session.execute(stmt)).scalars().all()}


async def on_cluster(
    session: AsyncSession, only: Collection[uuid.UUID] | None = None
) -> Sequence[Task]:
    """Tasks launched or running, and ended tasks whose objects are still to be removed (of
    `only`, when given)."""
    stmt = select(Task).where(
        Task.status.in_([s.value for s in ON_CLUSTER]) | Task.teardown_pending.is_(True)
    )
    if only is not None:
        stmt = stmt.where(Task.id.in_(list(only)))
    return (await session.execute(stmt)).scalars().all()


async def deleted_and_clean(session: AsyncSession) -> Sequence[uuid.UUID]:
    stmt = select(Task.id).where(Task.deleted.is_(True), Task.teardown_pending.is_(False))
    return (await session.execute(stmt)).scalars().all()


async def known_ids(session: AsyncSession) -> Sequence[uuid.UUID]:
    """Every task id (the garbage collector keeps their namespaces)."""
    return (await session.execute(select(Task.id))).scalars().all()


async def remove(session: AsyncSession, ids: Collection[uuid.UUID]) -> None:
    """Delete tasks with their events and results."""
    if not ids:
        return
    id_list = list(ids)
    await session.execute(delete(TaskEvent).where(TaskEvent.task_id.in_(id_list)))
    await session.execute(delete(TaskResult).where(TaskResult.task_id.in_(id_list)))
    await session.execute(delete(Task).where(Task.id.in_(id_list)))


async def events_page(
    session: AsyncSession, task_id: uuid.UUID, page: Page
) -> tuple[list[TaskEvent], str | None]:
    return await keyset_page(
        session,
        select(TaskEvent).where(TaskEvent.task_id == task_id),
        page,
        created=TaskEvent.created_at,
        ident=TaskEvent.id,
        cursor_of=lambda e: (e.created_at, e.id),
    )


async def results_page(
    session: AsyncSession, task_id: uuid.UUID, page: Page
) -> tuple[list[TaskResult], str | None]:
    return await keyset_page(
        session,
        select(TaskResult).where(TaskResult.task_id == task_id),
        page,
        created=TaskResult.created_at,
        ident=TaskResult.id,
        cursor_of=lambda r: (r.created_at, r.id),
    )


async def result_names(session: AsyncSession, task_id: uuid.UUID) -> set[str]:
    stmt = select(TaskResult.name).where(TaskResult.task_id == task_id)
    return set((await session.execute(stmt)).scalars().all())


async def unpushed_results(session: AsyncSession, task_id: uuid.UUID) -> Sequence[TaskResult]:
    """The task's results not pushed yet (UPLOAD), oldest first."""
    stmt = (
        select(TaskResult)
        .where(TaskResult.task_id == task_id, TaskResult.reference.is_(None))
        .order_by(TaskResult.created_at, TaskResult.id)
    )
    return (await session.execute(stmt)).scalars().all()


async def result(session: AsyncSession, result_id: uuid.UUID) -> TaskResult | None:
    return await session.get(TaskResult, result_id)


async def telemetry_users(
    session: AsyncSession, account_id: str, telemetry_id: uuid.UUID
) -> list[str]:
    """The account's tasks not yet ended naming the telemetry, as "task <id>" (the ids are in a
    JSON field, scanned as the functions' versions are)."""
    stmt = (
        select(Task.id, Task.telemetries)
        .where(
            Task.account_id == account_id,
            Task.telemetries.is_not(None),
            Task.status.in_([s.value for s in ACTIVE]),
        )
        .order_by(Task.created_at, Task.id)
    )
    wanted = str(telemetry_id)
    return [
        f"task {tid}"
        for tid, named in (await session.execute(stmt)).all()
        if isinstance(named, dict) and wanted in {str(v).lower() for v in named.values()}
    ]


async def telemetry_rows(session: AsyncSession, since: datetime) -> Sequence[Row[Any]]:
    """The columns the task exports read of each task that is active, still on its cluster or
    ended after `since` (whether it names telemetries is read from `telemetries`)."""
    stmt = select(
        Task.id,
        Task.account_id,
        Task.name,
        Task.telemetries,
        Task.status,
        Task.percent_complete,
        Task.instance_type,
        Task.cluster,
        Task.teardown_pending,
        Task.created_at,
        Task.launched_at,
        Task.running_at,
        Task.finished_at,
    ).where(
        Task.status.in_([s.value for s in ACTIVE])
        | Task.teardown_pending.is_(True)
        | (Task.finished_at >= since)
    )
    return (await session.execute(stmt)).all()


async def follow_logs(
    session: AsyncSession,
    task_ids: Collection[uuid.UUID],
    owner: str,
    now: datetime,
    until: datetime,
) -> dict[uuid.UUID, str]:
    """Of `task_ids`, those whose lines `owner` follows now: its leases are renewed and free or
    lapsed ones taken (one follower across replicas), with the last line sent of each."""
    if not task_ids:
        return {}
    ids = list(task_ids)
    free = (
        Task.log_follower.is_(None) | (Task.log_follower == owner) | (Task.log_follower_until < now)
    )
    await session.execute(
        update(Task)
        .where(Task.id.in_(ids), free)
        .values(log_follower=owner, log_follower_until=until)
    )
    stmt = select(Task.id, Task.log_sent).where(Task.id.in_(ids), Task.log_follower == owner)
    return {task_id: sent or "" for task_id, sent in (await session.execute(stmt)).all()}


async def logs_sent(
    session: AsyncSession, sent: dict[uuid.UUID, str], owner: str, *, release: bool = False
) -> None:
    """The last line `owner` sent of each task it follows (and, with `release`, its leases
    given up, for another replica to take over at once)."""
    for task_id, stamp in sent.items():
        values: dict[str, Any] = {"log_sent": stamp or None}
        if release:
            values |= {"log_follower": None, "log_follower_until": None}
        await session.execute(
            update(Task).where(Task.id == task_id, Task.log_follower == owner).values(**values)
        )
