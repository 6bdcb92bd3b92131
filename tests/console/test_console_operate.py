"""The console operating functions in a real headless Chromium against a real server process:
create → deploy (ACTIVE seen) → invoke in the playground (the answer shown, with its request
id and timing) → the logs view follows (a request made meanwhile appears) → undeploy (after a
confirmation); a bad input shows the violation next to its field and changes nothing; a key
without `deploy_function` sees the actions disabled. Screenshots of each view are kept."""

from __future__ import annotations

import json

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from tests.support.app import ADMIN_KEY
from tests.support.charts import PushCorpus
from tests.support.console import Browser, ConsoleServer, Screenshot, assert_private

pytestmark = pytest.mark.registry


def fill(browser: Browser, values: dict[str, str]) -> None:
    for field_id, text in values.items():
        element = browser.driver.find_element(By.ID, field_id)
        element.clear()
        if text:
            element.send_keys(text)


def hash_of(browser: Browser) -> str:
    return str(browser.js("return location.hash"))


def test_create_deploy_invoke_follow_logs_and_undeploy(
    console_server: ConsoleServer, browser: Browser, screenshot: Screenshot
) -> None:
    server = console_server
    before = len(server.api("GET", "/functions")["functions"])
    browser.open(server, "#/functions")
    browser.click("#new-function")
    browser.loaded("#/new")

    # a bad input: the violation next to its field, nothing created
    fill(browser, {"name": "", "containerImage": "nvcr.io/acme/echo:1.0"})
    browser.click("#create-form-submit")
    browser.wait(lambda: browser.text("#name-error"), "the name's violation shown")
    assert (
        browser.js("return document.getElementById('name').getAttribute('aria-invalid')") == "true"
    )
    screenshot("create-invalid")
    assert len(server.api("GET", "/functions")["functions"]) == before

    fill(browser, {"name": "console-echo"})
    browser.click("#create-form-submit")
    browser.wait(lambda: "/versions/" in hash_of(browser), "the new version's view")
    fid, vid = hash_of(browser).split("/")[2], hash_of(browser).split("/")[4]
    browser.loaded(f"#/functions/{fid}/versions/{vid}")
    screenshot("created")

    browser.click("#deploy-link")
    browser.loaded(f"#/functions/{fid}/versions/{vid}/deploy")
    options = Select(browser.driver.find_element(By.ID, "instanceType")).options
    assert any("NCP.GPU.H100_1x" in o.text for o in options)
    fill(browser, {"minInstances": "3", "maxInstances": "1"})
    browser.click("#deploy-form-submit")
    browser.wait(
        lambda: browser.text("#minInstances-error") or browser.text("#maxInstances-error"),
        "the scaling violation next to its field",
    )
    screenshot("deploy-invalid")
    live = httpx.get(
        f"{server.base}/v2/nvcf/deployments/functions/{fid}/versions/{vid}",
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
    )
    assert live.status_code == 404  # nothing deployed

    fill(browser, {"minInstances": "1", "maxInstances": "1"})
    browser.click("#deploy-form-submit")
    browser.wait(lambda: hash_of(browser).startswith("#/deployments/"), "the deployment view")
    did = hash_of(browser).split("/")[2]
    browser.wait_text("#status", "ACTIVE")
    screenshot("deployed")

    browser.click("#invoke-link")
    browser.loaded(f"#/functions/{fid}/versions/{vid}/invoke")
    browser.click("#invoke-form-submit")
    browser.wait_text("#answer", '"echo"')
    meta = browser.wait_text("#answer-meta", "done after")
    assert "HTTP 200" in meta and "request " in meta and "request —" not in meta
    screenshot("invoked")

    # the version's charts of the last hour: the request counted, one instance Running
    browser.driver.get(f"{server.base}/console#/functions/{fid}/versions/{vid}")
    browser.loaded(f"#/functions/{fid}/versions/{vid}")
    browser.wait_text("#chart-instances figcaption", "Running: 1")
    browser.wait(
        lambda: browser.js(
            "return [...document.querySelectorAll('#chart-requests path[data-series=requests]')]"
            ".some((p) => p.getAttribute('d').includes('L'))"
        ),
        "a requests line",
    )
    assert "p99" in (browser.text("#chart-latency figcaption") or "")
    screenshot("charts")

    browser.driver.get(f"{server.base}/console#/deployments/{did}/logs")
    browser.loaded(f"#/deployments/{did}/logs")
    browser.wait_text("#log-state", "following")
    browser.wait_text("#log", "Starting inference")
    resp = httpx.post(
        f"{server.base}/v2/nvcf/pexec/functions/{fid}",
        json={},
        headers={"Authorization": f"Bearer {ADMIN_KEY}", "X-Sim-Log": "printed-while-followed"},
        timeout=30,
    )
    assert resp.status_code == 200, resp.text
    browser.wait_text("#log", "printed-while-followed")
    screenshot("logs")

    browser.driver.get(f"{server.base}/console#/deployments/{did}")
    browser.loaded(f"#/deployments/{did}")
    browser.click("#undeploy")
    alert = browser.wait(lambda: browser.driver.switch_to.alert, "the confirmation")
    assert "Undeploy console-echo?" in alert.text
    alert.accept()
    browser.wait(lambda: hash_of(browser) == f"#/functions/{fid}/versions/{vid}", "version view")

    def gone() -> bool:
        url = f"{server.base}/v2/nvcf/deployments/functions/{fid}/versions/{vid}"
        answer = httpx.get(url, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        return answer.status_code == 404

    browser.wait(gone, "the deployment removed")
    # the console's only errors: the API's answers to the two bad inputs, the version's
    # deployment read once it is undeployed (404: "not deployed")
    unexpected = [
        p["message"]
        for p in browser.network.problems()
        if "status of 400 (Bad Request)" not in p["message"]
        and not ("/deployments/functions/" in p["message"] and "404" in p["message"])
    ]
    assert unexpected == []
    assert_private(browser, server)


def test_a_key_without_deploy_function_sees_the_actions_disabled(
    console_server: ConsoleServer, browser: Browser, screenshot: Screenshot
) -> None:
    server = console_server
    body = {
        "name": "console-readonly",
        "inferenceUrl": "/echo",
        "inferencePort": 8000,
        "containerImage": "nvcr.io/acme/echo:1.0",
    }
    fn = server.api("POST", "/functions", body)["function"]
    key = server.api("POST", "/api-keys", {"scopes": ["list_functions", "invoke_function"]})[
        "apiKey"
    ]["key"]
    browser.driver.get(f"{server.base}/console#/functions")
    if browser.js("return !document.getElementById('forget').hidden"):
        browser.click("#forget")
    browser.sign_in(key)
    version = f"#/functions/{fn['id']}/versions/{fn['versionId']}"
    browser.driver.get(f"{server.base}/console{version}")
    browser.loaded(version)
    assert browser.js("return document.getElementById('deploy-link').disabled") is True
    screenshot("version-readonly")
    browser.driver.get(f"{server.base}/console{version}/deploy")
    browser.loaded(f"{version}/deploy")
    assert browser.js("return document.getElementById('deploy-form-submit').disabled") is True
    assert "deploy_function" in (browser.text("#deploy-form-disabled") or "")
    screenshot("deploy-readonly")
    # the only errors: the API's 403s to the reads this key may not make (the probe of what it
    # may do, and the version's deployment)
    unexpected = [
        p["message"]
        for p in browser.network.problems()
        if "status of 403 (Forbidden)" not in p["message"]
    ]
    assert unexpected == []
    browser.click("#forget")


def test_change_the_configuration_then_roll_back(
    console_server: ConsoleServer,
    browser: Browser,
    screenshot: Screenshot,
    push_corpus: PushCorpus,
) -> None:
    server = console_server
    chart = push_corpus(server.registry, "sim-workload")
    body = {
        "name": "console-helm",
        "inferenceUrl": "/v2/models/m/infer",
        "inferencePort": 8000,
        "helmChart": chart.file_url,
        "helmChartServiceName": "entrypoint",
    }
    fn = server.api("POST", "/functions", body)["function"]
    spec = {"gpu": "H100", "instanceType": "NCP.GPU.H100_1x", "minInstances": 1, "maxInstances": 1}
    path = f"/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
    # the deploy view's dry run: a NodePort Service is refused, and then nothing is deployed
    node_port = {"service": {"name": "entrypoint", "type": "NodePort", "port": 8000}}
    browser.open(server, f"#/functions/{fn['id']}/versions/{fn['versionId']}/deploy")
    fill(browser, {"configuration": json.dumps(node_port)})
    browser.click("#dry-run-button")
    browser.wait_text("#dry-run-verdict", "NOT valid")
    assert "service-type" in (browser.text("#dry-run-findings") or "")
    screenshot("dry-run")
    browser.click("#deploy-form-submit")
    browser.wait(lambda: browser.text("#deploy-form .form-error"), "the deploy refused")
    assert "NodePort" in (browser.text("#deploy-form") or "")
    refused = httpx.get(
        f"{server.base}/v2/nvcf{path}", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    )
    assert refused.status_code == 404
    fill(browser, {"configuration": ""})
    browser.click("#dry-run-button")
    browser.wait_text("#dry-run-verdict", "valid: ")

    did = server.api("POST", path, {"deploymentSpecifications": [spec]})["deployment"][
        "deploymentId"
    ]
    browser.open(server, f"#/deployments/{did}")
    browser.wait_text("#status", "ACTIVE")
    browser.click("#configure-link")
    browser.loaded(f"#/deployments/{did}/configure")

    fill(browser, {"configuration": "{not json"})
    browser.click("#configure-form-submit")
    browser.wait(lambda: browser.text("#configuration-error"), "the JSON error at its field")
    fill(browser, {"configuration": '{"podAnnotations": {"example.com/rev": "two"}}'})
    browser.click("#configure-form-submit")
    browser.loaded(f"#/deployments/{did}")
    browser.wait_text("#specifications .rollout", "revision 2; rollout to 2: completed")
    browser.wait(lambda: browser.count("#revisions tbody tr") == 2, "two revisions listed")
    screenshot("configured")

    browser.click("#rollback-1")
    alert = browser.wait(lambda: browser.driver.switch_to.alert, "the confirmation")
    assert "back to revision 1" in alert.text
    alert.accept()
    browser.wait_text("#specifications .rollout", "revision 1; rollout to 1: completed")
    screenshot("rolled-back")
    assert [p for p in browser.network.problems() if "400" not in p["message"]] == []


def test_a_yaml_configuration_deploys_and_a_yaml_error_deploys_nothing(
    console_server: ConsoleServer,
    browser: Browser,
    screenshot: Screenshot,
    push_corpus: PushCorpus,
) -> None:
    """The configuration fields take YAML as well as JSON (the vendored js-yaml, loaded under
    the console's Content-Security-Policy and Trusted Types without a single violation)."""
    server = console_server
    chart = push_corpus(server.registry, "sim-workload")
    body = {
        "name": "console-yaml",
        "inferenceUrl": "/v2/models/m/infer",
        "inferencePort": 8000,
        "helmChart": chart.file_url,
        "helmChartServiceName": "entrypoint",
    }
    fn = server.api("POST", "/functions", body)["function"]
    path = f"/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
    browser.open(server, f"#/functions/{fn['id']}/versions/{fn['versionId']}/deploy")
    browser.loaded(f"#/functions/{fn['id']}/versions/{fn['versionId']}/deploy")

    # a syntax error: the parser's message (its line) at the field, and nothing deployed
    fill(browser, {"configuration": "podAnnotations:\n  example.com/rev: [one\n"})
    browser.click("#deploy-form-submit")
    error = browser.wait(lambda: browser.text("#configuration-error"), "the YAML error shown")
    assert error is not None
    assert "flow collection (2:24)" in error and "example.com/rev: [one" in error
    assert (
        browser.js("return document.getElementById('configuration').getAttribute('aria-invalid')")
        == "true"
    )
    screenshot("deploy-yaml-invalid")
    # a list is YAML too, but not a configuration
    fill(browser, {"configuration": "- a\n- b\n"})
    browser.click("#deploy-form-submit")
    browser.wait_text("#configuration-error", "must be a mapping")
    refused = httpx.get(
        f"{server.base}/v2/nvcf{path}", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    )
    assert refused.status_code == 404

    # the dry run reads the same YAML
    fill(browser, {"configuration": "service:\n  name: entrypoint\n  type: NodePort\n"})
    browser.click("#dry-run-button")
    browser.wait_text("#dry-run-verdict", "NOT valid")

    fill(
        browser,
        {
            "configuration": "# the annotation rides on every pod\npodAnnotations:\n"
            "  example.com/rev: one\n  example.com/count: '2'\n"
        },
    )
    browser.click("#deploy-form-submit")
    browser.wait(lambda: hash_of(browser).startswith("#/deployments/"), "the deployment view")
    did = hash_of(browser).split("/")[2]
    dep = server.api("GET", f"/deployments/{did}")["deployment"]
    assert dep["deploymentSpecifications"][0]["configuration"] == {
        "podAnnotations": {"example.com/rev": "one", "example.com/count": "2"}
    }
    browser.wait_text("#status", "ACTIVE")
    screenshot("deployed-from-yaml")

    # the change-configuration form takes YAML too: revision 2
    browser.click("#configure-link")
    browser.loaded(f"#/deployments/{did}/configure")
    fill(browser, {"configuration": "podAnnotations:\n  example.com/rev: two\n"})
    browser.click("#configure-form-submit")
    browser.loaded(f"#/deployments/{did}")
    browser.wait_text("#specifications .rollout", "revision 2; rollout to 2: completed")
    # the module loaded under the policy: no violation, no failed load (only the refusals)
    assert [p for p in browser.network.problems() if "400" not in p["message"]] == []
