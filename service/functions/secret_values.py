"""The plaintext of a version's secrets, for the reconciler only (what an instance's Secret
`nvcf-secrets` holds as `secrets.json`). Never returned, logged or put in an event."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession

from service.core.crypto import SecretBox
from service.functions import repository

log = logging.getLogger("nvcf.functions")


async def versions_secrets(
    session: AsyncSession, version_ids: Sequence[uuid.UUID], box: SecretBox
) -> dict[uuid.UUID, tuple[int, dict[str, str]]]:
    """Each version's secrets generation and its secrets in plaintext, for the reconciler
    only; two queries whatever the number of versions (versions that no longer exist are
    left out).

    The generations are read first: a concurrent update can only make the values newer than
    the generation recorded with them (delivered once more later, never missed). A value the
    configured key cannot decrypt is left out, with a warning naming the secret only."""
    ids = list(dict.fromkeys(version_ids))
    if not ids:
        return {}
    generations = await repository.secrets_generations(session, ids)
    out: dict[uuid.UUID, tuple[int, dict[str, str]]] = {
        vid: (int(generation or 0), {}) for vid, generation in generations
    }
    rows = await repository.secret_ciphertexts(session, list(out))
    for version_id, name, ciphertext in rows:
        try:
            out[version_id][1][name] = box.decrypt(ciphertext)
        except ValueError:
            log.warning(
                "secret %r of function version %s cannot be decrypted with the configured "
                "secrets key; left out of its instances' secrets.json",
                name,
                version_id,
            )
    return out
