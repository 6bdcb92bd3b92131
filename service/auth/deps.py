"""FastAPI dependencies: the caller's principal, scope checks and the org-path check.

Authentication needs no request session: a verified key is cached, and on a miss the lookup
uses a short session of its own. Keeping the dependency chain shallow matters on hot reads.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Coroutine
from typing import Annotated, Any

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.caller import caller
from service.auth.restrict import FunctionReach, check_functions
from service.auth.service import Authenticator, Principal
from service.core.components import Component
from service.core.db import SESSIONMAKER, request_session
from service.core.deps import RATE_LIMITER, SettingsDep
from service.core.idempotency import Recorder, idempotent

Session = Annotated[AsyncSession, Depends(request_session, scope="function")]

AUTHENTICATOR = Component[Authenticator]("authenticator")
FUNCTION_REACH = Component[FunctionReach]("function_reach")


async def authenticator(request: Request) -> Authenticator:
    return AUTHENTICATOR.of(request)


async def function_reach(request: Request) -> FunctionReach:
    return FUNCTION_REACH.of(request)


AuthenticatorDep = Annotated[Authenticator, Depends(authenticator)]
FunctionReachDep = Annotated[FunctionReach, Depends(function_reach)]


async def authenticate_request(request: Request) -> Principal:
    """The caller, verified once per request; the org in an aliased path must be its account.
    An invocation token only where the route's `require` took one first. (Its one parameter
    is the request: any other would be a query parameter of every route depending on it.)"""
    return await _caller(request, False, ())


async def _caller(request: Request, invocation: bool, any_of: Collection[str]) -> Principal:
    """`caller` for a REST route: a key limited to named functions reaches only those."""
    sessions = SESSIONMAKER.of(request)

    async def reach(principal: Principal) -> None:
        await check_functions(request, principal, sessions, FUNCTION_REACH.of(request))

    state = request.scope.setdefault("state", {})
    return await caller(
        AUTHENTICATOR.of(request),
        request.headers.get("authorization"),
        sessions=sessions,
        any_of=any_of,
        org=request.path_params.get("org") or state.get("org"),
        invocation=invocation,
        limiter=RATE_LIMITER.of(request),
        state=state,
        reach=reach,
    )


def require(
    *any_of: str, invocation: bool = False
) -> Callable[..., Coroutine[Any, Any, Principal]]:
    """A dependency that passes when the credential carries at least one of the scopes; an
    invocation token is a credential too where `invocation` (NVCF's `invoke_function` routes
    outside invoking: the assets and the token routes)."""

    async def dependency(request: Request) -> Principal:
        return await _caller(request, invocation, any_of)

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
