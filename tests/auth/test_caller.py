"""The one caller check (service/auth/caller.py): scope, org, the account rate limit counted
once per request, the request's memory of its caller, and the cached mode of a fast path."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import jwt
import pytest
from grpc import aio
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.auth.caller import MissingScope, caller
from service.auth.service import Authenticator, Principal
from service.core.errors import Forbidden, TooManyRequests, Unauthorized
from service.core.ratelimit import RateLimiter
from service.core.settings import Settings
from tests.support.api import assert_problem, bearer, new_key
from tests.support.app import JWT_SECRET, AppClient, ClientFactory
from tests.support.e2e import eventually, until_status
from tests.support.grpc_worker import GrpcWorker
from tests.support.invocation import deployed, invocation_app

SUFFIX = "invocation.localhost"

#: JWTs are verified without the database: sessions that are never opened
SESSIONS: async_sessionmaker[AsyncSession] = async_sessionmaker()


@pytest.fixture
def authenticator(tmp_path: Path) -> Authenticator:
    settings = Settings(_env_file=None, data_dir=tmp_path, jwt_secret=JWT_SECRET)
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


async def test_a_suspended_account_is_refused_by_every_entry_until_resumed(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    """REST, pexec, both transparent forms and an invocation token minted before: each a 403
    with the reason; another account goes on; resuming lets every one back."""
    operator = await invocation_app(
        client_factory, tmp_path, invoke_host_suffix=SUFFIX, default_account="operator"
    )
    key = await new_key(
        operator,
        ["register_function", "deploy_function", "list_functions", "invoke_function"],
        account="team-s",
    )
    tenant = AppClient(
        transport=httpx.ASGITransport(app=operator.app),
        base_url=str(operator.base_url),
        headers=bearer(key),
    )
    tenant.app = operator.app
    fn = await deployed(tenant)
    resp = await tenant.post(f"/v2/nvcf/tokens/functions/{fn['id']}", json={"clientId": "c"})
    assert resp.status_code == 200, resp.text
    token = bearer(resp.json()["access_token"])
    mine = await deployed(operator, name="operators")

    async def send(fid: str, headers: dict[str, str], rest: bool = True) -> list[httpx.Response]:
        """Each entry once: REST (not for a token), pexec, transparent by header and by host."""
        out = [await operator.get("/v2/nvcf/functions", headers=headers)] if rest else []
        out.append(await operator.post(f"/v2/nvcf/pexec/functions/{fid}", json=1, headers=headers))
        out.append(await operator.post("/echo", json=2, headers={**headers, "function-id": fid}))
        host = {**headers, "Host": f"{fid}.{SUFFIX}"}
        out.append(await operator.post("/echo", json=3, headers=host))
        return out

    suspended = await operator.put(
        "/v2/nvcf/accounts/team-s/suspension", json={"reason": "abuse report 7"}
    )
    assert suspended.status_code == 200, suspended.text
    for resp in [*await send(fn["id"], bearer(key)), *await send(fn["id"], token, rest=False)]:
        problem = assert_problem(resp, 403)
        assert problem["detail"] == "account 'team-s' is suspended: abuse report 7"
    for resp in await send(mine["id"], {}):
        assert resp.status_code == 200, resp.text

    assert (await operator.delete("/v2/nvcf/accounts/team-s/suspension")).status_code == 200
    await until_status(tenant, fn, "ACTIVE")  # its deployment, held at zero, comes back

    async def invocable() -> bool:
        # every entry: each may still route by what it read moments ago
        return all(r.status_code == 200 for r in await send(fn["id"], bearer(key)))

    await eventually(invocable)  # once the invocation entries see it ACTIVE
    for resp in [*await send(fn["id"], bearer(key)), *await send(fn["id"], token, rest=False)]:
        assert resp.status_code == 200, resp.text
    await tenant.aclose()


async def tenant_of(operator: AppClient, account: str) -> tuple[AppClient, str]:
    """A client of `account` (a key that deploys and invokes) on the operator's app."""
    key = await new_key(
        operator,
        ["register_function", "deploy_function", "list_functions", "invoke_function"],
        account=account,
    )
    tenant = AppClient(
        transport=httpx.ASGITransport(app=operator.app),
        base_url=str(operator.base_url),
        headers=bearer(key),
    )
    tenant.app = operator.app
    return tenant, key


async def minted_token(tenant: AppClient, fn: dict[str, Any]) -> str:
    resp = await tenant.post(f"/v2/nvcf/tokens/functions/{fn['id']}", json={"clientId": "c"})
    assert resp.status_code == 200, resp.text
    return str(resp.json()["access_token"])


async def test_a_suspended_account_is_refused_on_grpc_until_resumed(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    """gRPC: the key and an invocation token minted before the suspension each get
    PERMISSION_DENIED with the reason; resuming lets both back."""
    worker = await GrpcWorker().start()
    try:
        operator = await invocation_app(
            client_factory, tmp_path, upstream=worker.url, grpc_enabled=True, grpc_port=0
        )
        tenant, key = await tenant_of(operator, "team-g")
        fn = await deployed(tenant, name="grpc-echo", inferenceUrl="/gRPC", inferencePort=8001)
        token = await minted_token(tenant, fn)
        port = operator.app.state.grpc.port
        async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            echo: aio.UnaryUnaryMultiCallable[bytes, bytes]
            echo = channel.unary_unary("/test.Echo/Unary")

            async def call(credential: str) -> tuple[grpc.StatusCode, str]:
                metadata = (("authorization", f"Bearer {credential}"), ("function-id", fn["id"]))
                try:
                    await echo(b"hi", metadata=metadata)
                except aio.AioRpcError as error:
                    return error.code(), error.details() or ""
                return grpc.StatusCode.OK, ""

            assert await call(key) == await call(token) == (grpc.StatusCode.OK, "")
            reason = {"reason": "abuse report 8"}
            resp = await operator.put("/v2/nvcf/accounts/team-g/suspension", json=reason)
            assert resp.status_code == 200, resp.text
            for credential in (key, token):
                assert await call(credential) == (
                    grpc.StatusCode.PERMISSION_DENIED,
                    "account 'team-g' is suspended: abuse report 8",
                )
            assert (await operator.delete("/v2/nvcf/accounts/team-g/suspension")).status_code == 200

            async def both() -> bool:
                return await call(key) == await call(token) == (grpc.StatusCode.OK, "")

            await eventually(both)  # once its deployment, held at zero, is back
        await tenant.aclose()
    finally:
        worker.release()
        await worker.stop()


async def test_a_suspended_account_is_refused_by_the_llm_gateway_until_resumed(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    """The LLM gateway: the key and an invocation token minted before the suspension each
    get a 403 in OpenAI's shape with the reason; resuming lets both back."""
    operator = await invocation_app(client_factory, tmp_path)
    tenant, key = await tenant_of(operator, "team-l")
    models = [{"name": "m", "llmConfig": {"uris": ["/v1/chat/completions"]}}]
    fn = await deployed(tenant, name="llm", inferenceUrl="/", functionType="LLM", models=models)
    token = await minted_token(tenant, fn)
    body = {"model": f"{fn['id']}/m", "messages": [{"role": "user", "content": "hi"}]}

    async def chat(credential: str) -> httpx.Response:
        return await operator.post(
            "/v2/nvcf/llm/v1/chat/completions", json=body, headers=bearer(credential)
        )

    assert [(await chat(c)).status_code for c in (key, token)] == [200, 200]
    resp = await operator.put("/v2/nvcf/accounts/team-l/suspension", json={"reason": "unpaid"})
    assert resp.status_code == 200, resp.text
    for credential in (key, token):
        refused = await chat(credential)
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["message"] == "account 'team-l' is suspended: unpaid"
    assert (await operator.delete("/v2/nvcf/accounts/team-l/suspension")).status_code == 200

    async def both() -> bool:
        return [(await chat(c)).status_code for c in (key, token)] == [200, 200]

    await eventually(both)  # once its deployment, held at zero, is back
    await tenant.aclose()
