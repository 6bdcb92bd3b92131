"""The process's lifespan (the composition, docs/architecture.md): what `create_app` decided
(`Composition`), and the module-level `lifespan` that opens, wires and starts each plane's
components in order (what every plane shares, the control plane, the invocation plane, then the
loops and the gRPC listener) and closes them in reverse. The first start makes the admin key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.assets.service import Assets
from service.auth import scopes, tokens
from service.auth.repository import any_key
from service.auth.service import create_api_key, grant_scopes
from service.auth.suspensions import Suspensions
from service.auth.tokens import InvocationTokens
from service.backends.http1 import AnswerBounds
from service.backends.kubernetes.adapter import adds_collector
from service.charts.pipeline import ChartPipeline
from service.clusters.adapters import AdapterRegistry, collector_pod, worker_utils_pod
from service.clusters.catalog import load_catalog
from service.core import migrate
from service.core.crypto import load_secret_box
from service.core.db import make_engine, make_sessionmaker
from service.core.events import Events
from service.core.loops import LoopService, Startable
from service.core.settings import Settings
from service.deployments import subscribers
from service.deployments.announcements import DeploymentDeleted
from service.deployments.autoscaler.loop import Autoscaler, AutoscalerConfig
from service.deployments.canary_loop import CanaryLoop
from service.deployments.exported import InstanceExports
from service.deployments.history import HistoryConfig, HistoryPurger
from service.deployments.models import Deployment, Instance
from service.deployments.reconcile import Reconciler, build_reconciler, claim_owner
from service.deployments.reconcile.owner import OwnerId
from service.deployments.repository import active_instances
from service.deployments.timeseries.store import TimeSeries
from service.functions import read_cache
from service.functions import repository as functions_repository
from service.functions.events import AccessChanged
from service.functions.secrets import telemetry_key_replaced
from service.invocation import InvocationPlane
from service.invocation.dispatch_redis import RedisActivity
from service.invocation.grpc.entry import GrpcEntry
from service.invocation.metrics import InvocationMetrics
from service.llm.gateway import Gateway
from service.metering.counts import Meter
from service.observability.endpoints import Drops
from service.observability.export import Exports
from service.observability.pipeline import ExportSettings
from service.observability.service import KeyReplaced
from service.tasks import repository as tasks_repository
from service.tasks.exported import TaskExports
from service.tasks.loop import TaskLoop
from service.tasks.service import Tasks, known_task_ids
from service.telemetry import Telemetry

log = logging.getLogger("nvcf.server")

ADMIN_KEY_FILE = "admin-api-key"
#: where `nvcf-server invoke` keeps its replica id (inside the data dir)
INVOCATION_OWNER_DIR = "invocation"


@dataclass(frozen=True)
class Composition:
    """What `create_app` decided, read by the lifespan when the process starts."""

    settings: Settings
    telemetry: Telemetry
    #: the invocation plane alone (`nvcf-server invoke`)
    invocation_only: bool
    #: whether this process serves the invocation routes (alone, or `NVCF_INVOKE_ENABLED`)
    invocation: bool
    invocation_metrics: InvocationMetrics
    #: the LLM gateway, where the invocation routes are served
    llm_gateway: Gateway | None


@asynccontextmanager
async def lifespan(app: FastAPI, composition: Composition) -> AsyncIterator[None]:
    """The process's components opened, wired and started (one list of loops); each one's
    close is pushed as it is opened, so teardown runs in reverse, once. `create_app` binds
    `composition`."""
    c = composition
    async with contextlib.AsyncExitStack() as opened:
        shared = await _open_shared(app, c, opened)
        control = None if c.invocation_only else await _open_control(app, c, opened, shared)
        plane = await _open_invocation(app, c, opened, shared, control)
        loops = control.loops if control is not None else []
        # the gRPC listener and the plane, pushed after the loops, stop before them
        for loop in loops:
            loop.start()
            opened.push_async_callback(loop.stop)
        if plane is not None:
            opened.push_async_callback(plane.stop)
            if c.settings.grpc_enabled:
                grpc_entry = GrpcEntry(
                    c.settings, plane.engine, app.state.authenticator, shared.maker
                )
                await grpc_entry.start()
                opened.push_async_callback(grpc_entry.stop)
                app.state.grpc = grpc_entry
        yield


@dataclass(frozen=True)
class Shared:
    """What every plane of the process uses, opened first."""

    maker: async_sessionmaker[AsyncSession]
    events: Events
    assets: Assets
    adapters: AdapterRegistry
    #: one replica id for the reconciler's leases and the invocation plane's requests
    owner: OwnerId


async def _open_shared(app: FastAPI, c: Composition, opened: contextlib.AsyncExitStack) -> Shared:
    """Tracing, the database, events, caches, secrets, assets, the clusters' adapters and the
    replica's id."""
    settings, telemetry = c.settings, c.telemetry
    opened.push_async_callback(asyncio.to_thread, telemetry.tracing.shutdown)
    await asyncio.to_thread(Path(settings.data_dir).mkdir, mode=0o700, parents=True, exist_ok=True)
    url = settings.effective_database_url
    if settings.auto_migrate:
        await asyncio.to_thread(migrate.upgrade, url)
    engine = make_engine(url)
    opened.push_async_callback(engine.dispose)
    app.state.engine = engine
    app.state.sessionmaker = maker = make_sessionmaker(engine)
    if app.state.rate_limiter is not None:
        opened.push_async_callback(app.state.rate_limiter.aclose)
    app.state.events = events = Events()
    if read_cache.enabled(settings):
        app.state.version_cache = read_cache.VersionCache()
        # a version's details embed its activeInstances, read from deployments' tables
        read_cache.attach(app.state.version_cache, deployment=Deployment, instance=Instance)
    app.state.secret_box = await asyncio.to_thread(load_secret_box, settings)
    app.state.authenticator.suspensions = Suspensions(maker)
    app.state.authenticator.invocation_tokens = InvocationTokens(
        app.state.secret_box.derive(tokens.PURPOSE), settings.invoke_token_seconds
    )
    assets = await Assets.open(settings, app.state.secret_box, app.state.quotas)
    app.state.assets = assets
    app.state.catalog = await asyncio.to_thread(load_catalog, settings.clusters_file)
    adapters = AdapterRegistry.from_catalog(
        app.state.catalog,
        worker_bounds=AnswerBounds(
            max_head_bytes=settings.invoke_worker_max_head_bytes,
            max_headers=settings.invoke_worker_max_headers,
        ),
        worker_utils=worker_utils_pod(settings),
        collector=collector_pod(settings),
    )
    opened.push_async_callback(adapters.aclose)
    app.state.adapters = adapters
    if c.llm_gateway is not None:
        opened.push_async_callback(c.llm_gateway.aclose)
    # `nvcf-server invoke` has its own replica id (a server process may share the data dir)
    owner_dir = Path(settings.data_dir)
    if c.invocation_only:
        owner_dir = owner_dir / INVOCATION_OWNER_DIR
    owner = await asyncio.to_thread(claim_owner, owner_dir)
    opened.callback(owner.close)
    return Shared(maker, events, assets, adapters, owner)


@dataclass(frozen=True)
class Control:
    """The control plane's loops (the reconciler's and the autoscaler's wiring to the
    invocation plane is done there)."""

    reconciler: Reconciler
    autoscaler: Autoscaler
    #: every background loop of the process, in start order (stopped in reverse)
    loops: list[Startable]


def _reconciler_waker(app: FastAPI) -> Callable[[], None]:
    def wake_reconciler() -> None:
        """Wake the app's reconciler, if one runs in this process (read at each call)."""
        reconciler = app.state.reconciler
        if reconciler is not None:
            reconciler.wake()

    return wake_reconciler


async def _open_control(
    app: FastAPI, c: Composition, opened: contextlib.AsyncExitStack, shared: Shared
) -> Control:
    """The control plane: the admin key, the chart pipeline, the reconciler, history, the
    autoscaler, time series and the asset purge."""
    settings, telemetry = c.settings, c.telemetry
    maker, assets = shared.maker, shared.assets
    await bootstrap_admin_key(app, settings)
    chart_pipeline = ChartPipeline.from_settings(
        settings, app.state.secret_box, metrics=telemetry.charts, tracing=telemetry.tracing
    )
    opened.push_async_callback(chart_pipeline.aclose)
    app.state.chart_pipeline = chart_pipeline
    reconciler, collector = build_reconciler(
        settings,
        maker,
        shared.adapters,
        app.state.catalog,
        secret_box=app.state.secret_box,
        metrics=telemetry.reconcile,
        tracing=telemetry.tracing,
        owner=shared.owner,
    )
    app.state.reconciler = reconciler
    app.state.namespace_collector = collector
    wake_reconciler = _reconciler_waker(app)
    app.state.wake_reconciler = wake_reconciler
    app.state.active_instances = active_instances
    app.state.telemetry_users = _telemetry_users
    subscribers.subscribe(
        shared.events,
        wake=wake_reconciler,
        adds_collector=lambda cluster: adds_collector(shared.adapters.get(cluster)),
    )
    events = shared.events
    events.within(KeyReplaced, lambda s, e: telemetry_key_replaced(s, e, events))
    purger = HistoryPurger(maker, HistoryConfig.from_settings(settings))
    app.state.history_purger = purger
    autoscaler = Autoscaler(
        maker,
        AutoscalerConfig.from_settings(settings),
        metrics=telemetry.autoscale,
        on_change=reconciler.wake,
    )
    app.state.autoscaler = autoscaler
    timeseries = TimeSeries(
        telemetry.metrics.registry, maker, period=settings.timeseries_period_seconds
    )
    app.state.timeseries = timeseries
    asset_purge: LoopService[str] = LoopService(
        "asset-purge",
        lambda: assets.purge(maker),
        settings.asset_purge_period_seconds,
        log=log,
        failure="asset purge round failed",
    )
    tasks = Tasks(
        app.state.catalog,
        app.state.secret_box,
        app.state.quotas,
        settings=settings,
        pipeline=chart_pipeline,
    )
    app.state.tasks = tasks
    task_loop = TaskLoop(
        maker, shared.adapters, app.state.catalog, tasks, period=settings.tasks_interval
    )
    app.state.task_loop = task_loop
    collector.also_known.append(lambda: known_task_ids(maker))
    canary = CanaryLoop(
        maker, period=settings.canary_interval, events=shared.events, on_change=wake_reconciler
    )
    app.state.canary = canary
    loops: list[Startable] = [timeseries, asset_purge]
    if settings.reconciler_enabled:
        tasks.wake = task_loop.wake
        reconciler.on_changes = task_loop.changed
        loops += [reconciler, collector, purger, task_loop, canary]
        if settings.autoscale_enabled:
            loops.append(autoscaler)
    # stopped whether started or not: the reconciler gives up its leases
    idle: list[Startable] = [reconciler, collector, purger, autoscaler]
    for service in idle:
        if service not in loops:
            opened.push_async_callback(service.stop)
    return Control(reconciler, autoscaler, loops)


async def _open_invocation(
    app: FastAPI,
    c: Composition,
    opened: contextlib.AsyncExitStack,
    shared: Shared,
    control: Control | None,
) -> InvocationPlane | None:
    """The invocation plane, started and wired to the control plane's loops; without it, the
    reconciler reads the requests in flight from Redis when replicas share it."""
    settings = c.settings
    reconciler = control.reconciler if control is not None else None
    if not c.invocation:
        if settings.redis_url and reconciler is not None:
            activity = RedisActivity(settings.redis_url)
            opened.push_async_callback(activity.aclose)
            reconciler.activity = activity
        return None
    plane = InvocationPlane(
        settings,
        shared.maker,
        shared.adapters,
        app.state.catalog,
        c.invocation_metrics,
        shared.owner,
        assets=shared.assets,
    )
    await plane.start()
    app.state.invocation = plane
    exports = Exports(
        shared.maker,
        app.state.secret_box,
        ExportSettings(
            queue_size=settings.telemetry_queue_size,
            interval=settings.telemetry_export_interval,
            timeout=settings.telemetry_export_timeout,
            allowlist=settings.telemetry_allowlist,
            replica=shared.owner.value,
        ),
        Drops(c.telemetry.metrics.registry),
    )
    exports.start()
    opened.push_async_callback(exports.stop)
    shared.events.after_commit(KeyReplaced, lambda e: exports.forget(e.telemetry_id))
    c.invocation_metrics.exports = exports
    # pushed after the plane: stops after the plane's last run ended, and adds its counts
    meter = Meter(shared.maker, settings.metering_flush_seconds)
    meter.start()
    opened.push_async_callback(meter.stop)
    c.invocation_metrics.meter = meter
    app.state.telemetry_exports = exports
    if control is not None and settings.reconciler_enabled:
        # instances by phase; the lines of the instances this replica leads
        followers = InstanceExports(
            shared.maker,
            shared.adapters,
            app.state.secret_box,
            exports,
            shared.owner.value,
            period=min(settings.telemetry_export_interval, 5.0),
            limit=settings.telemetry_log_followers,
        )
        followers.start()
        opened.push_async_callback(followers.stop)
        # the tasks naming telemetries: gauges, lines and their lifetimes' traces
        task_exports = TaskExports(
            shared.maker,
            shared.adapters,
            app.state.tasks,
            exports,
            shared.owner.value,
            period=min(settings.telemetry_export_interval, 5.0),
            limit=settings.telemetry_log_followers,
        )
        task_exports.start()
        opened.push_async_callback(task_exports.stop)
        _wake_exports(control.reconciler, app.state.tasks, followers, task_exports)
        app.state.task_loop.on_telemetry = task_exports.changed
        app.state.telemetry_loops = (followers, task_exports)
    if control is not None and control.autoscaler in control.loops:
        # A request waiting for a version with no instance wakes the autoscaler
        # here at once; an instance turning Running wakes the waiting requests.
        plane.load.on_cold = control.autoscaler.wake
    if reconciler is not None:
        routes = plane.routes
        events = shared.events
        events.after_commit(AccessChanged, lambda e: routes.forget_function(e.function_id))
        events.after_commit(DeploymentDeleted, lambda e: routes.forget(e.version_id))
        reconciler.on_running = plane.instances_changed
        reconciler.on_draining = plane.routes.forget
        reconciler.activity = plane.dispatcher  # what a drain waits for
    return plane


def _wake_exports(
    reconciler: Reconciler, tasks: Tasks, instances: InstanceExports, task_exports: TaskExports
) -> None:
    """The export loops read again when the clusters report a change or a task is created,
    canceled or deleted (idle, they read nothing): besides the task loop, which is woken
    already."""
    task_loop_changed, task_loop_wake = reconciler.on_changes, tasks.wake

    def on_changes(instance_ids: set[str], resync: bool) -> Collection[str]:
        instances.changed()
        task_exports.changed()
        return task_loop_changed(instance_ids, resync) if task_loop_changed else ()

    def wake(task_id: str) -> None:
        task_loop_wake(task_id)
        task_exports.changed()

    reconciler.on_changes, tasks.wake = on_changes, wake


async def bootstrap_admin_key(app: FastAPI, settings: Settings) -> None:
    """Make sure an admin credential exists, and tell the operator where it is: the key itself
    only when it is generated (the first start), afterwards where it was kept."""
    path = Path(settings.data_dir) / ADMIN_KEY_FILE
    maker = app.state.sessionmaker
    async with maker() as session, session.begin():
        if settings.bootstrap_api_key is not None:
            key = settings.bootstrap_api_key.get_secret_value()
            # A bootstrap key stored by an older release lacks the operator scope: grant it.
            if not await grant_scopes(session, key, scopes.OPERATOR_KEY_SCOPES):
                await create_api_key(
                    session,
                    account_id=settings.default_account,
                    scopes=scopes.OPERATOR_KEY_SCOPES,
                    description="bootstrap key (NVCF_BOOTSTRAP_API_KEY)",
                    key=key,
                    operator=True,
                )
            _say(settings, "admin API key: the value of NVCF_BOOTSTRAP_API_KEY")
            return
        if await any_key(session):
            if await asyncio.to_thread(path.exists):
                _say(settings, f"admin API key: kept in {path} (printed at the first start only)")
            else:
                _say(
                    settings,
                    "admin API key: printed by the first start, not kept in this data "
                    "directory; make another with: nvcf-server create-key --account "
                    f"{settings.default_account} --scopes {','.join(scopes.OPERATOR_KEY_SCOPES)}",
                )
            return
        key, _ = await create_api_key(
            session,
            account_id=settings.default_account,
            scopes=scopes.OPERATOR_KEY_SCOPES,
            description="generated admin key",
            operator=True,
        )
    await asyncio.to_thread(_write_private, path, key + "\n")
    if settings.log_format == "json":
        # JSON lines go to log collectors, which must never hold a key: the file has it.
        log.warning(
            "generated an admin API key for account '%s', saved to %s (readable only by this user)",
            settings.default_account,
            path,
        )
        return
    # Printed once, on purpose: this is how an operator learns the first key.
    _say(settings, f"generated admin API key for account '{settings.default_account}': {key}")
    _say(settings, f"(also saved to {path}, readable only by this user)")


def _say(settings: Settings, line: str) -> None:
    """A line for the operator: a log record when every line must be JSON, else printed to
    stdout, flushed (a container's log shows it at once, not when a buffer fills)."""
    if settings.log_format == "json":
        log.info(line)
    else:
        print(f"nvcf-server: {line}", flush=True)


def _write_private(path: Path, content: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(content)


async def _telemetry_users(
    session: AsyncSession, account_id: str, telemetry_id: uuid.UUID
) -> list[str]:
    """What of the account names the telemetry: its versions, then its tasks not yet ended."""
    versions = await functions_repository.telemetry_users(session, account_id, telemetry_id)
    return versions + await tasks_repository.telemetry_users(session, account_id, telemetry_id)
