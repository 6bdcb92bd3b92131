"""The components deployments' routes need, as typed FastAPI dependencies (the composition,
service/app.py, builds them): the routes hand them to the use cases, which never see the
request or the app."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from service.charts.deps import ChartPipelineDep
from service.charts.pipeline import ChartPipeline
from service.clusters.catalog import Catalog
from service.clusters.deps import CatalogDep
from service.core.deps import EventsDep, QuotasDep
from service.core.events import Events
from service.core.quotas import Quotas


async def reconciler_wake(request: Request) -> Callable[[], None]:
    """Wakes this process's reconciler (a no-op where none runs); call it after the commit."""
    value: Callable[[], None] = request.app.state.wake_reconciler
    return value


WakeDep = Annotated[Callable[[], None], Depends(reconciler_wake)]


@dataclass(frozen=True)
class Deploying:
    """What changing a deployment uses besides the request's session."""

    catalog: Catalog
    pipeline: ChartPipeline
    quotas: Quotas
    events: Events
    #: wakes the reconciler: run after the commit (core.db.after_commit)
    wake: Callable[[], None]


async def deploying(
    catalog: CatalogDep,
    pipeline: ChartPipelineDep,
    quotas: QuotasDep,
    events: EventsDep,
    wake: WakeDep,
) -> Deploying:
    return Deploying(catalog, pipeline, quotas, events, wake)


DeployingDep = Annotated[Deploying, Depends(deploying)]
