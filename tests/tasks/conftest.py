"""Fixtures of the task tests: an app whose task loop does not run (the routes' answers stay
as the requests left them), the harness `h` that drives the use cases and the loop pass by pass
on a fake clock, and registries requiring a login, for result pushes (the anonymous one,
`anon_registry`, is in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from service.core.db import make_engine, make_sessionmaker
from tests.support.app import AppClient, ClientFactory
from tests.support.registry import (
    RegistryServer,
    RegistryUnavailable,
    TokenServer,
    TokenUser,
    start_registry,
)
from tests.support.tasks import TaskHarness


@pytest.fixture
async def client(client_factory: ClientFactory) -> AppClient:
    return await client_factory(reconciler_enabled=False)


@pytest.fixture
async def h(database_url: str) -> AsyncIterator[TaskHarness]:
    """The task use cases and loop over a simulated cluster on a fake clock, on a database of
    each kind (tests/support/tasks.py)."""
    engine = make_engine(database_url)
    try:
        yield TaskHarness.build(make_sessionmaker(engine))
    finally:
        await engine.dispose()


#: the login of `login_registry` (tests read it from the server)
_LOGIN = ("results-pusher", "Pu5h-s3cret-never-logged")


@pytest.fixture(scope="module")
def login_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """A docker-registry requiring htpasswd basic auth (its `username` and `password`)."""
    try:
        server = start_registry(tmp_path_factory.mktemp("registry-results"), htpasswd=_LOGIN)
    except RegistryUnavailable as exc:
        pytest.skip(f"no local OCI registry: {exc}")
    try:
        yield server
    finally:
        server.stop()


#: (username, password) with push rights on `token_login_registry`, and one with none
TOKEN_PUSHER = ("results-token-pusher", "T0ken-push-s3cret")
TOKEN_READER = ("results-token-reader", "T0ken-read-s3cret")


@pytest.fixture(scope="module")
def token_login_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """A docker-registry using bearer-token auth against its own token server, whose
    `username`/`password` may push; `.token_server.users` also holds a reader without rights."""
    directory = tmp_path_factory.mktemp("registry-results-token")
    tokens = TokenServer(
        directory / "token",
        {
            TOKEN_PUSHER[0]: TokenUser(TOKEN_PUSHER[1], frozenset({"pull", "push"})),
            TOKEN_READER[0]: TokenUser(TOKEN_READER[1], frozenset()),
        },
    )
    tokens.start()
    try:
        server = start_registry(directory / "registry", token=tokens, login=TOKEN_PUSHER)
    except RegistryUnavailable as exc:
        tokens.stop()
        pytest.skip(f"no local OCI registry: {exc}")
    try:
        yield server
    finally:
        server.stop()
        tokens.stop()
