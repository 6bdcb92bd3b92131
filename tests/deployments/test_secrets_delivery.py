"""Delivery of a version's secrets by the reconciler (simulated cluster, fake clock): a new
instance gets them at apply, an update reaches each running instance once, in place, and only
the instances holding an older generation; nothing is done on later passes."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from cryptography.fernet import Fernet
from sqlalchemy import select

from service.backends.protocol import AdapterError, InstanceSpec
from service.core.crypto import SecretBox
from service.core.events import Events
from service.deployments import subscribers
from service.deployments.models import Deployment, Instance
from service.functions.models import FunctionSecret, FunctionVersion
from service.functions.secrets import update_secrets
from tests.support.reconcile import Harness, workload


async def secrets_of(harness: Harness, inst: Instance) -> dict[str, str]:
    target = InstanceSpec(str(inst.id), "f", "v", "NCP.GPU.H100_1x", "H100", 1)
    for obj in await harness.sim().objects(target):
        if obj["kind"] == "Secret" and obj["metadata"]["name"] == "nvcf-secrets":
            return dict(json.loads(base64.b64decode(obj["data"]["secrets.json"])))
    raise AssertionError("no nvcf-secrets Secret")


async def put(harness: Harness, dep: Deployment, box: SecretBox, **values: str) -> None:
    async with harness.maker() as session, session.begin():
        version = await session.get(FunctionVersion, dep.version_id)
        assert version is not None
        events = Events()
        subscribers.subscribe(events, wake=lambda: None, adds_collector=lambda _: False)
        await update_secrets(
            session, version, list(values.items()), box=box, events=events, now=harness.clock()
        )


async def test_update_reaches_each_instance_once_in_place(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = SecretBox(Fernet.generate_key())
    rec = harness.new_reconciler(secret_box=box)
    dep = await harness.deploy([workload()], min_instances=2)
    async with harness.maker() as session, session.begin():
        session.add(
            FunctionSecret(version_id=dep.version_id, name="A", ciphertext=box.encrypt("1"))
        )
    await harness.until_status(dep, "ACTIVE", reconciler=rec)
    rows = await harness.instances(dep)
    assert [await secrets_of(harness, r) for r in rows] == [{"A": "1"}] * 2
    pods = {
        p.name
        for r in rows
        for p in (
            await harness.sim().observe(
                InstanceSpec(str(r.id), "f", "v", "NCP.GPU.H100_1x", "H100", 1)
            )
        ).pods
    }

    updates: list[str] = []
    original = harness.sim().update_objects

    async def counting(instance: InstanceSpec, objects: list[dict[str, Any]]) -> None:
        updates.append(instance.instance_id)
        await original(instance, objects)

    monkeypatch.setattr(harness.sim(), "update_objects", counting)
    await put(harness, dep, box, A="value-two-xyz", B="value-three-xyz")
    report = await rec.run_once()
    assert report.reconciled == 1
    assert sorted(updates) == sorted(str(r.id) for r in rows)  # each instance once
    after = await harness.instances(dep)
    assert [r.id for r in after] == [r.id for r in rows]  # no new instance
    assert all(r.secrets_generation == 1 and r.phase == "Running" for r in after)
    assert [await secrets_of(harness, r) for r in after] == [
        {"A": "value-two-xyz", "B": "value-three-xyz"}
    ] * 2
    assert pods == {
        p.name
        for r in after
        for p in (
            await harness.sim().observe(
                InstanceSpec(str(r.id), "f", "v", "NCP.GPU.H100_1x", "H100", 1)
            )
        ).pods
    }
    events = await harness.events(dep, "secrets")
    assert [e.reason for e in events].count("SecretsDelivered") == 2
    assert all("-xyz" not in e.message for e in await harness.events(dep))

    # settled: later passes read nothing and write no Secret
    updates.clear()
    for _ in range(5):
        report = await rec.run_once()
        assert report.deployments == 0
        harness.clock.advance(1)
    assert updates == []


async def test_a_failed_update_is_retried_until_delivered(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = SecretBox(Fernet.generate_key())
    rec = harness.new_reconciler(secret_box=box)
    dep = await harness.deploy([workload()])
    await harness.until_status(dep, "ACTIVE", reconciler=rec)
    original = harness.sim().update_objects
    failing = {"left": 2}

    async def flaky(instance: InstanceSpec, objects: list[dict[str, Any]]) -> None:
        if failing["left"]:
            failing["left"] -= 1
            raise AdapterError("etcdserver: request timed out", retryable=True)
        await original(instance, objects)

    monkeypatch.setattr(harness.sim(), "update_objects", flaky)
    await put(harness, dep, box, TOKEN="new")

    async def delivered() -> bool:
        [row] = await harness.instances(dep)
        return row.secrets_generation == 1

    await harness.drive(delivered, reconciler=rec)
    [row] = await harness.instances(dep)
    assert await secrets_of(harness, row) == {"TOKEN": "new"}
    assert failing["left"] == 0
    async with harness.maker() as session:
        due = await session.scalar(select(Deployment.due_at).where(Deployment.id == dep.id))
    assert due is None  # settled once delivered
