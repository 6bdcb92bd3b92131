"""NVCF's API-keys service routes, as nvcf-cli calls them (`init` and `api-key`; NVIDIA/nvcf
`src/clis/nvcf-cli/USAGE-GUIDE.md` "API Keys Service Endpoints", `internal/apikeys`):

- `POST /v1/admin/keys` — a management token for the caller's account (scope `admin`): an
  `nvapi-` key with the function-management scopes and `admin`, valid 12 hours. Without
  credentials it is granted only to a client address in `NVCF_ADMIN_TOKEN_NETWORKS` (NVCF's
  admin-issuer proxy: a route reachable from inside the cluster), for the default account.
- `POST /v1/keys` — a key from `authorizations.policies[{resources, scopes}]` and `expires_at`
  (scope `admin`); `resources: [{id: <functionId>, type: account-functions}]` limits the key to
  those functions on every route (service/auth/restrict.py); `id: "*"` does not. A limited
  key administers only keys limited to some of its functions (the others are absent from its
  lists and a 404 to revoke) and never carries `manage_registry_credentials` nor
  `manage_telemetries` (account-wide).
- `GET /v1/keys` — the account's keys (`{"keys": [...]}`), never their values; and
  `GET /v1/keys/{id}` one of them. Each as NVCF's `KeyResponseBuilder` writes it: `value` is
  the key's masked suffix (`nvapi-**********` and its last 3 characters), with `owner_type`,
  `owner_id`, `issuer_service_id` and `audience_service_ids` (from nvcf-cli's `Key-Owner-Id`
  and `Key-Issuer-Id` headers and the body's `audience_service_ids` at creation). List items
  keep their `authorizations` too (NVCF's leave them out) so that a list shows what each key
  reaches; a key narrowed at creation (a limited key minting one with `id: "*"`) shows its
  effective limit, the functions it works on, never the `*` it asked for.
- `PUT /v1/keys/{id}/authorizations` — replace an active key's policies (`{"authorizations":
  {"policies": [...]}}`, checked as on creation): its scopes and functions change at once.
- `DELETE /v1/keys/{id}` — revoke one (404 for an unknown id, as nvcf-cli expects). nvcf-cli
  sends no credential here (only its `Key-Issuer-*`/`Key-Owner-Id` headers): without one, a
  key of the default account is revoked only for a client address in
  `NVCF_ADMIN_TOKEN_NETWORKS` — the same opt-in that already gives such a client a management
  token (which may revoke the account's keys), so it grants nothing more — and never a key
  carrying the operator scope; anywhere else a request without a credential is refused (401).
  Neither credential-less path is open to a request carrying a proxy header (`Forwarded`,
  `X-Forwarded-For`, ...): behind a proxy every caller has the proxy's internal address.

A key minted by a key (a management token, or a key from `POST /v1/keys`) never outlives the
minting key: its expiry is cut to the minter's. The operator scope can never be granted
here. Several policies grant the union of their scopes and functions (a key here carries one
scope set).
"""

from __future__ import annotations

import ipaddress
import uuid
from collections.abc import Collection
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response

from service.auth import policies, repository, scopes
from service.auth.deps import AuthenticatorDep, FunctionReachDep, Session, require
from service.auth.policies import ISSUER, MANAGEMENT_LIFETIME, MANAGEMENT_SCOPES, key_view
from service.auth.service import (
    ACCOUNT_WIDE_SCOPES,
    Principal,
    key_in_reach,
    mint_key,
    replace_grant,
    revoke_key,
    within_reach,
)
from service.core.deps import QuotasDep, SettingsDep
from service.core.errors import NotFound, Unauthorized
from service.core.http import read_json

router = APIRouter(tags=["api-keys"])
#: the caller holding `admin` (the one caller check: a dependency, or called where a request
#: without a credential may be let in first)
admin = require(scopes.ADMIN)
Admin = Annotated[Principal, Depends(admin)]


#: headers a reverse proxy adds: their presence means the client address is the proxy's
PROXY_HEADERS = (
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-real-ip",
    "x-client-ip",
    "true-client-ip",
    "cf-connecting-ip",
)


def _trusted(request: Request, networks: Collection[str]) -> bool:
    client = request.client.host if request.client is not None else ""
    try:
        address = ipaddress.ip_address(client)
    except ValueError:
        return False
    return any(address in ipaddress.ip_network(n, strict=False) for n in networks)


def _credential_less(request: Request, what: str, networks: Collection[str]) -> bool:
    """Whether a request without a credential may `what` as the default account's admin: only
    from an address in NVCF_ADMIN_TOKEN_NETWORKS, and never through a reverse proxy (behind
    one, every caller has the proxy's internal address). A request with a credential: False."""
    if request.headers.get("authorization"):
        return False
    if not _trusted(request, networks):
        return False
    proxied = [h for h in PROXY_HEADERS if h in request.headers]
    if proxied:
        raise Unauthorized(
            detail=f"{what} needs a credential with scope 'admin': this request came through a "
            f"proxy ({', '.join(proxied)}), so its address says nothing about the caller and "
            "NVCF_ADMIN_TOKEN_NETWORKS does not apply"
        )
    return True


def _key_id(value: str, shown: str) -> uuid.UUID:
    """The path's key id; not one: 404 (NVCF: "Key not found")."""
    try:
        return uuid.UUID(value)
    except ValueError:
        raise NotFound(detail=f"API key {shown} not found") from None


@router.post(
    "/v1/admin/keys",
    summary="A management token for the caller's account (NVCF's API-keys service)",
    description="An `nvapi-` key with the function-management scopes and `admin`, valid 12 "
    "hours, in NVCF's shape (`value` is the token). Needs the `admin` scope, or no credential "
    "from an address in NVCF_ADMIN_TOKEN_NETWORKS and no proxy header such as X-Forwarded-For "
    "(then for the default account). A limited key's token is as limited, without "
    "manage_registry_credentials and manage_telemetries; a key's token expires no later than "
    "the key.",
)
async def admin_token(
    request: Request, session: Session, settings: SettingsDep, quotas: QuotasDep
) -> dict[str, Any]:
    limited: frozenset[uuid.UUID] | None = None
    not_after: datetime | None = None
    if not _credential_less(request, "a management token", settings.admin_token_networks):
        principal = await admin(request)
        account = principal.account_id
        limited = principal.functions  # a limited key's token is limited as much
        not_after = principal.expires_at  # and lives no longer
    else:
        account = settings.default_account
    granted: tuple[str, ...] = MANAGEMENT_SCOPES
    if limited is not None:
        granted = tuple(s for s in granted if s not in ACCOUNT_WIDE_SCOPES)
    body = await read_json(request) if await request.body() else {}
    description = policies.token_description(body)
    value, row = await mint_key(
        session,
        quotas,
        account_id=account,
        scopes=granted,
        expires_in=MANAGEMENT_LIFETIME,
        description=description or "Admin token",
        functions=limited,
        not_after=not_after,
    )
    return key_view(
        row,
        value,
        owner_type="SYSTEM",
        owner_id=account,
        issuer_service_id="",
        audience_service_ids=[],
    )


@router.post(
    "/v1/keys",
    summary="Create an API key from NVCF policies (NVCF's API-keys service)",
    description="`authorizations.policies[{resources, scopes}]`, `expires_at`, "
    "`description`; a policy naming function ids (`{id, type: account-functions}`) limits "
    "the key to them on every route. The operator scope cannot be granted.",
)
async def create_key(
    request: Request,
    session: Session,
    principal: Admin,
    quotas: QuotasDep,
    reach: FunctionReachDep,
) -> dict[str, Any]:
    body = await read_json(request)
    asked = await policies.key_request(body, principal, session, reach)
    account = principal.account_id
    value, row = await mint_key(
        session,
        quotas,
        account_id=account,
        scopes=asked.grant.scopes,
        description=asked.description,
        functions=asked.grant.functions,
        authorizations={
            "policies": asked.grant.policies,
            ISSUER: policies.issuer(request.headers, body, account),
        },
        expires_at=asked.expires_at,
        not_after=principal.expires_at,
    )
    return key_view(row, value)


@router.get("/v1/keys", summary="The account's API keys in NVCF's shape (never their values)")
async def list_keys(session: Session, principal: Admin) -> dict[str, Any]:
    rows = await repository.keys_of(session, principal.account_id)
    return {"keys": [key_view(r) for r in rows if within_reach(principal, r.functions)]}


@router.get(
    "/v1/keys/{keyId}",
    summary="One API key in NVCF's shape, with its authorizations (never its value)",
)
async def get_key(keyId: str, session: Session, principal: Admin) -> dict[str, Any]:
    kid = _key_id(keyId, keyId[:64])
    return key_view(await key_in_reach(session, principal.account_id, principal, kid))


@router.put(
    "/v1/keys/{keyId}/authorizations",
    summary="Replace an API key's policies (NVCF's API-keys service)",
    description='`{"authorizations": {"policies": [...]}}`, checked as on creation; '
    "the key's scopes and functions change at once. Only an active key (else 400).",
)
async def update_authorizations(
    keyId: str,
    request: Request,
    session: Session,
    principal: Admin,
    reach: FunctionReachDep,
    authenticator: AuthenticatorDep,
) -> dict[str, Any]:
    kid = _key_id(keyId, keyId[:64])
    row = await key_in_reach(session, principal.account_id, principal, kid)
    grant = await policies.grant_request(await read_json(request), principal, session, reach)
    await replace_grant(
        session,
        authenticator,
        row,
        scopes=grant.scopes,
        functions=grant.functions,
        authorizations=policies.kept_authorizations(grant, row),
    )
    return key_view(row)


@router.delete(
    "/v1/keys/{keyId}",
    status_code=204,
    response_class=Response,
    summary="Revoke an API key (NVCF's API-keys service)",
    description="Needs the `admin` scope; nvcf-cli sends no credential here, which is "
    "accepted only from an address in NVCF_ADMIN_TOKEN_NETWORKS without a proxy header (then "
    "for a key of the default account, never an operator key). A key limited to functions "
    "revokes only keys limited to some of them.",
)
async def delete_key(
    keyId: str,
    request: Request,
    session: Session,
    settings: SettingsDep,
    authenticator: AuthenticatorDep,
) -> Response:
    principal: Principal | None = None
    if _credential_less(request, "revoking a key", settings.admin_token_networks):
        account = settings.default_account
    else:
        if not request.headers.get("authorization"):
            raise Unauthorized(
                detail="revoking a key needs a credential with scope 'admin' (nvcf-cli's "
                "`api-key delete` sends none: it is accepted without one only from an address "
                "in NVCF_ADMIN_TOKEN_NETWORKS)"
            )
        principal = await admin(request)
        account = principal.account_id
    await revoke_key(session, authenticator, account, principal, _key_id(keyId, keyId))
    return Response(status_code=204)
