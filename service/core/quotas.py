"""Per-account quotas (like NVCF's per-account limits): how many functions, versions per
function, instances across deployments, registry credentials, API keys and assets (and bytes
of them) an account may have. Each domain counts its own rows and calls `enforce`; a refusal
is a 400 problem+json naming the quota and the setting that raises it, and changes nothing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from service.core.errors import DomainError, FieldError
from service.core.settings import Settings

#: Below the limit by more than this, concurrent requests of one account cannot pass it
#: together: the check skips the account lock (and its write) on the hot path.
SLACK = 100


class QuotaExceeded(DomainError):
    status = 400
    type_slug = "quota-exceeded"
    title = "Quota Exceeded"


@dataclass(frozen=True)
class Quota:
    name: str  # e.g. "functions"
    limit: int
    what: str  # what is counted, plural

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
        message = (
            f"the account has {used} {self.what} and may have at most {self.limit}; "
            f"this request would add {adding} (raise {self.setting})"
        )
        raise QuotaExceeded(
            detail=f"quota '{self.name}' exceeded: {message}",
            errors=[FieldError(f"quota.{self.name}", message)],
        )


@dataclass(frozen=True)
class Quotas:
    functions: Quota
    versions_per_function: Quota
    instances: Quota
    registry_credentials: Quota
    api_keys: Quota
    assets: Quota
    asset_bytes: Quota
    tasks: Quota
    active_tasks: Quota

    @classmethod
    def from_settings(cls, settings: Settings) -> Quotas:
        return cls(
            functions=Quota("functions", settings.quota_functions, "functions"),
            versions_per_function=Quota(
                "versions_per_function",
                settings.quota_versions_per_function,
                "versions of this function",
            ),
            instances=Quota(
                "instances", settings.quota_instances, "instances (maxInstances) deployed"
            ),
            registry_credentials=Quota(
                "registry_credentials",
                settings.quota_registry_credentials,
                "registry credentials",
            ),
            api_keys=Quota("api_keys", settings.quota_api_keys, "API keys"),
            assets=Quota("assets", settings.quota_assets, "assets"),
            asset_bytes=Quota(
                "asset_bytes", settings.quota_asset_bytes, "bytes of uploaded assets"
            ),
            tasks=Quota("tasks", settings.quota_tasks, "tasks"),
            active_tasks=Quota(
                "active_tasks", settings.quota_active_tasks, "tasks queued, launched or running"
            ),
        )
