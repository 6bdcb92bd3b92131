"""Functions shared with other accounts (NVCF's authorized parties), and who may read what.

A function belongs to the account that created it. Its owner may share it with other accounts
(`authorize_clients` routes, sharing_router.py): the whole function (every version, later ones
included) or single versions. An account a version is shared with may read it (`can_read`),
sees it in its lists with `visibility=authorized`, and nothing else: updating, deploying,
undeploying, deleting and sharing stay with the owner (their lookups are the owner-only
`service.get_function` / `get_version`, a 404 for anyone else, as in NVCF). It may also
invoke what is shared with it: the invocation plane resolves the caller's own and shared
versions in one query (invocation/access.py: `visible_versions`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import ColumnElement, false, or_
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from service.core.db import utcnow
from service.core.errors import Conflict, FieldError, NotFound, ValidationFailed
from service.functions import repository
from service.functions.models import Function, FunctionAuthorization, FunctionVersion

PRIVATE, AUTHORIZED, PUBLIC = "private", "authorized", "public"
#: the `visibility` values of the function lists (NVCF's VisibilityEnum); the default is all.
#: No function of this service is public (NVCF's are made so by NVIDIA's operators only).
VISIBILITIES = (PRIVATE, AUTHORIZED, PUBLIC)
ALL_VISIBILITIES = frozenset(VISIBILITIES)
#: accounts a function, or a version, may be shared with
MAX_AUTHORIZED_PARTIES = 100


def parse_visibility(values: Sequence[str] | None) -> frozenset[str]:
    """`visibility` given once as a comma-separated list or repeated, any case; 400 for an
    unknown value."""
    items = {v.strip().lower() for value in values or () for v in value.split(",") if v.strip()}
    unknown = sorted(items - ALL_VISIBILITIES)
    if unknown:
        raise ValidationFailed.of(
            [
                FieldError(
                    "visibility",
                    f"must be one or more of {', '.join(VISIBILITIES)} (comma-separated), "
                    f"got '{unknown[0]}'",
                )
            ]
        )
    return frozenset(items) or ALL_VISIBILITIES


# --- the read side ------------------------------------------------------------------------


@dataclass(frozen=True)
class Grants:
    """What is shared with one account: whole functions, and single versions (with the
    functions they belong to)."""

    functions: frozenset[uuid.UUID] = frozenset()
    versions: frozenset[uuid.UUID] = frozenset()
    functions_of_versions: frozenset[uuid.UUID] = frozenset()

    def any_of(self, function_id: uuid.UUID) -> bool:
        """Whether anything of the function is shared."""
        return function_id in self.functions or function_id in self.functions_of_versions


async def grants_of(session: AsyncSession, account_id: str) -> Grants:
    rows = await repository.grants_of(session, account_id)
    return Grants(
        functions=frozenset(f for f, v in rows if v is None),
        versions=frozenset(v for _, v in rows if v is not None),
        functions_of_versions=frozenset(f for f, v in rows if v is not None),
    )


def visible_versions(
    account_id: str, grants: Grants, visibility: frozenset[str]
) -> ColumnElement[bool]:
    """The versions `account_id` lists with `visibility`: its own (private), those shared with
    it (authorized)."""
    clauses: list[ColumnElement[bool]] = []
    if PRIVATE in visibility:
        clauses.append(FunctionVersion.account_id == account_id)
    if AUTHORIZED in visibility and grants.functions:
        clauses.append(FunctionVersion.function_id.in_(grants.functions))
    if AUTHORIZED in visibility and grants.versions:
        clauses.append(FunctionVersion.id.in_(grants.versions))
    return or_(*clauses) if clauses else false()


def visible_functions(
    account_id: str, grants: Grants, visibility: frozenset[str]
) -> ColumnElement[bool]:
    """The functions `account_id` lists with `visibility` (any of whose versions it may see)."""
    clauses: list[ColumnElement[bool]] = []
    if PRIVATE in visibility:
        clauses.append(Function.account_id == account_id)
    shared = grants.functions | grants.functions_of_versions
    if AUTHORIZED in visibility and shared:
        clauses.append(Function.id.in_(shared))
    return or_(*clauses) if clauses else false()


async def can_read(session: AsyncSession, account_id: str, version: FunctionVersion) -> bool:
    """Whether `account_id` may read (and invoke) `version`: it owns it, or the function or
    this version is shared with it."""
    if version.account_id == account_id:
        return True
    return await repository.is_shared(session, account_id, version)


async def readable_version(
    session: AsyncSession, account_id: str, function_id: uuid.UUID, version_id: uuid.UUID
) -> FunctionVersion:
    """The version if `account_id` may read it, else 404 (existence is never revealed)."""
    version = await repository.version_by_id(session, version_id)
    if (
        version is None
        or version.function_id != function_id
        or not await can_read(session, account_id, version)
    ):
        raise NotFound(detail=f"version {version_id} of function {function_id} not found")
    return version


# --- the owner's side: who a function or a version is shared with --------------------------


def _where(function_id: uuid.UUID, version_id: uuid.UUID | None) -> str:
    return (
        f"function {function_id}"
        if version_id is None
        else f"version {version_id} of function {function_id}"
    )


async def parties(
    session: AsyncSession, function_id: uuid.UUID, version_id: uuid.UUID | None
) -> list[str]:
    """The accounts the whole function (`version_id` None), or this version itself, is shared
    with, sorted."""
    return await repository.parties(session, function_id, version_id)


async def parties_by_version(
    session: AsyncSession, function_id: uuid.UUID
) -> dict[uuid.UUID | None, list[str]]:
    """Every grant of a function in one query: by version id, None for the whole function."""
    out: dict[uuid.UUID | None, list[str]] = {}
    for version_id, account in await repository.grants_of_function(session, function_id):
        out.setdefault(version_id, []).append(account)
    return out


def merged(by_version: dict[uuid.UUID | None, list[str]], version_id: uuid.UUID) -> list[str]:
    """Who may read a version: the whole function's accounts and the version's own."""
    return sorted({*by_version.get(None, ()), *by_version.get(version_id, ())})


async def _insert(
    session: AsyncSession,
    function_id: uuid.UUID,
    version_id: uuid.UUID | None,
    accounts: Iterable[str],
) -> None:
    now = utcnow()
    session.add_all(
        FunctionAuthorization(
            function_id=function_id, version_id=version_id, account_id=a, created_at=now
        )
        for a in accounts
    )
    try:
        await session.flush()
    except IntegrityError:
        raise Conflict(
            detail=f"the authorizations of {_where(function_id, version_id)} were changed "
            "concurrently; read them and try again"
        ) from None


async def replace(
    session: AsyncSession,
    function_id: uuid.UUID,
    version_id: uuid.UUID | None,
    accounts: Sequence[str],
) -> list[str]:
    """Share the whole function (or one version) with exactly `accounts` (NVCF: the request
    overwrites the level's authorized accounts)."""
    await repository.delete_parties(session, function_id, version_id)
    await _insert(session, function_id, version_id, accounts)
    return sorted(accounts)


async def add(
    session: AsyncSession, function_id: uuid.UUID, version_id: uuid.UUID | None, account: str
) -> list[str]:
    """Add one account to a level that already has some (NVCF: 404 when it has none, 409 when
    the account is there)."""
    current = await parties(session, function_id, version_id)
    where = _where(function_id, version_id)
    if not current:
        raise NotFound(
            detail=f"{where} is not shared with any account yet; share it first (POST without /add)"
        )
    if account in current:
        raise Conflict(detail=f"{where} is already shared with account '{account}'")
    if len(current) >= MAX_AUTHORIZED_PARTIES:
        raise ValidationFailed.of(
            [
                FieldError(
                    "authorizedParty.ncaId",
                    f"{where} is already shared with {len(current)} accounts, the most allowed",
                )
            ]
        )
    await _insert(session, function_id, version_id, [account])
    return sorted([*current, account])


async def remove(
    session: AsyncSession, function_id: uuid.UUID, version_id: uuid.UUID | None, account: str
) -> list[str]:
    """Remove one account from a level (NVCF: 404 when the level has none, or not this one)."""
    current = await parties(session, function_id, version_id)
    where = _where(function_id, version_id)
    if not current:
        raise NotFound(detail=f"{where} is not shared with any account")
    if account not in current:
        raise NotFound(detail=f"{where} is not shared with account '{account}'")
    await repository.delete_parties(session, function_id, version_id, account)
    return [a for a in current if a != account]


async def clear(
    session: AsyncSession, function_id: uuid.UUID, version_id: uuid.UUID | None
) -> None:
    """Unshare a level; a version's own grants stay when the whole function's are cleared."""
    await repository.delete_parties(session, function_id, version_id)
