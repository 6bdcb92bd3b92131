"""The console's telemetry endpoints in a real headless Chromium against a real server process:
an endpoint added from its form (a bad input shows the violation and adds nothing), named in
the function form, and, once its endpoint refuses the exports (an OTLP receiver answering
401), its row shows the last error and the count of what was dropped; deleting it is refused
while a version names it and done once none does."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from tests.support.app import ADMIN_KEY
from tests.support.console import Browser, ConsoleServer, Screenshot, assert_private, fast_catalog
from tests.support.otlp import OtlpReceiver
from tests.support.registry import RegistryServer
from tests.support.server import free_port, start_server, stop_server

pytestmark = pytest.mark.registry

SPEC = {"gpu": "L40S", "instanceType": "DGXC.GPU.L40S_1x", "minInstances": 1, "maxInstances": 1}


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver().start()
    r.status = 401  # a refused key: every export fails
    yield r
    r.stop()


@pytest.fixture(scope="module")
def console_server(
    tmp_path_factory: pytest.TempPathFactory,
    anon_registry: RegistryServer,
    receiver: OtlpReceiver,
) -> Iterator[ConsoleServer]:
    """conftest's server, allowed to export to the test receiver, exporting often."""
    tmp = tmp_path_factory.mktemp("console-server")
    port = free_port()
    proc = start_server(
        tmp / "data",
        f"sqlite+aiosqlite:///{tmp / 'nvcf.db'}",
        port,
        NVCF_CLUSTERS_FILE=str(fast_catalog(tmp)),
        NVCF_RECONCILE_INTERVAL="0.1",
        NVCF_RECONCILE_RESYNC_SECONDS="0.2",
        NVCF_TELEMETRY_ALLOWLIST=receiver.hostport,
        NVCF_TELEMETRY_EXPORT_INTERVAL="0.2",
        NVCF_TELEMETRY_EXPORT_TIMEOUT="2",
    )
    try:
        yield ConsoleServer(f"http://127.0.0.1:{port}", anon_registry)
    finally:
        stop_server(proc)


def fill(browser: Browser, values: dict[str, str]) -> None:
    for field_id, text in values.items():
        element = browser.driver.find_element(By.ID, field_id)
        element.clear()
        if text:
            element.send_keys(text)


def hash_of(browser: Browser) -> str:
    return str(browser.js("return location.hash"))


def test_an_endpoint_is_added_named_by_a_function_shows_its_errors_and_drops_and_is_deleted(
    console_server: ConsoleServer,
    receiver: OtlpReceiver,
    browser: Browser,
    screenshot: Screenshot,
) -> None:
    server = console_server
    browser.open(server, "#/telemetries")
    browser.wait_text("#view", "No telemetry endpoints yet.")
    browser.click("#new-telemetry")
    browser.loaded("#/telemetries/new")

    # a bad input (no type chosen): the violation next to its field, nothing added
    fill(browser, {"name": "console-otlp", "endpoint": receiver.url, "key": "a-key-never-shown"})
    browser.click("#telemetry-form-submit")
    browser.wait(lambda: browser.text("#types-error"), "the types' violation shown")
    screenshot("telemetry-invalid")
    assert server.api("GET", "/telemetries")["telemetries"] == []

    browser.click("#type-METRICS")
    browser.click("#type-TRACES")
    browser.click("#telemetry-form-submit")
    browser.loaded("#/telemetries")
    (made,) = server.api("GET", "/telemetries")["telemetries"]
    tid = made["telemetryId"]
    row = f'#telemetries tr[data-telemetry-id="{tid}"]'
    browser.wait_text(row, "console-otlp")
    assert "OTEL_COLLECTOR (HTTP)" in (browser.text(row) or "")
    assert "a-key-never-shown" not in str(browser.js("return document.body.innerText"))

    # the function form offers the endpoint for the types it receives, and only those
    browser.driver.get(f"{server.base}/console#/new")
    browser.loaded("#/new")
    logs = Select(browser.driver.find_element(By.ID, "logsTelemetryId"))
    assert [o.text for o in logs.options] == ["none"]
    Select(browser.driver.find_element(By.ID, "tracesTelemetryId")).select_by_value(tid)
    Select(browser.driver.find_element(By.ID, "metricsTelemetryId")).select_by_value(tid)
    fill(browser, {"name": "console-exported", "containerImage": "nvcr.io/acme/echo:1.0"})
    browser.click("#create-form-submit")
    browser.wait(lambda: "/versions/" in hash_of(browser), "the new version's view")
    fid, vid = hash_of(browser).split("/")[2], hash_of(browser).split("/")[4]
    browser.loaded(f"#/functions/{fid}/versions/{vid}")
    browser.wait_text("#version-telemetries", f"TRACES → {tid}")
    version = server.api("GET", f"/functions/{fid}/versions/{vid}")["function"]
    assert version["telemetries"] == {"metricsTelemetryId": tid, "tracesTelemetryId": tid}

    server.api(
        "POST", f"/deployments/functions/{fid}/versions/{vid}", {"deploymentSpecifications": [SPEC]}
    )
    browser.wait(
        lambda: (
            browser.js("return document.querySelector('#status .badge').dataset.value") == "ACTIVE"
        ),
        "the version ACTIVE",
    )
    for _ in range(5):
        resp = httpx.post(
            f"{server.base}/v2/nvcf/pexec/functions/{fid}",
            json={},
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=30,
        )
        assert resp.status_code == 200, resp.text

    # the endpoint refuses: its row shows why and counts the drops
    browser.driver.get(f"{server.base}/console#/telemetries")
    browser.loaded("#/telemetries")
    browser.wait_text(f"{row} .last-error", "HTTP 401")
    browser.wait(lambda: int(browser.text(f"{row} .dropped") or 0) >= 5, "the drops counted")
    assert (browser.text(f"{row} .last-success") or "").strip() == "—"
    screenshot("telemetries")

    # in use by the version: refused, the reason shown, nothing deleted
    browser.click(f"#delete-{tid}")
    alert = browser.wait(lambda: browser.driver.switch_to.alert, "the confirmation")
    assert "console-otlp" in alert.text
    alert.accept()
    browser.wait_text(f"#delete-{tid}-error", "in use by")
    assert len(server.api("GET", "/telemetries")["telemetries"]) == 1

    for path in (
        f"/deployments/functions/{fid}/versions/{vid}",
        f"/functions/{fid}/versions/{vid}",
    ):
        deleted = httpx.delete(
            f"{server.base}/v2/nvcf{path}",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=30,
        )
        assert deleted.status_code < 300, deleted.text

    def version_gone() -> bool:
        answer = httpx.get(
            f"{server.base}/v2/nvcf/functions/{fid}/versions/{vid}",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        )
        return answer.status_code == 404

    browser.wait(version_gone, "the version deleted")
    browser.click(f"#delete-{tid}")
    browser.wait(lambda: browser.driver.switch_to.alert, "the confirmation").accept()
    browser.wait(lambda: browser.count(row) == 0, "the deleted endpoint gone from the list")
    assert server.api("GET", "/telemetries")["telemetries"] == []
    # the console's only errors: the API's answers to the bad input and to the refused
    # deletion (400), the version's deployment read before it was deployed (404)
    problems = [
        p["message"]
        for p in browser.network.problems()
        if "status of 400 (Bad Request)" not in p["message"]
        and not ("/deployments/functions/" in p["message"] and "404" in p["message"])
    ]
    assert problems == []
    assert_private(browser, server)
