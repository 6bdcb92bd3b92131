"""Per-account quotas (NVCF's per-account limits): how many functions, versions per function,
instances across deployments, registry credentials, telemetry endpoints, API keys, assets (and
bytes of them) and tasks an account may have. The settings give every account's default; the
operator sets an account's own (service/auth/limits.py gives a domain the account's `Quota`).
Each domain counts its own rows and calls `check`; a refusal is a 400 problem+json naming the
account, the limit and its value in NVCF's words, and how to raise it, and changes nothing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from service.core.errors import DomainError, FieldError
from service.core.settings import Settings

#: Below the limit by more than this, concurrent requests of one account cannot pass it
#: together: the check skips the account lock (and its write) on the hot path.
SLACK = 100

#: NVCF's words for what each account limit counts (by its wire name)
LIMIT_WORDS: dict[str, str] = {
    "maxFunctionsAllowed": "the number of functions allowed",
    "maxTasksAllowed": "the number of tasks allowed",
    "maxTelemetriesAllowed": "the number of telemetries allowed",
    "maxRegistryCredentialsAllowed": "the number of registry credentials allowed",
    "maxVersionsPerFunctionAllowed": "the number of versions of a function allowed",
    "maxInstancesAllowed": "the number of instances allowed",
    "maxApiKeysAllowed": "the number of API keys allowed",
    "maxAssetsAllowed": "the number of assets allowed",
    "maxAssetBytesAllowed": "the number of bytes of assets allowed",
    "maxTasksRunningAllowed": "the number of tasks running at once allowed",
}


def limit_refusal(account_id: str, key: str, value: int) -> str:
    """NVCF's refusal of an account's limit, e.g. "Account 'a': Reached or exceeded the max
    limit for the number of functions allowed: 10." """
    what = LIMIT_WORDS[key]
    return f"Account '{account_id}': Reached or exceeded the max limit for {what}: {value}."


class QuotaExceeded(DomainError):
    status = 400
    type_slug = "quota-exceeded"
    title = "Quota Exceeded"


@dataclass(frozen=True)
class Quota:
    name: str  # e.g. "functions"
    limit: int
    what: str  # what is counted, plural
    key: str  # the account limit's wire name, e.g. "maxFunctionsAllowed"
    #: whose limit this is (None: the settings' default, not yet an account's)
    account: str | None = None

    def of_account(self, account_id: str, own: int | None) -> Quota:
        """This quota for `account_id`, whose own limit is `own` (None: the default)."""
        return replace(self, account=account_id, limit=self.limit if own is None else own)

    @property
    def lock_free_below(self) -> int:
        """While an account uses fewer than this, adding one needs neither the account lock
        nor a count of its own (`check` and the callers that count in their insert agree)."""
        return self.limit - SLACK

    @property
    def setting(self) -> str:
        return f"NVCF_QUOTA_{self.name.upper()}"

    async def check(
        self,
        count: Callable[[], Awaitable[int]],
        lock: Callable[[], Awaitable[None]],
        adding: int = 1,
    ) -> None:
        """Refuse when the account's `count()` plus `adding` would pass the limit. Close to
        the limit, `lock()` serialises the account's requests and the count is taken again,
        so two concurrent requests never both take the last places."""
        used = await count()
        if used + adding > self.lock_free_below:
            await lock()
            used = await count()
        self.enforce(used, adding)

    def enforce(self, used: int, adding: int = 1) -> None:
        """Refuse when `used + adding` would pass the limit."""
        if used + adding <= self.limit:
            return
        raise self.refused(
            f"the account has {used} {self.what} and may have at most {self.limit}; "
            f"this request would add {adding}"
        )

    def refused(self, why: str) -> QuotaExceeded:
        """The refusal: NVCF's words as the detail; `why` and how to raise the limit as the
        error of `quota.<name>`."""
        account = self.account or "?"
        message = (
            f"{why} (raise `{self.key}` with PATCH /v2/nvcf/accounts/{account}, or "
            f"{self.setting} for every account)"
        )
        return QuotaExceeded(
            detail=limit_refusal(account, self.key, self.limit),
            errors=[FieldError(f"quota.{self.name}", message)],
        )


@dataclass(frozen=True)
class Quotas:
    functions: Quota
    versions_per_function: Quota
    instances: Quota
    registry_credentials: Quota
    telemetries: Quota
    api_keys: Quota
    assets: Quota
    asset_bytes: Quota
    tasks: Quota
    active_tasks: Quota

    @classmethod
    def from_settings(cls, settings: Settings) -> Quotas:
        return cls(
            functions=Quota(
                "functions", settings.quota_functions, "functions", "maxFunctionsAllowed"
            ),
            versions_per_function=Quota(
                "versions_per_function",
                settings.quota_versions_per_function,
                "versions of this function",
                "maxVersionsPerFunctionAllowed",
            ),
            instances=Quota(
                "instances",
                settings.quota_instances,
                "instances (maxInstances) deployed",
                "maxInstancesAllowed",
            ),
            registry_credentials=Quota(
                "registry_credentials",
                settings.quota_registry_credentials,
                "registry credentials",
                "maxRegistryCredentialsAllowed",
            ),
            telemetries=Quota(
                "telemetries",
                settings.quota_telemetries,
                "telemetry endpoints",
                "maxTelemetriesAllowed",
            ),
            api_keys=Quota("api_keys", settings.quota_api_keys, "API keys", "maxApiKeysAllowed"),
            assets=Quota("assets", settings.quota_assets, "assets", "maxAssetsAllowed"),
            asset_bytes=Quota(
                "asset_bytes",
                settings.quota_asset_bytes,
                "bytes of uploaded assets",
                "maxAssetBytesAllowed",
            ),
            tasks=Quota("tasks", settings.quota_tasks, "tasks", "maxTasksAllowed"),
            active_tasks=Quota(
                "active_tasks",
                settings.quota_active_tasks,
                "tasks queued, launched or running",
                "maxTasksRunningAllowed",
            ),
        )
