"""Keys limited to named functions (NVCF policy resources `{id: <fid>, type:
account-functions}`): such a key reaches only those functions, on every route.

Checked once per request, after authentication, from the matched route: a `functionId` in the
path must be one of the key's; a `deploymentId` must be a deployment (or the history of one) of
one of them; creating a new function is refused (the key could not reach it). Lists filter by
the key's functions where they list functions or deployments. Another function is answered
404, as another account's is.

What a key's functions reach is asked of the domains above (`FunctionReach`, which the
composition supplies: deployments/reach.py); auth imports none of them.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from starlette.requests import Request

from service.auth.service import Principal
from service.core.errors import Forbidden, NotFound


class FunctionReach(Protocol):
    """What checking a key limited to named functions asks of the functions and deployments
    domains."""

    async def function_of_deployment(
        self, session: AsyncSession, deployment_id: uuid.UUID
    ) -> uuid.UUID | None:
        """The function of the deployment (or of the history of a removed one), if any."""

    async def own_functions(
        self, session: AsyncSession, account_id: str, ids: Collection[uuid.UUID]
    ) -> set[uuid.UUID]:
        """Those of `ids` that are the account's own functions."""

    async def shared_functions(
        self, session: AsyncSession, account_id: str, ids: Collection[uuid.UUID]
    ) -> set[uuid.UUID]:
        """Those of `ids` of which something is shared with the account."""


#: routes that create a new function (its id cannot be among the key's)
_CREATES_FUNCTION = frozenset({("POST", "/v2/nvcf/functions")})


async def check_functions(
    request: Request,
    principal: Principal,
    sessions: async_sessionmaker[AsyncSession],
    reach: FunctionReach,
) -> None:
    """Raise 404 (403 for a create) when a limited key asks for another function."""
    allowed = principal.functions
    if allowed is None:
        return
    route = request.scope.get("route")
    template = getattr(route, "path", "")
    if (request.method, template) in _CREATES_FUNCTION:
        raise Forbidden(
            detail="this API key is limited to named functions: it cannot create new ones"
        )
    params = request.path_params
    raw = params.get("functionId")
    if raw is not None:
        try:
            fid = uuid.UUID(str(raw))
        except ValueError:
            return  # the route reports the malformed id
        if fid not in allowed:
            raise NotFound(detail=f"function {fid} not found")
    raw = params.get("deploymentId")
    if raw is not None:
        try:
            did = uuid.UUID(str(raw))
        except ValueError:
            return
        async with sessions() as session:
            function_id = await reach.function_of_deployment(session, did)
        if function_id is not None and function_id not in allowed:
            raise NotFound(detail=f"deployment {did} not found")
