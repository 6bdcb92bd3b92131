"""The chart pipeline as a typed FastAPI dependency (the composition, service/app.py, builds it
at start)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.charts.pipeline import ChartPipeline


async def chart_pipeline(request: Request) -> ChartPipeline:
    value: ChartPipeline = request.app.state.chart_pipeline
    return value


ChartPipelineDep = Annotated[ChartPipeline, Depends(chart_pipeline)]
