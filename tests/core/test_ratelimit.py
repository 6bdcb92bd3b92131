"""Per-account rate limiting of the API (service/core/ratelimit.py): 429 problem+json with
Retry-After, accounts counted apart, the read fast path counted too, and counters shared
through Redis by several replicas."""

from __future__ import annotations

import uuid

from tests.support.api import bearer, create_fn, new_key
from tests.support.app import ClientFactory
from tests.support.redis import RedisServer

V = "/v2/nvcf"
# 3 requests at once, then 1 per 100 s: the window outlasts any test
LIMITS = {"rate_limit_per_second": 0.01, "rate_limit_burst": 3}


async def test_an_account_over_its_limit_gets_429_with_retry_after(
    client_factory: ClientFactory,
) -> None:
    admin = await client_factory()  # the operator's key, unlimited here
    key = bearer(await new_key(admin, ["list_functions"], "busy"))
    other = bearer(await new_key(admin, ["list_functions"], "calm"))
    client = await client_factory(**LIMITS)
    answers = [(await client.get(f"{V}/functions", headers=key)).status_code for _ in range(4)]
    assert answers == [200, 200, 200, 429]
    refused = await client.get(f"{V}/functions", headers=key)
    assert refused.status_code == 429
    assert refused.headers["content-type"] == "application/problem+json"
    assert 1 <= int(refused.headers["retry-after"]) <= 300
    assert refused.json()["detail"].startswith(
        "account 'busy' is over its rate limit (rateLimitPerSecond 0.01, rateLimitBurst 3: "
        "3 requests per 300 s)"
    )
    # another account is counted apart
    assert (await client.get(f"{V}/functions", headers=other)).status_code == 200


async def test_the_read_fast_path_counts_too(client_factory: ClientFactory) -> None:
    client = await client_factory(**LIMITS)
    fn = await create_fn(client)  # 1
    path = f"{V}/functions/{fn['id']}/versions/{fn['versionId']}"
    first = await client.get(path)  # 2, through the route: fills the cache
    second = await client.get(path)  # 3, answered by the fast path
    assert (first.status_code, second.status_code) == (200, 200)
    third = await client.get(path)
    assert third.status_code == 429 and "retry-after" in third.headers


async def test_replicas_share_the_counters_through_redis(
    client_factory: ClientFactory, redis_server: RedisServer
) -> None:
    a = await client_factory(redis_url=redis_server.url, **LIMITS)
    b = await client_factory(redis_url=redis_server.url, **LIMITS)
    # the Redis server outlives the test: an account of its own
    account = f"shared-{uuid.uuid4().hex[:8]}"
    key = bearer(await new_key(await client_factory(), ["list_functions"], account))
    codes = [(await c.get(f"{V}/functions", headers=key)).status_code for c in (a, b, a, b)]
    assert codes == [200, 200, 200, 429]


async def test_zero_turns_the_limit_off(client_factory: ClientFactory) -> None:
    client = await client_factory(rate_limit_per_second=0, rate_limit_burst=1)
    codes = {(await client.get(f"{V}/functions")).status_code for _ in range(5)}
    assert codes == {200}
