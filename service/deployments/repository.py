"""Every SQL statement of the deployments API: lookups (row-locked where a change follows),
pages, and the batched reads the views are built from (a page of deployments in a constant
number of queries: deployments, their specs, their instances, their versions)."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, Select, and_, delete, func, insert, or_, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from service.auth.service import Principal
from service.core.db import for_update
from service.core.errors import BadRequest, NotFound
from service.core.http import parse_uuids
from service.core.pagination import Page, keyset_page
from service.deployments.models import (
    AccountInstances,
    CanaryRelease,
    Deployment,
    DeploymentDesired,
    DeploymentEvent,
    DeploymentHistory,
    DeploymentSpec,
    Instance,
    InstanceDesired,
    KeptLog,
    SpecRevision,
    TrafficWeight,
)
from service.functions import repository as functions_repository
from service.functions.models import FunctionVersion
from service.health.machine import Phase


async def lock_version(
    session: AsyncSession, account_id: str, function_id: uuid.UUID, version_id: uuid.UUID
) -> FunctionVersion:
    """The caller's version, re-read and row-locked (`FOR UPDATE` on PostgreSQL) so concurrent
    deploys of one version serialise; 404 if it is not the caller's."""
    version = await functions_repository.lock_version(session, version_id)
    if version is None or version.account_id != account_id or version.function_id != function_id:
        raise NotFound(detail=f"version {version_id} of function {function_id} not found")
    return version


async def live_deployment(
    session: AsyncSession, version_id: uuid.UUID, *, locked: bool = False
) -> Deployment | None:
    """The version's live (`desired = deployed`) deployment, if any; `locked`: as it is now,
    no other writer changing it until the transaction ends (a change follows)."""
    stmt = select(Deployment).where(
        Deployment.version_id == version_id, Deployment.desired == DeploymentDesired.DEPLOYED
    )
    return (await session.execute(for_update(stmt) if locked else stmt)).scalar_one_or_none()


async def get_deployment(
    session: AsyncSession, account_id: str, deployment_id: uuid.UUID
) -> Deployment:
    deployment = await session.get(Deployment, deployment_id)
    if deployment is None or deployment.account_id != account_id:
        raise NotFound(detail=f"deployment {deployment_id} not found")
    return deployment


async def lock_deployment(
    session: AsyncSession, account_id: str, deployment_id: uuid.UUID
) -> Deployment:
    """The caller's deployment as it is now, locked as the reconciler locks it, so a change of
    its specs never interleaves with a unit of work."""
    stmt = for_update(select(Deployment).where(Deployment.id == deployment_id))
    deployment = (await session.execute(stmt)).scalar_one_or_none()
    if deployment is None or deployment.account_id != account_id:
        raise NotFound(detail=f"deployment {deployment_id} not found")
    return deployment


async def live_spec(
    session: AsyncSession, principal: Principal, deployment_id: str, spec_id: str
) -> tuple[Deployment, DeploymentSpec]:
    """The caller's live deployment and one of its specifications, its version and it locked
    in that order, every writer's (404; 400 when the deployment is being deleted)."""
    did, sid = parse_uuids((deployment_id, "deploymentId"), (spec_id, "gpuSpecificationId"))
    found = await get_deployment(session, principal.account_id, did)
    await functions_repository.lock_version(session, found.version_id)
    deployment = await lock_deployment(session, principal.account_id, did)
    spec = next((s for s in deployment.specs if s.id == sid), None)
    if spec is None:
        raise NotFound(detail=f"GPU specification {sid} not found in deployment {did}")
    if deployment.desired != DeploymentDesired.DEPLOYED:
        raise BadRequest(
            detail=f"deployment {did} is being deleted; its GPU specifications cannot change"
        )
    return deployment, spec


async def find_deployment(
    session: AsyncSession, account_id: str, deployment_id: uuid.UUID, now: datetime
) -> Deployment | DeploymentHistory:
    """The caller's deployment, or its history once removed (until that expires); 404
    otherwise."""
    deployment = await session.get(Deployment, deployment_id)
    if deployment is not None and deployment.account_id == account_id:
        return deployment
    removed = await history_entry(session, account_id, deployment_id, now)
    if removed is None:
        raise NotFound(detail=f"deployment {deployment_id} not found")
    return removed


async def get_version_deployment(
    session: AsyncSession,
    account_id: str,
    function_id: uuid.UUID,
    version_id: uuid.UUID,
    *,
    locked: bool = False,
) -> Deployment:
    """The live deployment of the caller's version (`locked`: as `live_deployment`); 404 when
    the version or deployment is unknown."""
    deployment = await live_deployment(session, version_id, locked=locked)
    if (
        deployment is None
        or deployment.account_id != account_id
        or deployment.function_id != function_id
    ):
        raise NotFound(detail=f"no deployment of version {version_id} of function {function_id}")
    return deployment


async def list_deployments(
    session: AsyncSession, account_id: str, page: Page, only: frozenset[uuid.UUID] | None = None
) -> tuple[list[Deployment], str | None]:
    """The caller's live deployments, oldest first, keyset-paginated like the functions list
    (`only`: of these functions, for a key limited to them)."""
    stmt = select(Deployment).where(
        Deployment.account_id == account_id, Deployment.desired == DeploymentDesired.DEPLOYED
    )
    if only is not None:
        stmt = stmt.where(Deployment.function_id.in_(list(only)))
    return await keyset_page(
        session,
        stmt,
        page,
        created=Deployment.created_at,
        ident=Deployment.id,
        cursor_of=lambda d: (d.created_at, d.id),
    )


async def instances_of(
    session: AsyncSession, deployment_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, list[Instance]]:
    out: dict[uuid.UUID, list[Instance]] = defaultdict(list)
    if not deployment_ids:
        return out
    stmt = (
        select(Instance)
        .where(Instance.deployment_id.in_(deployment_ids))
        .order_by(Instance.created_at, Instance.id)
    )
    for inst in (await session.execute(stmt)).scalars():
        out[inst.deployment_id].append(inst)
    return out


async def error_reasons(
    session: AsyncSession, deployment_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, DeploymentEvent]:
    """The latest event carrying a reason, per deployment (healthInfo of ERROR versions whose
    failed instance rows are gone)."""
    if not deployment_ids:
        return {}
    stmt = (
        select(DeploymentEvent)
        .where(
            DeploymentEvent.deployment_id.in_(deployment_ids),
            DeploymentEvent.reason.is_not(None),
        )
        .order_by(DeploymentEvent.at, DeploymentEvent.id)
    )
    return {e.deployment_id: e for e in (await session.execute(stmt)).scalars()}


async def running_counts(session: AsyncSession, deployment_id: uuid.UUID) -> dict[uuid.UUID, int]:
    """Running, wanted instances per specification of the deployment."""
    stmt = (
        select(Instance.spec_id, func.count())
        .where(
            Instance.deployment_id == deployment_id,
            Instance.desired == InstanceDesired.PRESENT,
            Instance.phase == Phase.RUNNING,
        )
        .group_by(Instance.spec_id)
    )
    return {sid: int(n) for sid, n in (await session.execute(stmt)).all()}


async def list_events(
    session: AsyncSession, deployment_id: uuid.UUID, page: Page
) -> tuple[list[DeploymentEvent], str | None]:
    """The deployment's timeline, oldest first (ties in insertion order)."""
    stmt = select(DeploymentEvent).where(DeploymentEvent.deployment_id == deployment_id)
    return await keyset_page(
        session,
        stmt,
        page,
        created=DeploymentEvent.at,
        ident=DeploymentEvent.id,
        cursor_of=lambda e: (e.at, uuid.UUID(int=e.id)),
        ident_from_cursor=lambda u: u.int,
    )


@dataclass(frozen=True)
class ActiveInstanceRow:
    instance_id: uuid.UUID
    phase: str
    instance_type: str
    gpu: str
    backend: str
    cluster: str | None
    created_at: Any
    updated_at: Any


async def active_instances(
    session: AsyncSession, version_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, list[ActiveInstanceRow]]:
    """Wanted instances of each version's live deployment, in one query."""
    out: dict[uuid.UUID, list[ActiveInstanceRow]] = defaultdict(list)
    if not version_ids:
        return out
    stmt = (
        select(
            Deployment.version_id,
            Instance.id,
            Instance.phase,
            DeploymentSpec.instance_type,
            DeploymentSpec.gpu,
            DeploymentSpec.backend,
            Instance.cluster,
            Instance.created_at,
            Instance.updated_at,
        )
        .join(Deployment, Deployment.id == Instance.deployment_id)
        .join(DeploymentSpec, DeploymentSpec.id == Instance.spec_id)
        .where(
            Deployment.version_id.in_(list(version_ids)),
            Deployment.desired == DeploymentDesired.DEPLOYED,
            Instance.desired == InstanceDesired.PRESENT,
        )
        .order_by(Instance.created_at, Instance.id)
    )
    for vid, iid, phase, itype, gpu, backend, cluster, created, updated in (
        await session.execute(stmt)
    ).all():
        out[vid].append(
            ActiveInstanceRow(iid, phase, itype, gpu, backend, cluster, created, updated)
        )
    return out


async def with_live_deployment(
    session: AsyncSession, versions: Select[*tuple[Any, ...]]
) -> Sequence[Row[Any]]:
    """The rows of `versions` (a statement of versions with an `id` column, e.g.
    `functions.repository.invocable_versions`), each with its live deployment's id and
    creation time (`deployment_id`, `created_at`; None when not deployed). One query."""
    chosen = versions.subquery()
    stmt = select(chosen, Deployment.id.label("deployment_id"), Deployment.created_at).outerjoin(
        Deployment,
        and_(
            Deployment.version_id == chosen.c.id,
            Deployment.desired == DeploymentDesired.DEPLOYED,
        ),
    )
    return (await session.execute(stmt)).all()


async def traffic_weights(session: AsyncSession, function_id: uuid.UUID) -> dict[uuid.UUID, int]:
    """The function's traffic split by version (empty: none)."""
    rows = await session.execute(
        select(TrafficWeight.version_id, TrafficWeight.weight).where(
            TrafficWeight.function_id == function_id
        )
    )
    return {r.version_id: r.weight for r in rows}


async def clear_traffic(session: AsyncSession, function_id: uuid.UUID) -> None:
    await session.execute(delete(TrafficWeight).where(TrafficWeight.function_id == function_id))


async def running_routes(session: AsyncSession, deployment_id: uuid.UUID) -> Sequence[Any]:
    """The Running instances a deployment's requests may go to, oldest first, each with what
    routing needs of its spec (`id`, `cluster`, `max_request_concurrency`, `backend`,
    `instance_type`)."""
    stmt = (
        select(
            Instance.id,
            Instance.cluster,
            DeploymentSpec.max_request_concurrency,
            DeploymentSpec.backend,
            DeploymentSpec.instance_type,
        )
        .join(DeploymentSpec, DeploymentSpec.id == Instance.spec_id)
        .where(
            Instance.deployment_id == deployment_id,
            Instance.phase == Phase.RUNNING,
            Instance.desired == InstanceDesired.PRESENT,
        )
        .order_by(Instance.created_at, Instance.id)
    )
    return (await session.execute(stmt)).all()


async def instance_of(
    session: AsyncSession, deployment_id: uuid.UUID, instance_id: uuid.UUID
) -> Instance | None:
    """The instance, when it is (or was) one of the deployment's."""
    row = await session.get(Instance, instance_id)
    return row if row is not None and row.deployment_id == deployment_id else None


async def running_instances(session: AsyncSession, deployment_id: uuid.UUID) -> Sequence[Instance]:
    """The deployment's Running instances, oldest first."""
    stmt = (
        select(Instance)
        .where(
            Instance.deployment_id == deployment_id,
            Instance.desired == InstanceDesired.PRESENT,
            Instance.phase == Phase.RUNNING.value,
        )
        .order_by(Instance.created_at, Instance.id)
    )
    return (await session.execute(stmt)).scalars().all()


async def function_of_deployment(
    session: AsyncSession, deployment_id: uuid.UUID
) -> uuid.UUID | None:
    """The function of a deployment, live or removed (while its history is kept)."""
    stmt = select(Deployment.function_id).where(Deployment.id == deployment_id)
    function_id = (await session.execute(stmt)).scalar_one_or_none()
    if function_id is None:
        removed = select(DeploymentHistory.function_id).where(DeploymentHistory.id == deployment_id)
        function_id = (await session.execute(removed)).scalar_one_or_none()
    return function_id


async def instance_counts(session: AsyncSession) -> Sequence[Any]:
    """(phase, cluster, desired, count) of the instances that are or may still be applied:
    one grouped count of the fleet (for `/metrics`, cached by its reader)."""
    stmt = (
        select(Instance.phase, Instance.cluster, Instance.desired, func.count())
        .where(or_(Instance.desired == InstanceDesired.PRESENT, Instance.applied.is_(True)))
        .group_by(Instance.phase, Instance.cluster, Instance.desired)
    )
    return (await session.execute(stmt)).all()


async def spec_revision(
    session: AsyncSession, spec_id: uuid.UUID, number: int
) -> SpecRevision | None:
    return await session.get(SpecRevision, (spec_id, number))


# --- the history of removed deployments (history.py) -------------------------------------------


async def history_entry(
    session: AsyncSession, account_id: str, deployment_id: uuid.UUID, now: datetime
) -> DeploymentHistory | None:
    """The caller's removed deployment, unless its history has expired."""
    row = await session.get(DeploymentHistory, deployment_id)
    if row is None or row.account_id != account_id or row.expires_at <= now:
        return None
    return row


async def history_of_version(
    session: AsyncSession,
    account_id: str,
    function_id: uuid.UUID,
    version_id: uuid.UUID,
    page: Page,
    now: datetime,
) -> tuple[list[DeploymentHistory], str | None]:
    """The caller's removed deployments of a version that have not expired, oldest first."""
    stmt = select(DeploymentHistory).where(
        DeploymentHistory.account_id == account_id,
        DeploymentHistory.version_id == version_id,
        DeploymentHistory.function_id == function_id,
        DeploymentHistory.expires_at > now,
    )
    return await keyset_page(
        session,
        stmt,
        page,
        created=DeploymentHistory.created_at,
        ident=DeploymentHistory.id,
        cursor_of=lambda h: (h.created_at, h.id),
    )


def _rowcount(result: object) -> int:
    return int(getattr(result, "rowcount", 0) or 0)


async def expired_history(session: AsyncSession, now: datetime, limit: int) -> list[uuid.UUID]:
    """Up to `limit` removed deployments whose history has expired, the oldest first."""
    stmt = (
        select(DeploymentHistory.id)
        .where(DeploymentHistory.expires_at <= now)
        .order_by(DeploymentHistory.expires_at)
        .limit(limit)
    )
    return list((await session.execute(stmt)).scalars())


async def delete_history_events(session: AsyncSession, ids: Sequence[uuid.UUID], limit: int) -> int:
    """Delete up to `limit` timeline entries of the deployments `ids`; how many."""
    some = (
        select(DeploymentEvent.id)
        .where(DeploymentEvent.deployment_id.in_(list(ids)))
        .limit(limit)
        .scalar_subquery()
    )
    result = await session.execute(
        delete(DeploymentEvent)
        .where(DeploymentEvent.id.in_(some))
        .execution_options(synchronize_session=False)
    )
    return _rowcount(result)


async def delete_history(session: AsyncSession, ids: Sequence[uuid.UUID], now: datetime) -> int:
    """Delete the expired history of the deployments `ids`, and the kept last lines of their
    failed instances (deployments/logs); how many histories."""
    result = await session.execute(
        delete(DeploymentHistory)
        .where(DeploymentHistory.id.in_(list(ids)), DeploymentHistory.expires_at <= now)
        .execution_options(synchronize_session=False)
    )
    await session.execute(
        delete(KeptLog)
        .where(KeptLog.deployment_id.in_(list(ids)))
        .execution_options(synchronize_session=False)
    )
    return _rowcount(result)


# --- a specification's revisions (revisions.py) ------------------------------------------------


async def revisions_of(session: AsyncSession, spec: DeploymentSpec) -> list[SpecRevision]:
    stmt = select(SpecRevision).where(SpecRevision.spec_id == spec.id).order_by(SpecRevision.number)
    return list((await session.execute(stmt)).scalars())


async def last_revision(session: AsyncSession, spec_id: uuid.UUID) -> int | None:
    """The number of the specification's latest revision (None: it has none)."""
    stmt = select(func.max(SpecRevision.number)).where(SpecRevision.spec_id == spec_id)
    last: int | None = (await session.execute(stmt)).scalar_one()
    return last


async def revision(session: AsyncSession, spec_id: uuid.UUID, number: int) -> SpecRevision | None:
    return await session.get(SpecRevision, (spec_id, number))


# --- the kept last lines of failed or restarted instances (logs/keep.py) -----------------------


async def forget_kept_log(session: AsyncSession, instance_id: uuid.UUID) -> None:
    await session.execute(delete(KeptLog).where(KeptLog.instance_id == instance_id))


async def kept_logs(session: AsyncSession, instance_ids: Sequence[uuid.UUID]) -> Sequence[KeptLog]:
    stmt = select(KeptLog).where(KeptLog.instance_id.in_(instance_ids))
    return (await session.execute(stmt)).scalars().all()


async def kept_log(session: AsyncSession, instance_id: uuid.UUID) -> KeptLog | None:
    """The lines kept of an instance's last failure or restart, if any."""
    return await session.get(KeptLog, instance_id)


# --- the instances quota's maintained count (usage.py) ------------------------------------------


async def live_specs_of_account(session: AsyncSession, account_id: str) -> Sequence[DeploymentSpec]:
    """The specifications of the account's deployments that are wanted (not being deleted)."""
    stmt = (
        select(DeploymentSpec)
        .join(Deployment, Deployment.id == DeploymentSpec.deployment_id)
        .where(
            Deployment.account_id == account_id,
            Deployment.desired == DeploymentDesired.DEPLOYED.value,
        )
    )
    return (await session.execute(stmt)).scalars().all()


async def add_deployed_instances(session: AsyncSession, account_id: str, delta: int) -> None:
    """Add `delta` to the account's deployed maxInstances (one atomic upsert)."""
    dialect = session.get_bind().dialect.name
    insert = pg_insert if dialect == "postgresql" else sqlite_insert
    stmt = insert(AccountInstances).values(account_id=account_id, deployed=delta)
    await session.execute(
        stmt.on_conflict_do_update(
            index_elements=[AccountInstances.account_id],
            set_={"deployed": AccountInstances.deployed + delta},
        )
    )


async def deployed_instances(session: AsyncSession, account_id: str) -> int | None:
    """The account's deployed maxInstances as kept (None: no row yet)."""
    stmt = select(AccountInstances.deployed).where(AccountInstances.account_id == account_id)
    deployed: int | None = await session.scalar(stmt)
    return deployed


async def max_instances_of(session: AsyncSession, spec_ids: Sequence[uuid.UUID]) -> int:
    """maxInstances summed over these specifications."""
    stmt = select(func.coalesce(func.sum(DeploymentSpec.max_instances), 0)).where(
        DeploymentSpec.id.in_(spec_ids)
    )
    return int((await session.execute(stmt)).scalar_one())


# --- the timeline (events.py) ------------------------------------------------------------------


def insert_events(session: Session, rows: list[dict[str, Any]]) -> None:
    """Write timeline entries in one multi-row INSERT (the session's commit is under way)."""
    session.execute(insert(DeploymentEvent), rows)


async def running_release_ids(session: AsyncSession) -> list[uuid.UUID]:
    """The canary releases the loop decides (RUNNING)."""
    rows = await session.scalars(select(CanaryRelease.id).where(CanaryRelease.phase == "RUNNING"))
    return list(rows)


async def canary_release(session: AsyncSession, release_id: uuid.UUID) -> CanaryRelease | None:
    return await session.get(CanaryRelease, release_id)


async def latest_release(session: AsyncSession, function_id: uuid.UUID) -> CanaryRelease | None:
    """The function's canary release under way, else its most recent one."""
    return (
        await session.scalars(
            select(CanaryRelease)
            .where(CanaryRelease.function_id == function_id)
            .order_by(CanaryRelease.active_function_id.is_(None), CanaryRelease.created_at.desc())
            .limit(1)
        )
    ).first()


# --------------------------------------------------------------------------- the export


async def deployed_of(
    session: AsyncSession, version_ids: Collection[uuid.UUID]
) -> Sequence[Row[str, uuid.UUID, uuid.UUID]]:
    """(account, function, version) of each of the versions that is deployed."""
    stmt = select(Deployment.account_id, Deployment.function_id, Deployment.version_id).where(
        Deployment.version_id.in_(list(version_ids)),
        Deployment.desired == DeploymentDesired.DEPLOYED,
    )
    return (await session.execute(stmt)).all()


async def instances_by_phase(
    session: AsyncSession, version_ids: Collection[uuid.UUID]
) -> Sequence[Row[uuid.UUID, str, int]]:
    """(version, phase, count) of the wanted instances of the versions' deployments."""
    stmt = (
        select(Deployment.version_id, Instance.phase, func.count(Instance.id))
        .join(Deployment, Deployment.id == Instance.deployment_id)
        .where(
            Deployment.version_id.in_(list(version_ids)),
            Deployment.desired == DeploymentDesired.DEPLOYED,
            Instance.desired == InstanceDesired.PRESENT,
        )
        .group_by(Deployment.version_id, Instance.phase)
    )
    return (await session.execute(stmt)).all()


async def leased_instances_of(
    session: AsyncSession, owner: str, phases: Collection[str], version_ids: Collection[uuid.UUID]
) -> Sequence[Row[uuid.UUID, str, uuid.UUID, uuid.UUID, uuid.UUID, str | None]]:
    """(instance, account, function, version, deployment, cluster) of the versions' applied
    instances in `phases` whose lease is `owner`'s."""
    stmt = (
        select(
            Instance.id,
            Instance.account_id,
            Deployment.function_id,
            Deployment.version_id,
            Deployment.id,
            Instance.cluster,
        )
        .join(Deployment, Deployment.id == Instance.deployment_id)
        .where(
            Deployment.version_id.in_(list(version_ids)),
            Instance.desired == InstanceDesired.PRESENT,
            Instance.applied.is_(True),
            Instance.cluster.is_not(None),
            Instance.phase.in_(list(phases)),
            Instance.lease_owner == owner,
        )
    )
    return (await session.execute(stmt)).all()
