"""HTTP routes of telemetry endpoints at NVCF's paths, scopes and shapes: `manage_telemetries`
for `/telemetries`, `update_secrets` for a new key. `DELETE` and the key's `PUT` answer 204."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response

from service.auth import scopes
from service.auth.deps import Session, idempotency, require
from service.auth.limits import account_quota
from service.auth.repository import lock_account
from service.auth.service import TELEMETRIES_ARE_ACCOUNT_WIDE, Principal
from service.core.deps import EventsDep, QuotasDep, SecretBoxDep, SettingsDep
from service.core.errors import Forbidden
from service.core.http import inline_body_doc, parse_uuid, read_json
from service.core.idempotency import Recorder
from service.observability import service
from service.observability.deps import TelemetryUsersDep
from service.observability.schemas import (
    TelemetryCreate,
    TelemetryEnvelope,
    TelemetryList,
    TelemetrySecretUpdate,
)

router = APIRouter(tags=["telemetries"])


def _account_wide(principal: Principal) -> Principal:
    if principal.functions is not None:
        raise Forbidden(detail=TELEMETRIES_ARE_ACCOUNT_WIDE)
    return principal


async def _manager(
    principal: Annotated[Principal, Depends(require(scopes.MANAGE_TELEMETRIES))],
) -> Principal:
    return _account_wide(principal)


async def _secrets_updater(
    principal: Annotated[Principal, Depends(require(scopes.UPDATE_SECRETS))],
) -> Principal:
    return _account_wide(principal)


Manager = Annotated[Principal, Depends(_manager)]
SecretsUpdater = Annotated[Principal, Depends(_secrets_updater)]
Idem = Annotated[Recorder, Depends(idempotency, scope="function")]

_ID = "telemetryId"


@router.post(
    "/telemetries",
    response_model=TelemetryEnvelope,
    response_model_exclude_none=True,
    openapi_extra=inline_body_doc(TelemetryCreate),
    summary="Add a telemetry endpoint (its key is write-only)",
)
async def create_telemetry(
    request: Request,
    session: Session,
    principal: Manager,
    idem: Idem,
    quotas: QuotasDep,
    box: SecretBoxDep,
    settings: SettingsDep,
) -> dict[str, Any]:
    spec = await service.validate_create(await read_json(request), settings.telemetry_allowlist)
    quota = await account_quota(session, quotas.telemetries, principal.account_id)
    await quota.check(
        lambda: service.count(session, principal.account_id),
        lambda: lock_account(session, principal.account_id),
    )
    telemetry = await service.create(session, account_id=principal.account_id, spec=spec, box=box)
    envelope = TelemetryEnvelope(telemetry=service.describe(telemetry))
    return idem.record(envelope.model_dump(mode="json", by_alias=True, exclude_none=True))


@router.get(
    "/telemetries",
    response_model=TelemetryList,
    response_model_exclude_none=True,
    summary="List the account's telemetry endpoints",
)
async def list_telemetries(session: Session, principal: Manager) -> TelemetryList:
    rows = await service.list_all(session, principal.account_id)
    return TelemetryList(telemetries=[service.describe(t) for t in rows])


@router.get(
    "/telemetries/{telemetryId}",
    response_model=TelemetryEnvelope,
    response_model_exclude_none=True,
    summary="Get one telemetry endpoint (without its key), with its export status",
)
async def get_telemetry(
    telemetryId: str, session: Session, principal: Manager
) -> TelemetryEnvelope:
    telemetry = await service.get(session, principal.account_id, parse_uuid(telemetryId, _ID))
    return TelemetryEnvelope(telemetry=service.describe(telemetry))


@router.delete(
    "/telemetries/{telemetryId}",
    status_code=204,
    response_class=Response,
    summary="Delete a telemetry endpoint no function version names",
)
async def delete_telemetry(
    telemetryId: str, session: Session, principal: Manager, users: TelemetryUsersDep
) -> Response:
    await service.delete(session, principal.account_id, parse_uuid(telemetryId, _ID), users)
    return Response(status_code=204)


@router.put(
    "/secrets/telemetries/{telemetryId}",
    status_code=204,
    response_class=Response,
    openapi_extra=inline_body_doc(TelemetrySecretUpdate),
    summary="Replace a telemetry endpoint's key",
)
async def update_telemetry_secret(
    telemetryId: str,
    request: Request,
    session: Session,
    principal: SecretsUpdater,
    box: SecretBoxDep,
    events: EventsDep,
) -> Response:
    tid = parse_uuid(telemetryId, _ID)
    secret = service.validate_secret_update(await read_json(request))
    await service.update_secret(session, principal.account_id, tid, secret, box, events)
    return Response(status_code=204)
