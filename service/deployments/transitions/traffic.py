"""A function's traffic split written, with each version's share of it on its deployment's
specifications: their minInstances count in proportion (`DeploymentSpec.floor_instances`) and
the autoscaler's target grows or shrinks with the share, so that each version's instances
follow its share of the traffic. A deployment whose desired
count changes is due for the reconciler, with a `scaling` event saying why."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from service.core.db import for_update
from service.deployments import traffic
from service.deployments.events import record_event
from service.deployments.models import Deployment, DeploymentDesired
from service.deployments.transitions.deployment import mark_changed
from service.functions import repository as functions_repository


async def set_split(
    session: AsyncSession, function_id: uuid.UUID, weights: Mapping[uuid.UUID, int], now: datetime
) -> None:
    """The function's split from now on (`weights` checked by the caller; empty: none), and
    each live version's share: its weight, 0 when a split leaves it out, 100 without one.
    Splits of one function are set one at a time (its row locked): the next replaces the
    rows the last one committed."""
    await functions_repository.lock_function(session, function_id)
    await traffic.replace(
        session,
        function_id,
        [
            traffic.TrafficWeightIn.model_construct(version_id=v, weight=w)
            for v, w in weights.items()
        ],
    )
    # as they are now: the autoscaler's target committed meanwhile is the one scaled
    live = await session.scalars(
        for_update(
            select(Deployment)
            .where(
                Deployment.function_id == function_id,
                Deployment.desired == DeploymentDesired.DEPLOYED,
            )
            .order_by(Deployment.id)
        )
    )
    for deployment in live:
        share = weights.get(deployment.version_id, 0) if weights else 100
        changed = []
        for spec in deployment.specs:
            if spec.traffic_share == share:
                continue
            before, old = spec.desired_instances, spec.traffic_share
            if spec.target_instances is not None:
                # the autoscaler's target follows the share too (from nothing: the floor)
                grown = -(-spec.target_instances * share // old) if share and old else None
                spec.target_instances = grown
            spec.traffic_share = share
            if spec.desired_instances != before:
                changed.append(
                    f"{spec.gpu} {spec.instance_type} ({spec.id}) {before} → "
                    f"{spec.desired_instances}"
                )
        if changed:
            mark_changed(deployment, now)
            record_event(
                session,
                deployment.id,
                "scaling",
                f"traffic share {share}%: minInstances count in proportion; " + ", ".join(changed),
                reason="TrafficShare",
            )
