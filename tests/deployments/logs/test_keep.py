"""The last lines kept as an instance fails: read from the backend (the previous run of a
restarted container first), bounded by lines and bytes per container, secret values masked,
and nothing (never an error) when the backend cannot answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

from service.backends import (
    AdapterError,
    InstanceSpec,
    NodeShape,
    SimulatedAdapter,
    SimulationDelays,
)
from service.backends.logs import MAX_LINE_BYTES, LogLine, LogRequest, bound
from service.backends.worker import WorkerPort
from service.deployments.logs.keep import last_lines, restart_counts, shown
from service.deployments.logs.mask import Masker

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
SECRET = "hf_0123456789abcdef"
INSTANCE = InstanceSpec(
    instance_id="inst-1",
    function_id="fn-1",
    version_id="ver-1",
    instance_type="NCP.GPU.H100_1x",
    gpu="H100",
    gpus_per_node=1,
    worker_service="web",
)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def workload(fault: str | None) -> list[dict[str, Any]]:
    annotations = {"sim.nvcf.io/fault": fault} if fault else {}
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
                    "spec": {"containers": [{"name": "inference", "image": "nvcr.io/a/b:1"}]},
                },
            },
        }
    ]


async def cluster(clock: Clock, fault: str | None = None) -> SimulatedAdapter:
    sim = SimulatedAdapter(
        "sim",
        provider="NCP",
        nodes=[NodeShape("H100", 8, 1)],
        delays=SimulationDelays(schedule_seconds=1, pull_seconds=2, ready_seconds=3),
        clock=clock,
    )
    await sim.apply(INSTANCE, workload(fault))
    await sim.observe(INSTANCE)
    return sim


async def test_a_crash_loops_runs_are_kept_previous_first() -> None:
    clock = Clock()
    sim = await cluster(clock, "CrashLoopBackOff")
    clock.now = T0 + timedelta(seconds=50)
    kept = await last_lines(sim, INSTANCE, Masker(()), lines=200, max_bytes=65536)
    assert [(k["container"], k["previous"]) for k in kept] == [
        ("inference", True),
        ("inference", False),
    ]
    assert all("Traceback (most recent call last):" in k["lines"] for k in kept)
    lines = shown(kept)
    assert lines[0].startswith("[") and " previous] INFO     Starting inference" in lines[0]


async def test_secret_values_printed_by_the_worker_are_masked() -> None:
    clock = Clock()
    sim = await cluster(clock)
    clock.now = T0 + timedelta(seconds=10)
    endpoint = await sim.endpoint(INSTANCE, WorkerPort("web", 8000))
    await endpoint.send("POST", "/echo", [("X-Sim-Log", f"token={SECRET} ok")], b"")
    kept = await last_lines(sim, INSTANCE, Masker([SECRET, "x"]), lines=200, max_bytes=65536)
    text = "\n".join(shown(kept))
    assert SECRET not in text
    assert "token=**** ok" in text
    assert "INFO" in text  # a value shorter than 4 characters ("x") is left alone


async def test_lines_and_bytes_are_bounded_per_container() -> None:
    clock = Clock()
    sim = await cluster(clock)
    clock.now = T0 + timedelta(seconds=10)
    endpoint = await sim.endpoint(INSTANCE, WorkerPort("web", 8000))
    for i in range(50):
        await endpoint.send("GET", f"/r{i}", [], b"")
    [few] = await last_lines(sim, INSTANCE, Masker(()), lines=5, max_bytes=65536)
    assert few["lines"] == [f'INFO     "GET /r{i}" 200 -' for i in range(45, 50)]
    [small] = await last_lines(sim, INSTANCE, Masker(()), lines=200, max_bytes=60)
    assert small["lines"] == ['INFO     "GET /r48" 200 -', 'INFO     "GET /r49" 200 -']
    assert await last_lines(sim, INSTANCE, Masker(()), lines=0, max_bytes=60) == []


class Unreachable:
    name = "gone"

    async def logs(self, instance: InstanceSpec, request: LogRequest) -> AsyncIterator[LogLine]:
        raise AdapterError("connection refused")
        yield  # an async generator  # pragma: no cover


async def test_a_backend_that_cannot_answer_costs_the_lines_only() -> None:
    kept = await last_lines(Unreachable(), INSTANCE, Masker(()), lines=200, max_bytes=100)  # type: ignore[arg-type]
    assert kept == []


async def test_a_restart_keeps_the_previous_run_of_the_restarted_container_only() -> None:
    """What a restart keeps (`only`): the run that ended of the containers named, bounded as
    at a failure; not the current run, not another container; a name the backend does not
    know keeps nothing."""
    clock = Clock()
    sim = await cluster(clock, "CrashLoopBackOff")
    clock.now = T0 + timedelta(seconds=50)
    observed = await sim.observe(INSTANCE)
    counts = restart_counts(observed)
    [(pod, container)] = [k for k, n in counts.items() if n > 0]
    assert container == "inference"
    kept = await last_lines(
        sim, INSTANCE, Masker(()), lines=3, max_bytes=65536, only=frozenset({(pod, container)})
    )
    assert [(k["pod"], k["container"], k["previous"]) for k in kept] == [(pod, container, True)]
    assert len(kept[0]["lines"]) == 3
    assert all(line.startswith(f"[{pod}/inference previous] ") for line in shown(kept))
    elsewhere = frozenset({(pod, "sidecar")})
    assert await last_lines(sim, INSTANCE, Masker(()), lines=3, max_bytes=100, only=elsewhere) == []


class Printed:
    """A backend whose container printed `texts` (the adapter's `logs` alone); records what
    it was asked."""

    name = "printed"

    def __init__(self, *texts: str) -> None:
        self.texts = texts
        self.asked: list[LogRequest] = []

    async def logs(self, instance: InstanceSpec, request: LogRequest) -> AsyncIterator[LogLine]:
        self.asked.append(request)
        if not request.previous:
            for text in self.texts:
                yield LogLine("web-0", "inference", bound(text))


async def test_a_kept_read_is_bounded_in_bytes_and_a_huge_line_is_cut() -> None:
    backend = Printed("x" * (20 * 1024 * 1024), "last")
    [kept] = await last_lines(backend, INSTANCE, Masker(()), lines=200, max_bytes=65536)  # type: ignore[arg-type]
    assert {r.limit_bytes for r in backend.asked} == {4 * 65536 + 1024 * 200}
    huge, last = kept["lines"]
    assert last == "last"
    assert huge.endswith("…[line truncated]")
    assert len(huge.encode()) <= MAX_LINE_BYTES + 32


async def test_a_secret_straddling_the_cut_is_masked_before_the_line_is_cut() -> None:
    backend = Printed("x" * (MAX_LINE_BYTES - 5) + SECRET + " tail")
    [kept] = await last_lines(backend, INSTANCE, Masker([SECRET]), lines=10, max_bytes=65536)  # type: ignore[arg-type]
    [line] = kept["lines"]
    assert SECRET[:5] not in line
    assert line == "x" * (MAX_LINE_BYTES - 5) + "****  …[line truncated]"
