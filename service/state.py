"""The application's typed state: what the lifespan builds (service/lifespan.py) and what routes,
middleware and the fast path read, with their types, instead of untyped `app.state` lookups.

`AppState` is Starlette's `State` with declared attributes; those the server may run without
(a read cache on PostgreSQL, a reconciler in tests) start as None.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from starlette.datastructures import State
from starlette.requests import Request

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

    from service.assets.service import Assets
    from service.auth.restrict import FunctionReach
    from service.auth.service import Authenticator
    from service.charts.pipeline import ChartPipeline
    from service.clusters.adapters import AdapterRegistry
    from service.clusters.catalog import Catalog
    from service.core.crypto import SecretBox
    from service.core.events import Events
    from service.core.middleware import Metrics
    from service.core.quotas import Quotas
    from service.core.ratelimit import RateLimiter
    from service.core.settings import Settings
    from service.deployments.autoscaler.loop import Autoscaler
    from service.deployments.history import HistoryPurger
    from service.deployments.logs.service import FollowLimiter
    from service.deployments.reconcile import NamespaceCollector, Reconciler
    from service.deployments.timeseries.store import TimeSeries
    from service.functions.deps import ActiveInstances
    from service.functions.read_cache import VersionCache
    from service.invocation import InvocationPlane
    from service.invocation.grpc.entry import GrpcEntry
    from service.observability.deps import TelemetryUsers
    from service.observability.export import Exports
    from service.tasks.loop import TaskLoop
    from service.tasks.service import Tasks
    from service.telemetry import Telemetry


class AppState(State):
    settings: Settings
    quotas: Quotas
    authenticator: Authenticator
    #: what a key limited to named functions reaches (deployments/reach.py)
    function_reach: FunctionReach
    #: the app's metric families and tracing (service/telemetry.py)
    telemetry: Telemetry
    #: `telemetry.metrics`: the registry `/metrics` exports, with the HTTP families
    metrics: Metrics
    engine: AsyncEngine
    sessionmaker: async_sessionmaker[AsyncSession]
    secret_box: SecretBox
    catalog: Catalog
    chart_pipeline: ChartPipeline
    adapters: AdapterRegistry
    reconciler: Reconciler | None
    #: wakes the reconciler (deployments/deps.py: WakeDep)
    wake_reconciler: Callable[[], None]
    #: the domain events' subscriptions (core/events.py)
    events: Events
    #: a version's activeInstances, read from deployments (functions/deps.py)
    active_instances: ActiveInstances
    #: the function versions (later tasks) naming a telemetry (observability/deps.py)
    telemetry_users: TelemetryUsers
    namespace_collector: NamespaceCollector | None
    #: purges expired history of removed deployments (runs where the reconciler runs)
    history_purger: HistoryPurger | None
    #: the autoscaler (runs where the reconciler runs)
    autoscaler: Autoscaler | None
    #: the version read cache (SQLite only: one process sees every commit)
    version_cache: VersionCache | None
    #: the API rate limit per account (None only before the state is set up)
    rate_limiter: RateLimiter | None
    #: None when this process does not serve invocations
    invocation: InvocationPlane | None
    #: the gRPC listener (None: not served by this process)
    grpc: GrpcEntry | None
    #: the export to tenants' telemetry endpoints (None: no invocation plane here)
    telemetry_exports: Exports | None
    #: open log follows per account (deployments/logs)
    log_follows: FollowLimiter
    #: per-version time series of this replica's counters (deployments/timeseries)
    timeseries: TimeSeries | None
    #: assets, their store and large results (service/assets/)
    assets: Assets | None
    #: tasks (service/tasks/) and their loop (None: not served by this process)
    tasks: Tasks | None
    task_loop: TaskLoop | None

    def __init__(self) -> None:
        # Values live in State's dict (class attributes would shadow them).
        super().__init__(
            {
                "reconciler": None,
                "namespace_collector": None,
                "history_purger": None,
                "autoscaler": None,
                "version_cache": None,
                "rate_limiter": None,
                "invocation": None,
                "grpc": None,
                "telemetry_exports": None,
                "timeseries": None,
                "assets": None,
                "tasks": None,
                "task_loop": None,
            }
        )


def app_state(request: Request) -> AppState:
    """The typed state of the request's application."""
    return cast(AppState, request.app.state)
