"""HTTP routes of instance logs (docs/logs.md); scope `deploy_function`, the deployment's
account only (another's is 404). The answer is `text/plain`, one line per line printed."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi.responses import StreamingResponse

from service.auth.deps import Session
from service.backends.logs import LogRequest
from service.clusters.deps import AdaptersDep
from service.core.db import utcnow
from service.core.deps import SecretBoxDep, SettingsDep
from service.core.http import parse_uuid, parse_uuids
from service.core.settings import Settings
from service.deployments.logs import service
from service.deployments.logs.deps import LogFollowsDep
from service.deployments.router_common import Deployer

router = APIRouter(tags=["deployments"])

_CONTAINER = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
#: NGC keeps 48 h of logs; a cluster may keep more, but no caller needs a month
_MAX_SINCE = 30 * 86400
LOG_TEXT: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/plain": {}}, "description": "The log lines."}
}

Container = Annotated[
    str | None,
    Query(
        max_length=63,
        pattern=_CONTAINER,
        description="Only this container (default: every container of every pod).",
    ),
]
TailLines = Annotated[
    int | None,
    Query(
        alias="tailLines",
        ge=0,
        description="The last N lines of each container (at most NVCF_LOGS_MAX_TAIL_LINES, "
        "also the default).",
    ),
]
SinceSeconds = Annotated[
    int | None,
    Query(alias="sinceSeconds", ge=1, le=_MAX_SINCE, description="Lines of the last N seconds."),
]
Timestamps = Annotated[
    bool, Query(description="Prefix each line with the RFC 3339 time it was printed.")
]
Follow = Annotated[
    bool,
    Query(
        description="Stream new lines as they are printed, until the instance ends or the "
        "caller leaves (NVCF_LOGS_MAX_FOLLOWS_PER_ACCOUNT at once; 429 beyond)."
    ),
]


def _query(
    settings: SettingsDep,
    container: Container = None,
    tail_lines: TailLines = None,
    since_seconds: SinceSeconds = None,
    timestamps: Timestamps = False,
    follow: Follow = False,
) -> LogRequest:
    """The query parameters both log routes take, checked against the settings' bounds."""
    return service.log_request(settings, container, tail_lines, since_seconds, timestamps, follow)


LogQuery = Annotated[LogRequest, Depends(_query)]


async def log_answer(
    follows: service.FollowLimiter,
    settings: Settings,
    reading: service.Reading,
    account_id: str,
) -> StreamingResponse:
    """The `text/plain` answer of a reading (the task logs route answers the same way)."""
    held = None
    if reading.request.follow and reading.sources:
        held = follows.acquire(account_id)
    try:
        body = await service.open_stream(reading, settings, held)
    except BaseException:
        if held is not None:
            held.release()
        raise
    return StreamingResponse(
        body,
        media_type="text/plain; charset=utf-8",
        headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"},
    )


@router.get(
    "/deployments/{deploymentId}/instances/{instanceId}/logs",
    response_class=StreamingResponse,
    responses=LOG_TEXT,
    summary="What an instance's containers printed (live, or the last lines kept when it failed)",
    description="Each line is prefixed with `[pod/container]` unless `container` names one. "
    "An instance that failed (even torn down since) answers with the last lines of its "
    "containers kept at its failure. Function secret values are masked.",
)
async def instance_logs(
    deploymentId: str,
    instanceId: str,
    session: Session,
    principal: Deployer,
    query: LogQuery,
    settings: SettingsDep,
    adapters: AdaptersDep,
    box: SecretBoxDep,
    follows: LogFollowsDep,
) -> StreamingResponse:
    did, iid = parse_uuids((deploymentId, "deploymentId"), (instanceId, "instanceId"))
    reading = await service.instance_reading(
        session, adapters, box, principal.account_id, did, iid, query, utcnow()
    )
    return await log_answer(follows, settings, reading, principal.account_id)


@router.get(
    "/deployments/{deploymentId}/logs",
    response_class=StreamingResponse,
    responses=LOG_TEXT,
    summary="What the Running instances of a deployment print, each line prefixed with its "
    "instance",
    description="Lines are prefixed with `[instanceId]` and (unless `container` names one) "
    "`[pod/container]`. Function secret values are masked.",
)
async def deployment_logs(
    deploymentId: str,
    session: Session,
    principal: Deployer,
    query: LogQuery,
    settings: SettingsDep,
    adapters: AdaptersDep,
    box: SecretBoxDep,
    follows: LogFollowsDep,
) -> StreamingResponse:
    did = parse_uuid(deploymentId, "deploymentId")
    reading = await service.deployment_reading(
        session, adapters, box, principal.account_id, did, query, utcnow()
    )
    return await log_answer(follows, settings, reading, principal.account_id)
