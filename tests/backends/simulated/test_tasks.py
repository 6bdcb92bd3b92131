"""The simulated cluster's task runner: a Job's container plays the script its environment
names, its progress file and results' files as `TaskFiles` gives them to the platform; a
script that is not one is refused at apply."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.backends import AdapterError, InstanceSpec, NodeShape, SimulatedAdapter
from service.backends.protocol import TaskFiles
from service.backends.simulated.model import SimulationDelays
from service.clusters.instance_types import parse_instance_type
from service.tasks.workload import job_objects
from tests.support.reconcile import FakeClock
from tests.support.tasks import catalog, script

TASK = InstanceSpec("task-1", "", "", "NCP.GPU.H100_1x", "H100", 1, task=True)


def objects(env: list[dict[str, str]], *, suspend: bool = False) -> list[dict[str, object]]:
    cluster = catalog().cluster("sim-a")
    assert cluster is not None
    return job_objects(
        task_id="task-1",
        name="t",
        nca_id="a",
        image="img:1",
        args=None,
        environment=env,
        cluster=cluster,
        backend="g",
        instance_type=parse_instance_type("NCP.GPU.H100_1x"),
        max_runtime_seconds=None,
        grace_seconds=60,
        secrets={},
        suspend=suspend,
    )


def adapter(clock: FakeClock) -> SimulatedAdapter:
    return SimulatedAdapter(
        "sim-a",
        provider="NCP",
        nodes=[NodeShape("H100", 1, 1)],
        delays=SimulationDelays(0, 0, 1),
        clock=clock,
    )


async def test_progress_and_result_files_as_the_script_writes_them(tmp_path: Path) -> None:
    clock = FakeClock()
    sim = adapter(clock)
    assert isinstance(sim, TaskFiles)
    env = script(
        steps=[{"after": 2, "percent": 30, "name": "ckpt", "files": {"a/b.txt": "bytes!"}}],
        exitAfter=None,
    )
    await sim.apply(TASK, objects(env))
    assert await sim.task_progress(TASK, max_bytes=1000) is None  # nothing written yet
    clock.advance(3)
    progress = json.loads(await sim.task_progress(TASK, max_bytes=1000) or b"")
    assert progress["percentComplete"] == 30 and progress["name"] == "ckpt"
    assert progress["taskId"] == "task-1"
    into = tmp_path / "fetched"
    await sim.fetch_task_result(TASK, "ckpt", str(into), max_bytes=100, max_files=10)
    assert (into / "a" / "b.txt").read_text() == "bytes!"
    with pytest.raises(AdapterError, match="larger than 3 bytes"):
        await sim.fetch_task_result(TASK, "ckpt", str(into), max_bytes=3, max_files=10)
    with pytest.raises(AdapterError, match="no directory"):
        await sim.fetch_task_result(TASK, "other", str(into), max_bytes=100, max_files=10)
    with pytest.raises(AdapterError, match="larger than 10 bytes"):
        await sim.task_progress(TASK, max_bytes=10)
    await sim.delete(TASK)
    assert await sim.task_progress(TASK, max_bytes=1000) is None
    with pytest.raises(AdapterError, match="no files"):
        await sim.fetch_task_result(TASK, "ckpt", str(into), max_bytes=100, max_files=10)


async def test_result_names_list_every_checkpoint_directory_oldest_first() -> None:
    clock = FakeClock()
    sim = adapter(clock)
    files = {"files": {"w.bin": "x"}}
    env = script(
        steps=[
            {"after": 1, "percent": 10, "name": "b-first", **files},
            {"after": 1, "percent": 20, "name": "a-second", **files},
            {"after": 1, "percent": 30, "name": "no-files"},
        ],
        exitAfter=None,
    )
    await sim.apply(TASK, objects(env))
    assert await sim.task_result_names(TASK, max_names=10) == []  # not started
    clock.advance(1.5)
    assert await sim.task_result_names(TASK, max_names=10) == ["b-first"]
    clock.advance(5)  # the progress file now names only the last checkpoint
    assert await sim.task_result_names(TASK, max_names=10) == ["b-first", "a-second"]
    assert await sim.task_result_names(TASK, max_names=1) == ["b-first"]


async def test_a_script_that_is_not_one_is_refused_at_apply() -> None:
    sim = adapter(FakeClock())
    bad = [{"key": "SIM_TASK_SCRIPT", "value": '{"steps": [{"after": -1}]}'}]
    with pytest.raises(AdapterError, match="after must be a number") as raised:
        await sim.apply(TASK, objects(bad))
    assert not raised.value.retryable


async def test_a_stopped_pod_frees_its_gpu_when_it_exits_and_is_listed_until_deleted() -> None:
    clock = FakeClock()
    sim = adapter(clock)
    env = script(steps=[{"after": 1, "percent": 10}], exitAfter=None, stopSeconds=5)
    await sim.apply(TASK, objects(env))
    clock.advance(2)
    assert [s.free for s in (await sim.capacity()).shapes] == [0]
    # the task is canceled: its Job is suspended, which asks its container to stop
    await sim.apply(TASK, objects(env, suspend=True))
    clock.advance(4)
    assert [s.free for s in (await sim.capacity()).shapes] == [0]  # still stopping
    clock.advance(2)
    # it exited 5 s after the stop: its GPU is free as Kubernetes frees a terminated pod's
    assert [s.free for s in (await sim.capacity()).shapes] == [1]
    pods = [o for o in await sim.objects(TASK) if o["kind"] == "Pod"]
    assert [p["status"]["phase"] for p in pods] == ["Failed"]
