"""A task on the simulated cluster naming telemetries exports in process as a function does:
its lines (masked, as the task logs route shows them), its progress, status and GPUs, and a
trace of its lifetime arrive at a real OTLP receiver, labelled with the task's id, name and
account; another account's task's never do, and a task naming none sends nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from service.auth import scopes
from service.tasks.exported import TaskExports
from service.tasks.models import Task
from tests.support.api import bearer, new_key
from tests.support.app import AppClient, ClientFactory
from tests.support.e2e import eventually
from tests.support.helm_e2e import fast_catalog
from tests.support.otlp import OtlpReceiver, attributes
from tests.support.tasks import BASE, script
from tests.support.telemetries import create_telemetry

ACCOUNT = "nvcf-default"
SECRET = "hf-secret-value"
TASKS = "/v1/nvct/tasks"


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver().start()
    yield r
    r.stop()


async def create_task(
    client: AppClient, name: str, headers: dict[str, str] | None = None, **fields: Any
) -> dict[str, Any]:
    steps = script(
        steps=[
            {"after": 0.1, "percent": 40, "name": SECRET, "files": {"w.bin": "one"}},
            {"after": 0.1, "percent": 100},
        ],
        exitAfter=0.1,
    )
    body = {**BASE, "name": name, "containerEnvironment": steps, **fields}
    resp = await client.post(TASKS, json=body, headers=headers)
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["task"])


async def ended(client: AppClient, task: dict[str, Any], headers: dict[str, str]) -> None:
    async def done() -> bool:
        got = (await client.get(f"{TASKS}/{task['id']}", headers=headers)).json()["task"]
        return bool(got["status"] == "COMPLETED")

    await eventually(done)


async def test_a_tasks_lines_metrics_and_lifetime_arrive_labelled_and_no_other_tasks(
    client_factory: ClientFactory, tmp_path: Path, receiver: OtlpReceiver
) -> None:
    other = OtlpReceiver().start()
    try:
        client = await client_factory(
            clusters_file=fast_catalog(tmp_path),
            tasks_interval=0.05,
            telemetry_allowlist=f"{receiver.hostport},{other.hostport}",
            telemetry_export_interval=0.2,
            telemetry_export_timeout=5.0,
        )
        theirs = bearer(await new_key(client, list(scopes.TASK_SCOPES), account="team-b"))
        theirs_telemetry = bearer(
            await new_key(client, [scopes.MANAGE_TELEMETRIES], account="team-b")
        )
        mine_t = await create_telemetry(client, endpoint=receiver.url)
        their_t = await create_telemetry(client, headers=theirs_telemetry, endpoint=other.url)

        def named(t: dict[str, Any]) -> dict[str, str]:
            return {f"{k}TelemetryId": t["telemetryId"] for k in ("logs", "metrics", "traces")}

        secrets = [{"name": "HF_TOKEN", "value": SECRET}]
        mine = await create_task(client, "trainer", telemetries=named(mine_t), secrets=secrets)
        their = await create_task(client, "their-job", theirs, telemetries=named(their_t))
        plain = await create_task(client, "plain")
        me = dict(client.headers)
        for task, headers in ((mine, me), (their, theirs), (plain, me)):
            await ended(client, task, headers)

        async def arrived() -> bool:
            await client.app.state.telemetry_exports.flush()
            names = {s.name for _, s in receiver.spans()}
            points = list(receiver.metric_points("nvcf.task.status"))
            lines = [r for _, r in receiver.log_records() if "checkpoint" in r.body.string_value]
            return bool(names >= {"task", "run"} and points and lines and list(other.log_records()))

        await eventually(arrived)
        labels = {"nvcf.account": ACCOUNT, "nvcf.task.id": mine["id"], "nvcf.task.name": "trainer"}

        # its lines: masked as the logs route shows them, each labelled as the task's
        records = [r for _, r in receiver.log_records()]
        texts = [r.body.string_value for r in records]
        assert "INFO     progress 40%, checkpoint **** (1 files)" in texts
        assert any(t.startswith("INFO     Starting task container") for t in texts)
        assert all(SECRET not in t for t in texts)
        for record in records:
            got = attributes(record.attributes)
            assert {k: got[k] for k in labels} == labels
            assert got["k8s.container.name"]
        assert {res["nvcf.account"] for res, _ in receiver.log_records()} == {ACCOUNT}

        # its lifetime: one trace, the task's id, its phases under the task's span
        spans = [s for _, s in receiver.spans()]
        assert {s.trace_id for s in spans} == {uuid.UUID(mine["id"]).bytes}
        by_name = {s.name: s for s in spans}
        assert {"task", "queue wait", "launch", "run"} <= set(by_name)
        root = by_name["task"]
        for phase in ("queue wait", "launch", "run"):
            assert by_name[phase].parent_span_id == root.span_id
        assert by_name["queue wait"].end_time_unix_nano <= by_name["run"].start_time_unix_nano
        assert by_name["run"].end_time_unix_nano == root.end_time_unix_nano
        got = attributes(root.attributes)
        assert {k: got[k] for k in labels} == labels
        assert got["nvcf.task.status"] == "COMPLETED" and got["nvcf.task.gpus"] == 1

        # its metrics: progress, status (1 for its status only) and GPUs, labelled as the task's
        for name in ("nvcf.task.progress", "nvcf.task.status", "nvcf.task.gpus"):
            points = list(receiver.metric_points(name))
            assert points, name
            for _, point in points:
                got = attributes(point.attributes)
                assert {k: got[k] for k in labels} == labels, name
        progress = [p.as_int for _, p in receiver.metric_points("nvcf.task.progress")]
        assert progress[-1] == 100
        last: dict[str, int] = {}
        for _, point in receiver.metric_points("nvcf.task.status"):
            last[attributes(point.attributes)["status"]] = point.as_int
        assert last["COMPLETED"] == 1 and sum(last.values()) == 1
        assert {p.as_int for _, p in receiver.metric_points("nvcf.task.gpus")} == {1}

        # nothing of the other account's task here, nor of the task naming none
        seen = {
            *(attributes(r.attributes).get("nvcf.task.id") for _, r in receiver.log_records()),
            *(attributes(s.attributes).get("nvcf.task.id") for _, s in receiver.spans()),
        }
        assert seen == {mine["id"]}
        assert {attributes(r.attributes)["nvcf.task.id"] for _, r in other.log_records()} == {
            their["id"]
        }
        assert {res["nvcf.account"] for res, _ in other.log_records()} == {"team-b"}
    finally:
        other.stop()


@contextmanager
def statements(engine: AsyncEngine) -> Iterator[list[str]]:
    """Every statement run on `engine` meanwhile."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)


async def test_an_idle_server_reads_nothing_for_export_until_something_changes(
    client_factory: ClientFactory, tmp_path: Path, receiver: OtlpReceiver
) -> None:
    """With no telemetry in use, the export loops' passes run no statement after the first,
    until a task is created or the clusters report a change (statements counted)."""
    client = await client_factory(
        clusters_file=fast_catalog(tmp_path),
        telemetry_allowlist=receiver.hostport,
        telemetry_export_interval=0.2,
    )
    state = client.app.state
    loops = state.telemetry_loops
    # their passes are run here, one at a time, with no other loop reading meanwhile
    for loop in (*loops, state.task_loop, state.reconciler):
        await loop.stop()
    run: list[str] = []

    async def passes(n: int) -> None:
        with statements(state.engine) as seen:
            for _ in range(n):
                for loop in loops:
                    await loop.pass_once()
        run.extend(s for s in seen if "telemetries" in s)

    await passes(1)
    first = len(run)
    await passes(3)
    assert first >= 2 and len(run) == first

    telemetry = await create_telemetry(client, endpoint=receiver.url)
    await passes(1)
    assert len(run) == first  # a telemetry nothing uses changes nothing

    state.reconciler.on_changes({"an-instance"}, False)  # a cluster's change feed
    await passes(1)
    assert len(run) == 2 * first  # both loops read again, and found nothing
    await passes(1)
    assert len(run) == 2 * first

    named = {"metricsTelemetryId": telemetry["telemetryId"]}
    await create_task(client, "trainer", telemetries=named)  # wakes the task export
    await passes(1)
    assert len(run) > 2 * first


async def test_one_replica_follows_a_tasks_lines_and_another_carries_on_when_it_stops(
    client_factory: ClientFactory, tmp_path: Path, receiver: OtlpReceiver
) -> None:
    """Two replicas' task exports on one database and cluster: each line arrives once; when
    the replica following the task stops, the other takes its lease over and goes on from the
    last line sent."""
    client = await client_factory(
        clusters_file=fast_catalog(tmp_path),
        tasks_interval=0.05,
        telemetry_allowlist=receiver.hostport,
        telemetry_export_interval=0.2,
        telemetry_export_timeout=5.0,
    )
    state = client.app.state
    mine = state.telemetry_loops[1]
    other = TaskExports(
        state.sessionmaker,
        state.adapters,
        state.tasks,
        state.telemetry_exports,
        "replica-b",
        period=mine.period,
        limit=mine.limit,
    )
    other.start()
    # its own task loop would tell it of the task on the cluster, as the app's tells the app's
    seen = state.task_loop.on_telemetry

    def on_telemetry() -> None:
        seen()
        other.changed()

    state.task_loop.on_telemetry = on_telemetry
    replicas = {"replica-b": other}
    telemetry = await create_telemetry(client, endpoint=receiver.url, types=["LOGS"])
    steps = [{"after": 0.3, "percent": 8 * i + 12, "name": f"step-{i}"} for i in range(12)]
    body = {
        **BASE,
        "name": "trainer",
        "containerEnvironment": script(steps=steps, exitAfter=0.1),
        "telemetries": {"logsTelemetryId": telemetry["telemetryId"]},
    }
    resp = await client.post(TASKS, json=body)
    assert resp.status_code == 200, resp.text
    task = resp.json()["task"]

    def checkpoints() -> list[str]:
        return [
            r.body.string_value
            for _, r in receiver.log_records()
            if "checkpoint step-" in r.body.string_value
        ]

    async def follower() -> str | None:
        async with state.sessionmaker() as session:
            row = await session.get(Task, uuid.UUID(task["id"]))
            return row.log_follower if row is not None and checkpoints() else None

    holder = await eventually(follower)
    replicas.setdefault(holder, mine)
    await replicas.pop(holder).stop()  # the replica following it stops; the other goes on
    await ended(client, task, dict(client.headers))

    async def all_lines() -> list[str]:
        await state.telemetry_exports.flush()
        lines = checkpoints()
        return lines if sum("step-11" in line for line in lines) else []

    lines = await eventually(all_lines)
    assert sorted(lines) == sorted(set(lines)), lines  # none twice
    assert {line.rsplit(" ", 1)[-1] for line in lines} == {f"step-{i}" for i in range(12)}
    await other.stop()
