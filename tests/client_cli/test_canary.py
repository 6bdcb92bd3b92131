"""`nvcf canary ...` against a real server: a release started from a plan file and shown with
its step, weights and figures; paused, resumed, promoted with `--wait` (exit 0); another
aborted with `--wait` (exit 3); `--wait` past its timeout exits 4; a bad plan refused naming
the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.client_cli import Nvcf

ECHO = ("--image", "nvcr.io/acme/echo:1.0", "--inference-url", "/echo", "--inference-port", "8000")
H100 = ("--gpu", "H100", "--instance-type", "NCP.GPU.H100_1x", "--min", "1", "--wait")


@pytest.fixture
def nvcf(server: str, tmp_path: Path) -> Nvcf:
    return Nvcf(server, tmp_path / "config")


def test_start_status_pause_resume_promote_and_abort(nvcf: Nvcf, tmp_path: Path) -> None:
    fn = nvcf.json("function", "create", "--name", "canaried", *ECHO)["function"]
    fid, stable = fn["id"], fn["versionId"]
    assert nvcf("deploy", fid, stable, *H100).exit_code == 0
    canary = nvcf.json("function", "create", "--name", "canaried", "--function-id", fid, *ECHO)[
        "function"
    ]["versionId"]
    assert nvcf("deploy", fid, canary, *H100).exit_code == 0
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps({"steps": [{"weight": 10, "seconds": 600}, {"weight": 50, "seconds": 600}]})
    )

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"steps": []}))
    refused = nvcf("canary", "start", fid, "--version", canary, "--plan", str(bad))
    assert refused.exit_code == 1 and "plan.steps" in refused.stderr

    started = nvcf("canary", "start", fid, "--version", canary, "--plan", str(plan))
    assert started.exit_code == 0, started.stderr
    assert "RUNNING" in started.stdout and "1 of 2" in started.stdout
    assert f"{canary} at 10%" in started.stdout and f"{stable} at 90%" in started.stdout
    shown = nvcf.json("canary", "status", fid)
    assert (shown["phase"], shown["weight"], shown["analysis"]["canary"]["requests"]) == (
        "RUNNING",
        10,
        0,
    )
    timed = nvcf("canary", "status", fid, "--wait", "--timeout", "0")
    assert timed.exit_code == 4 and "the release is RUNNING" in timed.stderr
    assert nvcf.json("canary", "pause", fid)["phase"] == "PAUSED"
    assert nvcf.json("canary", "resume", fid)["phase"] == "RUNNING"
    promoted = nvcf("canary", "promote", fid, "--wait")
    assert promoted.exit_code == 0, promoted.stderr
    assert "PROMOTED" in promoted.stdout
    assert nvcf.json("traffic", "get", fid)["traffic"] == [{"versionId": canary, "weight": 100}]

    # the other way round, aborted: --wait says it did not promote
    again = nvcf("canary", "start", fid, "--version", stable, "--plan", str(plan))
    assert again.exit_code == 0, again.stderr
    aborted = nvcf("canary", "abort", fid, "--wait")
    assert aborted.exit_code == 3 and "ABORTED" in aborted.stdout
