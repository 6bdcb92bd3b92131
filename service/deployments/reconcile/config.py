"""Tuning of the reconciler and of the namespace collector, mapped from the `NVCF_` settings."""

from __future__ import annotations

from dataclasses import dataclass, field

from service.core.settings import Settings
from service.health.machine import HealthTimeouts


@dataclass(frozen=True)
class ReconcilerConfig:
    """How the reconciler paces itself and judges instances."""

    #: seconds between passes when nothing wakes it (and between polls of starting instances)
    interval: float = 2.0
    lease_seconds: float = 60.0
    #: a Running instance with no health timer pending is re-observed at most this often
    resync_seconds: float = 10.0
    #: units of work in flight at once (1 on SQLite, which has a single writer)
    concurrency: int = 8
    #: deployments claimed and finished together in one unit of work
    batch_size: int = 50
    timeouts: HealthTimeouts = field(default_factory=HealthTimeouts)
    #: failed instances kept per deployment (for the API's instances/healthInfo)
    failed_history: int = 10

    @classmethod
    def from_settings(cls, settings: Settings) -> ReconcilerConfig:
        sqlite = settings.effective_database_url.startswith("sqlite")
        return cls(
            interval=settings.reconcile_interval,
            lease_seconds=settings.reconcile_lease_seconds,
            resync_seconds=settings.reconcile_resync_seconds,
            concurrency=1 if sqlite else settings.reconcile_concurrency,
            batch_size=settings.reconcile_batch_size,
            timeouts=HealthTimeouts(
                pod_scheduling=settings.health_pod_scheduling_timeout,
                image_pull=settings.health_image_pull_timeout,
                restart_loop=settings.health_restart_loop_timeout,
                init=settings.health_init_timeout,
                worker_startup=settings.health_worker_startup_timeout,
                worker_degradation=settings.health_worker_degradation_period,
                pending=settings.health_pending_timeout,
                failing_backoff=settings.health_failing_backoff,
                failing_recheck=min(30.0, settings.health_failing_backoff),
            ),
        )


@dataclass(frozen=True)
class CollectorConfig:
    """Orphaned-namespace garbage collection: period (0 disables), bound of one round, and the
    age under which a namespace is never collected (another replica may have created its
    instance after this one read the known ids)."""

    period: float = 300.0
    timeout: float = 60.0
    min_age: float = 120.0

    @classmethod
    def from_settings(cls, settings: Settings) -> CollectorConfig:
        return cls(
            period=settings.reconcile_gc_seconds,
            timeout=settings.reconcile_gc_timeout_seconds,
            min_age=settings.reconcile_gc_min_age_seconds,
        )
