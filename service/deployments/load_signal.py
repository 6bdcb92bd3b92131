"""The autoscaler's load signal: what each invocation replica reports of its load per function
version, and the sum over the live replicas the autoscaler reads (autoscaler/store.py).

Deployments owns the tables (`invocation_load`, `load_reporters`); the invocation plane reports
through `report_load` (invocation/load.py) and reads nothing here. A report writes one row per
version sampled (upserted by (replica, version)) and the replica's `reported_at`, in one
transaction: a replica's rows are current as of that time. Reporters silent for longer than
`forget_after` are forgotten with their rows when a report asks to `prune`.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, or_, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from service.deployments.autoscale.decide import Load
from service.deployments.models import LoadReporter, ReportedLoad


@dataclass(frozen=True)
class LoadSample:
    """One version's load on one replica since its previous report."""

    version_id: uuid.UUID
    in_flight: float
    waiting: int
    last_request_at: datetime | None


async def report_load(
    session: AsyncSession,
    owner: str,
    samples: Sequence[LoadSample],
    now: datetime,
    *,
    prune: timedelta | None = None,
) -> None:
    """Write `owner`'s report as of `now` (in the caller's transaction); with `prune`, forget
    the reporters silent for longer than it, and their rows."""
    if samples:
        rows = [
            {
                "owner": owner,
                "version_id": s.version_id,
                "in_flight": s.in_flight,
                "waiting": s.waiting,
                "last_request_at": s.last_request_at,
                "sampled_at": now,
            }
            for s in samples
        ]
        await session.execute(
            _upsert(
                session,
                ReportedLoad,
                [ReportedLoad.owner, ReportedLoad.version_id],
                ("in_flight", "waiting", "last_request_at", "sampled_at"),
            ),
            rows,
        )
    await session.execute(
        _upsert(session, LoadReporter, [LoadReporter.owner], ("reported_at",)),
        [{"owner": owner, "reported_at": now}],
    )
    if prune is not None:
        await session.execute(delete(LoadReporter).where(LoadReporter.reported_at < now - prune))
        await session.execute(
            delete(ReportedLoad).where(ReportedLoad.owner.not_in(select(LoadReporter.owner)))
        )


async def reported_load(
    session: AsyncSession, fresh_since: datetime, requests_since: datetime
) -> dict[uuid.UUID, Load] | None:
    """Each version's load summed over the replicas that reported since `fresh_since`; None
    when no replica did. Only versions with something in flight or waiting, or a request since
    `requests_since`, are answered."""
    live = select(LoadReporter.owner).where(LoadReporter.reported_at >= fresh_since)
    if (await session.execute(live.limit(1))).first() is None:
        return None
    rows = await session.execute(
        select(
            ReportedLoad.version_id,
            func.sum(ReportedLoad.in_flight),
            func.sum(ReportedLoad.waiting),
            func.max(ReportedLoad.last_request_at),
        )
        .where(
            ReportedLoad.owner.in_(live),
            or_(
                ReportedLoad.in_flight > 0,
                ReportedLoad.waiting > 0,
                ReportedLoad.last_request_at >= requests_since,
            ),
        )
        .group_by(ReportedLoad.version_id)
    )
    return {
        vid: Load(float(in_flight or 0), int(waiting or 0), last)
        for vid, in_flight, waiting, last in rows.all()
    }


def _upsert(session: AsyncSession, table: Any, keys: list[Any], columns: Sequence[str]) -> Any:
    """INSERT … ON CONFLICT (keys) DO UPDATE of `columns`, in the session's dialect."""
    dialect = session.get_bind().dialect.name
    stmt = (pg_insert if dialect == "postgresql" else sqlite_insert)(table)
    return stmt.on_conflict_do_update(
        index_elements=keys, set_={c: stmt.excluded[c] for c in columns}
    )


__all__ = ["LoadSample", "report_load", "reported_load"]
