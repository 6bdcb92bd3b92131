"""Fixtures of the web console's tests: one real server process (SQLite, the built-in catalog of
simulated clusters with near-zero delays, the local registry allowed for charts) and one
headless Chromium, both for the whole module; screenshots go to an artifacts directory that
the terminal summary names."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.browser import BrowserUnavailable, NetworkLog, start_browser
from tests.support.console import Browser, ConsoleServer, Screenshot, fast_catalog
from tests.support.registry import RegistryServer
from tests.support.server import free_port, start_server, stop_server

REQUIRE_SERVICES = os.environ.get("NVCF_TEST_REQUIRE_SERVICES") == "1"
#: where screenshots are kept (gitignored); NVCF_TEST_ARTIFACTS moves them
ARTIFACTS = Path(
    os.environ.get("NVCF_TEST_ARTIFACTS", Path(__file__).parents[1] / "artifacts")
).joinpath("console")
_written: list[Path] = []


@pytest.fixture(scope="module")
def console_server(
    tmp_path_factory: pytest.TempPathFactory, anon_registry: RegistryServer
) -> Iterator[ConsoleServer]:
    tmp = tmp_path_factory.mktemp("console-server")
    port = free_port()
    proc = start_server(
        tmp / "data",
        f"sqlite+aiosqlite:///{tmp / 'nvcf.db'}",
        port,
        NVCF_CLUSTERS_FILE=str(fast_catalog(tmp)),
        NVCF_REGISTRY_ALLOWLIST=anon_registry.host,
        NVCF_INSECURE_REGISTRIES=anon_registry.host,
        NVCF_RECONCILE_INTERVAL="0.1",
        NVCF_RECONCILE_RESYNC_SECONDS="0.2",
        NVCF_RENDER_WORKERS="1",
        NVCF_HEALTH_IMAGE_PULL_TIMEOUT="0.5",
        NVCF_TIMESERIES_PERIOD_SECONDS="0.5",
    )
    try:
        yield ConsoleServer(f"http://127.0.0.1:{port}", anon_registry)
    finally:
        stop_server(proc)


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    try:
        driver = start_browser(tmp_path_factory.mktemp("chromium") / "profile")
    except BrowserUnavailable as exc:
        if REQUIRE_SERVICES:
            pytest.fail(f"the console tests need a headless browser under `make test`: {exc}")
        pytest.skip(str(exc))
    try:
        # The first tab's own start-up requests are the browser's, not the console's.
        driver.get("about:blank")
        network = NetworkLog(driver)
        network.requests()
        network.by_id.clear()
        yield Browser(driver, network)
    finally:
        driver.quit()


@pytest.fixture
def browser(chromium: Browser) -> Browser:
    """The module's browser, its console messages so far set aside: `network.problems()` is
    what this test caused. Its requests are all kept (the key checks cover every one)."""
    chromium.network.requests()
    chromium.network.console.clear()
    return chromium


@pytest.fixture
def screenshot(request: pytest.FixtureRequest, browser: Browser) -> Screenshot:
    """`screenshot(label)`: the whole page as PNG under ARTIFACTS, named after the test."""

    def take(label: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{request.node.name}-{label}.png"
        driver = browser.driver
        size = driver.get_window_size()
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(size["width"], max(size["height"], int(height) + 120))
        try:
            assert driver.save_screenshot(str(path)), path
        finally:
            driver.set_window_size(size["width"], size["height"])
        _written.append(path)
        return path

    return take


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _written:
        terminalreporter.write_sep("-", "console screenshots")
        for path in _written:
            terminalreporter.write_line(str(path))
