"""`nvcf logs` and the last lines of a failed deployment, against a real server process with
corpus charts in a local registry: a healthy function's log read; a crash-looping helm
function (`sim.nvcf.io/fault` in its values) whose `deploy --wait` prints the failing
container's last lines (its stack trace), shown again by `status` and by `logs` after the
instance was torn down."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support.charts import PushCorpus
from tests.support.client_cli import Nvcf
from tests.support.registry import RegistryServer

pytestmark = pytest.mark.registry

ECHO = ("--image", "nvcr.io/acme/echo:1.0", "--inference-url", "/echo", "--inference-port", "8000")
H100 = ("--gpu", "H100", "--instance-type", "NCP.GPU.H100_1x")


@pytest.fixture
def nvcf(server: str, tmp_path: Path) -> Nvcf:
    return Nvcf(server, tmp_path / "config")


def test_logs_of_a_running_deployment(nvcf: Nvcf) -> None:
    fn = nvcf.json("function", "create", "--name", "logged", *ECHO)["function"]
    fid, vid = fn["id"], fn["versionId"]
    assert nvcf("deploy", fid, vid, *H100, "--min", "1", "--wait").exit_code == 0
    dep = nvcf.json("status", fid, vid)["deployment"]
    [inst] = dep["instances"]

    one = nvcf("logs", dep["deploymentId"], inst["instanceId"], "--tail", "50", "--since", "10m")
    assert one.exit_code == 0, one.stderr
    assert "/inference] INFO     Starting inference" in one.stdout  # as printed, no markup

    everyone = nvcf("logs", dep["deploymentId"], "-c", "inference", "--tail", "1")
    assert everyone.stdout.startswith(f"[{inst['instanceId']}] ")

    bad = nvcf("logs", dep["deploymentId"], "--since", "soon")
    assert bad.exit_code == 2 and "--since 'soon'" in bad.stderr
    refused = nvcf("logs", dep["deploymentId"], "-c", "Not_A_Name")
    assert refused.exit_code != 0 and "container" in refused.stderr
    assert nvcf("undeploy", fid, vid, "--wait").exit_code == 0


def test_deploy_wait_prints_the_failing_containers_last_lines(
    nvcf: Nvcf, anon_registry: RegistryServer, push_corpus: PushCorpus, tmp_path: Path
) -> None:
    chart = push_corpus(anon_registry, "sim-workload").file_url
    fn = nvcf.json(
        "function", "create", "--name", "crashing", "--helm-chart", chart,
        "--helm-chart-service", "entrypoint", "--inference-url", "/v2/models/m/infer",
        "--inference-port", "8000",
    )["function"]  # fmt: skip
    fid, vid = fn["id"], fn["versionId"]
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"podAnnotations": {"sim.nvcf.io/fault": "CrashLoopBackOff"}}))

    done = nvcf("deploy", fid, vid, *H100, "--values", str(values), "--wait")
    assert done.exit_code == 3, (done.stdout, done.stderr)
    assert "last lines of the failed instance" in done.stdout
    assert "Traceback (most recent call last):" in done.stdout
    assert "RuntimeError: CUDA error: out of memory" in done.stdout

    status = nvcf("status", fid, vid)
    assert "Traceback (most recent call last):" in status.stdout
    dep = nvcf.json("status", fid, vid)["deployment"]
    assert any("Traceback" in line for line in dep["healthInfo"][0]["lastLogs"])

    events = nvcf.json("events", dep["deploymentId"])["events"]
    failed = next(e["instanceId"] for e in events if e.get("phase") == "Failed")
    kept = nvcf("logs", dep["deploymentId"], failed)  # torn down: the kept lines
    assert kept.exit_code == 0
    assert "RuntimeError: CUDA error: out of memory" in kept.stdout
    assert nvcf("undeploy", fid, vid, "--wait").exit_code == 0
