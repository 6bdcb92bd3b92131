"""Helm functions end to end on the simulated clusters: an app on the built-in catalog with
near-zero delays and shrunk health timeouts, a helm function created from the `sim-workload`
corpus chart in a local registry, and the deploy/events helpers the helm e2e tests share."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import yaml

from tests.support.app import AppClient, ClientFactory
from tests.support.charts import PushCorpus
from tests.support.e2e import V, dep_url
from tests.support.registry import RegistryServer

CHART = "sim-workload"
BUILTIN_CATALOG = Path(__file__).parents[2] / "service" / "clusters" / "default_catalog.yaml"
FAULT = "sim.nvcf.io/fault"
H100 = {"gpu": "H100", "instanceType": "NCP.GPU.H100_1x", "minInstances": 1, "maxInstances": 1}
FAST: dict[str, Any] = {
    "reconcile_interval": 0.05,
    "reconcile_resync_seconds": 0.1,
    "render_workers": 1,
    "health_image_pull_timeout": 0.5,
    "health_pod_scheduling_timeout": 0.5,
    "health_restart_loop_timeout": 0.5,
    # Longer than a crash loop takes to reach 3 restarts (~0.6 s) plus its own timeout, so a
    # crash-looping pod fails for the restart loop, not for never becoming ready.
    "health_worker_startup_timeout": 4.0,
    "health_worker_degradation_period": 0.5,
}
_names = itertools.count()


# --- harness ------------------------------------------------------------------------------


def fast_catalog(tmp_path: Path) -> Path:
    """The built-in catalog with near-zero simulation delays (JSON is valid YAML)."""
    data = yaml.safe_load(BUILTIN_CATALOG.read_text())
    for group in data["clusterGroups"]:
        for cluster in group["clusters"]:
            cluster["simulation"] = {
                "scheduleSeconds": 0.02,
                "pullSeconds": 0.02,
                "readySeconds": 0.05,
            }
    path = tmp_path / "clusters.yaml"
    path.write_text(json.dumps(data))
    return path


async def start(
    client_factory: ClientFactory, tmp_path: Path, registry: RegistryServer, **overrides: Any
) -> AppClient:
    return await client_factory(
        clusters_file=fast_catalog(tmp_path),
        registry_allowlist=registry.host,
        insecure_registries=registry.host,
        **{**FAST, **overrides},
    )


async def create_helm_fn(client: AppClient, chart_url: str) -> dict[str, Any]:
    body = {
        "name": f"sim-helm-{next(_names)}",
        "inferenceUrl": "/v2/models/m/infer",
        "inferencePort": 8000,
        "helmChart": chart_url,
        "helmChartServiceName": "entrypoint",
    }
    resp = await client.post(f"{V}/functions", json=body)
    assert resp.status_code == 200, resp.text
    fn: dict[str, Any] = resp.json()["function"]
    assert fn["status"] == "INACTIVE"
    return fn


async def setup(
    client_factory: ClientFactory,
    tmp_path: Path,
    registry: RegistryServer,
    push: PushCorpus,
    *,
    functions: int = 1,
    **overrides: Any,
) -> tuple[AppClient, list[dict[str, Any]]]:
    client = await start(client_factory, tmp_path, registry, **overrides)
    chart = push(registry, CHART)
    fns = [await create_helm_fn(client, chart.file_url) for _ in range(functions)]
    return client, fns


def spec(configuration: dict[str, Any] | None = None, **changes: Any) -> dict[str, Any]:
    out: dict[str, Any] = {**H100, **changes}
    if configuration is not None:
        out["configuration"] = configuration
    return out


def pod_faults(fault: str, **more: str) -> dict[str, Any]:
    return {"podAnnotations": {FAULT: fault, **more}}


async def deploy(client: AppClient, fn: dict[str, Any], *specs: dict[str, Any]) -> dict[str, Any]:
    resp = await client.post(dep_url(fn), json={"deploymentSpecifications": list(specs)})
    assert resp.status_code == 200, resp.text
    dep: dict[str, Any] = resp.json()["deployment"]
    assert dep["functionStatus"] == "DEPLOYING"
    return dep


async def events(client: AppClient, dep: dict[str, Any]) -> list[dict[str, Any]]:
    resp = await client.get(f"{V}/deployments/{dep['deploymentId']}/events")
    assert resp.status_code == 200, resp.text
    return list(resp.json()["events"])


#: a task's chart Job: its container plays SIM_TASK_SCRIPT (`configuration.script`)
JOB = """apiVersion: batch/v1
kind: Job
metadata:
  name: trainer
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: trainer
          image: nvcr.io/acme/trainer:1.0
          env:
            - name: SIM_TASK_SCRIPT
              value: {{ .Values.script | quote }}
          resources:
            limits:
              nvidia.com/gpu: 1
"""
#: sim-workload with its worker, Service and side Job replaced by one task Job
TASK_CHART = {
    "templates/deployment.yaml": "",
    "templates/service.yaml": "",
    "templates/side-job.yaml": "",
    "templates/job.yaml": JOB,
}
