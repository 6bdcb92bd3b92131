"""Function rate limits as NVCF's limiter applies them: every window of a rate string, one
NCA tier (per-account rate, else the global one unless exempted), and a per-user tier."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from service.core.errors import TooManyRequests
from service.invocation.ratelimit import FunctionRateLimiter, RatePolicy, parse_rates
from tests.support.api import assert_problem
from tests.support.app import ClientFactory
from tests.support.invocation import deployed, invocation_app, pexec_url, sample
from tests.support.redis import RedisServer


def test_rate_strings() -> None:
    assert [r.text for r in parse_rates("100-S, 5000-H")] == ["100-S", "5000-H"]
    assert [r.text for r in parse_rates("10-s,5-S,3-D")] == ["5-S", "3-D"]  # stricter S kept
    assert parse_rates("x-S,0-M,5-Y") == ()
    # stored before counts were bounded: skipped, never a ValueError at every invocation
    assert parse_rates("9" * 4301 + "-S,²-M,٣-H,+5-D") == ()
    assert parse_rates(None) == ()


def test_tiers_follow_nvcf() -> None:
    assert RatePolicy.from_stored(None) is None
    assert RatePolicy.from_stored({"syncCheck": True}) is None
    policy = RatePolicy.from_stored(
        {
            "rateLimit": "10-S,1000-H",
            "exemptedNcaIds": ["free"],
            "perNcaIdRate": {"big": "100-S"},
            "perUserRate": "5-S",
        }
    )
    assert policy is not None
    tiers = {a: [(p, [r.text for r in rs]) for p, rs in policy.tiers(a, "u1")] for a in "xyz"}
    assert tiers["x"] == [("nca:x", ["10-S", "1000-H"]), ("user:u1:x", ["5-S"])]
    assert [(p, [r.text for r in rs]) for p, rs in policy.tiers("big", "")] == [
        ("nca:big", ["100-S"])
    ]
    # Exempt from the global rate only: the per-user tier stays.
    assert [p for p, _ in policy.tiers("free", "u1")] == ["user:u1:free"]
    assert policy.tiers("free", "") == []


async def test_every_window_counts_and_refusal_says_when_to_retry() -> None:
    limiter = FunctionRateLimiter()
    policy = RatePolicy.from_stored({"rateLimit": "100-S,2-H"})
    assert policy is not None
    for _ in range(2):
        await limiter.check(policy, account="a", subject="k", version_id="v")
    with pytest.raises(TooManyRequests) as refused:
        await limiter.check(policy, account="a", subject="k", version_id="v")
    assert "2-H" in refused.value.detail
    assert 1 <= int(refused.value.headers["Retry-After"]) <= 3600
    # Another account has its own counters; another version too.
    await limiter.check(policy, account="b", subject="k", version_id="v")
    await limiter.check(policy, account="a", subject="k", version_id="w")
    await limiter.aclose()


async def test_per_user_rate_is_counted_per_caller() -> None:
    limiter = FunctionRateLimiter()
    policy = RatePolicy.from_stored({"perUserRate": "1-M"})
    assert policy is not None
    await limiter.check(policy, account="a", subject="alice", version_id="v")
    await limiter.check(policy, account="a", subject="bob", version_id="v")
    with pytest.raises(TooManyRequests, match="per-user"):
        await limiter.check(policy, account="a", subject="alice", version_id="v")


async def test_counters_in_redis_are_shared(redis_server: RedisServer) -> None:
    one, two = FunctionRateLimiter(redis_server.url), FunctionRateLimiter(redis_server.url)
    policy = RatePolicy.from_stored({"rateLimit": "2-M"})
    assert policy is not None
    try:
        await one.check(policy, account="shared", subject="", version_id="redis-v")
        await two.check(policy, account="shared", subject="", version_id="redis-v")
        with pytest.raises(TooManyRequests):
            await one.check(policy, account="shared", subject="", version_id="redis-v")
    finally:
        await one.storage.reset()
        await one.aclose()
        await two.aclose()


async def test_a_third_request_within_a_second_is_429(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await invocation_app(client_factory, tmp_path)
    fn = await deployed(client, rateLimit={"rateLimit": "2-S"})
    answers = await asyncio.gather(*(client.post(pexec_url(fn), json={}) for _ in range(3)))
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200, 200, 429], [a.text for a in answers]
    refused = next(a for a in answers if a.status_code == 429)
    problem = assert_problem(refused, 429)
    assert "2-S" in str(problem["detail"])
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.headers["nvcf-status"] == "errored"
    metrics = (await client.get("/metrics")).text
    assert sample(metrics, "nvcf_invocation_requests_total", outcome="rate_limited") == 1


async def test_a_deleted_rate_limit_no_longer_refuses(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await invocation_app(client_factory, tmp_path)
    fn = await deployed(client, rateLimit={"rateLimit": "1-H"})
    assert (await client.post(pexec_url(fn), json={})).status_code == 200
    assert_problem(await client.post(pexec_url(fn), json={}), 429)
    url = f"/v2/nvcf/ratelimit/functions/{fn['id']}/versions/{fn['versionId']}"
    assert (await client.delete(url)).status_code == 204
    assert (await client.post(pexec_url(fn), json={})).status_code == 200
    assert (await client.put(url, json={"rateLimit": {"rateLimit": "1-H"}})).status_code == 204
    assert_problem(await client.post(pexec_url(fn), json={}), 429)
