"""Per-account rate limiting of the API (a token bucket's shape on the `limits` library).

Each account may make `burst` requests at once and `rate` per second on average (its own
`Rate`, else the settings'; a rate of 0 is no limit): the limit is `burst` requests per window
of `burst / rate` seconds, counted with `limits`' sliding-window counter (the long-run rate and
the largest burst of a token bucket of that size and rate). Counters live in memory, or in
Redis when `NVCF_REDIS_URL` is set, so several replicas share them. A refused request is a 429
problem+json naming the account, its limit and `Retry-After`.
"""

from __future__ import annotations

import math
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from limits import RateLimitItem, RateLimitItemPerSecond
from limits.aio.storage import MemoryStorage, RedisStorage, Storage
from limits.aio.strategies import SlidingWindowCounterRateLimiter
from redis.asyncio import ConnectionPool

from service.core.errors import TooManyRequests

#: a request's state key: whether the request was counted and allowed (False: refused)
COUNTED = "rate_counted"


def make_storage(redis_url: str | None) -> tuple[Storage, ConnectionPool | None]:
    """`limits` counters in memory, or in Redis through a connection pool of our own (redis-py)
    that the caller closes on shutdown."""
    if not redis_url:
        return MemoryStorage(), None
    pool = ConnectionPool.from_url(redis_url)
    options: dict[str, Any] = {"connection_pool": pool}
    return RedisStorage("async+" + redis_url, implementation="redispy", **options), pool


@dataclass(frozen=True)
class Rate:
    """An account's API rate limit: `per_second` on average (0: none), `burst` at once."""

    per_second: float
    burst: int

    @property
    def window(self) -> int:
        return max(1, math.ceil(self.burst / self.per_second))

    @property
    def item(self) -> RateLimitItem:
        return RateLimitItemPerSecond(self.burst, self.window)

    @property
    def description(self) -> str:
        return (
            f"rateLimitPerSecond {self.per_second:g}, rateLimitBurst {self.burst}: "
            f"{self.burst} requests per {self.window} s"
        )


class RateLimiter:
    """`admit(account, state, rate)` counts one request of the account and raises when over
    its limit (`rate`, else the default)."""

    def __init__(self, rate: float, burst: int, redis_url: str | None = None) -> None:
        self.default = Rate(rate, burst)
        self.storage: Storage
        self._pool: ConnectionPool | None
        self.storage, self._pool = make_storage(redis_url)
        self._limiter = SlidingWindowCounterRateLimiter(self.storage)

    async def allow(self, account: str, rate: Rate | None = None) -> bool:
        """Count one request of `account`; False when it is over the limit."""
        rate = rate or self.default
        if rate.per_second <= 0:
            return True
        return await self._limiter.hit(rate.item, "account", account)

    async def refusal(self, account: str, rate: Rate | None = None) -> TooManyRequests:
        rate = rate or self.default
        stats = await self._limiter.get_window_stats(rate.item, "account", account)
        retry = max(1, math.ceil(stats.reset_time - time.time()))
        return TooManyRequests(
            detail=f"account '{account}' is over its rate limit ({rate.description}); "
            f"retry in {retry} s",
            headers={"Retry-After": str(retry)},
        )

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()

    async def admit(
        self,
        account: str,
        state: MutableMapping[str, Any] | None = None,
        rate: Rate | None = None,
    ) -> None:
        """Count one request of `account` against `rate` (None: the default; 429 when it is
        over), once per request: `state`, the request's, keeps the verdict for every later
        check of the request (the read fast path counts, then the route it falls through to
        answers a refusal)."""
        allowed = state.get(COUNTED) if state is not None else None
        if allowed is None:
            allowed = await self.allow(account, rate)
            if state is not None:
                state[COUNTED] = allowed
        if not allowed:
            raise await self.refusal(account, rate)
