"""HTTP routes: NVCF's asset routes (`/v2/nvcf/assets`, the `invoke_function` scope), and
the local store's signed URLs (`/storage/...`, no API key: the signature is the credential).

`DELETE` answers 204 with an empty body, as NVCF does.

A download is never rendered on this server's origin, whatever type its owner declared: an
`text/html` or `image/svg+xml` asset opened in the console's tab would otherwise run its
script there (docs/security.md, "Asset downloads").
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from starlette.responses import FileResponse

from service.assets.deps import assets_of
from service.assets.models import Asset
from service.assets.schemas import (
    AssetRedirectResponse,
    AssetResponse,
    CreateAssetRequest,
    CreateAssetResponse,
    ListAssetsResponse,
)
from service.assets.service import Assets, describe, validate_create
from service.assets.signing import STORAGE_PREFIX, Grant
from service.assets.storage import KEY_RE, LocalStore
from service.auth import scopes
from service.auth.deps import Session, idempotency, require
from service.auth.service import Principal
from service.core.errors import Forbidden, NotFound
from service.core.http import inline_body_doc, parse_uuid, read_json
from service.core.idempotency import Recorder

router = APIRouter(tags=["assets"])
storage_router = APIRouter(include_in_schema=False)

#: NVCF's `invoke_function`: an API key's, or an invocation token (a browser that uploads an
#: asset and invokes with one token)
Invoker = Annotated[Principal, Depends(require(scopes.INVOKE_FUNCTION, invocation=True))]
Idem = Annotated[Recorder, Depends(idempotency, scope="function")]
_ID = "assetId"


def _assets(request: Request) -> Assets:
    assets = assets_of(request)
    if assets is None:  # only `nvcf-server invoke` runs without them, and not these routes
        raise NotFound(detail="assets are not served by this process")
    return assets


def _base(request: Request) -> str:
    return str(request.base_url)


@router.post(
    "/assets",
    response_model=CreateAssetResponse,
    openapi_extra=inline_body_doc(CreateAssetRequest),
    summary="Create an asset: its id and a pre-signed URL to upload its file to",
)
async def create_asset(
    request: Request, session: Session, principal: Invoker, idem: Idem
) -> dict[str, Any]:
    spec = validate_create(await read_json(request))
    made = await _assets(request).create(session, principal.account_id, spec, _base(request))
    answer = CreateAssetResponse(
        asset_id=made.asset.id,
        upload_url=made.upload_url,
        content_type=made.asset.content_type,
        description=made.asset.description,
    )
    # a retried create (same Idempotency-Key) gets the same asset and upload URL
    return idem.record(answer.model_dump(mode="json", by_alias=True))


@router.get("/assets", response_model=ListAssetsResponse, summary="List the account's assets")
async def list_assets(request: Request, session: Session, principal: Invoker) -> ListAssetsResponse:
    rows = await _assets(request).list_live(session, principal.account_id)
    return ListAssetsResponse(assets=[describe(a) for a in rows])


@router.get(
    "/assets/{assetId}",
    response_model=AssetResponse,
    summary="Show an uploaded asset's details (404 until its file is uploaded, as NVCF)",
)
async def get_asset(
    assetId: str, request: Request, session: Session, principal: Invoker
) -> AssetResponse:
    asset: Asset = await _assets(request).uploaded(
        session, principal.account_id, parse_uuid(assetId, _ID)
    )
    return AssetResponse(asset=describe(asset))


@router.get(
    "/assets/{assetId}/content-redirect",
    response_model=AssetRedirectResponse,
    summary="A pre-signed URL to download an uploaded asset",
)
async def get_asset_redirect(
    assetId: str, request: Request, session: Session, principal: Invoker
) -> AssetRedirectResponse:
    url = await _assets(request).download_url(
        session, principal.account_id, parse_uuid(assetId, _ID), _base(request)
    )
    return AssetRedirectResponse(presigned_url=url)


@router.delete(
    "/assets/{assetId}",
    status_code=204,
    response_class=Response,
    summary="Delete an uploaded asset (404 until its file is uploaded, as NVCF)",
)
async def delete_asset(
    assetId: str, request: Request, session: Session, principal: Invoker
) -> Response:
    await _assets(request).delete(session, principal.account_id, parse_uuid(assetId, _ID))
    return Response(status_code=204)


# --------------------------------------------------------------------------- local store


def _local(request: Request, kind: str, object_id: str) -> tuple[LocalStore, str]:
    assets = assets_of(request)
    key = f"{kind}/{object_id}"
    if assets is None or not isinstance(assets.store, LocalStore) or not KEY_RE.match(key):
        raise NotFound(detail=f"no object {request.url.path}")
    return assets.store, key


def _check(store: LocalStore, grant: Grant, signature: str) -> None:
    if not store.signer.verify(grant, signature):
        raise Forbidden(detail="the URL's signature does not match: use the URL as it was given")
    if grant.expires < time.time():
        raise Forbidden(detail="the signed URL has expired: ask for a new one")


#: sent with every download: saved, never rendered (nor sniffed into something renderable); if a
#: browser renders it anyway, in a sandbox of an opaque origin with no script
DOWNLOAD_HEADERS = {
    "Content-Disposition": "attachment",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "sandbox",
}

Expires = Annotated[int, Query(ge=0, le=2**40)]
Signature = Annotated[str, Query(min_length=64, max_length=64)]


@storage_router.put(STORAGE_PREFIX + "/{kind}/{object_id}", status_code=200)
async def upload_object(
    kind: str,
    object_id: str,
    request: Request,
    expires: Expires,
    signature: Signature,
    max_bytes: Annotated[int, Query(alias="maxBytes", ge=0, le=2**62)],
) -> Response:
    store, key = _local(request, kind, object_id)
    _check(store, Grant("PUT", key, expires, max_bytes=max_bytes), signature)
    await store.receive(key, request.stream(), max_bytes)
    return Response(status_code=200)


@storage_router.api_route(STORAGE_PREFIX + "/{kind}/{object_id}", methods=["GET", "HEAD"])
async def download_object(
    kind: str,
    object_id: str,
    request: Request,
    expires: Expires,
    signature: Signature,
    content_type: Annotated[str, Query(alias="contentType", max_length=255)],
) -> Response:
    store, key = _local(request, kind, object_id)
    _check(store, Grant("GET", key, expires, content_type=content_type), signature)
    if await store.size(key) is None:
        raise NotFound(detail="the object has not been uploaded")
    return FileResponse(store.path(key), media_type=content_type, headers=DOWNLOAD_HEADERS)


__all__ = ["router", "storage_router"]
