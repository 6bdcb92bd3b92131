"""Chart pipeline test fixtures; registry logic lives in tests/support/registry.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.registry import RegistryServer, RegistryUnavailable, start_registry

REGISTRY_USER = ("chart-puller", "s3cret-Pa55word")


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
def anon_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """An anonymous docker-registry on 127.0.0.1 for the whole session."""
    yield from _registry(tmp_path_factory, "registry-anon")


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
