"""Tuning of the reconciler and of the namespace collector, mapped from the `NVCF_` settings."""

from __future__ import annotations

from dataclasses import dataclass, field

from service.core.settings import Settings
from service.health.machine import HealthTimeouts

#: the settings' defaults, read once: each default is written in service/core/settings.py only
_DEFAULTS = Settings.model_construct()


@dataclass(frozen=True)
class ReconcilerConfig:
    """How the reconciler paces itself and judges instances."""

    #: seconds between passes when nothing wakes it (and between polls of starting instances)
    interval: float = _DEFAULTS.reconcile_interval
    lease_seconds: float = _DEFAULTS.reconcile_lease_seconds
    #: safety net: a settled Running instance is re-observed this often (resync.py)
    resync_seconds: float = _DEFAULTS.reconcile_resync_seconds
    #: units of work in flight at once (1 on SQLite, which has a single writer)
    concurrency: int = _DEFAULTS.reconcile_concurrency
    #: deployments claimed and finished together in one unit of work
    batch_size: int = _DEFAULTS.reconcile_batch_size
    #: instances tried per instance of a spec's minimum while its version is DEPLOYING
    deploy_attempts: int = _DEFAULTS.reconcile_deploy_attempts
    timeouts: HealthTimeouts = field(default_factory=HealthTimeouts)
    #: failed instances kept per deployment (for the API's instances/healthInfo)
    failed_history: int = 10
    #: seconds a removed deployment's history stays readable (deployments/history.py)
    history_retention: float = _DEFAULTS.history_retention_seconds
    #: seconds a draining instance may take to finish its requests
    drain_timeout: float = _DEFAULTS.drain_timeout_seconds
    #: a draining instance is kept at least this long, so cached routes forget it
    drain_grace: float = _DEFAULTS.invoke_route_cache_seconds
    #: last lines (and bytes) of each container kept when an instance fails (deployments/logs)
    kept_lines: int = _DEFAULTS.logs_kept_lines
    kept_bytes: int = _DEFAULTS.logs_kept_bytes

    @classmethod
    def from_settings(cls, settings: Settings) -> ReconcilerConfig:
        sqlite = settings.effective_database_url.startswith("sqlite")
        return cls(
            interval=settings.reconcile_interval,
            lease_seconds=settings.reconcile_lease_seconds,
            resync_seconds=settings.reconcile_resync_seconds,
            concurrency=1 if sqlite else settings.reconcile_concurrency,
            batch_size=settings.reconcile_batch_size,
            deploy_attempts=settings.reconcile_deploy_attempts,
            timeouts=HealthTimeouts.from_settings(settings),
            history_retention=settings.history_retention_seconds,
            drain_timeout=settings.drain_timeout_seconds,
            drain_grace=settings.invoke_route_cache_seconds,
            kept_lines=settings.logs_kept_lines,
            kept_bytes=settings.logs_kept_bytes,
        )


@dataclass(frozen=True)
class CollectorConfig:
    """Orphaned-namespace garbage collection: period (0 disables), bound of one round, and the
    age under which a namespace is never collected (another replica may have created its
    instance after this one read the known ids)."""

    period: float = _DEFAULTS.reconcile_gc_seconds
    timeout: float = _DEFAULTS.reconcile_gc_timeout_seconds
    min_age: float = _DEFAULTS.reconcile_gc_min_age_seconds

    @classmethod
    def from_settings(cls, settings: Settings) -> CollectorConfig:
        return cls(
            period=settings.reconcile_gc_seconds,
            timeout=settings.reconcile_gc_timeout_seconds,
            min_age=settings.reconcile_gc_min_age_seconds,
        )
