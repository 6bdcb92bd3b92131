"""Deployment commands: record desired state, scale it, tear it down; the use cases the routes
call (`deploy`, `rescale`, `patch_spec`, `delete`).

A deploy validates every specification (catalog resolution; for helm functions a re-render of
the pinned chart with each specification's configuration), then records the desired state and
wakes the reconciler after the commit. Concurrent deploys of one version serialise on an
in-process lock and on the version row (`FOR UPDATE` on PostgreSQL); the partial unique index
`uq_deployments_live_version` is the last line (409).

Services flush; the request's transaction commits. Nothing here calls a backend: the reconciler
converges instances to what is stored and is woken after the commit. Lookups are in
`repository.py`, the API objects in `views.py`.
"""

from __future__ import annotations

import asyncio
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.limits import account_quota
from service.auth.repository import lock_account
from service.auth.service import Principal
from service.charts.pipeline import ChartPipeline
from service.clusters.catalog import Catalog
from service.core.db import after_commit, utcnow
from service.core.errors import BadRequest, Conflict, FieldError, ValidationFailed
from service.core.events import Events
from service.core.quotas import Quotas
from service.deployments import rendering, repository, revisions, transitions, usage
from service.deployments.announcements import DeploymentDeleted
from service.deployments.autoscale.policy import PLATFORM, custom_policy, platform_policy
from service.deployments.models import (
    Deployment,
    DeploymentSpec,
)
from service.deployments.schemas import SPECS
from service.deployments.validation import (
    ScalingChange,
    StoredSpec,
    ValidatedSpec,
    revision_change,
    stored_capacity_errors,
    stored_policy_errors,
    validate_create,
    validate_patch,
    validate_update,
)
from service.deployments.workload import container_objects
from service.functions import service as functions_service
from service.functions.models import FunctionVersion
from service.health.status import SpecProgress, VersionStatus, next_status


@dataclass
class SpecObjects:
    """A validated specification with the objects it will install."""

    spec: ValidatedSpec
    objects: list[dict[str, Any]]


def initial_status(specs: Iterable[ValidatedSpec]) -> VersionStatus:
    """DEPLOYING, or ACTIVE at once when every minInstances is 0 (runtime.md §6)."""
    progress = [SpecProgress(min_instances=s.min_instances, running=0) for s in specs]
    return next_status(VersionStatus.INACTIVE, deployed=True, specs=progress)


async def create_deployment(
    session: AsyncSession,
    *,
    version: FunctionVersion,
    specs: Sequence[SpecObjects],
    feature_flags: dict[str, bool],
    by: str | None = None,
) -> Deployment:
    """Store the deployment and its specifications, move the version out of INACTIVE and
    record the validation and dispatch events. The caller checked the version is INACTIVE
    without a live deployment; the partial unique index refuses a second live one."""
    now = utcnow()
    deployment = Deployment(
        id=uuid.uuid4(),
        account_id=version.account_id,
        function_id=version.function_id,
        version_id=version.id,
        function_name=version.name,
        feature_flags=dict(feature_flags),
        generation=1,
        created_at=now,
        updated_at=now,
    )
    deployment.specs = [
        DeploymentSpec(
            id=uuid.uuid4(),
            position=position,
            gpu=item.spec.target.gpu,
            instance_type=item.spec.target.instance_type.name,
            backend=item.spec.target.group.name,
            clusters=item.spec.clusters,
            regions=item.spec.regions,
            attributes=item.spec.attributes,
            availability_zones=item.spec.availability_zones,
            candidate_clusters=[c.name for c in item.spec.target.clusters],
            min_instances=item.spec.min_instances,
            max_instances=item.spec.max_instances,
            max_request_concurrency=item.spec.max_request_concurrency,
            preferred_order=item.spec.preferred_order,
            configuration=item.spec.configuration,
            helm_validation_policy=item.spec.helm_validation_policy,
            objects=item.objects,
        )
        for position, item in enumerate(specs)
    ]
    summary = "; ".join(
        f"{s.gpu} {s.instance_type} on {s.backend} "
        f"(min {s.min_instances}, max {s.max_instances}; "
        f"clusters {', '.join(s.candidate_clusters)})"
        for s in deployment.specs
    )
    n = len(deployment.specs)
    await transitions.deploy(
        session,
        deployment,
        version,
        initial_status(s.spec for s in specs),
        now,
        validated=f"{n} GPU specification{'s' if n != 1 else ''} validated: {summary}",
        by=by,
    )
    await session.flush()
    return deployment


def stored_spec(spec: DeploymentSpec) -> StoredSpec:
    """The stored specification as PUT/PATCH validation compares it (API field names)."""
    return StoredSpec(
        id=spec.id,
        min_instances=spec.min_instances,
        max_instances=spec.max_instances,
        max_request_concurrency=spec.max_request_concurrency,
        fixed={
            "gpu": spec.gpu,
            "instanceType": spec.instance_type,
            "backend": spec.backend,
            "clusters": spec.clusters,
            "regions": spec.regions,
            "attributes": spec.attributes,
            "availabilityZones": spec.availability_zones,
            "preferredOrder": spec.preferred_order,
            "configuration": spec.configuration,
            "helmValidationPolicy": spec.helm_validation_policy,
        },
        candidate_clusters=tuple(str(c) for c in spec.candidate_clusters or ()),
        autoscaling_policy=spec.autoscaling_policy,
        autoscaling_configuration=spec.autoscaling_configuration,
    )


def _set_autoscaling(
    spec: DeploymentSpec, policy: str, configuration: dict[str, Any] | None
) -> list[str]:
    """Store a specification's autoscaling policy; what changed, for the timeline."""
    before = spec.autoscaling_policy or PLATFORM
    if before == policy and spec.autoscaling_configuration == configuration:
        return []
    spec.autoscaling_policy = policy
    spec.autoscaling_configuration = configuration
    described = f"autoscalingConfigurationPolicy {before} → {policy}"
    if configuration is not None:
        described += f" ({custom_policy(configuration, platform_policy()).describe()})"
    return [described]


async def apply_scaling(
    session: AsyncSession,
    deployment: Deployment,
    changes: Sequence[ScalingChange],
    version: FunctionVersion | None,
) -> bool:
    """Apply new scaling values; bump the generation, record a `scaling` event and recompute
    the version status when something changed. Returns whether anything changed."""
    specs = {s.id: s for s in deployment.specs}
    described: list[str] = []
    max_before = sum(s.max_instances for s in deployment.specs)
    for change in changes:
        spec = specs[change.spec_id]
        parts: list[str] = []
        for attr, label, value in (
            ("min_instances", "minInstances", change.min_instances),
            ("max_instances", "maxInstances", change.max_instances),
            ("max_request_concurrency", "maxRequestConcurrency", change.max_request_concurrency),
        ):
            old = getattr(spec, attr)
            if value is not None and value != old:
                setattr(spec, attr, value)
                parts.append(f"{label} {old} → {value}")
        if change.autoscaling is not None:
            parts += _set_autoscaling(spec, *change.autoscaling)
        if parts:
            described.append(f"{spec.gpu} {spec.instance_type} ({spec.id}): " + ", ".join(parts))
    if not described:
        return False
    now = utcnow()
    added = sum(s.max_instances for s in deployment.specs) - max_before
    await transitions.rescale(deployment, session, "; ".join(described), now, added_max=added)
    if version is not None:
        running = await repository.running_counts(session, deployment.id)
        progress = [
            SpecProgress(min_instances=s.min_instances, running=running.get(s.id, 0))
            for s in deployment.specs
        ]
        status = next_status(transitions.status_of(version), deployed=True, specs=progress)
        await transitions.set_version_status(
            session, deployment.id, version, status, now, cause="scaling"
        )
    await session.flush()
    return True


async def undeploy(
    session: AsyncSession,
    deployment: Deployment,
    version: FunctionVersion | None,
    *,
    message: str = "deployment deleted; instances will be torn down",
    drain: bool = False,
) -> None:
    """Mark the deployment `deleting` (the reconciler tears its instances down and removes it)
    and turn the version INACTIVE at once; `drain`: Running instances first finish their
    requests in flight and queued (graceful)."""
    await transitions.undeploy(session, deployment, version, utcnow(), message=message, drain=drain)
    await session.flush()


async def undeploy_version(
    session: AsyncSession, version_id: uuid.UUID, *, message: str
) -> Deployment | None:
    """Mark the version's live deployment (if any) `deleting`; for a version being deleted.
    The deployment row outlives the version row (no foreign key)."""
    deployment = await repository.live_deployment(session, version_id, locked=True)
    if deployment is not None:
        await undeploy(session, deployment, None, message=message)
    return deployment


#: a version's deployment (the routes' path), named in errors
_BY_VERSION = "/deployments/functions/{functionId}/versions/{functionVersionId}"

# --- the deploy use case -----------------------------------------------------------------------


@dataclass(frozen=True)
class Deploying:
    """What changing a deployment uses besides the request's session (deps.py: DeployingDep)."""

    catalog: Catalog
    pipeline: ChartPipeline
    quotas: Quotas
    events: Events
    #: wakes the reconciler: run after the commit (core.db.after_commit)
    wake: Callable[[], None]


_locks: weakref.WeakValueDictionary[uuid.UUID, asyncio.Lock] = weakref.WeakValueDictionary()


@asynccontextmanager
async def _version_lock(version_id: uuid.UUID) -> AsyncIterator[None]:
    """Serialise deploys of one version within this process (SQLite has no row locks)."""
    lock = _locks.get(version_id)
    if lock is None:
        lock = asyncio.Lock()
        _locks[version_id] = lock
    async with lock:
        yield


def _check_deployable(version: FunctionVersion, live: Deployment | None) -> None:
    if live is not None:
        raise BadRequest(
            detail=f"version {version.id} is {version.status} and already has deployment "
            f"{live.id}; delete that deployment first (DELETE {_BY_VERSION}), or change its "
            "scaling with PUT or PATCH"
        )
    if version.status != VersionStatus.INACTIVE:
        raise BadRequest(
            detail=f"version {version.id} is {version.status}; only an INACTIVE version can be "
            "deployed — delete its deployment first"
        )


async def _helm_objects(
    deps: Deploying,
    session: AsyncSession,
    principal: Principal,
    version: FunctionVersion,
    specs: list[ValidatedSpec],
) -> tuple[list[SpecObjects], dict[str, bool]]:
    """Re-render the pinned chart for every specification; all errors of all specs → 400."""
    errors: list[FieldError] = []
    out: list[SpecObjects] = []
    flags: dict[str, bool] = {}
    for spec in specs:
        result, found = await rendering.render(
            deps.pipeline,
            session,
            principal,
            version,
            clusters=spec.target.clusters,
            instance_type=spec.target.instance_type,
            configuration=spec.configuration,
            policy=spec.policy,
            path=f"{spec.path}.",
        )
        errors += found
        if not found:
            out.append(SpecObjects(spec, result.objects))
            flags.update(result.workload_config)
    if errors:
        raise ValidationFailed.of(errors, what="deployment")
    return out, flags


async def _objects(
    deps: Deploying,
    session: AsyncSession,
    principal: Principal,
    version: FunctionVersion,
    specs: list[ValidatedSpec],
) -> tuple[list[SpecObjects], dict[str, bool]]:
    if version.helm_chart is not None:
        return await _helm_objects(deps, session, principal, version, specs)
    return [
        SpecObjects(
            spec, container_objects(version, spec.target.instance_type, spec.target.clusters[0])
        )
        for spec in specs
    ], {}


async def instances_quota(
    deps: Deploying,
    session: AsyncSession,
    principal: Principal,
    replaced: Sequence[StoredSpec],
    new_max: Sequence[int],
) -> None:
    """The account's instances quota (maxInstances of its live deployments), when a change
    adds instances; `replaced` specifications are counted with their new values."""
    if sum(new_max) <= sum(s.max_instances for s in replaced):
        return
    quota = await account_quota(session, deps.quotas.instances, principal.account_id)
    await quota.check(
        lambda: usage.deployed_instances(
            session, principal.account_id, excluding=[s.id for s in replaced]
        ),
        lambda: lock_account(session, principal.account_id),
        sum(new_max),
    )


async def check_scaling(
    deps: Deploying,
    session: AsyncSession,
    principal: Principal,
    stored: Sequence[StoredSpec],
    changes: Sequence[ScalingChange],
    body_list: str | None,
) -> None:
    """New scaling values within what the clusters could hold, and within the quota."""
    catalog = deps.catalog
    by_id = {s.id: s for s in stored}
    errors: list[FieldError] = []
    for i, change in enumerate(changes):
        path = f"{body_list}[{i}]" if body_list else ""
        errors += stored_capacity_errors(catalog, by_id[change.spec_id], change, path)
        errors += stored_policy_errors(catalog, by_id[change.spec_id], change, path)
    if errors:
        raise ValidationFailed.of(errors)
    replaced = [by_id[c.spec_id] for c in changes]
    new_max = [
        c.max_instances if c.max_instances is not None else by_id[c.spec_id].max_instances
        for c in changes
    ]
    await instances_quota(deps, session, principal, replaced, new_max)


async def deploy(
    session: AsyncSession,
    deps: Deploying,
    principal: Principal,
    function_id: uuid.UUID,
    version_id: uuid.UUID,
    body: Any,
) -> Deployment:
    """Deploy a version: validate every specification of `body` (catalog resolution; for a
    helm function a re-render of the pinned chart per specification), check the instances
    quota, record the desired state and commit (inside the version's lock, so the next deploy
    of it sees this one); the reconciler is woken after the commit."""
    fid, vid = function_id, version_id
    version = await functions_service.get_version(session, principal.account_id, fid, vid)
    _check_deployable(version, await repository.live_deployment(session, vid))
    specs = validate_create(
        body,
        catalog=deps.catalog,
        is_helm=version.helm_chart is not None,
        is_grpc=version.inference_url.strip("/").lower() == "grpc",
    )
    objects, flags = await _objects(deps, session, principal, version, specs)
    async with _version_lock(vid):
        version = await repository.lock_version(session, principal.account_id, fid, vid)
        _check_deployable(version, await repository.live_deployment(session, vid))
        await instances_quota(deps, session, principal, [], [s.max_instances for s in specs])
        try:
            deployment = await create_deployment(
                session,
                version=version,
                specs=objects,
                feature_flags=flags,
                by=revisions.principal_name(principal),
            )
        except IntegrityError:
            raise Conflict(
                detail=f"a deployment for version {vid} already exists (created concurrently)"
            ) from None
        after_commit(session, deps.wake)
        # Commit inside the lock so the next deploy of this version sees this one.
        await session.commit()
    return deployment


async def rescale(
    session: AsyncSession,
    deps: Deploying,
    principal: Principal,
    function_id: uuid.UUID,
    version_id: uuid.UUID,
    body: Any,
) -> Deployment:
    """Change the scaling of the version's deployment's specifications (`PUT`); the reconciler
    is woken after the commit when anything changed."""
    account = principal.account_id
    # the version first, as a delete locks it: the deployment is then read as it is now
    version = await repository.lock_version(session, account, function_id, version_id)
    deployment = await repository.get_version_deployment(
        session, account, function_id, version_id, locked=True
    )
    stored = [stored_spec(s) for s in deployment.specs]
    changes = validate_update(body, stored)
    await check_scaling(deps, session, principal, stored, changes, SPECS)
    if await apply_scaling(session, deployment, changes, version):
        after_commit(session, deps.wake)
    return deployment


async def patch_spec(
    session: AsyncSession,
    deps: Deploying,
    principal: Principal,
    deployment_id: str,
    spec_id: str,
    body: Any,
) -> tuple[Deployment, DeploymentSpec]:
    """Change one specification's scaling, autoscaling policy or configuration (a new
    revision, rendered and checked as at deploy); every violation in one 400."""
    deployment, spec = await repository.live_spec(session, principal, deployment_id, spec_id)
    version = await repository.lock_version(
        session, principal.account_id, deployment.function_id, deployment.version_id
    )
    stored = stored_spec(spec)
    change = validate_patch(body, stored, is_helm=version.helm_chart is not None)
    revision = revision_change(body)
    errors: list[FieldError] = []
    rendered: tuple[dict[str, Any] | None, dict[str, Any] | None, list[Any]] | None = None
    if revision is not None:
        configuration, policy, objects, errors = await rendering.revision_objects(
            deps.pipeline, deps.catalog, session, principal, version, spec, revision
        )
        rendered = (configuration, policy, objects)
    try:
        await check_scaling(deps, session, principal, [stored], [change], None)
    except ValidationFailed as exc:
        errors = list(exc.errors or []) + errors
    if errors:
        raise ValidationFailed.of(errors, what="GPU specification update")
    changed = await apply_scaling(session, deployment, [change], version)
    if rendered is not None:
        configuration, policy, objects = rendered
        added = await revisions.new_revision(
            session,
            deployment,
            spec,
            configuration=configuration,
            helm_validation_policy=policy,
            objects=objects,
            by=revisions.principal_name(principal),
        )
        changed = changed or added is not None
    if changed:
        after_commit(session, deps.wake)
    return deployment, spec


async def delete(
    session: AsyncSession,
    deps: Deploying,
    principal: Principal,
    function_id: uuid.UUID,
    version_id: uuid.UUID,
    *,
    graceful: bool,
) -> FunctionVersion:
    """Undeploy the version (`graceful`: no new requests, those in flight and queued finish
    first); the reconciler is woken after the commit and `DeploymentDeleted` announced."""
    account = principal.account_id
    version = await repository.lock_version(session, account, function_id, version_id)
    deployment = await repository.get_version_deployment(
        session, account, function_id, version_id, locked=True
    )
    if graceful:
        message = (
            "deployment deleted (graceful): the version takes no new requests; instances "
            "finish the requests in flight and queued, then are torn down"
        )
    else:
        message = "deployment deleted (immediate); instances will be torn down"
    await undeploy(session, deployment, version, message=message, drain=graceful)
    after_commit(session, deps.wake)
    # the invocation plane of this process refuses new requests at once (others: route cache)
    await deps.events.publish(session, DeploymentDeleted(version_id))
    return version


async def hold_deployments(session: AsyncSession, account_id: str, held: bool, why: str) -> int:
    """Hold the account's deployments at zero instances (its suspension) or let them back."""
    return await transitions.hold_account(session, account_id, held, utcnow(), reason=why)
