"""`NVCF_LOG_FORMAT=json` on the real server process (docs/telemetry.md): every line it writes,
on stdout or stderr, is one JSON object with timestamp, level, logger, message and requestId;
records logged by domain code during a request carry that request's id; no key or password is
ever written."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.core.logs import configure_logging, request_id_var
from tests.support.app import ADMIN_KEY
from tests.support.catalogs import PERMISSIVE, write_catalog
from tests.support.charts import flat_chart, push_archive
from tests.support.nvcf_cli import add_request, encode_secret
from tests.support.registry import RegistryServer
from tests.support.server import free_port, start_server, stop_server

FIELDS = {"timestamp", "level", "logger", "message", "requestId"}
PASSWORD = "pw-never-logged-3e1b9c"
WRONG_KEY = "nvapi-wrong-key-never-logged-" + "b" * 30


def parse_lines(text: str) -> list[dict[str, Any]]:
    """Every line as JSON, each with the fields of docs/telemetry.md (AssertionError if not)."""
    records = []
    for line in text.splitlines():
        assert line.strip(), "an empty line"
        try:
            record = json.loads(line)
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
        assert isinstance(record, dict) and record.keys() >= FIELDS, line
        datetime.fromisoformat(record["timestamp"])
        records.append(record)
    return records


def test_every_line_of_the_server_is_json_with_the_request_id(tmp_path: Path) -> None:
    closed = free_port()  # nothing listens there: pulls from it fail as "unreachable"
    registry = f"127.0.0.1:{closed}"
    data = tmp_path / "data"
    port = free_port()
    proc = start_server(
        data,
        f"sqlite+aiosqlite:///{tmp_path / 'nvcf.db'}",
        port,
        NVCF_LOG_FORMAT="json",
        NVCF_REGISTRY_ALLOWLIST=registry,
        NVCF_INSECURE_REGISTRIES=registry,
    )
    base = f"http://127.0.0.1:{port}"
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    chosen_id = str(uuid.uuid4())
    try:
        with httpx.Client(base_url=base, headers=admin, timeout=30) as client:
            listed = client.get("/v2/nvcf/functions", headers={"X-Request-Id": chosen_id})
            credential = client.post(
                "/v2/nvcf/registry-credentials",
                json=add_request("registry.example.com", "robot", PASSWORD, ["HELM"]),
            )
            refused = client.get(
                "/v2/nvcf/functions", headers={"Authorization": f"Bearer {WRONG_KEY}"}
            )
            pull = client.post(
                "/v2/nvcf/functions",
                json={
                    "name": "helm-fn",
                    "inferenceUrl": "/infer",
                    "inferencePort": 8000,
                    "helmChart": f"oci://{registry}/charts/demo:1.0.0",
                    "helmChartServiceName": "entrypoint",
                },
            )
            metrics = client.get("/metrics").text
    finally:
        stop_server(proc)
    assert listed.status_code == 200 and listed.headers["x-request-id"] == chosen_id
    assert credential.status_code == 200, credential.text
    assert refused.status_code == 401
    assert pull.status_code == 502, pull.text
    assert 'nvcf_registry_errors_total{kind="unreachable"} 1.0' in metrics

    text = (data / "server.log").read_text()  # the process's stdout and stderr
    records = parse_lines(text)

    # the access line of each request carries the id its response names
    access = {r["requestId"]: r for r in records if r["logger"] == "nvcf.access"}
    for resp in (listed, credential, refused, pull):
        line = access[resp.headers["x-request-id"]]
        assert (line["method"], line["status"]) == (resp.request.method, resp.status_code)
        assert line["path"] == resp.request.url.path

    # a warning from a domain module, logged during the pull, names the same request
    [warning] = [r for r in records if r["logger"] == "service.charts.pipeline"]
    assert warning["level"] == "WARNING" and "unreachable" in warning["message"]
    assert warning["requestId"] == pull.headers["x-request-id"]
    assert warning["registryErrorKind"] == "unreachable"
    # records logged outside any request (start-up) say so
    assert any(r["requestId"] is None and r["logger"] == "nvcf.server" for r in records)

    # no key, password or encoded secret, in any line
    for secret in (ADMIN_KEY, WRONG_KEY, PASSWORD, encode_secret("robot", PASSWORD)):
        assert secret not in text
    assert "Bearer" not in text


def test_the_request_id_of_a_record_comes_from_the_context(tmp_path: Path) -> None:
    import logging

    out = tmp_path / "out.log"
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        with out.open("w") as stream:
            configure_logging("json", stream=stream)
            token = request_id_var.set("rid-1")
            try:
                logging.getLogger("nvcf.test").warning("inside %s", "a request")
            finally:
                request_id_var.reset(token)
            try:
                raise ValueError("boom")
            except ValueError:
                logging.getLogger("nvcf.test").exception("outside, with a traceback")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
        logging.captureWarnings(False)
    inside, outside = parse_lines(out.read_text())
    assert (inside["requestId"], inside["message"]) == ("rid-1", "inside a request")
    assert (inside["level"], inside["logger"]) == ("WARNING", "nvcf.test")
    assert outside["requestId"] is None and "ValueError: boom" in outside["exc_info"]


@pytest.mark.registry
def test_a_server_with_grpc_starting_a_chart_render_process_writes_only_json(
    tmp_path: Path, anon_registry: RegistryServer
) -> None:
    # The render worker is a subprocess, started (forked by the event loop) while the gRPC
    # listener's threads run: grpcio's own fork handler must write nothing.
    archive = flat_chart(tmp_path / "chart", None, {})
    chart = push_archive(anon_registry, archive, "jsonlogs", workdir=tmp_path / "push")
    host = anon_registry.host
    data = tmp_path / "data"
    port = free_port()
    proc = start_server(
        data,
        f"sqlite+aiosqlite:///{tmp_path / 'nvcf.db'}",
        port,
        NVCF_LOG_FORMAT="json",
        NVCF_GRPC_ENABLED="true",
        NVCF_GRPC_PORT=str(free_port()),
        NVCF_REGISTRY_ALLOWLIST=host,
        NVCF_INSECURE_REGISTRIES=host,
        NVCF_CLUSTERS_FILE=str(write_catalog(tmp_path, PERMISSIVE)),
    )
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=admin, timeout=60) as c:
            resp = c.post(
                "/v2/nvcf/helm/validate",
                json={
                    "helmChart": chart.file_url,
                    "helmChartServiceName": "entrypoint",
                    "inferencePort": 8000,
                },
            )
    finally:
        stop_server(proc)
    assert resp.status_code == 200 and resp.json()["valid"] is True, resp.text
    records = parse_lines((data / "server.log").read_text())
    assert any("gRPC invocation on" in r["message"] for r in records)
