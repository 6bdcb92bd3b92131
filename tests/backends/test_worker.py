"""Reaching an instance's inference worker through its adapter (service/backends/worker.py):
the built-in simulated worker, a simulated cluster's upstream server, and a Kubernetes
Service by cluster DNS or through the API server's service proxy (fake API server)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from service.backends import InstanceSpec, NodeShape, SimulatedAdapter, SimulationDelays
from service.backends.kubernetes import KubernetesAdapter
from service.backends.worker import (
    WorkerEndpoint,
    WorkerFailed,
    WorkerPort,
    WorkerUnreachable,
    connection_headers,
)
from tests.support.fake_k8s import FakeKubernetes
from tests.support.upstream import UpstreamServer

PORT = WorkerPort("entrypoint", 8000, "/echo", health_path="/v2/health/ready")
DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "inference"},
    "spec": {
        "replicas": 1,
        "selector": {"matchLabels": {"app": "w"}},
        "template": {
            "metadata": {"labels": {"app": "w"}},
            "spec": {
                "containers": [
                    {"name": "w", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}
                ]
            },
        },
    },
}


def instance(n: int = 1) -> InstanceSpec:
    return InstanceSpec(f"inst-{n}", "fn-1", "ver-1", "NCP.GPU.H100_1x", "H100", 1)


@pytest.fixture
async def sim() -> AsyncIterator[SimulatedAdapter]:
    adapter = SimulatedAdapter(
        "sim", provider="NCP", nodes=[NodeShape("H100", 8, 1)], delays=SimulationDelays(0, 0, 0)
    )
    yield adapter
    await adapter.aclose()


@pytest.fixture
def upstream() -> Iterator[UpstreamServer]:
    server = UpstreamServer().start()
    yield server
    server.stop()


async def call(
    endpoint: WorkerEndpoint, path: str = "/echo", body: Any = None, **headers: str
) -> tuple[int, dict[str, str], bytes]:
    content = json.dumps(body).encode() if body is not None else b""
    hdrs = [("content-type", "application/json"), *headers.items()]
    response = await endpoint.send("POST", path, hdrs, content)
    try:
        headers = {k.lower(): v for k, v in response.headers}
        return response.status, headers, await response.read(1 << 20)
    finally:
        await response.aclose()


async def test_simulated_worker_echoes_body_path_instance_and_nvcf_headers(
    sim: SimulatedAdapter,
) -> None:
    await sim.apply(instance(), [DEPLOYMENT])
    endpoint = await sim.endpoint(instance(), PORT)
    status, headers, body = await call(
        endpoint, "/echo?x=1", {"q": 1}, **{"NVCF-REQID": "r-1", "X-Other": "no"}
    )
    assert status == 200
    assert headers["content-type"] == "application/json"
    assert json.loads(body) == {
        "echo": {"q": 1},
        "path": "/echo?x=1",
        "instanceId": "inst-1",
        "headers": {"NVCF-REQID": "r-1"},
        "secrets": [],
    }


async def test_simulated_worker_status_delay_text_and_health(sim: SimulatedAdapter) -> None:
    await sim.apply(instance(), [DEPLOYMENT])
    endpoint = await sim.endpoint(instance(), PORT)
    status, _, body = await call(endpoint, body=None, **{"X-Sim-Status": "503"})
    assert status == 503 and json.loads(body)["echo"] is None
    status, _, body = await call(endpoint, **{"X-Sim-Delay-Ms": "5"})
    assert status == 200
    response = await endpoint.send("POST", "/echo", [], b"plain text")
    assert json.loads(await response.read(1000))["echo"] == "plain text"
    assert endpoint.health_url is not None and endpoint.health_url.endswith("/v2/health/ready")
    assert await endpoint.health() == 200


async def test_simulated_worker_streams_events(sim: SimulatedAdapter) -> None:
    await sim.apply(instance(), [DEPLOYMENT])
    endpoint = await sim.endpoint(instance(), PORT)
    response = await endpoint.send(
        "POST", "/echo", [("accept", "text/event-stream"), ("x-sim-events", "2")], b"{}"
    )
    assert dict(response.headers)["content-type"] == "text/event-stream"
    chunks = [c async for c in response.iter_bytes()]
    assert [json.loads(c.decode()[len("data: ") :])["index"] for c in chunks] == [0, 1]


async def test_an_instance_the_cluster_does_not_run_refuses(sim: SimulatedAdapter) -> None:
    endpoint = await sim.endpoint(instance(2), PORT)
    with pytest.raises(WorkerUnreachable, match="no simulated worker"):
        await call(endpoint)
    await sim.apply(instance(2), [DEPLOYMENT])
    assert (await call(endpoint))[0] == 200
    await sim.delete(instance(2))
    with pytest.raises(WorkerUnreachable):
        await call(endpoint)


async def test_a_request_under_way_fails_as_soon_as_its_instance_is_deleted(
    sim: SimulatedAdapter,
) -> None:
    """A pod killed mid-request resets the connection then, not when the work would end."""
    await sim.apply(instance(3), [DEPLOYMENT])
    endpoint = await sim.endpoint(instance(3), PORT)
    slow = asyncio.ensure_future(call(endpoint, **{"X-Sim-Delay-Ms": "600000"}))
    while not sim._workers._working:  # until the worker has taken the request
        assert not slow.done(), slow.result()
        await asyncio.sleep(0.01)
    await sim.delete(instance(3))
    with pytest.raises(WorkerFailed, match="torn down"):
        await asyncio.wait_for(slow, 60)  # a bound for a hang, not a timing assertion


async def test_simulated_cluster_with_an_upstream_forwards_there(
    upstream: UpstreamServer,
) -> None:
    adapter = SimulatedAdapter(
        "sim", provider="NCP", nodes=[NodeShape("H100", 8, 1)], upstream=upstream.url + "/"
    )
    try:
        endpoint = await adapter.endpoint(instance(), PORT)
        assert endpoint.base_url == upstream.url
        status, headers, body = await call(endpoint, "/echo", {"a": 1}, **{"NVCF-REQID": "r"})
        assert status == 200 and headers["x-upstream"] == "yes"
        echoed = json.loads(body)
        assert echoed["echo"] == {"a": 1} and echoed["path"] == "/echo"
        assert echoed["headers"] == {"NVCF-REQID": "r"}
    finally:
        await adapter.aclose()
    url = upstream.url
    upstream.stop()
    closed = SimulatedAdapter("sim", provider="NCP", nodes=[], upstream=url)
    try:
        with pytest.raises(WorkerUnreachable, match="connection refused"):
            await call(await closed.endpoint(instance(), PORT))
    finally:
        await closed.aclose()


def test_hop_by_hop_headers_include_those_connection_names() -> None:
    names = connection_headers([("Connection", "keep-alive, X-Trace"), ("TE", "trailers")])
    assert {"x-trace", "keep-alive", "te", "transfer-encoding", "upgrade"} <= names


# ---------------------------------------------------------------------------- kubernetes


@pytest.fixture
def k8s_server() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as fake:
        yield fake


async def test_service_dns_endpoint_in_the_cluster(tmp_path: Path) -> None:
    adapter = KubernetesAdapter(
        "k", kubeconfig=tmp_path / "none", worker_access="serviceDns", cluster_domain="corp.local"
    )
    try:
        endpoint = await adapter.endpoint(instance(), PORT)
        assert endpoint.base_url == "http://entrypoint.sr-inst-1.svc.corp.local:8000"
        assert endpoint.url("/echo") == endpoint.base_url + "/echo"
        assert endpoint.health_url == (
            "http://entrypoint.sr-inst-1.svc.corp.local:8000/v2/health/ready"
        )
    finally:
        await adapter.aclose()
    assert KubernetesAdapter("k", in_cluster=True).worker_access == "serviceDns"
    assert KubernetesAdapter("k", kubeconfig="x").worker_access == "apiServerProxy"


async def test_api_server_proxy_reaches_the_service(
    k8s_server: FakeKubernetes, upstream: UpstreamServer, tmp_path: Path
) -> None:
    kubeconfig = k8s_server.write_kubeconfig(tmp_path / "kubeconfig")
    adapter = KubernetesAdapter("k", kubeconfig=kubeconfig, context="fake")
    try:
        endpoint = await adapter.endpoint(instance(), PORT)
        assert endpoint.base_url == (
            f"{k8s_server.url}/api/v1/namespaces/sr-inst-1/services/entrypoint:8000/proxy"
        )
        # No such Service yet, then a Service without ready pods: nothing reached a worker.
        with pytest.raises(WorkerUnreachable, match='services "entrypoint" not found'):
            await call(endpoint)
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "entrypoint"},
            "spec": {"ports": [{"port": 8000}]},
        }
        k8s_server.add_object(service, namespace="sr-inst-1")
        with pytest.raises(WorkerUnreachable, match="no endpoints available"):
            await call(endpoint)
        k8s_server.serve_endpoint("sr-inst-1", "entrypoint", 8000, upstream.address)
        status, _, body = await call(endpoint, "/echo?q=1", {"hi": True}, **{"NVCF-REQID": "x"})
        assert status == 200
        echoed = json.loads(body)
        assert echoed["echo"] == {"hi": True} and echoed["path"] == "/echo?q=1"
        # The worker's own 503 is its answer, not a refusal.
        status, _, _ = await call(endpoint, **{"X-Upstream-Status": "503"})
        assert status == 503
        assert await endpoint.health() == 200
        # The caller's credentials never reach the worker; the adapter's do reach the proxy.
        proxied = [r for r in k8s_server.requests if "/proxy" in r.path]
        assert proxied
    finally:
        await adapter.aclose()
