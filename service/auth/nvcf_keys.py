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
  lists and a 404 to revoke) and never carries `manage_registry_credentials` (account-wide).
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
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response

from service.auth import repository, scopes
from service.auth.deps import (
    AuthenticatorDep,
    FunctionReachDep,
    Session,
    authenticate_request,
    require,
)
from service.auth.models import ApiKey
from service.auth.restrict import FunctionReach
from service.auth.router import MAX_KEY_LIFETIME
from service.auth.service import (
    API_KEY_PREFIX,
    Principal,
    create_api_key,
    limited_scope_errors,
    scope_errors,
    within_reach,
)
from service.core.db import utcnow
from service.core.deps import QuotasDep, SettingsDep
from service.core.errors import FieldError, Forbidden, NotFound, Unauthorized, ValidationFailed
from service.core.http import read_json

router = APIRouter(tags=["api-keys"])
Admin = Annotated[Principal, Depends(require(scopes.ADMIN))]

PRODUCT = "nv-cloud-functions"
ACCOUNT_FUNCTIONS = "account-functions"
AUTHORIZED_FUNCTIONS = "authorized-functions"
RESOURCE_TYPES = (ACCOUNT_FUNCTIONS, AUTHORIZED_FUNCTIONS)
#: what NVCF's admin token carries (its `manage_telemetries` has no counterpart here), and
#: `admin` so that it can create the account's keys (`POST /v1/keys`), as there
MANAGEMENT_SCOPES = (
    scopes.REGISTER_FUNCTION,
    scopes.LIST_FUNCTIONS,
    scopes.LIST_FUNCTIONS_DETAILS,
    scopes.DEPLOY_FUNCTION,
    scopes.UPDATE_FUNCTION,
    scopes.UPDATE_SECRETS,
    scopes.DELETE_FUNCTION,
    scopes.MANAGE_REGISTRY_CREDENTIALS,
    scopes.ADMIN,
)
MANAGEMENT_LIFETIME = timedelta(hours=12)
MAX_POLICIES = 16
MAX_RESOURCES = 100
MAX_TEXT = 256
MAX_AUDIENCES = 16
ALL = [{"id": "*", "type": ACCOUNT_FUNCTIONS}, {"id": "*", "type": AUTHORIZED_FUNCTIONS}]


#: how NVCF masks a key in its answers but at creation: the prefix, this, the last 3 characters
SUFFIX_MASK = "**********"
SUFFIX_SHOWN = 3
#: where the issuer fields of a key created here are kept, beside its policies
ISSUER = "issuer"


def suffix(row: ApiKey) -> str:
    """The key's `value` once created, as NVCF shows it: masked but for its last characters
    (kept in its hint since they were; an older key shows the mask alone)."""
    _, sep, last = row.hint.partition("…")
    return API_KEY_PREFIX + SUFFIX_MASK + (last[-SUFFIX_SHOWN:] if sep else "")


def _time(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _policy(key_scopes: list[str], resources: list[dict[str, str]]) -> dict[str, Any]:
    return {"product": PRODUCT, "resources": resources, "scopes": key_scopes}


def _stored(authorizations: dict[str, Any] | None) -> dict[str, Any] | None:
    """Stored policies as `POST /v1/keys` keeps them now: rows written before it validated its
    input may hold a client's extra keys or unbounded text, which are not shown back."""
    if authorizations is None:
        return None
    policies: list[dict[str, Any]] = []
    for policy in authorizations.get("policies") or []:
        if not isinstance(policy, dict):
            continue
        ignored: list[FieldError] = []
        resources = policy.get("resources")
        policies.append(
            {
                **_audiences(policy, "", ignored),
                "product": _bounded(policy, "product", "", ignored) or PRODUCT,
                "resources": [
                    {"id": str(r.get("id"))[:MAX_TEXT], "type": str(r.get("type"))[:MAX_TEXT]}
                    for r in (resources if isinstance(resources, list) else [])
                    if isinstance(r, dict)
                ],
                "scopes": [s for s in policy.get("scopes") or [] if isinstance(s, str)],
            }
        )
    return {"policies": policies}


def narrowed(
    policies: list[dict[str, Any]], functions: Collection[str] | None
) -> list[dict[str, Any]]:
    """Policies as they act on a key limited to `functions`: a `*` resource stands for those
    functions (each named once, with the type of the first `*` that stood for it)."""
    if functions is None:
        return policies
    out: list[dict[str, Any]] = []
    for policy in policies:
        resources: list[dict[str, str]] = []
        named: set[str] = set()
        for resource in policy["resources"]:
            ids = sorted(str(f) for f in functions) if resource["id"] == "*" else [resource["id"]]
            for fid in ids:
                if fid not in named:
                    named.add(fid)
                    resources.append({"id": fid, "type": resource["type"]})
        out.append({**policy, "resources": resources})
    return out


def _issuer_of(row: ApiKey) -> dict[str, Any]:
    kept = (row.authorizations or {}).get(ISSUER)
    kept = kept if isinstance(kept, dict) else {}
    audiences = kept.get("audience_service_ids")
    return {
        "owner_type": "USER",
        "owner_id": str(kept.get("owner_id") or row.account_id)[:MAX_TEXT],
        "issuer_service_id": str(kept.get("issuer_service_id") or "")[:MAX_TEXT],
        "audience_service_ids": [str(a)[:MAX_TEXT] for a in audiences][:MAX_AUDIENCES]
        if isinstance(audiences, list)
        else [],
    }


def key_view(row: ApiKey, value: str | None = None, **extra: Any) -> dict[str, Any]:
    """A key as NVCF's API-keys service shows it: `value` the key itself when it is created,
    else its masked suffix; its policies as they act (`narrowed`)."""
    now = utcnow()
    authorizations = _stored(row.authorizations)
    if authorizations is None:
        authorizations = {"policies": [_policy(list(row.scopes), ALL)]}
    authorizations = {"policies": narrowed(authorizations["policies"], row.functions)}
    out: dict[str, Any] = {
        "id": str(row.id),
        "value": value if value is not None else suffix(row),
        "status": "EXPIRED" if row.expires_at is not None and row.expires_at <= now else "ACTIVE",
        **_issuer_of(row),
        "description": row.description or "",
        "created_at": _time(row.created_at),
        "authorizations": authorizations,
        **extra,
    }
    if row.expires_at is not None:
        out["expires_at"] = _time(row.expires_at)
    return out


def _text(body: dict[str, Any], name: str, errors: list[FieldError]) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        errors.append(FieldError(name, f"must be a string of at most {MAX_TEXT} characters"))
        return None
    return value


def _expiry(body: dict[str, Any], errors: list[FieldError]) -> datetime | None:
    raw = body.get("expires_at")
    if raw is None:
        return None
    try:
        when = datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    except ValueError:
        errors.append(FieldError("expires_at", f"{raw!r} is not an RFC 3339 time"))
        return None
    if when.tzinfo is None:
        errors.append(FieldError("expires_at", "must carry a time zone (e.g. Z)"))
        return None
    now = utcnow()
    if when <= now:
        errors.append(FieldError("expires_at", "must be in the future"))
    elif when - now > MAX_KEY_LIFETIME:
        errors.append(FieldError("expires_at", f"must be within {MAX_KEY_LIFETIME.days} days"))
    return when


def _bounded(policy: dict[str, Any], name: str, at: str, errors: list[FieldError]) -> str | None:
    """A policy's optional text field, a string of 1 to MAX_TEXT characters."""
    value = policy.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT:
        errors.append(FieldError(f"{at}.{name}", f"must be a string of 1 to {MAX_TEXT} characters"))
        return None
    return value


def _audiences(policy: dict[str, Any], at: str, errors: list[FieldError]) -> dict[str, Any]:
    """A policy's `aud` (a bounded string) and `auds` (up to MAX_AUDIENCES of them), as kept."""
    out: dict[str, Any] = {}
    aud = _bounded(policy, "aud", at, errors)
    if aud is not None:
        out["aud"] = aud
    auds = policy.get("auds")
    if auds is None:
        return out
    if (
        not isinstance(auds, list)
        or len(auds) > MAX_AUDIENCES
        or not all(isinstance(a, str) and 0 < len(a) <= MAX_TEXT for a in auds)
    ):
        errors.append(
            FieldError(
                f"{at}.auds",
                f"must be a list of at most {MAX_AUDIENCES} strings of 1 to {MAX_TEXT} characters",
            )
        )
        return out
    out["auds"] = list(auds)
    return out


def _policies(
    body: dict[str, Any], errors: list[FieldError]
) -> tuple[list[str], set[uuid.UUID] | None, dict[str, list[str]], list[dict[str, Any]]]:
    """Scopes (union), functions (None: unrestricted), ids by resource type, the policies."""
    where = "authorizations.policies"
    auth = body.get("authorizations")
    policies = auth.get("policies") if isinstance(auth, dict) else None
    if not isinstance(policies, list) or not policies or len(policies) > MAX_POLICIES:
        errors.append(FieldError(where, f"must be a list of 1 to {MAX_POLICIES} policies"))
        return [], None, {}, []
    granted: set[str] = set()
    named: dict[str, list[str]] = {t: [] for t in RESOURCE_TYPES}
    everything = False
    kept: list[dict[str, Any]] = []
    for i, policy in enumerate(policies):
        at = f"{where}[{i}]"
        if not isinstance(policy, dict):
            errors.append(FieldError(at, "must be an object"))
            continue
        wanted = policy.get("scopes")
        if (
            not isinstance(wanted, list)
            or not wanted
            or not all(isinstance(s, str) for s in wanted)
            or len(wanted) > 64
        ):
            errors.append(FieldError(f"{at}.scopes", "must be a list of 1 to 64 scope names"))
            wanted = []
        for error in scope_errors(wanted):
            errors.append(FieldError(f"{at}.scopes", error.message))
        granted.update(wanted)
        resources = policy.get("resources", ALL)
        if not isinstance(resources, list) or not resources or len(resources) > MAX_RESOURCES:
            errors.append(
                FieldError(f"{at}.resources", f"must be a list of 1 to {MAX_RESOURCES} resources")
            )
            resources = []
        stored: list[dict[str, str]] = []
        for j, resource in enumerate(resources):
            rat = f"{at}.resources[{j}]"
            kind = resource.get("type") if isinstance(resource, dict) else None
            rid = resource.get("id") if isinstance(resource, dict) else None
            if kind not in RESOURCE_TYPES:
                errors.append(
                    FieldError(f"{rat}.type", f"must be one of {', '.join(RESOURCE_TYPES)}")
                )
                continue
            if rid == "*":
                everything = True
                stored.append({"id": "*", "type": str(kind)})
                continue
            try:
                fid = str(uuid.UUID(rid)) if isinstance(rid, str) else ""
            except ValueError:
                fid = ""
            if not fid:
                errors.append(FieldError(f"{rat}.id", "must be '*' or a function id"))
                continue
            named[str(kind)].append(fid)
            stored.append({"id": fid, "type": str(kind)})
        kept.append(
            {
                **_audiences(policy, at, errors),
                "product": _bounded(policy, "product", at, errors) or PRODUCT,
                "resources": stored,
                "scopes": sorted(set(wanted)),
            }
        )
    functions = None if everything else {uuid.UUID(f) for ids in named.values() for f in ids}
    return sorted(granted), functions, named, kept


async def _check_functions(
    session: Session,
    reach: FunctionReach,
    account_id: str,
    named: dict[str, list[str]],
    errors: list[FieldError],
) -> None:
    """Each named function must be the account's own (account-functions) or shared with it
    (authorized-functions)."""
    own_ids = [uuid.UUID(f) for f in named.get(ACCOUNT_FUNCTIONS, [])]
    if own_ids:
        own = await reach.own_functions(session, account_id, own_ids)
        for fid in own_ids:
            if fid not in own:
                errors.append(
                    FieldError(
                        "authorizations.policies.resources",
                        f"function {fid} is not one of this account's functions",
                    )
                )
    shared_ids = [uuid.UUID(f) for f in named.get(AUTHORIZED_FUNCTIONS, [])]
    if shared_ids:
        shared = await reach.shared_functions(session, account_id, shared_ids)
        for fid in shared_ids:
            if fid not in shared:
                errors.append(
                    FieldError(
                        "authorizations.policies.resources",
                        f"function {fid} is not shared with this account",
                    )
                )


def _issuer(request: Request, body: dict[str, Any], account: str) -> dict[str, Any]:
    """Who a key is for and from, as nvcf-cli says it (`Key-Owner-Id`, `Key-Issuer-Id`, the
    body's `audience_service_ids`), kept with the key to be shown back (bounded)."""
    audiences = body.get("audience_service_ids")
    if not isinstance(audiences, list) or not all(isinstance(a, str) for a in audiences):
        audiences = []
    return {
        "owner_id": request.headers.get("key-owner-id", "")[:MAX_TEXT] or account,
        "issuer_service_id": request.headers.get("key-issuer-id", "")[:MAX_TEXT],
        "audience_service_ids": [a[:MAX_TEXT] for a in audiences[:MAX_AUDIENCES]],
    }


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


@router.post(
    "/v1/admin/keys",
    summary="A management token for the caller's account (NVCF's API-keys service)",
    description="An `nvapi-` key with the function-management scopes and `admin`, valid 12 "
    "hours, in NVCF's shape (`value` is the token). Needs the `admin` scope, or no credential "
    "from an address in NVCF_ADMIN_TOKEN_NETWORKS and no proxy header such as X-Forwarded-For "
    "(then for the default account). A limited key's token is as limited, without "
    "manage_registry_credentials; a key's token expires no later than the key.",
)
async def admin_token(
    request: Request, session: Session, settings: SettingsDep, quotas: QuotasDep
) -> dict[str, Any]:
    limited: frozenset[uuid.UUID] | None = None
    not_after: datetime | None = None
    if not _credential_less(request, "a management token", settings.admin_token_networks):
        principal = await authenticate_request(request)
        if scopes.ADMIN not in principal.scopes:
            raise Forbidden(detail="a management token needs a credential with scope 'admin'")
        account = principal.account_id
        limited = principal.functions  # a limited key's token is limited as much
        not_after = principal.expires_at  # and lives no longer
    granted: tuple[str, ...] = MANAGEMENT_SCOPES
    if limited is not None:
        granted = tuple(s for s in granted if s != scopes.MANAGE_REGISTRY_CREDENTIALS)
    else:
        account = settings.default_account
    body = await read_json(request) if await request.body() else {}
    errors: list[FieldError] = []
    description = _text(body if isinstance(body, dict) else {}, "description", errors)
    if errors:
        raise ValidationFailed.of(errors)
    await quotas.api_keys.check(
        lambda: repository.count_keys(session, account),
        lambda: repository.lock_account(session, account),
    )
    value, row = await create_api_key(
        session,
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


async def _granted(
    body: dict[str, Any],
    principal: Principal,
    session: Session,
    reach: FunctionReach,
    errors: list[FieldError],
) -> tuple[list[str], set[uuid.UUID] | None, list[dict[str, Any]]]:
    """The scopes, functions and policies `body.authorizations` grants when `principal` asks
    (a limited key grants only its own functions: a `*` is narrowed to them); every violation
    goes to `errors`."""
    key_scopes, functions, named, kept = _policies(body, errors)
    if principal.functions is not None:
        # a key limited to named functions makes keys limited to (some of) them only
        if functions is None:
            functions = set(principal.functions)
        elif not functions <= principal.functions:
            errors.append(
                FieldError(
                    "authorizations.policies.resources",
                    "this key is limited to named functions: it can grant only those",
                )
            )
    errors += limited_scope_errors(key_scopes, functions, "authorizations.policies.scopes")
    if not errors:
        await _check_functions(session, reach, principal.account_id, named, errors)
    limit = None if functions is None else [str(f) for f in functions]
    return key_scopes, functions, narrowed(kept, limit)


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
    if not isinstance(body, dict):
        raise ValidationFailed.of([FieldError("body", "must be a JSON object")])
    errors: list[FieldError] = []
    description = _text(body, "description", errors)
    expires_at = _expiry(body, errors)
    key_scopes, functions, kept = await _granted(body, principal, session, reach, errors)
    if errors:
        raise ValidationFailed.of(errors)
    account = principal.account_id
    await quotas.api_keys.check(
        lambda: repository.count_keys(session, account),
        lambda: repository.lock_account(session, account),
    )
    value, row = await create_api_key(
        session,
        account_id=account,
        scopes=key_scopes,
        description=description,
        functions=functions,
        authorizations={"policies": kept, ISSUER: _issuer(request, body, account)},
        expires_at=expires_at,
        not_after=principal.expires_at,
    )
    return key_view(row, value)


@router.get("/v1/keys", summary="The account's API keys in NVCF's shape (never their values)")
async def list_keys(session: Session, principal: Admin) -> dict[str, Any]:
    rows = await repository.keys_of(session, principal.account_id)
    return {"keys": [key_view(r) for r in rows if within_reach(principal, r.functions)]}


async def _key_in_reach(session: Session, principal: Principal, key_id: str) -> ApiKey:
    """The caller's account's key `key_id` within its reach, else 404 (NVCF: "Key not found")."""
    try:
        kid = uuid.UUID(key_id)
    except ValueError:
        raise NotFound(detail=f"API key {key_id[:64]} not found") from None
    row = await repository.key_by_id(session, kid)
    if (
        row is None
        or row.account_id != principal.account_id
        or not within_reach(principal, row.functions)
    ):
        raise NotFound(detail=f"API key {kid} not found")
    return row


@router.get(
    "/v1/keys/{keyId}",
    summary="One API key in NVCF's shape, with its authorizations (never its value)",
)
async def get_key(keyId: str, session: Session, principal: Admin) -> dict[str, Any]:
    return key_view(await _key_in_reach(session, principal, keyId))


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
    row = await _key_in_reach(session, principal, keyId)
    body = await read_json(request)
    if not isinstance(body, dict):
        raise ValidationFailed.of([FieldError("body", "must be a JSON object")])
    errors: list[FieldError] = []
    key_scopes, functions, kept = await _granted(body, principal, session, reach, errors)
    if not errors and any(s in scopes.OPERATOR_SCOPES for s in row.scopes):
        errors.append(FieldError("keyId", "an operator key's scopes are changed only by the CLI"))
    if not errors and row.expires_at is not None and row.expires_at <= utcnow():
        errors.append(FieldError("keyId", "the key is not active (it expired)"))
    if errors:
        raise ValidationFailed.of(errors)
    issuer = (row.authorizations or {}).get(ISSUER)
    row.scopes = key_scopes
    row.functions = sorted(str(f) for f in functions) if functions is not None else None
    row.authorizations = {"policies": kept, **({ISSUER: issuer} if issuer else {})}
    await session.flush()
    authenticator.forget(row.key_hash)
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
    uncredentialed = not request.headers.get("authorization")
    principal: Principal | None = None
    if _credential_less(request, "revoking a key", settings.admin_token_networks):
        account = settings.default_account
    else:
        if uncredentialed:
            raise Unauthorized(
                detail="revoking a key needs a credential with scope 'admin' (nvcf-cli's "
                "`api-key delete` sends none: it is accepted without one only from an address "
                "in NVCF_ADMIN_TOKEN_NETWORKS)"
            )
        principal = await authenticate_request(request)
        if scopes.ADMIN not in principal.scopes:
            raise Forbidden(detail="revoking a key needs a credential with scope 'admin'")
        account = principal.account_id
    try:
        kid = uuid.UUID(keyId)
    except ValueError:
        raise NotFound(detail=f"API key {keyId} not found") from None
    row = await repository.key_by_id(session, kid)
    if (
        row is None
        or row.account_id != account
        or (principal is not None and not within_reach(principal, row.functions))
    ):
        raise NotFound(detail=f"API key {kid} not found")
    if uncredentialed and any(s in scopes.OPERATOR_SCOPES for s in row.scopes):
        raise Forbidden(detail="an operator key is revoked only with a credential")
    await repository.delete_key(session, row)
    authenticator.forget(row.key_hash)
    return Response(status_code=204)
