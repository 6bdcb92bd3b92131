"""The console's usage page in a real headless Chromium against a real server: a deployed
function's GPU-hours appear day by day and in its own row, read through the public usage
route with the key pasted in."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.console import Browser, ConsoleServer, Screenshot, assert_private

pytestmark = pytest.mark.registry


def test_an_accounts_usage_is_shown_per_day_and_per_function(
    console_server: ConsoleServer, browser: Browser, screenshot: Screenshot
) -> None:
    body = {
        "name": "console-metered",
        "inferenceUrl": "/echo",
        "inferencePort": 8000,
        "containerImage": "nvcr.io/acme/echo:1.0",
    }
    fn: dict[str, Any] = console_server.api("POST", "/functions", body)["function"]
    spec = {"gpu": "L40S", "instanceType": "DGXC.GPU.L40S_1x", "minInstances": 1, "maxInstances": 1}
    path = f"/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
    console_server.api("POST", path, {"deploymentSpecifications": [spec]})

    browser.open(console_server, "#/usage")
    browser.loaded("#/usage")
    row = browser.wait_text("#usage-functions tbody", fn["id"])
    assert row
    # refreshed every 2 s: the Running instance's GPU-hours grow past zero
    browser.wait(
        lambda: (
            float(
                browser.js(
                    "return document.querySelector('#usage-functions tbody tr td:nth-child(2)')"
                    ".textContent"
                )
            )
            > 0
        ),
        "GPU-hours above zero",
    )
    assert browser.count("#usage-days tbody tr") >= 30
    assert browser.count("#usage-days meter") >= 30
    screenshot("usage")
    assert_private(browser, console_server)
    assert browser.network.problems() == []
