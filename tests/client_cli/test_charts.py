"""`nvcf chart validate` and the failure path of `deploy --wait`, with corpus charts in a real
local registry: a helm function whose values inject a fault (`sim.nvcf.io/fault`) into the
simulated pods ends in ERROR, and `--wait` exits 3 with the reason and the timeline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support.charts import PushCorpus
from tests.support.client_cli import Nvcf
from tests.support.registry import RegistryServer

pytestmark = pytest.mark.registry

INGRESS = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "Ingress",
    "metadata": {"name": "public"},
    "spec": {"rules": []},
}


@pytest.fixture
def nvcf(server: str, tmp_path: Path) -> Nvcf:
    return Nvcf(server, tmp_path / "config")


def values_file(tmp_path: Path, values: dict[str, object]) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def test_chart_validate_prints_the_findings(
    nvcf: Nvcf, anon_registry: RegistryServer, push_corpus: PushCorpus, tmp_path: Path
) -> None:
    chart = push_corpus(anon_registry, "inference-ok").file_url
    ok = nvcf("chart", "validate", chart, "--gpu", "H100", "--instance-type", "NCP.GPU.H100_1x")
    assert ok.exit_code == 0, ok.stderr
    # the chart's 3 objects and the nvcf-secrets Secret every instance gets at install
    assert "valid, 4 objects" in ok.stdout and "modified" in ok.stdout  # an info finding

    ingress = values_file(tmp_path, {"extraObjects": [INGRESS]})
    bad = nvcf("chart", "validate", chart, "--values", ingress)
    assert bad.exit_code == 3
    assert "NOT valid" in bad.stdout and "kind-not-allowed" in bad.stdout

    as_json = nvcf("chart", "validate", chart, "--values", ingress, "-o", "json")
    assert as_json.exit_code == 3
    result = json.loads(as_json.stdout)
    assert result["valid"] is False
    assert [e["rule"] for e in result["errors"]] == ["kind-not-allowed"]


def test_deploy_wait_fails_with_the_reason_of_an_injected_fault(
    nvcf: Nvcf, anon_registry: RegistryServer, push_corpus: PushCorpus, tmp_path: Path
) -> None:
    chart = push_corpus(anon_registry, "sim-workload").file_url
    fn = nvcf.json(
        "function",
        "create",
        "--name",
        "faulty",
        "--helm-chart",
        chart,
        "--helm-chart-service",
        "entrypoint",
        "--inference-url",
        "/v2/models/m/infer",
        "--inference-port",
        "8000",
    )["function"]
    fid, vid = fn["id"], fn["versionId"]
    fault = values_file(tmp_path, {"podAnnotations": {"sim.nvcf.io/fault": "ImagePullBackOff"}})

    done = nvcf(
        "deploy", fid, vid, "--gpu", "H100", "--instance-type", "NCP.GPU.H100_1x",
        "--values", fault, "--wait",
    )  # fmt: skip
    assert done.exit_code == 3, (done.stdout, done.stderr)
    assert "deployment failed:" in done.stderr and "ImagePull" in done.stderr
    assert "ImagePullIssues" in done.stdout  # the event timeline
    assert "→ ERROR" in done.stdout

    state = nvcf.json("status", fid, vid)
    assert state["function"]["status"] == "ERROR"
    assert nvcf("undeploy", fid, vid, "--wait").exit_code == 0
