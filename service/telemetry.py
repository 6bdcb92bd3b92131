"""An application's telemetry (docs/telemetry.md): its Prometheus registry with every metric
family, and its tracing.

This is where each area of the service registers its metric families, once per application
(never on prometheus-client's global registry, so any number of apps can live in one
process, as they do in the tests). An area adds its own `<area>/metrics.py` class taking the
registry, a field here and a line in `Telemetry.build`, and hands the object to the code that
records; docs/telemetry.md gets a row per metric and the dashboard a panel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import generate_latest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.charts.metrics import ChartMetrics
from service.core.middleware import Metrics
from service.core.settings import Settings
from service.core.tracing import Tracing, tracing_from_settings
from service.deployments.metrics import AutoscaleMetrics, FleetGauges, ReconcileMetrics

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
        )

    async def scrape(self, sessionmaker: async_sessionmaker[AsyncSession]) -> bytes:
        """The Prometheus text exposition, the fleet gauges refreshed if they are stale."""
        await self.fleet.refresh(sessionmaker)
        return generate_latest(self.metrics.registry)


__all__ = ["Telemetry"]
