"""Key administration (scope `admin`): create, list and revoke API keys."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from typing import Annotated, Any, ClassVar

from fastapi import APIRouter, Depends, Request, Response
from pydantic import Field

from service.auth import repository, scopes
from service.auth.deps import AuthenticatorDep, Session, require
from service.auth.models import ApiKey
from service.auth.service import MAX_KEY_LIFETIME, Principal, mint_key, revoke_key, within_reach
from service.core.deps import QuotasDep
from service.core.durations import DurationError, parse_timedelta
from service.core.errors import FieldError, Forbidden, ValidationFailed
from service.core.http import inline_body_doc, parse_uuid, read_json
from service.core.schemas import CamelModel, Timestamp
from service.core.validation import Check, RequestModel, never_null, parse

router = APIRouter(tags=["api-keys"])
Admin = Annotated[Principal, Depends(require(scopes.ADMIN))]
ACCOUNT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


def _account(value: Any) -> str | None:
    if isinstance(value, str) and ACCOUNT_RE.match(value):
        return None
    return "must be 1–128 letters, digits, '.', '_' or '-'"


def _scope_names(value: Any) -> str | None:
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        return "must be a list of scope names"
    return None if value else "at least one scope is required"


def _description(value: Any) -> str | None:
    if isinstance(value, str) and len(value) <= 256:
        return None
    return "must be a string of at most 256 characters"


def _lifetime(value: Any) -> timedelta:
    """`expiresIn` as a timedelta; DurationError or ValueError (with the message) if wrong."""
    duration = parse_timedelta(value)
    if not duration:  # `P0D` would otherwise read as "no expiry": a key that never expires
        raise ValueError("must be longer than zero")
    if duration > MAX_KEY_LIFETIME:
        raise ValueError(f"must be at most {MAX_KEY_LIFETIME.days} days ('P36600D')")
    return duration


def _expires_in(value: Any) -> str | None:
    try:
        _lifetime(value)
    except DurationError:
        return f"'{value}' is not an ISO-8601 duration such as 'P30D'"
    except ValueError as exc:
        return str(exc)
    return None


class ApiKeyCreate(RequestModel):
    """Body of `POST /api-keys`. Whether each scope may be granted is checked when the key is
    created (`create_api_key`, shared with the command line)."""

    null_when_missing: ClassVar[tuple[str, ...]] = ("scopes",)

    nca_id: Annotated[str | None, Check(_account, {"pattern": ACCOUNT_RE.pattern}, before=True)] = (
        Field(
            default=None,
            description="the caller's account when absent; another account needs admin:accounts",
            json_schema_extra=never_null,
        )
    )
    scopes: Annotated[list[str], Check(_scope_names, {"minItems": 1}, before=True)] = Field(
        examples=[["list_functions", "deploy_function"]]
    )
    description: Annotated[str, Check(_description, {"maxLength": 256}, before=True)] | None = None
    expires_in: Annotated[str, Check(_expires_in, before=True)] | None = Field(
        default=None, examples=["P30D"], description="ISO-8601 duration, at most 100 years"
    )

    def lifetime(self) -> timedelta | None:
        return _lifetime(self.expires_in) if self.expires_in is not None else None


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


@router.post(
    "/api-keys",
    response_model_exclude_none=True,
    openapi_extra=inline_body_doc(ApiKeyCreate),
    summary="Create an API key (shown once)",
)
async def create_key(
    request: Request, session: Session, principal: Admin, quotas: QuotasDep
) -> dict[str, Any]:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise ValidationFailed.of([FieldError("body", "must be a JSON object")])
    model, errors = parse(ApiKeyCreate, body)
    if errors or model is None:
        raise ValidationFailed.of(errors)
    account = model.nca_id if model.nca_id is not None else principal.account_id
    if account != principal.account_id and scopes.ADMIN_ACCOUNTS not in principal.scopes:
        # An account's admin administers that account only (issue: cross-account minting).
        raise Forbidden(
            detail=f"creating a key for another account requires the operator scope "
            f"'{scopes.ADMIN_ACCOUNTS}'"
        )
    key, row = await mint_key(
        session,
        quotas,
        account_id=account,
        scopes=model.scopes,
        expires_in=model.lifetime(),
        description=model.description,
        functions=principal.functions,  # a limited key makes limited keys
        not_after=principal.expires_at,  # that live no longer than it
    )
    return {"apiKey": KeyOut.of(row, key).model_dump(mode="json", by_alias=True, exclude_none=True)}


@router.get("/api-keys", summary="List the account's API keys (never the keys themselves)")
async def list_keys(session: Session, principal: Admin) -> dict[str, Any]:
    rows = await repository.keys_of(session, principal.account_id)
    return {
        "apiKeys": [
            KeyOut.of(r).model_dump(mode="json", by_alias=True, exclude_none=True)
            for r in rows
            if within_reach(principal, r.functions)
        ]
    }


@router.delete(
    "/api-keys/{keyId}", status_code=204, response_class=Response, summary="Revoke an API key"
)
async def delete_key(
    keyId: str, session: Session, principal: Admin, authenticator: AuthenticatorDep
) -> Response:
    kid = parse_uuid(keyId, "keyId")
    await revoke_key(session, authenticator, principal.account_id, principal, kid)
    return Response(status_code=204)
