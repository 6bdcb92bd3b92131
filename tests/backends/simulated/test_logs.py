"""The simulated worker's log on a fake clock: start-up and readiness lines, the requests it
served, probe failures of the unhealthy faults, a crash loop's stack trace run after run with
`previous`, the bounds, and a follow that sees requests and ends with the instance."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from service.backends import (
    AdapterError,
    InstanceSpec,
    NodeShape,
    SimulatedAdapter,
    SimulationDelays,
)
from service.backends.logs import LogLine, LogRequest
from service.backends.worker import WorkerPort

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
# ready at 1 (scheduled) + 2 (pulled, running) + 3 (ready) = 6 s after apply
DELAYS = SimulationDelays(schedule_seconds=1, pull_seconds=2, ready_seconds=3)


class FakeClock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def set(self, seconds: float) -> None:
        self.now = T0 + timedelta(seconds=seconds)


INSTANCE = InstanceSpec(
    instance_id="inst-1",
    function_id="fn-1",
    version_id="ver-1",
    instance_type="NCP.GPU.H100_1x",
    gpu="H100",
    gpus_per_node=1,
    worker_service="web",
)


def objects(fault: str | None = None) -> list[dict[str, Any]]:
    annotations = {"sim.nvcf.io/fault": fault} if fault else {}
    container = {
        "name": "inference",
        "image": "nvcr.io/acme/triton:24.08",
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}, "annotations": annotations},
                    "spec": {"containers": [container]},
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 8000}]},
        },
    ]


async def started(clock: FakeClock, fault: str | None = None) -> SimulatedAdapter:
    sim = SimulatedAdapter(
        "sim", provider="NCP", nodes=[NodeShape("H100", 8, 1)], delays=DELAYS, clock=clock
    )
    await sim.apply(INSTANCE, objects(fault))
    await sim.observe(INSTANCE)
    return sim


async def read(sim: SimulatedAdapter, request: LogRequest | None = None) -> list[LogLine]:
    return [line async for line in sim.logs(INSTANCE, request or LogRequest())]


def texts(lines: list[LogLine]) -> list[str]:
    return [line.text for line in lines]


async def test_startup_readiness_and_each_request_served() -> None:
    clock = FakeClock()
    sim = await started(clock)
    assert await read(sim) == []  # not started yet: nothing printed

    clock.set(10)
    endpoint = await sim.endpoint(INSTANCE, WorkerPort("web", 8000))
    answer = await endpoint.send("POST", "/echo", [("NVCF-REQID", "req-1")], b"{}")
    assert answer.status == 200

    lines = await read(sim, LogRequest(timestamps=True))
    assert texts(lines)[0].startswith("INFO     Starting inference (nvcr.io/acme/triton:24.08)")
    assert "INFO     Model loaded: ready to serve (GET /health -> 200)" in texts(lines)
    assert texts(lines)[-1] == 'INFO     "POST /echo" 200 req-1'
    assert {line.container for line in lines} == {"inference"}
    assert lines[-1].timestamp == "2025-03-01T12:00:10.000000000Z"
    assert all(line.timestamp == "" for line in await read(sim))


async def test_a_crash_loop_prints_a_stack_trace_before_each_restart() -> None:
    clock = FakeClock()
    sim = await started(clock, "CrashLoopBackOff")
    clock.set(50)  # runs 3-6, 9-12, 18-21, 33-36 (each crashes), back-off until 60
    current = texts(await read(sim))
    assert current[0].startswith("INFO     Starting inference")
    assert "Traceback (most recent call last):" in current
    assert current[-2].startswith("RuntimeError: CUDA error: out of memory")
    previous = texts(await read(sim, LogRequest(previous=True)))
    assert "Traceback (most recent call last):" in previous


async def test_probe_failures_of_an_instance_that_never_gets_ready() -> None:
    clock = FakeClock()
    sim = await started(clock, "NeverReady")
    clock.set(3 + 35)
    lines = texts(await read(sim))
    failures = [t for t in lines if "health check: model still loading" in t]
    assert len(failures) == 3  # every 10 s since it started


async def test_fail_after_ready_prints_the_fault() -> None:
    clock = FakeClock()
    sim = await started(clock, "FailAfterReady")
    clock.set(30)
    lines = texts(await read(sim))
    assert "ERROR    CUDA error: an illegal memory access was encountered" in lines
    assert any("worker unhealthy (GET /health -> 500)" in t for t in lines)


async def test_bounds_tail_since_and_bytes() -> None:
    clock = FakeClock()
    sim = await started(clock)
    clock.set(10)
    endpoint = await sim.endpoint(INSTANCE, WorkerPort("web", 8000))
    for i in range(5):
        clock.set(10 + i)
        await endpoint.send("GET", f"/r{i}", [], b"")
    assert texts(await read(sim, LogRequest(tail_lines=2))) == [
        'INFO     "GET /r3" 200 -',
        'INFO     "GET /r4" 200 -',
    ]
    assert len(await read(sim, LogRequest(since_seconds=2))) == 3  # at 12, 13 and 14
    assert texts(await read(sim, LogRequest(tail_lines=5, limit_bytes=30))) == [
        'INFO     "GET /r0" 200 -'
    ]
    assert await read(sim, LogRequest(tail_lines=0)) == []


async def test_naming_a_container_the_pods_do_not_have_is_refused() -> None:
    clock = FakeClock()
    sim = await started(clock)
    clock.set(10)
    with pytest.raises(AdapterError) as refused:
        await read(sim, LogRequest(container="nope"))
    assert refused.value.status == 400
    with pytest.raises(AdapterError, match="previous terminated container"):
        await read(sim, LogRequest(container="inference", previous=True))


async def test_follow_sees_requests_and_ends_with_the_instance() -> None:
    clock = FakeClock()
    sim = await started(clock)
    clock.set(10)
    endpoint = await sim.endpoint(INSTANCE, WorkerPort("web", 8000))
    stream = sim.logs(INSTANCE, LogRequest(follow=True, tail_lines=0))
    # the follow is reading (waiting for a line) when the request is served
    waiting = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    await endpoint.send("POST", "/while-following", [("X-Sim-Log", "hello from the worker")], b"")
    assert (await waiting).text == "hello from the worker"
    assert (await anext(stream)).text == 'INFO     "POST /while-following" 200 -'
    await sim.delete(INSTANCE)
    assert [line async for line in stream] == []  # the follow ended with the instance
