"""Helpers for invocation tests: an app on a fast simulated catalog (optionally one whose
cluster forwards to a real upstream server), a function deployed until ACTIVE, and the
routing values (`route`, `target`) the dispatcher and load tracker take."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from service.backends.worker import WorkerPort
from service.invocation.routing import InstanceRoute, Target
from tests.support.api import create_fn
from tests.support.app import AppClient, ClientFactory
from tests.support.e2e import V, dep_url, deployment, until_status

FAST = {
    "reconcile_interval": 0.05,
    "reconcile_resync_seconds": 0.1,
    "rate_limit_per_second": 0,
}


def write_catalog(
    tmp_path: Path, *, upstream: str | None = None, clusters: int = 1, gpus: int = 8
) -> Path:
    """A one-group catalog `inv` of `clusters` simulated clusters `inv-0`, `inv-1`, … with
    one H100 node of `gpus` GPUs each; `upstream` makes the first one forward there."""
    members = []
    for i in range(clusters):
        sim: dict[str, Any] = {"scheduleSeconds": 0.01, "pullSeconds": 0.01, "readySeconds": 0.02}
        if upstream is not None and i == 0:
            sim["upstream"] = upstream
        members.append(
            {
                "name": f"inv-{i}",
                "adapter": "simulated",
                "provider": "NCP",
                "region": f"region-{i}",
                "nodes": [{"gpu": "H100", "gpusPerNode": gpus, "count": 1}],
                "simulation": sim,
            }
        )
    path = tmp_path / f"clusters-{clusters}-{upstream is not None}.yaml"
    path.write_text(json.dumps({"clusterGroups": [{"name": "inv", "clusters": members}]}))
    return path


async def invocation_app(
    client_factory: ClientFactory,
    tmp_path: Path,
    *,
    upstream: str | None = None,
    clusters: int = 1,
    gpus: int = 8,
    **overrides: Any,
) -> AppClient:
    catalog = write_catalog(tmp_path, upstream=upstream, clusters=clusters, gpus=gpus)
    return await client_factory(clusters_file=catalog, **{**FAST, **overrides})


def spec(**changes: Any) -> dict[str, Any]:
    return {"gpu": "H100", "backend": "inv", "minInstances": 1, "maxInstances": 1, **changes}


async def deployed(
    client: AppClient, *, specs: list[dict[str, Any]] | None = None, **fn: Any
) -> dict[str, Any]:
    """A container function (inferenceUrl /echo) deployed and ACTIVE, with its deployment."""
    created = await create_fn(client, **fn)
    resp = await client.post(dep_url(created), json={"deploymentSpecifications": specs or [spec()]})
    assert resp.status_code == 200, resp.text
    await until_status(client, created, "ACTIVE")
    created["deployment"] = await deployment(client, created)
    return created


def pexec_url(fn: dict[str, Any], *, version: bool = True) -> str:
    base = f"{V}/pexec/functions/{fn['id']}"
    return f"{base}/versions/{fn['versionId']}" if version else base


def sample(text: str, name: str, **labels: str) -> float:
    """The sum of the samples `name` whose labels include `labels` in a /metrics text."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def route(n: int | None = None, concurrency: int = 1) -> InstanceRoute:
    """A Running instance with id `UUID(int=n)` (a fresh random one without `n`)."""
    instance_id = uuid.uuid4() if n is None else uuid.UUID(int=n)
    return InstanceRoute(instance_id, f"c{n or ''}", concurrency, "g", "NCP.GPU.H100_1x", "r")


def target(*instances: InstanceRoute, fresh: bool = False) -> Target:
    """An ACTIVE version with these instances: function 100 and version 200, or fresh random
    ids (`fresh`: tests sharing one Redis)."""
    return Target(
        function_id=uuid.uuid4() if fresh else uuid.UUID(int=100),
        version_id=uuid.uuid4() if fresh else uuid.UUID(int=200),
        owner_account="acct",
        caller_account="acct",
        name="fn",
        status="ACTIVE",
        inference_path="/echo",
        port=WorkerPort("entrypoint", 8000),
        rate=None,
        instances=instances,
        worker_service=None,
    )
