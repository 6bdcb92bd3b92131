"""`GET /v2/nvcf/usage`: an account's metered usage over a period, grouped (docs/usage.md),
as JSON or CSV. A tenant reads its own account; the operator (`account_setup`) any. And NVCF's
`GET /v2/nvcf/accounts/{ncaId}/usage/gpus`: the GPUs the account's deployed functions may use
now (its minimum and maximum instances), per GPU and instance type and per cluster."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse

from service.auth import repository as auth_repository
from service.auth import scopes
from service.auth.deps import Session, require
from service.auth.service import MAX_ACCOUNT_ID, Principal
from service.clusters.catalog import Catalog
from service.clusters.deps import CatalogDep
from service.core.db import utcnow
from service.core.errors import FieldError, Forbidden, ValidationFailed
from service.core.schemas import iso_z
from service.deployments import repository as deployments_repository
from service.deployments.models import DeploymentSpec
from service.metering.usage import (
    GROUP_FIELDS,
    MAX_POINTS,
    MEASURES,
    STEP_LENGTH,
    Grouping,
    Step,
    account_records,
    grouped,
    series,
    totals,
)
from service.tasks.schemas import GpuUsageOut, ListGpuUsageResponse, placements_on
from service.tasks.usage import open_spans

router = APIRouter(tags=["usage"])
Reader = Annotated[
    Principal,
    Depends(
        require(
            scopes.LIST_FUNCTIONS,
            scopes.LIST_FUNCTIONS_DETAILS,
            scopes.LIST_TASKS,
            scopes.ACCOUNT_SETUP,
        )
    ),
]
Deployer = Annotated[Principal, Depends(require(scopes.DEPLOY_FUNCTION, scopes.ACCOUNT_SETUP))]
#: the longest period one query covers, and the one it covers when `since` is not given
MAX_PERIOD = timedelta(days=366)
DEFAULT_PERIOD = timedelta(days=30)
FORMATS = ("json", "csv")
CSV = "text/csv"

_Time = Annotated[
    str | None,
    Query(description="RFC 3339 time (`2026-12-01T00:00:00Z`); a time without zone is UTC"),
]


def _time(name: str, value: str | None, errors: list[FieldError]) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value) if len(value) <= 64 else None
    except ValueError:
        parsed = None
    if parsed is None:
        errors.append(FieldError(name, "must be an RFC 3339 time, e.g. 2026-12-01T00:00:00Z"))
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


@router.get(
    "/usage",
    summary="Metered usage of an account by period and grouping: GPU-seconds, invocations, "
    "tokens (JSON, or CSV with `Accept: text/csv` or `?format=csv`)",
    responses={200: {"content": {CSV: {"schema": {"type": "string"}}}}},
)
async def usage(
    request: Request,
    session: Session,
    principal: Reader,
    since: _Time = None,
    until: _Time = None,
    by: Annotated[
        str | None,
        Query(description="function (default), version, model, instanceType or cluster"),
    ] = None,
    account: Annotated[
        str | None, Query(description="the account (default: the caller's own)")
    ] = None,
    format: Annotated[str | None, Query(description="json (default) or csv")] = None,
    step: Annotated[
        str | None,
        Query(description="hour or day: the totals of each step too, as `series` (JSON only)"),
    ] = None,
) -> Response:
    errors: list[FieldError] = []
    now = utcnow()
    start, end = _time("since", since, errors), _time("until", until, errors)
    grouping = _grouping(by, errors)
    if format is not None and format not in FORMATS:
        errors.append(FieldError("format", f"must be one of {', '.join(FORMATS)}"))
    every = _step(step, errors)
    account_id = principal.account_id if account is None else account
    if not 1 <= len(account_id) <= MAX_ACCOUNT_ID:
        errors.append(FieldError("account", f"must be 1 to {MAX_ACCOUNT_ID} characters"))
    elif account_id != principal.account_id:
        if scopes.ACCOUNT_SETUP not in principal.scopes:
            raise Forbidden(
                detail=f"only the operator (scope '{scopes.ACCOUNT_SETUP}') reads another "
                "account's usage"
            )
        if await auth_repository.account_by_id(session, account_id) is None:
            errors.append(FieldError("account", f"unknown account '{account_id}'"))
    end = end or now
    start = start or end - DEFAULT_PERIOD
    if not errors and start >= end:
        errors.append(FieldError("since", "must be before until"))
    elif not errors and end - start > MAX_PERIOD:
        errors.append(FieldError("until", f"at most {MAX_PERIOD.days} days after since"))
    elif not errors and every is not None and (end - start) / STEP_LENGTH[every] > MAX_POINTS:
        errors.append(FieldError("step", f"gives more than {MAX_POINTS} points over the period"))
    if errors or grouping is None:
        raise ValidationFailed.of(errors)
    spans, counts = await account_records(
        session, account_id, start, end, await open_spans(session, account_id)
    )
    groups = grouped(spans, counts, by=grouping, since=start, until=end, now=now)
    rows = [g.out() for g in groups]
    if format == "csv" or (format is None and _wants_csv(request)):
        return _csv(account_id, grouping, rows)
    body: dict[str, Any] = {
        "account": account_id,
        "since": iso_z(start),
        "until": iso_z(end),
        "by": grouping.value,
        "usage": rows,
        "total": totals(groups),
    }
    if every is not None:
        points = series(spans, counts, since=start, until=end, now=now, step=every)
        body["series"] = [
            {**p, "since": iso_z(p["since"]), "until": iso_z(p["until"])}  # type: ignore[arg-type]
            for p in points
        ]
    return JSONResponse(body)


def _step(step: str | None, errors: list[FieldError]) -> Step | None:
    if step is None:
        return None
    try:
        return Step(step)
    except ValueError:
        errors.append(FieldError("step", f"must be one of {', '.join(s.value for s in Step)}"))
        return None


def _grouping(by: str | None, errors: list[FieldError]) -> Grouping | None:
    if by is None:
        return Grouping.FUNCTION
    try:
        return Grouping(by)
    except ValueError:
        names = ", ".join(g.value for g in Grouping)
        errors.append(FieldError("by", f"must be one of {names}"))
        return None


def _wants_csv(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return any(part.split(";")[0].strip().lower() == CSV for part in accept.split(","))


def _cell(value: object) -> object:
    """A name a spreadsheet would run as a formula is written as text."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def _csv(account_id: str, grouping: Grouping, rows: list[dict[str, object]]) -> Response:
    out = io.StringIO()
    columns = ["account", *GROUP_FIELDS[grouping], *MEASURES]
    writer = csv.DictWriter(out, columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(v) for k, v in {"account": account_id, **row}.items()})
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in account_id)
    return Response(
        out.getvalue(),
        media_type=CSV,
        headers={"content-disposition": f'attachment; filename="usage-{safe}.csv"'},
    )


@router.get(
    "/accounts/{ncaId}/usage/gpus",
    response_model=ListGpuUsageResponse,
    summary="GPUs the account's deployed functions may use now (NVCF's GPU max usage)",
)
async def gpu_usage(
    ncaId: str, session: Session, principal: Deployer, catalog: CatalogDep
) -> ListGpuUsageResponse:
    if ncaId != principal.account_id:
        if scopes.ACCOUNT_SETUP not in principal.scopes:
            raise Forbidden(
                detail=f"only the operator (scope '{scopes.ACCOUNT_SETUP}') reads another "
                "account's GPU usage"
            )
        if len(ncaId) > MAX_ACCOUNT_ID or not await auth_repository.account_by_id(session, ncaId):
            raise ValidationFailed.of([FieldError("ncaId", f"unknown account '{ncaId[:128]}'")])
    specs = await deployments_repository.live_specs_of_account(session, ncaId)
    return ListGpuUsageResponse(gpus=gpus_in_use(specs, catalog))


def gpus_in_use(specs: Sequence[DeploymentSpec], catalog: Catalog) -> list[GpuUsageOut]:
    """NVCF's reading: per GPU and instance type, the minimum and maximum instances summed
    over the specifications; per cluster, those of the specifications that may be placed on
    it."""
    by_type: dict[tuple[str, str], list[DeploymentSpec]] = {}
    for spec in specs:
        by_type.setdefault((spec.gpu, spec.instance_type), []).append(spec)
    out: list[GpuUsageOut] = []
    for (gpu, instance_type), group in sorted(by_type.items()):
        per_cluster: dict[str, list[int]] = {}
        for spec in group:
            for name in spec.candidate_clusters or []:
                counts = per_cluster.setdefault(str(name), [0, 0])
                counts[0] += spec.max_instances
                counts[1] += spec.min_instances
        placements = placements_on(
            catalog, {name: (most, least) for name, (most, least) in per_cluster.items()}
        )
        out.append(
            GpuUsageOut(
                gpu=gpu,
                instance_type=instance_type,
                current_max_usage=sum(s.max_instances for s in group),
                current_min_usage=sum(s.min_instances for s in group),
                placements=placements,
            )
        )
    return out
