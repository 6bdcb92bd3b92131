"""The plaintext of a version's secrets, for the reconciler only (what an instance's Secret
`nvcf-secrets` holds as `secrets.json`). Never returned, logged or put in an event."""

from __future__ import annotations

import logging
import uuid

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from service.core.crypto import SecretBox
from service.functions.models import FunctionSecret, FunctionVersion

log = logging.getLogger("nvcf.functions")


async def version_secrets(
    session: AsyncSession, version_id: uuid.UUID, box: SecretBox
) -> tuple[int, dict[str, str]]:
    """The version's secrets generation and its secrets in plaintext, for the reconciler only.

    The generation is read first: a concurrent update can only make the values newer than
    the generation recorded with them (delivered once more later, never missed). A value the
    configured key cannot decrypt is left out, with a warning naming the secret only."""
    generation = await session.scalar(
        select(FunctionVersion.secrets_generation).where(FunctionVersion.id == version_id)
    )
    rows = (
        await session.execute(
            select(FunctionSecret.name, FunctionSecret.ciphertext).where(
                FunctionSecret.version_id == version_id
            )
        )
    ).all()
    values: dict[str, str] = {}
    for name, ciphertext in rows:
        try:
            values[name] = box.decrypt(ciphertext)
        except ValueError:
            log.warning(
                "secret %r of function version %s cannot be decrypted with the configured "
                "secrets key; left out of its instances' secrets.json",
                name,
                version_id,
            )
    return int(generation or 0), values
