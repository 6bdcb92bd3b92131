"""Every SQL statement of registry credentials: the lookups, the count, the page, and the
credentials a pull may use (service.py holds the use cases; the request's transaction
commits)."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Sequence

from sqlalchemy import ColumnElement, exists, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from service.core.pagination import Page, keyset_page
from service.registry.models import (
    ArtifactType,
    ProvisionedBy,
    RegistryCredential,
    RegistryCredentialArtifactType,
)


async def find(
    session: AsyncSession, account_id: str, host: str, name: str
) -> RegistryCredential | None:
    """The account's credential named `name` for `host`, if any."""
    stmt = select(RegistryCredential).where(
        RegistryCredential.account_id == account_id,
        RegistryCredential.registry_hostname == host,
        RegistryCredential.name == name,
    )
    return (await session.execute(stmt)).scalar_one_or_none()


async def by_id(session: AsyncSession, credential_id: uuid.UUID) -> RegistryCredential | None:
    return await session.get(RegistryCredential, credential_id)


async def count(session: AsyncSession, account_id: str) -> int:
    stmt = (
        select(func.count())
        .select_from(RegistryCredential)
        .where(RegistryCredential.account_id == account_id)
    )
    return int((await session.execute(stmt)).scalar_one())


def _has_type(types: Iterable[ArtifactType]) -> ColumnElement[bool]:
    return exists().where(
        RegistryCredentialArtifactType.credential_id == RegistryCredential.id,
        RegistryCredentialArtifactType.artifact_type.in_([t.value for t in types]),
    )


async def page(
    session: AsyncSession,
    account_id: str,
    page: Page,
    *,
    artifact_types: Collection[ArtifactType] | None,
    provisioned_by: Collection[ProvisionedBy] | None,
) -> tuple[Sequence[RegistryCredential], str | None]:
    """A page of the account's credentials, oldest first: those with any of `artifact_types`
    and provisioned by any of `provisioned_by` (None: any)."""
    stmt = select(RegistryCredential).where(RegistryCredential.account_id == account_id)
    if artifact_types is not None:
        stmt = stmt.where(_has_type(artifact_types))
    if provisioned_by is not None:
        stmt = stmt.where(RegistryCredential.provisioned_by.in_([p.value for p in provisioned_by]))
    return await keyset_page(
        session,
        stmt,
        page,
        created=RegistryCredential.created_at,
        ident=RegistryCredential.id,
        cursor_of=lambda c: (c.created_at, c.id),
    )


async def of_type(
    session: AsyncSession,
    account_id: str,
    artifact_type: ArtifactType,
    *,
    hosts: Sequence[str] | None = None,
) -> Sequence[RegistryCredential]:
    """The account's `artifact_type` credentials (for one of `hosts`, when given), oldest
    first."""
    stmt = select(RegistryCredential).where(
        RegistryCredential.account_id == account_id, _has_type([artifact_type])
    )
    if hosts is not None:
        stmt = stmt.where(RegistryCredential.registry_hostname.in_(list(hosts)))
    stmt = stmt.order_by(RegistryCredential.created_at, RegistryCredential.id)
    return (await session.execute(stmt)).scalars().all()


async def delete(session: AsyncSession, credential: RegistryCredential) -> None:
    await session.delete(credential)
