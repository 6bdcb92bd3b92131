"""HTTP routes of function sharing, NVCF's authorization routes (scope `authorize_clients`).

`/authorizations/functions/{functionId}` shares the whole function (every version, later ones
included); `.../versions/{functionVersionId}` one version. POST replaces the accounts of that
level, PATCH `add`/`remove` change one, DELETE clears the level, GET reads them (for a
version: the whole function's accounts and its own). Only the owner may call them: anyone
else gets the 404 of an unknown function. All answer 200 with NVCF's bodies.

An account a function is shared with may invoke it (invocation/access.py). A change that may
take a share away (replace, remove, clear) makes this replica forget the function's cached
invocation targets once committed: its new invocations are refused at once, other replicas'
within `NVCF_INVOKE_ROUTE_CACHE_SECONDS`.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from service.auth import scopes
from service.auth.deps import Session, require
from service.auth.service import Principal
from service.core.deps import events
from service.core.errors import FieldError, ValidationFailed
from service.core.http import (
    json_body_doc,
    parse_uuid,
    parse_uuids,
    read_json,
    require_json_object,
)
from service.core.validation import parse
from service.functions import service, sharing
from service.functions.events import AccessChanged
from service.functions.requests import AuthorizedPartiesRequest, AuthorizedPartyPatch
from service.functions.responses import (
    AuthorizedParties,
    AuthorizedPartiesEnvelope,
    AuthorizedPartiesList,
)

router = APIRouter(tags=["function sharing"])

Sharer = Annotated[Principal, Depends(require(scopes.AUTHORIZE_CLIENTS))]

_FUNCTION = "/authorizations/functions/{functionId}"
_VERSION = _FUNCTION + "/versions/{functionVersionId}"
_SET_DOC = json_body_doc("AuthorizedPartiesRequest")
_PATCH_DOC = json_body_doc("AuthorizedPartyPatch")


def _own_account(where: str, account: str, owner: str) -> list[FieldError]:
    if account != owner:
        return []
    return [FieldError(where, f"'{account}' owns the function; only other accounts are authorized")]


async def _parties_body(request: Request, owner: str) -> list[str]:
    body = require_json_object(await read_json(request))
    model, errors = parse(AuthorizedPartiesRequest, body)
    if model is not None:
        for i, party in enumerate(model.authorized_parties):
            errors += _own_account(f"authorizedParties[{i}].ncaId", party.nca_id, owner)
    if errors or model is None:
        raise ValidationFailed.of(errors)
    return [p.nca_id for p in model.authorized_parties]


async def _party_body(request: Request, owner: str) -> str:
    body = require_json_object(await read_json(request))
    model, errors = parse(AuthorizedPartyPatch, body)
    if model is not None:
        errors += _own_account("authorizedParty.ncaId", model.authorized_party.nca_id, owner)
    if errors or model is None:
        raise ValidationFailed.of(errors)
    return model.authorized_party.nca_id


async def _owned(
    session: Session, principal: Principal, function_id: str, version_id: str | None
) -> tuple[uuid.UUID, uuid.UUID | None]:
    """The ids, once the caller is known to own the function (and the version): else 404."""
    if version_id is None:
        fid = parse_uuid(function_id, "functionId")
        await service.get_function(session, principal.account_id, fid)
        return fid, None
    fid, vid = parse_uuids((function_id, "functionId"), (version_id, "functionVersionId"))
    await service.get_version(session, principal.account_id, fid, vid)
    return fid, vid


async def _forget_targets(request: Request, session: Session, function_id: uuid.UUID) -> None:
    """Who may invoke the function may have changed: announced, so that this replica's
    invocation plane re-reads it at once."""
    await (await events(request)).publish(session, AccessChanged(function_id))


def _envelope(
    principal: Principal, fid: uuid.UUID, vid: uuid.UUID | None, accounts: list[str] | None
) -> dict[str, Any]:
    body = AuthorizedPartiesEnvelope(
        function=AuthorizedParties.of(fid, principal.account_id, vid, accounts)
    )
    return body.model_dump(mode="json", by_alias=True, exclude_none=True)


async def _set(
    request: Request, session: Session, principal: Principal, function_id: str, vid: str | None
) -> dict[str, Any]:
    fid, version = await _owned(session, principal, function_id, vid)
    accounts = await _parties_body(request, principal.account_id)
    await _forget_targets(request, session, fid)
    return _envelope(
        principal, fid, version, await sharing.replace(session, fid, version, accounts)
    )


async def _add(
    request: Request, session: Session, principal: Principal, function_id: str, vid: str | None
) -> dict[str, Any]:
    fid, version = await _owned(session, principal, function_id, vid)
    account = await _party_body(request, principal.account_id)
    return _envelope(principal, fid, version, await sharing.add(session, fid, version, account))


async def _remove(
    request: Request, session: Session, principal: Principal, function_id: str, vid: str | None
) -> dict[str, Any]:
    fid, version = await _owned(session, principal, function_id, vid)
    account = await _party_body(request, principal.account_id)
    await _forget_targets(request, session, fid)
    return _envelope(principal, fid, version, await sharing.remove(session, fid, version, account))


async def _clear(
    request: Request, session: Session, principal: Principal, function_id: str, vid: str | None
) -> dict[str, Any]:
    fid, version = await _owned(session, principal, function_id, vid)
    await sharing.clear(session, fid, version)
    await _forget_targets(request, session, fid)
    return _envelope(principal, fid, version, None)


# --- the whole function ---------------------------------------------------------------------


@router.post(
    _FUNCTION,
    response_model=AuthorizedPartiesEnvelope,
    response_model_exclude_none=True,
    openapi_extra=_SET_DOC,
    summary="Share every version of a function with these accounts (replacing the previous ones)",
)
async def authorize_function(
    functionId: str, request: Request, session: Session, principal: Sharer
) -> dict[str, Any]:
    return await _set(request, session, principal, functionId, None)


@router.get(
    _FUNCTION,
    response_model=AuthorizedPartiesList,
    response_model_exclude_none=True,
    summary="The accounts each version of a function is shared with",
)
async def function_authorizations(
    functionId: str, session: Session, principal: Sharer
) -> dict[str, Any]:
    fid, _ = await _owned(session, principal, functionId, None)
    by_version = await sharing.parties_by_version(session, fid)
    versions = await service.version_ids(session, fid)
    body = AuthorizedPartiesList(
        functions=[
            AuthorizedParties.of(fid, principal.account_id, v, sharing.merged(by_version, v))
            for v in versions
        ]
    )
    return body.model_dump(mode="json", by_alias=True, exclude_none=True)


@router.patch(
    _FUNCTION + "/add",
    response_model=AuthorizedPartiesEnvelope,
    response_model_exclude_none=True,
    openapi_extra=_PATCH_DOC,
    summary="Share every version of a function with one more account",
)
async def add_function_authorization(
    functionId: str, request: Request, session: Session, principal: Sharer
) -> dict[str, Any]:
    return await _add(request, session, principal, functionId, None)


@router.patch(
    _FUNCTION + "/remove",
    response_model=AuthorizedPartiesEnvelope,
    response_model_exclude_none=True,
    openapi_extra=_PATCH_DOC,
    summary="Stop sharing a function (at the function level) with one account",
)
async def remove_function_authorization(
    functionId: str, request: Request, session: Session, principal: Sharer
) -> dict[str, Any]:
    return await _remove(request, session, principal, functionId, None)


@router.delete(
    _FUNCTION,
    response_model=AuthorizedPartiesEnvelope,
    response_model_exclude_none=True,
    summary="Stop sharing a function at the function level (versions' own shares stay)",
)
async def clear_function_authorizations(
    functionId: str, request: Request, session: Session, principal: Sharer
) -> dict[str, Any]:
    return await _clear(request, session, principal, functionId, None)


# --- one version ----------------------------------------------------------------------------


@router.post(
    _VERSION,
    response_model=AuthorizedPartiesEnvelope,
    response_model_exclude_none=True,
    openapi_extra=_SET_DOC,
    summary="Share one version with these accounts (replacing the version's own ones)",
)
async def authorize_version(
    functionId: str, functionVersionId: str, request: Request, session: Session, principal: Sharer
) -> dict[str, Any]:
    return await _set(request, session, principal, functionId, functionVersionId)


@router.get(
    _VERSION,
    response_model=AuthorizedPartiesEnvelope,
    response_model_exclude_none=True,
    summary="The accounts a version is shared with (its own and the whole function's)",
)
async def version_authorizations(
    functionId: str, functionVersionId: str, session: Session, principal: Sharer
) -> dict[str, Any]:
    fid, vid = await _owned(session, principal, functionId, functionVersionId)
    assert vid is not None
    by_version = await sharing.parties_by_version(session, fid)
    return _envelope(principal, fid, vid, sharing.merged(by_version, vid))


@router.patch(
    _VERSION + "/add",
    response_model=AuthorizedPartiesEnvelope,
    response_model_exclude_none=True,
    openapi_extra=_PATCH_DOC,
    summary="Share one version with one more account",
)
async def add_version_authorization(
    functionId: str, functionVersionId: str, request: Request, session: Session, principal: Sharer
) -> dict[str, Any]:
    return await _add(request, session, principal, functionId, functionVersionId)


@router.patch(
    _VERSION + "/remove",
    response_model=AuthorizedPartiesEnvelope,
    response_model_exclude_none=True,
    openapi_extra=_PATCH_DOC,
    summary="Stop sharing one version (its own share) with one account",
)
async def remove_version_authorization(
    functionId: str, functionVersionId: str, request: Request, session: Session, principal: Sharer
) -> dict[str, Any]:
    return await _remove(request, session, principal, functionId, functionVersionId)


@router.delete(
    _VERSION,
    response_model=AuthorizedPartiesEnvelope,
    response_model_exclude_none=True,
    summary="Stop sharing one version (the whole function's shares stay)",
)
async def clear_version_authorizations(
    functionId: str,
    functionVersionId: str,
    request: Request,
    session: Session,
    principal: Sharer,
) -> dict[str, Any]:
    return await _clear(request, session, principal, functionId, functionVersionId)
