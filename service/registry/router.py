"""HTTP routes of the registry credentials API (api.md §5, NVCF's shape).

`DELETE` answers 204 with an empty body, as NVCF does (nvcf-cli expects exactly 204).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response

from service.auth import scopes
from service.auth.deps import Session, idempotency, require
from service.auth.limits import account_quota
from service.auth.repository import lock_account
from service.auth.service import REGISTRY_IS_ACCOUNT_WIDE, Principal
from service.core.deps import QuotasDep, SecretBoxDep
from service.core.errors import Forbidden
from service.core.http import inline_body_doc, parse_uuid, read_json
from service.core.idempotency import Recorder
from service.core.pagination import Limit, make_page
from service.registry import service
from service.registry.recognized import recognized_registries
from service.registry.schemas import (
    RecognizedRegistries,
    RecognizedRegistry,
    RegistryCredentialCreate,
    RegistryCredentialEnvelope,
    RegistryCredentialList,
    RegistryCredentialUpdate,
)

router = APIRouter(tags=["registry credentials"])


async def _manager(
    principal: Annotated[Principal, Depends(require(scopes.MANAGE_REGISTRY_CREDENTIALS))],
) -> Principal:
    if principal.functions is not None:
        raise Forbidden(detail=REGISTRY_IS_ACCOUNT_WIDE)
    return principal


Manager = Annotated[Principal, Depends(_manager)]
Idem = Annotated[Recorder, Depends(idempotency, scope="function")]

_ID = "registryCredentialId"


@router.post(
    "/registry-credentials",
    response_model=RegistryCredentialEnvelope,
    response_model_exclude_none=True,
    openapi_extra=inline_body_doc(RegistryCredentialCreate),
    summary="Add a registry credential (the secret is write-only)",
)
async def create_registry_credential(
    request: Request,
    session: Session,
    principal: Manager,
    idem: Idem,
    quotas: QuotasDep,
    box: SecretBoxDep,
) -> dict[str, Any]:
    spec = service.validate_create(await read_json(request))
    quota = await account_quota(session, quotas.registry_credentials, principal.account_id)
    await quota.check(
        lambda: service.count_credentials(session, principal.account_id),
        lambda: lock_account(session, principal.account_id),
    )
    cred = await service.create_credential(
        session, account_id=principal.account_id, spec=spec, box=box
    )
    envelope = RegistryCredentialEnvelope(registry_credential=service.describe(cred, box))
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
    box: SecretBoxDep,
    artifact_type: Annotated[
        list[str] | None,
        Query(
            alias="artifactType",
            description="only credentials with any of these artifact types (CONTAINER, HELM, "
            "MODEL, RESOURCE); repeat the parameter or separate with commas",
        ),
    ] = None,
    provisioned_by: Annotated[
        list[str] | None,
        Query(alias="provisionedBy", description="only credentials made by SYSTEM or USER"),
    ] = None,
    limit: Limit = None,
    cursor: str | None = None,
) -> RegistryCredentialList:
    filters = service.parse_filters(artifact_type, provisioned_by)
    page = make_page(limit, cursor)
    rows, next_cursor = await service.list_credentials(
        session, principal.account_id, page=page, filters=filters
    )
    return RegistryCredentialList(
        registry_credentials=[service.describe(c, box) for c in rows], next_cursor=next_cursor
    )


@router.get(
    "/registry-credentials/{registryCredentialId}",
    response_model=RegistryCredentialEnvelope,
    response_model_exclude_none=True,
    summary="Get one registry credential (without its secret)",
)
async def get_registry_credential(
    registryCredentialId: str,
    session: Session,
    principal: Manager,
    box: SecretBoxDep,
) -> RegistryCredentialEnvelope:
    cid = parse_uuid(registryCredentialId, _ID)
    cred = await service.get_credential(session, principal.account_id, cid)
    return RegistryCredentialEnvelope(registry_credential=service.describe(cred, box))


@router.patch(
    "/registry-credentials/{registryCredentialId}",
    response_model=RegistryCredentialEnvelope,
    response_model_exclude_none=True,
    openapi_extra=inline_body_doc(RegistryCredentialUpdate),
    summary="Replace a registry credential's secret and/or add artifact types to it",
)
async def update_registry_credential(
    registryCredentialId: str,
    request: Request,
    session: Session,
    principal: Manager,
    box: SecretBoxDep,
) -> RegistryCredentialEnvelope:
    cid = parse_uuid(registryCredentialId, _ID)
    update = service.validate_update(await read_json(request))
    cred = await service.update_credential(session, principal.account_id, cid, update, box)
    return RegistryCredentialEnvelope(registry_credential=service.describe(cred, box))


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


@router.get(
    "/recognized-registries",
    response_model=RecognizedRegistries,
    summary="List the registries NVCF recognizes, per artifact type",
)
async def list_recognized_registries(principal: Manager) -> RecognizedRegistries:
    return RecognizedRegistries(
        recognized_registries={
            kind: [RecognizedRegistry(**item) for item in items]
            for kind, items in recognized_registries().items()
        }
    )
