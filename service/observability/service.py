"""Telemetry endpoints: validation, storage (the key encrypted), the in-use refusal, and the
key an export decrypts. Services flush; the request's transaction commits.

Rules (NVCF's where it has them, decided here where it is silent):

- `secret.name` is the telemetry's name: unique within the account (a second is a 409).
- `provider`, `protocol`, each of `types`: NVCF's enumerations, any case; `types` not empty,
  duplicates dropped. The provider must have a wire here and the wire must carry the protocol
  and every type (wires.py); every violation is listed.
- `endpoint`: an http(s) URL without user info, query or fragment (a Datadog site name for
  DATADOG); its host must resolve to public addresses only, unless the operator allows it.
- `secret.value`: the key, a string; GRAFANA_CLOUD's is `instanceId:token` or, as ngcsdk
  sends it, `{"instanceId": ..., "apiKey": ...}`, stored as `instanceId:token`, its basic-auth
  login. The remote-write providers also take client certificates as ngcsdk sends them,
  `{clientKey, clientCert, caFile}` (mtls.py), to an https:// endpoint only; no other object
  is taken. Write-only, never in a message or log.
- A telemetry named by any function version (or task) of the account cannot be deleted
  (NVCF's answer: delete those first); the new key of `PUT /secrets/telemetries/{id}` must
  come under the telemetry's own name.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from service.core.crypto import SecretBox
from service.core.db import utcnow
from service.core.errors import BadRequest, Conflict, FieldError, NotFound, ValidationFailed
from service.core.events import Events
from service.core.http import require_json_object
from service.core.validation import failed, parse
from service.observability import mtls, repository
from service.observability.models import ERROR_MAX, Kind, Protocol, Provider, Telemetry
from service.observability.schemas import (
    TelemetryCreate,
    TelemetryOut,
    TelemetrySecretIn,
    TelemetrySecretUpdate,
    TelemetryStatus,
    secret_text,
)
from service.observability.wires import Wire, address_problem, target_of, wire_of, wire_problems

log = logging.getLogger("nvcf.observability")


@dataclass(frozen=True)
class KeyReplaced:
    """A telemetry's key was replaced (published to core/events.py's subscribers: the export
    reads it again at once)."""

    telemetry_id: uuid.UUID
    account_id: str


@dataclass(frozen=True)
class TelemetrySpec:
    """A validated create request."""

    name: str
    endpoint: str
    protocol: Protocol
    provider: Provider
    kinds: list[Kind]
    key: str

    def __repr__(self) -> str:
        return (
            f"TelemetrySpec(name={self.name!r}, provider={self.provider.value}, "
            f"endpoint={self.endpoint!r}, key=<hidden>)"
        )


def _grafana_login(value: str | dict[str, Any]) -> tuple[str, str]:
    """GRAFANA_CLOUD's (instance id, token): from `instanceId:token`, or from ngcsdk's
    `{"instanceId": ..., "apiKey": ...}`; empty strings where not given."""
    if isinstance(value, str):
        instance, _, token = value.partition(":")
        return instance, token
    given, key = value.get("instanceId"), value.get("apiKey")
    return (
        str(given) if isinstance(given, str | int) and not isinstance(given, bool) else "",
        key if isinstance(key, str) else "",
    )


def _key_problems(
    provider: Provider, value: str | dict[str, Any], endpoint: str
) -> list[FieldError]:
    if provider is Provider.GRAFANA_CLOUD:
        instance, token = _grafana_login(value)
        if not (instance.strip() and token.strip()) or ":" in instance:
            return [
                FieldError(
                    "secret.value",
                    'GRAFANA_CLOUD takes \'instanceId:token\' or {"instanceId": ..., "apiKey": '
                    "...} (the stack's instance id and an access policy token), sent as the "
                    "basic-auth login of its OTLP gateway",
                )
            ]
    elif isinstance(value, dict) and wire_of(provider) is Wire.REMOTE_WRITE:
        errors = [FieldError(f"secret.value.{f}", m) for f, m in mtls.problems(value)]
        if urlsplit(endpoint.strip()).scheme != "https":
            errors.append(
                FieldError(
                    "endpoint",
                    "client certificates are only presented over TLS: the endpoint must be "
                    "an https:// URL",
                )
            )
        return errors
    elif not isinstance(value, str):
        return [
            FieldError(
                "secret.value",
                f"{provider.value} takes its key as a string (sent as its API key or bearer "
                "token); only PROMETHEUS, VICTORIAMETRICS and KRATOS_THANOS also take client "
                "certificates ({clientKey, clientCert, caFile})",
            )
        ]
    return []


def _key_text(provider: Provider, value: str | dict[str, Any]) -> str:
    """The key as stored: GRAFANA_CLOUD's always `instanceId:token`, as exports send it."""
    if provider is Provider.GRAFANA_CLOUD:
        return ":".join(_grafana_login(value))
    if isinstance(value, dict):
        return mtls.stored(value)
    return secret_text(value)


async def validate_create(raw: Any, allowlist: Collection[str]) -> TelemetrySpec:
    """Validate a create body, or raise with every violation. Unknown fields are ignored."""
    model, errors = parse(TelemetryCreate, require_json_object(raw))
    if model is None:
        raise ValidationFailed.of(errors, what="telemetry")
    provider, protocol = Provider(model.provider), Protocol(model.protocol)
    kinds = [k for k in Kind if k.value in model.types]
    errors += [FieldError(f, m) for f, m in wire_problems(provider, protocol, kinds)]
    errors += _key_problems(provider, model.secret.value, model.endpoint)
    target, why = target_of(provider, model.endpoint)
    if why is not None:
        errors.append(FieldError("endpoint", why))
    elif target is not None and not failed(errors) & {"provider"}:
        reason = await address_problem(target, allowlist)
        if reason is not None:
            errors.append(FieldError("endpoint", reason))
    if errors:
        raise ValidationFailed.of(errors, what="telemetry")
    return TelemetrySpec(
        name=model.secret.name,
        endpoint=model.endpoint.strip(),
        protocol=protocol,
        provider=provider,
        kinds=kinds,
        key=_key_text(provider, model.secret.value),
    )


def validate_secret_update(raw: Any) -> TelemetrySecretIn:
    model, errors = parse(TelemetrySecretUpdate, require_json_object(raw))
    if errors or model is None:
        raise ValidationFailed.of(errors, what="telemetry secret")
    return model.secret


# --------------------------------------------------------------------------- responses


def describe(telemetry: Telemetry) -> TelemetryOut:
    """The telemetry as NVCF's TelemetryDto (never its key), with its export status."""
    return TelemetryOut(
        telemetry_id=telemetry.id,
        name=telemetry.name,
        endpoint=telemetry.endpoint,
        protocol=telemetry.protocol,
        provider=telemetry.provider,
        types=[k.value for k in telemetry.kinds],
        created_at=telemetry.created_at,
        status=TelemetryStatus(
            last_success_at=telemetry.last_success_at,
            last_error_at=telemetry.last_error_at,
            last_error=telemetry.last_error,
            dropped=telemetry.dropped or None,
        ),
    )


# --------------------------------------------------------------------------- storage


def _conflict(name: str, existing: uuid.UUID | None) -> Conflict:
    which = f" (id {existing})" if existing is not None else ""
    return Conflict(
        detail=f"a telemetry named '{name}' already exists in the account{which}: telemetries "
        "must have unique names (secret.name) within an account"
    )


async def count(session: AsyncSession, account_id: str) -> int:
    return await repository.count(session, account_id)


async def create(
    session: AsyncSession, *, account_id: str, spec: TelemetrySpec, box: SecretBox
) -> Telemetry:
    existing = await repository.find(session, account_id, spec.name)
    if existing is not None:
        raise _conflict(spec.name, existing.id)
    now = utcnow()
    telemetry = Telemetry(
        id=uuid.uuid4(),
        account_id=account_id,
        name=spec.name,
        endpoint=spec.endpoint,
        protocol=spec.protocol.value,
        provider=spec.provider.value,
        types=[k.value for k in spec.kinds],
        secret_ciphertext=box.encrypt(spec.key),
        created_at=now,
        updated_at=now,
    )
    session.add(telemetry)
    try:
        await session.flush()
    except IntegrityError:
        # a concurrent request stored the same name first; the transaction rolls back
        raise _conflict(spec.name, None) from None
    log.info(
        "telemetry %s '%s' (%s) added (account %s)",
        telemetry.id,
        telemetry.name,
        telemetry.provider,
        account_id,
    )
    return telemetry


async def get(
    session: AsyncSession, account_id: str, telemetry_id: uuid.UUID, *, locked: bool = False
) -> Telemetry:
    """The account's telemetry, else 404; `locked`: as `repository.lock` reads it."""
    read = repository.lock if locked else repository.by_id
    telemetry = await read(session, telemetry_id)
    if telemetry is None or telemetry.account_id != account_id:
        raise NotFound(detail=f"telemetry {telemetry_id} not found")
    return telemetry


async def list_all(session: AsyncSession, account_id: str) -> Sequence[Telemetry]:
    return await repository.of_account(session, account_id)


async def delete(
    session: AsyncSession,
    account_id: str,
    telemetry_id: uuid.UUID,
    named_by: Callable[[AsyncSession, str, uuid.UUID], Awaitable[Sequence[str]]],
) -> None:
    """Delete the telemetry unless something names it (`named_by`: what of the account does).
    It is locked first, as a version or task naming it holds it (`references.hold`), so one
    stored meanwhile is seen, or waits and finds it gone."""
    telemetry = await get(session, account_id, telemetry_id, locked=True)
    users = await named_by(session, account_id, telemetry_id)
    if users:
        shown = "; ".join(users[:10]) + (f"; and {len(users) - 10} more" if len(users) > 10 else "")
        raise BadRequest(
            detail=f"telemetry {telemetry_id} cannot be deleted: it is in use by {shown}; "
            "delete those first"
        )
    await repository.delete(session, telemetry)
    await session.flush()
    log.info("telemetry %s deleted (account %s)", telemetry_id, account_id)


async def update_secret(
    session: AsyncSession,
    account_id: str,
    telemetry_id: uuid.UUID,
    secret: TelemetrySecretIn,
    box: SecretBox,
    events: Events,
) -> None:
    telemetry = await get(session, account_id, telemetry_id)
    errors: list[FieldError] = []
    if secret.name != telemetry.name:
        errors.append(
            FieldError(
                "secret.name",
                f"'{secret.name}' is not the telemetry's name '{telemetry.name}': a telemetry "
                "keeps its name; give it with the new value",
            )
        )
    errors += _key_problems(Provider(telemetry.provider), secret.value, telemetry.endpoint)
    if errors:
        raise ValidationFailed.of(errors, what="telemetry secret")
    telemetry.secret_ciphertext = box.encrypt(_key_text(Provider(telemetry.provider), secret.value))
    telemetry.updated_at = utcnow()
    await events.publish(session, KeyReplaced(telemetry_id, account_id))
    await session.flush()
    log.info("telemetry %s: key replaced (account %s)", telemetry_id, account_id)


def key_of(telemetry: Telemetry, box: SecretBox) -> str | None:
    """The telemetry's key, or None (logged, never the key) when the configured secrets key
    cannot decrypt it."""
    try:
        return box.decrypt(telemetry.secret_ciphertext)
    except ValueError:
        log.warning(
            "telemetry %s (account %s): its key cannot be decrypted with the configured "
            "secrets key",
            telemetry.id,
            telemetry.account_id,
        )
        return None


def clip_error(reason: str) -> str:
    return reason if len(reason) <= ERROR_MAX else reason[: ERROR_MAX - 1] + "…"
