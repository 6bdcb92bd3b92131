"""`nvcf telemetry create|list|get|set-key|delete` and `nvcf function create --telemetry`
against a real server."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.client_cli import Nvcf

KEY = "telemetry-key-never-shown-7c1d"


@pytest.fixture
def nvcf(server: str, tmp_path: Path) -> Nvcf:
    return Nvcf(server, tmp_path / "config")


def create(nvcf: Nvcf, name: str, *types: str, endpoint: str = "https://8.8.8.8/otlp") -> str:
    args = ["telemetry", "create", "--name", name, "--endpoint", endpoint]
    args += ["--provider", "OTEL_COLLECTOR", "--key", KEY]
    for kind in types:
        args += ["--type", kind]
    done = nvcf(*args)
    assert done.exit_code == 0, done.stderr
    assert KEY not in done.stdout
    return done.stdout.strip()


def test_create_list_get_name_on_a_function_and_delete(nvcf: Nvcf) -> None:
    traces = create(nvcf, "traces", "TRACES")
    both = create(nvcf, "logs-metrics", "LOGS", "METRICS")
    listed = nvcf.json("telemetry", "list")
    assert {t["telemetryId"] for t in listed} >= {traces, both}
    table = nvcf("telemetry", "list")
    assert table.exit_code == 0 and "logs-metrics" in table.stdout and KEY not in table.stdout
    got = nvcf.json("telemetry", "get", both)
    assert got["types"] == ["LOGS", "METRICS"] and KEY not in str(got)

    fn = nvcf.json(
        "function", "create", "--name", "fn", "--image", "nvcr.io/acme/echo:1.0",
        "--inference-url", "/echo", "--inference-port", "8000",
        "--telemetry", traces, "--telemetry", both,
    )["function"]  # fmt: skip
    assert fn["telemetries"] == {
        "logsTelemetryId": both,
        "metricsTelemetryId": both,
        "tracesTelemetryId": traces,
    }
    refused = nvcf("telemetry", "delete", traces)
    assert refused.exit_code == 1 and "in use" in refused.stderr

    replaced = nvcf("telemetry", "set-key", traces, "--name", "traces", "--key", "new")
    assert replaced.exit_code == 0, replaced.stderr
    assert nvcf("function", "delete", fn["id"], fn["versionId"]).exit_code == 0
    assert nvcf("telemetry", "delete", traces).exit_code == 0
    missing = nvcf("telemetry", "get", traces)
    assert missing.exit_code == 1 and "404" in missing.stderr


def test_two_telemetries_of_one_type_on_a_function_is_a_usage_error(nvcf: Nvcf) -> None:
    first = create(nvcf, "one", "METRICS")
    second = create(nvcf, "two", "METRICS")
    done = nvcf(
        "function", "create", "--name", "fn2", "--image", "nvcr.io/acme/echo:1.0",
        "--inference-url", "/echo", "--telemetry", first, "--telemetry", second,
    )  # fmt: skip
    assert done.exit_code == 2 and "both receive METRICS" in done.stderr


def test_a_refused_endpoint_names_the_reason(nvcf: Nvcf) -> None:
    done = nvcf(
        "telemetry", "create", "--name", "local", "--endpoint", "http://127.0.0.1:4318",
        "--provider", "OTEL_COLLECTOR", "--type", "TRACES", "--key", KEY,
    )  # fmt: skip
    assert done.exit_code == 1 and "loopback" in done.stderr and KEY not in done.stderr
