"""NVCF's API-keys service's shapes, which its routes (nvcf_keys.py) parse and render: the
policies a key is made from (`authorizations.policies[{resources, scopes}]`), checked with every
violation listed, and a key as NVCF's `KeyResponseBuilder` writes it."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.auth import scopes
from service.auth.models import ApiKey
from service.auth.restrict import FunctionReach
from service.auth.service import (
    API_KEY_PREFIX,
    MAX_KEY_LIFETIME,
    Principal,
    limited_scope_errors,
    scope_errors,
)
from service.core.db import utcnow
from service.core.errors import FieldError, ValidationFailed

PRODUCT = "nv-cloud-functions"
ACCOUNT_FUNCTIONS = "account-functions"
AUTHORIZED_FUNCTIONS = "authorized-functions"
RESOURCE_TYPES = (ACCOUNT_FUNCTIONS, AUTHORIZED_FUNCTIONS)
#: what NVCF's admin token carries, and `admin` so that it can create the account's keys
#: (`POST /v1/keys`), as there
MANAGEMENT_SCOPES = (
    scopes.REGISTER_FUNCTION,
    scopes.LIST_FUNCTIONS,
    scopes.LIST_FUNCTIONS_DETAILS,
    scopes.DEPLOY_FUNCTION,
    scopes.UPDATE_FUNCTION,
    scopes.UPDATE_SECRETS,
    scopes.DELETE_FUNCTION,
    scopes.MANAGE_REGISTRY_CREDENTIALS,
    scopes.MANAGE_TELEMETRIES,
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
    session: AsyncSession,
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


def issuer(headers: Mapping[str, str], body: dict[str, Any], account: str) -> dict[str, Any]:
    """Who a key is for and from, as nvcf-cli says it (`Key-Owner-Id`, `Key-Issuer-Id`, the
    body's `audience_service_ids`), kept with the key to be shown back (bounded)."""
    audiences = body.get("audience_service_ids")
    if not isinstance(audiences, list) or not all(isinstance(a, str) for a in audiences):
        audiences = []
    return {
        "owner_id": headers.get("key-owner-id", "")[:MAX_TEXT] or account,
        "issuer_service_id": headers.get("key-issuer-id", "")[:MAX_TEXT],
        "audience_service_ids": [a[:MAX_TEXT] for a in audiences[:MAX_AUDIENCES]],
    }


async def _granted(
    body: dict[str, Any],
    principal: Principal,
    session: AsyncSession,
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


@dataclass(frozen=True)
class Grant:
    """What a key's policies grant: its scopes, its functions (None: every function) and the
    policies as kept (narrowed to the functions)."""

    scopes: list[str]
    functions: set[uuid.UUID] | None
    policies: list[dict[str, Any]]


@dataclass(frozen=True)
class KeyRequest:
    """A `POST /v1/keys` body, checked."""

    description: str | None
    expires_at: datetime | None
    grant: Grant


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ValidationFailed.of([FieldError("body", "must be a JSON object")])
    return body


async def key_request(
    body: Any, principal: Principal, session: AsyncSession, reach: FunctionReach
) -> KeyRequest:
    """A `POST /v1/keys` body as `principal` asks for it; every violation in one 400."""
    body = _object(body)
    errors: list[FieldError] = []
    description = _text(body, "description", errors)
    expires_at = _expiry(body, errors)
    key_scopes, functions, kept = await _granted(body, principal, session, reach, errors)
    if errors:
        raise ValidationFailed.of(errors)
    return KeyRequest(description, expires_at, Grant(key_scopes, functions, kept))


async def grant_request(
    body: Any, principal: Principal, session: AsyncSession, reach: FunctionReach
) -> Grant:
    """A `PUT /v1/keys/{id}/authorizations` body as `principal` asks for it (400: every
    violation)."""
    body = _object(body)
    errors: list[FieldError] = []
    key_scopes, functions, kept = await _granted(body, principal, session, reach, errors)
    if errors:
        raise ValidationFailed.of(errors)
    return Grant(key_scopes, functions, kept)


def token_description(body: Any) -> str | None:
    """A management token's optional `description` (any other body is ignored, as NVCF)."""
    errors: list[FieldError] = []
    description = _text(body if isinstance(body, dict) else {}, "description", errors)
    if errors:
        raise ValidationFailed.of(errors)
    return description


def kept_authorizations(grant: Grant, row: ApiKey) -> dict[str, Any]:
    """What a key whose policies are replaced keeps: the new policies, its issuer fields."""
    kept_issuer = (row.authorizations or {}).get(ISSUER)
    return {"policies": grant.policies, **({ISSUER: kept_issuer} if kept_issuer else {})}
