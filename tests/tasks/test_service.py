"""Helm tasks through the helm functions' chart pipeline: a chart pulled from the registry,
rendered with `configuration`, checked by the policy (every refusal in one 400), installed on
the simulated cluster with NVCT's contract, its Job's container playing its script to
COMPLETED; over HTTP on the app's own loop."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from service.tasks.models import Task
from tests.support.api import assert_problem
from tests.support.app import ClientFactory
from tests.support.charts import PushCorpus
from tests.support.e2e import eventually
from tests.support.helm_e2e import TASK_CHART, start
from tests.support.registry import RegistryServer

pytestmark = pytest.mark.registry

T = "/v1/nvct/tasks"


def helm_task(chart_url: str, **configuration: Any) -> dict[str, Any]:
    return {
        "name": "helm-train",
        "gpuSpecification": {
            "gpu": "H100",
            "instanceType": "NCP.GPU.H100_1x",
            "configuration": configuration,
            "helmValidationPolicy": {"name": "Default"},
        },
        "helmChart": chart_url,
        "resultHandlingStrategy": "NONE",
    }


async def test_a_helm_task_runs_its_charts_job_to_completed(
    client_factory: ClientFactory,
    tmp_path: Path,
    anon_registry: RegistryServer,
    push_corpus: PushCorpus,
) -> None:
    client = await start(client_factory, tmp_path, anon_registry, tasks_interval=0.05)
    chart = push_corpus(anon_registry, "sim-workload", "tasks/helm", files=TASK_CHART)
    script = {
        "steps": [{"after": 0.1, "percent": 40, "name": "ckpt"}, {"after": 1, "percent": 100}]
    }
    resp = await client.post(T, json=helm_task(chart.file_url, script=json.dumps(script)))
    assert resp.status_code == 200, resp.text
    task = resp.json()["task"]
    assert task["helmChart"] == chart.file_url and "containerImage" not in task
    policy = {"name": "Default"}
    assert task["gpuSpecification"]["helmValidationPolicy"] == policy

    async def completed() -> dict[str, Any] | None:
        got = (await client.get(f"{T}/{task['id']}")).json()["task"]
        return got if got["status"] == "COMPLETED" else None

    done = await eventually(completed)
    assert done["percentComplete"] == 100
    results = (await client.get(f"{T}/{task['id']}/results")).json()["results"]
    assert [r["name"] for r in results] == ["ckpt"]

    async with client.app.state.sessionmaker() as session:
        row = await session.get(Task, uuid.UUID(task["id"]))
    assert row is not None and row.objects
    [job] = [o for o in row.objects if o["kind"] == "Job"]
    assert job["metadata"]["name"] == "trainer"


async def test_a_chart_the_policy_refuses_is_a_400_naming_every_finding(
    client_factory: ClientFactory,
    tmp_path: Path,
    anon_registry: RegistryServer,
    push_corpus: PushCorpus,
) -> None:
    client = await start(client_factory, tmp_path, anon_registry, reconciler_enabled=False)
    chart = push_corpus(anon_registry, "kind-not-allowed")
    problem = assert_problem(await client.post(T, json=helm_task(chart.file_url)), 400)
    errors = problem["errors"]
    assert isinstance(errors, list)
    assert {e["field"] for e in errors} == {"helmChart"}
    [error] = errors
    assert error["rule"] == "kind-not-allowed"
    assert "v1.Namespace" in error["message"] and "Ingress" in error["message"]
    assert (await client.get(T)).json()["tasks"] == []
