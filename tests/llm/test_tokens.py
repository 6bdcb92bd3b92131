"""Token rate limits (service/llm/tokens.py): the estimate charged first, refused in OpenAI's
429 with Retry-After when a window cannot take it, and corrected from the worker's usage —
in memory and in Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from service.core.token_rates import parse_token_rates
from service.llm.errors import OpenAIError
from service.llm.tokens import AccountTokens, TokenLimiter, estimate, go_duration
from tests.support.redis import RedisServer

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
EMBEDDINGS = "/v1/embeddings"
WHO = {"account": "acct", "function_id": "f", "model": "m"}


def test_the_estimate_is_a_quarter_of_the_text_bytes_plus_the_output_bound() -> None:
    chat = {"messages": [{"role": "user", "content": "x" * 40}], "max_tokens": 100}
    assert estimate(CHAT, chat) == 1 + 10 + 100  # "user" is text too
    assert estimate(CHAT, {**chat, "max_completion_tokens": 5}) == 16
    assert estimate(RESPONSES, {"input": "y" * 8, "max_output_tokens": 3}) == 5
    assert estimate(RESPONSES, {"input": "y" * 8, "instructions": "z" * 8}) == 4
    assert estimate(EMBEDDINGS, {"input": ["abcd", "efgh"]}) == 2
    assert estimate(CHAT, {"messages": [{"content": "é"}]}) == 1  # bytes, not characters
    assert estimate(CHAT, {"messages": [], "max_tokens": True}) == 0


@pytest.fixture
async def limiter() -> AsyncIterator[TokenLimiter]:
    limiter = TokenLimiter()
    yield limiter
    await limiter.aclose()


async def test_no_limit_charges_nothing(limiter: TokenLimiter) -> None:
    assert await limiter.charge(None, tokens=10**9, **WHO) is None
    assert await limiter.charge("", tokens=10**9, **WHO) is None


async def test_the_request_that_would_exceed_the_limit_is_refused(limiter: TokenLimiter) -> None:
    assert await limiter.charge("100-M,1000-H", tokens=60, **WHO) is not None
    with pytest.raises(OpenAIError) as info:
        await limiter.charge("100-M,1000-H", tokens=41, **WHO)
    error = info.value
    assert error.status == 429 and error.code == "rate_limit_exceeded" and error.type == "tokens"
    assert "100-M" in error.message and "1000-H" not in error.message
    assert 1 <= int(error.headers["Retry-After"]) <= 60
    assert await limiter.charge("100-M,1000-H", tokens=40, **WHO) is not None  # fits exactly
    # another account, another model: their own counters
    assert await limiter.charge("100-M", tokens=100, **{**WHO, "account": "other"}) is not None
    assert await limiter.charge("100-M", tokens=100, **{**WHO, "model": "m2"}) is not None


async def test_a_request_larger_than_the_limit_says_so(limiter: TokenLimiter) -> None:
    with pytest.raises(OpenAIError) as info:
        await limiter.charge("50-S", tokens=51, **WHO)
    assert "Request too large" in info.value.message


async def test_usage_corrects_the_estimate_both_ways(limiter: TokenLimiter) -> None:
    charge = await limiter.charge("100-M", tokens=90, **WHO)
    assert charge is not None
    await charge.settle(30)  # the worker used less: 60 given back
    await charge.settle(1000)  # settled once only
    second = await limiter.charge("100-M", tokens=70, **WHO)
    assert second is not None
    await second.settle(75)  # more than estimated: counted, to exactly the limit
    with pytest.raises(OpenAIError):
        await limiter.charge("100-M", tokens=1, **WHO)
    third = await limiter.charge("100-M", tokens=0, **{**WHO, "model": "fresh"})
    assert third is not None
    await third.settle(500)  # a streamed answer far over: the window is full until it passes
    with pytest.raises(OpenAIError):
        await limiter.charge("100-M", tokens=1, **{**WHO, "model": "fresh"})
    unknown = await limiter.charge("100-M", tokens=5, **{**WHO, "model": "quiet"})
    assert unknown is not None
    await unknown.settle(None)  # no usage reported: the estimate stands
    assert unknown.settled is False


async def test_counters_in_redis_are_shared_and_corrected(redis_server: RedisServer) -> None:
    one, two = TokenLimiter(redis_server.url), TokenLimiter(redis_server.url)
    who = {**WHO, "account": "redis-acct"}
    try:
        charge = await one.charge("100-H", tokens=80, **who)
        assert charge is not None
        with pytest.raises(OpenAIError):
            await two.charge("100-H", tokens=30, **who)
        await charge.settle(50)
        assert await two.charge("100-H", tokens=30, **who) is not None
        with pytest.raises(OpenAIError):
            await one.charge("100-H", tokens=21, **who)
    finally:
        await one.storage.reset()
        await one.aclose()
        await two.aclose()


async def test_account_windows_are_shared_by_replicas_in_redis(redis_server: RedisServer) -> None:
    """An account's token windows (accountInputTokenRateLimit/accountOutputTokenRateLimit):
    what one replica counts from a worker's usage, another refuses on."""
    one, two = TokenLimiter(redis_server.url), TokenLimiter(redis_server.url)
    limits = AccountTokens(parse_token_rates("10-H"), parse_token_rates("5-M,100-MO"))
    try:
        await one.admit_account("acct", limits)
        await one.count_account("acct", limits, 9, 4)
        await two.admit_account("acct", limits)  # 9 of 10 and 4 of 5: on
        await two.count_account("acct", limits, 1, 0)
        with pytest.raises(OpenAIError) as refused:
            await one.admit_account("acct", limits)
        assert refused.value.status == 429
        assert "on input tokens (accountInputTokenRateLimit 10-H): 10 tokens counted" in str(
            refused.value.message
        )
        await two.admit_account("other", limits)  # another account's windows are its own
    finally:
        await one.storage.reset()
        await one.aclose()
        await two.aclose()


def test_reset_durations_read_as_gos() -> None:
    cases = [(0, "1ms"), (0.25, "250ms"), (1.5, "1.5s"), (59.9994, "59.999s"), (60, "1m0s")]
    cases += [(61.25, "1m1.25s"), (3600, "1h0m0s"), (7 * 86400, "168h0m0s")]
    for seconds, text in cases:
        assert go_duration(seconds) == text
