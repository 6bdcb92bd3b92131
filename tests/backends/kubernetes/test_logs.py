"""The kubernetes adapter reads instance logs through the pods' log subresource of the test
API server (tests/support/fake_k8s.py): every pod and container, streamed, `previous`, the
bounds passed on, a follow that ends with its container, and the API server's refusals."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from service.backends import AdapterError, InstanceSpec
from service.backends.kubernetes import KubernetesAdapter
from service.backends.logs import READ_LINE_BYTES, LogLine, LogRequest
from tests.support.fake_k8s import FakeKubernetes

NS = "sr-inst-1"


@pytest.fixture
def server() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as fake:
        yield fake


@pytest.fixture
async def adapter(server: FakeKubernetes, tmp_path: Path) -> AsyncIterator[KubernetesAdapter]:
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    k8s = KubernetesAdapter("k8s-test", kubeconfig=kubeconfig, context="fake")
    yield k8s
    await k8s.aclose()


INSTANCE = InstanceSpec(
    instance_id="inst-1",
    function_id="fn-1",
    version_id="ver-1",
    instance_type="NCP.GPU.H100_1x",
    gpu="H100",
    gpus_per_node=1,
)


def pod(
    name: str, *containers: str, init: tuple[str, ...] = (), restarts: int = 0
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "initContainers": [{"name": c, "image": "busybox"} for c in init],
            "containers": [{"name": c, "image": "nvcr.io/x/y:1"} for c in containers],
        },
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": c, "restartCount": restarts, "ready": True} for c in containers
            ],
        },
    }


async def read(adapter: KubernetesAdapter, request: LogRequest) -> list[LogLine]:
    return [line async for line in adapter.logs(INSTANCE, request)]


async def test_every_pod_and_container_is_read_with_the_bounds_passed_on(
    adapter: KubernetesAdapter, server: FakeKubernetes
) -> None:
    server.add_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    server.add_object(pod("web-0", "inference", "sidecar", init=("fetch",)))
    server.add_object(pod("web-1", "inference", "sidecar"))
    server.write_log(NS, "web-0", "fetch", "downloading", "done")
    server.write_log(NS, "web-0", "inference", *(f"line {i}" for i in range(10)))
    server.write_log(NS, "web-0", "sidecar", "proxy up")
    server.write_log(NS, "web-1", "inference", "other pod")
    # web-1's sidecar has not started: skipped, as kubectl --all-containers skips it

    lines = await read(adapter, LogRequest(tail_lines=3, timestamps=True, limit_bytes=10_000))

    by_source: dict[tuple[str, str], list[str]] = {}
    for line in lines:
        by_source.setdefault((line.pod, line.container), []).append(line.text)
        assert line.timestamp.endswith("Z")
    assert by_source == {
        ("web-0", "fetch"): ["downloading", "done"],
        ("web-0", "inference"): ["line 7", "line 8", "line 9"],
        ("web-0", "sidecar"): ["proxy up"],
        ("web-1", "inference"): ["other pod"],
    }
    queries = [r.query for r in server.requests if r.path.endswith("/log")]
    assert {q["container"] for q in queries} == {"fetch", "inference", "sidecar"}
    assert all(
        q["tailLines"] == "3" and q["timestamps"] == "true" and q["limitBytes"] == "10000"
        for q in queries
    )


async def test_previous_reads_the_run_before_the_restart(
    adapter: KubernetesAdapter, server: FakeKubernetes
) -> None:
    server.add_object(pod("web-0", "inference", restarts=2))
    server.add_object(pod("web-1", "inference"))  # never restarted: no previous run
    server.write_log(NS, "web-0", "inference", "Traceback ...", "RuntimeError: boom", previous=True)
    server.write_log(NS, "web-0", "inference", "starting again")
    server.write_log(NS, "web-1", "inference", "fine")

    lines = await read(adapter, LogRequest(previous=True))

    assert [(line.pod, line.text) for line in lines] == [
        ("web-0", "Traceback ..."),
        ("web-0", "RuntimeError: boom"),
    ]
    assert [r.query.get("previous") for r in server.requests if r.path.endswith("/log")] == ["true"]


async def test_follow_streams_lines_as_written_and_ends_with_the_container(
    adapter: KubernetesAdapter, server: FakeKubernetes
) -> None:
    server.add_object(pod("web-0", "inference"))
    server.write_log(NS, "web-0", "inference", "started")
    stream = adapter.logs(INSTANCE, LogRequest(follow=True))

    assert (await anext(stream)).text == "started"
    server.write_log(NS, "web-0", "inference", "served POST /echo")
    assert (await anext(stream)).text == "served POST /echo"
    server.write_log(NS, "web-0", "inference", "exiting")
    server.end_log(NS, "web-0", "inference")
    assert [line.text async for line in stream] == ["exiting"]


async def test_a_follow_left_by_its_reader_is_closed(
    adapter: KubernetesAdapter, server: FakeKubernetes
) -> None:
    server.add_object(pod("web-0", "inference"))
    server.write_log(NS, "web-0", "inference", "started")
    stream = adapter.logs(INSTANCE, LogRequest(follow=True))
    assert isinstance(stream, AsyncGenerator)
    assert (await anext(stream)).text == "started"
    await stream.aclose()  # the caller went away: nothing keeps reading
    server.write_log(NS, "web-0", "inference", "nobody reads this")
    await asyncio.sleep(0)


async def test_a_container_named_alone_gets_the_api_servers_refusal(
    adapter: KubernetesAdapter, server: FakeKubernetes
) -> None:
    server.add_object(pod("web-0", "inference"))

    with pytest.raises(AdapterError) as waiting:
        await read(adapter, LogRequest(container="inference"))
    assert waiting.value.status == 400
    assert "is waiting to start: ContainerCreating" in waiting.value.message

    with pytest.raises(AdapterError) as previous:
        await read(adapter, LogRequest(container="inference", previous=True))
    assert 'previous terminated container "inference" in pod "web-0" not found' in (
        previous.value.message
    )

    with pytest.raises(AdapterError) as unknown:
        await read(adapter, LogRequest(container="nope"))
    assert unknown.value.status == 400
    assert 'container "nope" is not valid' in unknown.value.message


async def test_an_instance_without_pods_has_no_lines(adapter: KubernetesAdapter) -> None:
    assert await read(adapter, LogRequest(follow=True, container="inference")) == []


async def test_an_unreachable_api_server_is_an_adapter_error(
    adapter: KubernetesAdapter, server: FakeKubernetes
) -> None:
    server.add_object(pod("web-0", "inference"))
    server.write_log(NS, "web-0", "inference", "x")
    server.inject_error(
        "GET",
        f"/api/v1/namespaces/{NS}/pods",
        {"kind": "Status", "code": 403, "message": 'pods is forbidden: User "x" cannot list'},
    )
    with pytest.raises(AdapterError) as denied:
        await read(adapter, LogRequest())
    assert denied.value.status == 403


async def test_a_line_of_20_mb_is_cut_as_it_arrives_and_the_next_lines_follow(
    adapter: KubernetesAdapter, server: FakeKubernetes
) -> None:
    """A worker printing a `\\r` progress bar writes one line of any size: the reader keeps
    READ_LINE_BYTES of it (room to mask a secret before the line is cut), drops the rest."""
    server.add_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    server.add_object(pod("web-0", "inference"))
    bar = "".join(f"\r{i % 100:3d}%" for i in range(4_000_000))  # 20 MB, no newline
    server.write_log(NS, "web-0", "inference", "start", bar, "after")

    lines = await read(adapter, LogRequest(container="inference"))

    first, cut, after = (line.text for line in lines)
    assert (first, after) == ("start", "after")
    long = cut
    assert long.endswith("…[line truncated]")
    assert len(long.encode()) == READ_LINE_BYTES + len(" …[line truncated]".encode())
    assert long.startswith(bar[:1000])
