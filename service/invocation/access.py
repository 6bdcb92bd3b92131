"""Who may invoke what: the one place the invocation plane asks which function versions a
caller may reach (`visible_versions`) and whose requests it may read (`may_poll`).

A caller invokes its own account's functions and those shared with its account (NVCF's
authorized parties, functions/sharing.py: the whole function, or single versions). Anything
else is a 404, exactly like an unknown function. An invocation token (auth/tokens.py) reaches
only what its grant names, within what its account may invoke. Every invocation entry, the
status polls and the queue routes resolve versions through here (routing.py caches what it
resolves; functions/sharing_router.py forgets a function's cached targets when its sharing
changes).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.service import Principal
from service.deployments import repository as deployments
from service.functions import repository as functions


async def visible_versions(
    session: AsyncSession,
    principal: Principal,
    function_id: uuid.UUID,
    version_id: uuid.UUID | None = None,
) -> Sequence[Row[Any]]:
    """The versions of a function the caller may invoke (all of them, or the one asked for),
    each with its live deployment's id and creation time (None when not deployed): its
    account's own, and those shared with its account; an invocation token's, only the granted
    ones. One query, composed of the functions' and the deployments' repositories."""
    if principal.functions is not None and function_id not in principal.functions:
        return []  # a key limited to named functions (NVCF policy resources)
    granted: frozenset[str] | None = frozenset()
    if principal.grant is not None:
        granted = principal.grant.versions(str(function_id))
        if granted is None:
            return []
    versions = functions.invocable_versions(
        principal.account_id, function_id, version_id, [uuid.UUID(v) for v in granted or ()]
    )
    return await deployments.with_live_deployment(session, versions)


def may_poll(
    principal: Principal,
    request_account: str,
    function_id: uuid.UUID,
    version_id: uuid.UUID,
) -> bool:
    """Whether the caller may read a request's state: the account that made it (an account a
    function is shared with reads its own requests, never the owner's nor the reverse); an
    invocation token, only requests of the versions it may invoke; a key limited to named
    functions, only theirs."""
    if principal.account_id != request_account:
        return False
    if principal.functions is not None and function_id not in principal.functions:
        return False  # a key limited to named functions reads only their requests
    grant = principal.grant
    return grant is None or grant.allows(str(function_id), str(version_id))
