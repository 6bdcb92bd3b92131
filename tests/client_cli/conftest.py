"""The client command line's tests: one real server process (SQLite, the built-in simulated
catalog, the local registry allowed for charts) for the modules that need no settings of their
own; a module that does overrides `server`. A server process costs several CPU seconds to
start, and these modules' tests read only what they made (accounts, functions, telemetries
and releases of their own)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.client_cli import served
from tests.support.registry import RegistryServer


@pytest.fixture(scope="package")
def server(
    tmp_path_factory: pytest.TempPathFactory, anon_registry: RegistryServer
) -> Iterator[str]:
    host = anon_registry.host
    with served(
        tmp_path_factory.mktemp("server"),
        NVCF_REGISTRY_ALLOWLIST=host,
        NVCF_INSECURE_REGISTRIES=host,
        # a crash-looping instance fails at once (test_logs), a canary steps every 0.2 s
        # (test_canary), usage is counted every 0.1 s (test_usage)
        NVCF_HEALTH_RESTART_LOOP_TIMEOUT="0.5",
        NVCF_CANARY_INTERVAL="0.2",
        NVCF_METERING_FLUSH_SECONDS="0.1",
    ) as url:
        yield url
