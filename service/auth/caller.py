"""The one caller check of every entry: credential → principal → suspended account → org →
account rate limit → function reach → scope.

The REST dependencies (deps.py), the invocation entries (HTTP, gRPC, the LLM gateway through the
HTTP entry), the version read fast path, the NGC routes and `/metrics` all call `caller`; each
only translates its refusals (`DomainError`s) to its protocol.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.auth.limits import api_rate
from service.auth.service import Authenticator, Principal
from service.core.errors import Forbidden, Unauthorized
from service.core.ratelimit import RateLimiter

#: a request's state keys: the verified caller, and its account (the access line's)
PRINCIPAL = "principal"
ACCOUNT_ID = "account_id"


class MissingScope(Forbidden):
    """The credential carries none of the scopes the operation needs (403)."""

    @classmethod
    def of(cls, any_of: Collection[str]) -> MissingScope:
        needed = " or ".join(f"'{s}'" for s in any_of)
        return cls(detail=f"this operation requires the scope {needed}")


async def caller(
    authenticator: Authenticator,
    authorization: str | None,
    *,
    sessions: async_sessionmaker[AsyncSession] | None,
    any_of: Collection[str] = (),
    org: str | None = None,
    invocation: bool = False,
    limiter: RateLimiter | None = None,
    state: MutableMapping[str, Any] | None = None,
    reach: Callable[[Principal], Awaitable[None]] | None = None,
) -> Principal:
    """The caller of a request holding at least one of `any_of` (none: any credential).

    - `sessions` None is the cached mode of a fast path that must not wait: only an API key
      verified moments ago (by the same header) is known, anything else is a 401 to fall
      through on; never a database read.
    - `org`: the org an aliased path names, which must be the caller's account (403).
    - `invocation`: an invocation token is a credential too (elsewhere it is a 403).
    - `limiter`: the request counts against the account's rate limit (its own, else the
      limiter's default; 429), once per request however often it is checked (`state`
      remembers it).
    - `reach`: what the route adds (a key limited to named functions).
    - `state`, the request's: the caller is verified once per request (a second call only
      checks its scopes), and recorded with its account for the access line.
    """
    known: Principal | None = state.get(PRINCIPAL) if state is not None else None
    principal = known or await _principal(authenticator, authorization, sessions, invocation)
    if known is None:
        if authenticator.suspensions is not None:
            await authenticator.suspensions.check(principal.account_id, read=sessions is not None)
        if org is not None and org != principal.account_id:
            raise Forbidden(detail=f"organization '{org}' in the path is not the caller's account")
        if limiter is not None:
            known_limits = authenticator.suspensions
            own = {} if known_limits is None else known_limits.own_limits(principal.account_id)
            await limiter.admit(principal.account_id, state, api_rate(own, limiter.default))
        if reach is not None:
            await reach(principal)
        if state is not None:
            state[PRINCIPAL] = principal
            state[ACCOUNT_ID] = principal.account_id
    if any_of and principal.scopes.isdisjoint(any_of):
        raise MissingScope.of(any_of)
    return principal


async def _principal(
    authenticator: Authenticator,
    authorization: str | None,
    sessions: async_sessionmaker[AsyncSession] | None,
    invocation: bool,
) -> Principal:
    if sessions is not None:
        return await authenticator.authenticate(sessions, authorization, invocation=invocation)
    principal = authenticator.cached_principal(authorization)
    if principal is None:
        raise Unauthorized(detail="the credential was not verified moments ago")
    return principal
