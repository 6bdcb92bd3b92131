"""The task loop on a simulated cluster and a fake clock, pass by pass: every terminal status
reached as a user sees it (status, healthInfo, events, results), placement sharing capacity,
stopping within the grace period, secrets reaching a running container, and a restart of the
server in the middle of each clock changing nothing."""

from __future__ import annotations

import base64
import json
import re
import socket
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from service.backends.protocol import AdapterError, InstanceSpec
from service.backends.simulated.adapter import SimulatedAdapter
from service.clusters.adapters import AdapterRegistry
from service.clusters.catalog import Catalog
from service.core.db import make_engine, make_sessionmaker
from service.core.kube import INSTANCE_TYPE_LABEL
from service.core.pagination import Page
from service.registry.models import ArtifactType
from service.registry.schemas import Login
from service.registry.service import CredentialSpec, create_credential
from service.tasks import repository
from service.tasks.loop import TaskLoop
from service.tasks.models import TaskStatus
from tests.support.app import AppClient, ClientFactory
from tests.support.e2e import eventually
from tests.support.helm_e2e import fast_catalog
from tests.support.reconcile import workload
from tests.support.registry import RegistryServer
from tests.support.tasks import ACCOUNT, BASE, TaskHarness, manifest_digest, oras_pull, script

STEPS_10_50_100 = script(
    steps=[
        {
            "after": 1,
            "percent": 10,
            "name": "ckpt-1",
            "files": {"w.bin": "one"},
            "metadata": {"loss": 0.5},
        },
        {"after": 2, "percent": 50, "name": "ckpt-2", "files": {"w.bin": "two"}},
        {"after": 2, "percent": 100},
    ],
    exitAfter=1,
)


async def test_a_task_reporting_10_50_100_completes_with_its_two_results(
    h: TaskHarness,
) -> None:
    tid = await h.create(containerEnvironment=STEPS_10_50_100)
    await h.run()
    assert (await h.task(tid)).status == TaskStatus.LAUNCHED
    await h.run()
    task = await h.task(tid)
    assert task.status == TaskStatus.RUNNING and task.percent_complete is None
    await h.run(2)
    task = await h.task(tid)
    assert task.status == TaskStatus.RUNNING and task.percent_complete == 10
    assert task.last_heartbeat_at is not None and task.last_heartbeat_at <= h.clock.now
    await h.run(6)
    task = await h.task(tid)
    assert task.status == TaskStatus.COMPLETED and task.percent_complete == 100
    results = await h.results(tid)
    assert [(r.name, r.metadata_) for r in results] == [("ckpt-1", {"loss": 0.5}), ("ckpt-2", {})]
    events = await h.events(tid)
    assert events[0] == "Task created and queued"
    assert events[1] == "Task launched on cluster sim-a"
    assert "Task container started" in events
    assert "Result ckpt-1 reported at 10%" in events and "Result ckpt-2 reported at 50%" in events
    assert "Task completed (percentComplete 100)" in events
    assert events[-1] == "Task objects removed from the cluster"
    assert not await h.on_cluster(tid)


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        (
            {"steps": [{"after": 1, "percent": 10}], "exitAfter": 1, "exitCode": 3},
            "exited with code 3",
        ),
        ({"steps": [{"after": 1, "percent": 10}], "exitAfter": 1, "oom": True}, "OOMKilled"),
        (
            {"steps": [{"after": 1, "percent": 40}], "exitAfter": 1},
            "without reporting percentComplete 100",
        ),
        (
            {
                "steps": [{"after": 1, "percent": 50}, {"after": 2, "percent": 20}],
                "exitAfter": None,
            },
            "went down from 50 to 20",
        ),
        ({"steps": [{"after": 1, "raw": "not json"}], "exitAfter": None}, "malformed progress"),
        ({"steps": [{"after": 1, "percent": 101}], "exitAfter": None}, "from 1 to 100"),
    ],
)
async def test_a_failing_container_errors_with_the_reason(
    h: TaskHarness, fields: dict[str, object], why: str
) -> None:
    tid = await h.create(containerEnvironment=script(**fields))
    await h.run(6)
    task = await h.task(tid)
    assert task.status == TaskStatus.ERRORED
    assert task.health_error is not None and why in task.health_error
    events = await h.events(tid)
    assert any(why in e for e in events), events
    assert not await h.on_cluster(tid)


async def test_a_progress_file_the_adapter_refuses_errors_in_the_adapters_words(
    h: TaskHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    adapter = h.registry.get("sim-a")
    assert isinstance(adapter, SimulatedAdapter)

    async def refuse(instance: InstanceSpec, *, max_bytes: int) -> bytes | None:
        raise AdapterError("the sidecar cannot read the progress file (403)", retryable=False)

    tid = await h.create(containerEnvironment=script(steps=[{"after": 1, "percent": 10}]))
    await h.run()
    monkeypatch.setattr(adapter, "task_progress", refuse)
    await h.run(3)
    task = await h.task(tid)
    assert task.status == TaskStatus.ERRORED
    why = "the sidecar cannot read the progress file (403)"
    assert task.health_error is not None and why in task.health_error
    assert "malformed" not in task.health_error
    assert any(why in e for e in await h.events(tid))


async def test_a_missed_heartbeat_errors_after_five_minutes(h: TaskHarness) -> None:
    fields = {"steps": [{"after": 1, "percent": 30}], "exitAfter": None, "heartbeat": False}
    tid = await h.create(containerEnvironment=script(**fields))
    await h.run(295, step=5)
    assert (await h.task(tid)).status == TaskStatus.RUNNING
    h.restart()  # a restart in the middle of the heartbeat's clock
    await h.run(10, step=5)
    task = await h.task(tid)
    assert task.status == TaskStatus.ERRORED and "no heartbeat" in (task.health_error or "")


async def test_a_task_running_past_max_runtime_is_stopped(h: TaskHarness) -> None:
    hang = script(steps=[{"after": 1, "percent": 5}], exitAfter=None)
    tid = await h.create(containerEnvironment=hang, maxRuntimeDuration="PT10M")
    await h.run(300, step=30)
    assert (await h.task(tid)).status == TaskStatus.RUNNING
    h.restart()
    await h.run(270, step=30)
    assert (await h.task(tid)).status == TaskStatus.RUNNING
    await h.run(60, step=30)
    task = await h.task(tid)
    assert task.status == TaskStatus.EXCEEDED_MAX_RUNTIME_DURATION
    assert not await h.on_cluster(tid)


async def test_a_task_without_capacity_exceeds_its_max_queued_duration(h: TaskHarness) -> None:
    hang = script(steps=[{"after": 1, "percent": 5}], exitAfter=None)
    two_gpus = {"gpu": "H100", "instanceType": "NCP.GPU.H100_2x"}
    busy = await h.create(containerEnvironment=hang, gpuSpecification=two_gpus)
    waiting = await h.create(maxQueuedDuration="PT5M")
    await h.run(240, step=30)
    assert (await h.task(busy)).status == TaskStatus.RUNNING
    assert (await h.task(waiting)).status == TaskStatus.QUEUED
    h.restart()  # the queued clock is the task's own: a restart does not reset it
    await h.run(60, step=30)
    task = await h.task(waiting)
    assert task.status == TaskStatus.EXCEEDED_MAX_QUEUED_DURATION
    assert "maxQueuedDuration" in (await h.events(waiting))[-1]


async def test_a_freed_slot_launches_the_next_task(h: TaskHarness) -> None:
    quick = script(steps=[{"after": 1, "percent": 100}], exitAfter=0)
    two_gpus = {"gpu": "H100", "instanceType": "NCP.GPU.H100_2x"}
    first = await h.create(containerEnvironment=quick, gpuSpecification=two_gpus)
    second = await h.create(containerEnvironment=quick)
    await h.run()
    assert (await h.task(second)).status == TaskStatus.QUEUED
    await h.run(4)
    assert (await h.task(first)).status == TaskStatus.COMPLETED
    assert (await h.task(second)).status == TaskStatus.COMPLETED


async def test_a_change_reported_for_some_tasks_runs_a_pass_over_those_at_once(
    h: TaskHarness,
) -> None:
    quick = script(steps=[{"after": 1, "percent": 100}], exitAfter=0)
    ended = await h.create(containerEnvironment=quick)
    other = await h.create(containerEnvironment=quick)
    await h.run()
    loop = TaskLoop(h.maker, h.registry, h.catalog, h.tasks, clock=h.clock, period=3600)
    loop.start()  # its first pass, at once, sees both containers running
    try:
        await eventually(lambda: _statuses_are(h, [ended, other], TaskStatus.RUNNING))
        h.clock.advance(2)  # both containers exit; the cluster's feed reports one of them
        loop.changed({str(ended), "an-instance-of-a-function"}, resync=False)
        await eventually(lambda: _statuses_are(h, [ended], TaskStatus.COMPLETED))
        # that pass looked at the task the feed named; the other waits for the periodic pass
        assert (await h.task(other)).status == TaskStatus.RUNNING
    finally:
        await loop.stop()
    await h.run()
    assert (await h.task(other)).status == TaskStatus.COMPLETED


async def _statuses_are(h: TaskHarness, ids: list[uuid.UUID], status: TaskStatus) -> bool:
    return [(await h.task(i)).status for i in ids] == [status] * len(ids)


async def test_a_pass_over_many_tasks_commits_a_few_transactions_not_some_per_task(
    database_url: str,
) -> None:
    engine = make_engine(database_url)
    commits = 0

    def counted(*_: object) -> None:
        nonlocal commits
        commits += 1

    event.listen(engine.sync_engine, "commit", counted)
    try:
        h = TaskHarness.build(make_sessionmaker(engine), gpus=8)
        quick = script(steps=[{"after": 1, "percent": 100}], exitAfter=0)
        ids = [await h.create(containerEnvironment=quick) for _ in range(8)]
        per_pass: list[int] = []
        for _ in range(4):  # launched; RUNNING; COMPLETED and removed; idle
            commits = 0
            await h.run()
            per_pass.append(commits)
            h.clock.advance(1)
        assert [(await h.task(i)).status for i in ids] == [TaskStatus.COMPLETED] * 8
        # launches, observations and teardown events: one transaction each, whatever the count
        assert max(per_pass) <= 4, per_pass
        assert per_pass[-1] == 0, per_pass  # a pass with nothing to do writes nothing
    finally:
        await engine.dispose()


async def test_a_launched_tasks_pod_gets_the_accounts_pull_secrets_and_node_affinity(
    h: TaskHarness,
) -> None:
    async with h.maker() as session, session.begin():
        spec = CredentialSpec(
            "nvcr.io", "ngc", Login("$oauthtoken", "s3cret"), [ArtifactType.CONTAINER]
        )
        await create_credential(session, account_id="acct-tasks", spec=spec, box=h.box)
    tid = await h.create()
    await h.run()
    adapter = h.registry.get("sim-a")
    assert isinstance(adapter, SimulatedAdapter)
    spec_ = InstanceSpec(str(tid), "", "", "NCP.GPU.H100_1x", "H100", 1, task=True)
    objects = await adapter.objects(spec_)
    pulls = [o for o in objects if o.get("type") == "kubernetes.io/dockerconfigjson"]
    [job] = [o for o in objects if o["kind"] == "Job"]
    pod = job["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": pulls[0]["metadata"]["name"]}]
    [term] = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": ["NCP.GPU.H100"]} in term[
        "matchExpressions"
    ]


async def test_a_helm_task_on_an_nvlink_cluster_gets_a_helm_functions_nvlink_mutations(
    database_url: str,
) -> None:
    engine = make_engine(database_url)
    try:
        h = TaskHarness.build(make_sessionmaker(engine), attributes=("NVLinkOptimized",))
        tid = await h.create()
        # as the chart pipeline renders a helm task: a Job whose container asks for a GPU
        job = workload("train", kind="Job", restart_policy="Never")
        async with h.maker() as session, session.begin():
            task = await repository.get(session, tid)
            assert task is not None
            task.objects, task.container_image = [job], None
        await h.run()
        assert (await h.task(tid)).status == TaskStatus.LAUNCHED
        adapter = h.registry.get("sim-a")
        assert isinstance(adapter, SimulatedAdapter)
        objects = await adapter.objects(await h.instance(tid))
        [domain] = [o for o in objects if o["kind"] == "ComputeDomain"]
        claim = domain["spec"]["channel"]["resourceClaimTemplate"]["name"]
        [applied] = [o for o in objects if o["kind"] == "Job"]
        pod = applied["spec"]["template"]["spec"]
        assert pod["containers"][0]["resources"]["claims"] == [{"name": domain["metadata"]["name"]}]
        assert claim == "nvcf-cd-channel-0"
        affinity = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        clique = {"key": "nvidia.com/gpu.clique", "operator": "Exists"}
        assert clique in affinity["nodeSelectorTerms"][0]["matchExpressions"]
    finally:
        await engine.dispose()


async def test_a_task_on_a_cluster_removed_from_the_catalog_errors(h: TaskHarness) -> None:
    hang = script(steps=[{"after": 1, "percent": 5}], exitAfter=None)
    tid = await h.create(containerEnvironment=hang)
    await h.run(3)
    assert (await h.task(tid)).status == TaskStatus.RUNNING
    # the operator removes the cluster from the catalog and restarts the server
    other = Catalog.from_data(
        {
            "clusterGroups": [
                {
                    "name": "test-group",
                    "clusters": [
                        {
                            "name": "sim-b",
                            "adapter": "simulated",
                            "provider": "NCP",
                            "region": "us-east-1",
                            "nodes": [{"gpu": "H100", "gpusPerNode": 2, "count": 1}],
                        }
                    ],
                }
            ]
        }
    )
    registry = AdapterRegistry.from_catalog(other, clock=h.clock)
    loop = TaskLoop(h.maker, registry, other, h.tasks, clock=h.clock)
    await loop.run_pass()
    await loop.run_pass()
    task = await h.task(tid)
    assert task.status == TaskStatus.ERRORED
    assert task.health_error == "its cluster sim-a was removed from the cluster catalog"
    assert not task.teardown_pending
    events = await h.events(tid)
    assert "Task errored: its cluster sim-a was removed from the cluster catalog" in events


async def test_cancel_asks_to_stop_then_kills_after_the_grace_period(h: TaskHarness) -> None:
    stubborn = script(steps=[{"after": 1, "percent": 5}], exitAfter=None, onStop="ignore")
    tid = await h.create(containerEnvironment=stubborn, terminationGracePeriodDuration="PT2M")
    await h.run(3)
    async with h.maker() as session, session.begin():
        await h.tasks.cancel(session, "acct-tasks", tid)
    await h.run(60, step=10)
    assert (await h.task(tid)).status == TaskStatus.CANCELED
    assert await h.on_cluster(tid)  # still within its grace period
    h.restart()  # the grace period is the task's own clock
    await h.run(50, step=10)
    assert await h.on_cluster(tid)
    await h.run(20, step=10)
    assert not await h.on_cluster(tid)
    events = await h.events(tid)
    assert any("asked to stop and killed after PT2M" in e for e in events), events
    assert events[-1] == "Task container killed after its termination grace period"


async def test_a_helm_tasks_job_is_asked_to_stop_then_killed_after_the_grace_period(
    h: TaskHarness,
) -> None:
    stubborn = script(steps=[{"after": 1, "percent": 5}], exitAfter=None, onStop="ignore")
    tid = await h.create(terminationGracePeriodDuration="PT2M")
    chart_job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "finetune"},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 30,
                    "containers": [
                        {
                            "name": "task",
                            "image": "nvcr.io/acme/finetune:1",
                            "env": [{"name": k["key"], "value": k["value"]} for k in stubborn],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                }
            },
        },
    }
    async with h.maker() as session, session.begin():  # as a helm task's rendered chart
        row = await repository.get_for_update(session, tid)
        assert row is not None
        row.objects, row.container_image = [chart_job], None
    await h.run(3)
    assert (await h.task(tid)).status == TaskStatus.RUNNING
    async with h.maker() as session, session.begin():
        await h.tasks.cancel(session, "acct-tasks", tid)
    await h.run(60, step=10)
    assert (await h.task(tid)).status == TaskStatus.CANCELED
    assert await h.on_cluster(tid)  # asked to stop, still within the task's grace period
    await h.run(70, step=10)
    assert not await h.on_cluster(tid)
    events = await h.events(tid)
    assert events[-1] == "Task container killed after its termination grace period"


async def test_a_container_that_stops_when_asked_is_removed_before_the_grace_period(
    h: TaskHarness,
) -> None:
    polite = script(steps=[{"after": 1, "percent": 5}], exitAfter=None, stopSeconds=5)
    tid = await h.create(containerEnvironment=polite)
    await h.run(3)
    async with h.maker() as session, session.begin():
        await h.tasks.delete(session, "acct-tasks", tid)
    await h.run(10)
    assert not await h.on_cluster(tid)
    async with h.maker() as session:
        assert await repository.get(session, tid) is None  # deleted once the cluster is clean


async def test_rotated_secrets_reach_the_running_container(h: TaskHarness) -> None:
    hang = script(steps=[{"after": 1, "percent": 5}], exitAfter=None)
    tid = await h.create(containerEnvironment=hang, secrets=[{"name": "A", "value": "one"}])
    await h.run(2)
    async with h.maker() as session, session.begin():
        await h.tasks.update_secrets(
            session, "acct-tasks", tid, {"secrets": [{"name": "B", "value": "two"}]}
        )
    await h.run(1)
    adapter = h.registry.get("sim-a")
    assert isinstance(adapter, SimulatedAdapter)
    objects = await adapter.objects(await h.instance(tid))
    secret = next(o for o in objects if o["kind"] == "Secret")
    assert json.loads(base64.b64decode(secret["data"]["secrets.json"])) == {"A": "one", "B": "two"}
    task = await h.task(tid)
    assert task.secrets_delivered == task.secrets_generation == 2


async def test_tasks_share_the_clusters_capacity_with_function_instances(h: TaskHarness) -> None:
    adapter = h.registry.get("sim-a")
    assert isinstance(adapter, SimulatedAdapter)
    function = InstanceSpec("fn-instance", "f", "v", "NCP.GPU.H100_2x", "H100", 2)
    await adapter.apply(function, [workload(gpus=2)])
    tid = await h.create()
    await h.run(30, step=10)
    assert (await h.task(tid)).status == TaskStatus.QUEUED  # the function holds both GPUs
    await adapter.delete(function)
    await h.run(3)
    assert (await h.task(tid)).status == TaskStatus.COMPLETED


async def test_over_http_a_task_reporting_10_50_100_completes_on_the_apps_loop(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await client_factory(clusters_file=fast_catalog(tmp_path), tasks_interval=0.05)
    slow = script(
        steps=[
            {"after": 0.3, "percent": 10, "name": "ckpt-1", "files": {"w.bin": "one"}},
            {"after": 1, "percent": 50, "name": "ckpt-2", "files": {"w.bin": "two"}},
            {"after": 1, "percent": 100},
        ],
        exitAfter=1,
    )
    body = {"name": "e2e", **{k: v for k, v in BASE.items() if k != "name"}}
    resp = await client.post("/v1/nvct/tasks", json={**body, "containerEnvironment": slow})
    assert resp.status_code == 200, resp.text
    path = f"/v1/nvct/tasks/{resp.json()['task']['id']}"

    async def completed() -> bool:
        return bool((await client.get(path)).json()["task"]["status"] == "COMPLETED")

    await eventually(completed)
    results = (await client.get(f"{path}/results")).json()["results"]
    assert [r["name"] for r in results] == ["ckpt-1", "ckpt-2"]
    messages = [e["message"] for e in (await client.get(f"{path}/events")).json()["events"]]
    assert "Result ckpt-2 reported at 50%" in messages
    assert "Task completed (percentComplete 100)" in messages


async def test_over_http_a_containers_exit_ends_its_task_without_waiting_for_the_interval(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    # an hour between passes: only the cluster's report of the exit can end the task in time
    client = await client_factory(clusters_file=fast_catalog(tmp_path), tasks_interval=3600)
    quick = script(steps=[{"after": 0.3, "percent": 100}], exitAfter=0.2)
    body = {"name": "e2e", **{k: v for k, v in BASE.items() if k != "name"}}
    resp = await client.post("/v1/nvct/tasks", json={**body, "containerEnvironment": quick})
    assert resp.status_code == 200, resp.text
    path = f"/v1/nvct/tasks/{resp.json()['task']['id']}"

    async def completed() -> bool:
        return bool((await client.get(path)).json()["task"]["status"] == "COMPLETED")

    await eventually(completed, seconds=20)


async def test_a_container_that_never_writes_progress_errors_after_five_minutes(
    h: TaskHarness,
) -> None:
    tid = await h.create(containerEnvironment=script(steps=[], exitAfter=None))
    await h.run(10)
    started = (await h.task(tid)).running_at
    assert started is not None
    await h.run(290, step=10)
    assert (await h.task(tid)).status == TaskStatus.RUNNING  # 5 minutes since it started
    await h.run(10)
    task = await h.task(tid)
    assert task.status == TaskStatus.ERRORED and "no heartbeat" in (task.health_error or "")


async def test_a_task_ending_within_one_pass_still_records_running(h: TaskHarness) -> None:
    quick = script(steps=[{"after": 0, "percent": 100}], exitAfter=0)
    tid = await h.create(containerEnvironment=quick)
    await h.run()
    assert (await h.task(tid)).status == TaskStatus.LAUNCHED
    h.clock.advance(5)  # started, reported 100 and exited before the next pass
    await h.run()
    task = await h.task(tid)
    assert task.status == TaskStatus.COMPLETED
    assert task.launched_at is not None and task.running_at is not None
    assert task.launched_at <= task.running_at <= (task.finished_at or task.running_at)
    events = await h.events(tid)
    assert events[:4] == [
        "Task created and queued",
        "Task launched on cluster sim-a",
        "Task container started",
        "Task completed (percentComplete 100)",
    ]


async def test_event_times_never_go_backwards(h: TaskHarness) -> None:
    """A pass reads its clock once; a task created after that instant is still launched no
    earlier than it was created."""
    pass_started = h.clock.now
    h.clock.advance(1)
    tid = await h.create()
    h.loop.clock = lambda: pass_started
    await h.run()
    async with h.maker() as session:
        rows, _ = await repository.events_page(session, tid, Page(limit=None, after=None))
    times = [e.created_at for e in rows]
    assert [e.message for e in rows][:2] == [
        "Task created and queued",
        "Task launched on cluster sim-a",
    ]
    assert times == sorted(times)
    task = await h.task(tid)
    assert task.launched_at is not None and task.launched_at >= task.created_at


async def test_a_pass_that_read_its_clock_before_another_writers_change_lists_its_own_after(
    h: TaskHarness,
) -> None:
    """A pass's progress and end come after what another writer wrote since the pass read its
    clock (here a secrets update; an UPLOAD's push, in production), not before it."""
    steps = script(steps=[{"after": 1, "percent": 10}, {"after": 2, "percent": 100}])
    tid = await h.create(containerEnvironment=steps)
    await h.run(2)
    assert (await h.task(tid)).status == TaskStatus.RUNNING
    pass_started = h.clock.now
    h.clock.advance(3)
    async with h.maker() as session, session.begin():
        raw = {"secrets": [{"name": "HF_TOKEN", "value": "hf_new"}]}
        await h.tasks.update_secrets(session, ACCOUNT, tid, raw)
    h.loop.clock = lambda: pass_started
    await h.run()
    async with h.maker() as session:
        rows, _ = await repository.events_page(session, tid, Page(limit=None, after=None))
    messages = [e.message for e in rows]
    assert messages.index("Secrets updated: HF_TOKEN") < messages.index(
        "Task completed (percentComplete 100)"
    )
    times = [e.created_at for e in rows]
    assert times == sorted(times)


TWO_CHECKPOINTS = script(
    steps=[
        {"after": 0.3, "percent": 10, "name": "ckpt-1", "files": {"w.bin": "one"}},
        {"after": 0.5, "percent": 50, "name": "ckpt-2", "files": {"w.bin": "two", "m.json": "{}"}},
        {"after": 0.5, "percent": 100},
    ],
    exitAfter=0.2,
)


async def _upload_task(client: AppClient) -> str:
    body = {
        **{k: v for k, v in BASE.items() if k != "resultHandlingStrategy"},
        "resultHandlingStrategy": "UPLOAD",
        "resultsLocation": "acme/team/model",
        "secrets": [{"name": "NGC_API_KEY", "value": "nvapi-never-shown"}],
        "containerEnvironment": TWO_CHECKPOINTS,
    }
    resp = await client.post("/v1/nvct/tasks", json=body)
    assert resp.status_code == 200, resp.text
    return f"/v1/nvct/tasks/{resp.json()['task']['id']}"


async def _ended(client: AppClient, path: str) -> dict[str, Any]:
    async def ended() -> dict[str, Any] | None:
        task: dict[str, Any] = (await client.get(path)).json()["task"]
        return task if task["status"] not in ("QUEUED", "LAUNCHED", "RUNNING") else None

    task: dict[str, Any] = await eventually(ended)
    return task


async def test_an_upload_task_pushes_each_checkpoint_and_oras_pulls_its_bytes(
    client_factory: ClientFactory, tmp_path: Path, anon_registry: RegistryServer
) -> None:
    client = await client_factory(
        clusters_file=fast_catalog(tmp_path),
        tasks_interval=0.05,
        task_results_registry=anon_registry.host,
        insecure_registries=anon_registry.host,
    )
    path = await _upload_task(client)
    task = await _ended(client, path)
    assert task["status"] == "COMPLETED", task
    results = (await client.get(f"{path}/results")).json()["results"]
    assert [r["name"] for r in results] == ["ckpt-1", "ckpt-2"]
    expected = {
        "ckpt-1": {"ckpt-1/w.bin": b"one"},
        "ckpt-2": {"ckpt-2/w.bin": b"two", "ckpt-2/m.json": b"{}"},
    }
    for result in results:
        name = result["name"]
        assert result["reference"] == f"{anon_registry.host}/acme/team/model:{name}"
        assert result["digest"] == manifest_digest(anon_registry, result["reference"])
        assert oras_pull(anon_registry, result["reference"], tmp_path / name) == expected[name]
    messages = [e["message"] for e in (await client.get(f"{path}/events")).json()["events"]]
    pushed = messages.index(f"Result ckpt-2 pushed to {anon_registry.host}/acme/team/model:ckpt-2")
    assert pushed < messages.index("Task completed (percentComplete 100)")


async def test_an_upload_task_whose_push_fails_ends_errored_with_the_reason(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        host = f"127.0.0.1:{closed.getsockname()[1]}"
    client = await client_factory(
        clusters_file=fast_catalog(tmp_path),
        tasks_interval=0.05,
        task_results_registry=host,
        insecure_registries=host,
        task_results_push_attempts=1,
    )
    path = await _upload_task(client)
    task = await _ended(client, path)
    assert task["status"] == "ERRORED", task
    error = task["healthInfo"]["error"]
    # both checkpoints' pushes fail; whichever fails first ends the task
    assert re.match(r"result ckpt-[12] could not be pushed: ", error), error
    messages = [e["message"] for e in (await client.get(f"{path}/events")).json()["events"]]
    assert f"Task errored: {error}" in messages
    assert "nvapi-never-shown" not in str(messages)


async def test_a_checkpoint_shorter_than_one_pass_is_still_among_the_results(
    h: TaskHarness,
) -> None:
    files = {"files": {"w.bin": "x"}}
    brief = script(
        steps=[
            {"after": 1, "percent": 10, "name": "ckpt-1", **files},
            {"after": 0.2, "percent": 20, "name": "ckpt-brief", **files},
            {"after": 0.2, "percent": 30, "name": "ckpt-3", **files},
            {"after": 2, "percent": 100},
        ],
        exitAfter=1,
    )
    tid = await h.create(containerEnvironment=brief)
    await h.run(8)  # one pass a second: ckpt-brief is never in the progress file at a pass
    assert (await h.task(tid)).status == TaskStatus.COMPLETED
    names = [r.name for r in await h.results(tid)]
    assert sorted(names) == ["ckpt-1", "ckpt-3", "ckpt-brief"], names
    assert "Result ckpt-brief found in NVCT_RESULTS_DIR at completion" in await h.events(tid)
