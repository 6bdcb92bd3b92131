"""Chart pipeline test fixtures; registry logic lives in tests/support/registry.py.

`anon_registry` and `push_corpus` are in tests/conftest.py: tests/deployments uses them too."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.charts import (
    REGISTRY_USER,
    TOKEN_OUTSIDER,
    TOKEN_USER,
    ArchiveFactory,
    build_chart,
)
from tests.support.registry import (
    RegistryServer,
    RegistryUnavailable,
    TokenServer,
    TokenUser,
    start_registry,
)


def _registry(
    factory: pytest.TempPathFactory, name: str, htpasswd: tuple[str, str] | None = None
) -> Iterator[RegistryServer]:
    try:
        server = start_registry(factory.mktemp(name), htpasswd=htpasswd)
    except RegistryUnavailable as exc:
        pytest.skip(f"no local OCI registry: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """A docker-registry requiring htpasswd basic auth (user/password: REGISTRY_USER)."""
    yield from _registry(tmp_path_factory, "registry-auth", REGISTRY_USER)


@pytest.fixture
def start_extra_registry(tmp_path: Path) -> Iterator[Callable[[], RegistryServer]]:
    """Start throw-away anonymous registries (e.g. to stop one mid-test); all stopped after."""
    started: list[RegistryServer] = []

    def start() -> RegistryServer:
        try:
            server = start_registry(tmp_path / f"registry-{len(started)}")
        except RegistryUnavailable as exc:
            pytest.skip(f"no local OCI registry: {exc}")
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _token_registry(directory: Path) -> RegistryServer:
    """A registry using Docker token auth against its own, started TokenServer; the caller
    stops both (see _stop_token_registry)."""
    tokens = TokenServer(
        directory / "token",
        {
            TOKEN_USER[0]: TokenUser(TOKEN_USER[1], frozenset({"pull", "push"})),
            TOKEN_OUTSIDER[0]: TokenUser(TOKEN_OUTSIDER[1], frozenset()),
        },
    )
    tokens.start()
    try:
        return start_registry(directory / "registry", token=tokens, login=TOKEN_USER)
    except RegistryUnavailable as exc:
        tokens.stop()
        pytest.skip(f"no local OCI registry: {exc}")


def _stop_token_registry(server: RegistryServer) -> None:
    server.stop()
    if server.token_server is not None:
        server.token_server.stop()


@pytest.fixture(scope="session")
def token_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """A docker-registry using bearer-token auth (`auth: token`) against a local token server
    (`.token_server`) that grants TOKEN_USER pull and push, for the whole session."""
    server = _token_registry(tmp_path_factory.mktemp("registry-token"))
    try:
        yield server
    finally:
        _stop_token_registry(server)


@pytest.fixture
def start_token_registry(tmp_path: Path) -> Iterator[Callable[[], RegistryServer]]:
    """Start throw-away token-auth registries with their own token servers (e.g. to stop the
    token server mid-test); all stopped after the test."""
    started: list[RegistryServer] = []

    def start() -> RegistryServer:
        server = _token_registry(tmp_path / f"registry-token-{len(started)}")
        started.append(server)
        return server

    yield start
    for server in started:
        _stop_token_registry(server)


# --- corpus charts pushed to the local registries (API tests) ------------------------------


@pytest.fixture(scope="session")
def corpus_archive(tmp_path_factory: pytest.TempPathFactory) -> ArchiveFactory:
    """`corpus_archive(name, files=None)` -> a packaged .tgz (cached per name without files)."""
    cache: dict[str, Path] = {}

    def factory(name: str, files: dict[str, str] | None = None) -> Path:
        if files or name not in cache:
            archive = build_chart(name, tmp_path_factory.mktemp(name), files)
            if files:
                return archive
            cache[name] = archive
        return cache[name]

    return factory
