"""An account's limits: NVCF's four (`maxFunctionsAllowed`, `maxTasksAllowed`,
`maxTelemetriesAllowed`, `maxRegistryCredentialsAllowed`) and the platform's own. Each is the
value the operator set for the account, else the global setting: `account_limit` is the one
lookup of a value, `account_quota` the same as a quota to check.

The rates (`RATES`: the API rate limit, and the LLM token limits NVIDIA/nvcf PRs #1658/#1661
name `accountInputTokenRateLimit`/`accountOutputTokenRateLimit`) are read on every request,
from the accounts snapshot (suspensions.py) rather than the database: `api_rate` and
`token_rates` give an account's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.auth import repository
from service.auth.models import Account
from service.core.quotas import LIMIT_WORDS, Quota, limit_refusal
from service.core.ratelimit import Rate
from service.core.settings import Settings
from service.core.token_rates import TokenRate, parse_token_rates

#: NVCF's cap of its 32-bit limits
INT32_MAX = 2_147_483_647


@dataclass(frozen=True)
class Limit:
    name: str  # the wire name, e.g. "maxFunctionsAllowed"
    setting: str  # the Settings attribute of its default
    maximum: int

    def default(self, settings: Settings) -> int:
        return int(getattr(settings, self.setting))

    def refusal(self, account_id: str, value: int) -> str:
        """NVCF's refusal, naming the account, the limit and its value."""
        return limit_refusal(account_id, self.name, value)


LIMITS: dict[str, Limit] = {
    limit.name: limit
    for limit in (
        Limit("maxFunctionsAllowed", "quota_functions", INT32_MAX),
        Limit("maxTasksAllowed", "quota_tasks", INT32_MAX),
        Limit("maxTelemetriesAllowed", "quota_telemetries", 50),
        Limit("maxRegistryCredentialsAllowed", "quota_registry_credentials", 50),
        Limit("maxVersionsPerFunctionAllowed", "quota_versions_per_function", INT32_MAX),
        Limit("maxInstancesAllowed", "quota_instances", INT32_MAX),
        Limit("maxApiKeysAllowed", "quota_api_keys", INT32_MAX),
        Limit("maxAssetsAllowed", "quota_assets", INT32_MAX),
        Limit("maxAssetBytesAllowed", "quota_asset_bytes", 2**62),
        Limit("maxTasksRunningAllowed", "quota_active_tasks", INT32_MAX),
    )
}
assert set(LIMITS) == set(LIMIT_WORDS)

#: the rates' wire names, and the settings of their defaults
RATE_PER_SECOND = "rateLimitPerSecond"
RATE_BURST = "rateLimitBurst"
INPUT_TOKENS = "accountInputTokenRateLimit"
OUTPUT_TOKENS = "accountOutputTokenRateLimit"
RATES: dict[str, str] = {
    RATE_PER_SECOND: "rate_limit_per_second",
    RATE_BURST: "rate_limit_burst",
    INPUT_TOKENS: "llm_account_input_token_rate_limit",
    OUTPUT_TOKENS: "llm_account_output_token_rate_limit",
}
#: the largest `rateLimitPerSecond`
MAX_RATE_PER_SECOND = 1_000_000


def limits_of(account: Account | None, settings: Settings) -> dict[str, Any]:
    """Every limit of an account (None: one never configured), by wire name."""
    own: Mapping[str, Any] = (account.limits or {}) if account is not None else {}
    out: dict[str, Any] = {
        name: int(own[name]) if name in own else limit.default(settings)
        for name, limit in LIMITS.items()
    }
    for name, setting in RATES.items():
        out[name] = own[name] if name in own else getattr(settings, setting)
    return out


def api_rate(own: Mapping[str, Any], default: Rate) -> Rate:
    """An account's API rate limit: its own values (`own`, its stored limits), else `default`."""
    per_second = own.get(RATE_PER_SECOND, default.per_second)
    return Rate(float(per_second), int(own.get(RATE_BURST, default.burst)))


def token_rates(
    own: Mapping[str, Any], defaults: tuple[str, str]
) -> tuple[tuple[TokenRate, ...], tuple[TokenRate, ...]]:
    """An account's LLM token limits, input and output: its own, else `defaults` (the
    settings')."""
    return (
        parse_token_rates(own.get(INPUT_TOKENS, defaults[0])),
        parse_token_rates(own.get(OUTPUT_TOKENS, defaults[1])),
    )


async def _own(session: AsyncSession, account_id: str, name: str) -> int | None:
    account = await repository.account_by_id(session, account_id)
    own = (account.limits or {}) if account is not None else {}
    return int(own[name]) if name in own else None


async def account_limit(
    session: AsyncSession, settings: Settings, account_id: str, name: str
) -> int:
    """The value of limit `name` (a key of `LIMITS`) for `account_id`: the operator's for the
    account, else the global setting's."""
    own = await _own(session, account_id, name)
    return LIMITS[name].default(settings) if own is None else own


async def account_quota(session: AsyncSession, quota: Quota, account_id: str) -> Quota:
    """`quota` (the settings' default) as `account_id`'s."""
    return quota.of_account(account_id, await _own(session, account_id, quota.key))
