"""NVIDIA's nvcf-cli against the task routes: every command and flag of its `cmd/task.go`, the
requests exactly as `internal/client/tasks.go` builds them (method, path, query, headers,
body bytes: tests/support/nvct_cli.py), the answers decoded as its structs decode them
(tests/support/go_decode.py). The examples are nvcf-cli's `examples/*task*.json` with the
built-in catalog's backend and instance type (theirs name NVIDIA's clusters)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from service.auth.scopes import TASK_SCOPES
from tests.support.api import bearer, new_key
from tests.support.app import AppClient
from tests.support.charts import PushCorpus
from tests.support.e2e import eventually
from tests.support.go_decode import (
    LIST_BASIC_TASK_DETAILS_RESPONSE,
    LIST_GPU_USAGE_RESPONSE,
    LIST_TASK_EVENTS_RESPONSE,
    LIST_TASK_RESULTS_RESPONSE,
    LIST_TASKS_RESPONSE,
    TASK_RESPONSE,
    assert_go_decodes,
)
from tests.support.helm_e2e import TASK_CHART, start
from tests.support.nvct_cli import (
    ACCEPT,
    JSON_BODY,
    bulk_body,
    create_body,
    marshal,
    query,
    secrets_body,
    task_path,
)
from tests.support.registry import RegistryServer
from tests.support.telemetries import create_telemetry

ACCOUNT = "nvcf-default"
SPEC = {"gpu": "H100", "instanceType": "NCP.GPU.H100_1x", "backend": "nvcf-default"}
#: examples/create-task.json
CREATE_TASK = {
    "name": "example-training-task",
    "description": "Minimal NVCT task example used by `nvcf-cli task create --input-file`.",
    "gpuSpecification": SPEC,
    "containerImage": "nvcr.io/0651155215864979/ncp-dev/example-trainer:0.1.0",
    "containerArgs": "--epochs 10 --batch-size 32",
    "containerEnvironment": [
        {"key": "MODEL_NAME", "value": "llama"},
        {"key": "LOG_LEVEL", "value": "INFO"},
    ],
    "tags": ["example", "training", "demo"],
    "maxRuntimeDuration": "PT4H",
    "maxQueuedDuration": "PT24H",
    "terminationGracePeriodDuration": "PT15M",
    "resultHandlingStrategy": "NONE",
}
#: examples/create-task-with-results.json
CREATE_TASK_WITH_RESULTS = {
    "name": "example-fine-tune-with-upload",
    "description": "Task that uploads results/checkpoints to NGC Model Registry. Requires "
    "NGC_API_KEY secret with write privileges to resultsLocation.",
    "gpuSpecification": SPEC,
    "containerImage": "nvcr.io/0651155215864979/ncp-dev/example-trainer:0.1.0",
    "containerArgs": "--checkpoint-dir /workspace/checkpoints",
    "containerEnvironment": [{"key": "OUTPUT_DIR", "value": "/workspace/checkpoints"}],
    "tags": ["example", "fine-tune"],
    "maxRuntimeDuration": "PT6H",
    "resultHandlingStrategy": "UPLOAD",
    "resultsLocation": "my-org/my-team/my-finetuned-model",
    "secrets": [{"name": "NGC_API_KEY", "value": "nvapi-replace-with-real-key"}],
}
#: examples/create-task-helm.json (its chart is replaced by `--helm-chart`)
CREATE_TASK_HELM: dict[str, Any] = {
    "name": "example-helm-task",
    "description": "Task launched via a Helm chart with a custom validation policy.",
    "gpuSpecification": {
        **SPEC,
        "configuration": {
            "image": {
                "repository": "nvcr.io/0651155215864979/ncp-dev/example-helm-trainer",
                "tag": "0.1.0",
            },
            "replicaCount": 1,
        },
        "helmValidationPolicy": {"name": "Default"},
    },
    "helmChart": "https://helm.ngc.nvidia.com/0651155215864979/example-charts/charts/"
    "example-trainer-0.1.0.tgz",
    "tags": ["example", "helm"],
    "maxRuntimeDuration": "PT2H",
    "resultHandlingStrategy": "NONE",
}
#: examples/bulk-tasks.json
BULK_TASKS = {
    "taskIds": [
        "00000000-0000-0000-0000-000000000001",
        "00000000-0000-0000-0000-000000000002",
        "00000000-0000-0000-0000-000000000003",
    ]
}
#: examples/update-task-secrets.json
UPDATE_TASK_SECRETS = {
    "secrets": [
        {"name": "NGC_API_KEY", "value": "nvapi-replace-with-real-key"},
        {"name": "HF_TOKEN", "value": "hf_replace-with-real-token"},
    ]
}


#: on sim-ncp a task (the simulated cluster's default script) completes after half a second;
#: on sim-slow it runs for an hour
CATALOG = {
    "clusterGroups": [
        {
            "name": "nvcf-default",
            "clusters": [
                {
                    "name": name,
                    "adapter": "simulated",
                    "provider": "NCP",
                    "region": "us-east-1",
                    "k8sVersion": "1.30.0",
                    "nodes": [
                        {"gpu": gpu, "gpusPerNode": 1, "count": 4, "cpu": 16, "memory": "64Gi"}
                    ],
                    "simulation": {
                        "scheduleSeconds": 0.1,
                        "pullSeconds": 0.1,
                        "readySeconds": ready,
                    },
                }
                for name, gpu, ready in (("sim-ncp", "H100", 0.5), ("sim-slow", "L40S", 3600))
            ],
        }
    ]
}


class Cli:
    """Sends what nvcf-cli sends, with its NVCT key (`api-key generate --for task`)."""

    def __init__(self, client: httpx.AsyncClient, key: str) -> None:
        self.client = client
        self.auth = bearer(key)

    async def send(self, method: str, path: str, body: Any = None) -> httpx.Response:
        headers = {**(JSON_BODY if body is not None else ACCEPT), **self.auth}
        content = marshal(body) if body is not None else None
        return await self.client.request(method, path, content=content, headers=headers)

    async def decoded(self, method: str, path: str, shape: Any, body: Any = None) -> Any:
        """`decodeNVCT`: a 2xx decoded into the struct, else the CLI's error."""
        response = await self.send(method, path, body)
        assert 200 <= response.status_code < 300, (path, response.status_code, response.text)
        assert_go_decodes(response.json(), shape)
        return response.json()


async def cli_of(client: AppClient) -> Cli:
    return Cli(client, await new_key(client, list(TASK_SCOPES)))


def test_the_requests_are_built_as_the_go_client_builds_them() -> None:
    flags = create_body(
        name="flagged",
        gpu="H100",
        instance_type="NCP.GPU.H100_1x",
        image="nvcr.io/acme/trainer:1",
        container_env=["A=1", "B=x=y"],
        models=["m:1:ngc://org/m:1"],
        secrets=["TOKEN=t"],
    )
    assert list(flags) == [
        "name",
        "gpuSpecification",
        "containerImage",
        "containerEnvironment",
        "models",
        "secrets",
    ]
    assert flags["gpuSpecification"] == {"gpu": "H100", "instanceType": "NCP.GPU.H100_1x"}
    assert flags["containerEnvironment"][1] == {"key": "B", "value": "x=y"}
    assert flags["models"] == [{"name": "m", "version": "1", "uri": "ngc://org/m:1"}]
    # a flag overrides the file; the --secrets pairs come before the file's secrets
    mixed = create_body(CREATE_TASK_WITH_RESULTS, name="renamed", secrets=["HF_TOKEN=h"])
    assert mixed["name"] == "renamed"
    assert [s["name"] for s in mixed["secrets"]] == ["HF_TOKEN", "NGC_API_KEY"]
    assert query(limit=0, status="", cursor="") == ""
    assert query(status="RUNNING", limit=2, cursor="c") == "?cursor=c&limit=2&status=RUNNING"
    assert marshal({"a": "<&>"}) == b'{"a":"\\u003c\\u0026\\u003e"}'


async def test_every_task_command_as_nvcf_cli_sends_it(client_factory: Any, tmp_path: Path) -> None:
    catalog = tmp_path / "clusters.yaml"
    catalog.write_text(yaml.safe_dump(CATALOG))
    client: AppClient = await client_factory(
        clusters_file=catalog, task_results_registry="registry.example.com"
    )
    cli = await cli_of(client)

    # task create --input-file examples/create-task.json
    first = await cli.decoded("POST", "/v1/nvct/tasks", TASK_RESPONSE, create_body(CREATE_TASK))
    task = first["task"]
    assert task["status"] == "QUEUED" or task["status"] in {"LAUNCHED", "RUNNING"}
    assert task["containerEnvironment"] == CREATE_TASK["containerEnvironment"]
    assert task["terminationGracePeriodDuration"] == "PT15M"
    # task create with every other flag (over no file)
    logs, metrics = (
        await create_telemetry(client),
        await create_telemetry(
            client,
            provider="PROMETHEUS",
            types=["METRICS"],
            endpoint="https://8.8.8.8/api/v1/write",
            secret={"name": "prom", "value": "k"},
        ),
    )
    telemetries = {
        "logsTelemetryId": logs["telemetryId"],
        "metricsTelemetryId": metrics["telemetryId"],
        "tracesTelemetryId": logs["telemetryId"],
    }
    flagged = create_body(
        name="flagged-task",
        gpu="L40S",
        instance_type="NCP.GPU.L40S_1x",
        clusters=["sim-slow"],
        image="nvcr.io/acme/trainer:1.0",
        container_args="--epochs 1",
        container_env=["MODEL=llama"],
        tags=["a", "b"],
        description="every flag",
        max_runtime="PT1H",
        max_queued="PT2H",
        termination_grace="PT5M",
        result_strategy="UPLOAD",
        results_location="acme/team/flagged-model",
        models=["llama:1.0:ngc://acme/llama:1.0"],
        resources=["data:2:ngc://acme/data:2"],
        secrets=["HF_TOKEN=hf_x", "NGC_API_KEY=nvapi-x"],
        logs_telemetry_id=telemetries["logsTelemetryId"],
        metrics_telemetry_id=telemetries["metricsTelemetryId"],
        traces_telemetry_id=telemetries["tracesTelemetryId"],
    )
    assert flagged["telemetries"] == telemetries
    second = await cli.decoded("POST", "/v1/nvct/tasks", TASK_RESPONSE, flagged)
    shown = second["task"]
    assert shown["resultHandlingStrategy"] == "UPLOAD"
    assert shown["resultsLocation"] == "acme/team/flagged-model"
    assert shown["telemetries"] == telemetries
    assert shown["gpuSpecification"]["clusters"] == ["sim-slow"]
    assert shown["models"] == [{"name": "llama", "version": "1.0", "uri": "ngc://acme/llama:1.0"}]
    assert "secrets" not in shown
    # task create --input-file examples/create-task-with-results.json --backend B (UPLOAD;
    # --backend and --clusters together are refused, as for deployments)
    both = create_body(CREATE_TASK_WITH_RESULTS, backend="nvcf-default", clusters=["sim-ncp"])
    assert both["gpuSpecification"]["clusters"] == ["sim-ncp"]
    refused_both = await cli.send("POST", "/v1/nvct/tasks", both)
    assert refused_both.status_code == 400, refused_both.text
    assert any(e["field"].startswith("gpuSpecification") for e in refused_both.json()["errors"]), (
        refused_both.text
    )
    upload = create_body(CREATE_TASK_WITH_RESULTS, backend="nvcf-default")
    third = await cli.decoded("POST", "/v1/nvct/tasks", TASK_RESPONSE, upload)
    assert third["task"]["resultsLocation"] == "my-org/my-team/my-finetuned-model"
    ids = [task["id"], shown["id"], third["task"]["id"]]

    # task list [--limit] [--status] [--cursor]
    everything = await cli.decoded("GET", "/v1/nvct/tasks", LIST_TASKS_RESPONSE)
    assert [t["id"] for t in everything["tasks"]] == ids
    page = await cli.decoded("GET", "/v1/nvct/tasks" + query(limit=2), LIST_TASKS_RESPONSE)
    assert [t["id"] for t in page["tasks"]] == ids[:2] and page["cursor"]
    rest = await cli.decoded(
        "GET", "/v1/nvct/tasks" + query(limit=2, cursor=page["cursor"]), LIST_TASKS_RESPONSE
    )
    assert [t["id"] for t in rest["tasks"]] == ids[2:]

    # task bulk --task-ids a --input-file F (the flag's ids, then the file's)
    bulk = await cli.decoded(
        "POST",
        "/v1/nvct/tasks/bulk",
        LIST_BASIC_TASK_DETAILS_RESPONSE,
        bulk_body({"taskIds": ids[1:]}, [ids[0]]),
    )
    assert bulk["ncaId"] == ACCOUNT
    assert [t["id"] for t in bulk["tasks"]] == ids
    # task bulk --input-file examples/bulk-tasks.json: ids of no task, a 404 (validateAccount)
    refused = await cli.send("POST", "/v1/nvct/tasks/bulk", bulk_body(BULK_TASKS))
    assert refused.status_code == 404
    assert all(i in refused.json()["detail"] for i in BULK_TASKS["taskIds"])

    # task get [taskId] [--include-secrets]
    got = await cli.decoded("GET", task_path(ids[1]), TASK_RESPONSE)
    assert "secrets" not in got["task"]
    named = await cli.decoded("GET", task_path(ids[1]) + "?includeSecrets=true", TASK_RESPONSE)
    assert named["task"]["secrets"] == ["HF_TOKEN", "NGC_API_KEY"]

    # the first task runs to its end on the simulated cluster
    async def completed() -> bool:
        body = (await cli.send("GET", task_path(ids[0]))).json()
        return bool(body["task"]["status"] == "COMPLETED")

    await eventually(completed)
    # task status filter
    done = await cli.decoded(
        "GET", "/v1/nvct/tasks" + query(status="COMPLETED"), LIST_TASKS_RESPONSE
    )
    assert ids[0] in [t["id"] for t in done["tasks"]]

    # task events [--limit] [--cursor]
    events = await cli.decoded("GET", task_path(ids[0], "/events"), LIST_TASK_EVENTS_RESPONSE)
    assert len(events["events"]) >= 3
    one = await cli.decoded(
        "GET", task_path(ids[0], "/events") + query(limit=1), LIST_TASK_EVENTS_RESPONSE
    )
    assert len(one["events"]) == 1 and one["cursor"]
    after = await cli.decoded(
        "GET",
        task_path(ids[0], "/events") + query(limit=1, cursor=one["cursor"]),
        LIST_TASK_EVENTS_RESPONSE,
    )
    assert after["events"][0]["eventId"] == events["events"][1]["eventId"]

    # task results [--limit] [--cursor]
    results = await cli.decoded(
        "GET", task_path(ids[0], "/results") + query(limit=10), LIST_TASK_RESULTS_RESPONSE
    )
    assert results["results"] == []

    # task update-secrets [taskId] --input-file examples/update-task-secrets.json --secrets X=y
    updated = await cli.send(
        "PUT",
        f"/v1/nvct/secrets/tasks/{ids[1]}",
        secrets_body(UPDATE_TASK_SECRETS, ["EXTRA=e"]),
    )
    assert updated.status_code in (200, 204), updated.text
    named = await cli.decoded("GET", task_path(ids[1]) + "?includeSecrets=true", TASK_RESPONSE)
    assert sorted(named["task"]["secrets"]) == ["EXTRA", "HF_TOKEN", "NGC_API_KEY"]

    # GetTaskGpuUsage (the client's; no command of cmd/task.go calls it)
    await cli.decoded("GET", f"/v1/nvct/accounts/{ACCOUNT}/usage/gpus", LIST_GPU_USAGE_RESPONSE)

    # task cancel [taskId]: POST without a body
    canceled = await cli.decoded("POST", task_path(ids[1], "/cancel"), TASK_RESPONSE)
    assert canceled["task"]["id"] == ids[1]

    # task delete [taskId]: 200 or 204, then the task is gone
    for task_id in ids:
        deleted = await cli.send("DELETE", task_path(task_id))
        assert deleted.status_code in (200, 204), deleted.text
    assert (await cli.send("GET", task_path(ids[0]))).status_code == 404


async def test_nvcf_cli_errors_are_problems_the_cli_prints(client: AppClient) -> None:
    cli = await cli_of(client)
    # no image nor chart, a bad duration: every violation in one answer
    body = create_body(name="bad", gpu="H100", instance_type="NCP.GPU.H100_1x", max_runtime="4h")
    refused = await cli.send("POST", "/v1/nvct/tasks", body)
    assert refused.status_code == 400
    fields = {e["field"] for e in refused.json()["errors"]}
    assert {"maxRuntimeDuration"} <= fields and len(fields) >= 2
    # another account's task is a 404 on every route
    other = Cli(client, await new_key(client, list(TASK_SCOPES), account="team-b"))
    mine = await cli.decoded(
        "POST",
        "/v1/nvct/tasks",
        TASK_RESPONSE,
        create_body(CREATE_TASK, name="mine"),
    )
    task_id = mine["task"]["id"]
    for method, path, payload in (
        ("GET", task_path(task_id), None),
        ("POST", task_path(task_id, "/cancel"), None),
        ("GET", task_path(task_id, "/events"), None),
        ("GET", task_path(task_id, "/results"), None),
        ("PUT", f"/v1/nvct/secrets/tasks/{task_id}", {"secrets": [{"name": "A", "value": "b"}]}),
        ("DELETE", task_path(task_id), None),
    ):
        assert (await other.send(method, path, payload)).status_code == 404, (method, path)


@pytest.mark.registry
async def test_nvcf_cli_creates_a_helm_task_from_its_example_and_helm_chart_flag(
    client_factory: Any,
    tmp_path: Path,
    anon_registry: RegistryServer,
    push_corpus: PushCorpus,
) -> None:
    client = await start(client_factory, tmp_path, anon_registry, reconciler_enabled=False)
    cli = await cli_of(client)
    chart = push_corpus(anon_registry, "sim-workload", "tasks/cli-helm", files=TASK_CHART)
    # task create --input-file examples/create-task-helm.json --helm-chart URL
    body = create_body(CREATE_TASK_HELM, helm_chart=chart.file_url)
    assert body["helmChart"] == chart.file_url
    created = await cli.decoded("POST", "/v1/nvct/tasks", TASK_RESPONSE, body)
    task = created["task"]
    assert task["helmChart"] == chart.file_url and "containerImage" not in task
    spec = task["gpuSpecification"]
    assert spec["helmValidationPolicy"] == {"name": "Default"}
    assert spec["configuration"] == CREATE_TASK_HELM["gpuSpecification"]["configuration"]
