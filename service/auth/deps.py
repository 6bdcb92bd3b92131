"""FastAPI dependencies: the caller's principal, scope checks and the org-path check."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.service import Authenticator, Principal
from service.core.db import request_session
from service.core.errors import Forbidden

Session = Annotated[AsyncSession, Depends(request_session, scope="function")]


async def current_principal(request: Request, session: Session) -> Principal:
    auth: Authenticator = request.app.state.authenticator
    principal = await auth.authenticate(session, request.headers.get("authorization"))
    org = request.path_params.get("org")
    if org is not None and org != principal.account_id:
        raise Forbidden(detail=f"organization '{org}' in the path is not the caller's account")
    request.state.account_id = principal.account_id
    return principal


def require(*any_of: str) -> Callable[..., Coroutine[Any, Any, Principal]]:
    """A dependency that passes when the credential carries at least one of the scopes."""
    needed = " or ".join(f"'{s}'" for s in any_of)

    async def dependency(
        principal: Annotated[Principal, Depends(current_principal)],
    ) -> Principal:
        if principal.scopes.isdisjoint(any_of):
            raise Forbidden(detail=f"this operation requires the scope {needed}")
        return principal

    return dependency
