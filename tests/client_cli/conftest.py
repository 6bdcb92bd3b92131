"""The client command line's tests: one real server process (SQLite, the built-in simulated
catalog) for the modules that need no settings of their own; a module that does overrides
`server`. A server process costs several CPU seconds to start, and these modules' tests read
only what they made (accounts, functions and telemetries of their own)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.client_cli import served


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # usage (tests/client_cli/test_usage.py) is read once the replica has added its counts
    with served(tmp_path_factory.mktemp("server"), NVCF_METERING_FLUSH_SECONDS="0.1") as url:
        yield url
