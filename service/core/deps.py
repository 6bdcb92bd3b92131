"""Typed FastAPI dependencies for the components of `core` the composition builds (service/app.py
puts them on the application's state, core/components.py reads them); each domain declares its
own the same way in its `deps.py`. Routes take these, and hand the components to the domain's
functions: no domain function receives a `Request` or the app."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.core.components import Component
from service.core.crypto import SecretBox
from service.core.db import SESSIONMAKER
from service.core.events import Events
from service.core.quotas import Quotas
from service.core.ratelimit import RateLimiter
from service.core.settings import Settings

SETTINGS = Component[Settings]("settings")
QUOTAS = Component[Quotas]("quotas")
SECRET_BOX = Component[SecretBox]("secret_box")
RATE_LIMITER = Component[RateLimiter | None]("rate_limiter")
EVENTS = Component[Events]("events")


async def settings(request: Request) -> Settings:
    return SETTINGS.of(request)


async def quotas(request: Request) -> Quotas:
    return QUOTAS.of(request)


async def secret_box(request: Request) -> SecretBox:
    return SECRET_BOX.of(request)


async def rate_limiter(request: Request) -> RateLimiter | None:
    """None when rate limiting is off."""
    return RATE_LIMITER.of(request)


async def events(request: Request) -> Events:
    return EVENTS.of(request)


async def sessionmaker(request: Request) -> async_sessionmaker[AsyncSession]:
    """For work outside the request's transaction (the request's own is `auth.deps.Session`)."""
    return SESSIONMAKER.of(request)


SettingsDep = Annotated[Settings, Depends(settings)]
QuotasDep = Annotated[Quotas, Depends(quotas)]
SecretBoxDep = Annotated[SecretBox, Depends(secret_box)]
RateLimiterDep = Annotated[RateLimiter | None, Depends(rate_limiter)]
EventsDep = Annotated[Events, Depends(events)]
SessionmakerDep = Annotated[async_sessionmaker[AsyncSession], Depends(sessionmaker)]
