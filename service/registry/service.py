"""Registry credentials: validation, storage (password encrypted), and look-ups for pulls.

Services flush; the request's transaction commits.

Rules (api.md §5 in NVCF's shape; decided here where the spec is silent), declared once by the
request models of schemas.py (the hostname grammar is hostnames.py) and checked by pydantic:

- `registryHostname` is `host[:port]`, stored lower-cased: a DNS name, an IPv4 literal or a
  bracketed IPv6 literal (`[::1]:5000`), optional port 1-65535; no scheme, path, query,
  fragment or user info. Any registry is accepted (NVCF only takes its recognized ones);
  `registryName` says which recognized registry it is, or `Custom Registry`.
- `secret.name` (the `registryCredentialName`): 1-48 letters, digits, `_`, `.`, `-`, starting
  with a letter or digit. nvcf-cli always sends `credentials`.
- `secret.value`: base64 of `user:password` (standard alphabet, padding optional). The user
  name: 1-255 printable characters without ':' or surrounding whitespace; the password: not
  empty, no control characters; NGC hosts (`nvcr.io`, `*.ngc.nvidia.com`) take only the user
  `$oauthtoken`, as in NVCF. Write-only: never returned, never in a message or log.
- `artifactTypes`: a non-empty list of CONTAINER, HELM, MODEL, RESOURCE (any case, duplicates
  dropped). `HELM` credentials pull charts, `CONTAINER` ones become instances' pull secrets.
- `tags`: as a function's tags; `description`: at most 256 characters.
- Unique per (account, registryHostname, secret.name), as in NVCF: a second one is a 409.
- PATCH sets a new secret (name and login) and/or ADDS `artifactTypeEnums`; hostname, tags
  and description are fixed once created (NVCF's rule).
- SYSTEM-provisioned credentials cannot be deleted through the API (NVCF's rule).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from service.core.crypto import SecretBox
from service.core.db import utcnow
from service.core.errors import BadRequest, Conflict, FieldError, NotFound, ValidationFailed
from service.core.http import require_json_object
from service.core.pagination import Page
from service.core.validation import parse
from service.registry import repository
from service.registry.hostnames import normalize_hostname, split_host_port
from service.registry.models import (
    ArtifactType,
    ProvisionedBy,
    RegistryCredential,
)
from service.registry.recognized import is_ngc, registry_name
from service.registry.schemas import (
    ARTIFACT_TYPES,
    PROVISIONED_BY,
    Login,
    RegistryCredentialCreate,
    RegistryCredentialOut,
    RegistryCredentialUpdate,
)

log = logging.getLogger("nvcf.registry")

NGC_USER = "$oauthtoken"
#: NVCF's keyType of an NGC credential whose API key is not a personal `nvapi-` key
LEGACY_KEY_TYPE = "LEGACY"

# --------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class CredentialSpec:
    """A validated create request."""

    registry_hostname: str
    name: str
    login: Login
    artifact_types: list[ArtifactType]
    tags: list[str] | None = None
    description: str | None = None

    def __repr__(self) -> str:
        return (
            f"CredentialSpec(registry_hostname={self.registry_hostname!r}, name={self.name!r}, "
            f"username={self.login.username!r}, password=<hidden>)"
        )


@dataclass(frozen=True)
class CredentialUpdate:
    """A validated PATCH: a new secret (name and login) and/or artifact types to add."""

    name: str | None = None
    login: Login | None = None
    artifact_types: tuple[ArtifactType, ...] = ()

    def __repr__(self) -> str:
        return (
            f"CredentialUpdate(name={self.name!r}, login={'<hidden>' if self.login else None}, "
            f"artifact_types={[t.value for t in self.artifact_types]})"
        )


@dataclass(frozen=True)
class ListFilters:
    """The `artifactType` and `provisionedBy` filters; None = no filter."""

    artifact_types: frozenset[ArtifactType] | None = None
    provisioned_by: frozenset[ProvisionedBy] | None = None


T = TypeVar("T")
E = TypeVar("E", ArtifactType, ProvisionedBy)


def _unique(values: Iterable[T]) -> list[T]:
    return list(dict.fromkeys(values))


def _ngc_problem(hostname: str, login: Login) -> FieldError | None:
    if is_ngc(hostname) and login.username != NGC_USER:
        return FieldError(
            "secret.value",
            f"NGC registries (nvcr.io, *.ngc.nvidia.com) take the user name '{NGC_USER}' "
            "with an NGC API key as the password: send base64('$oauthtoken:<key>')",
        )
    return None


def validate_create(raw: Any) -> CredentialSpec:
    """Validate a create body, or raise with every violation. Unknown fields are ignored."""
    model, errors = parse(RegistryCredentialCreate, require_json_object(raw))
    if model is not None:
        problem = _ngc_problem(model.registry_hostname, model.secret.login())
        if problem is not None:
            errors.append(problem)
    if errors or model is None:
        raise ValidationFailed.of(errors, what="registry credential")
    return CredentialSpec(
        registry_hostname=model.registry_hostname,
        name=model.secret.name,
        login=model.secret.login(),
        artifact_types=_unique(ArtifactType(t) for t in model.artifact_types),
        tags=None if model.tags is None else _unique(model.tags),
        description=model.description or None,
    )


def validate_update(raw: Any) -> CredentialUpdate:
    """Validate a PATCH body: a secret, artifact types to add, or both (NVCF's rule)."""
    model, errors = parse(RegistryCredentialUpdate, require_json_object(raw))
    if model is not None and model.secret is None and not model.artifact_type_enums:
        errors.append(
            FieldError(
                "body",
                "either secret or artifactTypeEnums (the artifact types to add) is required",
            )
        )
    if errors or model is None:
        raise ValidationFailed.of(errors, what="registry credential")
    return CredentialUpdate(
        name=model.secret.name if model.secret is not None else None,
        login=model.secret.login() if model.secret is not None else None,
        artifact_types=tuple(_unique(ArtifactType(t) for t in model.artifact_type_enums or ())),
    )


def _enum_filter(
    values: Sequence[str] | None, field: str, kind: type[E], allowed: tuple[str, ...]
) -> tuple[frozenset[E] | None, list[FieldError]]:
    """Repeated (`?a=X&a=Y`) and comma-separated (`?a=X,Y`) values, any case, as Spring reads
    NVCF's `Set<Enum>` query parameters; none given = no filter."""
    if not values:
        return None, []
    items = [v.strip() for value in values for v in value.split(",") if v.strip()]
    if not items:
        return None, []
    out: set[E] = set()
    errors: list[FieldError] = []
    for item in items:
        if item.upper() in allowed:
            out.add(kind(item.upper()))
        else:
            errors.append(FieldError(field, f"must be one of {', '.join(allowed)}, got '{item}'"))
    return frozenset(out), errors


def parse_filters(
    artifact_type: Sequence[str] | None, provisioned_by: Sequence[str] | None
) -> ListFilters:
    types, errors = _enum_filter(artifact_type, "artifactType", ArtifactType, ARTIFACT_TYPES)
    who, more = _enum_filter(provisioned_by, "provisionedBy", ProvisionedBy, PROVISIONED_BY)
    errors += more
    if errors:
        raise ValidationFailed.of(errors)
    return ListFilters(artifact_types=types, provisioned_by=who)


# --------------------------------------------------------------------------- responses


def _key_type(cred: RegistryCredential, box: SecretBox) -> str | None:
    """NVCF's `keyType`: LEGACY for an NGC `$oauthtoken` login whose key is not `nvapi-`."""
    if not is_ngc(cred.registry_hostname) or cred.username != NGC_USER:
        return None
    password = _decrypt(box, cred)
    if password is None or password.startswith("nvapi-"):
        return None
    return LEGACY_KEY_TYPE


def describe(cred: RegistryCredential, box: SecretBox) -> RegistryCredentialOut:
    """The credential as NVCF's RegistryCredentialDetailsDto (never its secret)."""
    return RegistryCredentialOut(
        registry_credential_id=cred.id,
        nca_id=cred.account_id,
        registry_credential_name=cred.name,
        registry_name=registry_name(cred.registry_hostname),
        registry_hostname=cred.registry_hostname,
        artifact_types=[t.value for t in cred.artifact_types],
        tags=cred.tags,
        description=cred.description,
        provisioned_by=cred.provisioned_by,
        key_type=_key_type(cred, box),
        last_updated_at=cred.updated_at,
        created_at=cred.created_at,
    )


# --------------------------------------------------------------------------- storage


def _conflict(host: str, name: str, existing: uuid.UUID | None) -> Conflict:
    which = f" (id {existing})" if existing is not None else ""
    return Conflict(
        detail=f"a registry credential named '{name}' for registry '{host}' already exists"
        f"{which}: registry credentials must have a unique hostname and secret.name within "
        "an account; use another secret.name, or change that credential with PATCH"
    )


async def _flush_unique(session: AsyncSession, host: str, name: str) -> None:
    try:
        await session.flush()
    except IntegrityError:
        # A concurrent request stored the same (host, name) first; the request's
        # transaction is rolled back by the error.
        raise _conflict(host, name, None) from None


async def count_credentials(session: AsyncSession, account_id: str) -> int:
    return await repository.count(session, account_id)


async def create_credential(
    session: AsyncSession,
    *,
    account_id: str,
    spec: CredentialSpec,
    box: SecretBox,
    provisioned_by: ProvisionedBy = ProvisionedBy.USER,
) -> RegistryCredential:
    existing = await repository.find(session, account_id, spec.registry_hostname, spec.name)
    if existing is not None:
        raise _conflict(spec.registry_hostname, spec.name, existing.id)
    now = utcnow()
    cred = RegistryCredential(
        id=uuid.uuid4(),
        account_id=account_id,
        registry_hostname=spec.registry_hostname,
        name=spec.name,
        username=spec.login.username,
        password_ciphertext=box.encrypt(spec.login.password),
        description=spec.description,
        tags=spec.tags,
        provisioned_by=provisioned_by.value,
        created_at=now,
        updated_at=now,
        artifact_type_rows=[],
    )
    cred.add_artifact_types(spec.artifact_types)
    session.add(cred)
    await _flush_unique(session, spec.registry_hostname, spec.name)
    log.info(
        "registry credential %s '%s' for %s added (account %s)",
        cred.id,
        cred.name,
        cred.registry_hostname,
        account_id,
    )
    return cred


async def get_credential(
    session: AsyncSession, account_id: str, credential_id: uuid.UUID
) -> RegistryCredential:
    cred = await repository.by_id(session, credential_id)
    if cred is None or cred.account_id != account_id:
        raise NotFound(detail=f"registry credential {credential_id} not found")
    return cred


async def list_credentials(
    session: AsyncSession,
    account_id: str,
    *,
    page: Page,
    filters: ListFilters | None = None,
) -> tuple[Sequence[RegistryCredential], str | None]:
    """The account's credentials, oldest first; a credential passes the artifact type filter
    when it has any of the types asked for (as in NVCF)."""
    filters = filters or ListFilters()
    return await repository.page(
        session,
        account_id,
        page,
        artifact_types=filters.artifact_types,
        provisioned_by=filters.provisioned_by,
    )


async def update_credential(
    session: AsyncSession,
    account_id: str,
    credential_id: uuid.UUID,
    update: CredentialUpdate,
    box: SecretBox,
) -> RegistryCredential:
    cred = await get_credential(session, account_id, credential_id)
    if update.login is not None:
        problem = _ngc_problem(cred.registry_hostname, update.login)
        if problem is not None:
            raise ValidationFailed.of([problem], what="registry credential")
    if update.name is not None and update.name != cred.name:
        existing = await repository.find(session, account_id, cred.registry_hostname, update.name)
        if existing is not None:
            raise _conflict(cred.registry_hostname, update.name, existing.id)
        cred.name = update.name
    if update.login is not None:
        cred.username = update.login.username
        cred.password_ciphertext = box.encrypt(update.login.password)
    cred.add_artifact_types(list(update.artifact_types))
    cred.updated_at = utcnow()
    await _flush_unique(session, cred.registry_hostname, cred.name)
    log.info("registry credential %s updated (account %s)", cred.id, account_id)
    return cred


async def delete_credential(
    session: AsyncSession, account_id: str, credential_id: uuid.UUID
) -> None:
    cred = await get_credential(session, account_id, credential_id)
    if cred.provisioned_by == ProvisionedBy.SYSTEM:
        raise BadRequest(
            detail=f"registry credential {credential_id} is provisioned by the system "
            "(provisionedBy SYSTEM) and cannot be deleted"
        )
    await repository.delete(session, cred)
    await session.flush()
    log.info("registry credential %s deleted (account %s)", credential_id, account_id)


# --------------------------------------------------------------------------- pulls


def _decrypt(box: SecretBox, cred: RegistryCredential) -> str | None:
    try:
        return box.decrypt(cred.password_ciphertext)
    except ValueError:
        log.warning(
            "registry credential %s (%s, account %s) cannot be decrypted with the configured "
            "secrets key; skipped",
            cred.id,
            cred.registry_hostname,
            cred.account_id,
        )
        return None


def _host_candidates(host: str) -> list[str]:
    """The stored hostnames that apply to a pull from `host[:port]`."""
    normal, problems = normalize_hostname(host.strip())
    value = normal if not problems and normal is not None else host.strip().lower()
    hostname, port = split_host_port(value)
    return [value] if port is None else [value, hostname]


async def credentials_for_host(
    session: AsyncSession,
    account_id: str,
    host: str,
    *,
    box: SecretBox,
    artifact_type: ArtifactType,
) -> list[tuple[str, str]]:
    """Decrypted (username, password) pairs of the account's `artifact_type` credentials for
    pulls from `host[:port]` (charts: HELM).

    A credential applies when its hostname equals `host[:port]` exactly, or when it has no port
    and equals the host part. Ordered by creation (oldest first). Credentials that the
    configured key cannot decrypt are skipped with a warning (never with their password).
    """
    out: list[tuple[str, str]] = []
    creds = await repository.of_type(
        session, account_id, artifact_type, hosts=_host_candidates(host)
    )
    for cred in creds:
        password = _decrypt(box, cred)
        if password is not None:
            out.append((cred.username, password))
    return out


async def all_credentials(
    session: AsyncSession, account_id: str, *, box: SecretBox, artifact_type: ArtifactType
) -> list[tuple[str, str, str]]:
    """Every `artifact_type` credential of the account as decrypted (registryHostname,
    username, password), ordered by creation: with CONTAINER, the image pull secrets of a
    deployment (helm.md §5)."""
    out: list[tuple[str, str, str]] = []
    for cred in await repository.of_type(session, account_id, artifact_type):
        password = _decrypt(box, cred)
        if password is not None:
            out.append((cred.registry_hostname, cred.username, password))
    return out
