"""Invocation tokens (NVCF's invocation assertion tokens): short-lived signed credentials that
may invoke the functions they name and nothing else.

An account that may invoke a function asks for a token naming it (invocation/tokens.py, up to
four functions, or none; a function without a version means all of its versions) and hands
the token to a browser or a partner instead of its API key. A token is a JWT (HS256, PyJWT)
signed with a key derived from the server's secret key (`SecretBox.derive`): it needs no JWT
setting, and every replica sharing the secret key (the data directory or `NVCF_SECRETS_KEY`)
verifies it. Its header's `kid` marks it as ours; its claims are the issuing account
(`ncaId`), the client id (`sub`), the scope, the functions, and an expiry
`NVCF_INVOKE_TOKEN_SECONDS` away.

The authenticator (service.py) turns a token into a principal carrying an `InvocationGrant`.
Only the routes where NVCF takes `invoke_function` accept such a principal (`authenticate(...,
invocation=True)`: the invocation entries, the account's assets, the token routes), and
the invocation plane's admission lets it reach the granted versions only (invocation/routing.py
and access.py). A token is a secret: it is never logged nor stored.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import jwt
from jwt.types import Options

from service.auth.scopes import INVOKE_FUNCTION
from service.core.errors import Unauthorized

#: the `kid` of our tokens' header: a token with it is verified with our key only
KID = "nvcf-invocation-token"
ISSUER = "nvcf-server"
AUDIENCE = "nvcf-invocation"
#: the key derivation's purpose (`SecretBox.derive`)
PURPOSE = "nvcf invocation tokens v1"
#: functions one token may name (NVCF: 4)
MAX_FUNCTIONS = 4
#: the longest client id (it is the token's subject, the worker's NVCF-SUB)
MAX_CLIENT_ID = 128
_BEARER = {"WWW-Authenticate": "Bearer"}


@dataclass(frozen=True)
class InvocationGrant:
    """What an invocation token may invoke: (function id, version ids) pairs, the ids as
    canonical text; no version ids: every version of the function."""

    functions: tuple[tuple[str, frozenset[str]], ...]

    @classmethod
    def of(cls, pairs: Iterable[tuple[uuid.UUID, uuid.UUID | None]]) -> InvocationGrant:
        """The grant of (function, version or None) pairs; a function named without a version
        anywhere in them grants all its versions."""
        merged: dict[str, set[str] | None] = {}
        for function_id, version_id in pairs:
            fid = str(function_id)
            if version_id is None:
                merged[fid] = None
                continue
            if fid not in merged:
                merged[fid] = set()
            versions = merged[fid]
            if versions is not None:
                versions.add(str(version_id))
        return cls(tuple((f, frozenset(v or ())) for f, v in merged.items()))

    def versions(self, function_id: str) -> frozenset[str] | None:
        """The granted versions of a function (empty: all of them); None: not granted."""
        for fid, versions in self.functions:
            if fid == function_id:
                return versions
        return None

    def allows(self, function_id: str, version_id: str | None) -> bool:
        """Whether a request naming this function (and version, when given) may go on; with no
        version, the versions it may reach are the granted ones (`versions`)."""
        versions = self.versions(function_id)
        if versions is None:
            return False
        return not versions or version_id is None or version_id in versions

    def claims(self) -> list[dict[str, str]]:
        return [
            {"functionId": fid, **({"functionVersionId": vid} if vid else {})}
            for fid, versions in self.functions
            for vid in (sorted(versions) or [""])
        ]


@dataclass(frozen=True)
class TokenHolder:
    """What a verified invocation token says."""

    account_id: str
    client_id: str
    grant: InvocationGrant
    expires_at: datetime


def _malformed(what: str) -> Unauthorized:
    return Unauthorized(detail=f"invocation token is malformed: {what}", headers=_BEARER)


def _grant_of(claims: dict[str, Any]) -> InvocationGrant:
    raw = claims.get("functions")
    # empty: a token for the asset routes alone (NVCF issues one for `functions: []`)
    if not isinstance(raw, list) or len(raw) > MAX_FUNCTIONS:
        raise _malformed("its 'functions' claim is not a list of functions")
    pairs: list[tuple[uuid.UUID, uuid.UUID | None]] = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("functionId"), str):
            raise _malformed("an entry of 'functions' names no function")
        version = item.get("functionVersionId")
        try:
            pairs.append(
                (
                    uuid.UUID(item["functionId"]),
                    None if version is None else uuid.UUID(str(version)),
                )
            )
        except ValueError:
            raise _malformed("an entry of 'functions' is not a UUID") from None
    return InvocationGrant.of(pairs)


class InvocationTokens:
    """Issues and verifies invocation tokens with one key, for `lifetime` seconds."""

    def __init__(self, key: bytes, lifetime: int) -> None:
        self._key = key
        self.lifetime = lifetime

    def __repr__(self) -> str:
        return f"InvocationTokens(<key hidden>, lifetime={self.lifetime})"

    def issue(
        self, account_id: str, client_id: str, grant: InvocationGrant, lifetime: int | None = None
    ) -> str:
        """A token valid `lifetime` seconds (at most, and by default, this issuer's)."""
        now = int(time.time())
        lifetime = self.lifetime if lifetime is None else min(lifetime, self.lifetime)
        claims = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": client_id,
            "ncaId": account_id,
            "scope": INVOKE_FUNCTION,
            "functions": grant.claims(),
            "iat": now,
            "exp": now + lifetime,
            "jti": str(uuid.uuid4()),
        }
        return jwt.encode(claims, self._key, algorithm="HS256", headers={"kid": KID})

    def verify(self, token: str) -> TokenHolder:
        """The holder of a token that is ours, intact and unexpired; else 401."""
        options: Options = {"require": ["exp", "iat", "iss", "aud", "sub"]}
        try:
            claims = jwt.decode(
                token,
                self._key,
                algorithms=["HS256"],
                audience=AUDIENCE,
                issuer=ISSUER,
                options=options,
            )
        except jwt.ExpiredSignatureError:
            raise Unauthorized(
                detail="invocation token has expired; ask for a new one", headers=_BEARER
            ) from None
        except jwt.InvalidSignatureError:
            raise Unauthorized(
                detail="invocation token signature is invalid (not issued by this service, or "
                "its secret key changed)",
                headers=_BEARER,
            ) from None
        except (jwt.PyJWTError, RecursionError) as exc:
            raise Unauthorized(
                detail=f"invocation token rejected: {type(exc).__name__}", headers=_BEARER
            ) from None
        account, client = claims.get("ncaId"), claims.get("sub")
        if not isinstance(account, str) or not account or not isinstance(client, str):
            raise _malformed("it names no account or no client")
        if claims.get("scope") != INVOKE_FUNCTION:
            raise _malformed(f"its scope is not '{INVOKE_FUNCTION}'")
        expires = datetime.fromtimestamp(int(claims["exp"]), UTC)
        return TokenHolder(account, client, _grant_of(claims), expires)


def is_invocation_token(token: str) -> bool:
    """Whether a bearer credential is marked as one of our invocation tokens (unverified)."""
    try:
        header = jwt.get_unverified_header(token)
    except (jwt.PyJWTError, RecursionError):
        return False
    return header.get("kid") == KID
