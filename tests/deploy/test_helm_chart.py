"""deploy/helm/nvcf-server, rendered by the project's Helm engine (the real Helm library, as
`helm template` renders) for the value sets operators use, every object checked against the
Kubernetes OpenAPI schemas, the pod against Pod Security `restricted`, and the configuration
the pod would see read by the service's own Settings."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cryptography.fernet import Fernet

from service.auth.service import API_KEY_PREFIX
from service.charts.render import ChartRenderer, ChartRenderError
from service.clusters.catalog import check_catalog
from service.core.crypto import load_secret_box
from service.core.settings import Settings
from tests.support.charts import by_kind

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "nvcf-server"
NAMESPACE = "nvcf-system"
DB = "postgresql+psycopg://nvcf:s3cret@postgres.example:5432/nvcf"
REDIS = "redis://:hunter2@redis.example:6379/0"
#: the oldest Kubernetes the chart declares (Chart.yaml kubeVersion) and the newest with schemas
KUBE_VERSIONS = ["1.25.0", kubernetes_validate.latest_version()]

DEFAULTS: dict[str, Any] = {"database": {"url": DB}}
SCALED: dict[str, Any] = {"database": {"url": DB}, "replicaCount": 3, "redis": {"url": REDIS}}
EXISTING: dict[str, Any] = {
    "database": {"url": DB},
    "secrets": {
        "existingSecret": "ops-nvcf-keys",
        "secretsKeyKey": "fernet",
        "bootstrapApiKeyKey": "admin",
    },
}
VALUE_SETS = {"defaults": DEFAULTS, "replicas-3-redis": SCALED, "existing-secret": EXISTING}


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import helm_python

    return Path(helm_python.package(CHART, destination=tmp_path_factory.mktemp("chart")))


def render(archive: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    async def go() -> str:
        renderer = ChartRenderer(workers=1)
        try:
            output = await renderer.render(archive, values=values, namespace=NAMESPACE)
        finally:
            await renderer.aclose()
        assert not output.hook_templates and not output.crds
        return output.manifest

    return [o for o in yaml.safe_load_all(asyncio.run(go())) if o]


@pytest.fixture(scope="module")
def rendered(archive: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """Value-set name -> `Kind/name` -> object."""
    return {name: by_kind(render(archive, values)) for name, values in VALUE_SETS.items()}


def one(objects: dict[str, dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for key, o in objects.items() if key.startswith(f"{kind}/")]
    return found


def container(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (c,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert isinstance(c, dict)
    return c


def secret_data(secret: dict[str, Any]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()}


def pod_environment(
    objects: dict[str, dict[str, Any]], external: dict[str, dict[str, str]] | None = None
) -> dict[str, str]:
    """The container's environment as the kubelet would resolve it (secretKeyRefs included,
    `external` standing for Secrets the chart does not create)."""
    secrets = {
        o["metadata"]["name"]: secret_data(o) for o in objects.values() if o["kind"] == "Secret"
    }
    secrets.update(external or {})
    env: dict[str, str] = {}
    for var in container(objects)["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            if ref.get("optional") and ref["key"] not in secrets.get(ref["name"], {}):
                continue
            env[var["name"]] = secrets[ref["name"]][ref["key"]]
    return env


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_object_is_valid_for_kubernetes(
    rendered: dict[str, dict[str, dict[str, Any]]], value_set: str, kube_version: str
) -> None:
    objects = rendered[value_set]
    kinds = sorted(key.split("/")[0] for key in objects)
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Secret",
        "Service",
        "ServiceAccount",
    ]
    for key, obj in objects.items():
        try:
            kubernetes_validate.validate(obj, kube_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{key} is invalid for Kubernetes {kube_version}: {path}: {exc.message}")
        if obj["kind"] not in {"ClusterRole", "ClusterRoleBinding"}:
            assert obj["metadata"]["namespace"] == NAMESPACE, key


def test_the_schema_check_is_not_vacuous(rendered: dict[str, dict[str, dict[str, Any]]]) -> None:
    """What the check above would say of a wrongly typed field and of an unknown one."""
    deployment = one(rendered["defaults"], "Deployment")
    wrong_type = {**deployment, "spec": {**deployment["spec"], "replicas": "three"}}
    unknown = {**deployment, "spec": {**deployment["spec"], "replica": 3}}
    for bad in (wrong_type, unknown):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, KUBE_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_the_pod_meets_pod_security_restricted(
    rendered: dict[str, dict[str, dict[str, Any]]], value_set: str
) -> None:
    objects = rendered[value_set]
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001  # the Dockerfile's USER
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(key), key
    c = container(objects)
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["runAsNonRoot"] is True
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not sc.get("privileged")
    assert "runAsUser" not in sc or sc["runAsUser"] != 0
    assert all("hostPort" not in p for p in c["ports"])
    # read-only root filesystem, with emptyDirs where the server writes
    assert sc["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert all(set(v) == {"name", "emptyDir"} for v in volumes.values()), volumes
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert set(mounts) == {"/data", "/tmp"} and set(mounts.values()) <= set(volumes)
    plain = {v["name"]: v.get("value") for v in c["env"]}
    assert plain["NVCF_DATA_DIR"] == "/data"
    resources = c["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"]


def test_probes_ask_health_and_readiness_on_the_served_port(
    rendered: dict[str, dict[str, dict[str, Any]]],
) -> None:
    objects = rendered["defaults"]
    c = container(objects)
    (port,) = c["ports"]
    assert port == {"name": "http", "containerPort": 8080, "protocol": "TCP"}
    assert c["args"] == ["serve", "--host", "0.0.0.0", "--port", "8080"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/health/ready", "port": "http"}
    assert c["startupProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    # a start (migrations included) gets minutes before liveness may restart the pod
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120
    service = one(objects, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert (
        one(objects, "Deployment")["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    )


def test_defaults_generate_working_keys_that_outlive_the_release(
    rendered: dict[str, dict[str, dict[str, Any]]], tmp_path: Path
) -> None:
    objects = rendered["defaults"]
    assert one(objects, "Deployment")["spec"]["replicas"] == 1
    secret = one(objects, "Secret")
    # the generated secrets key is lost with the Secret: `helm uninstall` keeps it
    assert secret["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    data = secret_data(secret)
    assert data["database-url"] == DB and "redis-url" not in data
    fernet = Fernet(data["secrets-key"].encode())
    assert fernet.decrypt(fernet.encrypt(b"x")) == b"x"
    assert data["bootstrap-api-key"].startswith(API_KEY_PREFIX)
    assert len(data["bootstrap-api-key"]) > len(API_KEY_PREFIX) + 40
    env = pod_environment(objects)
    assert env["NVCF_SECRETS_KEY"] == data["secrets-key"]
    assert env["NVCF_BOOTSTRAP_API_KEY"] == data["bootstrap-api-key"]
    assert env["NVCF_METRICS_TOKEN"] == data["metrics-token"] and len(data["metrics-token"]) >= 32
    assert "NVCF_REDIS_URL" not in env
    # the service itself accepts the pod's configuration, keys included
    settings = settings_from(env)
    assert settings.effective_database_url == DB
    assert settings.log_format == "json"
    # the worker-utils sidecar in function pods is the chart's own image
    image = container(objects)["image"]
    assert image.startswith("nvcf-server:") and settings.worker_utils_image == image
    box = load_secret_box(settings)
    assert box.decrypt(box.encrypt("registry password")) == "registry password"


def settings_from(env: dict[str, str]) -> Settings:
    unknown = {k for k in env if k.removeprefix("NVCF_").lower() not in Settings.model_fields}
    assert unknown == set(), "the pod sets variables the service does not read"
    values: dict[str, Any] = {k.removeprefix("NVCF_").lower(): v for k, v in env.items()}
    return Settings(_env_file=None, **values)


def test_renders_are_not_the_same_keys_twice(archive: Path) -> None:
    """Generated keys are random per install (an upgrade reads the installed ones back)."""
    first = secret_data(one(by_kind(render(archive, DEFAULTS)), "Secret"))
    second = secret_data(one(by_kind(render(archive, DEFAULTS)), "Secret"))
    assert first["secrets-key"] != second["secrets-key"]
    assert first["bootstrap-api-key"] != second["bootstrap-api-key"]
    assert first["metrics-token"] != second["metrics-token"]


def test_the_service_monitor_scrapes_with_the_pods_metrics_token(archive: Path) -> None:
    """The Prometheus Operator's scrape presents the very token the pod reads, so it gets
    the per-function series (docs/telemetry.md); off by default (it needs the operator's CRD)."""
    assert not [k for k in by_kind(render(archive, DEFAULTS)) if k.startswith("ServiceMonitor/")]
    values = {
        **DEFAULTS,
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
    }
    objects = by_kind(render(archive, values))
    monitor = one(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    service = one(objects, "Service")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    credentials = endpoint["authorization"]["credentials"]
    assert endpoint["authorization"]["type"] == "Bearer"
    token = secret_data(objects[f"Secret/{credentials['name']}"])[credentials["key"]]
    env = pod_environment(objects)
    assert env["NVCF_METRICS_TOKEN"] == token
    assert settings_from(env).metrics_token is not None


def test_a_given_metrics_token_is_checked(archive: Path) -> None:
    values = {**DEFAULTS, "secrets": {"metricsToken": "m" * 40}}
    assert secret_data(one(by_kind(render(archive, values)), "Secret"))["metrics-token"] == "m" * 40
    with pytest.raises(ChartRenderError) as caught:
        render(archive, {**DEFAULTS, "secrets": {"metricsToken": "short"}})
    assert "secrets.metricsToken must be at least 32 characters" in caught.value.detail


def test_three_replicas_share_redis_counters(
    rendered: dict[str, dict[str, dict[str, Any]]],
) -> None:
    objects = rendered["replicas-3-redis"]
    assert one(objects, "Deployment")["spec"]["replicas"] == 3
    env = pod_environment(objects)
    assert env["NVCF_REDIS_URL"] == REDIS
    (redis_var,) = [v for v in container(objects)["env"] if v["name"] == "NVCF_REDIS_URL"]
    assert "value" not in redis_var  # its password stays in the Secret
    assert settings_from(env).redis_url == REDIS


def test_an_existing_secret_holds_the_keys(
    rendered: dict[str, dict[str, dict[str, Any]]],
) -> None:
    objects = rendered["existing-secret"]
    secret = one(objects, "Secret")
    assert set(secret_data(secret)) == {"database-url"}  # the chart stores no key
    assert "annotations" not in secret["metadata"]
    refs = {
        v["name"]: v["valueFrom"]["secretKeyRef"]
        for v in container(objects)["env"]
        if "valueFrom" in v
    }
    assert refs["NVCF_SECRETS_KEY"] == {"name": "ops-nvcf-keys", "key": "fernet"}
    assert refs["NVCF_BOOTSTRAP_API_KEY"] == {"name": "ops-nvcf-keys", "key": "admin"}
    assert refs["NVCF_DATABASE_URL"]["name"] == secret["metadata"]["name"]


def test_given_keys_are_stored_as_given(archive: Path) -> None:
    key = Fernet.generate_key().decode()
    values = {**DEFAULTS, "secrets": {"secretsKey": key, "bootstrapApiKey": "nvapi-ops-key"}}
    data = secret_data(one(by_kind(render(archive, values)), "Secret"))
    assert data["secrets-key"] == key and data["bootstrap-api-key"] == "nvapi-ops-key"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, "database.url is required: the URL of an external PostgreSQL database"),
        ({"database": {"url": "  "}}, "database.url is required"),
        (
            {"database": {"url": "sqlite+aiosqlite:////data/nvcf.db"}},
            "database.url must be a PostgreSQL URL",
        ),
        (
            {**DEFAULTS, "secrets": {"bootstrapApiKey": "changeme"}},
            "secrets.bootstrapApiKey must start with nvapi-",
        ),
    ],
)
def test_a_missing_or_wrong_value_fails_the_render_with_the_charts_message(
    archive: Path, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(ChartRenderError) as caught:
        render(archive, values)
    assert message in caught.value.detail


def test_a_refused_url_is_not_echoed_with_its_password(archive: Path) -> None:
    with pytest.raises(ChartRenderError) as caught:
        render(archive, {"database": {"url": "mysql://root:topsecret@db/nvcf"}})
    assert "topsecret" not in caught.value.detail and "mysql://***@db/nvcf" in caught.value.detail


def test_the_cluster_role_is_deploy_clusterrole(
    rendered: dict[str, dict[str, dict[str, Any]]],
) -> None:
    objects = rendered["defaults"]
    manifest = {
        o["kind"]: o for o in yaml.safe_load_all((ROOT / "deploy" / "clusterrole.yaml").read_text())
    }
    assert one(objects, "ClusterRole")["rules"] == manifest["ClusterRole"]["rules"]
    binding = one(objects, "ClusterRoleBinding")
    account = one(objects, "ServiceAccount")["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    ]
    assert binding["roleRef"]["name"] == one(objects, "ClusterRole")["metadata"]["name"]
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account


def test_a_cluster_catalog_is_mounted_where_the_service_reads_it(
    archive: Path, tmp_path: Path
) -> None:
    catalog = {
        "clusterGroups": [
            {
                "name": "prod",
                "clusters": [
                    {
                        "name": "local",
                        "adapter": "kubernetes",
                        "provider": "ON-PREM",
                        "region": "dc-1",
                        "nodes": [{"gpu": "H100", "gpusPerNode": 8, "count": 4}],
                        "kubernetes": {"inCluster": True},
                    }
                ],
            }
        ]
    }
    objects = by_kind(render(archive, {**DEFAULTS, "clusterCatalog": catalog}))
    for obj in objects.values():
        kubernetes_validate.validate(obj, KUBE_VERSIONS[-1], strict=True)
    config_map = one(objects, "ConfigMap")
    path = tmp_path / "clusters.yaml"
    path.write_text(config_map["data"]["clusters.yaml"])
    assert check_catalog(path) == []
    c = container(objects)
    env = pod_environment(objects)
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "catalog"]
    assert env["NVCF_CLUSTERS_FILE"] == f"{mount['mountPath']}/clusters.yaml"
    assert mount["readOnly"] is True
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "catalog"]
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]


def test_helm_lint_finds_nothing_but_information() -> None:
    import helm_python

    report = helm_python.lint(CHART, values=DEFAULTS, strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] > 1] == []  # 1: INFO (no icon)
