"""The web console at /console in a real headless Chromium, against a real server process on
the simulated catalog: the pages load, a deployed function is seen reaching ACTIVE, a failed
one (a fault annotation of the simulated backend) is shown with its reason, the page loads
nothing from another host, and the key stays out of every URL and off every other request.
Each page seen is kept as a screenshot (the terminal summary lists them)."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import httpx
import pytest

from service.console import CONTENT_SECURITY_POLICY
from tests.support.app import ADMIN_KEY
from tests.support.charts import PushCorpus
from tests.support.console import Browser, ConsoleServer, Screenshot, assert_private, header

pytestmark = pytest.mark.registry

FAULT = "sim.nvcf.io/fault"


def container_function(server: ConsoleServer, name: str) -> dict[str, Any]:
    body = {
        "name": name,
        "inferenceUrl": "/echo",
        "inferencePort": 8000,
        "containerImage": "nvcr.io/acme/echo:1.0",
    }
    fn: dict[str, Any] = server.api("POST", "/functions", body)["function"]
    return fn


def deploy(server: ConsoleServer, fn: dict[str, Any], spec: dict[str, Any]) -> str:
    path = f"/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
    dep = server.api("POST", path, {"deploymentSpecifications": [spec]})["deployment"]
    return str(dep["deploymentId"])


def csp(value: str) -> dict[str, str]:
    """directive -> its sources, of a Content-Security-Policy header"""
    pairs = (part.strip().partition(" ") for part in value.split(";") if part.strip())
    return {name: sources for name, _, sources in pairs}


def test_the_console_is_served_with_a_strict_content_security_policy(
    console_server: ConsoleServer,
) -> None:
    page = httpx.get(f"{console_server.base}/console")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert page.headers["cache-control"] == "no-store"
    policy = csp(page.headers["content-security-policy"])
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert policy["default-src"] == "'none'"
    for directive in ("script-src", "style-src", "img-src", "connect-src"):
        assert policy[directive] == "'self'", directive
    for directive in ("base-uri", "form-action", "frame-ancestors", "object-src"):
        assert policy[directive] == "'none'", directive
    assert policy["require-trusted-types-for"] == "'script'"
    assert "unsafe" not in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["referrer-policy"] == "no-referrer"
    # every file the page names is this server's, by absolute path, and served with the policy
    urls = re.findall(r'(?:src|href)="([^"#]+)"', page.text)
    assert len(urls) == 3, urls
    for url in urls:
        assert url.startswith("/console/assets/"), url
        asset = httpx.get(f"{console_server.base}{url}")
        assert asset.status_code == 200, url
        assert asset.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert asset.headers["x-content-type-options"] == "nosniff"
    missing = httpx.get(f"{console_server.base}/console/assets/index.html")
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/problem+json"


def test_a_deployed_function_is_seen_reaching_active(
    console_server: ConsoleServer, browser: Browser, screenshot: Screenshot
) -> None:
    fn = container_function(console_server, "console-echo")
    spec = {"gpu": "L40S", "instanceType": "DGXC.GPU.L40S_1x", "minInstances": 1, "maxInstances": 1}
    deployment_id = deploy(console_server, fn, spec)

    browser.open(console_server)
    row = f'#functions tr[data-version-id="{fn["versionId"]}"]'
    browser.wait_text(row, "console-echo")
    browser.wait_text(f"{row} td:nth-child(5)", "deployment")
    screenshot("functions")

    browser.click(f'{row} a[href^="#/functions/"]')
    browser.loaded(f"#/functions/{fn['id']}/versions/{fn['versionId']}")
    assert "no chart findings" in (browser.text("#findings") or "")
    browser.wait_text("#deployment-link", "ACTIVE")
    screenshot("version")

    browser.click("#deployment-link a")
    browser.loaded(f"#/deployments/{deployment_id}")
    browser.wait_text("#status", "ACTIVE")
    browser.wait_text("#instances tbody", "Running")
    browser.wait(
        lambda: browser.count("#timeline .instance-row rect.phase-Running") == 1,
        "a Running bar in the timeline chart",
    )
    assert browser.count("#timeline .instance-row") == 1
    browser.wait(
        lambda: browser.count('#timeline rect[data-status="ACTIVE"]') == 1,
        "the version's ACTIVE span in the timeline chart",
    )
    events = browser.wait_text("#events", "DEPLOYING → ACTIVE")
    assert "INACTIVE → DEPLOYING" in events
    assert browser.text("#health") is None
    screenshot("deployment")
    assert_private(browser, console_server)
    assert browser.network.problems() == []


def test_a_failed_deployment_is_shown_with_its_reason(
    console_server: ConsoleServer,
    browser: Browser,
    screenshot: Screenshot,
    push_corpus: PushCorpus,
) -> None:
    chart = push_corpus(console_server.registry, "sim-workload")
    body = {
        "name": "console-broken",
        "inferenceUrl": "/v2/models/m/infer",
        "inferencePort": 8000,
        "helmChart": chart.file_url,
        "helmChartServiceName": "entrypoint",
    }
    fn = console_server.api("POST", "/functions", body)["function"]
    spec = {
        "gpu": "H100",
        "instanceType": "NCP.GPU.H100_1x",
        "minInstances": 1,
        "maxInstances": 1,
        "configuration": {"podAnnotations": {FAULT: "ImagePullBackOff"}},
    }
    deployment_id = deploy(console_server, fn, spec)

    browser.open(console_server, "#/deployments")
    row = f'#deployments tr[data-deployment-id="{deployment_id}"]'
    browser.wait_text(row, "console-broken")
    browser.click(f'{row} a[href^="#/deployments/"]')
    browser.loaded(f"#/deployments/{deployment_id}")
    browser.wait_text("#status", "ERROR")
    health = browser.wait_text("#health", "ImagePullIssues")
    assert "cannot pull image nvcr.io/acme/sim-worker:1.0" in health
    events = browser.wait_text("#events", "DEPLOYING → ERROR")
    assert "ImagePullIssues" in events
    failed = "#timeline .instance-row rect.phase-Failed"
    browser.wait(lambda: browser.count(failed) == 1, "a Failed bar in the timeline chart")
    assert "ImagePullIssues" in (browser.text(f"{failed} title") or "")
    assert browser.count("#timeline .instance-row rect.phase-Running") == 0
    assert browser.count('#timeline rect[data-status="ERROR"]') == 1
    screenshot("deployment")

    browser.click("#version-link")
    browser.loaded(f"#/functions/{fn['id']}/versions/{fn['versionId']}")
    browser.wait_text("#status", "ERROR")
    # the pipeline's findings of the chart at creation (it sets automountServiceAccountToken)
    findings = fn["findings"]
    assert findings
    assert browser.count("#findings tbody tr") == len(findings)
    shown = browser.text("#findings") or ""
    for finding in findings:
        assert finding["rule"] in shown and finding["message"] in shown, finding
    screenshot("version")
    assert_private(browser, console_server)
    assert browser.network.problems() == []


def test_a_key_that_only_lists_functions_sees_them_without_deployments(
    console_server: ConsoleServer, browser: Browser
) -> None:
    fn = container_function(console_server, "console-listed")
    body = {"scopes": ["list_functions"], "description": "console reader"}
    reader = console_server.api("POST", "/api-keys", body)["apiKey"]["key"]
    browser.open(console_server)
    browser.click("#forget")
    browser.sign_in(reader)
    browser.loaded("#/functions")
    browser.wait_text(f'#functions tr[data-version-id="{fn["versionId"]}"]', "console-listed")
    browser.wait_text("#view", "Deployments are not shown: 403")
    assert browser.count('#functions a[href^="#/deployments/"]') == 0
    assert_private(browser, console_server, key=reader)


def test_a_refused_key_is_forgotten_and_the_console_asks_again(
    console_server: ConsoleServer, browser: Browser
) -> None:
    browser.open(console_server)
    browser.click("#forget")
    browser.wait_text("#login-error", "forgotten")
    assert browser.stored_key() is None

    wrong = "nvapi-not-a-key-" + "x" * 40
    browser.sign_in(wrong)
    browser.wait_text("#login-error", "refused")
    assert browser.stored_key() is None
    assert browser.text("#view") == ""

    browser.sign_in(ADMIN_KEY)
    browser.loaded("#/functions")
    assert_private(browser, console_server)
    # the refused key went nowhere but to the API, in its Authorization header
    refused = [r for r in browser.network.requests() if wrong in r.url or wrong in str(r.headers)]
    assert refused
    for request in refused:
        assert request.url.startswith(f"{console_server.base}/v2/nvcf/"), request.url
        assert header(request, "Authorization") == f"Bearer {wrong}"


def test_the_vendored_yaml_parser_is_served_as_published_under_the_policy(
    console_server: ConsoleServer,
) -> None:
    asset = httpx.get(f"{console_server.base}/console/assets/js-yaml.esm.min.mjs?v=5.5.0")
    assert asset.status_code == 200
    assert asset.headers["content-type"].startswith("text/javascript")
    assert asset.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert asset.text.startswith(
        "/*! js-yaml 5.5.0 https://github.com/nodeca/js-yaml @license MIT */"
    )
    # byte for byte the npm package's file (docs/console.md "Vendored code")
    digest = hashlib.sha256(asset.content).hexdigest()
    assert digest == "de0f5266d4312ab9cd564aba4217eb9cc98dcfd18bd59988aa7e0971e7c722b5"
    # the vendor folder is not a directory served: only the names of the fixed list
    for name in ("vendor/js-yaml.esm.min.mjs", "js-yaml.LICENSE", "js-yaml.esm.min.mjs.map"):
        assert httpx.get(f"{console_server.base}/console/assets/{name}").status_code == 404


def test_an_llm_functions_models_are_shown_as_callers_name_them(
    console_server: ConsoleServer, browser: Browser
) -> None:
    body = {
        "name": "console-llm",
        "inferenceUrl": "/",
        "containerImage": "nvcr.io/acme/openai:1.0",
        "functionType": "LLM",
        "models": [
            {
                "name": "tiny",
                "llmConfig": {
                    "uris": ["/v1/chat/completions", "/v1/embeddings"],
                    "tokenRateLimit": "1000-S",
                },
            }
        ],
    }
    fn = console_server.api("POST", "/functions", body)["function"]
    browser.open(console_server)
    browser.wait_text(f'#functions tr[data-version-id="{fn["versionId"]}"]', "console-llm")
    browser.click(f'#functions tr[data-version-id="{fn["versionId"]}"] a[href^="#/functions/"]')
    browser.loaded(f"#/functions/{fn['id']}/versions/{fn['versionId']}")
    shown = browser.wait_text("#models", f"{fn['id']}/tiny")
    assert "/v1/chat/completions /v1/embeddings (1000-S tokens)" in shown
