"""HTTP routes of a function's canary release (releases.py): GET needs `list_functions`, the
POSTs `deploy_function`; only the function's owner reaches them (anyone else: the 404 of an
unknown function). Every change of the split is announced (`AccessChanged`) so that this
replica routes by it at once, the others within `NVCF_INVOKE_ROUTE_CACHE_SECONDS`."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth import scopes
from service.auth.deps import Session, require
from service.auth.service import Principal
from service.core.db import after_commit, utcnow
from service.core.deps import events
from service.core.errors import Conflict, ValidationFailed
from service.core.http import inline_body_doc, parse_uuid, read_json, require_json_object
from service.core.validation import parse
from service.deployments import releases
from service.deployments.deps import WakeDep
from service.deployments.revisions import principal_name
from service.deployments.router_common import Deployer
from service.functions import service as functions
from service.functions.events import AccessChanged

router = APIRouter(tags=["deployments"])

Reader = Annotated[Principal, Depends(require(scopes.LIST_FUNCTIONS))]
_PATH = "/functions/{functionId}/canary"
_NO_BODY = {
    "requestBody": {
        "required": False,
        "description": "none: the action is in the path (an empty object is accepted)",
        "content": {"application/json": {"schema": {"type": "object", "maxProperties": 0}}},
    }
}


async def _owned(session: AsyncSession, principal: Principal, functionId: str) -> uuid.UUID:
    fid = parse_uuid(functionId, "functionId")
    await functions.get_function(session, principal.account_id, fid)
    return fid


@router.get(
    _PATH,
    response_model=releases.CanaryOut,
    response_model_exclude_none=True,
    summary="A function's canary release under way (else its last one), with the figures of "
    "its current step",
)
async def get_canary(functionId: str, session: Session, principal: Reader) -> releases.CanaryOut:
    fid = await _owned(session, principal, functionId)
    return await releases.view(session, await releases.get_latest(session, fid))


@router.post(
    _PATH,
    response_model=releases.CanaryOut,
    response_model_exclude_none=True,
    openapi_extra=inline_body_doc(releases.CanaryStart),
    summary="Start a canary release of a version: its plan's steps, each advanced when its "
    "analysis passes",
)
async def start_canary(
    functionId: str, request: Request, session: Session, principal: Deployer, wake: WakeDep
) -> releases.CanaryOut:
    fid = await _owned(session, principal, functionId)
    body: dict[str, Any] = require_json_object(await read_json(request))
    model, errors = parse(releases.CanaryStart, body)
    if errors or model is None:
        raise ValidationFailed.of(errors)
    release = await releases.start(session, fid, model, by=principal_name(principal), now=utcnow())
    await (await events(request)).publish(session, AccessChanged(fid))
    after_commit(session, wake)  # the versions' shares may change their instance counts
    return await releases.view(session, release)


def _action_route(action: releases.Action) -> None:
    async def operate(
        functionId: str, request: Request, session: Session, principal: Deployer, wake: WakeDep
    ) -> releases.CanaryOut:
        fid = await _owned(session, principal, functionId)
        release = await releases.get_latest(session, fid)
        if not await releases.operate(
            session, release, action, by=principal_name(principal), now=utcnow()
        ):
            raise Conflict(detail=f"canary release {release.id} changed meanwhile; read it again")
        await (await events(request)).publish(session, AccessChanged(fid))
        after_commit(session, wake)  # instance counts follow the shares; an abort may undeploy
        return await releases.view(session, release)

    handler: Callable[..., Awaitable[releases.CanaryOut]] = operate
    handler.__name__ = f"{action.value}_canary"
    router.post(
        f"{_PATH}/{action.value}",
        response_model=releases.CanaryOut,
        response_model_exclude_none=True,
        openapi_extra=_NO_BODY,
        summary={
            releases.Action.PAUSE: "Pause a canary release at its step (its weight stays)",
            releases.Action.RESUME: "Resume a paused canary release (the step's time restarts)",
            releases.Action.PROMOTE: "Promote the canary now (100 % of the traffic)",
            releases.Action.ABORT: "Abort a canary release now (the stable version takes all)",
        }[action],
    )(handler)


for _action in releases.Action:
    _action_route(_action)
