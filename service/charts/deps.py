"""The chart pipeline as a typed FastAPI dependency (the composition, service/app.py, builds it
at start)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.charts.pipeline import ChartPipeline
from service.core.components import Component

CHART_PIPELINE = Component[ChartPipeline]("chart_pipeline")


async def chart_pipeline(request: Request) -> ChartPipeline:
    return CHART_PIPELINE.of(request)


ChartPipelineDep = Annotated[ChartPipeline, Depends(chart_pipeline)]
