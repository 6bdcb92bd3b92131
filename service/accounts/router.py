"""NVCF's account routes (`/v2/nvcf/accounts`, scope `account_setup`, which only the operator's
credentials hold), and the suspension this platform adds."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Request, Response
from pydantic import Field, StrictFloat, StrictInt, StrictStr

from service.accounts import service
from service.auth import scopes
from service.auth.deps import AuthenticatorDep, Session, require
from service.auth.limits import INT32_MAX, LIMITS, MAX_RATE_PER_SECOND, RATES
from service.auth.router import ACCOUNT_RE
from service.auth.service import MAX_ACCOUNT_ID, Principal
from service.auth.suspensions import Suspensions
from service.core.deps import SettingsDep
from service.core.errors import FieldError, ServiceUnavailable, ValidationFailed
from service.core.http import inline_body_doc, read_json
from service.core.token_rates import MAX_TOKEN_RATE, token_rate_error
from service.core.validation import Check, RequestModel, parse

router = APIRouter(tags=["accounts"])
M = TypeVar("M", bound=RequestModel)
Operator = Annotated[Principal, Depends(require(scopes.ACCOUNT_SETUP))]

Name = Annotated[StrictStr, Field(max_length=256)]


def _limit(name: str) -> Any:
    return Field(default=None, ge=0, le=LIMITS[name].maximum)


#: an account's LLM token limit ("" for none, whatever the setting says)
TokenLimit = Annotated[
    StrictStr,
    Field(max_length=MAX_TOKEN_RATE),
    Check(token_rate_error, {"examples": ["100000-M,50000000-MO"]}),
]
RATE_DOC = (
    "{what} tokens per account, every model together: '<count>-<unit>' items, unit S, M, H, "
    "D, W or MO (30 days), no unit twice; empty: none (NVIDIA's {name})"
)


class AccountUpdate(RequestModel):
    """Body of `PATCH /accounts/{ncaId}`: only the limits named change."""

    name: Name | None = None
    max_functions_allowed: StrictInt | None = _limit("maxFunctionsAllowed")
    max_tasks_allowed: StrictInt | None = _limit("maxTasksAllowed")
    max_telemetries_allowed: StrictInt | None = _limit("maxTelemetriesAllowed")
    max_registry_credentials_allowed: StrictInt | None = _limit("maxRegistryCredentialsAllowed")
    max_versions_per_function_allowed: StrictInt | None = _limit("maxVersionsPerFunctionAllowed")
    max_instances_allowed: StrictInt | None = _limit("maxInstancesAllowed")
    max_api_keys_allowed: StrictInt | None = _limit("maxApiKeysAllowed")
    max_assets_allowed: StrictInt | None = _limit("maxAssetsAllowed")
    max_asset_bytes_allowed: StrictInt | None = _limit("maxAssetBytesAllowed")
    max_tasks_running_allowed: StrictInt | None = _limit("maxTasksRunningAllowed")
    rate_limit_per_second: Annotated[StrictFloat, Field(ge=0, le=MAX_RATE_PER_SECOND)] | None = (
        Field(default=None, description="API requests per second on average (0: no limit)")
    )
    rate_limit_burst: Annotated[StrictInt, Field(ge=1, le=INT32_MAX)] | None = Field(
        default=None, description="API requests at once"
    )
    account_input_token_rate_limit: TokenLimit | None = Field(
        default=None,
        description=RATE_DOC.format(what="Input", name="accountInputTokenRateLimit"),
    )
    account_output_token_rate_limit: TokenLimit | None = Field(
        default=None,
        description=RATE_DOC.format(what="Output", name="accountOutputTokenRateLimit"),
    )

    def limits(self) -> dict[str, Any]:
        named = self.model_dump(by_alias=True, exclude_none=True)
        out: dict[str, Any] = {k: int(v) for k, v in named.items() if k in LIMITS}
        out.update({k: v for k, v in named.items() if k in RATES})
        return out


class AccountCreate(AccountUpdate):
    """Body of `POST /accounts/{ncaId}` (nvcf-cli's `CreateAccountRequest`)."""

    admin_client_id: Annotated[StrictStr, Field(max_length=256)] | None = None
    registry_credentials: list[Any] | None = Field(
        default=None, description="not taken here: add them with the registry-credential routes"
    )


class Suspension(RequestModel):
    reason: Annotated[StrictStr, Field(min_length=1, max_length=1024)]


def _nca_id(value: str) -> str:
    if not value or len(value) > MAX_ACCOUNT_ID:
        raise ValidationFailed.of(
            [FieldError("ncaId", f"must be 1 to {MAX_ACCOUNT_ID} characters")]
        )
    return value


async def _body(request: Request, model: type[M]) -> M:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise ValidationFailed.of([FieldError("body", "must be a JSON object")])
    parsed, errors = parse(model, body)
    if errors or parsed is None:
        raise ValidationFailed.of(errors)
    return parsed


def _suspensions(authenticator: AuthenticatorDep) -> Suspensions:
    if authenticator.suspensions is None:
        raise ServiceUnavailable(detail="the database is not open yet")
    return authenticator.suspensions


SuspensionsDep = Annotated[Suspensions, Depends(_suspensions)]
OWNS_LIVE_OBJECTS: dict[str, Any] = {
    "description": "The account owns functions or registry credentials: suspend it instead",
    "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
}


@router.get("/accounts", summary="List the accounts (NVCF's `cloudAccounts`)")
async def list_accounts(session: Session, _: Operator, settings: SettingsDep) -> dict[str, Any]:
    rows = await service.all_accounts(session)
    return {"cloudAccounts": [service.dto(r, settings) for r in rows]}


@router.get("/accounts/{ncaId}", summary="An account and its limits")
async def get_account(
    ncaId: str, session: Session, _: Operator, settings: SettingsDep
) -> dict[str, Any]:
    row = await service.get(session, _nca_id(ncaId))
    return {"account": service.dto(row, settings)}


@router.post(
    "/accounts/{ncaId}",
    openapi_extra=inline_body_doc(AccountCreate),
    summary="Create an account (limits not named are the settings')",
)
async def create_account(
    ncaId: str,
    request: Request,
    session: Session,
    _: Operator,
    settings: SettingsDep,
    suspensions: SuspensionsDep,
) -> dict[str, Any]:
    account_id = _nca_id(ncaId)
    if not ACCOUNT_RE.match(account_id):
        raise ValidationFailed.of(
            [FieldError("ncaId", "must be 1–128 letters, digits, '.', '_' or '-'")]
        )
    model = await _body(request, AccountCreate)
    if model.registry_credentials:
        raise ValidationFailed.of(
            [
                FieldError(
                    "registryCredentials",
                    "not taken at creation: add them with POST /v2/nvcf/registry-credentials",
                )
            ]
        )
    row = await service.create(
        session,
        suspensions,
        account_id,
        name=model.name,
        admin_client_id=model.admin_client_id,
        limits=model.limits(),
    )
    return {"account": service.dto(row, settings)}


@router.patch(
    "/accounts/{ncaId}",
    openapi_extra=inline_body_doc(AccountUpdate),
    summary="Change any subset of an account's limits",
)
async def update_account(
    ncaId: str,
    request: Request,
    session: Session,
    _: Operator,
    settings: SettingsDep,
    suspensions: SuspensionsDep,
) -> dict[str, Any]:
    account_id = _nca_id(ncaId)
    model = await _body(request, AccountUpdate)
    row = await service.update(
        session, suspensions, account_id, name=model.name, limits=model.limits()
    )
    return {"account": service.dto(row, settings)}


@router.delete(
    "/accounts/{ncaId}",
    status_code=204,
    response_class=Response,
    summary="Delete an account owning nothing live (else suspend it)",
    responses={409: OWNS_LIVE_OBJECTS},
)
async def delete_account(
    ncaId: str, session: Session, _: Operator, suspensions: SuspensionsDep
) -> Response:
    await service.delete(session, suspensions, _nca_id(ncaId))
    return Response(status_code=204)


@router.put(
    "/accounts/{ncaId}/suspension",
    openapi_extra=inline_body_doc(Suspension),
    summary="Suspend an account: its keys and tokens are refused, its deployments at zero",
)
async def suspend_account(
    ncaId: str,
    request: Request,
    session: Session,
    principal: Operator,
    settings: SettingsDep,
    suspensions: SuspensionsDep,
) -> dict[str, Any]:
    account_id = _nca_id(ncaId)
    model = await _body(request, Suspension)
    row = await service.suspend(
        session, suspensions, account_id, principal.account_id, model.reason
    )
    return {"account": service.dto(row, settings)}


@router.delete("/accounts/{ncaId}/suspension", summary="Resume a suspended account")
async def resume_account(
    ncaId: str,
    session: Session,
    _: Operator,
    settings: SettingsDep,
    suspensions: SuspensionsDep,
) -> dict[str, Any]:
    row = await service.resume(session, suspensions, _nca_id(ncaId))
    return {"account": service.dto(row, settings)}
