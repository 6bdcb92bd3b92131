"""The task routes over HTTP at NVCT's paths, in NVCT's shapes and scopes: create, list with
NVCT's pagination, bulk, get (secret names only when asked), cancel, delete, events, results,
secrets and GPU usage; every bad input a 400 naming each violation; another account's task a
404 on every route.

The tests on `client` share one app per database, each in an account of its own (`admin` is
the operator's client of the same app)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from service.auth import scopes
from tests.support.api import assert_problem, bearer, new_key
from tests.support.app import AppClient, ClientFactory
from tests.support.nvcf_cli import add_request
from tests.support.telemetries import create_telemetry

pytestmark = pytest.mark.asyncio(loop_scope="module")
# the tests that build their own app run in their own loop
own_app = pytest.mark.asyncio(loop_scope="function")

T = "/v1/nvct/tasks"
CREDENTIALS = "/v2/nvcf/registry-credentials"
TASK = {
    "name": "train-1",
    "gpuSpecification": {"gpu": "H100", "instanceType": "NCP.GPU.H100_1x"},
    "containerImage": "nvcr.io/acme/trainer:1.0",
    "containerArgs": "--epochs 1",
    "containerEnvironment": [{"key": "MODEL", "value": "llama"}],
    "tags": ["demo", "train"],
    "description": "a test task",
    "maxRuntimeDuration": "PT4H",
    "maxQueuedDuration": "PT30M",
    "resultHandlingStrategy": "NONE",
    "secrets": [{"name": "HF_TOKEN", "value": "hf-secret-value"}],
}


@pytest.fixture(scope="module")
def module_settings() -> dict[str, Any]:
    # no task loop: a task stays as its routes leave it, however long the module runs
    return {"reconciler_enabled": False}


@pytest.fixture
def client(tenant_client: AppClient) -> AppClient:
    return tenant_client


@pytest.fixture
def admin(module_client: AppClient) -> AppClient:
    return module_client


async def create(client: httpx.AsyncClient, **changes: Any) -> dict[str, Any]:
    resp = await client.post(T, json={**TASK, **changes})
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["task"])


async def create_body(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    resp = await client.post(T, json=body)
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["task"])


async def test_create_then_read_in_nvct_shapes(client: AppClient) -> None:
    task = await create(client)
    assert task["status"] == "QUEUED"
    assert task["name"] == "train-1" and task["ncaId"]
    assert task["maxRuntimeDuration"] == "PT4H"
    assert task["maxQueuedDuration"] == "PT30M"
    assert task["terminationGracePeriodDuration"] == "PT1H"  # NVCT's default
    assert task["resultHandlingStrategy"] == "NONE"
    assert task["gpuSpecification"] == {"gpu": "H100", "instanceType": "NCP.GPU.H100_1x"}
    assert task["containerEnvironment"] == [{"key": "MODEL", "value": "llama"}]
    assert "secrets" not in task and "hf-secret-value" not in str(task)
    uuid.UUID(task["id"])

    got = await client.get(f"{T}/{task['id']}")
    assert got.status_code == 200
    assert "secrets" not in got.json()["task"]
    asked = (await client.get(f"{T}/{task['id']}?includeSecrets=true")).json()["task"]
    assert asked["secrets"] == ["HF_TOKEN"]
    assert "hf-secret-value" not in str(asked)

    events = (await client.get(f"{T}/{task['id']}/events")).json()
    assert events["events"][0]["message"] == "Task created and queued"
    assert set(events["events"][0]) == {"eventId", "taskId", "ncaId", "message", "createdAt"}
    assert "cursor" not in events and "limit" not in events
    assert (await client.get(f"{T}/{task['id']}/results")).json() == {"results": []}


async def test_list_pages_with_nvct_cursor_and_filters_by_status(client: AppClient) -> None:
    made = [await create(client, name=f"t-{i}") for i in range(3)]
    first = (await client.get(T, params={"limit": 2})).json()
    assert [t["id"] for t in first["tasks"]] == [m["id"] for m in made[:2]]
    assert first["limit"] == 2 and first["cursor"]
    rest = (await client.get(T, params={"limit": 2, "cursor": first["cursor"]})).json()
    assert [t["id"] for t in rest["tasks"]] == [made[2]["id"]]
    assert "cursor" not in rest and "limit" not in rest
    await client.post(f"{T}/{made[0]['id']}/cancel")
    canceled = (await client.get(T, params={"status": "CANCELED"})).json()["tasks"]
    assert [t["id"] for t in canceled] == [made[0]["id"]]
    bad = await client.get(T, params={"status": "SLEEPING"})
    assert "SLEEPING" in str(assert_problem(bad, 400)["detail"])

    bulk = await client.post(f"{T}/bulk", json={"taskIds": [made[2]["id"], made[1]["id"]]})
    assert bulk.status_code == 200, bulk.text
    assert bulk.json()["tasks"] == [
        {"id": made[2]["id"], "name": "t-2", "status": "QUEUED"},
        {"id": made[1]["id"], "name": "t-1", "status": "QUEUED"},
    ]
    assert bulk.json()["ncaId"]
    unknown = str(uuid.uuid4())
    missing = await client.post(f"{T}/bulk", json={"taskIds": [made[1]["id"], unknown]})
    assert unknown in str(assert_problem(missing, 404)["detail"])
    empty = await client.post(f"{T}/bulk", json={"taskIds": []})
    assert_problem(empty, 400)


async def test_lists_give_nvcts_ten_per_page_when_paging_without_a_limit(
    client: AppClient,
) -> None:
    made = [await create(client, name=f"t-{i}") for i in range(11)]
    first = (await client.get(T)).json()
    assert first["limit"] == 10 and len(first["tasks"]) == 10
    rest = (await client.get(T, params={"cursor": first["cursor"]})).json()
    assert [t["id"] for t in rest["tasks"]] == [made[10]["id"]]


async def test_a_create_naming_no_strategy_gets_none_without_a_results_registry(
    client: AppClient,
) -> None:
    body = {k: v for k, v in TASK.items() if k != "resultHandlingStrategy"}
    task = await create_body(client, body)
    assert task["resultHandlingStrategy"] == "NONE"
    assert (await client.get(f"{T}/{task['id']}")).json()["task"]["resultHandlingStrategy"] == (
        "NONE"
    )
    # a resultsLocation still means UPLOAD, refused as such
    located = {**body, "resultsLocation": "acme/team/model"}
    problem = assert_problem(await client.post(T, json=located), 400)
    assert "NVCF_TASK_RESULTS_REGISTRY" in str(problem["errors"])


async def test_every_violation_is_named_in_one_400_and_nothing_is_created(
    client: AppClient,
) -> None:
    body = {
        "name": "-bad name",
        "gpuSpecification": {"gpu": "NOPE", "instanceType": "NCP.GPU.NOPE_1x"},
        "containerImage": "nvcr.io/acme/trainer:1.0",
        "helmChart": "oci://reg.example.com/charts/t-1.0.0.tgz",
        "tags": ["ok", "not ok!"],
        "maxRuntimeDuration": "four hours",
        "maxQueuedDuration": "P1Y",
        "terminationGracePeriodDuration": "PT0S",
        "resultHandlingStrategy": "UPLOAD",
    }
    problem = assert_problem(await client.post(T, json=body), 400)
    fields = {e["field"] for e in problem["errors"]}
    assert {
        "name",
        "tags[1]",
        "maxRuntimeDuration",
        "maxQueuedDuration",
        "terminationGracePeriodDuration",
        "resultsLocation",
        "helmChart",
    } <= fields, fields
    # this server has no results registry: that is said, not which credentials would push
    assert "secrets" not in fields
    assert "NVCF_TASK_RESULTS_REGISTRY" in str(problem["errors"])
    assert any(f.startswith("gpuSpecification") for f in fields), fields
    assert (await client.get(T)).json()["tasks"] == []


async def test_telemetries_must_be_the_accounts_and_of_their_type_each_named_in_one_400(
    client: AppClient, admin: AppClient
) -> None:
    every = await create_telemetry(client)  # logs, metrics and traces
    metrics = await create_telemetry(
        client,
        provider="PROMETHEUS",
        types=["METRICS"],
        endpoint="https://8.8.8.8/api/v1/write",
        secret={"name": "prom", "value": "k"},
    )
    someone_else = f"someone-else-{uuid.uuid4().hex[:12]}"
    other = bearer(await new_key(admin, [scopes.MANAGE_TELEMETRIES], account=someone_else))
    theirs = await create_telemetry(client, headers=other)
    unknown = str(uuid.uuid4())
    wrong = {
        "logsTelemetryId": metrics["telemetryId"],
        "metricsTelemetryId": theirs["telemetryId"],
        "tracesTelemetryId": unknown,
    }
    problem = assert_problem(await client.post(T, json={**TASK, "telemetries": wrong}), 400)
    errors = {e["field"]: e["message"] for e in problem["errors"]}
    assert errors == {
        "telemetries.logsTelemetryId": f"telemetry '{metrics['name']}' "
        f"({metrics['telemetryId']}) receives METRICS, not LOGS",
        "telemetries.metricsTelemetryId": f"telemetry {theirs['telemetryId']} is not one of "
        "the account's",
        "telemetries.tracesTelemetryId": f"telemetry {unknown} is not one of the account's",
    }
    assert (await client.get(T)).json()["tasks"] == []

    right = {"logsTelemetryId": every["telemetryId"], "metricsTelemetryId": metrics["telemetryId"]}
    assert (await create(client, telemetries=right))["telemetries"] == right


async def test_a_telemetry_named_by_a_task_not_ended_is_not_deleted(client: AppClient) -> None:
    telemetry = await create_telemetry(client)
    tid = telemetry["telemetryId"]
    task = await create(client, telemetries={"logsTelemetryId": tid})
    problem = assert_problem(await client.delete(f"/v2/nvcf/telemetries/{tid}"), 400)
    assert task["id"] in str(problem["detail"])
    assert (await client.get(f"/v2/nvcf/telemetries/{tid}")).status_code == 200
    canceled = await client.post(f"{T}/{task['id']}/cancel")
    assert canceled.status_code == 200, canceled.text
    assert (await client.delete(f"/v2/nvcf/telemetries/{tid}")).status_code == 204


async def test_neither_image_nor_chart_and_unknown_instance_type_are_400(
    client: AppClient,
) -> None:
    body = {k: v for k, v in TASK.items() if k != "containerImage"}
    body["gpuSpecification"] = {"gpu": "H100", "instanceType": "NCP.GPU.H100_3x"}
    problem = assert_problem(await client.post(T, json=body), 400)
    fields = {e["field"] for e in problem["errors"]}
    assert "containerImage" in fields
    assert "gpuSpecification.instanceType" in fields, problem
    ngc = [{"name": "NGC_API_KEY", "value": "nvapi-x"}]
    upload = {
        **TASK,
        "resultHandlingStrategy": "UPLOAD",
        "resultsLocation": "Acme/!",
        "secrets": ngc,
    }
    problem = assert_problem(await client.post(T, json=upload), 400)
    assert {e["field"] for e in problem["errors"]} == {"resultsLocation"}


async def test_upload_on_a_server_without_a_results_registry_is_400_saying_so(
    client: AppClient,
) -> None:
    ngc = [{"name": "NGC_API_KEY", "value": "nvapi-x"}]
    upload = {**TASK, "resultHandlingStrategy": "UPLOAD", "secrets": ngc}
    problem = assert_problem(
        await client.post(T, json={**upload, "resultsLocation": "acme/team/model"}), 400
    )
    errors = problem["errors"]
    assert isinstance(errors, list) and len(errors) == 1
    assert errors[0]["field"] == "resultsLocation"
    assert "NVCF_TASK_RESULTS_REGISTRY" in errors[0]["message"]
    assert "resultHandlingStrategy NONE" in errors[0]["message"]
    assert (await client.get(T)).json()["tasks"] == []


RESULTS_HOST = "results.example.com:5000"


@own_app
async def test_upload_lists_every_results_location_violation_and_needs_a_push_credential(
    client_factory: ClientFactory,
) -> None:
    client = await client_factory(
        reconciler_enabled=False, task_results_registry=f"{RESULTS_HOST}/nvct"
    )
    upload = {**TASK, "resultHandlingStrategy": "UPLOAD"}
    # a model name longer than 64 characters and a repository longer than 255 on the registry
    long = {**upload, "resultsLocation": f"{'o' * 150}/{'t' * 60}/{'m' * 65}"}
    problem = assert_problem(await client.post(T, json=long), 400)
    messages = [e["message"] for e in problem["errors"] if e["field"] == "resultsLocation"]
    assert any("at most 64 characters" in m for m in messages), messages
    assert any("at most 255 characters" in m for m in messages), messages
    # no NGC_API_KEY secret and only credentials that cannot push results there
    for host, types in ((RESULTS_HOST, ["CONTAINER", "HELM"]), ("other.example.com", ["MODEL"])):
        request = add_request(host, "robot", "pw", types, name=f"c-{len(types)}")
        assert (await client.post(CREDENTIALS, json=request)).status_code == 200
    located = {**upload, "resultsLocation": "acme/team/model"}
    problem = assert_problem(await client.post(T, json=located), 400)
    assert [e["field"] for e in problem["errors"]] == ["secrets"]
    assert RESULTS_HOST in str(problem["errors"])
    # NVCT reads the secret's name in any case
    lower = [{"name": "ngc_api_key", "value": "nvapi-x"}]
    assert (await client.post(T, json={**located, "secrets": lower})).status_code == 200
    # or the account's MODEL credential for the results registry
    request = add_request(RESULTS_HOST, "pusher", "pw", ["MODEL"], name="results")
    assert (await client.post(CREDENTIALS, json=request)).status_code == 200
    assert (await client.post(T, json=located)).status_code == 200


async def test_another_accounts_task_is_404_on_every_route(
    client: AppClient, admin: AppClient
) -> None:
    task = await create(client)
    someone_else = f"someone-else-{uuid.uuid4().hex[:12]}"
    other = bearer(await new_key(admin, list(scopes.TASK_SCOPES), account=someone_else))
    tid = task["id"]
    for method, path, body in [
        ("GET", f"{T}/{tid}", None),
        ("POST", f"{T}/{tid}/cancel", None),
        ("DELETE", f"{T}/{tid}", None),
        ("GET", f"{T}/{tid}/events", None),
        ("GET", f"{T}/{tid}/results", None),
        ("GET", f"{T}/{tid}/logs", None),
        ("PUT", f"/v1/nvct/secrets/tasks/{tid}", {"secrets": [{"name": "A", "value": "b"}]}),
    ]:
        resp = await client.request(method, path, json=body, headers=other)
        assert_problem(resp, 404)
    bulk = await client.post(f"{T}/bulk", json={"taskIds": [tid]}, headers=other)
    assert tid in str(assert_problem(bulk, 404)["detail"])
    assert (await client.get(T, headers=other)).json()["tasks"] == []
    assert (await client.get(f"{T}/{tid}")).json()["task"]["status"] == "QUEUED"


async def test_each_route_needs_its_nvct_scope(
    client: AppClient, admin: AppClient, tenant: str
) -> None:
    task = await create(client)
    reader = bearer(await new_key(admin, [scopes.LIST_TASKS], account=tenant))
    assert (await client.get(T, headers=reader)).status_code == 200
    for method, path in [
        ("POST", T),
        ("GET", f"{T}/{task['id']}"),
        ("POST", f"{T}/{task['id']}/cancel"),
        ("DELETE", f"{T}/{task['id']}"),
        ("GET", f"{T}/{task['id']}/events"),
        ("GET", f"{T}/{task['id']}/results"),
        ("GET", f"{T}/{task['id']}/logs"),
    ]:
        resp = await client.request(
            method, path, json=TASK if method == "POST" else None, headers=reader
        )
        assert "scope" in str(assert_problem(resp, 403)["detail"])


async def test_nvcf_cli_task_key_from_v1_keys_launches_tasks(client: AppClient) -> None:
    expires = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    body = {
        "description": "nvcf-cli task key",
        "expires_at": expires,
        "authorizations": {
            "policies": [
                {
                    "product": "nv-cloud-functions",
                    "resources": [{"id": "*", "type": "account-functions"}],
                    "scopes": list(scopes.TASK_SCOPES),
                }
            ]
        },
    }
    resp = await client.post("/v1/keys", json=body)
    assert resp.status_code == 200, resp.text
    key = bearer(resp.json()["value"])
    task = (await client.post(T, json=TASK, headers=key)).json()["task"]
    assert (await client.get(f"{T}/{task['id']}/events", headers=key)).status_code == 200


async def test_cancel_a_queued_task_and_delete(client: AppClient) -> None:
    task = await create(client)
    resp = await client.post(f"{T}/{task['id']}/cancel")
    assert resp.status_code == 200
    assert resp.json()["task"]["status"] == "CANCELED"
    again = await client.post(f"{T}/{task['id']}/cancel")
    assert (
        assert_problem(again, 400)["detail"]
        == "Invalid request: Cannot cancel a Task with 'CANCELED' terminal status"
    )
    deleted = await client.delete(f"{T}/{task['id']}")
    assert deleted.status_code == 204 and deleted.content == b""
    assert_problem(await client.get(f"{T}/{task['id']}"), 404)
    assert_problem(await client.get(f"{T}/not-a-uuid"), 400)


async def test_secrets_update_merges_names_and_never_shows_values(client: AppClient) -> None:
    task = await create(client)
    path = f"/v1/nvct/secrets/tasks/{task['id']}"
    resp = await client.put(
        path, json={"secrets": [{"name": "NGC_API_KEY", "value": "nvapi-very-secret"}]}
    )
    assert resp.status_code == 204, resp.text
    shown = (await client.get(f"{T}/{task['id']}?includeSecrets=true")).json()["task"]
    assert shown["secrets"] == ["HF_TOKEN", "NGC_API_KEY"]
    assert "nvapi-very-secret" not in str(shown)
    events = (await client.get(f"{T}/{task['id']}/events")).json()["events"]
    assert "nvapi-very-secret" not in str(events)
    bad = await client.put(path, json={"secrets": [{"name": "-x", "value": ""}]})
    fields = {e["field"] for e in assert_problem(bad, 400)["errors"]}
    assert fields == {"secrets[0].name", "secrets[0].value"}


@own_app
async def test_task_quotas_refuse_with_the_quota_problem(client_factory: Any) -> None:
    client = await client_factory(quota_tasks=2, quota_active_tasks=1, reconciler_enabled=False)
    first = await create(client)
    refused = await client.post(T, json=TASK)
    problem = assert_problem(refused, 400)
    assert "tasks running at once allowed: 1" in str(problem["detail"])
    assert "NVCF_QUOTA_ACTIVE_TASKS" in str(problem["errors"])
    await client.post(f"{T}/{first['id']}/cancel")
    await create(client)
    refused = await client.post(T, json=TASK)
    problem = assert_problem(refused, 400)
    assert "number of tasks allowed: 2" in str(problem["detail"])
    assert "NVCF_QUOTA_TASKS" in str(problem["errors"])


async def test_gpu_usage_of_the_callers_account(client: AppClient) -> None:
    task = await create(client)
    usage = await client.get(f"/v1/nvct/accounts/{task['ncaId']}/usage/gpus")
    assert usage.status_code == 200, usage.text
    [gpu] = usage.json()["gpus"]
    assert gpu["gpu"] == "H100" and gpu["instanceType"] == "NCP.GPU.H100_1x"
    assert gpu["currentMaxUsage"] == 1 and gpu["placements"]
    assert_problem(await client.get("/v1/nvct/accounts/someone-else/usage/gpus"), 404)


async def test_the_namespace_collector_knows_every_task(client: AppClient) -> None:
    task = await create(client)
    collector = client.app.state.namespace_collector
    known: set[str] = set()
    for more in collector.also_known:
        known |= await more()
    assert task["id"] in known  # its namespace sr-<taskId> is never collected as an orphan


async def test_bad_query_parameters_are_400(client: AppClient) -> None:
    task = await create(client)
    assert_problem(await client.get(f"{T}/{task['id']}?includeSecrets=maybe"), 400)
    assert_problem(await client.get(T, params={"limit": 0}), 400)
    assert_problem(await client.get(T, params={"cursor": "garbage"}), 400)
    assert_problem(await client.get(f"{T}/{task['id']}/events", params={"limit": "x"}), 400)


async def test_a_container_task_on_a_multi_node_instance_type_is_400(client: AppClient) -> None:
    multi = {"gpu": "B200", "instanceType": "ON-PREM.GPU.B200_8x.x2"}
    problem = assert_problem(await client.post(T, json={**TASK, "gpuSpecification": multi}), 400)
    [error] = problem["errors"]
    assert error["field"] == "gpuSpecification.instanceType"
    assert "helm" in error["message"] and "one node" in error["message"]


async def test_the_api_document_says_models_and_resources_are_not_downloaded(
    client: AppClient,
) -> None:
    doc = (await client.get("/openapi.json")).json()
    body = doc["paths"]["/v1/nvct/tasks"]["post"]["requestBody"]["content"]["application/json"]
    props = body["schema"]["properties"]
    for name, path in (("models", "/config/models"), ("resources", "/config/resources")):
        text = props[name]["description"]
        assert "not downloaded" in text and f"`{path}` is an empty directory" in text


async def test_the_api_document_has_nvcts_helm_policy_and_icms_request_id(
    client: AppClient,
) -> None:
    schemas = (await client.get("/openapi.json")).json()["components"]["schemas"]
    assert "helmValidationPolicy" in schemas["TaskGpuSpecificationOut"]["properties"]
    assert "icmsRequestId" in schemas["TaskInstanceOut"]["properties"]
