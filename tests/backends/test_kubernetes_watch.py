"""The Kubernetes adapter's change feed (issue 32) against the local test API server: its WATCH
of pods, controllers and warning events marks the instance whose namespace changed; a lost
watch is re-established and asks for one resync; through the app, a lost watch re-observes the
instance once, and a pod status change reaches the instance's condition by WATCH, with the
periodic pass and the resync an hour away."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from service.backends.changes import ChangeFeed
from service.backends.kubernetes import KubernetesAdapter
from service.backends.protocol import NodeShape
from service.deployments.reconcile import Reconciler
from tests.support.api import create_fn
from tests.support.app import ClientFactory
from tests.support.fake_k8s import FakeKubernetes, fixture, iter_fixture_items

V = "/v2/nvcf"
WATCHED_KINDS = 6  # pods, Deployments, ReplicaSets, StatefulSets, Jobs, warning events
NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def server() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as fake:
        yield fake


async def eventually(check: Callable[[], Awaitable[Any]], *, seconds: float = 30.0) -> Any:
    """Poll until `check()` returns something truthy; fail after the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        value = await check()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition not reached within {seconds}s")
        await asyncio.sleep(0.05)


def pod(name: str, namespace: str) -> dict[str, Any]:
    obj = fixture("pod-running.json")
    obj["metadata"]["name"] = name
    obj["metadata"]["namespace"] = namespace
    obj["metadata"].pop("ownerReferences", None)
    return obj


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


async def test_a_pod_change_marks_exactly_its_instance(
    server: FakeKubernetes, tmp_path: Path
) -> None:
    for ns in ("sr-inst-1", "sr-inst-2", "kube-system"):
        server.add_object(namespace(ns))
        server.add_object(pod("web-0", ns))
    adapter = KubernetesAdapter(
        "k8s-test",
        kubeconfig=server.write_kubeconfig(tmp_path / "kubeconfig"),
        context="fake",
        nodes=[NodeShape("H100", 8, 1)],
    )
    assert isinstance(adapter, ChangeFeed)
    woken = asyncio.Event()
    adapter.watch_changes(woken.set)
    try:

        async def all_watching() -> bool:
            return len(server.watches()) >= WATCHED_KINDS and woken.is_set()

        await eventually(all_watching)
        first = adapter.take_changes(NOW)
        # established: one resync of the cluster, the existing objects are not news
        assert first.resync and first.instance_ids == set()
        woken.clear()

        status = fixture("pod-crashloopbackoff.json")["status"]
        server.set_status("Pod", "sr-inst-2", "web-0", status)
        server.set_status("Pod", "kube-system", "web-0", status)  # not an instance namespace
        await eventually(lambda: asyncio.sleep(0, woken.is_set()))
        await asyncio.sleep(0.2)  # let the other event arrive too, if it were sent
        changes = adapter.take_changes(NOW)
        assert changes.instance_ids == {"inst-2"} and not changes.resync
        assert adapter.next_change() is None  # nothing happens by time alone
        for request in server.watches():
            assert request.path.startswith(("/api/v1/", "/apis/"))
            assert "/namespaces/" not in request.path  # across all namespaces
    finally:
        await adapter.aclose()


async def test_a_lost_watch_is_re_established_and_asks_for_one_resync(
    server: FakeKubernetes, tmp_path: Path
) -> None:
    server.add_object(namespace("sr-inst-1"))
    adapter = KubernetesAdapter(
        "k8s-test", kubeconfig=server.write_kubeconfig(tmp_path / "kubeconfig"), context="fake"
    )
    woken = asyncio.Event()
    adapter.watch_changes(woken.set)
    try:
        await eventually(lambda: asyncio.sleep(0, len(server.watches()) >= WATCHED_KINDS))
        await eventually(lambda: asyncio.sleep(0, adapter.take_changes(NOW).resync))
        server.compact()  # resuming from the old version would be 410 Gone
        server.drop_watches()
        await eventually(lambda: asyncio.sleep(0, len(server.watches()) >= 2 * WATCHED_KINDS))
        changes = await eventually(
            lambda: asyncio.sleep(0, c if (c := adapter.take_changes(NOW)).resync else None)
        )
        assert changes.resync
        # every watch is back: a change arrives again, and no second resync was asked for
        server.add_object(pod("web-0", "sr-inst-1"))

        async def marked() -> Any:
            taken = adapter.take_changes(NOW)
            return taken if taken.instance_ids else None

        later = await eventually(marked)
        assert later.instance_ids == {"inst-1"} and not later.resync
    finally:
        await adapter.aclose()


async def test_a_watch_that_keeps_failing_backs_off_though_its_list_works(
    server: FakeKubernetes, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A LIST that works while the WATCH is refused every time (no `watch` permission): the
    retries back off ever longer instead of re-asking for a resync every half second."""
    forbidden = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403}
    server.inject_error("WATCH", "/api/v1/pods", {**forbidden, "reason": "Forbidden"})
    adapter = KubernetesAdapter(
        "k8s-test", kubeconfig=server.write_kubeconfig(tmp_path / "kubeconfig"), context="fake"
    )
    adapter.watch_changes(lambda: None)
    caplog.set_level(logging.WARNING, logger="nvcf.backends")

    def delays() -> list[float]:
        return [
            float(r.getMessage().rsplit(" in ", 1)[1].rstrip("s"))
            for r in caplog.records
            if "watching Pod failed" in r.getMessage()
        ]

    try:
        await eventually(lambda: asyncio.sleep(0, len(delays()) >= 3))
        first = delays()[:3]
        assert first == sorted(first) and first[0] < first[2]  # 0.5, 1, 2: growing
    finally:
        await adapter.aclose()


# ------------------------------------------------------------------------- through the app


def write_catalog(tmp_path: Path, server: FakeKubernetes) -> Path:
    data = {
        "clusterGroups": [
            {
                "name": "k8s-watch",
                "clusters": [
                    {
                        "name": "k8s-a",
                        "adapter": "kubernetes",
                        "provider": "NCP",
                        "region": "us-west-2",
                        "nodes": [{"gpu": "H100", "gpusPerNode": 8, "count": 2}],
                        "kubernetes": {
                            "kubeconfig": str(server.write_kubeconfig(tmp_path / "k8s-a.yaml")),
                            "context": "fake",
                        },
                    }
                ],
            }
        ]
    }
    path = tmp_path / "clusters.yaml"
    path.write_text(json.dumps(data))
    return path


async def test_a_pod_status_change_reaches_the_instance_by_watch(
    server: FakeKubernetes, client_factory: ClientFactory, tmp_path: Path
) -> None:
    for node in iter_fixture_items("nodes.json"):
        server.add_object(node)
    # passes an hour apart: only a watch event (or a health timer) wakes the reconciler
    client = await client_factory(
        clusters_file=write_catalog(tmp_path, server),
        reconcile_interval=3600.0,
        reconcile_resync_seconds=3600.0,
        health_pod_scheduling_timeout=3600.0,
    )
    reconciler = client.app.state.reconciler
    assert isinstance(reconciler, Reconciler)
    fn = await create_fn(client)
    url = f"{V}/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
    spec = {"gpu": "H100", "minInstances": 1, "maxInstances": 1, "clusters": ["k8s-a"]}
    resp = await client.post(url, json={"deploymentSpecifications": [spec]})
    assert resp.status_code == 200, resp.text

    async def applied() -> str | None:
        for obj in server.objects():
            name = obj["metadata"]["name"]
            if (
                obj["kind"] == "Namespace"
                and name.startswith("sr-")
                and server.get("Deployment", name, "inference") is not None
            ):
                return str(name)
        return None

    ns: str = await eventually(applied)
    workload = server.get("Deployment", ns, "inference")
    assert workload is not None
    running = pod("inference-7c9f8d6b5d-8xk2p", ns)
    running["metadata"]["labels"] = dict(workload["spec"]["template"]["metadata"]["labels"])
    container = workload["spec"]["template"]["spec"]["containers"][0]["name"]
    running["spec"]["containers"][0]["name"] = container
    server.add_object(running, namespace=ns)
    server.set_status("Deployment", ns, "inference", fixture("deployment-available.json")["status"])

    async def instance() -> dict[str, Any]:
        """The deployment's instance ({} between a failed one and its replacement)."""
        resp = await client.get(url)
        assert resp.status_code == 200, resp.text
        instances = resp.json()["deployment"]["instances"]
        assert len(instances) <= 1
        return dict(instances[0]) if instances else {}

    async def is_running() -> bool:
        return (await instance()).get("phase") == "Running"

    await eventually(is_running)

    def pod_lists() -> int:
        path = f"/api/v1/namespaces/{ns}/pods"
        return sum(1 for r in server.requests if r.method == "GET" and r.path == path)

    async def passes(n: int) -> None:
        """Let the reconciler make `n` passes (woken: its interval is an hour)."""
        for _ in range(n):
            done = reconciler.passes
            reconciler.wake()

            async def passed(done: int = done) -> bool:
                return reconciler.passes > done

            await eventually(passed)

    # settled: once the watches are up (a watch asks for its resync before its request) and
    # that resync is done, the reconciler does not look at the instance while nothing changes
    await eventually(lambda: asyncio.sleep(0, len(server.watches()) >= WATCHED_KINDS))
    await passes(2)
    settled = pod_lists()
    await passes(3)
    assert pod_lists() == settled

    # the watches are lost (and the API server compacted): re-established, they ask for one
    # resync, which re-observes the instance once
    established = len(server.watches())
    server.compact()
    server.drop_watches()
    await eventually(lambda: asyncio.sleep(0, len(server.watches()) >= established + WATCHED_KINDS))
    await eventually(lambda: asyncio.sleep(0, pod_lists() == settled + 1))
    await passes(3)
    assert pod_lists() == settled + 1
    settled += 1

    # the kubelet reports the container crash-looping: the change arrives by WATCH
    before = await instance()
    crashing = fixture("pod-crashloopbackoff.json")["status"]
    server.set_status("Pod", ns, "inference-7c9f8d6b5d-8xk2p", crashing)

    async def noticed() -> dict[str, Any] | None:
        inst = await instance()
        return inst if inst and inst != before else None

    changed = await eventually(noticed)
    assert pod_lists() > settled
    # the crash-looping instance failed (the fixture's restarts are long past the restart-loop
    # timeout) and a replacement took its place
    assert changed["instanceId"] != before["instanceId"]
    deployment_id = resp.json()["deployment"]["deploymentId"]
    events = await client.get(f"{V}/deployments/{deployment_id}/events")
    assert events.status_code == 200, events.text
    failures = [
        e["message"]
        for e in events.json()["events"]
        if e["kind"] == "instance" and before["instanceId"] in json.dumps(e)
    ]
    assert any("restarted 5 times" in m for m in failures), failures
