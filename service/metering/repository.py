"""Every statement on the metering tables."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Float, case, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from service.metering.models import GpuInterval, UsageCount


async def set_cluster(session: AsyncSession, instance_id: uuid.UUID, cluster: str) -> None:
    await session.execute(
        update(GpuInterval).where(GpuInterval.instance_id == instance_id).values(cluster=cluster)
    )


async def set_started(session: AsyncSession, instance_id: uuid.UUID, at: datetime) -> None:
    """The instance's first ready moment; a later one (ready again) changes nothing."""
    await session.execute(
        update(GpuInterval)
        .where(
            GpuInterval.instance_id == instance_id,
            GpuInterval.started_at.is_(None),
            GpuInterval.ended_at.is_(None),
        )
        .values(started_at=at)
    )


async def set_ended(session: AsyncSession, instance_ids: Sequence[uuid.UUID], at: datetime) -> None:
    """The instances' end; an interval already closed stays as it was."""
    await session.execute(
        update(GpuInterval)
        .where(GpuInterval.instance_id.in_(list(instance_ids)), GpuInterval.ended_at.is_(None))
        .values(ended_at=at)
    )


async def set_deployment_ended(
    session: AsyncSession, deployment_id: uuid.UUID, at: datetime
) -> None:
    await session.execute(
        update(GpuInterval)
        .where(GpuInterval.deployment_id == deployment_id, GpuInterval.ended_at.is_(None))
        .values(ended_at=at)
    )


async def intervals(
    session: AsyncSession, account_id: str, since: datetime, until: datetime
) -> Sequence[GpuInterval]:
    """The account's intervals that overlap [since, until)."""
    stmt = select(GpuInterval).where(
        GpuInterval.account_id == account_id,
        GpuInterval.created_at < until,
        or_(GpuInterval.ended_at.is_(None), GpuInterval.ended_at > since),
    )
    return (await session.execute(stmt)).scalars().all()


class seconds_between(FunctionElement[float]):
    """`end - start` in seconds, for two `UTCDateTime` columns, on either database."""

    type = Float()
    inherit_cache = True


@compiles(seconds_between, "sqlite")
def _seconds_sqlite(element: seconds_between, compiler: SQLCompiler, **kw: Any) -> str:
    # SQLAlchemy stores "YYYY-MM-DD HH:MM:SS.ffffff"; julianday() would keep milliseconds only
    start, end = (compiler.process(c, **kw) for c in element.clauses)
    whole = f"(CAST(strftime('%s', {end}) AS INTEGER) - CAST(strftime('%s', {start}) AS INTEGER))"
    part = f"(CAST(substr({end}, 20) AS REAL) - CAST(substr({start}, 20) AS REAL))"
    return f"({whole} + {part})"


@compiles(seconds_between, "postgresql")
def _seconds_postgresql(element: seconds_between, compiler: SQLCompiler, **kw: Any) -> str:
    start, end = (compiler.process(c, **kw) for c in element.clauses)
    return f"EXTRACT(EPOCH FROM ({end} - {start}))"


#: the labels of the GPU totals on /metrics
TOTAL_KEYS = (
    GpuInterval.account_id,
    GpuInterval.function_id,
    GpuInterval.task_id,
    GpuInterval.instance_type,
    GpuInterval.cluster,
)


async def closed_gpu_totals(
    session: AsyncSession, now: datetime
) -> Sequence[tuple[tuple[Any, ...], float, float]]:
    """(key, ready GPU-seconds, not-ready GPU-seconds) summed in the database over every
    interval ended by `now`, keyed as `TOTAL_KEYS`: what /metrics serves, read without a row per
    interval ever written."""
    i = GpuInterval

    def gpu_seconds(start: Any) -> Any:
        seconds = seconds_between(start, i.ended_at)
        return case((seconds > 0, seconds), else_=0.0) * i.gpus

    stmt = (
        select(
            *TOTAL_KEYS,
            func.sum(case((i.started_at.is_not(None), gpu_seconds(i.started_at)), else_=0.0)),
            func.sum(case((i.started_at.is_(None), gpu_seconds(i.created_at)), else_=0.0)),
        )
        .where(i.ended_at.is_not(None), i.ended_at <= now)
        .group_by(*TOTAL_KEYS)
    )
    return [
        (tuple(row[:5]), float(row[5] or 0.0), float(row[6] or 0.0))
        for row in (await session.execute(stmt)).all()
    ]


async def open_intervals(session: AsyncSession, now: datetime) -> Sequence[GpuInterval]:
    """The intervals not ended by `now`: the instances on a cluster (bounded by the fleet)."""
    stmt = select(GpuInterval).where(
        or_(GpuInterval.ended_at.is_(None), GpuInterval.ended_at > now)
    )
    return (await session.execute(stmt)).scalars().all()


async def counts(
    session: AsyncSession, account_id: str | None, since: datetime, until: datetime
) -> Sequence[UsageCount]:
    """The counts of the hours in [since, until) (every account's: None)."""
    stmt = select(UsageCount).where(UsageCount.hour >= since, UsageCount.hour < until)
    if account_id is not None:
        stmt = stmt.where(UsageCount.account_id == account_id)
    return (await session.execute(stmt)).scalars().all()


async def add_counts(session: AsyncSession, rows: Sequence[dict[str, object]]) -> None:
    """Add each row's counts to its key's, unless the stored row already took its batch."""
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    insert = pg_insert if dialect == "postgresql" else sqlite_insert
    stmt = insert(UsageCount).values(list(rows))
    table = UsageCount.__table__.c
    await session.execute(
        stmt.on_conflict_do_update(
            index_elements=[
                table.replica,
                table.hour,
                table.account_id,
                table.function_id,
                table.version_id,
                table.model,
            ],
            set_={
                "invocations": table.invocations + stmt.excluded.invocations,
                "input_tokens": table.input_tokens + stmt.excluded.input_tokens,
                "output_tokens": table.output_tokens + stmt.excluded.output_tokens,
                "batch": stmt.excluded.batch,
            },
            where=table.batch < stmt.excluded.batch,
        )
    )


async def count_totals(session: AsyncSession) -> Sequence[tuple[str, str, str, list[int]]]:
    """(account, function id, model, [invocations, input, output]) summed over every hour."""
    c = UsageCount.__table__.c
    stmt = select(
        c.account_id,
        c.function_id,
        c.model,
        func.sum(c.invocations),
        func.sum(c.input_tokens),
        func.sum(c.output_tokens),
    ).group_by(c.account_id, c.function_id, c.model)
    return [
        (account, fid, model, [int(n or 0), int(i or 0), int(o or 0)])
        for account, fid, model, n, i, o in (await session.execute(stmt)).all()
    ]
