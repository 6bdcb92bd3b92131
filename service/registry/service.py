"""Registry credentials: validation, storage (password encrypted), and look-ups for pulls.

Services flush; the request's transaction commits.

Rules (api.md §5, decided here where the spec is silent):

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

import ipaddress
import logging
import re
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
from service.core.http import json_kind, require_json_object
from service.core.pagination import Page, keyset_page
from service.core.validation import DNS_LABEL_RE
from service.registry.models import HOSTNAME_MAX, RegistryCredential

log = logging.getLogger("nvcf.registry")

USERNAME_MAX = 255
PASSWORD_MAX = 4096
DESCRIPTION_MAX = 256
FIELDS = ("registryHostname", "username", "password", "description")

_SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]{0,15}$")
_PORT_RE = re.compile(r"^[0-9]{1,5}$")


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


def _split_host_port(raw: str) -> tuple[str, str | None]:
    """`host[:port]` → (host, port text or None), for a value that is known to be well formed."""
    if raw.startswith("["):
        end = raw.find("]")
        rest = raw[end + 1 :]
        return raw[: end + 1], (rest[1:] if rest.startswith(":") else None)
    if raw.count(":") == 1:
        host, port = raw.split(":")
        return host, port
    return raw, None


def _check_host(host: str) -> tuple[str | None, str | None]:
    """A lower-cased DNS name or IP literal (IPv6 in brackets) → (normalised, problem)."""
    if host.startswith("["):
        literal = host[1:-1]
        if "%" in literal:
            return None, "an IPv6 address must not carry a zone ('%...')"
        try:
            return f"[{ipaddress.IPv6Address(literal).compressed}]", None
        except ValueError:
            return None, f"'{host}' is not a valid IPv6 address"
    if not host:
        return None, "has no host name before the ':port'"
    if not host.isascii():
        return None, (
            "must be ASCII; write an internationalised domain name in its punycode ('xn--...') form"
        )
    host = host.lower()
    if host.endswith("."):
        return None, f"'{host}' must not end with '.'"
    labels = host.split(".")
    if all(label.isdigit() for label in labels):
        try:
            return str(ipaddress.IPv4Address(host)), None
        except ValueError:
            return None, f"'{host}' is not a valid IPv4 address"
    if len(host) > 253:
        return None, "a DNS name must be at most 253 characters"
    if any(not DNS_LABEL_RE.match(label) for label in labels):
        return None, (
            f"'{host}' is not a valid DNS name: each dot-separated label must be 1 to 63 "
            "letters, digits or '-', not starting or ending with '-'"
        )
    return host, None


def normalize_hostname(raw: str) -> tuple[str | None, list[str]]:
    """Check `host[:port]`; returns the lower-cased value or the problems found.

    Messages never repeat a value that holds user info (`user:password@host`).
    """
    if raw == "":
        return None, ["must not be empty"]
    if len(raw) > HOSTNAME_MAX:
        return None, [f"must be at most {HOSTNAME_MAX} characters"]
    if any(ch.isspace() or not ch.isprintable() for ch in raw):
        return None, ["must not contain spaces or control characters"]
    if "://" in raw:
        scheme, rest = raw.split("://", 1)
        shown = f"'{scheme}://'" if _SCHEME_RE.match(scheme) else "the scheme"
        message = f"must be host[:port] without a scheme: drop {shown}"
        hint = _suggestion(rest)
        if hint is not None:
            message += f" and send '{hint}'"
        return None, [message]
    if "@" in raw:
        return None, [
            "must not contain user info ('user:password@'); send the user name and password "
            "in username and password"
        ]
    if any(sep in raw for sep in "/?#"):
        message = "must be host[:port] only, without a path, query or fragment"
        hint = _suggestion(raw)
        if hint is not None:
            message += f": send '{hint}'"
        return None, [message]

    port_text: str | None = None
    if raw.startswith("["):
        end = raw.find("]")
        if end < 0:
            return None, ["has an unclosed '[' (an IPv6 address is written '[::1]:5000')"]
        rest = raw[end + 1 :]
        if rest and not rest.startswith(":"):
            return None, ["must be '[ipv6]' or '[ipv6]:port', with nothing else after ']'"]
        host, port_text = raw[: end + 1], (rest[1:] if rest else None)
    elif raw.count(":") > 1:
        try:
            ip = ipaddress.IPv6Address(raw)
        except ValueError:
            return None, ["must be host[:port], with at most one ':'"]
        return None, [f"an IPv6 address must be in brackets: '[{ip.compressed}]'"]
    else:
        host, _, port = raw.partition(":")
        port_text = port if ":" in raw else None

    problems: list[str] = []
    normal, problem = _check_host(host)
    if problem is not None:
        problems.append(problem)
    port_number: int | None = None
    if port_text is not None:
        if not _PORT_RE.match(port_text) or not 1 <= int(port_text) <= 65535:
            shown = f", got {port_text}" if port_text.isdigit() and len(port_text) <= 12 else ""
            problems.append(f"the port must be a number from 1 to 65535{shown}")
        else:
            port_number = int(port_text)
    if problems or normal is None:
        return None, problems
    return (normal if port_number is None else f"{normal}:{port_number}"), []


def _suggestion(rest: str) -> str | None:
    """The valid `host[:port]` at the start of a URL remainder, unless it has user info."""
    head = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if "@" in head or not head or "://" in head:
        return None
    normal, problems = normalize_hostname(head)
    return None if problems else normal


class _Checker:
    def __init__(self) -> None:
        self.errors: list[FieldError] = []

    def err(self, fld: str, message: str) -> None:
        self.errors.append(FieldError(fld, message))

    def hostname(self, value: Any) -> str | None:
        if not isinstance(value, str):
            self.err("registryHostname", f"must be a string, got {json_kind(value)}")
            return None
        normal, problems = normalize_hostname(value)
        for p in problems:
            self.err("registryHostname", p)
        return normal

    def username(self, value: Any) -> str | None:
        fld = "username"
        if not isinstance(value, str):
            self.err(fld, f"must be a string, got {json_kind(value)}")
            return None
        before = len(self.errors)
        if value == "":
            self.err(fld, "must not be empty")
        elif len(value) > USERNAME_MAX:
            self.err(fld, f"must be at most {USERNAME_MAX} characters, got {len(value)}")
        else:
            if not value.isprintable():
                self.err(fld, "must contain only printable characters (no control characters)")
            if value != value.strip():
                self.err(fld, "must not start or end with whitespace")
            if ":" in value:
                self.err(fld, "must not contain ':' (it cannot be sent in HTTP basic auth)")
        return value if len(self.errors) == before else None

    def password(self, value: Any) -> str | None:
        # Never put the value, or anything derived from it, into a message.
        fld = "password"
        if not isinstance(value, str):
            self.err(fld, f"must be a string, got {json_kind(value)}")
            return None
        if value == "":
            self.err(fld, "must not be empty")
            return None
        if len(value) > PASSWORD_MAX:
            self.err(fld, f"must be at most {PASSWORD_MAX} characters")
            return None
        if any(ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 for ch in value):
            self.err(fld, "must not contain control characters such as line breaks or tabs")
            return None
        return value

    def description(self, value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str):
            self.err("description", f"must be a string, got {json_kind(value)}")
            return None
        if len(value) > DESCRIPTION_MAX:
            self.err(
                "description", f"must be at most {DESCRIPTION_MAX} characters, got {len(value)}"
            )
            return None
        return value or None


def validate_create(raw: Any) -> CredentialSpec:
    """Validate a create body, or raise with every violation. Unknown fields are ignored."""
    body = require_json_object(raw)
    c = _Checker()
    values: dict[str, Any] = {}
    for key, check in (
        ("registryHostname", c.hostname),
        ("username", c.username),
        ("password", c.password),
    ):
        if body.get(key) is None:
            c.err(key, "is required")
        else:
            values[key] = check(body[key])
    description = c.description(body.get("description"))
    if c.errors:
        raise ValidationFailed.of(c.errors, what="registry credential")
    return CredentialSpec(
        registry_hostname=values["registryHostname"],
        username=values["username"],
        password=values["password"],
        description=description,
    )


def validate_update(raw: Any) -> CredentialUpdate:
    """Validate a PATCH body: at least one field; `null` only removes the description."""
    body = require_json_object(raw)
    c = _Checker()
    present = [k for k in FIELDS if k in body]
    if not present:
        c.err("body", f"at least one of {', '.join(FIELDS)} is required")
    checks = {"registryHostname": c.hostname, "username": c.username, "password": c.password}
    values: dict[str, Any] = {}
    for key, check in checks.items():
        if key not in body:
            continue
        if body[key] is None:
            c.err(key, "cannot be null; leave the field out to keep its value")
        else:
            values[key] = check(body[key])
    description = c.description(body.get("description"))
    if c.errors:
        raise ValidationFailed.of(c.errors, what="registry credential")
    return CredentialUpdate(
        registry_hostname=values.get("registryHostname"),
        username=values.get("username"),
        password=values.get("password"),
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
    hostname, port = _split_host_port(value)
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
