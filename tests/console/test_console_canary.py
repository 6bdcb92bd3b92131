"""The console's view of a version shows its function's traffic split and canary release (step,
weights, figures, last change) and operates the release: paused, then aborted after a
confirmation, the split following; in a real headless Chromium against a real server."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.support.console import Browser, ConsoleServer, Screenshot

pytestmark = pytest.mark.registry

ECHO = {"inferenceUrl": "/echo", "inferencePort": 8000, "containerImage": "nvcr.io/acme/echo:1.0"}
SPEC = {"gpu": "H100", "instanceType": "NCP.GPU.H100_1x", "minInstances": 1, "maxInstances": 1}


def active(server: ConsoleServer, fn: dict[str, Any]) -> dict[str, Any]:
    path = f"/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
    server.api("POST", path, {"deploymentSpecifications": [SPEC]})
    for _ in range(600):
        if (
            server.api("GET", f"/functions/{fn['id']}/versions/{fn['versionId']}")["function"][
                "status"
            ]
            == "ACTIVE"
        ):
            return fn
        time.sleep(0.05)
    raise AssertionError(f"version {fn['versionId']} not ACTIVE")


def test_the_version_view_shows_and_operates_the_canary_release(
    console_server: ConsoleServer, browser: Browser, screenshot: Screenshot
) -> None:
    server = console_server
    stable = active(
        server, server.api("POST", "/functions", {"name": "canaried", **ECHO})["function"]
    )
    fid = stable["id"]
    canary = active(
        server,
        server.api("POST", f"/functions/{fid}/versions", {"name": "canaried", **ECHO})["function"],
    )
    plan = {"steps": [{"weight": 10, "seconds": 600}, {"weight": 50, "seconds": 600}]}
    server.api("POST", f"/functions/{fid}/canary", {"versionId": canary["versionId"], "plan": plan})

    browser.open(server, f"#/functions/{fid}/versions/{canary['versionId']}")
    browser.wait_text("#canary-phase", "RUNNING")
    assert browser.text("#canary-step") == "1 of 2"
    assert "at 10 %" in (browser.text("#canary-weight") or "")
    assert "0 requests" in (browser.text("#canary-figures") or "")
    split = browser.text("#traffic-split") or ""
    assert "90 %" in split and "10 %" in split
    screenshot("running")

    browser.click("#canary-pause")
    alert = browser.wait(lambda: browser.driver.switch_to.alert, "the confirmation")
    assert "Pause" in alert.text
    alert.accept()
    browser.wait_text("#canary-phase", "PAUSED")
    assert "paused at step 1" in (browser.text("#canary-reason") or "")
    assert server.api("GET", f"/functions/{fid}/canary")["phase"] == "PAUSED"

    browser.click("#canary-abort")
    browser.wait(lambda: browser.driver.switch_to.alert, "the confirmation").accept()
    browser.wait_text("#canary-phase", "ABORTED")
    assert browser.count("#canary-actions") == 0  # an ended release has no action
    assert "100 %" in (browser.text("#traffic-split") or "")
    traffic = server.api("GET", f"/functions/{fid}/traffic")["traffic"]
    assert traffic == [{"versionId": stable["versionId"], "weight": 100}]
    screenshot("aborted")
    assert browser.network.problems() == []
