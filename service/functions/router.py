"""HTTP routes of the function registry (api.md §2)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel

from service.auth import scopes
from service.auth.deps import Session, idempotency, require
from service.auth.limits import account_quota
from service.auth.repository import lock_account
from service.auth.service import Principal
from service.charts.deps import ChartPipelineDep
from service.charts.pipeline import ChartPipeline
from service.charts.target import not_permitted_message, permitted_clusters
from service.clusters.catalog import Catalog
from service.clusters.deps import CatalogDep
from service.core.crypto import SecretBox
from service.core.deps import SETTINGS, EventsDep, QuotasDep, SecretBoxDep, sessionmaker
from service.core.errors import FieldError, ValidationFailed
from service.core.events import Events
from service.core.http import inline_body_doc, json_body_doc, parse_uuid, parse_uuids, read_json
from service.core.idempotency import Recorder
from service.core.pagination import Limit, make_page
from service.core.quotas import Quotas
from service.functions import secrets, service, sharing, views
from service.functions.deps import (
    ActiveInstancesDep,
    VersionCacheDep,
    active_instances,
    version_cache,
)
from service.functions.read_cache import cached_list_read, cached_version_read
from service.functions.responses import FunctionEnvelope, FunctionIds, FunctionList, FunctionOut
from service.functions.validation import (
    FunctionSpec,
    UtilsImages,
    validate_create,
    validate_metadata_update,
)
from service.observability.references import reference_errors

router = APIRouter(tags=["functions"])
JSON = "application/json"

Registrar = Annotated[Principal, Depends(require(scopes.REGISTER_FUNCTION))]
LIST_CHECK = require(*scopes.LIST_SCOPES)
Lister = Annotated[Principal, Depends(LIST_CHECK)]
Updater = Annotated[Principal, Depends(require(scopes.UPDATE_FUNCTION))]
Deleter = Annotated[Principal, Depends(require(scopes.DELETE_FUNCTION))]
SecretsUpdater = Annotated[Principal, Depends(require(scopes.UPDATE_SECRETS))]
Idem = Annotated[Recorder, Depends(idempotency, scope="function")]
Visibility = Annotated[
    list[str] | None,
    Query(
        description="which functions: private (the caller's), authorized (shared with it), "
        "public; comma-separated or repeated, default all"
    ),
]


@dataclass(frozen=True)
class _Creating:
    """What creating a function or version uses besides the request's session."""

    catalog: Catalog
    pipeline: ChartPipeline
    quotas: Quotas
    box: SecretBox


async def _creating(
    catalog: CatalogDep, pipeline: ChartPipelineDep, quotas: QuotasDep, box: SecretBoxDep
) -> _Creating:
    return _Creating(catalog, pipeline, quotas, box)


Creating = Annotated[_Creating, Depends(_creating)]

_CREATE_DOC = json_body_doc("FunctionCreate")
_UPDATE_DOC = json_body_doc("FunctionMetadataUpdate")


def _dump(model: FunctionEnvelope) -> dict[str, Any]:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def _json(model: BaseModel | dict[str, Any]) -> Response:
    """Serialise once; FastAPI would otherwise re-validate the response model per request."""
    if isinstance(model, BaseModel):
        return Response(model.model_dump_json(by_alias=True, exclude_none=True), media_type=JSON)
    return Response(json.dumps(model, separators=(",", ":")), media_type=JSON)


def _check_policy_permitted(catalog: Catalog, spec: FunctionSpec) -> None:
    """A creation has no target cluster yet: its helmValidationPolicy must be permitted by
    some cluster of the catalog (the operator's decision), else a 400 naming them."""
    policy = spec.helm_validation_policy
    if not permitted_clusters(catalog, catalog.clusters, policy):
        message = not_permitted_message(catalog, catalog.clusters, policy)
        raise ValidationFailed.of([FieldError("helmValidationPolicy", message)])


def _utils_images(request: Request) -> UtilsImages:
    """Where a function's worker-utilities image may come from (the operator's settings)."""
    settings = SETTINGS.of(request)
    return UtilsImages(settings.worker_utils_image_registries, settings.worker_utils_image or None)


async def _create(
    request: Request,
    session: Session,
    principal: Principal,
    idem: Recorder,
    fid: str | None,
    components: _Creating,
) -> Response:
    function_id = parse_uuid(fid, "functionId") if fid is not None else None
    spec = validate_create(await read_json(request), utils_images=_utils_images(request))
    wrong = await reference_errors(session, principal.account_id, spec.telemetries)
    if wrong:
        raise ValidationFailed.of(wrong)
    chart_digest: str | None = None
    findings: list[dict[str, Any]] | None = None
    if spec.helm_chart is not None:
        _check_policy_permitted(components.catalog, spec)
        chart_digest, findings = await components.pipeline.validate_for_create(
            session, principal, spec
        )
    quotas = components.quotas
    account = principal.account_id
    new_function = function_id is None

    async def lock() -> None:
        await lock_account(session, account)

    if function_id is None:
        functions = await account_quota(session, quotas.functions, account)
        function_id = await service.add_function(session, account, below=functions.lock_free_below)
        if function_id is None:  # near the quota: count under the account's lock
            await functions.check(lambda: service.count_functions(session, account), lock)
            function_id = await service.add_function(session, account)
            assert function_id is not None
    else:
        await service.get_function(session, account, function_id)
        parent = function_id
        versions = await account_quota(session, quotas.versions_per_function, account)
        await versions.check(lambda: service.count_versions(session, parent), lock)
    version = await service.create_version(
        session,
        account_id=principal.account_id,
        spec=spec,
        box=components.box,
        function_id=function_id,
        new_function=new_function,
        chart_digest=chart_digest,
        findings=findings,
    )
    return _json(idem.record(_dump(FunctionEnvelope(function=FunctionOut.of(version)))))


@router.post(
    "/functions",
    response_model=FunctionEnvelope,
    response_model_exclude_none=True,
    openapi_extra=_CREATE_DOC,
    summary="Create a function (its first version)",
)
async def create_function(
    request: Request, session: Session, principal: Registrar, idem: Idem, components: Creating
) -> Response:
    return await _create(request, session, principal, idem, None, components)


@router.post(
    "/functions/{functionId}/versions",
    response_model=FunctionEnvelope,
    response_model_exclude_none=True,
    openapi_extra=_CREATE_DOC,
    summary="Create a new version of a function",
)
async def create_version(
    functionId: str,
    request: Request,
    session: Session,
    principal: Registrar,
    idem: Idem,
    components: Creating,
) -> Response:
    return await _create(request, session, principal, idem, functionId, components)


@router.get(
    "/functions",
    response_model=FunctionList,
    response_model_exclude_none=True,
    summary="List function versions",
)
async def list_functions(
    session: Session,
    principal: Lister,
    cache: VersionCacheDep,
    instances_of: ActiveInstancesDep,
    limit: Limit = None,
    cursor: str | None = None,
    name: str | None = None,
    status: str | None = None,
    tag: str | None = None,
    visibility: Visibility = None,
) -> Response:
    filters = service.ListFilters(
        name=name,
        status=service.parse_status_filter(status),
        tag=tag,
        visibility=sharing.parse_visibility(visibility),
    )
    page = make_page(limit, cursor)

    async def build() -> str:
        rows, next_cursor = await service.list_versions(
            session, principal.account_id, filters=filters, page=page, only=principal.functions
        )
        outs = await views.function_outs(session, instances_of, principal, rows)
        return views.list_body(outs, next_cursor)

    key = ("functions", limit, cursor, name, filters.status, tag, *sorted(filters.visibility))
    return await cached_list_read(cache, principal, key, build)


@router.get(
    "/functions/ids",
    response_model=FunctionIds,
    summary="List the ids of the functions the caller may see",
)
async def list_function_ids(
    session: Session, principal: Lister, visibility: Visibility = None
) -> Response:
    ids = await service.list_function_ids(
        session, principal.account_id, sharing.parse_visibility(visibility)
    )
    if principal.functions is not None:
        ids = [i for i in ids if i in principal.functions]
    return _json(FunctionIds(function_ids=ids))


@router.get(
    "/functions/{functionId}/versions",
    response_model=FunctionList,
    response_model_exclude_none=True,
    summary="List the versions of a function",
)
async def list_function_versions(
    functionId: str,
    session: Session,
    principal: Lister,
    cache: VersionCacheDep,
    instances_of: ActiveInstancesDep,
    limit: Limit = None,
    cursor: str | None = None,
) -> Response:
    fid = parse_uuid(functionId, "functionId")
    page = make_page(limit, cursor)

    async def build() -> str:
        await service.check_listable(session, principal.account_id, fid)
        rows, next_cursor = await service.list_versions(
            session,
            principal.account_id,
            filters=service.ListFilters(),
            page=page,
            function_id=fid,
        )
        return views.list_body(
            await views.function_outs(session, instances_of, principal, rows), next_cursor
        )

    return await cached_list_read(cache, principal, ("versions", fid, limit, cursor), build)


@router.get(
    "/functions/{functionId}/versions/{functionVersionId}",
    response_model=FunctionEnvelope,
    response_model_exclude_none=True,
    summary="Get one function version",
)
async def get_function_version(
    functionId: str,
    functionVersionId: str,
    request: Request,
    includeSecrets: Annotated[
        bool, Query(description="include the names of the version's secrets")
    ] = True,
) -> Response:
    # The hottest read (clients poll a version while it deploys): see read_cache.py. It takes
    # no request session (a miss uses a read-only one), and the scope check is a plain call
    # rather than a dependency (FastAPI's per-dependency cost was the largest share of a
    # cached read).
    principal = await LIST_CHECK(request)
    fid, vid = parse_uuids((functionId, "functionId"), (functionVersionId, "functionVersionId"))

    instances_of = active_instances(request)
    sessions = await sessionmaker(request)

    async def build() -> str:
        return await views.version_body(
            sessions, instances_of, principal, fid, vid, include_secrets=includeSecrets
        )

    return await cached_version_read(
        version_cache(request), principal, fid, vid, build, secrets=includeSecrets
    )


async def _update(
    request: Request,
    session: Session,
    principal: Principal,
    function_id: str,
    version_id: str,
    events: Events,
) -> Response:
    fid, vid = parse_uuids((function_id, "functionId"), (version_id, "functionVersionId"))
    update = validate_metadata_update(await read_json(request))
    version = await service.update_metadata(
        session, principal.account_id, fid, vid, update, events=events
    )
    return _json(FunctionEnvelope(function=FunctionOut.of(version)))


@router.put(
    "/functions/{functionId}/versions/{functionVersionId}",
    response_model=FunctionEnvelope,
    response_model_exclude_none=True,
    openapi_extra=_UPDATE_DOC,
    summary="Update a version's tags, description or rate limit",
)
async def update_function_version(
    functionId: str,
    functionVersionId: str,
    request: Request,
    session: Session,
    principal: Updater,
    events: EventsDep,
) -> Response:
    return await _update(request, session, principal, functionId, functionVersionId, events)


@router.put(
    "/metadata/functions/{functionId}/versions/{functionVersionId}",
    response_model=FunctionEnvelope,
    response_model_exclude_none=True,
    openapi_extra=_UPDATE_DOC,
    deprecated=True,
    summary="Update a version's metadata (deprecated alias)",
)
async def update_function_metadata(
    functionId: str,
    functionVersionId: str,
    request: Request,
    session: Session,
    principal: Updater,
    events: EventsDep,
) -> Response:
    return await _update(request, session, principal, functionId, functionVersionId, events)


@router.delete(
    "/functions/{functionId}/versions/{functionVersionId}",
    status_code=204,
    response_class=Response,
    summary="Delete a function version (and tear down its deployment)",
)
async def delete_function_version(
    functionId: str,
    functionVersionId: str,
    session: Session,
    principal: Deleter,
    events: EventsDep,
) -> Response:
    fid, vid = parse_uuids((functionId, "functionId"), (functionVersionId, "functionVersionId"))
    await service.delete_version(session, principal.account_id, fid, vid, events=events)
    return Response(status_code=204)


# NVCF's rate-limit controller (`/v2/nvcf/ratelimit/...`, scope update_function): its PUT is
# the version update by another path (deprecated there too) answering 204; its DELETE is the
# only way to remove a version's `rateLimit` (an update cannot unset it).
@router.put(
    "/ratelimit/functions/{functionId}/versions/{versionId}",
    status_code=204,
    response_class=Response,
    openapi_extra=_UPDATE_DOC,
    deprecated=True,
    summary="Update a version's rate limit (deprecated: PUT /v2/nvcf/functions/{functionId}/"
    "versions/{versionId})",
)
async def update_rate_limit(
    functionId: str,
    versionId: str,
    request: Request,
    session: Session,
    principal: Updater,
    events: EventsDep,
) -> Response:
    fid, vid = parse_uuids((functionId, "functionId"), (versionId, "versionId"))
    update = validate_metadata_update(await read_json(request))
    await service.update_metadata(session, principal.account_id, fid, vid, update, events=events)
    return Response(status_code=204)


@router.delete(
    "/ratelimit/functions/{functionId}/versions/{versionId}",
    status_code=204,
    response_class=Response,
    summary="Remove a version's rate limit (its invocations are no longer limited by it)",
)
async def delete_rate_limit(
    functionId: str,
    versionId: str,
    session: Session,
    principal: Updater,
    events: EventsDep,
) -> Response:
    fid, vid = parse_uuids((functionId, "functionId"), (versionId, "versionId"))
    await service.delete_rate_limit(session, principal.account_id, fid, vid, events=events)
    return Response(status_code=204)


@router.put(
    "/secrets/functions/{functionId}/versions/{functionVersionId}",
    status_code=204,
    response_class=Response,
    openapi_extra=inline_body_doc(secrets.SecretsUpdate),
    summary="Add or replace a version's secrets by name; running instances receive them in "
    "place (values are never returned)",
)
async def update_function_secrets(
    functionId: str,
    functionVersionId: str,
    request: Request,
    session: Session,
    principal: SecretsUpdater,
    box: SecretBoxDep,
    events: EventsDep,
) -> Response:
    fid, vid = parse_uuids((functionId, "functionId"), (functionVersionId, "functionVersionId"))
    update = secrets.validate_update(await read_json(request))
    version = await service.get_version(session, principal.account_id, fid, vid)
    await secrets.update_secrets(session, version, update, box=box, events=events)
    return Response(status_code=204)
