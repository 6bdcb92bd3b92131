"""Typed FastAPI dependencies for the components of `core` the composition builds (service/app.py
puts them on the application's state); each domain declares its own the same way in its
`deps.py`. Routes take these, and hand the components to the domain's functions: no domain
function receives a `Request` or the app."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.core.crypto import SecretBox
from service.core.events import Events
from service.core.quotas import Quotas
from service.core.ratelimit import RateLimiter
from service.core.settings import Settings


async def settings(request: Request) -> Settings:
    value: Settings = request.app.state.settings
    return value


async def quotas(request: Request) -> Quotas:
    value: Quotas = request.app.state.quotas
    return value


async def secret_box(request: Request) -> SecretBox:
    value: SecretBox = request.app.state.secret_box
    return value


async def rate_limiter(request: Request) -> RateLimiter | None:
    """None when rate limiting is off."""
    value: RateLimiter | None = request.app.state.rate_limiter
    return value


async def events(request: Request) -> Events:
    value: Events = request.app.state.events
    return value


async def sessionmaker(request: Request) -> async_sessionmaker[AsyncSession]:
    """For work outside the request's transaction (the request's own is `auth.deps.Session`)."""
    value: async_sessionmaker[AsyncSession] = request.app.state.sessionmaker
    return value


SettingsDep = Annotated[Settings, Depends(settings)]
QuotasDep = Annotated[Quotas, Depends(quotas)]
SecretBoxDep = Annotated[SecretBox, Depends(secret_box)]
RateLimiterDep = Annotated[RateLimiter | None, Depends(rate_limiter)]
EventsDep = Annotated[Events, Depends(events)]
SessionmakerDep = Annotated[async_sessionmaker[AsyncSession], Depends(sessionmaker)]
