"""The components deployments' routes need, as typed FastAPI dependencies (the composition,
service/app.py, builds them): the routes hand them to the use cases, which never see the
request or the app."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request

from service.charts.deps import ChartPipelineDep
from service.clusters.deps import CatalogDep
from service.core.components import Component
from service.core.deps import EventsDep, QuotasDep
from service.deployments.logs.service import FollowLimiter
from service.deployments.service import Deploying
from service.deployments.timeseries.store import TimeSeries

WAKE_RECONCILER = Component[Callable[[], None]]("wake_reconciler")
LOG_FOLLOWS = Component[FollowLimiter]("log_follows")
TIMESERIES = Component[TimeSeries | None]("timeseries")


async def reconciler_wake(request: Request) -> Callable[[], None]:
    """Wakes this process's reconciler (a no-op where none runs); call it after the commit."""
    return WAKE_RECONCILER.of(request)


async def log_follows(request: Request) -> FollowLimiter:
    """The process's open log follows per account."""
    return LOG_FOLLOWS.of(request)


async def timeseries(request: Request) -> TimeSeries | None:
    """This replica's per-version time series (None where none are kept)."""
    return TIMESERIES.of(request)


WakeDep = Annotated[Callable[[], None], Depends(reconciler_wake)]
LogFollowsDep = Annotated[FollowLimiter, Depends(log_follows)]
TimeSeriesDep = Annotated[TimeSeries | None, Depends(timeseries)]


async def deploying(
    catalog: CatalogDep,
    pipeline: ChartPipelineDep,
    quotas: QuotasDep,
    events: EventsDep,
    wake: WakeDep,
) -> Deploying:
    return Deploying(catalog, pipeline, quotas, events, wake)


DeployingDep = Annotated[Deploying, Depends(deploying)]
