"""FastAPI application factory: the app built plane by plane (what every process answers, the
API, the pages, the invocation entry ahead of the middleware), routers under every documented
prefix. Its components are opened by the lifespan (service/lifespan.py)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, FastAPI
from fastapi.openapi.utils import get_openapi
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from service.accounts.router import router as accounts_router
from service.accounts.usage import router as usage_router
from service.assets.router import router as assets_router
from service.assets.router import storage_router
from service.assets.signing import STORAGE_PREFIX
from service.auth.nvcf_keys import router as nvcf_keys_router
from service.auth.router import router as keys_router
from service.auth.service import Authenticator
from service.charts.router import router as helm_router
from service.clusters.router import router as clusters_router
from service.clusters.router import v3_router
from service.console import install_console
from service.core.docs_ui import install_docs
from service.core.errors import ServiceUnavailable
from service.core.idempotency import IdempotentReplay
from service.core.middleware import RequestContextMiddleware
from service.core.openapi import truthful
from service.core.paths import normalize
from service.core.problem import install_problem_handlers
from service.core.quotas import Quotas
from service.core.ratelimit import RateLimiter
from service.core.routing import mount_flat
from service.core.settings import Settings
from service.core.tracing import TracingMiddleware
from service.deployments.canary_router import router as canary_router
from service.deployments.logs.router import router as logs_router
from service.deployments.logs.service import FollowLimiter
from service.deployments.reach import FunctionReach
from service.deployments.revisions_router import router as revisions_router
from service.deployments.router import router as deployments_router
from service.deployments.timeseries.router import router as timeseries_router
from service.deployments.traffic_router import router as traffic_router
from service.functions import read_cache
from service.functions.requests import DOC_MODELS
from service.functions.router import router as functions_router
from service.functions.sharing_router import router as sharing_router
from service.invocation import http_openapi, http_routes
from service.invocation.http import InvocationEntry
from service.invocation.metrics import InvocationMetrics
from service.invocation.tokens import router as tokens_router
from service.lifespan import Composition, lifespan
from service.llm import openapi as llm_openapi
from service.llm.gateway import Gateway
from service.llm.metrics import LlmMetrics
from service.llm.routing import PREFIX as LLM_PREFIX
from service.llm.tokens import TokenLimiter
from service.ngc.router import router as ngc_router
from service.observability.router import router as telemetries_router
from service.registry.router import router as registry_router
from service.state import AppState
from service.tasks.router import router as tasks_router
from service.telemetry import Telemetry, sees_tenants

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

API_PREFIX = "/v2/nvcf"
#: NVCT's prefix (cloud tasks)
TASKS_PREFIX = "/v1/nvct"


class NvcfApp(FastAPI):
    """The FastAPI application, with the invocation entry ahead of it: every HTTP request's
    path is normalized once (`normalize`: `//`, the org aliases), then the entry's host
    dispatch and router (invocation/http.py) answer what is theirs, inside the same
    request-context middleware, and hand the rest to FastAPI (`stack`)."""

    invocation_entry: InvocationEntry | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        normalize(scope)
        entry = self.invocation_entry
        if entry is None:
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        scope["router"] = self.router  # the entry's router is no URL provider of FastAPI's
        await entry(scope, receive, send)

    async def stack(self, scope: Scope, receive: Receive, send: Send) -> None:
        """FastAPI's middleware stack and routes (the entry's router's default)."""
        await super().__call__(scope, receive, send)


def api_routers(settings: Settings | None = None) -> list[APIRouter]:
    routers = [
        functions_router,
        sharing_router,
        keys_router,
        registry_router,
        telemetries_router,
        helm_router,
        deployments_router,
        revisions_router,
        traffic_router,
        canary_router,
        logs_router,
        timeseries_router,
        clusters_router,
        tokens_router,
        assets_router,
        accounts_router,
        usage_router,
    ]
    return routers


def _storage_body_limit(settings: Settings) -> Callable[[Scope], int | None]:
    """The body limit of uploads to the local store's signed URLs (each URL also carries its
    own), else the default."""
    storage = max(settings.asset_max_bytes, settings.asset_result_max_bytes)
    prefix = STORAGE_PREFIX + "/"

    def of(scope: Scope) -> int | None:
        return storage if str(scope.get("path", "")).startswith(prefix) else None

    return of


def create_app(
    settings: Settings | None = None,
    *,
    span_exporter: SpanExporter | None = None,
    invocation_only: bool = False,
) -> NvcfApp:
    """The application; `span_exporter` turns tracing on and receives every span (tests);
    `invocation_only`: the invocation plane alone (`nvcf-server invoke`): its routes, health
    and metrics, no reconciler, chart pipeline or admin bootstrap. Built plane by plane; its
    components are opened by the lifespan (service/lifespan.py)."""
    settings = settings or Settings()
    telemetry = Telemetry.build(settings, span_exporter=span_exporter)
    invocation = settings.invoke_enabled or invocation_only
    c = Composition(
        settings,
        telemetry,
        invocation_only,
        invocation,
        InvocationMetrics(telemetry.metrics.registry),
        _llm_gateway(settings, telemetry) if invocation else None,
    )
    app = NvcfApp(
        title="NVCF-compatible control plane",
        version="0.1.0",
        description="Function registry and deployments for GPU cloud functions, "
        "compatible with NVIDIA Cloud Functions clients.",
        lifespan=partial(lifespan, composition=c),
        docs_url=None,  # served from installed assets by install_docs, not from a CDN
        redoc_url=None,
    )
    _init_state(app, settings, telemetry)
    install_problem_handlers(app)
    _install_operations(app, telemetry)
    # the local store's signed URLs (service/assets/router.py): large results are fetched
    # from the process that answered the invocation
    app.include_router(storage_router)
    if not invocation_only:
        _mount_api(app, settings)
        _mount_pages(app)
    app.openapi = _openapi(app, invocation)  # type: ignore[method-assign]
    _install_middleware(app, c)
    return app


def _init_state(app: NvcfApp, settings: Settings, telemetry: Telemetry) -> None:
    """The state every plane reads from the start (the lifespan adds what it opens)."""
    app.state = AppState()
    app.state.settings = settings
    app.state.quotas = Quotas.from_settings(settings)
    # always there: an account may have a rate limit of its own when the setting's is off
    app.state.rate_limiter = RateLimiter(
        settings.rate_limit_per_second, settings.rate_limit_burst, settings.redis_url
    )
    app.state.authenticator = Authenticator(settings)
    app.state.function_reach = FunctionReach()
    app.state.log_follows = FollowLimiter(settings.logs_max_follows_per_account)
    app.state.telemetry = telemetry
    app.state.metrics = telemetry.metrics


def _llm_gateway(settings: Settings, telemetry: Telemetry) -> Gateway:
    return Gateway(
        suffix=settings.invoke_host_suffix,
        max_body=settings.invoke_max_body_bytes,
        tokens=TokenLimiter(settings.redis_url),
        metrics=LlmMetrics(telemetry.metrics.registry),
        allowlist=settings.llm_model_allowlist,
        account_tokens=(
            settings.llm_account_input_token_rate_limit,
            settings.llm_account_output_token_rate_limit,
        ),
    )


def _install_operations(app: NvcfApp, telemetry: Telemetry) -> None:
    """What every process answers: idempotent replays, health, readiness, metrics."""

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


def _mount_api(app: NvcfApp, settings: Settings) -> None:
    """The API plane: the REST API under its prefixes, the keys routes, NGC's."""
    # The NGC org aliases (/v2/orgs/{org}[/teams/{team}]/nvcf/...) are rewritten onto this
    # prefix by the middleware, so each route is matched once, not three times.
    for router in api_routers(settings):
        mount_flat(app, router, API_PREFIX)
    app.include_router(v3_router)
    mount_flat(app, tasks_router, TASKS_PREFIX)
    # flat: a 405's Allow names every method of a path only among the app's own routes
    mount_flat(app, nvcf_keys_router, "")
    app.include_router(ngc_router)


def _mount_pages(app: NvcfApp) -> None:
    """The pages: the API's documentation and the web console."""
    install_docs(app)
    install_console(app)


def _openapi(app: NvcfApp, invocation: bool) -> Callable[[], dict[str, Any]]:
    """The OpenAPI document: the app's routes, and the invocation and LLM routes (answered
    ahead of FastAPI) where they are served."""

    def custom_openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        if invocation:
            schema.setdefault("paths", {}).update(http_openapi.openapi_paths())
            schema["paths"].update(llm_openapi.openapi_paths())
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        llm_models = llm_openapi.MODELS_DOCUMENTED if invocation else ()
        if invocation:
            components.update(llm_openapi.SCHEMAS)
        for model in (*DOC_MODELS, *http_openapi.MODELS, *llm_models):
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
            api_prefixes=(API_PREFIX, "/v3/", "/v2/org", TASKS_PREFIX),
            own_errors=(LLM_PREFIX + "/",),
        )
        return schema

    return custom_openapi


def _install_middleware(app: NvcfApp, c: Composition) -> None:
    """The middleware stack, and the invocation plane's entry ahead of it with the same
    request context around it."""
    settings, telemetry = c.settings, c.telemetry
    # Added first, so it runs inside the request-context middleware (ids, metrics, log line).
    if not c.invocation_only:
        app.add_middleware(read_cache.VersionReadFastPath)
    limit_of = _storage_body_limit(settings)
    if telemetry.tracing.enabled:
        # Inside the request context (request id, org alias); absent when tracing is off.
        app.add_middleware(TracingMiddleware, tracing=telemetry.tracing)
    app.add_middleware(
        RequestContextMiddleware,
        metrics=telemetry.metrics,
        max_body_bytes=settings.max_body_bytes,
        json_logs=settings.log_format == "json",
        body_limit=limit_of,
    )
    if c.invocation:
        _mount_invocation(app, c)


def _mount_invocation(app: NvcfApp, c: Composition) -> None:
    """The invocation plane's entry, with the middleware the ordinary stack puts around its
    routes, in the same order."""
    settings, telemetry = c.settings, c.telemetry

    def context(inner: ASGIApp, body_limit: Callable[[Scope], int]) -> ASGIApp:
        if telemetry.tracing.enabled:
            inner = TracingMiddleware(inner, tracing=telemetry.tracing)
        return RequestContextMiddleware(
            inner,
            metrics=telemetry.metrics,
            max_body_bytes=settings.max_body_bytes,
            json_logs=settings.log_format == "json",
            body_limit=body_limit,
        )

    routes = http_routes.Routes(
        plane=lambda: app.state.invocation,
        authenticator=lambda: app.state.authenticator,
        sessionmaker=lambda: app.state.sessionmaker,
        llm=c.llm_gateway,
    )
    app.invocation_entry = InvocationEntry(
        suffix=settings.invoke_host_suffix,
        max_body=settings.invoke_max_body_bytes,
        operations=http_routes.OPERATIONS,
        answer=routes,
        fallback=app.stack,
        context=context,
        llm=c.llm_gateway,
    )


__all__ = ["create_app"]
