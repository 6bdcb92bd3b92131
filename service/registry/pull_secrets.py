"""Image pull secrets of an account (helm.md §5): one `kubernetes.io/dockerconfigjson` payload
per registry credential with the CONTAINER artifact type, under a stable name that carries no
credential text. Credentials without CONTAINER (e.g. HELM-only ones) are never put in a Pod."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.core.crypto import SecretBox
from service.registry.models import ArtifactType
from service.registry.service import all_credentials

PullSecrets = list[tuple[str, dict[str, Any]]]


def pull_secret_name(hostname: str, username: str) -> str:
    """A stable Secret name per registry login (no credential text in the name).

    Named by (hostname, username), as before credentials had names, so an upgrade renames
    nothing; of two credentials with the same login the newest one is used."""
    digest = hashlib.sha256(f"{hostname}\n{username}".encode()).hexdigest()
    return f"nvcf-pull-{digest[:16]}"


def dockerconfig(hostname: str, username: str, password: str) -> dict[str, Any]:
    auth = base64.b64encode(f"{username}:{password}".encode()).decode()
    return {"auths": {hostname: {"username": username, "password": password, "auth": auth}}}


async def account_pull_secrets(
    session: AsyncSession, account_id: str, box: SecretBox
) -> PullSecrets:
    """(Secret name, dockerconfig) of every CONTAINER credential of the account, sorted by
    name."""
    creds = await all_credentials(
        session, account_id, box=box, artifact_type=ArtifactType.CONTAINER
    )
    secrets = {
        pull_secret_name(host, user): dockerconfig(host, user, password)
        for host, user, password in creds
    }
    return sorted(secrets.items())
