"""A task on the Kubernetes adapter, against the test API server (tests/support/fake_k8s.py)
playing the Job controller and the kubelet: the Job and its Secret applied into `sr-<taskId>`
with the worker-utils sidecar as a native sidecar; what the Job's pod reports observed
(running, exit 0, a non-zero exit, OOMKilled, `activeDeadlineSeconds` → DeadlineExceeded); the
task's files read through the sidecar (`nvcf-server worker-utils` for real, behind the API
server's pod proxy) with their bounds; a helm task's objects; deletion releasing the sidecar."""

from __future__ import annotations

import io
import json
import os
import tarfile
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.backends import AdapterError
from service.backends.kubernetes import APPLIED_ANNOTATION, KubernetesAdapter
from service.backends.protocol import TaskFiles
from service.backends.worker_utils_pod import CONTAINER_NAME, WorkerUtilsPod
from service.health.observed import ObservedState
from tests.support.fake_k8s import FakeKubernetes
from tests.support.sidecar import Sidecar
from tests.support.task_objects import (
    JOB,
    helm_task_objects,
    task_instance,
    task_objects,
)

POD = WorkerUtilsPod(
    image="registry.example.com/nvcf-server:1.2",
    max_asset_bytes=1000,
    max_result_bytes=10_000,
    max_result_files=10,
    timeout_seconds=60,
)
TASK = task_instance()
NS = TASK.namespace


@pytest.fixture
def server() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as fake:
        yield fake


@pytest.fixture
async def adapter(server: FakeKubernetes, tmp_path: Path) -> AsyncIterator[KubernetesAdapter]:
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    k8s = KubernetesAdapter("k8s-test", kubeconfig=kubeconfig, context="fake", worker_utils=POD)
    yield k8s
    await k8s.aclose()


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The task container's files (each test its own result names)."""
    root = tmp_path_factory.mktemp("task")
    (root / "results").mkdir()
    return root


@pytest.fixture(scope="module")
def sidecar(task_dir: Path) -> Iterator[Sidecar]:
    process = Sidecar.for_task(task_dir / "progress.json", task_dir / "results", "--linger", "60")
    try:
        yield process
    finally:
        process.stop()


async def running(server: FakeKubernetes, adapter: KubernetesAdapter, sidecar: Sidecar) -> str:
    """Apply the task, start its pod and route the pod proxy to the sidecar process."""
    await adapter.apply(TASK, task_objects())
    server.start_job(NS, JOB)
    pod = server.run_job_pod(NS, JOB)
    server.serve_pod(NS, pod, 8479, f"127.0.0.1:{sidecar.port}")
    return pod


async def test_the_job_and_its_secret_are_applied_with_the_native_sidecar(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    assert isinstance(adapter, TaskFiles)
    await adapter.apply(TASK, task_objects())
    namespace = server.get("Namespace", None, NS)
    assert namespace is not None
    assert namespace["metadata"]["labels"]["nvcf.nvidia.com/instance-id"] == TASK.instance_id
    assert json.loads(namespace["metadata"]["annotations"][APPLIED_ANNOTATION]) == [
        ["batch/v1", "Job", JOB],
        ["v1", "Secret", "nvcf-secrets"],
    ]
    job = server.get("Job", NS, JOB)
    assert job is not None
    assert (job["spec"]["backoffLimit"], job["spec"]["activeDeadlineSeconds"]) == (0, 3600)
    spec = job["spec"]["template"]["spec"]
    assert spec["restartPolicy"] == "Never"
    [sidecar] = spec["initContainers"]
    assert (sidecar["name"], sidecar["restartPolicy"]) == (CONTAINER_NAME, "Always")
    # the task container's emptyDir, read-only
    assert sidecar["volumeMounts"] == [{"name": "nvct", "mountPath": "/var/nvct", "readOnly": True}]
    assert [c["name"] for c in spec["containers"]] == ["task"]
    assert server.get("Secret", NS, "nvcf-secrets") is not None
    # the Secret (rank 1) goes in before the Job that mounts it
    kinds = [p.split("/")[-2] for p in server.patches() if f"/namespaces/{NS}/" in p]
    assert kinds == ["secrets", "jobs"]


async def test_what_the_job_pod_reports_is_observed(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    await adapter.apply(TASK, task_objects())
    observed = await adapter.observe(TASK)
    job = observed.controller("Job", JOB)
    assert job is not None and not job.job_complete and not job.job_failed
    assert observed.pods == ()
    server.start_job(NS, JOB)
    server.run_job_pod(NS, JOB)
    [pod] = (await adapter.observe(TASK)).pods
    assert pod.phase == "Running" and pod.owner_kind == "Job"
    assert [s.name for s in pod.init_container_statuses] == [CONTAINER_NAME]
    server.finish_job(NS, JOB, 0)
    observed = await adapter.observe(TASK)
    job = observed.controller("Job", JOB)
    assert job is not None and job.job_complete and not job.job_failed
    assert task_state(observed) == ("Succeeded", 0, "Completed")


@pytest.mark.parametrize(("code", "oom", "reason"), [(3, False, "Error"), (0, True, "OOMKilled")])
async def test_a_failed_task_container_is_observed(
    server: FakeKubernetes, adapter: KubernetesAdapter, code: int, oom: bool, reason: str
) -> None:
    await adapter.apply(TASK, task_objects())
    server.start_job(NS, JOB)
    server.run_job_pod(NS, JOB)
    server.finish_job(NS, JOB, code, oom=oom)
    observed = await adapter.observe(TASK)
    job = observed.controller("Job", JOB)
    assert job is not None and job.job_failed
    assert task_state(observed) == ("Failed", 137 if oom else code, reason)


async def test_the_runtime_deadline_is_observed(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    await adapter.apply(TASK, task_objects())
    server.start_job(NS, JOB)
    server.run_job_pod(NS, JOB)
    server.exceed_job_deadline(NS, JOB)
    observed = await adapter.observe(TASK)
    job = observed.controller("Job", JOB)
    assert job is not None and job.job_failed
    failed = job.condition("Failed")
    assert failed is not None and failed.reason == "DeadlineExceeded"
    assert observed.pods == ()


def task_state(observed: ObservedState) -> tuple[str, int | None, str]:
    [pod] = observed.pods
    [task] = pod.container_statuses
    assert task.state is not None and task.state.kind == "terminated"
    return pod.phase, task.state.exit_code, task.state.reason


async def test_the_progress_file_is_read_through_the_sidecar(
    server: FakeKubernetes, adapter: KubernetesAdapter, sidecar: Sidecar, task_dir: Path
) -> None:
    (task_dir / "progress.json").unlink(missing_ok=True)  # the module's sidecar serves it
    await adapter.apply(TASK, task_objects())
    assert await adapter.task_progress(TASK, max_bytes=1000) is None  # no pod yet
    server.start_job(NS, JOB)
    assert await adapter.task_progress(TASK, max_bytes=1000) is None  # not running yet
    pod = server.run_job_pod(NS, JOB)
    server.serve_pod(NS, pod, 8479, f"127.0.0.1:{sidecar.port}")
    assert await adapter.task_progress(TASK, max_bytes=1000) is None  # nothing written yet
    progress = b'{"percentComplete": 50, "name": "checkpoint-1"}'
    (task_dir / "progress.json").write_bytes(progress)
    assert await adapter.task_progress(TASK, max_bytes=1000) == progress
    with pytest.raises(AdapterError) as refused:
        await adapter.task_progress(TASK, max_bytes=10)
    assert not refused.value.retryable
    assert refused.value.message == (
        f"reading the progress file of task {TASK.instance_id}: 413 the progress file passes "
        "10 bytes"
    )


async def test_a_result_is_copied_through_the_sidecar(
    server: FakeKubernetes,
    adapter: KubernetesAdapter,
    sidecar: Sidecar,
    task_dir: Path,
    tmp_path: Path,
) -> None:
    await running(server, adapter, sidecar)
    result = task_dir / "results" / "checkpoint-1"
    (result / "shard").mkdir(parents=True)
    weights = os.urandom(5000)
    (result / "shard" / "weights.bin").write_bytes(weights)
    (result / "config.json").write_text("{}")
    into = tmp_path / "fetched" / "checkpoint-1"
    await adapter.fetch_task_result(TASK, "checkpoint-1", str(into), max_bytes=10_000, max_files=10)
    assert {p.relative_to(into).as_posix() for p in into.rglob("*")} == {
        "shard",
        "shard/weights.bin",
        "config.json",
    }
    assert (into / "shard" / "weights.bin").read_bytes() == weights
    assert sorted(p.name for p in into.parent.iterdir()) == ["checkpoint-1"]  # no leftovers


async def test_a_result_named_as_nvcts_progress_file_allows_is_listed_and_copied(
    server: FakeKubernetes,
    adapter: KubernetesAdapter,
    sidecar: Sidecar,
    task_dir: Path,
    tmp_path: Path,
) -> None:
    await running(server, adapter, sidecar)
    name = "step(1)!*'-" + "x" * 179  # NVCT's characters, 190 of them
    (task_dir / "results" / name).mkdir(parents=True)
    (task_dir / "results" / name / "model.bin").write_bytes(b"weights")
    assert name in await adapter.task_result_names(TASK, max_names=10)
    into = tmp_path / "fetched"
    await adapter.fetch_task_result(TASK, name, str(into), max_bytes=1000, max_files=1)
    assert (into / "model.bin").read_bytes() == b"weights"


async def test_the_last_result_is_read_after_the_task_container_exited(
    server: FakeKubernetes,
    adapter: KubernetesAdapter,
    sidecar: Sidecar,
    task_dir: Path,
    tmp_path: Path,
) -> None:
    await running(server, adapter, sidecar)
    (task_dir / "results" / "final").mkdir()
    (task_dir / "results" / "final" / "model.bin").write_bytes(b"final weights")
    done = b'{"percentComplete": 100, "name": "final"}'
    (task_dir / "progress.json").write_bytes(done)
    # the task container exits; the sidecar's preStop hook holds the pod for the platform
    server.finish_job(NS, JOB, 0, lingering=True)
    [pod] = (await adapter.observe(TASK)).pods
    [task] = pod.container_statuses
    assert task.state is not None and task.state.exit_code == 0
    assert await adapter.task_progress(TASK, max_bytes=1000) == done
    into = tmp_path / "final"
    await adapter.fetch_task_result(TASK, "final", str(into), max_bytes=1000, max_files=1)
    assert (into / "model.bin").read_bytes() == b"final weights"


async def test_a_result_past_a_bound_or_missing_is_refused(
    server: FakeKubernetes,
    adapter: KubernetesAdapter,
    sidecar: Sidecar,
    task_dir: Path,
    tmp_path: Path,
) -> None:
    await running(server, adapter, sidecar)
    result = task_dir / "results" / "big"
    result.mkdir()
    (result / "a").write_bytes(b"x" * 600)
    (result / "b").write_bytes(b"x" * 600)
    into = str(tmp_path / "fetched")
    cases = [
        ("big", 1000, 10, "413 result 'big' passes 1000 bytes", False),
        ("big", 10_000, 1, "413 result 'big' holds more than 1 files", False),
        ("gone", 10_000, 10, "404 no result 'gone' in the results directory", True),
    ]
    for name, max_bytes, max_files, message, retryable in cases:
        with pytest.raises(AdapterError) as refused:
            await adapter.fetch_task_result(
                TASK, name, into, max_bytes=max_bytes, max_files=max_files
            )
        what = f"fetching result {name!r} of task {TASK.instance_id}"
        assert refused.value.message == f"{what}: {message}"
        assert refused.value.retryable is retryable
    unwritable = tmp_path / "a-file"
    unwritable.write_text("not a directory")
    with pytest.raises(AdapterError) as refused:
        await adapter.fetch_task_result(
            TASK, "big", str(unwritable / "big"), max_bytes=10_000, max_files=10
        )
    assert refused.value.message.startswith(f"fetching result 'big' of task {TASK.instance_id}: ")
    assert "cannot write into" in refused.value.message
    with pytest.raises(AdapterError) as refused:
        await adapter.fetch_task_result(TASK, "../etc", into, max_bytes=10, max_files=1)
    assert "is not a result's name (1-190 letters" in refused.value.message
    assert not refused.value.retryable


async def test_the_adapter_reads_task_files(adapter: KubernetesAdapter) -> None:
    # the task loop reads a task's progress and results only from a `TaskFiles` adapter
    assert isinstance(adapter, TaskFiles)


async def test_the_result_names_are_listed_through_the_sidecar(
    server: FakeKubernetes, adapter: KubernetesAdapter, tmp_path: Path
) -> None:
    results = tmp_path / "results"
    results.mkdir()
    own = Sidecar.for_task(tmp_path / "progress.json", results)
    try:
        await adapter.apply(TASK, task_objects())
        assert await adapter.task_result_names(TASK, max_names=10) == []  # no pod yet
        server.start_job(NS, JOB)
        pod = server.run_job_pod(NS, JOB)
        server.serve_pod(NS, pod, 8479, f"127.0.0.1:{own.port}")
        assert await adapter.task_result_names(TASK, max_names=10) == []
        for mtime, name in [(1_000, "b-first"), (2_000, "a-second"), (3_000, "c-third")]:
            (results / name).mkdir()
            os.utime(results / name, (mtime, mtime))
        (results / "not-a-directory").write_text("x")
        names = await adapter.task_result_names(TASK, max_names=10)
        assert names == ["b-first", "a-second", "c-third"]
        assert await adapter.task_result_names(TASK, max_names=2) == ["b-first", "a-second"]
    finally:
        own.stop()


@pytest.mark.parametrize(
    "body",
    [
        b'["a", "b", "c"]',  # more than asked for
        b'["../etc"]',
        b'{"names": []}',
        b"not json",
        b'["' + b"x" * 5000 + b'"]',
    ],
)
async def test_a_listing_that_is_not_result_names_is_refused(
    server: FakeKubernetes, adapter: KubernetesAdapter, body: bytes
) -> None:
    canned = CannedSidecar(body)
    try:
        await adapter.apply(TASK, task_objects())
        server.start_job(NS, JOB)
        pod = server.run_job_pod(NS, JOB)
        server.serve_pod(NS, pod, 8479, canned.address)
        with pytest.raises(AdapterError) as refused:
            await adapter.task_result_names(TASK, max_names=2)
        assert refused.value.message == (
            f"listing the results of task {TASK.instance_id}: the sidecar's answer is not a "
            "list of at most 2 result names"
        )
        assert not refused.value.retryable
    finally:
        canned.stop()


class CannedSidecar:
    """A sidecar that answers every request with the same 200 body (one that lies)."""

    def __init__(self, body: bytes) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.address = f"127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def written(root: Path) -> list[str]:
    return [p.relative_to(root).as_posix() for p in root.rglob("*")]


def tar_of(*members: tuple[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (tar_of(("r/a", b"x" * 9000)), "the stream passes 16484 bytes"),
        (tar_of(("r/a", b"x" * 60), ("r/b", b"x" * 60)), "more than 100 bytes"),
        (tar_of(("r/a", b"1"), ("r/b", b"2"), ("r/c", b"3")), "more than 2 files"),
        (tar_of(("r/../../escaped", b"x")), "the stream holds a member the platform refuses"),
        (tar_of(("/etc/escaped", b"x")), "the stream holds '/etc/escaped', not in 'r'"),
        (tar_of(("other/x", b"x")), "the stream holds 'other/x', not in 'r'"),
    ],
)
async def test_a_stream_the_bounds_do_not_allow_is_refused(
    server: FakeKubernetes, adapter: KubernetesAdapter, tmp_path: Path, body: bytes, message: str
) -> None:
    canned = CannedSidecar(body)
    try:
        await adapter.apply(TASK, task_objects())
        server.start_job(NS, JOB)
        pod = server.run_job_pod(NS, JOB)
        server.serve_pod(NS, pod, 8479, canned.address)
        into = tmp_path / "out" / "r"
        with pytest.raises(AdapterError) as refused:
            await adapter.fetch_task_result(TASK, "r", str(into), max_bytes=100, max_files=2)
        assert message in refused.value.message
        assert not refused.value.retryable
        # nothing was written outside the destination, and the scratch file is gone
        assert sorted(written(tmp_path)) == [
            "kubeconfig",
            "out",
            "out/r",
        ]
    finally:
        canned.stop()


async def test_pods_without_the_sidecar_say_so(server: FakeKubernetes, tmp_path: Path) -> None:
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    bare = KubernetesAdapter("k8s-test", kubeconfig=kubeconfig, context="fake")
    try:
        await bare.apply(TASK, task_objects())
        job = server.get("Job", NS, JOB)
        assert job is not None and "initContainers" not in job["spec"]["template"]["spec"]
        server.start_job(NS, JOB)
        server.run_job_pod(NS, JOB)
        with pytest.raises(AdapterError) as refused:
            await bare.task_progress(TASK, max_bytes=100)
        assert "have no worker-utils sidecar" in refused.value.message
        assert not refused.value.retryable
    finally:
        await bare.aclose()


async def test_an_unreachable_sidecar_is_a_retryable_failure(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    await adapter.apply(TASK, task_objects())
    server.start_job(NS, JOB)
    pod = server.run_job_pod(NS, JOB)  # no address behind the pod proxy
    with pytest.raises(AdapterError) as failed:
        await adapter.task_progress(TASK, max_bytes=100)
    assert failed.value.retryable
    assert failed.value.message == (
        f"reading the progress file of task {TASK.instance_id}: 503 no endpoints available for "
        f'pod "{pod}"'
    )


async def test_a_pod_other_than_the_task_pod_is_not_a_missing_sidecar(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    await adapter.apply(TASK, task_objects())
    server.add_object(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "helper"},
            "spec": {"containers": [{"name": "helper", "image": "busybox"}]},
            "status": {"phase": "Running"},
        },
        namespace=NS,
    )
    assert await adapter.task_progress(TASK, max_bytes=100) is None


async def test_a_helm_task_objects_are_applied_and_observed(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    await adapter.apply(TASK, helm_task_objects())
    stored = {f"{o['kind']}/{o['metadata']['name']}" for o in server.objects(NS)}
    assert stored == {
        "ConfigMap/trainer-config",
        "Deployment/dashboard",
        "Job/trainer",
        "Secret/nvcf-secrets",
        "Service/trainer-metrics",
        "ServiceAccount/trainer",
    }
    trainer = server.get("Job", NS, "trainer")
    assert trainer is not None
    assert trainer["spec"]["template"]["spec"]["initContainers"][0]["name"] == CONTAINER_NAME
    observed = await adapter.observe(TASK)
    assert observed.missing == ()
    assert {str(r) for r in observed.expected} >= {"Job/trainer", "ConfigMap/trainer-config"}


async def test_deleting_a_task_releases_its_sidecar_then_its_namespace(
    server: FakeKubernetes, adapter: KubernetesAdapter, sidecar: Sidecar
) -> None:
    pod = await running(server, adapter, sidecar)
    assert not await adapter.delete(TASK)  # the namespace is terminating
    proxied = [r.path for r in server.requests if "/proxy/" in r.path]
    assert proxied == [f"/api/v1/namespaces/{NS}/pods/{pod}:8479/proxy/nvct/release"]
    deletes = [r.path for r in server.requests if r.method == "DELETE"]
    assert deletes == [f"/api/v1/namespaces/{NS}"]
    server.finish_namespace_deletion(NS)
    assert await adapter.delete(TASK)


async def test_stopping_a_task_releases_its_sidecar(
    server: FakeKubernetes, adapter: KubernetesAdapter, sidecar: Sidecar
) -> None:
    pod = await running(server, adapter, sidecar)
    await adapter.apply(TASK, task_objects(suspend=True))
    job = server.get("Job", NS, JOB)
    assert job is not None and job["spec"]["suspend"] is True
    proxied = [(r.method, r.path) for r in server.requests if "/proxy/" in r.path]
    assert proxied == [("POST", f"/api/v1/namespaces/{NS}/pods/{pod}:8479/proxy/nvct/release")]
    # the sidecar's preStop hook (its linger) now ends at once
    async with httpx.AsyncClient(base_url=sidecar.url, timeout=30) as http:
        assert (await http.get("/nvct/linger")).status_code == 204


async def test_a_pod_being_deleted_is_released_too(
    server: FakeKubernetes, adapter: KubernetesAdapter, sidecar: Sidecar
) -> None:
    pod = await running(server, adapter, sidecar)
    stored = server.get("Pod", NS, pod)
    assert stored is not None
    stored["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    server.add_object(stored, namespace=NS)
    assert await adapter.task_progress(TASK, max_bytes=100) is None  # no longer read
    await adapter.delete(TASK)
    proxied = [r.path for r in server.requests if "/proxy/" in r.path]
    assert proxied == [f"/api/v1/namespaces/{NS}/pods/{pod}:8479/proxy/nvct/release"]


async def test_deleting_a_task_whose_pod_is_gone_deletes_its_namespace(
    server: FakeKubernetes, adapter: KubernetesAdapter
) -> None:
    await adapter.apply(TASK, task_objects())
    assert not await adapter.delete(TASK)
    assert [r.path for r in server.requests if "/proxy/" in r.path] == []
    server.finish_namespace_deletion(NS)
    assert await adapter.delete(TASK)
