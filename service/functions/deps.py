"""The components the function registry's routes need, as typed FastAPI dependencies (the
composition, service/app.py, builds them); `ActiveInstances` is the read model the registry
shows but does not own: a version's running instances, answered by deployments."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Mapping, Sequence
from typing import Annotated, Any, Protocol

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncSession

from service.core.components import Component
from service.functions.read_cache import VERSION_CACHE, VersionCache


class ActiveInstances(Protocol):
    def __call__(
        self, session: AsyncSession, version_ids: Sequence[uuid.UUID]
    ) -> Awaitable[Mapping[uuid.UUID, Sequence[Any]]]:
        """The wanted instances of each version's live deployment, in one query (rows with
        `instance_id, phase, instance_type, gpu, backend, cluster, created_at, updated_at`)."""


ACTIVE_INSTANCES = Component[ActiveInstances]("active_instances")


def version_cache(request: Request) -> VersionCache | None:
    """None unless the read cache is on (SQLite); a plain call on the hot read."""
    return VERSION_CACHE.of(request)


def active_instances(request: Request) -> ActiveInstances:
    return ACTIVE_INSTANCES.of(request)


async def _version_cache(request: Request) -> VersionCache | None:
    return version_cache(request)


async def _active_instances(request: Request) -> ActiveInstances:
    return active_instances(request)


VersionCacheDep = Annotated[VersionCache | None, Depends(_version_cache)]
ActiveInstancesDep = Annotated[ActiveInstances, Depends(_active_instances)]
