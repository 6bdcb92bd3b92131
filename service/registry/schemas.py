"""Request and response shapes of the registry credentials API (api.md §5, NVCF's shape).

The secret is write-only: `secret.value` (base64 of `user:password`, as nvcf-cli sends it) is
in the request models and in no response model. The request models declare every field rule
once: pydantic checks the bodies with them (service.py) and the OpenAPI document shows them.
"""

from __future__ import annotations

import base64
import binascii
import re
import uuid
from typing import Annotated, ClassVar, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from service.core.schemas import MAX_SECRET_VALUE, SECRET_NAME_RE, CamelModel, Tags, Timestamp
from service.core.validation import Expect, OneOf, RequestModel, Rules, matches
from service.registry.hostnames import normalize_hostname
from service.registry.models import HOSTNAME_MAX, NAME_MAX, ArtifactType, ProvisionedBy

USERNAME_MAX = 255
DESCRIPTION_MAX = 256
ARTIFACT_TYPES: tuple[str, ...] = tuple(t.value for t in ArtifactType)
PROVISIONED_BY: tuple[str, ...] = tuple(p.value for p in ProvisionedBy)

_BASE64_RE = re.compile(r"^[A-Za-z0-9+/]*={0,2}$")


class Login(NamedTuple):
    """A decoded `secret.value`."""

    username: str
    password: str

    def __repr__(self) -> str:
        return f"Login(username={self.username!r}, password=<hidden>)"


def decode_login(value: str) -> tuple[Login | None, list[str]]:
    """`base64("user:password")` → the login, or every problem found.

    Standard base64 alphabet, padding optional (as Java's decoder, which NVCF uses, accepts
    it). The password is everything after the first ':' (it may hold ':'; the user name
    cannot). Messages never quote the value or anything decoded from it, not even a length.
    """
    digits = value.rstrip("=")
    if not _BASE64_RE.match(value) or len(digits) % 4 == 1:
        return None, [
            "must be the standard base64 encoding of 'username:password' (alphabet A-Z a-z "
            "0-9 + /, no spaces or line breaks), e.g. the output of "
            "`echo -n 'user:password' | base64 -w0`"
        ]
    try:
        raw = base64.b64decode(digits + "=" * (-len(digits) % 4), validate=True)
        text = raw.decode("utf-8")
    except (binascii.Error, ValueError):
        return None, ["must be the base64 encoding of UTF-8 text 'username:password'"]
    username, colon, password = text.partition(":")
    if not colon:
        return None, ["must decode to 'username:password': there is no ':' after the user name"]
    problems: list[str] = []
    if not username:
        problems.append("the user name before the ':' must not be empty")
    elif len(username) > USERNAME_MAX:
        problems.append(f"the user name must be at most {USERNAME_MAX} characters")
    elif not username.isprintable():
        problems.append("the user name must contain only printable characters")
    elif username != username.strip():
        problems.append("the user name must not start or end with whitespace")
    if not password:
        problems.append("the password after the ':' must not be empty")
    elif any(ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 for ch in password):
        # A pasted trailing newline (`echo` without -n) would otherwise fail every pull later.
        problems.append("the password must not contain control characters such as line breaks")
    if problems:
        return None, problems
    return Login(username, password), []


def _secret_value(value: str) -> tuple[str, list[str]]:
    if not 1 <= len(value) <= MAX_SECRET_VALUE:  # never the length of a secret
        return value, [f"must be 1 to {MAX_SECRET_VALUE} characters"]
    return value, decode_login(value)[1]


def _hostname(value: str) -> tuple[str, list[str]]:
    normal, problems = normalize_hostname(value)
    return (normal if normal is not None else value), problems


Hostname = Annotated[
    str,
    Rules(_hostname, {"minLength": 1, "maxLength": HOSTNAME_MAX}),
    Field(
        description="host[:port], no scheme, path or user info; stored lower-cased",
        examples=["nvcr.io", "registry.example.com:5000"],
    ),
]
SecretName = Annotated[
    str,
    Field(min_length=1, max_length=NAME_MAX, examples=["credentials"]),
    matches(
        SECRET_NAME_RE.pattern,
        "'{value}' must start with a letter or digit and contain only letters, digits, "
        "'_', '.' and '-'",
    ),
]
SecretValue = Annotated[
    str,
    Expect((str,), "must be a string: the base64 encoding of 'username:password'"),
    Rules(
        _secret_value,
        {
            "minLength": 1,
            "maxLength": MAX_SECRET_VALUE,
            "description": "base64 of 'username:password'; write-only, stored encrypted",
            "examples": ["cm9ib3Q6czNjcjN0"],
        },
    ),
]
ArtifactTypeName = Annotated[str, OneOf(ARTIFACT_TYPES)]
ArtifactTypes = Annotated[
    list[ArtifactTypeName],
    Field(min_length=1),
    Expect((list,), f"must be a list of artifact types ({', '.join(ARTIFACT_TYPES)})"),
]
Description = Annotated[str, Field(max_length=DESCRIPTION_MAX)]


class RegistrySecretIn(RequestModel):
    """`secret`: the credential's name and `base64("user:password")`."""

    name: SecretName
    value: SecretValue = Field(repr=False)

    shape: ClassVar[str] = "with name and value"

    def login(self) -> Login:
        login, problems = decode_login(self.value)
        assert login is not None and not problems  # checked by the model
        return login


class RegistryCredentialCreate(RequestModel):
    """Body of `POST /registry-credentials` (what `nvcf-cli registry-credential add` sends)."""

    registry_hostname: Hostname
    secret: RegistrySecretIn
    artifact_types: ArtifactTypes
    tags: Tags | None = None
    description: Description | None = None


class RegistryCredentialUpdate(RequestModel):
    """Body of `PATCH /registry-credentials/{id}`: a new secret, artifact types to ADD to the
    credential's (never removed), or both. Null is the same as absent, as in NVCF."""

    model_config = ConfigDict(json_schema_extra={"minProperties": 1})

    secret: RegistrySecretIn | None = None
    artifact_type_enums: (
        Annotated[
            list[ArtifactTypeName],
            Expect((list,), f"must be a list of artifact types ({', '.join(ARTIFACT_TYPES)})"),
        ]
        | None
    ) = None


# --- responses --------------------------------------------------------------------------


class RegistryCredentialOut(CamelModel):
    """NVCF's RegistryCredentialDetailsDto (never the secret)."""

    registry_credential_id: uuid.UUID
    nca_id: str
    registry_credential_name: str
    registry_name: str
    registry_hostname: str
    artifact_types: list[str]
    tags: list[str] | None = None
    description: str | None = None
    provisioned_by: str
    key_type: str | None = Field(
        default=None,
        description="'LEGACY' for an NGC credential whose API key is not an 'nvapi-' key",
    )
    last_updated_at: Timestamp
    created_at: Timestamp


class RegistryCredentialEnvelope(CamelModel):
    registry_credential: RegistryCredentialOut


class RegistryCredentialList(CamelModel):
    registry_credentials: list[RegistryCredentialOut]
    next_cursor: str | None = None


class RecognizedRegistry(BaseModel):
    name: str
    hostname: str


class RecognizedRegistries(CamelModel):
    """Per artifact type (CONTAINER, HELM, MODEL, RESOURCE), the recognized registries."""

    recognized_registries: dict[str, list[RecognizedRegistry]]
