"""`nvcf invoke --grpc` against a real server with its gRPC listener on (the built-in simulated
catalog, whose worker echoes gRPC calls): a raw method's bytes, the health check, refusals."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.client_cli import Nvcf, served
from tests.support.server import free_port

GRPC_FN = (
    "--image",
    "nvcr.io/acme/grpc-echo:1.0",
    "--inference-url",
    "/gRPC",
    "--inference-port",
    "8001",
)
H100 = ("--gpu", "H100", "--instance-type", "NCP.GPU.H100_1x")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    port = free_port()
    data = tmp_path_factory.mktemp("server")
    with served(data, NVCF_GRPC_ENABLED="true", NVCF_GRPC_PORT=str(port)) as url:
        yield url, port


def test_invoke_grpc_calls_a_raw_method_and_the_health_service(
    server: tuple[str, int], tmp_path: Path
) -> None:
    url, port = server
    nvcf = Nvcf(url, tmp_path / "config")
    fn = nvcf.json("function", "create", "--name", "grpc-echo", *GRPC_FN)["function"]
    fid, vid = str(fn["id"]), str(fn["versionId"])
    assert nvcf("deploy", fid, vid, *H100, "--min", "1", "--wait").exit_code == 0
    address = ("--grpc", "--grpc-address", f"127.0.0.1:{port}")

    raw = nvcf.json("invoke", fid, *address, "--method", "/any.Echo/Say", "--data", "hello")
    assert (raw["code"], raw["body"], raw["encoding"]) == ("OK", "hello", "utf-8")
    assert raw["requestId"]
    text = nvcf("invoke", fid, "--version", vid, *address, "--method", "/a.B/C", "--data", "hi")
    assert text.exit_code == 0 and text.stdout.strip() == "hi"

    # the simulated echo answers the health check with its own (empty) request: not SERVING
    health = nvcf("invoke", fid, *address)
    assert health.exit_code == 3
    assert "UNKNOWN" in health.stdout and "answered UNKNOWN" in health.stderr

    unknown = nvcf("invoke", "00000000-0000-0000-0000-000000000000", *address)
    assert unknown.exit_code == 3 and "NOT_FOUND" in unknown.stderr
    nobody = nvcf(
        "invoke", fid, "--grpc", "--grpc-address", f"127.0.0.1:{free_port()}", "--timeout", "5"
    )
    assert nobody.exit_code == 3 and "UNAVAILABLE" in nobody.stderr
