"""HTTP routes of a function's traffic split (traffic.py): GET needs `list_functions`, PUT
`deploy_function`; only the function's owner reaches them (anyone else: the 404 of an unknown
function). A new split is announced (`AccessChanged`) so that this replica routes by it at
once, other replicas within `NVCF_INVOKE_ROUTE_CACHE_SECONDS`."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from service.auth import scopes
from service.auth.deps import Session, require
from service.auth.service import Principal
from service.core.db import after_commit, utcnow
from service.core.deps import events
from service.core.errors import ValidationFailed
from service.core.http import parse_uuid, read_json, require_json_object
from service.core.validation import parse
from service.deployments import traffic, transitions
from service.deployments.deps import WakeDep
from service.deployments.router_common import Deployer
from service.functions import service as functions
from service.functions.events import AccessChanged

router = APIRouter(tags=["deployments"])

Reader = Annotated[Principal, Depends(require(scopes.LIST_FUNCTIONS))]
_PATH = "/functions/{functionId}/traffic"
_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["traffic"],
                    "properties": {
                        "traffic": {
                            "type": "array",
                            "maxItems": traffic.MAX_SPLIT,
                            "items": {
                                "type": "object",
                                "required": ["versionId", "weight"],
                                "properties": {
                                    "versionId": {"type": "string", "format": "uuid"},
                                    "weight": {
                                        "type": "integer",
                                        "minimum": 0,
                                        "maximum": traffic.TOTAL,
                                    },
                                },
                            },
                        }
                    },
                }
            }
        },
    }
}


@router.get(
    _PATH,
    response_model=traffic.TrafficSplit,
    summary="A function's traffic split (empty: its newest invocable version takes it all)",
)
async def get_traffic(functionId: str, session: Session, principal: Reader) -> traffic.TrafficSplit:
    fid = parse_uuid(functionId, "functionId")
    await functions.get_function(session, principal.account_id, fid)
    return await traffic.split_of(session, fid)


@router.put(
    _PATH,
    response_model=traffic.TrafficSplit,
    openapi_extra=_BODY,
    summary="Set a function's traffic split: weights summing to 100 over its invocable versions",
)
async def set_traffic(
    functionId: str, request: Request, session: Session, principal: Deployer, wake: WakeDep
) -> traffic.TrafficSplit:
    fid = parse_uuid(functionId, "functionId")
    await functions.get_function(session, principal.account_id, fid)
    body: dict[str, Any] = require_json_object(await read_json(request))
    model, errors = parse(traffic.TrafficRequest, body)
    if model is not None:
        errors += await traffic.violations(session, fid, model.traffic)
    if errors or model is None:
        raise ValidationFailed.of(errors)
    weights = {w.version_id: w.weight for w in model.traffic}
    await transitions.set_split(session, fid, weights, utcnow())
    await (await events(request)).publish(session, AccessChanged(fid))
    after_commit(session, wake)  # the versions' shares may change their instance counts
    return await traffic.split_of(session, fid)
