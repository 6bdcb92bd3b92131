"""What the app fixtures of tests/conftest.py configure and hand out, for tests to import:
the admin key and JWT secret the settings carry, and the types of the factories."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx
from fastapi import FastAPI

from service.core.settings import Settings

ADMIN_KEY = "nvapi-test-admin-" + "a" * 40
JWT_SECRET = "test-jwt-secret-that-is-long-enough-for-hs256"

SettingsFactory = Callable[..., Settings]


class AppClient(httpx.AsyncClient):
    """An httpx client bound to one in-process app, which tests may inspect."""

    app: FastAPI


ClientFactory = Callable[..., Awaitable[AppClient]]


async def without_reconciler(client: AppClient) -> AppClient:
    """Stop the app's reconciler: the rows a test writes stay as written."""
    reconciler = getattr(client.app.state, "reconciler", None)
    if reconciler is not None:
        await reconciler.stop()
        client.app.state.reconciler = None
    return client
