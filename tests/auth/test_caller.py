"""The one caller check (service/auth/caller.py): scope, org, the account rate limit counted
once per request, the request's memory of its caller, and the cached mode of a fast path."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.auth.caller import MissingScope, caller
from service.auth.service import Authenticator, Principal
from service.core.errors import Forbidden, TooManyRequests, Unauthorized
from service.core.ratelimit import RateLimiter
from service.core.settings import Settings
from tests.support.app import JWT_SECRET

#: JWTs are verified without the database: sessions that are never opened
SESSIONS: async_sessionmaker[AsyncSession] = async_sessionmaker()


@pytest.fixture
def authenticator(tmp_path: Path) -> Authenticator:
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None, data_dir=tmp_path, jwt_secret=JWT_SECRET
    )
    return Authenticator(settings)


def header(account: str, *scopes: str) -> str:
    claims = {"sub": account, "scopes": list(scopes), "exp": int(time.time()) + 600}
    return "Bearer " + jwt.encode(claims, JWT_SECRET, algorithm="HS256")


async def test_the_caller_holds_one_of_the_scopes(authenticator: Authenticator) -> None:
    principal = await caller(
        authenticator, header("acme", "b"), sessions=SESSIONS, any_of=("a", "b")
    )
    assert (principal.account_id, principal.scopes) == ("acme", frozenset({"b"}))
    with pytest.raises(MissingScope) as refused:
        await caller(authenticator, header("acme", "c"), sessions=SESSIONS, any_of=("a", "b"))
    assert refused.value.status == 403
    assert refused.value.detail == "this operation requires the scope 'a' or 'b'"


async def test_another_org_in_the_path_is_refused(authenticator: Authenticator) -> None:
    with pytest.raises(Forbidden) as refused:
        await caller(authenticator, header("acme"), sessions=SESSIONS, org="other")
    assert refused.value.detail == "organization 'other' in the path is not the caller's account"
    principal = await caller(authenticator, header("acme"), sessions=SESSIONS, org="acme")
    assert principal.account_id == "acme"


async def test_a_request_is_verified_once_and_checks_its_scopes_each_time(
    authenticator: Authenticator,
) -> None:
    state: dict[str, Any] = {}
    reached: list[Principal] = []

    async def reach(principal: Principal) -> None:
        reached.append(principal)

    first = await caller(
        authenticator, header("acme", "a"), sessions=SESSIONS, state=state, reach=reach
    )
    assert state["account_id"] == "acme"  # the access line's
    again = await caller(
        authenticator, header("acme", "a"), sessions=SESSIONS, state=state, reach=reach
    )
    assert again is first and reached == [first]
    with pytest.raises(MissingScope):
        await caller(
            authenticator, header("acme", "a"), sessions=SESSIONS, any_of=("b",), state=state
        )


async def test_a_request_counts_once_against_the_account_rate_limit(
    authenticator: Authenticator,
) -> None:
    limiter = RateLimiter(rate=0.01, burst=2)  # 2 requests, then one per 200 s
    credential = header("acme")

    async def check(state: dict[str, Any]) -> None:
        await caller(authenticator, credential, sessions=SESSIONS, limiter=limiter, state=state)

    first: dict[str, Any] = {}
    await check(first)
    first.pop("principal")  # checked again from scratch: still the same request
    await check(first)
    await check({})  # the account's second request
    refused: dict[str, Any] = {}
    with pytest.raises(TooManyRequests):
        await check(refused)
    # the route a fast path fell through to answers the refusal, counting nothing more
    with pytest.raises(TooManyRequests) as again:
        await check(refused)
    assert again.value.headers is not None and "Retry-After" in again.value.headers


async def test_the_cached_mode_knows_only_keys_verified_moments_ago(
    authenticator: Authenticator,
) -> None:
    """A fast path that must not wait: a credential not verified moments ago (here a JWT,
    which is never remembered) is a 401 it falls through on, without the database."""
    credential = header("acme", "a")
    await caller(authenticator, credential, sessions=SESSIONS)
    with pytest.raises(Unauthorized):
        await caller(authenticator, credential, sessions=None)
