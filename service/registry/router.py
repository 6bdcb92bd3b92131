"""HTTP routes of the registry credentials API (api.md §5).

`DELETE` answers 204 with an empty body, like the deletion of a function version.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response

from service.auth import scopes
from service.auth.deps import Session, idempotency, require
from service.auth.service import Principal, lock_account
from service.core.crypto import SecretBox
from service.core.http import inline_body_doc, parse_uuid, read_json
from service.core.idempotency import Recorder
from service.core.pagination import MAX_LIMIT, make_page
from service.registry import service
from service.registry.schemas import (
    RegistryCredentialCreate,
    RegistryCredentialEnvelope,
    RegistryCredentialList,
    RegistryCredentialOut,
    RegistryCredentialUpdate,
)
from service.state import app_state

router = APIRouter(tags=["registry credentials"])

Manager = Annotated[Principal, Depends(require(scopes.MANAGE_REGISTRY_CREDENTIALS))]
Idem = Annotated[Recorder, Depends(idempotency, scope="function")]

_ID = "registryCredentialId"


def _box(request: Request) -> SecretBox:
    box: SecretBox = request.app.state.secret_box
    return box


@router.post(
    "/registry-credentials",
    response_model=RegistryCredentialEnvelope,
    response_model_exclude_none=True,
    openapi_extra=inline_body_doc(RegistryCredentialCreate),
    summary="Store a registry credential (the password is write-only)",
)
async def create_registry_credential(
    request: Request, session: Session, principal: Manager, idem: Idem
) -> dict[str, Any]:
    spec = service.validate_create(await read_json(request))
    await app_state(request).quotas.registry_credentials.check(
        lambda: service.count_credentials(session, principal.account_id),
        lambda: lock_account(session, principal.account_id),
    )
    cred = await service.create_credential(
        session, account_id=principal.account_id, spec=spec, box=_box(request)
    )
    envelope = RegistryCredentialEnvelope(registry_credential=RegistryCredentialOut.of(cred))
    return idem.record(envelope.model_dump(mode="json", by_alias=True, exclude_none=True))


@router.get(
    "/registry-credentials",
    response_model=RegistryCredentialList,
    response_model_exclude_none=True,
    summary="List the caller's registry credentials",
)
async def list_registry_credentials(
    session: Session,
    principal: Manager,
    limit: Annotated[int | None, Query(ge=1, le=MAX_LIMIT)] = None,
    cursor: str | None = None,
) -> RegistryCredentialList:
    page = make_page(limit, cursor)
    rows, next_cursor = await service.list_credentials(session, principal.account_id, page=page)
    return RegistryCredentialList(
        registry_credentials=[RegistryCredentialOut.of(c) for c in rows], next_cursor=next_cursor
    )


@router.get(
    "/registry-credentials/{registryCredentialId}",
    response_model=RegistryCredentialEnvelope,
    response_model_exclude_none=True,
    summary="Get one registry credential (without its password)",
)
async def get_registry_credential(
    registryCredentialId: str,
    session: Session,
    principal: Manager,
) -> RegistryCredentialEnvelope:
    cid = parse_uuid(registryCredentialId, _ID)
    cred = await service.get_credential(session, principal.account_id, cid)
    return RegistryCredentialEnvelope(registry_credential=RegistryCredentialOut.of(cred))


@router.patch(
    "/registry-credentials/{registryCredentialId}",
    response_model=RegistryCredentialEnvelope,
    response_model_exclude_none=True,
    openapi_extra=inline_body_doc(RegistryCredentialUpdate),
    summary="Change a registry credential's hostname, username, password or description",
)
async def update_registry_credential(
    registryCredentialId: str,
    request: Request,
    session: Session,
    principal: Manager,
) -> RegistryCredentialEnvelope:
    cid = parse_uuid(registryCredentialId, _ID)
    update = service.validate_update(await read_json(request))
    cred = await service.update_credential(
        session, principal.account_id, cid, update, _box(request)
    )
    return RegistryCredentialEnvelope(registry_credential=RegistryCredentialOut.of(cred))


@router.delete(
    "/registry-credentials/{registryCredentialId}",
    status_code=204,
    response_class=Response,
    summary="Delete a registry credential",
)
async def delete_registry_credential(
    registryCredentialId: str,
    session: Session,
    principal: Manager,
) -> Response:
    cid = parse_uuid(registryCredentialId, _ID)
    await service.delete_credential(session, principal.account_id, cid)
    return Response(status_code=204)
