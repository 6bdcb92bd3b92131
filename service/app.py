"""FastAPI application factory: lifespan wiring, routers under every documented prefix."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, FastAPI
from fastapi.openapi.utils import get_openapi
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from service.assets.router import router as assets_router
from service.assets.router import storage_router
from service.assets.service import Assets
from service.assets.signing import STORAGE_PREFIX
from service.auth import scopes, tokens
from service.auth.nvcf_keys import router as nvcf_keys_router
from service.auth.repository import any_key
from service.auth.router import router as keys_router
from service.auth.service import (
    Authenticator,
    create_api_key,
    grant_scopes,
)
from service.auth.tokens import InvocationTokens
from service.backends.http1 import AnswerBounds
from service.charts.pipeline import ChartPipeline
from service.charts.router import router as helm_router
from service.clusters.adapters import AdapterRegistry, worker_utils_pod
from service.clusters.catalog import load_catalog
from service.clusters.router import router as clusters_router
from service.clusters.router import v3_router
from service.console import install_console
from service.core import migrate
from service.core.crypto import load_secret_box
from service.core.db import make_engine, make_sessionmaker
from service.core.docs_ui import install_docs
from service.core.errors import ServiceUnavailable
from service.core.events import Events
from service.core.idempotency import IdempotentReplay
from service.core.loops import LoopService, Startable
from service.core.middleware import RequestContextMiddleware
from service.core.openapi import truthful
from service.core.problem import install_problem_handlers
from service.core.quotas import Quotas
from service.core.ratelimit import RateLimiter
from service.core.routing import mount_flat
from service.core.settings import Settings
from service.core.tracing import TracingMiddleware
from service.deployments import subscribers
from service.deployments.announcements import DeploymentDeleted
from service.deployments.autoscale.loop import Autoscaler, AutoscalerConfig
from service.deployments.history import HistoryConfig, HistoryPurger
from service.deployments.logs.router import router as logs_router
from service.deployments.logs.service import FollowLimiter
from service.deployments.models import Deployment, Instance
from service.deployments.reach import FunctionReach
from service.deployments.reconcile import Reconciler, build_reconciler, claim_owner
from service.deployments.repository import active_instances
from service.deployments.revisions_router import router as revisions_router
from service.deployments.router import router as deployments_router
from service.deployments.timeseries.router import router as timeseries_router
from service.deployments.timeseries.store import TimeSeries
from service.functions import read_cache
from service.functions.events import AccessChanged
from service.functions.router import router as functions_router
from service.functions.schemas import DOC_MODELS
from service.functions.sharing_router import router as sharing_router
from service.invocation import InvocationPlane
from service.invocation import http as invocation_http
from service.invocation.dispatch_redis import RedisActivity
from service.invocation.grpc.entry import GrpcEntry
from service.invocation.http import InvocationEntry
from service.invocation.metrics import InvocationMetrics
from service.invocation.tokens import router as tokens_router
from service.invocation.transparent import body_limit
from service.llm import openapi as llm_openapi
from service.llm.gateway import Gateway
from service.llm.metrics import LlmMetrics
from service.llm.routing import PREFIX as LLM_PREFIX
from service.llm.tokens import TokenLimiter
from service.ngc.router import router as ngc_router
from service.registry.router import router as registry_router
from service.state import AppState
from service.telemetry import Telemetry, sees_tenants

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger("nvcf.server")

API_PREFIX = "/v2/nvcf"
ADMIN_KEY_FILE = "admin-api-key"
#: where `nvcf-server invoke` keeps its replica id (inside the data dir)
INVOCATION_OWNER_DIR = "invocation"


class NvcfApp(FastAPI):
    """The FastAPI application, with the invocation entry ahead of its middleware stack:
    requests the entry claims (every invocation route, invocation/http.py) are answered by
    it, inside the same request-context middleware."""

    invocation_entry: InvocationEntry | None = None
    #: the entry with the request-context middleware (and tracing) around it
    invocation_app: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        entry = self.invocation_entry
        if entry is not None and scope["type"] == "http" and entry.claim(scope):
            scope["app"] = self
            assert self.invocation_app is not None
            await self.invocation_app(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def api_routers(settings: Settings | None = None) -> list[APIRouter]:
    routers = [
        functions_router,
        sharing_router,
        keys_router,
        registry_router,
        helm_router,
        deployments_router,
        revisions_router,
        logs_router,
        timeseries_router,
        clusters_router,
        tokens_router,
        assets_router,
    ]
    return routers


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


def _storage_body_limit(
    settings: Settings, invocation: Callable[[Scope], int | None] | None
) -> Callable[[Scope], int | None]:
    """The body limit of uploads to the local store's signed URLs (each URL also carries its
    own), else the invocation routes' limit, else the default."""
    storage = max(settings.asset_max_bytes, settings.asset_result_max_bytes)
    prefix = STORAGE_PREFIX + "/"

    def of(scope: Scope) -> int | None:
        if str(scope.get("path", "")).startswith(prefix):
            return storage
        return invocation(scope) if invocation is not None else None

    return of


def create_app(
    settings: Settings | None = None,
    *,
    span_exporter: SpanExporter | None = None,
    invocation_only: bool = False,
) -> NvcfApp:
    """The application; `span_exporter` turns tracing on and receives every span (tests);
    `invocation_only`: the invocation plane alone (`nvcf-server invoke`): its routes, health
    and metrics, no reconciler, chart pipeline or admin bootstrap."""
    settings = settings or Settings()
    telemetry = Telemetry.build(settings, span_exporter=span_exporter)

    def wake_reconciler() -> None:
        """Wake the app's reconciler, if one runs in this process (read at each call)."""
        reconciler = app.state.reconciler
        if reconciler is not None:
            reconciler.wake()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Each component's close is pushed as it is opened: teardown runs in reverse, once.
        async with contextlib.AsyncExitStack() as opened:
            await _open(app, opened)
            yield

    async def _open(app: FastAPI, opened: contextlib.AsyncExitStack) -> None:
        """Open the process's components, wire them, start its loops (one list)."""
        opened.push_async_callback(asyncio.to_thread, telemetry.tracing.shutdown)
        await asyncio.to_thread(
            Path(settings.data_dir).mkdir, mode=0o700, parents=True, exist_ok=True
        )
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
        )
        opened.push_async_callback(adapters.aclose)
        app.state.adapters = adapters
        if llm_gateway is not None:
            opened.push_async_callback(llm_gateway.aclose)
        #: every background loop of the process, in start order (stopped in reverse)
        loops: list[Startable] = []
        # One replica id for the reconciler's leases and the invocation plane's requests;
        # `nvcf-server invoke` has its own (a server process may share the data dir).
        owner_dir = Path(settings.data_dir)
        if invocation_only:
            owner_dir = owner_dir / INVOCATION_OWNER_DIR
        owner = await asyncio.to_thread(claim_owner, owner_dir)
        opened.callback(owner.close)
        reconciler: Reconciler | None = None
        autoscaler: Autoscaler | None = None
        plane: InvocationPlane | None = None
        if not invocation_only:
            await bootstrap_admin_key(app, settings)
            chart_pipeline = ChartPipeline.from_settings(
                settings, app.state.secret_box, metrics=telemetry.charts, tracing=telemetry.tracing
            )
            opened.push_async_callback(chart_pipeline.aclose)
            app.state.chart_pipeline = chart_pipeline
            reconciler, collector = build_reconciler(
                settings,
                maker,
                adapters,
                app.state.catalog,
                secret_box=app.state.secret_box,
                metrics=telemetry.reconcile,
                tracing=telemetry.tracing,
                owner=owner,
            )
            app.state.reconciler = reconciler
            app.state.namespace_collector = collector
            app.state.wake_reconciler = wake_reconciler
            app.state.active_instances = active_instances
            subscribers.subscribe(events, wake=wake_reconciler)
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
            loops += [timeseries, asset_purge]
            if settings.reconciler_enabled:
                loops += [reconciler, collector, purger]
                if settings.autoscale_enabled:
                    loops.append(autoscaler)
            # stopped whether started or not: the reconciler gives up its leases
            idle: list[Startable] = [reconciler, collector, purger, autoscaler]
            for service in idle:
                if service not in loops:
                    opened.push_async_callback(service.stop)
        if invocation_only or settings.invoke_enabled:
            plane = InvocationPlane(
                settings,
                maker,
                adapters,
                app.state.catalog,
                invocation_metrics,
                owner,
                assets=assets,
            )
            await plane.start()
            app.state.invocation = plane
            if autoscaler is not None and autoscaler in loops:
                # A request waiting for a version with no instance wakes the autoscaler
                # here at once; an instance turning Running wakes the waiting requests.
                plane.load.on_cold = autoscaler.wake
            if reconciler is not None:
                routes = plane.routes
                events.after_commit(AccessChanged, lambda e: routes.forget_function(e.function_id))
                events.after_commit(DeploymentDeleted, lambda e: routes.forget(e.version_id))
                reconciler.on_running = plane.instances_changed
                reconciler.on_draining = plane.routes.forget
                reconciler.activity = plane.dispatcher  # what a drain waits for
        elif settings.redis_url and reconciler is not None:
            activity = RedisActivity(settings.redis_url)
            opened.push_async_callback(activity.aclose)
            reconciler.activity = activity
        # the gRPC listener and the plane, pushed after the loops, stop before them
        for loop in loops:
            loop.start()
            opened.push_async_callback(loop.stop)
        if plane is not None:
            opened.push_async_callback(plane.stop)
            if settings.grpc_enabled:
                grpc_entry = GrpcEntry(settings, plane.engine, app.state.authenticator, maker)
                await grpc_entry.start()
                opened.push_async_callback(grpc_entry.stop)
                app.state.grpc = grpc_entry

    app = NvcfApp(
        title="NVCF-compatible control plane",
        version="0.1.0",
        description="Function registry and deployments for GPU cloud functions, "
        "compatible with NVIDIA Cloud Functions clients.",
        lifespan=lifespan,
        docs_url=None,  # served from installed assets by install_docs, not from a CDN
        redoc_url=None,
    )
    app.state = AppState()
    app.state.settings = settings
    app.state.quotas = Quotas.from_settings(settings)
    if settings.rate_limit_per_second > 0:
        app.state.rate_limiter = RateLimiter(
            settings.rate_limit_per_second, settings.rate_limit_burst, settings.redis_url
        )
    app.state.authenticator = Authenticator(settings)
    app.state.function_reach = FunctionReach()
    app.state.log_follows = FollowLimiter(settings.logs_max_follows_per_account)
    app.state.telemetry = telemetry
    app.state.metrics = telemetry.metrics
    invocation_metrics = InvocationMetrics(telemetry.metrics.registry)
    llm_gateway: Gateway | None = None
    if settings.invoke_enabled or invocation_only:
        llm_gateway = Gateway(
            suffix=settings.invoke_host_suffix,
            max_body=settings.invoke_max_body_bytes,
            tokens=TokenLimiter(settings.redis_url),
            metrics=LlmMetrics(telemetry.metrics.registry),
        )
    install_problem_handlers(app)

    @app.exception_handler(IdempotentReplay)
    async def _replay(request: Request, exc: IdempotentReplay) -> JSONResponse:
        return JSONResponse(
            exc.body, status_code=exc.status_code, headers={"Idempotent-Replayed": "true"}
        )

    @app.get("/health", include_in_schema=True, tags=["health"])
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/health/ready", tags=["health"])
    async def ready(request: Request) -> dict[str, str]:
        try:
            async with request.app.state.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        except Exception as exc:
            raise ServiceUnavailable(detail=f"database unreachable: {type(exc).__name__}") from None
        return {"status": "ready"}

    @app.get("/metrics", include_in_schema=False)
    async def prometheus(request: Request) -> Response:
        tenants = await sees_tenants(request)
        body = await telemetry.scrape(request.app.state.sessionmaker, tenants=tenants)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    # The NGC org aliases (/v2/orgs/{org}[/teams/{team}]/nvcf/...) are rewritten onto this
    # prefix by the middleware, so each route is matched once, not three times.
    # the local store's signed URLs (service/assets/router.py): large results are fetched
    # from the process that answered the invocation
    app.include_router(storage_router)
    if not invocation_only:
        for router in api_routers(settings):
            mount_flat(app, router, API_PREFIX)
        app.include_router(v3_router)
        # flat: a 405's Allow names every method of a path only among the app's own routes
        mount_flat(app, nvcf_keys_router, "")
        app.include_router(ngc_router)
        install_docs(app)
        install_console(app)

    def custom_openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        invocation = settings.invoke_enabled or invocation_only
        if invocation:
            schema.setdefault("paths", {}).update(invocation_http.openapi_paths())
            schema["paths"].update(llm_openapi.openapi_paths())
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        llm_models = llm_openapi.MODELS_DOCUMENTED if invocation else ()
        if invocation:
            components.update(llm_openapi.SCHEMAS)
        for model in (*DOC_MODELS, *invocation_http.MODELS, *llm_models):
            doc = model.model_json_schema(
                by_alias=True, ref_template="#/components/schemas/{model}"
            )
            for name, sub in doc.pop("$defs", {}).items():
                components.setdefault(name, sub)
            components[model.__name__] = doc
        schema["components"]["securitySchemes"] = {
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": "nvapi- key or JWT; an invocation token (POST /v2/nvcf/tokens/"
                "functions...) on the invocation routes only",
            }
        }
        schema["security"] = [{"bearer": []}]
        app.openapi_schema = truthful(
            schema,
            api_prefixes=(API_PREFIX, "/v3/", "/v2/org"),
            own_errors=(LLM_PREFIX + "/",),
        )
        return schema

    app.openapi = custom_openapi  # type: ignore[method-assign]
    # Added first, so it runs inside the request-context middleware (ids, metrics, log line).
    if not invocation_only:
        app.add_middleware(read_cache.VersionReadFastPath)
    invocation_limit = None
    if settings.invoke_enabled or invocation_only:
        invocation_limit = body_limit(settings.invoke_host_suffix, settings.invoke_max_body_bytes)
        if llm_gateway is not None:
            invocation_limit = llm_gateway.limit_with(invocation_limit)
    limit_of = _storage_body_limit(settings, invocation_limit)
    if telemetry.tracing.enabled:
        # Inside the request context (request id, org alias); absent when tracing is off.
        app.add_middleware(TracingMiddleware, tracing=telemetry.tracing)
    app.add_middleware(
        RequestContextMiddleware,
        metrics=telemetry.metrics,
        max_body_bytes=settings.max_body_bytes,
        json_logs=settings.log_format == "json",
        body_limit=limit_of,
        send_timeout=settings.http_send_timeout,
    )
    if invocation_limit is not None:
        entry = InvocationEntry(
            suffix=settings.invoke_host_suffix,
            plane=lambda: app.state.invocation,
            authenticator=lambda: app.state.authenticator,
            sessionmaker=lambda: app.state.sessionmaker,
            llm=llm_gateway,
        )
        inner: ASGIApp = entry
        # the middleware the ordinary stack puts around its routes, in the same order
        if telemetry.tracing.enabled:
            inner = TracingMiddleware(inner, tracing=telemetry.tracing)
        app.invocation_app = RequestContextMiddleware(
            inner,
            metrics=telemetry.metrics,
            max_body_bytes=settings.max_body_bytes,
            json_logs=settings.log_format == "json",
            body_limit=limit_of,
            send_timeout=settings.http_send_timeout,
        )
        app.invocation_entry = entry
    return app


__all__ = ["create_app"]
