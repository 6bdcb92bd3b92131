"""Token rate limits (`llmConfig.tokenRateLimit`, e.g. "1000-S,5000-M"), per model and caller
account, on the `limits` library's counters — in memory, or in Redis (`NVCF_REDIS_URL`) so
replicas share them, as the function rate limits.

A request is charged first from an estimate: its input (a quarter of the UTF-8 bytes of its
text — no tokenizer runs here; the worker's tokenizer is the truth) plus the most it may
produce (`max_tokens`, `max_completion_tokens`, `max_output_tokens`; none given: nothing).
A request whose estimate does not fit in every window is refused with OpenAI's 429 and
`Retry-After`; otherwise the estimate is counted. When the worker reports `usage` (in the
answer, or in a streamed chunk), the difference is settled: more tokens are counted (a
window may then run over, refusing the next requests until it passes), fewer are given back
within the same window.

Windows are fixed (`limits`' fixed window: a counter per window that can be both added to
and given back to, which the estimate-then-correct scheme needs).

An account's own token limits (`accountInputTokenRateLimit`, `accountOutputTokenRateLimit`:
NVIDIA/nvcf PRs #1658/#1661; service/auth/limits.py) are counted apart, per account across
every model: no estimate, the workers' reported `usage` counted after each answer (input and
output each against its own limit), and a request refused before it reaches a worker once a
window's count has reached its limit (`AccountTokens`). The counters live where the models'
do (in memory, or Redis shared by replicas); each expires with its window, so memory holds
only the windows of accounts that called within them.

Every answer of a request that was charged, and every token 429, carries NVCF's
`X-Ratelimit-Limit-Tokens`, `X-Ratelimit-Remaining-Tokens` and `X-Ratelimit-Reset-Tokens`
(the shortest window's, as NVCF chooses; the reset as a Go duration, `1.5s`, `2m0s`) and
`X-Should-Retry` (a 429: `true` unless the wait is over a minute, as NVCF; an answer: `false`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from limits import RateLimitItem, RateLimitItemPerDay, RateLimitItemPerSecond
from limits.aio.strategies import FixedWindowRateLimiter

from service.auth.limits import INPUT_TOKENS, OUTPUT_TOKENS
from service.core.ratelimit import make_storage
from service.core.token_rates import MAX_TOKEN_DIGITS, TokenRate, parse_token_rates
from service.functions.llm_config import EMBEDDINGS, RESPONSES
from service.llm.errors import OpenAIError

#: bytes of text per token in the estimate (English text runs about four)
BYTES_PER_TOKEN = 4
_NAMESPACE = "llm-tokens"
_ACCOUNT_NAMESPACE = "llm-account-tokens"
#: the most tokens one answer's `usage` counts (a worker's figure is bounded like a limit's)
MAX_COUNTED = 10**MAX_TOKEN_DIGITS


def _item(rate: TokenRate) -> RateLimitItem:
    if rate.unit == "W":
        return RateLimitItemPerDay(rate.count, 7)
    return RateLimitItemPerSecond(rate.count, rate.seconds)


def _text_bytes(value: Any) -> int:
    """The UTF-8 bytes of the text in a request's content (strings anywhere inside)."""
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item.encode("utf-8", "surrogatepass"))
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return total


def input_estimate(path: str, body: Mapping[str, Any]) -> int:
    """The tokens of a request's input text, as estimated here."""
    content = body.get("input") if path in (EMBEDDINGS, RESPONSES) else body.get("messages")
    if path == RESPONSES and body.get("instructions"):
        content = [content, body.get("instructions")]
    return math.ceil(_text_bytes(content) / BYTES_PER_TOKEN)


def estimate(path: str, body: Mapping[str, Any], given: int | None = None) -> int:
    """The tokens a request is charged before the worker says: its input text (`given`, when
    already estimated) and the most it may produce."""
    if given is None:
        given = input_estimate(path, body)
    limits = [body.get(k) for k in ("max_completion_tokens", "max_tokens", "max_output_tokens")]
    produced = next(
        (v for v in limits if isinstance(v, int) and not isinstance(v, bool) and v >= 0), 0
    )
    return given + produced


@dataclass(frozen=True, slots=True)
class _Counter:
    rate: TokenRate
    item: RateLimitItem
    ids: tuple[str, ...]


#: NVCF's longest wait a 429 tells a client to retry after (X-Should-Retry)
RETRY_WITHIN = 60


def go_duration(seconds: float) -> str:
    """A duration as Go's `time.Duration.String` writes it at millisecond resolution (at
    least 1ms), as NVCF's reset headers are: `250ms`, `1.5s`, `2m0s`, `1h0m0s`."""
    ms = max(1, int(seconds * 1000))
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    whole, fraction = divmod(rest, 1000)
    text = f"{whole}.{fraction:03d}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    return f"{minutes}m{text}" if minutes else text


@dataclass
class Charge:
    """What a request was charged; `settle` corrects it from the worker's usage (once)."""

    limiter: TokenLimiter
    counters: Sequence[_Counter]
    charged: int
    #: the window each counter was charged in (its reset time), to give back only there
    resets: Sequence[float]
    #: the X-Ratelimit-*-Tokens headers as of the charge
    headers: dict[str, str]
    settled: bool = False

    async def settle(self, used: int | None) -> None:
        """Count `used` tokens instead of the estimate (None: the worker did not say; the
        estimate stands)."""
        if self.settled or used is None:
            return
        self.settled = True
        await self.limiter.correct(self, used - self.charged)


class TokenLimiter:
    """Counts tokens against models' token rate limits; `aclose()` on shutdown."""

    def __init__(self, redis_url: str | None = None) -> None:
        self.storage, self._pool = make_storage(redis_url)
        self._limiter = FixedWindowRateLimiter(self.storage)

    def _counters(
        self, rates: Sequence[TokenRate], account: str, function_id: str, model: str
    ) -> list[_Counter]:
        return [
            _Counter(r, _item(r), (_NAMESPACE, account, function_id, model, r.text)) for r in rates
        ]

    async def charge(
        self, limit: Any, *, account: str, function_id: str, model: str, tokens: int
    ) -> Charge | None:
        """Charge `tokens` against the model's stored `tokenRateLimit` for `account`, or
        raise OpenAI's 429 when any window cannot take them; None when the model has no
        limit."""
        rates = parse_token_rates(limit)
        if not rates:
            return None
        counters = self._counters(rates, account, function_id, model)
        refused: list[_Counter] = []
        for c in counters:
            if not await self._limiter.test(c.item, *c.ids, cost=max(tokens, 1)):
                refused.append(c)
        if refused:
            raise await self._refusal(refused, tokens, model)
        for c in counters:
            await self._limiter.hit(c.item, *c.ids, cost=tokens)
        resets = [await self._reset(c) for c in counters]
        return Charge(self, counters, tokens, resets, await self._headers(counters))

    async def _reset(self, c: _Counter) -> float:
        return (await self._limiter.get_window_stats(c.item, *c.ids)).reset_time

    async def _headers(self, counters: Sequence[_Counter]) -> dict[str, str]:
        """NVCF's X-Ratelimit-*-Tokens of the shortest window."""
        shortest = min(counters, key=lambda c: c.rate.seconds)
        stats = await self._limiter.get_window_stats(shortest.item, *shortest.ids)
        return {
            "X-Ratelimit-Limit-Tokens": str(shortest.rate.count),
            "X-Ratelimit-Remaining-Tokens": str(max(0, stats.remaining)),
            "X-Ratelimit-Reset-Tokens": go_duration(stats.reset_time - time.time()),
        }

    async def correct(self, charge: Charge, delta: int) -> None:
        if delta > 0:
            for c in charge.counters:
                await self._limiter.hit(c.item, *c.ids, cost=delta)
            return
        if delta == 0:
            return
        now = time.time()
        for c, reset in zip(charge.counters, charge.resets, strict=True):
            if now >= reset:
                continue  # the charged window has passed: nothing of this request is counted
            key = c.item.key_for(*c.ids)
            back = min(-delta, max(await self.storage.get(key), 0))
            if back:
                await self.storage.incr(key, c.item.get_expiry(), -back)

    async def _refusal(self, refused: list[_Counter], tokens: int, model: str) -> OpenAIError:
        retry = 1
        for c in refused:
            stats = await self._limiter.get_window_stats(c.item, *c.ids)
            retry = max(retry, math.ceil(stats.reset_time - time.time()))
        limits = ", ".join(c.rate.text for c in refused)
        too_big = [c for c in refused if tokens > c.rate.count]
        if too_big:
            message = (
                f"Request too large for model `{model}`: about {tokens} tokens requested, "
                f"more than its token rate limit allows at all ({limits}). Lower max_tokens "
                "or the input."
            )
        else:
            message = (
                f"Rate limit reached for model `{model}` on tokens ({limits}): about {tokens} "
                f"tokens requested. Please try again in {retry}s."
            )
        return OpenAIError(
            429,
            message,
            type="tokens",
            code="rate_limit_exceeded",
            headers={
                **await self._headers(refused),
                "Retry-After": str(retry),
                "X-Should-Retry": "true" if retry <= RETRY_WITHIN else "false",
            },
        )

    async def admit_account(self, account: str, limits: AccountTokens) -> None:
        """Refuse (OpenAI's 429 naming the limit) a request of `account` once any window of
        its token limits has counted its limit."""
        for c in limits.counters(account):
            counted = await self.storage.get(c.item.key_for(*c.ids))
            if counted >= c.rate.count:
                raise await self._account_refusal(account, c, counted)

    async def count_account(
        self, account: str, limits: AccountTokens, input_tokens: int, output_tokens: int
    ) -> None:
        """Count an answer's reported tokens in every window of the account's limits."""
        used = {"input": input_tokens, "output": output_tokens}
        for c in limits.counters(account):
            tokens = min(used[c.ids[2]], MAX_COUNTED)
            if tokens > 0:
                await self._limiter.hit(c.item, *c.ids, cost=tokens)

    async def _account_refusal(self, account: str, c: _Counter, counted: int) -> OpenAIError:
        stats = await self._limiter.get_window_stats(c.item, *c.ids)
        retry = max(1, math.ceil(stats.reset_time - time.time()))
        kind = c.ids[2]
        name = INPUT_TOKENS if kind == "input" else OUTPUT_TOKENS
        return OpenAIError(
            429,
            f"Rate limit reached for account `{account}` on {kind} tokens ({name} "
            f"{c.rate.text}): {counted} tokens counted of {c.rate.count} in this window. "
            f"Please try again in {retry}s.",
            type="tokens",
            code="rate_limit_exceeded",
            headers={
                "Retry-After": str(retry),
                "X-Should-Retry": "true" if retry <= RETRY_WITHIN else "false",
            },
        )

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()


@dataclass(frozen=True)
class AccountTokens:
    """An account's token limits, input and output (none: empty)."""

    input: tuple[TokenRate, ...] = ()
    output: tuple[TokenRate, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.input or self.output)

    def counters(self, account: str) -> list[_Counter]:
        """A counter per window, keyed by its unit and not its count: a changed limit judges
        the tokens already counted in the window."""
        return [
            _Counter(
                r,
                RateLimitItemPerSecond(MAX_COUNTED, r.seconds),
                (_ACCOUNT_NAMESPACE, account, kind, r.unit),
            )
            for kind, rates in (("input", self.input), ("output", self.output))
            for r in rates
        ]
