"""The task loop launching a task that names telemetries: the instance it applies carries the
collector of those telemetries (their keys, the task's labels), which the Kubernetes adapter
adds to the task's Job (tests/backends/test_collector_pod.py). Apart from test_loop.py only to
keep this issue's test out of that module's way."""

from __future__ import annotations

from typing import Any

import pytest

from service.backends.protocol import InstanceSpec
from service.observability import service as telemetries
from service.observability.models import Kind, Protocol, Provider
from service.observability.service import TelemetrySpec
from tests.support.tasks import ACCOUNT, TaskHarness


async def test_a_launched_task_naming_a_telemetry_is_applied_with_its_collector(
    h: TaskHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = TelemetrySpec(
        "task-otlp",
        "https://8.8.8.8/otlp",
        Protocol.HTTP,
        Provider.OTEL_COLLECTOR,
        [Kind.LOGS, Kind.TRACES],
        "task-key-4d1",
    )
    async with h.maker() as session, session.begin():
        telemetry = await telemetries.create(session, account_id=ACCOUNT, spec=spec, box=h.box)
    tid = await h.create(telemetries={"logsTelemetryId": str(telemetry.id)})

    adapter = h.registry.get("sim-a")
    assert adapter is not None
    applied: list[InstanceSpec] = []
    apply = adapter.apply

    async def recording(instance: InstanceSpec, objects: list[dict[str, Any]]) -> None:
        applied.append(instance)
        await apply(instance, objects)

    monkeypatch.setattr(adapter, "apply", recording)
    await h.run()

    [instance] = applied
    assert instance.instance_id == str(tid) and instance.telemetry is not None
    assert instance.telemetry.keys == {"NVCF_TELEMETRY_0_KEY": "task-key-4d1"}
    config = instance.telemetry.config
    assert set(config["service"]["pipelines"]) == {"logs"}  # only what the task names
    labels = {a["key"]: a["value"] for a in config["processors"]["resource"]["attributes"]}
    assert labels["nvcf.task.id"] == str(tid) and labels["nvcf.account"] == ACCOUNT
    assert labels["nvcf.task.name"] == "job"  # as the in-process export labels a task
    assert "task-key-4d1" not in repr(instance)
