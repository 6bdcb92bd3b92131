"""Deployments' handlers of the function registry's events (functions/events.py), subscribed by
the composition (service/lifespan.py) with `subscribe`: a deleted version's deployment is torn down,
changed secrets are delivered to the instances of a deployed version. Both run in the
publisher's transaction; `wake` (the reconciler's) runs after its commit."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from sqlalchemy.ext.asyncio import AsyncSession

from service.core.db import after_commit
from service.core.events import Events
from service.deployments import transitions
from service.deployments.repository import live_deployment
from service.deployments.service import undeploy_version
from service.functions.events import SecretsChanged, VersionDeleted


async def undeploy_deleted_version(
    session: AsyncSession, event: VersionDeleted, *, wake: Callable[[], None]
) -> None:
    """Mark the version's live deployment `deleting` (it outlives the version row; the
    reconciler tears its instances down)."""
    message = f"function version {event.version_id} deleted; tearing down"
    deployment = await undeploy_version(session, event.version_id, message=message)
    if deployment is not None:
        after_commit(session, wake)


async def deliver_secrets(
    session: AsyncSession, event: SecretsChanged, *, wake: Callable[[], None]
) -> None:
    """A deployed version's deployment is made due: the reconciler writes the new Secret into
    every instance holding an older generation."""
    deployment = await live_deployment(session, event.version_id)
    if deployment is not None:
        transitions.secrets_changed(
            session, deployment, list(event.names), event.generation, event.at
        )
        after_commit(session, wake)


def subscribe(events: Events, *, wake: Callable[[], None]) -> None:
    events.within(VersionDeleted, partial(undeploy_deleted_version, wake=wake))
    events.within(SecretsChanged, partial(deliver_secrets, wake=wake))
