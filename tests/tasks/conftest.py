"""Fixtures of the task tests: an app whose task loop does not run (the routes' answers stay
as the requests left them; tests/tasks/test_loop.py drives the loop on a fake clock)."""

from __future__ import annotations

import pytest

from tests.support.app import AppClient, ClientFactory


@pytest.fixture
async def client(client_factory: ClientFactory) -> AppClient:
    return await client_factory(reconciler_enabled=False)
