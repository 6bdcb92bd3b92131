"""The components the telemetry routes need (the composition builds them): `TelemetryUsers`,
the read model of what names a telemetry, answered by the domains that name them (functions'
versions, tasks not yet ended), so that one in use is not deleted."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Sequence
from typing import Annotated, Protocol

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncSession

from service.core.components import Component


class TelemetryUsers(Protocol):
    def __call__(
        self, session: AsyncSession, account_id: str, telemetry_id: uuid.UUID
    ) -> Awaitable[Sequence[str]]:
        """What of the account names the telemetry, each worded for a message ("function
        <id>, version <id>"); empty when nothing does."""


TELEMETRY_USERS = Component[TelemetryUsers]("telemetry_users")


async def _telemetry_users(request: Request) -> TelemetryUsers:
    return TELEMETRY_USERS.of(request)


TelemetryUsersDep = Annotated[TelemetryUsers, Depends(_telemetry_users)]
