"""Deployments over HTTP (api.md §3), on SQLite and PostgreSQL.

These tests check the recorded desired state and the API's own status rules; they never wait
for instances to run. The reconciler (when the app runs one) is stopped so that the instance
rows some tests insert stay exactly as written. The tests on `api` share one app per database:
each reads what it made itself, and a test that lists reads an account of its own.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from sqlalchemy import select

from service.core.db import utcnow
from service.deployments.models import Deployment, DeploymentSpec, Instance
from service.functions.models import FunctionVersion
from tests.support.api import CONTAINER_FN, bearer, create_fn, new_key
from tests.support.app import AppClient, ClientFactory, without_reconciler
from tests.support.catalogs import PERMISSIVE, write_catalog
from tests.support.charts import PushCorpus
from tests.support.registry import RegistryServer

pytestmark = pytest.mark.asyncio(loop_scope="module")
# the tests that build their own app run in their own loop
own_app = pytest.mark.asyncio(loop_scope="function")

V = "/v2/nvcf"
L40 = {"gpu": "L40", "backend": "nvcf-default", "minInstances": 1, "maxInstances": 2}


@pytest.fixture(scope="module")
def module_settings() -> dict[str, Any]:
    return {"reconcile_interval": 3600}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def api(module_client: AppClient) -> AppClient:
    """The module's app without its reconciler: the instance rows a test writes stay as
    written."""
    return await without_reconciler(module_client)


def own_account() -> str:
    return f"acct-{uuid.uuid4().hex[:12]}"


def dep_url(fn: dict[str, Any]) -> str:
    return f"{V}/deployments/functions/{fn['id']}/versions/{fn['versionId']}"


async def deploy(
    client: httpx.AsyncClient,
    fn: dict[str, Any],
    *specs: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> Any:
    body = {"deploymentSpecifications": list(specs or [L40])}
    resp = await client.post(dep_url(fn), json=body, headers=headers)
    assert resp.status_code == 200, resp.text
    return resp.json()["deployment"]


async def version_status(client: httpx.AsyncClient, fn: dict[str, Any]) -> str:
    resp = await client.get(f"{V}/functions/{fn['id']}/versions/{fn['versionId']}")
    assert resp.status_code == 200, resp.text
    return str(resp.json()["function"]["status"])


async def stored(client: AppClient, version_id: str) -> list[Deployment]:
    async with client.app.state.sessionmaker() as session:
        stmt = select(Deployment).where(Deployment.version_id == uuid.UUID(version_id))
        return list((await session.execute(stmt)).scalars().all())


async def add_instance(
    client: AppClient, deployment_id: str, spec_id: str, *, phase: str, **kw: Any
) -> uuid.UUID:
    """Write an instance row as the reconciler would (no reconciler runs in these tests)."""
    async with client.app.state.sessionmaker() as session, session.begin():
        iid = uuid.uuid4()
        session.add(
            Instance(
                id=iid,
                deployment_id=uuid.UUID(deployment_id),
                spec_id=uuid.UUID(spec_id),
                account_id="nvcf-default",
                cluster="sim-dgxc",
                phase=phase,
                since=utcnow(),
                **kw,
            )
        )
    return iid


async def set_status(client: AppClient, version_id: str, status: str) -> None:
    async with client.app.state.sessionmaker() as session, session.begin():
        version = await session.get(FunctionVersion, uuid.UUID(version_id))
        assert version is not None
        version.status = status


# --- create --------------------------------------------------------------------------------


async def test_deploy_container_function(api: AppClient) -> None:
    fn = await create_fn(api)
    dep = await deploy(
        api, fn, {"gpu": "L40", "backend": "nvcf-default", "minInstances": 1, "maxInstances": 2}
    )
    uuid.UUID(dep["deploymentId"])
    assert dep["functionId"] == fn["id"] and dep["functionVersionId"] == fn["versionId"]
    assert dep["functionName"] == "echo" and dep["ncaId"] == "nvcf-default"
    assert dep["functionStatus"] == "DEPLOYING"
    assert dep["createdAt"].endswith("Z") and dep["lastUpdatedAt"].endswith("Z")
    assert dep["instances"] == []
    assert "healthInfo" not in dep
    (spec,) = dep["deploymentSpecifications"]
    uuid.UUID(spec["gpuSpecificationId"])
    assert spec["instanceType"] == "DGXC.GPU.L40_1x"  # the GPU's default type, returned
    assert spec["backend"] == "nvcf-default"
    assert spec["gpu"] == "L40"
    assert (spec["minInstances"], spec["maxInstances"]) == (1, 2)
    assert (spec["maxRequestConcurrency"], spec["preferredOrder"]) == (1, 1)
    assert "configuration" not in spec and "helmValidationPolicy" not in spec
    assert await version_status(api, fn) == "DEPLOYING"

    (row,) = await stored(api, fn["versionId"])
    assert row.desired == "deployed" and row.feature_flags == {}
    (srow,) = row.specs
    assert srow.candidate_clusters == ["sim-dgxc"]
    kinds = [(o["kind"], o["metadata"]["name"]) for o in srow.objects]
    assert kinds == [("Deployment", "inference"), ("Service", "entrypoint")]
    workload, svc = srow.objects
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "nvcr.io/acme/echo:1.0"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {"cpu", "memory"} <= set(container["resources"]["limits"])
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8000}
    assert container["ports"][0]["containerPort"] == 8000
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["ports"][0]["port"] == 8000

    events = (await api.get(f"{V}/deployments/{dep['deploymentId']}/events")).json()["events"]
    assert [e["kind"] for e in events][:2] == ["validation", "dispatch"]
    assert "DGXC.GPU.L40_1x" in events[0]["message"]
    assert all(e["at"].endswith("Z") for e in events)


async def test_container_workload_uses_function_settings(api: AppClient) -> None:
    fn = await create_fn(
        api,
        inferenceUrl="/grpc",
        inferencePort=9001,
        containerArgs="serve --model 'my model'",
        containerEnvironment=[{"key": "MODE", "value": "fast"}],
    )
    await deploy(
        api,
        fn,
        {"gpu": "H100", "instanceType": "NCP.GPU.H100_4x", "minInstances": 1, "maxInstances": 1},
    )
    (row,) = await stored(api, fn["versionId"])
    workload, svc = row.specs[0].objects
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["serve", "--model", "my model"]
    assert {"name": "MODE", "value": "fast"} in container["env"]
    assert container["readinessProbe"]["grpc"] == {"port": 9001}
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert svc["spec"]["ports"][0]["port"] == 9001
    assert row.specs[0].candidate_clusters == ["sim-ncp"]


async def test_all_min_zero_is_active_at_once(api: AppClient) -> None:
    fn = await create_fn(api)
    dep = await deploy(
        api,
        fn,
        {"gpu": "L40S", "minInstances": 0, "maxInstances": 1},
        {"gpu": "H100", "instanceType": "NCP.GPU.H100_1x", "minInstances": 0, "maxInstances": 3},
    )
    assert dep["functionStatus"] == "ACTIVE"
    assert [s["instanceType"] for s in dep["deploymentSpecifications"]] == [
        "DGXC.GPU.L40S_1x",
        "NCP.GPU.H100_1x",
    ]
    assert await version_status(api, fn) == "ACTIVE"


async def test_every_violation_of_every_spec_is_reported_and_nothing_stored(
    api: AppClient,
) -> None:
    fn = await create_fn(api)
    body = {
        "deploymentSpecifications": [
            {
                "instanceType": "DGXC.GPU.L40S_1x",
                "maxInstances": 0,
                "maxRequestConcurrency": 20000,
                "preferredOrder": 0,
                "regions": "us-east-1",
            },
            {
                "gpu": "L40S",
                "backend": "nvcf-default",
                "clusters": ["sim-dgxc"],
                "minInstances": 3,
                "maxInstances": 2,
                "attributes": [1],
            },
            {"gpu": "L40S", "minInstances": -1, "maxInstances": "two", "preferredOrder": 100},
            {"gpu": "L40S", "minInstances": 1.5, "maxInstances": True},
        ],
        "someUnknownField": 1,
    }
    resp = await api.post(dep_url(fn), json=body)
    assert resp.status_code == 400, resp.text
    problem = resp.json()
    assert problem["type"] == "urn:nvcf:problem-details:bad-request"
    fields = {e["field"] for e in problem["errors"]}
    s = "deploymentSpecifications"
    expected = {
        f"{s}[0].gpu",
        f"{s}[0].minInstances",
        f"{s}[0].maxInstances",
        f"{s}[0].maxRequestConcurrency",
        f"{s}[0].preferredOrder",
        f"{s}[0].regions",
        f"{s}[1].maxInstances",
        f"{s}[1].backend",
        f"{s}[1].attributes",
        f"{s}[2].minInstances",
        f"{s}[2].maxInstances",
        f"{s}[2].preferredOrder",
        f"{s}[3].minInstances",
        f"{s}[3].maxInstances",
    }
    assert expected <= fields, fields - expected
    messages = {e["field"]: e["message"] for e in problem["errors"]}
    assert "required" in messages[f"{s}[0].gpu"]
    assert "≥ minInstances (3)" in messages[f"{s}[1].maxInstances"]
    assert "1 to 16384" in messages[f"{s}[0].maxRequestConcurrency"]
    assert "cannot be used together" in messages[f"{s}[1].backend"]
    assert await stored(api, fn["versionId"]) == []
    assert await version_status(api, fn) == "INACTIVE"


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"deploymentSpecifications": []},
        {"deploymentSpecifications": {"gpu": "L40"}},
        {"deploymentSpecifications": ["L40"]},
    ],
)
async def test_missing_or_empty_specifications(api: AppClient, body: dict[str, Any]) -> None:
    fn = await create_fn(api)
    resp = await api.post(dep_url(fn), json=body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["errors"][0]["field"].startswith("deploymentSpecifications")


async def test_helm_only_fields_on_a_container_function(api: AppClient) -> None:
    fn = await create_fn(api)
    resp = await api.post(
        dep_url(fn),
        json={
            "deploymentSpecifications": [
                {**L40, "configuration": {}},
                {**L40, "helmValidationPolicy": {"name": "Unrestricted"}},
            ]
        },
    )
    assert resp.status_code == 400
    errors = {e["field"]: e["message"] for e in resp.json()["errors"]}
    assert "helm functions" in errors["deploymentSpecifications[0].configuration"]
    assert "helm functions" in errors["deploymentSpecifications[1].helmValidationPolicy"]
    assert await stored(api, fn["versionId"]) == []


async def test_multi_node_type_is_refused_for_container_functions(api: AppClient) -> None:
    fn = await create_fn(api)
    resp = await api.post(
        dep_url(fn),
        json={
            "deploymentSpecifications": [
                {
                    "gpu": "B200",
                    "instanceType": "ON-PREM.GPU.B200_8x.x2",
                    "minInstances": 1,
                    "maxInstances": 1,
                }
            ]
        },
    )
    assert resp.status_code == 400
    (error,) = resp.json()["errors"]
    assert error["field"] == "deploymentSpecifications[0].instanceType"
    assert "multi-node" in error["message"] and "helm functions" in error["message"]


@pytest.mark.parametrize(
    ("instance_type", "fragment"),
    [
        ("L40S_1x", "'.GPU.' must follow the CSP"),
        ("DGXC.GPU.L40S", "lacks the '_<N>x' GPU count suffix"),
        ("DGXC.GPU.L40S_0x", "not a positive integer"),
        ("FOO.GPU.L40S_1x", "unknown CSP 'FOO'"),
        ("DGXC.GPU.L40S_1x.x1", "at least 2"),
        ("DGXC.GPU.L40S_1x.2", "'x<NODES>'"),
    ],
)
async def test_malformed_instance_types_have_precise_messages(
    api: AppClient, instance_type: str, fragment: str
) -> None:
    fn = await create_fn(api)
    spec = {"gpu": "L40S", "instanceType": instance_type, "minInstances": 1, "maxInstances": 1}
    resp = await api.post(dep_url(fn), json={"deploymentSpecifications": [spec]})
    assert resp.status_code == 400
    (error,) = resp.json()["errors"]
    assert error["field"] == "deploymentSpecifications[0].instanceType"
    assert repr(instance_type) in error["message"]
    assert fragment in error["message"]
    assert "expected <CSP>.GPU.<GPU_NAME>_<N>x[.x<NODES>]" in error["message"]


async def test_type_not_offered_lists_what_is_offered(api: AppClient) -> None:
    fn = await create_fn(api)
    spec = {"gpu": "H100", "instanceType": "AWS.GPU.H100_8x", "minInstances": 1, "maxInstances": 1}
    resp = await api.post(dep_url(fn), json={"deploymentSpecifications": [spec]})
    assert resp.status_code == 400
    (error,) = resp.json()["errors"]
    assert "not offered" in error["message"]
    assert "NCP.GPU.H100_1x" in error["message"] and "NCP.GPU.H100_8x" in error["message"]
    assert "NCP.GPU.H100_8x.x2" not in error["message"]  # multi-node: helm only

    unknown_gpu = {"gpu": "T4", "minInstances": 1, "maxInstances": 1}
    resp = await api.post(dep_url(fn), json={"deploymentSpecifications": [unknown_gpu]})
    assert resp.status_code == 400
    assert "offered GPUs" in resp.json()["errors"][0]["message"]


async def test_deploy_requires_an_inactive_version(api: AppClient) -> None:
    fn = await create_fn(api)
    await deploy(api, fn)
    resp = await api.post(dep_url(fn), json={"deploymentSpecifications": [L40]})
    assert resp.status_code == 400
    detail = resp.json()["detail"]
    assert "DEPLOYING" in detail and "delete" in detail

    other = await create_fn(api)
    await set_status(api, other["versionId"], "ERROR")
    resp = await api.post(dep_url(other), json={"deploymentSpecifications": [L40]})
    assert resp.status_code == 400
    assert "ERROR" in resp.json()["detail"]


async def test_concurrent_deploys_create_exactly_one(api: AppClient) -> None:
    fn = await create_fn(api)
    body = {"deploymentSpecifications": [L40]}
    responses = await asyncio.gather(*(api.post(dep_url(fn), json=body) for _ in range(10)))
    codes = sorted(r.status_code for r in responses)
    assert codes.count(200) == 1, [r.text for r in responses]
    assert set(codes) <= {200, 400, 409}
    assert len(await stored(api, fn["versionId"])) == 1


async def test_unknown_version_and_bad_ids(api: AppClient) -> None:
    fn = await create_fn(api)
    body = {"deploymentSpecifications": [L40]}
    missing = f"{V}/deployments/functions/{fn['id']}/versions/{uuid.uuid4()}"
    assert (await api.post(missing, json=body)).status_code == 404
    bad = f"{V}/deployments/functions/{fn['id']}/versions/not-a-uuid"
    resp = await api.post(bad, json=body)
    assert resp.status_code == 400 and resp.json()["errors"][0]["field"] == "functionVersionId"
    assert (await api.get(f"{V}/deployments/nope")).status_code == 400
    assert (await api.get(f"{V}/deployments/{uuid.uuid4()}")).status_code == 404
    assert (await api.get(dep_url(fn))).status_code == 404  # not deployed


async def test_deploy_scope_is_required(api: AppClient) -> None:
    fn = await create_fn(api)
    key = await new_key(api, ["list_functions", "register_function"])
    resp = await api.post(
        dep_url(fn), json={"deploymentSpecifications": [L40]}, headers=bearer(key)
    )
    assert resp.status_code == 403
    assert "deploy_function" in resp.json()["detail"]


# --- read ----------------------------------------------------------------------------------


async def test_get_by_version_and_by_id_and_isolation(api: AppClient) -> None:
    fn = await create_fn(api)
    dep = await deploy(api, fn)
    by_version = await api.get(dep_url(fn))
    assert by_version.status_code == 200
    by_id = await api.get(f"{V}/deployments/{dep['deploymentId']}")
    assert by_id.status_code == 200
    assert by_version.json() == by_id.json() == {"deployment": dep}
    org = await api.get(f"/v2/orgs/nvcf-default/nvcf/deployments/{dep['deploymentId']}")
    assert org.status_code == 200

    other = bearer(await new_key(api, ["deploy_function", "list_functions"], account=own_account()))
    assert (await api.get(dep_url(fn), headers=other)).status_code == 404
    assert (
        await api.get(f"{V}/deployments/{dep['deploymentId']}", headers=other)
    ).status_code == 404
    events = f"{V}/deployments/{dep['deploymentId']}/events"
    assert (await api.get(events, headers=other)).status_code == 404
    assert (await api.delete(dep_url(fn), headers=other)).status_code == 404
    assert (
        await api.post(dep_url(fn), json={"deploymentSpecifications": [L40]}, headers=other)
    ).status_code == 404
    listed = (await api.get(f"{V}/deployments", headers=other)).json()
    assert listed == {"deployments": []}


async def test_list_and_events(api: AppClient) -> None:
    scopes = ["register_function", "deploy_function", "list_functions"]
    own = bearer(await new_key(api, scopes, account=own_account()))
    fns = []
    for _ in range(3):
        resp = await api.post(f"{V}/functions", json=CONTAINER_FN, headers=own)
        assert resp.status_code == 200, resp.text
        fns.append(resp.json()["function"])
    deps = [await deploy(api, fn, headers=own) for fn in fns]
    listed = (await api.get(f"{V}/deployments", headers=own)).json()["deployments"]
    assert [d["deploymentId"] for d in listed] == [d["deploymentId"] for d in deps]
    page1 = (await api.get(f"{V}/deployments", params={"limit": 2}, headers=own)).json()
    assert len(page1["deployments"]) == 2
    cursor = {"cursor": page1["nextCursor"]}
    page2 = (await api.get(f"{V}/deployments", params=cursor, headers=own)).json()
    assert [d["deploymentId"] for d in page1["deployments"] + page2["deployments"]] == [
        d["deploymentId"] for d in deps
    ]
    assert "nextCursor" not in page2 or page2["deployments"]

    events_url = f"{V}/deployments/{deps[0]['deploymentId']}/events"
    everything = (await api.get(events_url, headers=own)).json()["events"]
    assert len(everything) >= 2
    first = (await api.get(events_url, params={"limit": 1}, headers=own)).json()
    assert first["events"] == everything[:1]
    cursor = {"cursor": first["nextCursor"]}
    rest = (await api.get(events_url, params=cursor, headers=own)).json()
    assert first["events"] + rest["events"] == everything


async def test_instances_and_health_info(api: AppClient) -> None:
    fn = await create_fn(api)
    dep = await deploy(api, fn)
    spec_id = dep["deploymentSpecifications"][0]["gpuSpecificationId"]
    running = await add_instance(api, dep["deploymentId"], spec_id, phase="Running")
    await add_instance(
        api,
        dep["deploymentId"],
        spec_id,
        phase="Failed",
        desired="absent",
        reason="ImagePullIssues",
        message="image nvcr.io/acme/echo:1.0 cannot be pulled",
    )
    got = (await api.get(f"{V}/deployments/{dep['deploymentId']}")).json()["deployment"]
    (inst,) = got["instances"]
    assert inst["instanceId"] == str(running)
    assert inst["gpuSpecificationId"] == spec_id
    assert inst["cluster"] == "sim-dgxc" and inst["phase"] == "Running"
    assert inst["since"].endswith("Z")
    assert got["healthInfo"] == [
        {
            "gpu": "L40",
            "instanceType": "DGXC.GPU.L40_1x",
            "backend": "nvcf-default",
            "error": "ImagePullIssues: image nvcr.io/acme/echo:1.0 cannot be pulled",
        }
    ]


async def test_active_instances_with_details_scope(api: AppClient) -> None:
    fn = await create_fn(api)
    idle = await create_fn(api, name="idle")
    dep = await deploy(api, fn)
    spec_id = dep["deploymentSpecifications"][0]["gpuSpecificationId"]
    iid = await add_instance(api, dep["deploymentId"], spec_id, phase="Starting")
    await add_instance(api, dep["deploymentId"], spec_id, phase="Failed", desired="absent")

    details = bearer(await new_key(api, ["list_functions_details"]))
    listed = (await api.get(f"{V}/functions", headers=details)).json()["functions"]
    by_version = {f["versionId"]: f for f in listed}
    (active,) = by_version[fn["versionId"]]["activeInstances"]
    # NVCF's InstanceDto; the phase, reason and message are the deployment's instances[]
    assert set(active) == {
        "instanceId",
        "functionId",
        "functionVersionId",
        "instanceType",
        "instanceStatus",
        "ncaId",
        "gpu",
        "backend",
        "location",
        "instanceCreatedAt",
        "instanceUpdatedAt",
    }
    assert active["instanceId"] == str(iid)
    assert active["functionId"] == fn["id"] and active["functionVersionId"] == fn["versionId"]
    assert active["instanceStatus"] == "STARTING"
    assert active["instanceType"] == "DGXC.GPU.L40_1x" and active["ncaId"] == "nvcf-default"
    assert active["gpu"] == "L40" and active["backend"] == "nvcf-default"
    assert active["location"] == "sim-dgxc"
    assert active["instanceCreatedAt"].endswith("Z") and active["instanceUpdatedAt"].endswith("Z")
    assert by_version[idle["versionId"]]["activeInstances"] == []
    one = await api.get(f"{V}/functions/{fn['id']}/versions/{fn['versionId']}", headers=details)
    assert one.json()["function"]["activeInstances"] == [active]

    plain = bearer(await new_key(api, ["list_functions"]))
    listed = (await api.get(f"{V}/functions", headers=plain)).json()["functions"]
    assert all("activeInstances" not in f for f in listed)


@pytest.mark.parametrize(
    ("phase", "status"),
    [
        ("Scheduling", "STARTING"),
        ("Starting", "STARTING"),
        ("Running", "RUNNING"),
        ("Degraded", "RUNNING"),
        ("Failed", "ERRORED"),
    ],
)
async def test_instance_phases_map_onto_nvcf_instance_statuses(
    api: AppClient, phase: str, status: str
) -> None:
    fn = await create_fn(api)
    dep = await deploy(api, fn)
    spec_id = dep["deploymentSpecifications"][0]["gpuSpecificationId"]
    await add_instance(api, dep["deploymentId"], spec_id, phase=phase)
    one = await api.get(f"{V}/functions/{fn['id']}/versions/{fn['versionId']}")
    (active,) = one.json()["function"]["activeInstances"]
    assert active["instanceStatus"] == status
    # the deployment keeps this service's own words for it
    got = (await api.get(f"{V}/deployments/{dep['deploymentId']}")).json()["deployment"]
    assert got["instances"][0]["phase"] == phase


# --- scaling -------------------------------------------------------------------------------


async def test_put_matches_gpu_and_instance_type_in_any_case(api: AppClient) -> None:
    fn = await create_fn(api)
    await deploy(api, fn, {**L40, "instanceType": "DGXC.GPU.L40_1x"})
    for gpu, instance_type in [("l40", "dgxc.gpu.l40_1x"), ("L40", "DGXC.GPU.L40_1X")]:
        resp = await api.put(
            dep_url(fn),
            json={
                "deploymentSpecifications": [
                    {
                        "gpu": gpu,
                        "instanceType": instance_type,
                        "backend": "NVCF-DEFAULT",
                        "minInstances": 1,
                        "maxInstances": 3,
                    }
                ]
            },
        )
        assert resp.status_code == 200, resp.text
        (spec,) = resp.json()["deployment"]["deploymentSpecifications"]
        assert (spec["gpu"], spec["instanceType"], spec["maxInstances"]) == (
            "L40",
            "DGXC.GPU.L40_1x",
            3,
        )


async def test_put_scales_and_refuses_other_changes(api: AppClient) -> None:
    fn = await create_fn(api)
    dep = await deploy(api, fn)
    (spec,) = dep["deploymentSpecifications"]
    resp = await api.put(
        dep_url(fn),
        json={
            "deploymentSpecifications": [
                {**L40, "minInstances": 2, "maxInstances": 4, "maxRequestConcurrency": 8}
            ]
        },
    )
    assert resp.status_code == 200, resp.text
    (new,) = resp.json()["deployment"]["deploymentSpecifications"]
    assert (new["minInstances"], new["maxInstances"], new["maxRequestConcurrency"]) == (2, 4, 8)
    assert new["gpuSpecificationId"] == spec["gpuSpecificationId"]

    resp = await api.put(
        dep_url(fn),
        json={
            "deploymentSpecifications": [
                {
                    "gpuSpecificationId": spec["gpuSpecificationId"],
                    "gpu": "L40S",
                    "instanceType": "DGXC.GPU.L40S_1x",
                    "minInstances": 1,
                    "maxInstances": 1,
                }
            ]
        },
    )
    assert resp.status_code == 400
    fields = {e["field"]: e["message"] for e in resp.json()["errors"]}
    assert set(fields) == {
        "deploymentSpecifications[0].gpu",
        "deploymentSpecifications[0].instanceType",
    }
    assert "cannot be changed" in fields["deploymentSpecifications[0].gpu"]
    again = (await api.get(dep_url(fn))).json()["deployment"]["deploymentSpecifications"][0]
    assert (again["minInstances"], again["maxInstances"]) == (2, 4)  # nothing changed

    resp = await api.put(
        dep_url(fn),
        json={"deploymentSpecifications": [{**L40, "minInstances": 5, "maxInstances": 4}]},
    )
    assert resp.status_code == 400
    resp = await api.put(
        dep_url(fn),
        json={"deploymentSpecifications": [{"gpuSpecificationId": str(uuid.uuid4()), **L40}]},
    )
    assert resp.status_code == 400

    events = (await api.get(f"{V}/deployments/{dep['deploymentId']}/events")).json()["events"]
    assert [e for e in events if e["kind"] == "scaling"]
    (row,) = await stored(api, fn["versionId"])
    assert row.generation == 2


async def test_patch_gpu_specification(api: AppClient) -> None:
    fn = await create_fn(api)
    dep = await deploy(api, fn)
    spec_id = dep["deploymentSpecifications"][0]["gpuSpecificationId"]
    url = f"{V}/deployments/{dep['deploymentId']}/gpu-specifications/{spec_id}"
    # sim-dgxc holds at most 4 L40 instances: 5 could never run
    resp = await api.patch(url, json={"maxInstances": 5})
    assert resp.status_code == 400
    assert resp.json()["errors"] == [
        {
            "field": "maxInstances",
            "message": "must be at most 4: the candidate clusters (sim-dgxc) hold at most 4 "
            "instances of DGXC.GPU.L40_1x, got 5",
        }
    ]
    resp = await api.patch(url, json={"maxInstances": 4})
    assert resp.status_code == 200, resp.text
    spec = resp.json()["gpuSpecification"]
    assert (spec["minInstances"], spec["maxInstances"]) == (1, 4)
    assert spec["gpuSpecificationId"] == spec_id

    assert (await api.patch(url, json={})).status_code == 400
    resp = await api.patch(url, json={"minInstances": 6})
    assert resp.status_code == 400 and "≥ minInstances" in resp.json()["detail"]
    resp = await api.patch(url, json={"minInstances": -1, "maxInstances": 0})
    assert {e["field"] for e in resp.json()["errors"]} == {"minInstances", "maxInstances"}
    missing = f"{V}/deployments/{dep['deploymentId']}/gpu-specifications/{uuid.uuid4()}"
    assert (await api.patch(missing, json={"minInstances": 1})).status_code == 404


async def test_scaling_recomputes_the_version_status(api: AppClient) -> None:
    fn = await create_fn(api)
    dep = await deploy(api, fn, {**L40, "minInstances": 0})
    assert dep["functionStatus"] == "ACTIVE"
    spec_id = dep["deploymentSpecifications"][0]["gpuSpecificationId"]
    await add_instance(api, dep["deploymentId"], spec_id, phase="Running")
    url = f"{V}/deployments/{dep['deploymentId']}/gpu-specifications/{spec_id}"

    assert (await api.patch(url, json={"minInstances": 1})).status_code == 200
    assert await version_status(api, fn) == "ACTIVE"  # 1 Running ≥ 1
    assert (await api.patch(url, json={"minInstances": 2})).status_code == 200
    assert await version_status(api, fn) == "DEGRADING"  # some, fewer than min
    assert (await api.patch(url, json={"minInstances": 1})).status_code == 200
    assert await version_status(api, fn) == "ACTIVE"

    events = (await api.get(f"{V}/deployments/{dep['deploymentId']}/events")).json()["events"]
    assert any(e["kind"] == "status" and "DEGRADING" in e["message"] for e in events)

    deploying = await create_fn(api)
    dep2 = await deploy(api, deploying)
    spec2 = dep2["deploymentSpecifications"][0]["gpuSpecificationId"]
    url2 = f"{V}/deployments/{dep2['deploymentId']}/gpu-specifications/{spec2}"
    assert (await api.patch(url2, json={"minInstances": 0})).status_code == 200
    assert await version_status(api, deploying) == "ACTIVE"


# --- delete --------------------------------------------------------------------------------


async def test_delete_deployment_and_redeploy(api: AppClient) -> None:
    fn = await create_fn(api)
    dep = await deploy(api, fn)
    resp = await api.delete(dep_url(fn), params={"graceful": "false"})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["function"]["versionId"] == fn["versionId"]
    assert body["function"]["status"] == "INACTIVE"
    assert await version_status(api, fn) == "INACTIVE"
    (row,) = await stored(api, fn["versionId"])
    assert row.desired == "deleting" and row.generation == 2
    assert (await api.get(dep_url(fn))).status_code == 404
    old = (await api.get(f"{V}/deployments/{dep['deploymentId']}")).json()["deployment"]
    assert old["functionStatus"] == "INACTIVE"
    events = (await api.get(f"{V}/deployments/{dep['deploymentId']}/events")).json()["events"]
    assert any(e["kind"] == "teardown" for e in events)
    listed = (await api.get(f"{V}/deployments")).json()["deployments"]
    assert dep["deploymentId"] not in {d["deploymentId"] for d in listed}
    assert (await api.delete(dep_url(fn))).status_code == 404

    again = await deploy(api, fn)
    assert again["deploymentId"] != dep["deploymentId"]
    assert again["functionStatus"] == "DEPLOYING"
    rows = await stored(api, fn["versionId"])
    assert sorted(r.desired for r in rows) == ["deleted", "deployed"] or sorted(
        r.desired for r in rows
    ) == ["deleting", "deployed"]


async def test_deleting_the_version_marks_its_deployment_deleting(api: AppClient) -> None:
    fn = await create_fn(api)
    dep = await deploy(api, fn)
    resp = await api.delete(f"{V}/functions/{fn['id']}/versions/{fn['versionId']}")
    assert resp.status_code == 204
    (row,) = await stored(api, fn["versionId"])
    assert row.desired == "deleting" and row.generation == 2
    async with api.app.state.sessionmaker() as session:
        specs = (
            (
                await session.execute(
                    select(DeploymentSpec).where(DeploymentSpec.deployment_id == row.id)
                )
            )
            .scalars()
            .all()
        )
    assert len(specs) == 1  # the deployment outlives the version row
    got = (await api.get(f"{V}/deployments/{dep['deploymentId']}")).json()["deployment"]
    assert got["functionStatus"] == "INACTIVE"
    events = (await api.get(f"{V}/deployments/{dep['deploymentId']}/events")).json()["events"]
    assert events[-1]["kind"] == "teardown"


@own_app
async def test_wakes_the_reconciler_after_commit(client_factory: ClientFactory) -> None:
    client = await client_factory(reconcile_interval=3600)
    real = getattr(client.app.state, "reconciler", None)
    if real is not None:
        await real.stop()
    seen: list[str] = []

    class Spy:
        def wake(self) -> None:
            seen.append("wake")

    client.app.state.reconciler = Spy()
    fn = await create_fn(client)
    dep = await deploy(client, fn)
    assert seen == ["wake"]
    spec_id = dep["deploymentSpecifications"][0]["gpuSpecificationId"]
    url = f"{V}/deployments/{dep['deploymentId']}/gpu-specifications/{spec_id}"
    await client.patch(url, json={"maxInstances": 3})
    await client.delete(dep_url(fn))
    assert seen == ["wake"] * 3
    # A refused request does not wake it.
    await client.post(dep_url(fn), json={"deploymentSpecifications": [{"gpu": "nope"}]})
    assert len(seen) == 3


# --- helm functions: the pinned chart re-rendered per specification ------------------------
# Registry fixtures come from tests/conftest.py (a real local docker-registry).


async def helm_setup(
    client_factory: ClientFactory,
    registry: RegistryServer,
    push: PushCorpus,
    catalog: Path | None = None,
) -> tuple[AppClient, dict[str, Any]]:
    client = await client_factory(
        reconcile_interval=3600,
        registry_allowlist=registry.host,
        insecure_registries=registry.host,
        clusters_file=catalog,
    )
    await without_reconciler(client)
    chart = push(registry, "inference-ok")
    fn = await create_fn(
        client,
        name="helm-echo",
        inferenceUrl="/v2/models/m/infer",
        inferencePort=8000,
        containerImage=None,
        helmChart=chart.file_url,
        helmChartServiceName="entrypoint",
    )
    assert fn["helmChartDigest"] == chart.digest
    return client, fn


def objects_by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in objects}


@own_app
@pytest.mark.registry
async def test_helm_configuration_changes_the_stored_objects(
    client_factory: ClientFactory,
    anon_registry: RegistryServer,
    push_corpus: PushCorpus,
    tmp_path: Path,
) -> None:
    # the catalog permits every policy: the operator's rules have their own tests
    catalog = write_catalog(tmp_path, PERMISSIVE)
    client, fn = await helm_setup(client_factory, anon_registry, push_corpus, catalog)
    configured = {
        "gpu": "L40S",
        "minInstances": 1,
        "maxInstances": 1,
        "configuration": {
            "replicaCount": 2,
            "image": {"tag": "2.0"},  # maps deep-merge: repository keeps its default
            "workloadConfig": {"featureFlags": {"StatusByWorkerReadiness": True}},
        },
        "helmValidationPolicy": {"name": "Unrestricted"},
    }
    plain = {"gpu": "H100", "minInstances": 1, "maxInstances": 1}
    dep = await deploy(client, fn, configured, plain)
    first, second = dep["deploymentSpecifications"]
    assert first["configuration"] == configured["configuration"]
    assert first["helmValidationPolicy"] == {"name": "Unrestricted", "extraKubernetesTypes": []}
    assert "configuration" not in second

    (row,) = await stored(client, fn["versionId"])
    assert row.feature_flags == {"StatusByWorkerReadiness": True}
    changed = objects_by_kind(row.specs[0].objects)
    default = objects_by_kind(row.specs[1].objects)
    names = [o["metadata"]["name"] for o in row.specs[0].objects]
    assert "nvcf-workload-config" not in names  # never installed
    assert changed["Deployment"]["spec"]["replicas"] == 2
    assert default["Deployment"]["spec"]["replicas"] == 1
    image = changed["Deployment"]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "nvcr.io/nvidia/inference-test:2.0"
    assert default["Deployment"]["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "nvcr.io/nvidia/inference-test:1.0"
    )
    assert changed["Service"]["metadata"]["name"] == "entrypoint"


@own_app
@pytest.mark.registry
async def test_helm_overrides_breaking_rules_are_refused_with_rule_ids(
    client_factory: ClientFactory,
    anon_registry: RegistryServer,
    push_corpus: PushCorpus,
    tmp_path: Path,
) -> None:
    # the catalog permits every policy: the operator's rules have their own tests
    catalog = write_catalog(tmp_path, PERMISSIVE)
    client, fn = await helm_setup(client_factory, anon_registry, push_corpus, catalog)
    ingress = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {"name": "web"},
        "spec": {},
    }
    specs = [
        {
            "gpu": "L40S",
            "minInstances": 1,
            "maxInstances": 1,
            "configuration": {"service": {"type": "NodePort"}},
        },
        {
            "gpu": "H100",
            "minInstances": 1,
            "maxInstances": 1,
            "configuration": {"extraObjects": [ingress]},
        },
        {"gpu": "L40", "minInstances": 1, "maxInstances": 1, "configuration": {"boom": True}},
        {
            "gpu": "B200",
            "instanceType": "ON-PREM.GPU.B200_8x.x2",
            "minInstances": 1,
            "maxInstances": 1,
            "configuration": {"gpus": 4},
        },
    ]
    resp = await client.post(dep_url(fn), json={"deploymentSpecifications": specs})
    assert resp.status_code == 400, resp.text
    errors = [(e["field"], e["rule"]) for e in resp.json()["errors"]]
    assert ("deploymentSpecifications[0].configuration", "service-type") in errors
    assert ("deploymentSpecifications[1].configuration", "kind-not-allowed") in errors
    assert ("deploymentSpecifications[2].configuration", "render-error") in errors
    assert ("deploymentSpecifications[3].instanceType", "multi-node-full-node") in errors
    assert all(e["message"] for e in resp.json()["errors"])
    assert await stored(client, fn["versionId"]) == []
    assert await version_status(client, fn) == "INACTIVE"

    # The deployment's policy admits the extra kind; a full-node multi-node layout passes.
    allowed = {
        "gpu": "H100",
        "minInstances": 1,
        "maxInstances": 1,
        "configuration": {"extraObjects": [ingress]},
        "helmValidationPolicy": {
            "name": "Default",
            "extraKubernetesTypes": [
                {"group": "networking.k8s.io", "version": "v1", "kind": "Ingress"}
            ],
        },
    }
    multi = {
        "gpu": "B200",
        "instanceType": "ON-PREM.GPU.B200_8x.x2",
        "minInstances": 1,
        "maxInstances": 1,
        "configuration": {"gpus": 8, "replicaCount": 2},
    }
    dep = await deploy(client, fn, allowed, multi)
    assert [s["instanceType"] for s in dep["deploymentSpecifications"]] == [
        "NCP.GPU.H100_1x",
        "ON-PREM.GPU.B200_8x.x2",
    ]
    (row,) = await stored(client, fn["versionId"])
    assert "Ingress" in objects_by_kind(row.specs[0].objects)
    assert row.specs[1].candidate_clusters == ["sim-onprem"]
