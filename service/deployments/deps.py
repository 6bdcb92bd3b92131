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
from service.deployments.service import Deploying

WAKE_RECONCILER = Component[Callable[[], None]]("wake_reconciler")


async def reconciler_wake(request: Request) -> Callable[[], None]:
    """Wakes this process's reconciler (a no-op where none runs); call it after the commit."""
    return WAKE_RECONCILER.of(request)


WakeDep = Annotated[Callable[[], None], Depends(reconciler_wake)]


async def deploying(
    catalog: CatalogDep,
    pipeline: ChartPipelineDep,
    quotas: QuotasDep,
    events: EventsDep,
    wake: WakeDep,
) -> Deploying:
    return Deploying(catalog, pipeline, quotas, events, wake)


DeployingDep = Annotated[Deploying, Depends(deploying)]
