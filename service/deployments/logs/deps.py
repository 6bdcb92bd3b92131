"""The component the log routes need, as a typed FastAPI dependency (the composition,
service/app.py, builds it)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.core.components import Component
from service.deployments.logs.service import FollowLimiter

LOG_FOLLOWS = Component[FollowLimiter]("log_follows")


async def log_follows(request: Request) -> FollowLimiter:
    """The process's open log follows per account."""
    return LOG_FOLLOWS.of(request)


LogFollowsDep = Annotated[FollowLimiter, Depends(log_follows)]
