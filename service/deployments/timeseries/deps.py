"""The component the time-series route needs, as a typed FastAPI dependency (the composition,
service/app.py, builds it)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.core.components import Component
from service.deployments.timeseries.store import TimeSeries

TIMESERIES = Component[TimeSeries | None]("timeseries")


async def timeseries(request: Request) -> TimeSeries | None:
    """This replica's per-version time series (None where none are kept)."""
    return TIMESERIES.of(request)


TimeSeriesDep = Annotated[TimeSeries | None, Depends(timeseries)]
