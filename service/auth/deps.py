"""FastAPI dependencies: the caller's principal, scope checks and the org-path check.

Authentication needs no request session: a verified key is cached, and on a miss the lookup
uses a short session of its own. Keeping the dependency chain shallow matters on hot reads.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.restrict import FunctionReach, check_functions
from service.auth.service import Authenticator, Principal
from service.core.components import Component
from service.core.db import SESSIONMAKER, request_session
from service.core.deps import RATE_LIMITER, SettingsDep
from service.core.errors import Forbidden
from service.core.idempotency import Recorder, idempotent

#: request state key: True/False when the read fast path already counted the request against
#: the account's rate limit (False: it was over the limit)
RATE_COUNTED = "rate_counted"

Session = Annotated[AsyncSession, Depends(request_session, scope="function")]

AUTHENTICATOR = Component[Authenticator]("authenticator")
FUNCTION_REACH = Component[FunctionReach]("function_reach")


async def authenticator(request: Request) -> Authenticator:
    return AUTHENTICATOR.of(request)


async def function_reach(request: Request) -> FunctionReach:
    return FUNCTION_REACH.of(request)


AuthenticatorDep = Annotated[Authenticator, Depends(authenticator)]
FunctionReachDep = Annotated[FunctionReach, Depends(function_reach)]


async def authenticate_request(request: Request, *, invocation: bool = False) -> Principal:
    """The caller, verified once per request; the org in an aliased path must be its account.
    An invocation token only when `invocation` (the routes that take one, `require`)."""
    principal: Principal | None = getattr(request.state, "principal", None)
    if principal is not None:
        return principal
    principal = await AUTHENTICATOR.of(request).authenticate(
        SESSIONMAKER.of(request), request.headers.get("authorization"), invocation=invocation
    )
    org = request.path_params.get("org") or getattr(request.state, "org", None)
    if org is not None and org != principal.account_id:
        raise Forbidden(detail=f"organization '{org}' in the path is not the caller's account")
    limiter = RATE_LIMITER.of(request)
    if limiter is not None:
        counted = getattr(request.state, RATE_COUNTED, None)  # by the read fast path
        if counted is None:
            await limiter.check(principal.account_id)
        elif counted is False:
            raise await limiter.refusal(principal.account_id)
    await check_functions(request, principal, SESSIONMAKER.of(request), FUNCTION_REACH.of(request))
    request.state.principal = principal
    request.state.account_id = principal.account_id
    return principal


def require(
    *any_of: str, invocation: bool = False
) -> Callable[..., Coroutine[Any, Any, Principal]]:
    """A dependency that passes when the credential carries at least one of the scopes; an
    invocation token is a credential too where `invocation` (NVCF's `invoke_function` routes
    outside invoking: the assets and the token routes)."""
    needed = " or ".join(f"'{s}'" for s in any_of)

    async def dependency(request: Request) -> Principal:
        principal = await authenticate_request(request, invocation=invocation)
        if principal.scopes.isdisjoint(any_of):
            raise Forbidden(detail=f"this operation requires the scope {needed}")
        return principal

    return dependency


async def idempotency(
    request: Request,
    session: Session,
    principal: Annotated[Principal, Depends(authenticate_request)],
    settings: SettingsDep,
) -> AsyncIterator[Recorder]:
    """`Idempotency-Key` handling for a create, keyed by the caller's account."""
    ttl = settings.idempotency_ttl_seconds
    async with idempotent(request, session, principal.account_id, ttl) as recorder:
        yield recorder
