"""Benchmark of helm function creation through the HTTP API (helm.md §1–§3).

Run: `.venv/bin/python bench/charts.py [--reps N] [--variant VARIANT]`. Starts its own local
docker-registry (tests/support/registry.py) and the app in-process (lifespan included, httpx
ASGI transport), pushes a chart that renders 300 objects, and prints medians of:

(a) creating a helm function end to end through the API (cold chart cache: a new chart version
    each repetition) against pulling the same chart with `oras` and rendering it with
    `helm_python` directly in this process → ratio, target ≤ 1.3;
(b) a second create of the same chart (cache hit) as a fraction of the first, target ≤ 0.3.

The baseline renders the way `helm template` does (the install action in client dry-run:
render, then parse every document to sort by kind and split out hooks). For context it also
prints the Helm engine alone (`Chart.render`: templates only, no manifest), which is not a
usable manifest but bounds what any render could cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import helm_python
import httpx
import oras.provider
import yaml
from asgi_lifespan import LifespanManager

from service.app import create_app
from service.core.settings import Settings
from tests.support.registry import RegistryServer, push_chart, start_registry

KEY = "nvapi-bench-" + "c" * 40
OBJECTS = 300
CHART = "bench-chart"
NAMESPACE = "bench"

DEPLOYMENT = """apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}-inference
spec:
  replicas: 1
  selector:
    matchLabels: {app: inference}
  template:
    metadata:
      labels: {app: inference}
    spec:
      securityContext: {runAsNonRoot: true, runAsUser: 1000, seccompProfile: {type: RuntimeDefault}}
      containers:
        - name: inference
          image: "nvcr.io/nvidia/inference-test:1.0"
          ports: [{name: http, containerPort: 8000}]
          securityContext:
            allowPrivilegeEscalation: false
            capabilities: {drop: [ALL]}
          resources:
            limits: {cpu: "1", memory: 1Gi}
"""
SERVICE = """apiVersion: v1
kind: Service
metadata:
  name: entrypoint
spec:
  selector: {app: inference}
  ports: [{name: http, port: 8000, targetPort: http}]
"""
CONFIGMAPS = """{{- range $i := until (int .Values.configMaps) }}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ $.Release.Name }}-config-{{ $i }}
  labels: {app: inference, index: "{{ $i }}"}
data:
  index: "{{ $i }}"
  greeting: {{ printf "hello from %d" $i | quote }}
  settings.yaml: |
    {{- toYaml $.Values.settings | nindent 4 }}
{{- end }}
"""


HOOK = """apiVersion: batch/v1
kind: Job
metadata:
  name: {{ .Release.Name }}-test
  annotations: {"helm.sh/hook": test}
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: test, image: busybox}]
"""
SUBCHART_TEMPLATE = """apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-extras
data: {message: {{ .Values.message | quote }}}
"""
#: chart shapes: the renders take different paths through Helm (see service/charts/render.py)
VARIANTS = ("plain", "hooks", "kube-version", "subchart")


def write_bench_chart(root: Path, version: str, variant: str = "plain") -> Path:
    """A chart rendering OBJECTS objects (a Deployment, a Service and ConfigMaps), plus
    per variant a test hook, a kubeVersion constraint, or a subchart with one of them."""
    chart = root / f"{CHART}-{version}" / CHART
    (chart / "templates").mkdir(parents=True)
    meta: dict[str, Any] = {
        "apiVersion": "v2",
        "name": CHART,
        "version": version,
        "type": "application",
    }
    if variant == "kube-version":
        meta["kubeVersion"] = ">=1.20.0-0"
    if variant == "subchart":
        meta["dependencies"] = [{"name": "extras", "version": "0.1.0"}]
        sub = chart / "charts" / "extras"
        (sub / "templates").mkdir(parents=True)
        (sub / "Chart.yaml").write_text(
            yaml.safe_dump({"apiVersion": "v2", "name": "extras", "version": "0.1.0"})
        )
        (sub / "values.yaml").write_text("message: hello\n")
        (sub / "templates" / "configmap.yaml").write_text(SUBCHART_TEMPLATE)
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta))
    values = {
        # the subchart's object keeps the total at OBJECTS, the limit
        "configMaps": OBJECTS - (3 if variant == "subchart" else 2),
        "settings": {"threads": 4, "models": [f"model-{i}" for i in range(8)], "debug": False},
    }
    (chart / "values.yaml").write_text(yaml.safe_dump(values))
    (chart / "templates" / "deployment.yaml").write_text(DEPLOYMENT)
    (chart / "templates" / "service.yaml").write_text(SERVICE)
    (chart / "templates" / "configmaps.yaml").write_text(CONFIGMAPS)
    if variant == "hooks":
        (chart / "templates" / "tests" / "test.yaml").parent.mkdir()
        (chart / "templates" / "tests" / "test.yaml").write_text(HOOK)
    return chart


def direct_pull_and_render(
    server: RegistryServer, version: str, workdir: Path, *, engine_only: bool = False
) -> int:
    """The baseline: oras pull of the manifest and chart blob, then helm_python render."""
    registry = oras.provider.Registry(hostname=server.host, insecure=True)
    target = f"{server.host}/{NAMESPACE}/{CHART}:{version}"
    manifest = registry.get_manifest(target)
    layer = manifest["layers"][0]["digest"]
    archive = workdir / f"{CHART}-{version}-{time.monotonic_ns()}.tgz"
    registry.download_blob(target, layer, str(archive))
    with (
        helm_python.Chart.load(archive) as chart,
        helm_python.Config(storage_driver="memory", namespace="nvcf-validation") as config,
    ):
        if engine_only:
            files = chart.render(None, name="mini-service", namespace="nvcf-validation")
            return sum(
                text.count("\nkind: ") + text.startswith("kind: ") for text in files.values()
            )
        release = config.install(
            chart, "mini-service", namespace="nvcf-validation", dry_run="client"
        )
        manifest_text = str(release.get("manifest") or "")
    return sum(1 for line in manifest_text.splitlines() if line.startswith("kind: "))


async def create(client: httpx.AsyncClient, url: str, n: int) -> float:
    body = {
        "name": f"bench-{n}",
        "inferenceUrl": "/v2/models/m/infer",
        "inferencePort": 8000,
        "helmChart": url,
        "helmChartServiceName": "entrypoint",
    }
    start = time.perf_counter()
    resp = await client.post("/v2/nvcf/functions", json=body)
    elapsed = time.perf_counter() - start
    if resp.status_code != 200:
        raise RuntimeError(f"create failed: {resp.status_code} {resp.text[:2000]}")
    return elapsed


async def run(reps: int, variant: str = "plain") -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="nvcf-bench-charts-"))
    server = start_registry(tmp / "registry")
    try:
        versions = [f"1.0.{i}" for i in range(reps + 1)]
        for version in versions:
            push_chart(
                server,
                write_bench_chart(tmp / "src", version, variant),
                NAMESPACE,
                workdir=tmp / "push",
            )
        settings = Settings(
            data_dir=tmp / "data",
            bootstrap_api_key=KEY,
            registry_allowlist=server.host,
            insecure_registries=server.host,
            _env_file=None,
        )  # type: ignore[call-arg]
        app = create_app(settings)
        async with (
            LifespanManager(app) as manager,
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=manager.app),
                base_url="http://nvcf.bench",
                headers={"Authorization": f"Bearer {KEY}"},
                timeout=120,
            ) as client,
        ):
            url = f"oci://{server.host}/{NAMESPACE}/{CHART}-%s.tgz"
            # warm-up: worker processes, database, connection pools (not measured)
            await create(client, url % versions[0], 0)
            await asyncio.to_thread(direct_pull_and_render, server, versions[0], tmp)
            first: list[float] = []
            second: list[float] = []
            direct: list[float] = []
            engine: list[float] = []
            rendered = 0
            for i, version in enumerate(versions[1:], start=1):
                start = time.perf_counter()
                rendered = await asyncio.to_thread(direct_pull_and_render, server, version, tmp)
                direct.append(time.perf_counter() - start)
                start = time.perf_counter()
                await asyncio.to_thread(
                    direct_pull_and_render, server, version, tmp, engine_only=True
                )
                engine.append(time.perf_counter() - start)
                first.append(await create(client, url % version, 2 * i))
                second.append(await create(client, url % version, 2 * i + 1))
        return {
            "objects": rendered,
            "reps": reps,
            "first": first,
            "second": second,
            "direct": direct,
            "engine": engine,
        }
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    parser.add_argument(
        "--variant",
        choices=VARIANTS,
        default="plain",
        help="chart shape (the targets are set for plain; the others show the other paths)",
    )
    args = parser.parse_args()
    figures = asyncio.run(run(args.reps, args.variant))
    first = statistics.median(figures["first"])
    second = statistics.median(figures["second"])
    direct = statistics.median(figures["direct"])
    engine = statistics.median(figures["engine"])
    ms = 1000.0
    print(
        f"chart ({args.variant}): {figures['objects']} rendered objects, "
        f"{figures['reps']} repetitions (medians)"
    )
    print(f"  direct oras pull + helm_python render : {direct * ms:8.1f} ms")
    print(f"  direct oras pull + helm engine only   : {engine * ms:8.1f} ms  (context)")
    print(f"  API create, cold chart cache          : {first * ms:8.1f} ms")
    print(f"  API create, same chart again (cached) : {second * ms:8.1f} ms")
    ratio_a = first / direct
    ratio_b = second / first
    verdict_a = "ok" if ratio_a <= 1.3 else "ABOVE TARGET"
    verdict_b = "ok" if ratio_b <= 0.3 else "ABOVE TARGET"
    print(f"(a) API create / direct pull+render = {ratio_a:.2f}  (target <= 1.3: {verdict_a})")
    print(f"(b) cached create / first create    = {ratio_b:.2f}  (target <= 0.3: {verdict_b})")
    print(f"    API create / direct engine only = {first / engine:.2f}  (context, no target)")
    if args.json:
        print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
