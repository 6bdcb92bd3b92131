"""Credential verification: `nvapi-` API keys (hashed at rest), JWTs (HS256 or JWKS), and the
invocation tokens this service issues (tokens.py), which only the invocation entries accept."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import secrets
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import jwt
from jwt.types import Options
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.auth import repository
from service.auth.limits import account_quota
from service.auth.models import ApiKey
from service.auth.scopes import (
    ALL_SCOPES,
    INVOKE_FUNCTION,
    MANAGE_REGISTRY_CREDENTIALS,
    MANAGE_TELEMETRIES,
    OPERATOR_SCOPES,
)
from service.auth.suspensions import Suspensions
from service.auth.tokens import InvocationGrant, InvocationTokens, is_invocation_token
from service.core.db import utcnow
from service.core.errors import (
    BadRequest,
    FieldError,
    Forbidden,
    NotFound,
    Unauthorized,
    ValidationFailed,
)
from service.core.http import json_errors
from service.core.quotas import Quotas
from service.core.settings import Settings

API_KEY_PREFIX = "nvapi-"
#: the longest lifetime a key may be given (a key's expiry must be a date: `now + expiresIn`
#: overflows for durations the parser accepts, up to 999,999,999 days)
MAX_KEY_LIFETIME = timedelta(days=100 * 366)
_BEARER = {"WWW-Authenticate": "Bearer"}
#: the longest account id (the `accounts.id` column, and every `account_id` column)
MAX_ACCOUNT_ID = 128


@dataclass(frozen=True)
class Principal:
    """Who is calling: an account and the scopes granted to this credential."""

    account_id: str
    scopes: frozenset[str]
    kind: str  # "api-key", "jwt" or "invocation-token"
    subject: str
    #: an invocation token's: the only functions (and versions) it may invoke; None: any the
    #: account may invoke
    grant: InvocationGrant | None = None
    #: the functions a key is limited to (NVCF policy resources); None: every function
    functions: frozenset[uuid.UUID] | None = None
    #: when an API key or invocation token stops working (None: never, or a JWT): nothing it
    #: mints outlives it
    expires_at: datetime | None = None


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def generate_key() -> str:
    return API_KEY_PREFIX + secrets.token_urlsafe(48)


def scope_errors(scopes: Iterable[str], *, operator: bool = False) -> list[FieldError]:
    """Why a list of scopes cannot be granted; operator scopes only by the operator's CLI."""
    errors: list[FieldError] = []
    for s in sorted(set(scopes)):
        if s in OPERATOR_SCOPES:
            if not operator:
                errors.append(
                    FieldError(
                        "scopes",
                        f"scope '{s}' can only be granted by the operator "
                        "(`nvcf-server create-key`)",
                    )
                )
        elif s not in ALL_SCOPES:
            errors.append(FieldError("scopes", f"unknown scope '{s}'"))
    return errors


#: why a key limited to named functions never carries `manage_registry_credentials`
REGISTRY_IS_ACCOUNT_WIDE = (
    "registry credentials are account-wide (every function of the account pulls with them): "
    "a key limited to named functions cannot manage them"
)
#: why a key limited to named functions never carries `manage_telemetries`
TELEMETRIES_ARE_ACCOUNT_WIDE = (
    "telemetry endpoints are account-wide (any function of the account may name them): a key "
    "limited to named functions cannot manage them"
)
#: the scopes over what serves every function of the account, which a key limited to named
#: functions never carries -> why
ACCOUNT_WIDE_SCOPES = {
    MANAGE_REGISTRY_CREDENTIALS: REGISTRY_IS_ACCOUNT_WIDE,
    MANAGE_TELEMETRIES: TELEMETRIES_ARE_ACCOUNT_WIDE,
}


def limited_scope_errors(
    scopes: Iterable[str], functions: Iterable[uuid.UUID] | None, field: str = "scopes"
) -> list[FieldError]:
    """Why a key limited to `functions` (None: unlimited) cannot carry these scopes."""
    if functions is None:
        return []
    asked = set(scopes)
    return [
        FieldError(field, f"scope '{scope}': {why}")
        for scope, why in ACCOUNT_WIDE_SCOPES.items()
        if scope in asked
    ]


def within_reach(principal: Principal, key_functions: Iterable[str] | None) -> bool:
    """Whether a caller may see and revoke a key limited to `key_functions` (None: unlimited):
    an unlimited caller any of its account's; a limited one only keys limited to some of its
    own functions."""
    if principal.functions is None:
        return True
    if key_functions is None:
        return False
    return {uuid.UUID(str(f)) for f in key_functions} <= principal.functions


async def create_api_key(
    session: AsyncSession,
    *,
    account_id: str,
    scopes: Iterable[str],
    expires_in: timedelta | None = None,
    description: str | None = None,
    key: str | None = None,
    operator: bool = False,
    functions: Iterable[uuid.UUID] | None = None,
    authorizations: dict[str, Any] | None = None,
    expires_at: datetime | None = None,
    not_after: datetime | None = None,
) -> tuple[str, ApiKey]:
    """Store a new key (hash only); returns the key itself, shown once, and its row.

    `operator` is set only by the operator's own paths (the CLI, the bootstrap key): it allows
    the operator scopes, which the API can never grant. `not_after` (the minting key's
    expiry) caps the new key's: a key never outlives the key that made it.
    """
    scope_list = sorted(set(scopes))
    errors = scope_errors(scope_list, operator=operator)
    errors += limited_scope_errors(scope_list, functions)
    if not scope_list:
        errors.append(FieldError("scopes", "at least one scope is required"))
    if errors:
        raise ValidationFailed.of(errors)
    if key is None:
        key = generate_key()
    elif not key.startswith(API_KEY_PREFIX):
        raise BadRequest(detail="API keys must start with 'nvapi-'")
    await repository.ensure_account(session, account_id)
    row = ApiKey(
        id=uuid.uuid4(),
        account_id=account_id,
        key_hash=hash_key(key),
        # its start, and its last characters: what NVCF's API-keys service shows of a key
        hint=key[:10] + "…" + key[-3:],
        scopes=scope_list,
        description=description,
        expires_at=_capped(
            expires_at or (utcnow() + expires_in if expires_in else None), not_after
        ),
        functions=sorted(str(f) for f in functions) if functions is not None else None,
        authorizations=authorizations,
    )
    session.add(row)
    await session.flush()
    return key, row


async def mint_key(
    session: AsyncSession,
    quotas: Quotas,
    *,
    account_id: str,
    scopes: Iterable[str],
    expires_in: timedelta | None = None,
    description: str | None = None,
    functions: Iterable[uuid.UUID] | None = None,
    authorizations: dict[str, Any] | None = None,
    expires_at: datetime | None = None,
    not_after: datetime | None = None,
) -> tuple[str, ApiKey]:
    """A key a caller of the API asks for (both key APIs, NVCF's management token): within
    the account's key quota, then `create_api_key` (which never grants the operator scopes)."""
    quota = await account_quota(session, quotas.api_keys, account_id)
    await quota.check(
        lambda: repository.count_keys(session, account_id),
        lambda: repository.lock_account(session, account_id),
    )
    return await create_api_key(
        session,
        account_id=account_id,
        scopes=scopes,
        expires_in=expires_in,
        description=description,
        functions=functions,
        authorizations=authorizations,
        expires_at=expires_at,
        not_after=not_after,
    )


async def key_in_reach(
    session: AsyncSession, account_id: str, principal: Principal | None, key_id: uuid.UUID
) -> ApiKey:
    """The key `key_id` of `account_id` within the caller's reach (`within_reach`; no
    principal: a credential-less caller the route trusts), else 404."""
    row = await repository.key_by_id(session, key_id)
    if (
        row is None
        or row.account_id != account_id
        or (principal is not None and not within_reach(principal, row.functions))
    ):
        raise NotFound(detail=f"API key {key_id} not found")
    return row


async def revoke_key(
    session: AsyncSession,
    authenticator: Authenticator,
    account_id: str,
    principal: Principal | None,
    key_id: uuid.UUID,
) -> None:
    """Revoke a key in the caller's reach (`key_in_reach`), at once in this process. Without
    a principal (a credential-less caller), never an operator key (403)."""
    row = await key_in_reach(session, account_id, principal, key_id)
    if principal is None and any(s in OPERATOR_SCOPES for s in row.scopes):
        raise Forbidden(detail="an operator key is revoked only with a credential")
    await repository.delete_key(session, row)
    authenticator.forget(row.key_hash)


async def replace_grant(
    session: AsyncSession,
    authenticator: Authenticator,
    row: ApiKey,
    *,
    scopes: Iterable[str],
    functions: Iterable[uuid.UUID] | None,
    authorizations: dict[str, Any],
) -> None:
    """Give an active key other scopes and functions, at once in this process (400 for an
    operator key, whose scopes only the CLI changes, or an expired one)."""
    if any(s in OPERATOR_SCOPES for s in row.scopes):
        raise ValidationFailed.of(
            [FieldError("keyId", "an operator key's scopes are changed only by the CLI")]
        )
    if row.expires_at is not None and row.expires_at <= utcnow():
        raise ValidationFailed.of([FieldError("keyId", "the key is not active (it expired)")])
    row.scopes = list(scopes)
    row.functions = sorted(str(f) for f in functions) if functions is not None else None
    row.authorizations = authorizations
    await session.flush()
    authenticator.forget(row.key_hash)


def _capped(expires_at: datetime | None, not_after: datetime | None) -> datetime | None:
    if not_after is None:
        return expires_at
    return not_after if expires_at is None else min(expires_at, not_after)


async def grant_scopes(session: AsyncSession, key: str, wanted: Iterable[str]) -> bool:
    """Make sure a stored key carries at least `wanted`; False when no such key is stored.

    For the operator's own key only: it bypasses the checks of `create_api_key`.
    """
    row = await repository.key_by_hash(session, hash_key(key))
    if row is None:
        return False
    missing = set(wanted) - set(row.scopes)
    if missing:
        row.scopes = sorted(set(row.scopes) | missing)
        await session.flush()
    return True


INVOCATION_TOKEN = "invocation-token"  # noqa: S105 (a principal kind, not a secret)
#: the refusal of an invocation token anywhere but an invocation entry
NOT_AN_INVOCATION_ROUTE = (
    "an invocation token may only invoke the functions it names (pexec, exec, their status "
    "polls, transparent mode), use the account's assets and ask for invocation tokens; this "
    "route needs an API key or a JWT"
)

#: how long a verified API key is answered from memory (by its header) before it is read again
KNOWN_SECONDS = 5.0
#: a key is never answered from memory within this long of its expiry
EXPIRY_MARGIN_SECONDS = 1.0
#: headers remembered at most (all forgotten at once when full)
KNOWN_MAX = 1024


@dataclass(slots=True)
class _Lookup:
    """One key lookup under way and how many requests wait for it."""

    future: asyncio.Future[Principal]
    waiters: int = 0


class Authenticator:
    """Turns an `Authorization` header into a Principal, or raises 401: `authenticate` is the
    one entry (REST dependencies, the invocation entries, gRPC, the LLM gateway, /metrics);
    `cached_principal` is its first step, callable alone by a fast path that must not wait."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        # The one cache: principals of API keys verified moments ago, by the Authorization
        # header's text (no parsing or hashing on a hit): header -> (principal, key hash,
        # answered until, on the monotonic clock).
        self._known: dict[str, tuple[Principal, str, float]] = {}
        #: key lookups under way, by header: requests arriving together share one query
        self._lookups: dict[str, _Lookup] = {}
        self._jwks: jwt.PyJWKSet | None = None
        self._jwks_loaded_at = 0.0
        self._jwks_lock = asyncio.Lock()
        #: set once the server's secret key is loaded (lifespan.py); None: tokens are refused
        self.invocation_tokens: InvocationTokens | None = None
        #: set once the database is open (lifespan.py): suspended accounts are refused
        self.suspensions: Suspensions | None = None

    def forget(self, key_hash: str) -> None:
        """Forget a revoked key at once instead of waiting for its memory to expire."""
        for header in [h for h, (_, kh, _) in self._known.items() if kh == key_hash]:
            del self._known[header]

    async def authenticate(
        self,
        sessions: async_sessionmaker[AsyncSession],
        authorization: str | None,
        *,
        invocation: bool = False,
    ) -> Principal:
        """The caller of a request. An invocation token is accepted only when `invocation`
        (where NVCF takes `invoke_function`: the invocation entries, the asset routes and the
        token routes): anywhere else it is a 403, so a route refuses tokens unless it says
        otherwise."""
        if not authorization:
            raise Unauthorized(detail="missing Authorization header", headers=_BEARER)
        known = self._known.get(authorization)
        if known is not None and known[2] > time.monotonic():
            return known[0]
        scheme, _, credential = authorization.partition(" ")
        credential = credential.strip()
        if scheme.lower() != "bearer" or not credential:
            raise Unauthorized(
                detail="Authorization header must be 'Bearer <credential>'", headers=_BEARER
            )
        if credential.startswith(API_KEY_PREFIX):
            return await self._api_key(sessions, authorization, credential)
        if is_invocation_token(credential):
            principal = self._invocation_token(credential)
            if not invocation:
                raise Forbidden(detail=NOT_AN_INVOCATION_ROUTE)
            return principal
        return await self._jwt(credential)

    def _invocation_token(self, token: str) -> Principal:
        if self.invocation_tokens is None:
            raise Unauthorized(
                detail="invocation tokens are not accepted by this process", headers=_BEARER
            )
        holder = self.invocation_tokens.verify(token)
        return Principal(
            account_id=holder.account_id,
            scopes=frozenset({INVOKE_FUNCTION}),
            kind=INVOCATION_TOKEN,
            subject=holder.client_id,
            grant=holder.grant,
            expires_at=holder.expires_at,  # a token it asks for never outlives it
        )

    def cached_principal(self, authorization: str | None) -> Principal | None:
        """The principal of an API key `authenticate` verified moments ago (by the same
        header) and still valid, else None: the first step of `authenticate`, alone.

        Never raises and never touches the database: callers on a fast path fall back to
        `authenticate` (which gives the proper 401) whenever this returns None. A header is
        answered from memory for `KNOWN_SECONDS` (never within `EXPIRY_MARGIN_SECONDS` of its
        key's expiry; a revocation in this process forgets it at once).
        """
        if not authorization:
            return None
        known = self._known.get(authorization)
        if known is not None and known[2] > time.monotonic():
            return known[0]
        return None

    async def _api_key(
        self, sessions: async_sessionmaker[AsyncSession], authorization: str, key: str
    ) -> Principal:
        """The key's principal, looked up once for every request that asks for it meanwhile
        (a burst when a known header expires would otherwise be a burst of queries)."""
        lookup = self._lookups.get(authorization)
        if lookup is None:
            future = asyncio.ensure_future(self._look_up(sessions, authorization, key))
            lookup = self._lookups[authorization] = _Lookup(future)
            future.add_done_callback(functools.partial(self._looked_up, authorization, lookup))
        lookup.waiters += 1
        try:
            return await asyncio.shield(lookup.future)
        finally:
            lookup.waiters -= 1
            if lookup.waiters == 0 and not lookup.future.done():
                lookup.future.cancel()  # every request that wanted it went away: so does the query

    def _looked_up(
        self, authorization: str, lookup: _Lookup, future: asyncio.Future[Principal]
    ) -> None:
        if self._lookups.get(authorization) is lookup:
            del self._lookups[authorization]
        if not future.cancelled():
            future.exception()  # retrieved: every waiter may have gone

    async def _look_up(
        self, sessions: async_sessionmaker[AsyncSession], authorization: str, key: str
    ) -> Principal:
        key_hash = hash_key(key)
        async with sessions() as session:
            row = await repository.key_by_hash(session, key_hash)
        if row is None:
            raise Unauthorized(detail="unknown API key", headers=_BEARER)
        principal = Principal(
            account_id=row.account_id,
            scopes=frozenset(str(s) for s in row.scopes),
            kind="api-key",
            subject=str(row.id),
            functions=(
                frozenset(uuid.UUID(str(f)) for f in row.functions)
                if row.functions is not None
                else None
            ),
            expires_at=row.expires_at,
        )
        remember = KNOWN_SECONDS
        if row.expires_at is not None:
            left = (row.expires_at - utcnow()).total_seconds()
            if left <= 0:
                raise Unauthorized(detail="API key has expired", headers=_BEARER)
            remember = min(remember, left - EXPIRY_MARGIN_SECONDS)
        if remember > 0:
            if len(self._known) >= KNOWN_MAX:
                self._known.clear()
            self._known[authorization] = (principal, key_hash, time.monotonic() + remember)
        return principal

    async def _jwt(self, token: str) -> Principal:
        s = self._settings
        if s.jwt_secret is None and s.jwks_url is None and s.jwks_file is None:
            raise Unauthorized(
                detail="credential is not an API key and JWT verification is not configured",
                headers=_BEARER,
            )
        try:
            header = jwt.get_unverified_header(token)
        except (jwt.PyJWTError, RecursionError):  # the header is unauthenticated input
            raise Unauthorized(detail="credential is not a valid JWT", headers=_BEARER) from None
        alg = header.get("alg")
        options: Options = {"require": ["exp"]}
        try:
            if alg == "HS256":
                if s.jwt_secret is None:
                    raise Unauthorized(
                        detail="HS256 tokens are not accepted (no secret configured)",
                        headers=_BEARER,
                    )
                claims = jwt.decode(
                    token,
                    s.jwt_secret.get_secret_value(),
                    algorithms=["HS256"],
                    options=options,
                )
            elif alg in ("RS256", "ES256"):
                key = await self._signing_key(header.get("kid"), alg)
                claims = jwt.decode(token, key, algorithms=[alg], options=options)
            else:
                raise Unauthorized(detail=f"JWT algorithm '{alg}' is not accepted", headers=_BEARER)
        except jwt.ExpiredSignatureError:
            raise Unauthorized(detail="JWT has expired", headers=_BEARER) from None
        except jwt.MissingRequiredClaimError as exc:
            raise Unauthorized(
                detail=f"JWT is missing the '{exc.claim}' claim", headers=_BEARER
            ) from None
        except jwt.InvalidSignatureError:
            raise Unauthorized(detail="JWT signature is invalid", headers=_BEARER) from None
        except jwt.PyJWTError as exc:
            raise Unauthorized(detail=f"JWT rejected: {exc}", headers=_BEARER) from None
        except RecursionError:
            raise Unauthorized(detail="JWT claims are nested too deeply", headers=_BEARER) from None
        # Claims are input like any body: no NUL, no lone surrogate, bounded nesting. The
        # token is authentic; what it says cannot be used: a 400 naming the claim.
        claim_errors = json_errors(claims, root="jwt", prefix="jwt")
        if claim_errors:
            raise ValidationFailed.of(claim_errors, "JWT")
        account_claim = "ncaId" if claims.get("ncaId") else "sub"
        account = claims.get(account_claim)
        if not isinstance(account, str) or not account:
            raise Unauthorized(
                detail="JWT has neither an 'ncaId' nor a 'sub' claim", headers=_BEARER
            )
        if len(account) > MAX_ACCOUNT_ID:
            err = FieldError(
                f"jwt.{account_claim}",
                f"names an account id of {len(account)} characters; at most "
                f"{MAX_ACCOUNT_ID} are allowed",
            )
            raise ValidationFailed.of([err], "JWT")
        raw_scopes = claims.get("scopes", claims.get("scope", []))
        if isinstance(raw_scopes, str):
            raw_scopes = raw_scopes.split()
        if not isinstance(raw_scopes, list):
            raise Unauthorized(detail="JWT 'scopes' claim must be a list", headers=_BEARER)
        # An identity provider speaks for tenants, not for the operator of this server.
        granted = frozenset(str(x) for x in raw_scopes) - frozenset(OPERATOR_SCOPES)
        return Principal(
            account_id=account,
            scopes=granted,
            kind="jwt",
            subject=str(claims.get("sub", account)),
        )

    async def _signing_key(self, kid: Any, alg: str) -> Any:
        """The JWKS key `kid` names, which must be a key of the header's algorithm: the header
        is unauthenticated, and an RSA key handed to the ES256 verifier (or the reverse) is
        not a signature failure but a crash in the crypto library."""
        if kid is not None and not isinstance(kid, str):
            raise Unauthorized(detail="JWT key id ('kid') must be a string", headers=_BEARER)
        jwks = await self._load_jwks()
        found = [k for k in jwks.keys if kid is None or k.key_id == kid]
        if not found and kid is not None:
            # An unknown kid may mean the issuer rotated keys: reload once.
            jwks = await self._load_jwks(force=True)
            found = [k for k in jwks.keys if k.key_id == kid]
        if not found:
            raise Unauthorized(detail=f"JWT key id '{kid}' is not in the JWKS", headers=_BEARER)
        for k in found:
            if k.algorithm_name == alg:
                return k.key
        which = "no key of the JWKS is" if kid is None else f"JWKS key '{kid}' is not"
        raise Unauthorized(detail=f"JWT algorithm '{alg}': {which} an {alg} key", headers=_BEARER)

    async def _load_jwks(self, force: bool = False) -> jwt.PyJWKSet:
        async with self._jwks_lock:
            fresh = time.monotonic() - self._jwks_loaded_at < 300
            if self._jwks is not None and fresh and not force:
                return self._jwks
            s = self._settings
            try:
                if s.jwks_file is not None:
                    text = await asyncio.to_thread(Path(s.jwks_file).read_text)
                    data = json.loads(text)
                else:
                    assert s.jwks_url is not None
                    async with httpx.AsyncClient(timeout=10) as client:
                        resp = await client.get(s.jwks_url)
                        resp.raise_for_status()
                        data = resp.json()
                self._jwks = jwt.PyJWKSet.from_dict(data)
            except Exception as exc:  # the JWKS is an upstream: any failure means "cannot verify"
                raise Unauthorized(
                    detail=f"cannot load the JWKS to verify the token: {exc}", headers=_BEARER
                ) from None
            self._jwks_loaded_at = time.monotonic()
            return self._jwks
