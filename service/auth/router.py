"""Key administration (scope `admin`): create, list and revoke API keys."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from pydantic import Field
from sqlalchemy import select

from service.auth import scopes
from service.auth.deps import Session, require
from service.auth.models import ApiKey
from service.auth.service import Principal, count_api_keys, create_api_key, lock_account
from service.core.durations import DurationError, parse_timedelta
from service.core.errors import FieldError, Forbidden, NotFound, ValidationFailed
from service.core.http import inline_body_doc, parse_uuid, read_json
from service.core.schemas import CamelModel, Timestamp
from service.state import app_state

router = APIRouter(tags=["api-keys"])
Admin = Annotated[Principal, Depends(require(scopes.ADMIN))]
ACCOUNT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


class ApiKeyCreate(CamelModel):
    """Body of `POST /api-keys` (documentation: the route reads and checks the JSON itself)."""

    nca_id: str | None = Field(
        default=None,
        pattern=ACCOUNT_RE.pattern,
        description="the caller's account when absent; another account needs admin:accounts",
    )
    scopes: list[str] = Field(min_length=1, examples=[["list_functions", "deploy_function"]])
    description: str | None = Field(default=None, max_length=256)
    expires_in: str | None = Field(
        default=None, examples=["P30D"], description="ISO-8601 duration, at most 100 years"
    )


class KeyOut(CamelModel):
    id: uuid.UUID
    nca_id: str
    hint: str
    scopes: list[str]
    description: str | None = None
    expires_at: Timestamp | None = None
    created_at: Timestamp
    key: str | None = None  # only in the creation response

    @classmethod
    def of(cls, row: ApiKey, key: str | None = None) -> KeyOut:
        return cls(
            id=row.id,
            nca_id=row.account_id,
            hint=row.hint,
            scopes=list(row.scopes),
            description=row.description,
            expires_at=row.expires_at,
            created_at=row.created_at,
            key=key,
        )


#: the longest lifetime a key may be given (a key's expiry must be a date: `now + expiresIn`
#: overflows for durations the parser accepts, up to 999,999,999 days)
MAX_KEY_LIFETIME = timedelta(days=100 * 366)


def _parse_duration(value: Any) -> timedelta | None:
    if value is None:
        return None
    try:
        duration = parse_timedelta(value)
    except DurationError:
        raise ValidationFailed.of(
            [FieldError("expiresIn", f"'{value}' is not an ISO-8601 duration such as 'P30D'")]
        ) from None
    if not duration:  # `P0D` would otherwise read as "no expiry": a key that never expires
        raise ValidationFailed.of([FieldError("expiresIn", "must be longer than zero")])
    if duration > MAX_KEY_LIFETIME:
        raise ValidationFailed.of(
            [FieldError("expiresIn", f"must be at most {MAX_KEY_LIFETIME.days} days ('P36600D')")]
        )
    return duration


@router.post(
    "/api-keys",
    response_model_exclude_none=True,
    openapi_extra=inline_body_doc(ApiKeyCreate),
    summary="Create an API key (shown once)",
)
async def create_key(request: Request, session: Session, principal: Admin) -> dict[str, Any]:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise ValidationFailed.of([FieldError("body", "must be a JSON object")])
    errors: list[FieldError] = []
    account = body.get("ncaId", principal.account_id)
    if not isinstance(account, str) or not ACCOUNT_RE.match(account):
        errors.append(FieldError("ncaId", "must be 1–128 letters, digits, '.', '_' or '-'"))
    raw_scopes = body.get("scopes")
    if not isinstance(raw_scopes, list) or not all(isinstance(s, str) for s in raw_scopes):
        errors.append(FieldError("scopes", "must be a list of scope names"))
    description = body.get("description")
    if description is not None and (not isinstance(description, str) or len(description) > 256):
        errors.append(FieldError("description", "must be a string of at most 256 characters"))
    try:
        expires_in = _parse_duration(body.get("expiresIn"))
    except ValidationFailed as exc:
        errors.extend(exc.errors)
        expires_in = None
    if errors:
        raise ValidationFailed.of(errors)
    if account != principal.account_id and scopes.ADMIN_ACCOUNTS not in principal.scopes:
        # An account's admin administers that account only (issue: cross-account minting).
        raise Forbidden(
            detail=f"creating a key for another account requires the operator scope "
            f"'{scopes.ADMIN_ACCOUNTS}'"
        )
    await lock_account(session, account)
    app_state(request).quotas.api_keys.enforce(await count_api_keys(session, account))
    key, row = await create_api_key(
        session,
        account_id=account,
        scopes=[str(s) for s in raw_scopes or []],
        expires_in=expires_in,
        description=description,
    )
    return {"apiKey": KeyOut.of(row, key).model_dump(mode="json", by_alias=True, exclude_none=True)}


@router.get("/api-keys", summary="List the account's API keys (never the keys themselves)")
async def list_keys(session: Session, principal: Admin) -> dict[str, Any]:
    rows = (
        (
            await session.execute(
                select(ApiKey)
                .where(ApiKey.account_id == principal.account_id)
                .order_by(ApiKey.created_at)
            )
        )
        .scalars()
        .all()
    )
    return {
        "apiKeys": [
            KeyOut.of(r).model_dump(mode="json", by_alias=True, exclude_none=True) for r in rows
        ]
    }


@router.delete(
    "/api-keys/{keyId}", status_code=204, response_class=Response, summary="Revoke an API key"
)
async def delete_key(keyId: str, request: Request, session: Session, principal: Admin) -> Response:
    kid = parse_uuid(keyId, "keyId")
    row = await session.get(ApiKey, kid)
    if row is None or row.account_id != principal.account_id:
        raise NotFound(detail=f"API key {kid} not found")
    await session.delete(row)
    request.app.state.authenticator.forget(row.key_hash)
    return Response(status_code=204)
