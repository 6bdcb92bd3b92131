"""Function registry operations. Services flush; the request's transaction commits."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, insert, literal, select
from sqlalchemy.ext.asyncio import AsyncSession

from service.core.crypto import SecretBox
from service.core.db import UTCDateTime, UUIDStr, mark_written, utcnow
from service.core.errors import FieldError, NotFound, ValidationFailed
from service.core.events import Events
from service.core.pagination import Page, keyset_page
from service.functions import sharing
from service.functions.events import VersionDeleted
from service.functions.models import Function, FunctionSecret, FunctionVersion, VersionTag
from service.functions.validation import FunctionSpec, MetadataUpdate

STATUSES = ("ACTIVE", "DEPLOYING", "ERROR", "INACTIVE", "DEGRADED", "DEGRADING")


@dataclass(frozen=True)
class ListFilters:
    name: str | None = None
    status: str | None = None
    tag: str | None = None
    #: the caller's own functions (private), those shared with it (authorized)
    visibility: frozenset[str] = sharing.ALL_VISIBILITIES


def parse_status_filter(value: str | None) -> str | None:
    if value is None:
        return None
    upper = value.upper()
    if upper not in STATUSES:
        raise ValidationFailed.of(
            [FieldError("status", f"must be one of {', '.join(STATUSES)}, got '{value}'")]
        )
    return upper


async def create_version(
    session: AsyncSession,
    *,
    account_id: str,
    spec: FunctionSpec,
    box: SecretBox,
    function_id: uuid.UUID,
    new_function: bool = False,
    chart_digest: str | None = None,
    findings: list[dict[str, Any]] | None = None,
) -> FunctionVersion:
    """A new version of the caller's function `function_id`, or the first one of the function
    `add_function` has just inserted (`new_function`)."""
    now = utcnow()
    if not new_function:
        await get_function(session, account_id, function_id)
    version = FunctionVersion(
        id=uuid.uuid4(),
        function_id=function_id,
        account_id=account_id,
        name=spec.name,
        status="INACTIVE",
        inference_url=spec.inference_url,
        inference_port=spec.inference_port,
        container_image=spec.container_image,
        container_args=spec.container_args,
        container_environment=spec.container_environment,
        helm_chart=spec.helm_chart,
        helm_chart_service_name=spec.helm_chart_service_name,
        helm_chart_digest=chart_digest,
        models=spec.models,
        resources=spec.resources,
        api_body_format=spec.api_body_format,
        function_type=spec.function_type,
        health=spec.health,
        health_uri=spec.health_uri,
        description=spec.description,
        tags=spec.tags,
        rate_limit=spec.rate_limit,
        findings=findings,
        created_at=now,
        updated_at=now,
        secret_names=sorted(n for n, _ in spec.secrets),
    )
    session.add(version)
    session.add_all(
        FunctionSecret(version_id=version.id, name=n, ciphertext=box.encrypt(v))
        for n, v in spec.secrets
    )
    session.add_all(VersionTag(version_id=version.id, tag=t) for t in spec.tags)
    await session.flush()
    return version


async def add_function(
    session: AsyncSession, account_id: str, *, below: int | None = None
) -> uuid.UUID | None:
    """Insert a new function of the account and return its id. With `below`, only while the
    account has fewer functions than that, counted by the insert itself: the usual quota case
    costs no round trip of its own (None: nothing inserted, the caller counts under a lock)."""
    function_id, now = uuid.uuid4(), utcnow()
    row = select(literal(function_id, UUIDStr()), literal(account_id), literal(now, UTCDateTime()))
    if below is not None:
        owned = select(func.count()).select_from(Function).where(Function.account_id == account_id)
        row = row.where(owned.scalar_subquery() < below)
    inserted = await session.execute(
        insert(Function).from_select(["id", "account_id", "created_at"], row).returning(Function.id)
    )
    mark_written(session.sync_session)
    return function_id if inserted.first() is not None else None


async def count_functions(session: AsyncSession, account_id: str) -> int:
    stmt = select(func.count()).select_from(Function).where(Function.account_id == account_id)
    return int((await session.execute(stmt)).scalar_one())


async def count_versions(session: AsyncSession, function_id: uuid.UUID) -> int:
    stmt = (
        select(func.count())
        .select_from(FunctionVersion)
        .where(FunctionVersion.function_id == function_id)
    )
    return int((await session.execute(stmt)).scalar_one())


async def get_function(session: AsyncSession, account_id: str, function_id: uuid.UUID) -> Function:
    """The caller's own function, else 404 (also when it is only shared with the caller)."""
    fn = await session.get(Function, function_id)
    if fn is None or fn.account_id != account_id:
        raise NotFound(detail=f"function {function_id} not found")
    return fn


async def get_version(
    session: AsyncSession, account_id: str, function_id: uuid.UUID, version_id: uuid.UUID
) -> FunctionVersion:
    """The caller's own version, else 404: for changes (reads: `sharing.readable_version`)."""
    version = await session.get(FunctionVersion, version_id)
    if version is None or version.account_id != account_id or version.function_id != function_id:
        raise NotFound(detail=f"version {version_id} of function {function_id} not found")
    return version


async def check_listable(session: AsyncSession, account_id: str, function_id: uuid.UUID) -> None:
    """404 unless the caller owns the function or some of it is shared with it."""
    fn = await session.get(Function, function_id)
    if fn is not None and fn.account_id == account_id:
        return
    if fn is None or not (await sharing.grants_of(session, account_id)).any_of(function_id):
        raise NotFound(detail=f"function {function_id} not found")


async def list_versions(
    session: AsyncSession,
    account_id: str,
    *,
    filters: ListFilters,
    page: Page,
    function_id: uuid.UUID | None = None,
    only: frozenset[uuid.UUID] | None = None,
) -> tuple[Sequence[FunctionVersion], str | None]:
    """The versions the caller may list: its own and those shared with it, as `filters` ask
    (`only`: of these functions, for a key limited to them)."""
    grants = (
        await sharing.grants_of(session, account_id)
        if sharing.AUTHORIZED in filters.visibility
        else sharing.Grants()
    )
    stmt = select(FunctionVersion).where(
        sharing.visible_versions(account_id, grants, filters.visibility)
    )
    if function_id is not None:
        stmt = stmt.where(FunctionVersion.function_id == function_id)
    if only is not None:
        stmt = stmt.where(FunctionVersion.function_id.in_(list(only)))
    if filters.name is not None:
        stmt = stmt.where(FunctionVersion.name == filters.name)
    if filters.status is not None:
        stmt = stmt.where(FunctionVersion.status == filters.status)
    if filters.tag is not None:
        stmt = stmt.where(
            FunctionVersion.id.in_(
                select(VersionTag.version_id).where(VersionTag.tag == filters.tag)
            )
        )
    return await keyset_page(
        session,
        stmt,
        page,
        created=FunctionVersion.created_at,
        ident=FunctionVersion.id,
        cursor_of=lambda v: (v.created_at, v.id),
    )


async def list_function_ids(
    session: AsyncSession, account_id: str, visibility: frozenset[str] = sharing.ALL_VISIBILITIES
) -> list[uuid.UUID]:
    grants = (
        await sharing.grants_of(session, account_id)
        if sharing.AUTHORIZED in visibility
        else sharing.Grants()
    )
    stmt = (
        select(Function.id)
        .where(sharing.visible_functions(account_id, grants, visibility))
        .order_by(Function.created_at, Function.id)
    )
    return list((await session.execute(stmt)).scalars().all())


async def version_ids(session: AsyncSession, function_id: uuid.UUID) -> list[uuid.UUID]:
    """Every version of a function, oldest first."""
    stmt = (
        select(FunctionVersion.id)
        .where(FunctionVersion.function_id == function_id)
        .order_by(FunctionVersion.created_at, FunctionVersion.id)
    )
    return list((await session.execute(stmt)).scalars().all())


async def update_metadata(
    session: AsyncSession,
    account_id: str,
    function_id: uuid.UUID,
    version_id: uuid.UUID,
    update: MetadataUpdate,
) -> FunctionVersion:
    version = await get_version(session, account_id, function_id, version_id)
    if update.tags is not None:
        version.tags = update.tags
        await session.execute(delete(VersionTag).where(VersionTag.version_id == version.id))
        session.add_all(VersionTag(version_id=version.id, tag=t) for t in update.tags)
    if update.description is not None:
        version.description = update.description
    if update.rate_limit is not None:
        version.rate_limit = update.rate_limit
    version.updated_at = utcnow()
    await session.flush()
    return version


async def delete_version(
    session: AsyncSession,
    account_id: str,
    function_id: uuid.UUID,
    version_id: uuid.UUID,
    *,
    events: Events,
) -> None:
    """Delete a version and its secrets; the function goes with its last version.

    `VersionDeleted` is announced first (deployments marks the version's live deployment
    `deleting`: it outlives the version row, and the reconciler tears its instances down).
    """
    version = await get_version(session, account_id, function_id, version_id)
    await events.publish(session, VersionDeleted(version_id))
    await session.delete(version)
    await session.flush()
    remaining = await session.scalar(
        select(FunctionVersion.id).where(FunctionVersion.function_id == function_id).limit(1)
    )
    if remaining is None:
        await session.execute(delete(Function).where(Function.id == function_id))
