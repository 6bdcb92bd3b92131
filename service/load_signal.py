"""The load the invocation replicas report, as the autoscaler reads it (deployments/autoscale/
store.py: `LoadSignal`), handed to it by the composition (service/app.py).

It reads the invocation plane's tables, so it sits above both domains; it goes once the
invocation plane reports its load through deployments (issue 26)."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from service.deployments.autoscale.decide import Load
from service.invocation.models import InvocationLoad, InvocationReplica


async def reported_load(
    session: AsyncSession, fresh_since: datetime, requests_since: datetime
) -> dict[uuid.UUID, Load] | None:
    """Each version's load summed over the replicas that reported since `fresh_since`; None
    when no replica did. Only versions with something in flight or waiting, or a request since
    `requests_since`, are answered."""
    live = select(InvocationReplica.owner).where(InvocationReplica.load_reported_at >= fresh_since)
    if (await session.execute(live.limit(1))).first() is None:
        return None
    rows = await session.execute(
        select(
            InvocationLoad.version_id,
            func.sum(InvocationLoad.in_flight),
            func.sum(InvocationLoad.waiting),
            func.max(InvocationLoad.last_request_at),
        )
        .where(
            InvocationLoad.owner.in_(live),
            or_(
                InvocationLoad.in_flight > 0,
                InvocationLoad.waiting > 0,
                InvocationLoad.last_request_at >= requests_since,
            ),
        )
        .group_by(InvocationLoad.version_id)
    )
    return {
        vid: Load(float(in_flight or 0), int(waiting or 0), last)
        for vid, in_flight, waiting, last in rows.all()
    }
