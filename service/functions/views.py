"""Read models of the function registry: function objects as a caller sees them, with the
`activeInstances` deployments answers (`deps.ActiveInstances`), and the body of the hottest
read, one version, read in a short read-only session of its own."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.auth import scopes
from service.auth.service import Principal
from service.functions import sharing
from service.functions.deps import ActiveInstances
from service.functions.models import FunctionVersion
from service.functions.responses import FunctionEnvelope, FunctionList, FunctionOut


async def function_outs(
    session: AsyncSession,
    instances_of: ActiveInstances,
    principal: Principal,
    versions: Sequence[FunctionVersion],
    *,
    include_secrets: bool = True,
) -> list[FunctionOut]:
    """Function objects as the caller sees them (another account's, shared with it, without
    what runs them); with `list_functions_details` the caller's own carry `activeInstances`
    (the instances of the version's live deployment, loaded in one query for all versions)."""
    account = principal.account_id
    details = scopes.LIST_FUNCTIONS_DETAILS in principal.scopes
    instances = (
        await instances_of(session, [v.id for v in versions if v.account_id == account])
        if details
        else {}
    )
    return [
        FunctionOut.of(
            v,
            viewer=account,
            details=details,
            active_instances=instances.get(v.id, []),
            include_secrets=include_secrets,
        )
        for v in versions
    ]


def list_body(outs: list[FunctionOut], next_cursor: str | None) -> str:
    return FunctionList(functions=outs, next_cursor=next_cursor).model_dump_json(
        by_alias=True, exclude_none=True
    )


async def version_body(
    sessions: async_sessionmaker[AsyncSession],
    instances_of: ActiveInstances,
    principal: Principal,
    function_id: uuid.UUID,
    version_id: uuid.UUID,
    *,
    include_secrets: bool,
) -> str:
    """One version as the caller sees it, serialised; read without the request's transaction
    (the hot read takes none: a cache miss opens this short read-only session)."""
    async with sessions() as session:
        version = await sharing.readable_version(
            session, principal.account_id, function_id, version_id
        )
        (out,) = await function_outs(
            session, instances_of, principal, [version], include_secrets=include_secrets
        )
        await session.rollback()
    return FunctionEnvelope(function=out).model_dump_json(by_alias=True, exclude_none=True)
