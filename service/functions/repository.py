"""Every SQL statement of functions, their versions, tags, secrets and sharing grants
(service.py, sharing.py and secrets.py hold the use cases and the rules; the request's
transaction commits). Who may see what is decided by sharing.py, which hands the condition
in (`visible`)."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Select,
    and_,
    delete,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
)
from sqlalchemy.ext.asyncio import AsyncSession

from service.core.db import UTCDateTime, UUIDStr, for_update, mark_written, utcnow
from service.core.pagination import Page, keyset_page
from service.functions.models import (
    Function,
    FunctionAuthorization,
    FunctionSecret,
    FunctionVersion,
    VersionTag,
)

# --------------------------------------------------------------------------- functions


async def add_function(
    session: AsyncSession, account_id: str, below: int | None
) -> uuid.UUID | None:
    """Insert a new function of the account; with `below`, only while the account has fewer
    functions than that, counted by the insert itself (None: nothing inserted)."""
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


async def function_by_id(session: AsyncSession, function_id: uuid.UUID) -> Function | None:
    return await session.get(Function, function_id)


async def lock_function(session: AsyncSession, function_id: uuid.UUID) -> Function | None:
    """The function as it is now, no other writer of what is the function's as a whole (its
    traffic split) going on until the transaction ends."""
    stmt = for_update(select(Function).where(Function.id == function_id))
    return (await session.execute(stmt)).scalar_one_or_none()


async def count_functions(session: AsyncSession, account_id: str) -> int:
    stmt = select(func.count()).select_from(Function).where(Function.account_id == account_id)
    return int((await session.execute(stmt)).scalar_one())


async def function_ids(session: AsyncSession, visible: ColumnElement[bool]) -> list[uuid.UUID]:
    """The ids of the `visible` functions, oldest first."""
    stmt = select(Function.id).where(visible).order_by(Function.created_at, Function.id)
    return list((await session.execute(stmt)).scalars().all())


async def owned_function_ids(
    session: AsyncSession, account_id: str, function_ids: Collection[uuid.UUID]
) -> set[uuid.UUID]:
    """Those of the functions that the account owns (one query)."""
    stmt = select(Function.id).where(
        Function.id.in_(list(function_ids)), Function.account_id == account_id
    )
    return set((await session.execute(stmt)).scalars())


# --------------------------------------------------------------------------- versions


async def version_by_id(session: AsyncSession, version_id: uuid.UUID) -> FunctionVersion | None:
    return await session.get(FunctionVersion, version_id)


async def versions_by_id(
    session: AsyncSession, version_ids: Collection[uuid.UUID]
) -> dict[uuid.UUID, FunctionVersion]:
    """The versions of the ids that exist, by id (one query)."""
    ids = list(set(version_ids))
    if not ids:
        return {}
    stmt = select(FunctionVersion).where(FunctionVersion.id.in_(ids))
    return {v.id: v for v in (await session.execute(stmt)).scalars()}


def versions_with_ids(version_ids: Collection[uuid.UUID]) -> Select[uuid.UUID, uuid.UUID, str]:
    """A statement (composed by the deployments with the live deployments): the `id`,
    `function_id` and `status` of the versions of those ids that exist."""
    return select(FunctionVersion.id, FunctionVersion.function_id, FunctionVersion.status).where(
        FunctionVersion.id.in_(list(version_ids))
    )


async def lock_versions(
    session: AsyncSession, version_ids: Collection[uuid.UUID]
) -> dict[uuid.UUID, FunctionVersion]:
    """`lock_version` of each of `version_ids` that exists, by id (locked in id order, so two
    writers cannot deadlock)."""
    if not version_ids:
        return {}
    ids = sorted(set(version_ids))
    stmt = for_update(
        select(FunctionVersion).where(FunctionVersion.id.in_(ids)).order_by(FunctionVersion.id)
    )
    return {v.id: v for v in (await session.execute(stmt)).scalars()}


async def hold_versions(session: AsyncSession, version_ids: Collection[uuid.UUID]) -> None:
    """Keep the versions among `version_ids` from deletion until the transaction ends (`FOR
    SHARE` in id order; SQLite's write gate), so what is read of them next is what stays."""
    if version_ids:
        ids = sorted(set(version_ids))
        stmt = select(FunctionVersion.id).where(FunctionVersion.id.in_(ids))
        await session.execute(for_update(stmt.order_by(FunctionVersion.id), share=True))


async def lock_version(session: AsyncSession, version_id: uuid.UUID) -> FunctionVersion | None:
    """The version as it is now, no other writer changing it (or what is decided about it: a
    deploy, a rescale, its deletion) until the transaction ends; None if it does not exist."""
    stmt = for_update(select(FunctionVersion).where(FunctionVersion.id == version_id))
    return (await session.execute(stmt)).scalar_one_or_none()


async def statuses_of(
    session: AsyncSession, version_ids: Collection[uuid.UUID]
) -> dict[uuid.UUID, str]:
    """The stored status of each version that exists, by id (one query)."""
    ids = list(set(version_ids))
    if not ids:
        return {}
    stmt = select(FunctionVersion.id, FunctionVersion.status).where(FunctionVersion.id.in_(ids))
    return {vid: status for vid, status in (await session.execute(stmt)).all()}


async def count_versions_by_status(session: AsyncSession) -> dict[str, int]:
    """How many versions there are of each stored status, across every account."""
    stmt = select(FunctionVersion.status, func.count()).group_by(FunctionVersion.status)
    return {str(status): int(n) for status, n in await session.execute(stmt)}


async def owns_version(
    session: AsyncSession, account_id: str, function_id: uuid.UUID, version_id: uuid.UUID
) -> bool:
    """Whether the account owns this version of this function."""
    stmt = select(FunctionVersion.id).where(
        FunctionVersion.id == version_id,
        FunctionVersion.function_id == function_id,
        FunctionVersion.account_id == account_id,
    )
    return (await session.execute(stmt)).first() is not None


async def versions_of(session: AsyncSession, function_id: uuid.UUID) -> list[FunctionVersion]:
    """Every version of a function, oldest first (one query)."""
    stmt = (
        select(FunctionVersion)
        .where(FunctionVersion.function_id == function_id)
        .order_by(FunctionVersion.created_at, FunctionVersion.id)
    )
    return list((await session.execute(stmt)).scalars().all())


async def version_ids(session: AsyncSession, function_id: uuid.UUID) -> list[uuid.UUID]:
    """Every version id of a function, oldest first."""
    stmt = (
        select(FunctionVersion.id)
        .where(FunctionVersion.function_id == function_id)
        .order_by(FunctionVersion.created_at, FunctionVersion.id)
    )
    return list((await session.execute(stmt)).scalars().all())


async def count_versions(session: AsyncSession, function_id: uuid.UUID) -> int:
    stmt = (
        select(func.count())
        .select_from(FunctionVersion)
        .where(FunctionVersion.function_id == function_id)
    )
    return int((await session.execute(stmt)).scalar_one())


async def page_versions(
    session: AsyncSession,
    visible: ColumnElement[bool],
    page: Page,
    *,
    function_id: uuid.UUID | None = None,
    only: Collection[uuid.UUID] | None = None,
    name: str | None = None,
    status: Any = None,
    tag: str | None = None,
) -> tuple[Sequence[FunctionVersion], str | None]:
    """A page of the `visible` versions, oldest first, narrowed by the filters given."""
    stmt = select(FunctionVersion).where(visible)
    if function_id is not None:
        stmt = stmt.where(FunctionVersion.function_id == function_id)
    if only is not None:
        stmt = stmt.where(FunctionVersion.function_id.in_(list(only)))
    if name is not None:
        stmt = stmt.where(FunctionVersion.name == name)
    if status is not None:
        stmt = stmt.where(FunctionVersion.status == status)
    if tag is not None:
        stmt = stmt.where(
            FunctionVersion.id.in_(select(VersionTag.version_id).where(VersionTag.tag == tag))
        )
    return await keyset_page(
        session,
        stmt,
        page,
        created=FunctionVersion.created_at,
        ident=FunctionVersion.id,
        cursor_of=lambda v: (v.created_at, v.id),
    )


async def llm_versions(
    session: AsyncSession,
    visible: ColumnElement[bool],
    *,
    only: Collection[uuid.UUID] | None = None,
) -> Sequence[Any]:
    """(id, function id, account, models, created) of the `visible` LLM versions (of the
    functions `only`, when given), oldest first: the LLM gateway's model list."""
    stmt = (
        select(
            FunctionVersion.id,
            FunctionVersion.function_id,
            FunctionVersion.account_id,
            FunctionVersion.models,
            FunctionVersion.created_at,
        )
        .where(FunctionVersion.function_type == "LLM", visible)
        .order_by(FunctionVersion.created_at, FunctionVersion.id)
    )
    if only is not None:
        stmt = stmt.where(FunctionVersion.function_id.in_(list(only)))
    return (await session.execute(stmt)).all()


async def replace_tags(session: AsyncSession, version_id: uuid.UUID, tags: Sequence[str]) -> None:
    await session.execute(delete(VersionTag).where(VersionTag.version_id == version_id))
    session.add_all(VersionTag(version_id=version_id, tag=t) for t in tags)


async def delete_version(session: AsyncSession, version: FunctionVersion) -> None:
    """Delete a version (its secrets and tags go with it); the function goes with its last
    version."""
    function_id = version.function_id
    await session.delete(version)
    await session.flush()
    remaining = await session.scalar(
        select(FunctionVersion.id).where(FunctionVersion.function_id == function_id).limit(1)
    )
    if remaining is None:
        await session.execute(delete(Function).where(Function.id == function_id))


# --------------------------------------------------------------------------- secrets


async def secrets_of(session: AsyncSession, version_id: uuid.UUID) -> Sequence[FunctionSecret]:
    stmt = select(FunctionSecret).where(FunctionSecret.version_id == version_id)
    return (await session.execute(stmt)).scalars().all()


async def secrets_generations(
    session: AsyncSession, version_ids: Sequence[uuid.UUID]
) -> Sequence[Any]:
    """(version id, secrets generation) of the versions that exist."""
    stmt = select(FunctionVersion.id, FunctionVersion.secrets_generation).where(
        FunctionVersion.id.in_(list(version_ids))
    )
    return (await session.execute(stmt)).all()


async def secret_ciphertexts(
    session: AsyncSession, version_ids: Sequence[uuid.UUID]
) -> Sequence[Any]:
    """(version id, name, ciphertext) of the versions' secrets."""
    stmt = select(FunctionSecret.version_id, FunctionSecret.name, FunctionSecret.ciphertext).where(
        FunctionSecret.version_id.in_(list(version_ids))
    )
    return (await session.execute(stmt)).all()


# --------------------------------------------------------------------------- sharing


async def grants_of(session: AsyncSession, account_id: str) -> Sequence[Any]:
    """(function id, version id or None) of everything shared with the account."""
    stmt = select(FunctionAuthorization.function_id, FunctionAuthorization.version_id).where(
        FunctionAuthorization.account_id == account_id
    )
    return (await session.execute(stmt)).all()


async def is_shared(session: AsyncSession, account_id: str, version: FunctionVersion) -> bool:
    """Whether the version, or its whole function, is shared with the account."""
    shared = await session.scalar(
        select(FunctionAuthorization.id)
        .where(
            FunctionAuthorization.account_id == account_id,
            or_(
                and_(
                    FunctionAuthorization.function_id == version.function_id,
                    FunctionAuthorization.version_id.is_(None),
                ),
                FunctionAuthorization.version_id == version.id,
            ),
        )
        .limit(1)
    )
    return shared is not None


def _level(function_id: uuid.UUID, version_id: uuid.UUID | None) -> ColumnElement[bool]:
    """The grants of the whole function (`version_id` None) or of one version."""
    if version_id is None:
        return and_(
            FunctionAuthorization.function_id == function_id,
            FunctionAuthorization.version_id.is_(None),
        )
    return FunctionAuthorization.version_id == version_id


async def parties(
    session: AsyncSession, function_id: uuid.UUID, version_id: uuid.UUID | None
) -> list[str]:
    """The accounts of one level (the whole function, `version_id` None, or one version),
    sorted."""
    stmt = (
        select(FunctionAuthorization.account_id)
        .where(_level(function_id, version_id))
        .order_by(FunctionAuthorization.account_id)
    )
    return list((await session.execute(stmt)).scalars().all())


async def grants_of_function(session: AsyncSession, function_id: uuid.UUID) -> Sequence[Any]:
    """(version id or None, account) of every grant of a function, by account."""
    stmt = (
        select(FunctionAuthorization.version_id, FunctionAuthorization.account_id)
        .where(FunctionAuthorization.function_id == function_id)
        .order_by(FunctionAuthorization.account_id)
    )
    return (await session.execute(stmt)).all()


async def delete_parties(
    session: AsyncSession,
    function_id: uuid.UUID,
    version_id: uuid.UUID | None,
    account: str | None = None,
) -> None:
    """Delete a level's grants (of `account` only, when given)."""
    stmt = delete(FunctionAuthorization).where(_level(function_id, version_id))
    if account is not None:
        stmt = stmt.where(FunctionAuthorization.account_id == account)
    await session.execute(stmt)


#: the version columns invocation needs (never the whole row: secrets, objects, findings),
#: each labelled by its attribute: what a row of `invocable_versions` carries
_INVOCATION_COLUMNS = (
    FunctionVersion.id,
    FunctionVersion.function_id,
    FunctionVersion.account_id,
    FunctionVersion.name,
    FunctionVersion.status,
    FunctionVersion.inference_url,
    FunctionVersion.inference_port,
    FunctionVersion.helm_chart_service_name,
    FunctionVersion.container_image,
    FunctionVersion.health,
    FunctionVersion.rate_limit,
    FunctionVersion.function_type,
    FunctionVersion.models,
    FunctionVersion.tags,
    FunctionVersion.llm_invocation_config,
    FunctionVersion.telemetries,
)


def invocable_versions(
    account_id: str,
    function_id: uuid.UUID,
    version_id: uuid.UUID | None,
    granted: Collection[uuid.UUID] = (),
) -> Select[Any]:
    """A statement (composed by the invocation plane with the live deployments): the
    versions of a function an account may invoke — its own, and those shared with it (the
    whole function, or single versions) — all of them or the one asked for; only `granted`
    ones when any are named (an invocation token's grant)."""
    shared = exists().where(
        FunctionAuthorization.account_id == account_id,
        FunctionAuthorization.function_id == FunctionVersion.function_id,
        or_(
            FunctionAuthorization.version_id.is_(None),
            FunctionAuthorization.version_id == FunctionVersion.id,
        ),
    )
    stmt = select(*(c.label(c.key) for c in _INVOCATION_COLUMNS)).where(
        FunctionVersion.function_id == function_id,
        or_(FunctionVersion.account_id == account_id, shared),
    )
    if version_id is not None:
        stmt = stmt.where(FunctionVersion.id == version_id)
    if granted:
        stmt = stmt.where(FunctionVersion.id.in_(list(granted)))
    return stmt


# --------------------------------------------------------------------------- telemetries


async def telemetries_named(session: AsyncSession) -> dict[uuid.UUID, dict[str, Any]]:
    """Each version naming telemetries, with its `telemetries` (what the export follows)."""
    stmt = select(FunctionVersion.id, FunctionVersion.telemetries).where(
        FunctionVersion.telemetries.is_not(None)
    )
    return {
        vid: dict(named)
        for vid, named in (await session.execute(stmt)).all()
        if isinstance(named, dict)
    }


async def telemetry_users(
    session: AsyncSession, account_id: str, telemetry_id: uuid.UUID
) -> list[str]:
    """The account's versions naming the telemetry in their `telemetries`, as
    "function <id> version <id>" (NVCF scans them the same way: the ids are in a JSON field)."""
    stmt = (
        select(FunctionVersion.function_id, FunctionVersion.id, FunctionVersion.telemetries)
        .where(FunctionVersion.account_id == account_id, FunctionVersion.telemetries.is_not(None))
        .order_by(FunctionVersion.created_at, FunctionVersion.id)
    )
    wanted = str(telemetry_id)
    return [
        f"function {fid} version {vid}"
        for fid, vid, named in (await session.execute(stmt)).all()
        if isinstance(named, dict) and wanted in {str(v).lower() for v in named.values()}
    ]


async def naming_telemetry(
    session: AsyncSession, account_id: str, telemetry_id: uuid.UUID
) -> list[FunctionVersion]:
    """The account's versions naming the telemetry in their `telemetries`, as they are now,
    rows locked (in id order)."""
    stmt = for_update(
        select(FunctionVersion)
        .where(FunctionVersion.account_id == account_id, FunctionVersion.telemetries.is_not(None))
        .order_by(FunctionVersion.id)
    )
    wanted = str(telemetry_id)
    return [
        v
        for v in (await session.execute(stmt)).scalars().all()
        if isinstance(v.telemetries, dict)
        and wanted in {str(x).lower() for x in v.telemetries.values()}
    ]
