"""`nvcf usage` against a real server process: a function deployed and invoked shows its
GPU-hours and invocations by function, as a table, JSON and CSV; a tenant is refused another
account's usage (exit 1, the 403); a bad grouping is a usage error (exit 2)."""

from __future__ import annotations

import csv
import io
import time
from pathlib import Path

import httpx

from tests.support.app import ADMIN_KEY
from tests.support.client_cli import Nvcf

ECHO = ("--image", "nvcr.io/acme/echo:1.0", "--inference-url", "/echo", "--inference-port", "8000")
H100 = ("--gpu", "H100", "--instance-type", "NCP.GPU.H100_1x")


def tenant_key(server: str, account: str) -> str:
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=f"{server}/v2/nvcf", headers=auth, timeout=60) as api:
        assert api.post(f"/accounts/{account}", json={"name": account}).status_code == 200
        resp = api.post("/api-keys", json={"scopes": ["list_functions"], "ncaId": account})
        assert resp.status_code == 200, resp.text
        return str(resp.json()["apiKey"]["key"])


def test_usage_by_function_as_table_json_and_csv(server: str, tmp_path: Path) -> None:
    nvcf = Nvcf(server, tmp_path / "config")
    fn = nvcf.json("function", "create", "--name", "metered", *ECHO)["function"]
    fid, vid = fn["id"], fn["versionId"]
    assert nvcf("deploy", fid, vid, *H100, "--min", "1", "--wait").exit_code == 0
    for _ in range(3):
        assert nvcf("invoke", fid, "--version", vid, "--data", "{}").exit_code == 0

    def mine() -> dict[str, object] | None:
        body = nvcf.json("usage", "--since", "1h", "--by", "function")
        rows = [r for r in body["usage"] if r["functionId"] == fid]
        return rows[0] if rows and rows[0]["invocations"] == 3 else None

    row = mine()
    for _ in range(100):  # the replica adds its counts every 0.1 s
        if row is not None:
            break
        time.sleep(0.1)
        row = mine()
    assert row is not None and row["gpuSeconds"] > 0  # type: ignore[operator]

    shown = nvcf("usage", "--since", "1h")
    assert shown.exit_code == 0 and fid in shown.stdout and "GPU-HOURS" in shown.stdout
    exported = nvcf("usage", "--since", "1h", "--csv")
    assert exported.exit_code == 0
    lines = {r["functionId"]: r for r in csv.DictReader(io.StringIO(exported.stdout))}
    assert lines[fid]["invocations"] == "3"


def test_a_tenant_is_refused_another_account_and_a_bad_grouping_is_a_usage_error(
    server: str, tmp_path: Path
) -> None:
    tenant = Nvcf(server, tmp_path / "t", env={"NVCF_API_KEY": tenant_key(server, "team-u")})
    assert tenant.json("usage")["account"] == "team-u"
    denied = tenant("usage", "--account", "someone-else")
    assert denied.exit_code == 1 and "403" in denied.stderr
    bad = tenant("usage", "--by", "colour")
    assert bad.exit_code == 2 and "--by must be one of" in bad.stderr
    malformed = tenant("usage", "--since", "last week")
    assert malformed.exit_code == 1 and "since" in malformed.stderr
