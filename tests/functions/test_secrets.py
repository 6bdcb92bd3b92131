"""Secrets in the workload over HTTP on the simulated cluster: the worker sees the version's
secret names, `PUT /secrets/functions/{id}/versions/{versionId}` merges by name and running
instances read the update without a restart; bad bodies are 400 listing every violation and
change nothing; values appear in no response, log record or event."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from sqlalchemy.ext.asyncio import AsyncSession

from service.backends.protocol import InstanceSpec
from service.backends.simulated.adapter import SimulatedAdapter
from service.core.crypto import SecretBox
from service.core.db import make_sessionmaker
from service.core.events import Events
from service.functions import secrets, service
from service.functions.models import FunctionVersion
from tests.support.api import assert_problem, bearer, create_fn, new_key
from tests.support.app import AppClient, ClientFactory
from tests.support.e2e import V, dep_url, deployment, eventually
from tests.support.invocation import deployed, invocation_app, pexec_url, spec
from tests.support.races import writers
from tests.support.reconcile import ACCOUNT, add_version

SECRET_VALUE = "s3cr3t-value-never-shown"
ROTATED_VALUE = "r0tated-value-never-shown"


def secrets_url(fn: dict[str, Any]) -> str:
    return f"{V}/secrets/functions/{fn['id']}/versions/{fn['versionId']}"


def sim(client: AppClient) -> SimulatedAdapter:
    adapter = client.app.state.adapters.get("inv-0")
    assert isinstance(adapter, SimulatedAdapter)
    return adapter


async def secrets_json(client: AppClient, instance_id: str) -> dict[str, str]:
    """The `secrets.json` of the instance's Secret as the simulated cluster holds it."""
    target = InstanceSpec(instance_id, "f", "v", "NCP.GPU.H100_1x", "H100", 1)
    for obj in await sim(client).objects(target):
        if obj["kind"] == "Secret" and obj["metadata"]["name"] == "nvcf-secrets":
            return dict(json.loads(base64.b64decode(obj["data"]["secrets.json"])))
    raise AssertionError("no Secret nvcf-secrets in the instance namespace")


async def invoke(client: AppClient, fn: dict[str, Any]) -> dict[str, Any]:
    resp = await client.post(pexec_url(fn), json={"q": 1})
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


async def test_worker_sees_names_and_rotation_needs_no_restart(
    client_factory: ClientFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    client = await invocation_app(client_factory, tmp_path)
    fn = await deployed(client, secrets=[{"name": "API_TOKEN", "value": SECRET_VALUE}])
    [inst] = fn["deployment"]["instances"]
    first = await invoke(client, fn)
    assert first["secrets"] == ["API_TOKEN"]
    assert await secrets_json(client, inst["instanceId"]) == {"API_TOKEN": SECRET_VALUE}
    pods_before = {
        (o["metadata"]["name"], o["metadata"]["uid"])
        for o in await sim(client).objects(
            InstanceSpec(inst["instanceId"], "f", "v", "NCP.GPU.H100_1x", "H100", 1)
        )
        if o["kind"] == "Pod"
    }

    resp = await client.put(
        secrets_url(fn),
        json={
            "secrets": [
                {"name": "API_TOKEN", "value": ROTATED_VALUE},
                {"name": "DB_CONFIG", "value": {"user": "app", "port": 5432}},
            ]
        },
    )
    assert resp.status_code == 204, resp.text
    assert resp.content == b""

    async def rotated() -> bool:
        return bool((await invoke(client, fn))["secrets"] == ["API_TOKEN", "DB_CONFIG"])

    await eventually(rotated)
    assert await secrets_json(client, inst["instanceId"]) == {
        "API_TOKEN": ROTATED_VALUE,
        "DB_CONFIG": '{"port":5432,"user":"app"}',
    }
    # the same instance and the same pods: updated in place, no restart
    after = await invoke(client, fn)
    assert after["instanceId"] == inst["instanceId"]
    [now] = (await deployment(client, fn))["instances"]
    assert (now["instanceId"], now["phase"]) == (inst["instanceId"], "Running")
    pods_after = {
        (o["metadata"]["name"], o["metadata"]["uid"])
        for o in await sim(client).objects(
            InstanceSpec(inst["instanceId"], "f", "v", "NCP.GPU.H100_1x", "H100", 1)
        )
        if o["kind"] == "Pod"
    }
    assert pods_after == pods_before

    # the version lists both names, never a value; the timeline says what happened
    got = await client.get(f"{V}/functions/{fn['id']}/versions/{fn['versionId']}")
    assert got.json()["function"]["secrets"] == ["API_TOKEN", "DB_CONFIG"]
    dep = await deployment(client, fn)
    events = (await client.get(f"{V}/deployments/{dep['deploymentId']}/events")).text
    assert "SecretsUpdated" in events and "SecretsDelivered" in events
    for text in (got.text, events, json.dumps(dep), caplog.text):
        assert SECRET_VALUE not in text and ROTATED_VALUE not in text


async def test_every_container_mounts_the_secret(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await invocation_app(client_factory, tmp_path)
    fn = await deployed(client)
    [inst] = fn["deployment"]["instances"]
    assert (await invoke(client, fn))["secrets"] == []
    target = InstanceSpec(inst["instanceId"], "f", "v", "NCP.GPU.H100_1x", "H100", 1)
    [workload] = [o for o in await sim(client).objects(target) if o["kind"] == "Deployment"]
    pod = workload["spec"]["template"]["spec"]
    assert {"name": "nvcf-secrets", "secret": {"secretName": "nvcf-secrets"}} in pod["volumes"]
    for container in pod["containers"]:
        assert {
            "name": "nvcf-secrets",
            "mountPath": "/var/secrets",
            "readOnly": True,
        } in container["volumeMounts"]
    # a version deployed without secrets gets its first ones in place
    resp = await client.put(secrets_url(fn), json={"secrets": [{"name": "NEW", "value": "v"}]})
    assert resp.status_code == 204, resp.text

    async def delivered() -> bool:
        return bool((await invoke(client, fn))["secrets"] == ["NEW"])

    await eventually(delivered)


async def test_version_without_deployment_keeps_them_for_its_deployment(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await invocation_app(client_factory, tmp_path)
    fn = await create_fn(client, secrets=[{"name": "A", "value": "1"}])
    resp = await client.put(
        secrets_url(fn),
        json={"secrets": [{"name": "A", "value": "2"}, {"name": "B", "value": "3"}]},
    )
    assert resp.status_code == 204, resp.text
    resp = await client.post(dep_url(fn), json={"deploymentSpecifications": [spec()]})
    assert resp.status_code == 200, resp.text

    async def active() -> bool:
        got = await client.get(f"{V}/functions/{fn['id']}/versions/{fn['versionId']}")
        return bool(got.json()["function"]["status"] == "ACTIVE")

    await eventually(active)
    [inst] = (await deployment(client, fn))["instances"]
    assert await secrets_json(client, inst["instanceId"]) == {"A": "2", "B": "3"}
    assert (await invoke(client, fn))["secrets"] == ["A", "B"]


async def test_bad_bodies_list_every_violation_and_change_nothing(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await invocation_app(client_factory, tmp_path)
    fn = await create_fn(client, secrets=[{"name": "KEEP", "value": "x"}])
    cases: list[tuple[Any, set[str]]] = [
        ({}, {"secrets"}),
        ({"secrets": []}, {"secrets"}),
        ({"secrets": "A=1"}, {"secrets"}),
        (
            {
                "secrets": [
                    {"name": "-bad", "value": ""},
                    {"name": "ok", "value": 3},
                    {"name": "n" * 49, "value": "v"},
                ]
            },
            {"secrets[0].name", "secrets[0].value", "secrets[1].value", "secrets[2].name"},
        ),
        (
            {"secrets": [{"name": "DUP", "value": "1"}, {"name": "DUP", "value": "2"}]},
            {"secrets"},
        ),
        ({"secrets": [{"name": "BIG", "value": "v" * 32769}]}, {"secrets[0].value"}),
        ({"secrets": [{"name": f"S{i}", "value": "v"} for i in range(129)]}, {"secrets"}),
    ]
    for body, fields in cases:
        resp = await client.put(secrets_url(fn), json=body)
        problem = assert_problem(resp, 400)
        errors = problem["errors"]
        assert isinstance(errors, list)
        assert fields <= {e["field"] for e in errors}, (body, errors)
        assert "v" * 100 not in resp.text
    # the total after the merge is bounded too
    many = [{"name": f"S{i}", "value": "v"} for i in range(128)]
    resp = await client.put(secrets_url(fn), json={"secrets": many})
    problem = assert_problem(resp, 400)
    assert "129 secrets" in json.dumps(problem)
    got = await client.get(f"{V}/functions/{fn['id']}/versions/{fn['versionId']}")
    assert got.json()["function"]["secrets"] == ["KEEP"]


async def test_scope_and_ownership(client_factory: ClientFactory, tmp_path: Path) -> None:
    client = await invocation_app(client_factory, tmp_path)
    fn = await create_fn(client)
    body = {"secrets": [{"name": "A", "value": "1"}]}
    reader = await new_key(client, ["list_functions"])
    resp = await client.put(secrets_url(fn), json=body, headers=bearer(reader))
    assert_problem(resp, 403)
    other = await new_key(client, ["update_secrets"], account="someone-else")
    resp = await client.put(secrets_url(fn), json=body, headers=bearer(other))
    assert_problem(resp, 404)
    owner = await new_key(client, ["update_secrets"])
    resp = await client.put(secrets_url(fn), json=body, headers=bearer(owner))
    assert resp.status_code == 204, resp.text
    missing = {**fn, "versionId": "00000000-0000-0000-0000-000000000000"}
    resp = await client.put(secrets_url(missing), json=body)
    assert_problem(resp, 404)


async def test_two_updates_at_once_both_land_and_each_is_a_new_generation(
    database_url: str,
) -> None:
    box = SecretBox(Fernet.generate_key())
    async with writers(database_url) as w:
        maker = make_sessionmaker(w.engine)
        async with maker() as session, session.begin():
            fid, vid = await add_version(session)

        async def update(session: AsyncSession, name: str) -> None:
            version = await service.get_version(session, ACCOUNT, fid, vid)
            await secrets.update_secrets(session, version, [(name, "v")], box=box, events=Events())

        async with maker() as first:
            await update(first, "FIRST")

            async def second() -> None:
                async with maker() as session, session.begin():
                    await update(session, "SECOND")

            updating = asyncio.create_task(second())
            await w.until_waiting()
            await first.commit()
        await updating
        async with maker() as session:
            version = await session.get_one(FunctionVersion, vid)
            # the second update is generation 2: instances holding the first's receive it too
            assert (version.secret_names, version.secrets_generation) == (["FIRST", "SECOND"], 2)
