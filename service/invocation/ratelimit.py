"""Function rate limits (a version's `rateLimit`), enforced as NVCF's rate limiter does.

The stored object is NVCF's `RateLimitDto`: `rateLimit` ("100-S,5000-H"), `exemptedNcaIds`,
`perNcaIdRate` ({ncaId: rate}) and `perUserRate`. A rate string lists `<count>-<unit>` items
(S, M, H, D); every item is its own counter and all must allow (of two items with the same unit
the stricter counts). A request is checked against at most two tiers:

- the NCA tier, exactly one of: the caller account's `perNcaIdRate` entry when there is one,
  else the global `rateLimit` — skipped for an account in `exemptedNcaIds`;
- the user tier, when `perUserRate` is set: the same rate for every caller identity (the
  credential's subject), counted per identity and account, on top of the NCA tier.

Counters are per (caller account, function version, rate) — NVCF's key layout — in the
`limits` library's moving window (exact: no burst across a window edge), in memory or in Redis
(`NVCF_REDIS_URL`) so replicas share them. A refusal is a 429 problem+json with `Retry-After`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from limits import (
    RateLimitItem,
    RateLimitItemPerDay,
    RateLimitItemPerHour,
    RateLimitItemPerMinute,
    RateLimitItemPerSecond,
)
from limits.aio.strategies import MovingWindowRateLimiter

from service.core.errors import TooManyRequests
from service.core.numbers import natural
from service.core.ratelimit import make_storage

_UNITS: dict[str, type[RateLimitItem]] = {
    "S": RateLimitItemPerSecond,
    "M": RateLimitItemPerMinute,
    "H": RateLimitItemPerHour,
    "D": RateLimitItemPerDay,
}
#: at most this many per-account entries are read from a stored policy (NVCF allows 32)
MAX_PER_NCA = 32
#: digits of a rate's count (as functions' RATE_RE allows at creation)
MAX_RATE_DIGITS = 9


@dataclass(frozen=True)
class Rate:
    """One `<count>-<unit>` item and its counter."""

    text: str
    item: RateLimitItem


def parse_rates(value: Any) -> tuple[Rate, ...]:
    """The items of a rate string; malformed items are skipped (as NVCF's limiter does) and
    of two items with the same unit the stricter stays."""
    if not isinstance(value, str):
        return ()
    best: dict[str, Rate] = {}
    for part in value.split(","):
        text, _, unit = part.strip().partition("-")
        unit = unit.strip().upper()
        count = natural(text.strip(), max_digits=MAX_RATE_DIGITS)
        if count is None or unit not in _UNITS or count < 1:
            continue
        rate = Rate(f"{count}-{unit}", _UNITS[unit](count))
        kept = best.get(unit)
        if kept is None or rate.item.amount < kept.item.amount:
            best[unit] = rate
    return tuple(best[u] for u in _UNITS if u in best)


@dataclass(frozen=True)
class RatePolicy:
    """A version's rate limits, read defensively from the stored `rateLimit` object."""

    rates: tuple[Rate, ...] = ()
    exempted: frozenset[str] = frozenset()
    per_nca: Mapping[str, tuple[Rate, ...]] | None = None
    per_user: tuple[Rate, ...] = ()

    @classmethod
    def from_stored(cls, stored: Any) -> RatePolicy | None:
        """None when the version has no limit at all."""
        if not isinstance(stored, Mapping):
            return None
        exempted = stored.get("exemptedNcaIds")
        per_nca_raw = stored.get("perNcaIdRate")
        per_nca: dict[str, tuple[Rate, ...]] = {}
        if isinstance(per_nca_raw, Mapping):
            for nca, text in list(per_nca_raw.items())[:MAX_PER_NCA]:
                rates = parse_rates(text)
                if rates:
                    per_nca[str(nca)] = rates
        policy = cls(
            rates=parse_rates(stored.get("rateLimit")),
            exempted=frozenset(str(e) for e in exempted)
            if isinstance(exempted, Sequence) and not isinstance(exempted, str)
            else frozenset(),
            per_nca=per_nca or None,
            per_user=parse_rates(stored.get("perUserRate")),
        )
        if not (policy.rates or policy.per_nca or policy.per_user):
            return None
        return policy

    def tiers(self, account: str, subject: str) -> list[tuple[str, tuple[Rate, ...]]]:
        """(counter prefix, rates) of every tier that applies to a caller."""
        out: list[tuple[str, tuple[Rate, ...]]] = []
        own = (self.per_nca or {}).get(account)
        if own:
            out.append((f"nca:{account}", own))
        elif self.rates and account not in self.exempted:
            out.append((f"nca:{account}", self.rates))
        if self.per_user and subject:
            out.append((f"user:{subject}:{account}", self.per_user))
        return out


class FunctionRateLimiter:
    """Counts invocations against versions' rate policies; `aclose()` on shutdown."""

    def __init__(self, redis_url: str | None = None) -> None:
        self.storage, self._pool = make_storage(redis_url)
        self._limiter = MovingWindowRateLimiter(self.storage)

    async def check(
        self, policy: RatePolicy, *, account: str, subject: str, version_id: str
    ) -> None:
        """Count one request; raise `TooManyRequests` (with `Retry-After`) when any counter of
        any tier that applies is over its rate. Every counter is counted."""
        refused: list[tuple[str, Rate]] = []
        for prefix, rates in policy.tiers(account, subject):
            for rate in rates:
                if not await self._limiter.hit(rate.item, "invoke", prefix, version_id, rate.text):
                    refused.append((prefix, rate))
        if not refused:
            return
        retry = 1
        for prefix, rate in refused:
            stats = await self._limiter.get_window_stats(
                rate.item, "invoke", prefix, version_id, rate.text
            )
            retry = max(retry, math.ceil(stats.reset_time - time.time()))
        tier = "per-user rate" if refused[0][0].startswith("user:") else "rate limit"
        raise TooManyRequests(
            detail=f"function version {version_id} is over its {tier} "
            f"({', '.join(r.text for _, r in refused)}) for account '{account}'; "
            f"retry in {retry} s",
            headers={"Retry-After": str(retry)},
        )

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()
