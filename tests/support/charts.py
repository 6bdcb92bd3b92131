"""Chart test helpers shared by several test modules: the corpus charts packaged as archives
and validated, the registry accounts of the chart fixtures (tests/charts/conftest.py), pushing
a chart, and the exact findings of each failing corpus chart."""

from __future__ import annotations

import hashlib
import shutil
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from service.charts.findings import Finding, PipelineResult
from service.charts.policy import ValidationPolicy
from service.charts.render import (
    DEFAULT_KUBE_VERSION,
    PLACEHOLDER_NAMESPACE,
    ChartRenderer,
    ChartRenderError,
    RenderOutput,
    check_rendered,
    render_checked,
)
from tests.support.registry import RegistryServer

CORPUS = Path(__file__).parents[1] / "charts" / "corpus"
BASE = "inference-ok"

ArchiveFactory = Callable[..., Path]


def build_chart(name: str, workdir: Path, files: dict[str, str] | None = None) -> Path:
    """Package corpus chart `name` (an overlay on inference-ok unless it has a Chart.yaml)."""
    import helm_python  # the Helm engine loads only in the tests that package charts

    source = CORPUS / name
    chart_dir = workdir / "src" / name
    if (source / "Chart.yaml").exists():
        shutil.copytree(source, chart_dir)
    else:
        shutil.copytree(CORPUS / BASE, chart_dir)
        shutil.copytree(source, chart_dir, dirs_exist_ok=True)
    for relative, text in (files or {}).items():
        (chart_dir / relative).parent.mkdir(parents=True, exist_ok=True)
        (chart_dir / relative).write_text(text)
    return Path(helm_python.package(chart_dir, destination=workdir))


async def validate_chart(
    renderer: ChartRenderer,
    archive: Path,
    *,
    values: dict[str, Any] | None = None,
    service_name: str,
    inference_port: int,
    policy: ValidationPolicy | None = None,
    enforce_security: bool = False,
    instance_type_nodes: int | None = None,
    gpus_per_node: int | None = None,
    nvlink: bool = False,
    namespace: str = PLACEHOLDER_NAMESPACE,
    kube_version: str = DEFAULT_KUBE_VERSION,
    api_versions: list[str] | None = None,
) -> PipelineResult:
    """Render `archive` and run the whole pipeline; Helm's refusals become error findings.

    A render failure (template error, `fail`, `required`, schema violation, library chart,
    time or memory limit) is one error finding whose rule is `ChartRenderError.rule`.
    """

    async def render(engine: bool) -> RenderOutput:
        return await renderer.render(
            archive,
            values=values,
            namespace=namespace,
            kube_version=kube_version,
            api_versions=api_versions,
            engine=engine,
        )

    def check(output: RenderOutput) -> PipelineResult:
        return check_rendered(
            output,
            service_name=service_name,
            inference_port=inference_port,
            policy=policy,
            enforce_security=enforce_security,
            instance_type_nodes=instance_type_nodes,
            gpus_per_node=gpus_per_node,
            nvlink=nvlink,
        )

    try:
        return await render_checked(render, check)
    except ChartRenderError as exc:
        result = PipelineResult()
        result.add(Finding(exc.rule, "error", None, None, exc.detail))
        return result


async def validate(
    renderer: ChartRenderer, archive: Path, values: dict[str, Any] | None = None, **kw: Any
) -> PipelineResult:
    kw.setdefault("service_name", "entrypoint")
    kw.setdefault("inference_port", 8000)
    return await validate_chart(renderer, archive, values=values, **kw)


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in objects}


REGISTRY_USER = ("chart-puller", "s3cret-Pa55word")
#: token-auth registries: this account may pull and push every repository ...
TOKEN_USER = ("token-puller", "t0ken-Pa55word")
#: ... and this one has valid credentials but no repository access at all
TOKEN_OUTSIDER = ("token-outsider", "0utsider-Pa55word")


@dataclass(frozen=True)
class PushedChart:
    """A chart pushed with Helm to `oci://<host>/<namespace>/<name>:<version>`."""

    host: str
    namespace: str
    name: str
    version: str
    digest: str  # manifest digest
    layer_digest: str  # sha256 of the chart archive (the Helm layer blob)

    @property
    def file_url(self) -> str:
        """The NVCF documentation form `oci://…/<name>-<version>.tgz`."""
        return f"oci://{self.host}/{self.namespace}/{self.name}-{self.version}.tgz"

    @property
    def ref_url(self) -> str:
        """The plain OCI reference form `oci://…/<name>:<version>`."""
        return f"oci://{self.host}/{self.namespace}/{self.name}:{self.version}"


def push_archive(
    server: RegistryServer, archive: Path, namespace: str, *, workdir: Path
) -> PushedChart:
    """Push a packaged chart with the Helm engine (as users do) and describe it."""
    import helm_python

    workdir.mkdir(parents=True, exist_ok=True)
    client = helm_python.RegistryClient(
        plain_http=True, credentials_file=workdir / "registry-credentials.json"
    )
    if server.username is not None and server.password is not None:
        client.login(server.host, server.username, server.password, plain_http=True)
    client.push(archive, f"oci://{server.host}/{namespace}")
    with tarfile.open(archive, "r:gz") as tar:
        member = next(
            m for m in tar.getmembers() if m.name.count("/") == 1 and m.name.endswith("/Chart.yaml")
        )
        stream = tar.extractfile(member)
        assert stream is not None
        meta = yaml.safe_load(stream.read())
    name, version = str(meta["name"]), str(meta["version"])
    resolved = client.resolve(f"oci://{server.host}/{namespace}/{name}:{version}")
    digest = resolved.get("digest")
    if not isinstance(digest, str):
        raise RuntimeError(f"helm could not resolve the chart it pushed: {resolved}")
    layer = "sha256:" + hashlib.sha256(archive.read_bytes()).hexdigest()
    return PushedChart(server.host, namespace, name, version, digest, layer)


PushCorpus = Callable[..., PushedChart]


def flat_chart(workdir: Path, overlay: str | None, files: dict[str, str | None]) -> Path:
    """Package inference-ok (plus corpus `overlay`) without its subchart, plus `files`
    (None deletes a file)."""
    import helm_python

    chart = workdir / "src" / "chart"
    shutil.copytree(CORPUS / BASE, chart)
    if overlay is not None:
        shutil.copytree(CORPUS / overlay, chart, dirs_exist_ok=True)
    shutil.rmtree(chart / "charts")
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    meta.pop("dependencies")
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta))
    for relative, text in files.items():
        if text is None:
            (chart / relative).unlink()
            continue
        (chart / relative).parent.mkdir(parents=True, exist_ok=True)
        (chart / relative).write_text(text)
    return Path(helm_python.package(chart, destination=workdir))


HOOK = (
    "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {name}\n"
    "  annotations: {{helm.sh/hook: {events}}}\n"
    "spec: {{template: {{spec: {{restartPolicy: Never, containers: []}}}}}}\n"
)

#: a finding as (rule, severity, object, field)
Row = tuple[str, str, str | None, str | None]


POD = "v1/Pod/insecure"
C0 = "spec.containers[0]"
C1 = "spec.containers[1]"
RO_ROOT = "securityContext.readOnlyRootFilesystem"
W = "warning"

#: the exact findings of each failing corpus chart (tests/charts/corpus/<name>)
FAILING: dict[str, list[Row]] = {
    "kind-not-allowed": [("kind-not-allowed", "error", None, "kind")],
    "service-type": [("service-type", "error", "v1/Service/exposed", "spec.type")],
    "volume-type": [
        ("volume-type", "error", "v1/Pod/volumes", "spec.volumes[2].hostPath"),
        (
            "volume-type",
            "error",
            "v1/Pod/volumes",
            "spec.volumes[3].projected.sources[1].serviceAccountToken",
        ),
    ],
    "service-not-found": [("service-not-found", "error", None, "helmChartServiceName")],
    "service-port": [("service-port", "error", "v1/Service/entrypoint", "spec.ports")],
    "service-target": [
        ("service-target", "error", "v1/Service/entrypoint", "spec.ports[0].targetPort")
    ],
    "missing-name": [("missing-name", "error", "v1/ConfigMap/?", "metadata.name")],
    "too-many-objects": [("too-many-objects", "error", None, None)],
    "workload-config-bad": [
        (
            "workload-config",
            "error",
            "v1/ConfigMap/nvcf-workload-config",
            "data.config.yaml.featureFlags",
        )
    ],
    "security": [
        ("security-host-namespaces", W, POD, "spec.hostNetwork"),
        ("security-host-namespaces", W, POD, "spec.hostPID"),
        ("security-host-namespaces", W, POD, "spec.hostIPC"),
        ("security-service-account-token", W, POD, "spec.automountServiceAccountToken"),
        ("security-sysctls", W, POD, "spec.securityContext.sysctls[1].name"),
        ("security-host-ports", W, POD, f"{C0}.ports[0].hostPort"),
        ("security-privileged", W, POD, f"{C0}.securityContext.privileged"),
        ("security-privilege-escalation", W, POD, f"{C0}.securityContext.allowPrivilegeEscalation"),
        ("security-capabilities", W, POD, f"{C0}.securityContext.capabilities.drop"),
        ("security-capabilities", W, POD, f"{C0}.securityContext.capabilities.add"),
        ("security-run-as-non-root", W, POD, f"{C0}.securityContext.runAsNonRoot"),
        ("security-run-as-user", W, POD, "spec.securityContext.runAsUser"),
        ("security-seccomp", W, POD, f"{C0}.securityContext.seccompProfile.type"),
        ("security-apparmor", W, POD, f"{C0}.securityContext.appArmorProfile.type"),
        (
            "security-apparmor",
            W,
            POD,
            "metadata.annotations.container.apparmor.security.beta.kubernetes.io/root",
        ),
        ("security-selinux", W, POD, f"{C0}.securityContext.seLinuxOptions.type"),
        ("security-selinux", W, POD, f"{C0}.securityContext.seLinuxOptions.user"),
        ("security-proc-mount", W, POD, f"{C0}.securityContext.procMount"),
        ("security-read-only-root-filesystem", W, POD, f"{C0}.{RO_ROOT}"),
        # the second container sets nothing and inherits the pod's runAsUser: 0
        ("security-capabilities", W, POD, f"{C1}.securityContext.capabilities.drop"),
        ("security-run-as-non-root", W, POD, f"{C1}.securityContext.runAsNonRoot"),
        ("security-run-as-user", W, POD, "spec.securityContext.runAsUser"),
        ("security-seccomp", W, POD, f"{C1}.securityContext.seccompProfile.type"),
        ("security-read-only-root-filesystem", W, POD, f"{C1}.{RO_ROOT}"),
        ("resources-limits", W, POD, f"{C1}.resources.limits"),
    ],
}
