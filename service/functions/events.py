"""What the function registry announces (core/events.py): the domains above subscribe at
composition (service/lifespan.py) — deployments tear down a deleted version's deployment and deliver
changed secrets; the invocation plane forgets whom it let invoke a function."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class VersionDeleted:
    """A version is being deleted (its row goes in the same transaction)."""

    version_id: uuid.UUID


@dataclass(frozen=True)
class SecretsChanged:
    """Secrets of a version were added or replaced; `generation` is its new secrets generation."""

    version_id: uuid.UUID
    names: tuple[str, ...]
    generation: int
    at: datetime
    #: the change is a telemetry's new key (its collector's Secret, where one runs)
    telemetry_key: bool = False


@dataclass(frozen=True)
class AccessChanged:
    """Who may invoke the function (what is shared with whom), or how often (a version's
    rate limit), changed."""

    function_id: uuid.UUID
