"""What deployments announce to the domain above them (core/events.py), subscribed at
composition (service/lifespan.py): the invocation plane refuses a deleted deployment's version at
once in this process."""

from __future__ import annotations

import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class DeploymentDeleted:
    """The live deployment of a version was deleted (its instances are being torn down)."""

    version_id: uuid.UUID
