"""An application's telemetry (docs/telemetry.md): its Prometheus registry with every metric
family, and its tracing.

This is where each area of the service registers its metric families, once per application
(never on prometheus-client's global registry, so any number of apps can live in one
process, as they do in the tests). An area adds its own `<area>/metrics.py` class taking the
registry, a field here and a line in `Telemetry.build`, and hands the object to the code that
records; docs/telemetry.md gets a row per metric and the dashboard a panel.

A family whose series name a tenant's objects (a label in `TENANT_LABELS`) is served only to an
operator's scrape (`sees_tenants`): one with `NVCF_METRICS_TOKEN`, or with an operator key.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from starlette.requests import Request

from service.auth import scopes
from service.auth.caller import MissingScope, caller
from service.auth.deps import AUTHENTICATOR
from service.charts.metrics import ChartMetrics
from service.core.db import SESSIONMAKER
from service.core.deps import SETTINGS
from service.core.errors import Forbidden
from service.core.middleware import Metrics
from service.core.settings import Settings
from service.core.tracing import Tracing, tracing_from_settings
from service.deployments.metrics import AutoscaleMetrics, FleetGauges, ReconcileMetrics
from service.metering.metrics import UsageCounters
from service.tasks.usage import open_spans

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter


@dataclass(frozen=True)
class Telemetry:
    """The metrics and the tracing of one application."""

    #: the registry `/metrics` exports, with the HTTP request families
    metrics: Metrics
    tracing: Tracing
    charts: ChartMetrics
    reconcile: ReconcileMetrics
    fleet: FleetGauges
    autoscale: AutoscaleMetrics
    usage: UsageCounters

    @classmethod
    def build(cls, settings: Settings, *, span_exporter: SpanExporter | None = None) -> Telemetry:
        """Every family registered on a fresh registry; tracing as the settings say (or to
        `span_exporter`, which turns it on: tests pass an in-memory exporter)."""
        metrics = Metrics()
        registry = metrics.registry
        return cls(
            metrics=metrics,
            tracing=tracing_from_settings(settings, span_exporter),
            charts=ChartMetrics(registry),
            reconcile=ReconcileMetrics(registry),
            fleet=FleetGauges(registry, max_age=settings.metrics_fleet_cache_seconds),
            autoscale=AutoscaleMetrics(registry),
            usage=UsageCounters(registry, max_age=settings.metrics_fleet_cache_seconds),
        )

    async def scrape(
        self, sessionmaker: async_sessionmaker[AsyncSession], *, tenants: bool
    ) -> bytes:
        """The Prometheus text exposition, the fleet gauges refreshed if they are stale;
        without `tenants`, no family whose series name a tenant's objects."""
        await self.fleet.refresh(sessionmaker)
        if tenants:  # the metered totals name tenants: read only for a scrape that sees them
            await self.usage.refresh(sessionmaker, lambda session: open_spans(session, None))
        registry = self.metrics.registry
        return generate_latest(registry if tenants else _Anonymous(registry))


#: labels naming a tenant's objects: a family with any of them is served to operators only
TENANT_LABELS = frozenset({"function_id", "version_id"})


class _Anonymous:
    """A registry's families whose series name no tenant's object."""

    def __init__(self, registry: Collector) -> None:
        self.registry = registry

    def collect(self) -> Iterable[Metric]:
        for family in self.registry.collect():
            if not any(TENANT_LABELS.intersection(s.labels) for s in family.samples):
                yield family


async def sees_tenants(request: Request) -> bool:
    """Whether a `/metrics` scrape may read the series that name tenants' objects: with
    `Authorization: Bearer <NVCF_METRICS_TOKEN>`, or an operator's credential (`admin:accounts`).
    No credential: False. A credential that is neither: 401 (unknown) or 403 (a tenant's)."""
    header = request.headers.get("authorization", "")
    if not header.strip():
        return False
    token = SETTINGS.of(request).metrics_token
    scheme, _, credential = header.partition(" ")
    if token is not None and scheme.lower() == "bearer":
        expected = token.get_secret_value().encode()
        if hmac.compare_digest(credential.strip().encode("utf-8", "replace"), expected):
            return True
    try:
        await caller(
            AUTHENTICATOR.of(request),
            header,
            sessions=SESSIONMAKER.of(request),
            any_of=(scopes.ADMIN_ACCOUNTS,),
        )
    except MissingScope:
        raise Forbidden(
            detail="the per-function metrics are the operator's: scrape with "
            f"NVCF_METRICS_TOKEN or a key with the scope '{scopes.ADMIN_ACCOUNTS}', or with no "
            "credential for the other metrics"
        ) from None
    return True


__all__ = ["TENANT_LABELS", "Telemetry", "sees_tenants"]
