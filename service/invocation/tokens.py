"""HTTP routes issuing invocation tokens, as NVCF's `InvocationAssertionTokenController` does
(scope `invoke_function`): `POST /tokens/functions/{functionId}[/versions/{versionId}]` with
`{clientId}`, and `POST /tokens/functions` with `{functions: [{functionId,
functionVersionId?}] (0 to 4: none, a token for the account's assets alone), clientId}`. The
answer is OAuth2's `{access_token, expires_in}`. Each issue counts against the caller's
account's API rate limit (429, as NVCF's `verifyLimits`).

The caller must itself be allowed to invoke every function (and version) it names — its own,
or one shared with its account (access.py) — when it asks: else the 404 of an unknown
function, and nothing is issued. The token never outlives the caller's API key or token (its
lifetime is cut to the credential's expiry). It (auth/tokens.py) then invokes exactly those
through every invocation entry, uses the account's assets, and may ask for a token for (some
of) its own functions, as NVCF's take `invoke_function` there. It is never logged.
"""

from __future__ import annotations

import math
import uuid
from typing import Annotated, Any, ClassVar

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from service.auth import scopes
from service.auth.deps import AuthenticatorDep, Session, require
from service.auth.service import Authenticator, Principal
from service.auth.tokens import MAX_CLIENT_ID, MAX_FUNCTIONS, InvocationGrant
from service.core.db import utcnow
from service.core.errors import (
    FieldError,
    NotFound,
    ServiceUnavailable,
    Unauthorized,
    ValidationFailed,
)
from service.core.http import inline_body_doc, read_json, require_json_object
from service.core.validation import Check, MaxItems, RequestModel, parse
from service.invocation.access import visible_versions

router = APIRouter(tags=["invocation tokens"])

#: an API key's `invoke_function`, or an invocation token (as NVCF): a token asks only for
#: what it may invoke itself, and never outlives itself
Invoker = Annotated[Principal, Depends(require(scopes.INVOKE_FUNCTION, invocation=True))]


def _client_id(value: str) -> str | None:
    if not value.strip():
        return "must not be blank"
    if not value.isprintable():
        return "must not hold control characters"
    return None


ClientId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_CLIENT_ID,
        description="Who will use the token (the token's subject; the worker's NVCF-SUB)",
    ),
    Check(_client_id),
]


class InvocationTokenRequest(RequestModel):
    """Body of `POST /tokens/functions/{functionId}[/versions/{functionVersionId}]`."""

    client_id: ClientId


class TokenFunction(RequestModel):
    """A function the token may invoke: every version, or the one named."""

    shape: ClassVar[str] = "with functionId"
    function_id: uuid.UUID
    function_version_id: uuid.UUID | None = None


def _functions_list(value: Any) -> str | None:
    if value is None:
        return "is required: a list of up to 4 {functionId, functionVersionId?}"
    if not isinstance(value, list):
        return "must be a list of {functionId, functionVersionId?}"
    return None


class MultiFunctionsInvocationTokenRequest(RequestModel):
    """Body of `POST /tokens/functions`."""

    null_when_missing: ClassVar[tuple[str, ...]] = ("functions",)

    functions: Annotated[
        list[TokenFunction],
        Check(_functions_list, before=True),
        MaxItems(MAX_FUNCTIONS),
    ]
    client_id: ClientId


class InvocationTokenResponse(BaseModel):
    """OAuth2's access token answer."""

    access_token: str = Field(description="The token: send it as `Authorization: Bearer`")
    expires_in: int = Field(description="Seconds until it expires")


_ONE_DOC = inline_body_doc(InvocationTokenRequest)
_MANY_DOC = inline_body_doc(MultiFunctionsInvocationTokenRequest)
_RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {
        "description": "A named function (or version) is not one the caller may invoke",
        "content": {
            "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
        },
    },
}


async def _body(request: Request, errors: list[FieldError]) -> dict[str, Any]:
    try:
        return require_json_object(await read_json(request))
    except ValidationFailed as exc:
        raise ValidationFailed.of([*errors, *exc.errors]) from None


def _path_ids(*pairs: tuple[str, str]) -> tuple[list[uuid.UUID], list[FieldError]]:
    ids: list[uuid.UUID] = []
    errors: list[FieldError] = []
    for value, name in pairs:
        try:
            ids.append(uuid.UUID(value))
        except ValueError:
            errors.append(FieldError(name, f"'{value}' is not a UUID"))
    return ids, errors


async def _issue(
    auth: Authenticator,
    session: Session,
    principal: Principal,
    client_id: str,
    pairs: list[tuple[uuid.UUID, uuid.UUID | None]],
) -> InvocationTokenResponse:
    missing: list[str] = []
    for function_id, version_id in dict.fromkeys(pairs):
        if not await visible_versions(session, principal, function_id, version_id):
            missing.append(
                f"function {function_id}"
                + (f" version {version_id}" if version_id is not None else "")
            )
    if missing:
        raise NotFound(detail=f"{'; '.join(missing)}: not found")
    tokens = auth.invocation_tokens
    if tokens is None:
        raise ServiceUnavailable(detail="invocation tokens cannot be issued yet; retry")
    lifetime = tokens.lifetime
    if principal.expires_at is not None:
        # a token never outlives the key that asked for it
        left = math.floor((principal.expires_at - utcnow()).total_seconds())
        if left < 1:
            raise Unauthorized(detail="API key has expired", headers={"WWW-Authenticate": "Bearer"})
        lifetime = min(lifetime, left)
    token = tokens.issue(principal.account_id, client_id, InvocationGrant.of(pairs), lifetime)
    return InvocationTokenResponse(access_token=token, expires_in=lifetime)


@router.post(
    "/tokens/functions/{functionId}",
    response_model=InvocationTokenResponse,
    responses=_RESPONSES,
    openapi_extra=_ONE_DOC,
    summary="Issue a token that may invoke every version of this function, and nothing else",
)
async def token_for_function(
    functionId: str,
    request: Request,
    session: Session,
    principal: Invoker,
    auth: AuthenticatorDep,
) -> InvocationTokenResponse:
    ids, errors = _path_ids((functionId, "functionId"))
    model, body_errors = parse(InvocationTokenRequest, await _body(request, errors))
    if errors or body_errors or model is None:
        raise ValidationFailed.of([*errors, *body_errors])
    return await _issue(auth, session, principal, model.client_id, [(ids[0], None)])


@router.post(
    "/tokens/functions/{functionId}/versions/{functionVersionId}",
    response_model=InvocationTokenResponse,
    responses=_RESPONSES,
    openapi_extra=_ONE_DOC,
    summary="Issue a token that may invoke this version of a function, and nothing else",
)
async def token_for_version(
    functionId: str,
    functionVersionId: str,
    request: Request,
    session: Session,
    principal: Invoker,
    auth: AuthenticatorDep,
) -> InvocationTokenResponse:
    ids, errors = _path_ids((functionId, "functionId"), (functionVersionId, "functionVersionId"))
    model, body_errors = parse(InvocationTokenRequest, await _body(request, errors))
    if errors or body_errors or model is None:
        raise ValidationFailed.of([*errors, *body_errors])
    return await _issue(auth, session, principal, model.client_id, [(ids[0], ids[1])])


@router.post(
    "/tokens/functions",
    response_model=InvocationTokenResponse,
    responses=_RESPONSES,
    openapi_extra=_MANY_DOC,
    summary="Issue a token that may invoke up to 4 functions (all their versions, or one each); "
    "none: a token for the account's assets",
)
async def token_for_functions(
    request: Request, session: Session, principal: Invoker, auth: AuthenticatorDep
) -> InvocationTokenResponse:
    model, errors = parse(MultiFunctionsInvocationTokenRequest, await _body(request, []))
    if errors or model is None:
        raise ValidationFailed.of(errors)
    pairs = [(f.function_id, f.function_version_id) for f in model.functions]
    return await _issue(auth, session, principal, model.client_id, pairs)
