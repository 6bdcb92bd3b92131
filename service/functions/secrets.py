"""A version's secrets after creation: the update NVCF offers (`PUT /secrets/functions/{id}/
versions/{versionId}`, scope `update_secrets`) and the plaintext the reconciler delivers.

An update merges by name into the version's secrets (a new value replaces the stored one) and
bumps `secrets_generation`; when the version has a live deployment, the deployment is made due
and the reconciler writes the new Secret into every instance that holds an older generation,
in place (pods keep running and read the new file). A version with no deployment keeps the
secrets for its next deployment. Unlike NVCF, secrets may be added to a deployed version that
had none: every instance mounts its Secret from the start. Values are only ever held as
ciphertext here and never appear in a response, a log record or an event.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Annotated, Any, ClassVar

from sqlalchemy.ext.asyncio import AsyncSession

from service.core.crypto import SecretBox
from service.core.db import utcnow
from service.core.errors import FieldError, NotFound, ValidationFailed
from service.core.events import Events
from service.core.http import require_json_object
from service.core.validation import Check, MaxItems, RequestModel, Rules, parse
from service.functions import repository
from service.functions.events import SecretsChanged
from service.functions.models import FunctionSecret, FunctionVersion
from service.functions.requests import MAX_SECRETS, SecretIn, secret_text
from service.observability.service import KeyReplaced

log = logging.getLogger("nvcf.functions")


def _secrets_list(value: Any) -> str | None:
    if value is None:
        return "is required: a non-empty list of {name, value}"
    if not isinstance(value, list) or not value:
        return "must be a non-empty list of {name, value}"
    return None


def _unique_names(secrets: list[SecretIn]) -> tuple[list[SecretIn], list[str]]:
    names = [s.name for s in secrets]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        return secrets, [f"names must be unique; {', '.join(repeated)} appear(s) more than once"]
    return secrets, []


class SecretsUpdate(RequestModel):
    """Body of `PUT /secrets/functions/{id}/versions/{versionId}` (NVCF's
    UpdateFunctionSecretsRequest): the secrets to add or replace, by name."""

    null_when_missing: ClassVar[tuple[str, ...]] = ("secrets",)

    secrets: Annotated[
        list[SecretIn],
        Check(_secrets_list, {"minItems": 1}, before=True),
        MaxItems(MAX_SECRETS),
        Rules(_unique_names),
    ]


def validate_update(raw: Any) -> list[tuple[str, str]]:
    """(name, stored text) of every secret of a valid body, or a 400 listing every violation."""
    body = require_json_object(raw)
    model, errors = parse(SecretsUpdate, body)
    if errors or model is None:
        raise ValidationFailed.of(errors)
    return [(s.name, secret_text(s.value)) for s in model.secrets]


async def update_secrets(
    session: AsyncSession,
    version: FunctionVersion,
    secrets: list[tuple[str, str]],
    *,
    box: SecretBox,
    events: Events,
    now: datetime | None = None,
) -> None:
    """Merge `secrets` into the version's (new values win), bump its secrets generation and
    announce it (`SecretsChanged`: deployments delivers them to a deployed version). The
    version is read as it is now and held until the transaction ends: an update committed
    meanwhile is merged into, and each update is a generation of its own."""
    if await repository.lock_version(session, version.id) is None:
        raise NotFound(detail=f"version {version.id} of function {version.function_id} not found")
    stored = {row.name: row for row in await repository.secrets_of(session, version.id)}
    names = sorted(set(stored) | {n for n, _ in secrets})
    if len(names) > MAX_SECRETS:
        raise ValidationFailed.of(
            [
                FieldError(
                    "secrets",
                    f"the version would have {len(names)} secrets; at most {MAX_SECRETS} "
                    f"(it has {len(stored)})",
                )
            ]
        )
    for name, value in secrets:
        row = stored.get(name)
        if row is None:
            session.add(
                FunctionSecret(version_id=version.id, name=name, ciphertext=box.encrypt(value))
            )
        else:
            row.ciphertext = box.encrypt(value)
    now = now or utcnow()
    version.secret_names = names
    version.secrets_generation = (version.secrets_generation or 0) + 1
    version.updated_at = now
    await events.publish(
        session,
        SecretsChanged(version.id, tuple(n for n, _ in secrets), version.secrets_generation, now),
    )
    await session.flush()
    log.info(
        "function version %s: %d secret(s) updated, generation %d",
        version.id,
        len(secrets),
        version.secrets_generation,
    )


async def telemetry_key_replaced(session: AsyncSession, event: KeyReplaced, events: Events) -> None:
    """A telemetry's key is part of what a version naming it delivers to its instances (the
    collector's Secret on Kubernetes): each such version's secrets generation is bumped and
    announced, so its deployed instances receive the new key (`SecretsChanged`)."""
    now = utcnow()
    for version in await repository.naming_telemetry(session, event.account_id, event.telemetry_id):
        version.secrets_generation = (version.secrets_generation or 0) + 1
        version.updated_at = now
        name = f"key of telemetry {event.telemetry_id}"
        await events.publish(
            session,
            SecretsChanged(
                version.id, (name,), version.secrets_generation, now, telemetry_key=True
            ),
        )
