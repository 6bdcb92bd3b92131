"""Invocation tokens as signed and read (service/auth/tokens.py): what a grant allows, and that
only a token signed with this server's derived key, for our audience, unexpired, is taken."""

from __future__ import annotations

import time
import uuid

import jwt
import pytest
from cryptography.fernet import Fernet

from service.auth.tokens import AUDIENCE, ISSUER, KID, InvocationGrant, InvocationTokens
from service.core.crypto import SecretBox
from service.core.errors import Unauthorized
from tests.support.app import JWT_SECRET

F, G = uuid.UUID(int=1), uuid.UUID(int=2)
V1, V2 = uuid.UUID(int=11), uuid.UUID(int=12)


def test_a_grant_allows_the_named_functions_and_versions_only() -> None:
    grant = InvocationGrant.of([(F, V1), (G, None), (F, V2), (G, V1)])
    assert grant.versions(str(F)) == frozenset({str(V1), str(V2)})
    assert grant.versions(str(G)) == frozenset()  # every version
    assert grant.versions(str(uuid.UUID(int=3))) is None
    assert grant.allows(str(F), str(V1)) and grant.allows(str(F), None)
    assert not grant.allows(str(F), str(uuid.UUID(int=13)))
    assert grant.allows(str(G), str(uuid.UUID(int=99)))
    assert not grant.allows(str(uuid.UUID(int=3)), None)


def test_a_token_round_trips_and_is_bound_to_its_key() -> None:
    box = SecretBox(Fernet.generate_key())
    key = box.derive("nvcf invocation tokens v1")
    assert key != box.derive("another purpose") and len(key) == 32
    tokens = InvocationTokens(key, 60)
    grant = InvocationGrant.of([(F, V1), (G, None)])
    token = tokens.issue("acct", "client-1", grant)
    holder = tokens.verify(token)
    assert (holder.account_id, holder.client_id, holder.grant) == ("acct", "client-1", grant)
    assert jwt.get_unverified_header(token)["kid"] == KID
    with pytest.raises(Unauthorized, match="signature"):
        InvocationTokens(b"k" * 32, 60).verify(token)


@pytest.mark.parametrize(
    "change",
    [
        {"aud": "someone-else"},
        {"iss": "someone-else"},
        {"exp": int(time.time()) - 5},
        {"scope": "admin"},
        {"functions": "everything"},
        {"functions": [{"functionId": "not-a-uuid"}]},
        {"functions": [{"functionId": str(F)}] * 5},
    ],
)
def test_a_token_our_key_signed_but_not_as_we_issue_is_refused(change: dict[str, object]) -> None:
    key = b"s" * 32
    now = int(time.time())
    claims: dict[str, object] = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "c",
        "ncaId": "acct",
        "scope": "invoke_function",
        "functions": [{"functionId": str(F)}],
        "iat": now,
        "exp": now + 60,
        **change,
    }
    token = jwt.encode(claims, key, algorithm="HS256", headers={"kid": KID})
    with pytest.raises(Unauthorized):
        InvocationTokens(key, 60).verify(token)


def test_the_jwt_secret_cannot_mint_invocation_tokens() -> None:
    """A JWT signed with NVCF_JWT_SECRET but marked as an invocation token is verified with
    the derived key only: refused."""
    now = int(time.time())
    claims = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "c",
        "ncaId": "acct",
        "scope": "invoke_function",
        "functions": [{"functionId": str(F)}],
        "iat": now,
        "exp": now + 60,
    }
    forged = jwt.encode(claims, JWT_SECRET, algorithm="HS256", headers={"kid": KID})
    with pytest.raises(Unauthorized, match="signature"):
        InvocationTokens(b"d" * 32, 60).verify(forged)
