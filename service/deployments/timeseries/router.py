"""`GET /v2/nvcf/functions/{functionId}/versions/{functionVersionId}/metrics`: the version's
time series of the last hour on this replica (store.py); scope `list_functions`, the
version's account only."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from service.auth import scopes
from service.auth.deps import Session, require
from service.auth.service import Principal
from service.core.errors import NotFound
from service.core.http import parse_uuids
from service.deployments.timeseries.deps import TimeSeriesDep
from service.functions import repository as functions_repository

router = APIRouter(tags=["functions"])
Reader = Annotated[
    Principal, Depends(require(scopes.LIST_FUNCTIONS, scopes.LIST_FUNCTIONS_DETAILS))
]


@router.get(
    "/functions/{functionId}/versions/{functionVersionId}/metrics",
    summary="The version's requests, latency, queue depth and instances over the last hour",
    description="One point per sampling period (NVCF_TIMESERIES_PERIOD_SECONDS) of this "
    "server replica: `requests` and `errors` of the period, `latencyP50`/`latencyP99` "
    "(seconds, the histogram bucket's upper bound; null without requests), `queueDepth`, "
    "`inFlight`, `running` instances and the autoscaler's `target`.",
)
async def version_metrics(
    functionId: str,
    functionVersionId: str,
    session: Session,
    principal: Reader,
    series: TimeSeriesDep,
) -> dict[str, Any]:
    fid, vid = parse_uuids((functionId, "functionId"), (functionVersionId, "functionVersionId"))
    version = await functions_repository.version_by_id(session, vid)
    if version is None or version.function_id != fid or version.account_id != principal.account_id:
        raise NotFound(detail=f"version {vid} of function {fid} not found")
    period = series.period if series is not None else 0
    points = series.points(str(vid)) if series is not None else []
    return {"periodSeconds": period, "points": points}
