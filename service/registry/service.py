"""Registry credentials: validation, storage (password encrypted), and look-ups for pulls.

Services flush; the request's transaction commits.

Rules (api.md §5, decided here where the spec is silent), declared once by the request models
of schemas.py (the hostname grammar is hostnames.py) and checked by pydantic:

- `registryHostname` is `host[:port]`, stored lower-cased: a DNS name, an IPv4 literal or a
  bracketed IPv6 literal (`[::1]:5000`), optional port 1-65535; no scheme, path, query,
  fragment or user info. A value with a scheme gets a message saying to drop it.
- `username`: 1-255 printable characters, no `:` (it cannot be sent in HTTP basic auth), no
  leading or trailing whitespace.
- `password`: 1-4096 characters without control characters (a pasted trailing newline would
  otherwise fail every pull later). Write-only: never returned, never in a message or log.
- `description`: optional, at most 256 characters; `""` or (in PATCH) `null` removes it.
- Unique per (account, registryHostname, username): a second one is a 409 naming both.
  `nvcr.io` and `nvcr.io:443` are different hostnames.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from service.core.crypto import SecretBox
from service.core.db import utcnow
from service.core.errors import Conflict, FieldError, NotFound, ValidationFailed
from service.core.http import require_json_object
from service.core.pagination import Page, keyset_page
from service.core.validation import parse
from service.registry.hostnames import normalize_hostname, split_host_port
from service.registry.models import RegistryCredential
from service.registry.schemas import RegistryCredentialCreate, RegistryCredentialUpdate

log = logging.getLogger("nvcf.registry")

FIELDS = ("registryHostname", "username", "password", "description")

# --------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class CredentialSpec:
    """A validated create request."""

    registry_hostname: str
    username: str
    password: str = ""
    description: str | None = None

    def __repr__(self) -> str:
        return (
            f"CredentialSpec(registry_hostname={self.registry_hostname!r}, "
            f"username={self.username!r}, password=<hidden>)"
        )


@dataclass(frozen=True)
class CredentialUpdate:
    """A validated PATCH: None means "keep"; `clear_description` removes the description."""

    registry_hostname: str | None = None
    username: str | None = None
    password: str | None = None
    description: str | None = None
    clear_description: bool = False

    def __repr__(self) -> str:
        return (
            f"CredentialUpdate(registry_hostname={self.registry_hostname!r}, "
            f"username={self.username!r}, password={'<hidden>' if self.password else None})"
        )


def validate_create(raw: Any) -> CredentialSpec:
    """Validate a create body, or raise with every violation. Unknown fields are ignored."""
    model, errors = parse(RegistryCredentialCreate, require_json_object(raw))
    if errors or model is None:
        raise ValidationFailed.of(errors, what="registry credential")
    return CredentialSpec(
        registry_hostname=model.registry_hostname,
        username=model.username,
        password=model.password,
        description=model.description or None,
    )


def validate_update(raw: Any) -> CredentialUpdate:
    """Validate a PATCH body: at least one field; `null` only removes the description."""
    body = require_json_object(raw)
    model, errors = parse(RegistryCredentialUpdate, body)
    if not any(k in body for k in FIELDS):
        errors.insert(0, FieldError("body", f"at least one of {', '.join(FIELDS)} is required"))
    if errors or model is None:
        raise ValidationFailed.of(errors, what="registry credential")
    description = model.description or None
    return CredentialUpdate(
        registry_hostname=model.registry_hostname,
        username=model.username,
        password=model.password,
        description=description,
        clear_description="description" in body and description is None,
    )


# --------------------------------------------------------------------------- storage


def _conflict(host: str, username: str, existing: uuid.UUID | None) -> Conflict:
    which = f" (id {existing})" if existing is not None else ""
    return Conflict(
        detail=f"a registry credential for registry '{host}' and username '{username}' "
        f"already exists{which}; change it with PATCH or delete it first"
    )


async def _find(
    session: AsyncSession, account_id: str, host: str, username: str
) -> RegistryCredential | None:
    stmt = select(RegistryCredential).where(
        RegistryCredential.account_id == account_id,
        RegistryCredential.registry_hostname == host,
        RegistryCredential.username == username,
    )
    return (await session.execute(stmt)).scalar_one_or_none()


async def _flush_unique(session: AsyncSession, host: str, username: str) -> None:
    try:
        await session.flush()
    except IntegrityError:
        # A concurrent request stored the same (host, username) first; the request's
        # transaction is rolled back by the error.
        raise _conflict(host, username, None) from None


async def count_credentials(session: AsyncSession, account_id: str) -> int:
    stmt = (
        select(func.count())
        .select_from(RegistryCredential)
        .where(RegistryCredential.account_id == account_id)
    )
    return int((await session.execute(stmt)).scalar_one())


async def create_credential(
    session: AsyncSession, *, account_id: str, spec: CredentialSpec, box: SecretBox
) -> RegistryCredential:
    existing = await _find(session, account_id, spec.registry_hostname, spec.username)
    if existing is not None:
        raise _conflict(spec.registry_hostname, spec.username, existing.id)
    now = utcnow()
    cred = RegistryCredential(
        id=uuid.uuid4(),
        account_id=account_id,
        registry_hostname=spec.registry_hostname,
        username=spec.username,
        password_ciphertext=box.encrypt(spec.password),
        description=spec.description,
        created_at=now,
        updated_at=now,
    )
    session.add(cred)
    await _flush_unique(session, spec.registry_hostname, spec.username)
    return cred


async def get_credential(
    session: AsyncSession, account_id: str, credential_id: uuid.UUID
) -> RegistryCredential:
    cred = await session.get(RegistryCredential, credential_id)
    if cred is None or cred.account_id != account_id:
        raise NotFound(detail=f"registry credential {credential_id} not found")
    return cred


async def list_credentials(
    session: AsyncSession, account_id: str, *, page: Page
) -> tuple[Sequence[RegistryCredential], str | None]:
    stmt = select(RegistryCredential).where(RegistryCredential.account_id == account_id)
    return await keyset_page(
        session,
        stmt,
        page,
        created=RegistryCredential.created_at,
        ident=RegistryCredential.id,
        cursor_of=lambda c: (c.created_at, c.id),
    )


async def update_credential(
    session: AsyncSession,
    account_id: str,
    credential_id: uuid.UUID,
    update: CredentialUpdate,
    box: SecretBox,
) -> RegistryCredential:
    cred = await get_credential(session, account_id, credential_id)
    host = update.registry_hostname or cred.registry_hostname
    username = update.username if update.username is not None else cred.username
    if (host, username) != (cred.registry_hostname, cred.username):
        existing = await _find(session, account_id, host, username)
        if existing is not None and existing.id != cred.id:
            raise _conflict(host, username, existing.id)
    cred.registry_hostname = host
    cred.username = username
    if update.password is not None:
        cred.password_ciphertext = box.encrypt(update.password)
    if update.description is not None:
        cred.description = update.description
    elif update.clear_description:
        cred.description = None
    cred.updated_at = utcnow()
    await _flush_unique(session, host, username)
    return cred


async def delete_credential(
    session: AsyncSession, account_id: str, credential_id: uuid.UUID
) -> None:
    cred = await get_credential(session, account_id, credential_id)
    await session.delete(cred)
    await session.flush()


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
    session: AsyncSession, account_id: str, host: str, *, box: SecretBox
) -> list[tuple[str, str]]:
    """Decrypted (username, password) pairs of the account for pulls from `host[:port]`.

    A credential applies when its hostname equals `host[:port]` exactly, or when it has no port
    and equals the host part. Ordered by creation (oldest first). Credentials that the
    configured key cannot decrypt are skipped with a warning (never with their password).
    """
    stmt = (
        select(RegistryCredential)
        .where(
            RegistryCredential.account_id == account_id,
            RegistryCredential.registry_hostname.in_(_host_candidates(host)),
        )
        .order_by(RegistryCredential.created_at, RegistryCredential.id)
    )
    out: list[tuple[str, str]] = []
    for cred in (await session.execute(stmt)).scalars():
        password = _decrypt(box, cred)
        if password is not None:
            out.append((cred.username, password))
    return out


async def all_credentials(
    session: AsyncSession, account_id: str, *, box: SecretBox
) -> list[tuple[str, str, str]]:
    """Every credential of the account as decrypted (registryHostname, username, password),
    ordered by creation: the image pull secrets of a deployment (helm.md §5)."""
    stmt = (
        select(RegistryCredential)
        .where(RegistryCredential.account_id == account_id)
        .order_by(RegistryCredential.created_at, RegistryCredential.id)
    )
    out: list[tuple[str, str, str]] = []
    for cred in (await session.execute(stmt)).scalars():
        password = _decrypt(box, cred)
        if password is not None:
            out.append((cred.registry_hostname, cred.username, password))
    return out
