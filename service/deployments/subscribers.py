"""Deployments' handlers of the function registry's events (functions/events.py), subscribed by
the composition (service/lifespan.py) with `subscribe`: a deleted version's deployment is torn down,
changed secrets are delivered to the instances of a deployed version. Both run in the
publisher's transaction; `wake` (the reconciler's) runs after its commit."""

from __future__ import annotations

from collections.abc import Callable, Collection
from functools import partial

from sqlalchemy.ext.asyncio import AsyncSession

from service.core.db import after_commit
from service.core.events import Events
from service.deployments import transitions
from service.deployments.models import InstanceDesired
from service.deployments.repository import instances_of, live_deployment
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


def _telemetry_key_delivery(clusters: Collection[str], rolling: Collection[str]) -> str:
    """How the instances on `clusters` get a telemetry's new key: where the cluster adds the
    collector (`rolling`), its Secret changes and so does the pod template's checksum of the
    keys, so the pods roll; elsewhere the server's own exporter sends with it."""
    in_process = "the server's exporter uses the new key from its next export, without a restart"
    if not rolling:
        return in_process
    rolled = (
        f"the collector's Secret gets the new key and the pods on {', '.join(sorted(rolling))} "
        "roll (their telemetry-keys checksum changes)"
    )
    return rolled if set(clusters) <= set(rolling) else f"{rolled}; elsewhere {in_process}"


async def deliver_secrets(
    session: AsyncSession,
    event: SecretsChanged,
    *,
    wake: Callable[[], None],
    adds_collector: Callable[[str], bool],
) -> None:
    """A deployed version's deployment is made due: the reconciler writes the new Secret into
    every instance holding an older generation. `adds_collector(cluster)`: whether the
    cluster adds the collector to the pods (a telemetry's key then rolls them)."""
    deployment = await live_deployment(session, event.version_id)
    if deployment is not None:
        names, generation = list(event.names), event.generation
        if event.telemetry_key:
            instances = (await instances_of(session, [deployment.id]))[deployment.id]
            clusters = {i.cluster or "" for i in instances if i.desired == InstanceDesired.PRESENT}
            how = _telemetry_key_delivery(clusters, {c for c in clusters if adds_collector(c)})
            transitions.secrets_changed(session, deployment, names, generation, event.at, how)
        else:
            transitions.secrets_changed(session, deployment, names, generation, event.at)
        after_commit(session, wake)


def subscribe(
    events: Events, *, wake: Callable[[], None], adds_collector: Callable[[str], bool]
) -> None:
    events.within(VersionDeleted, partial(undeploy_deleted_version, wake=wake))
    events.within(
        SecretsChanged, partial(deliver_secrets, wake=wake, adds_collector=adds_collector)
    )
