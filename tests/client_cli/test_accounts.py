"""`nvcf account list|get|update|suspend|resume` against a real server, with the operator's
key; a tenant's key is refused (exit 1, the 403)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.app import ADMIN_KEY
from tests.support.client_cli import Nvcf


def tenant_key(server: str, account: str) -> str:
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=f"{server}/v2/nvcf", headers=auth, timeout=60) as api:
        assert api.post(f"/accounts/{account}", json={"name": account}).status_code == 200
        resp = api.post("/api-keys", json={"scopes": ["list_functions"], "ncaId": account})
        assert resp.status_code == 200, resp.text
        return str(resp.json()["apiKey"]["key"])


def test_list_get_update_suspend_resume(server: str, tmp_path: Path) -> None:
    nvcf = Nvcf(server, tmp_path / "config")
    key = tenant_key(server, "team-cli")
    tenant = Nvcf(server, tmp_path / "tenant", env={"NVCF_API_KEY": key})

    assert "team-cli" in [a["ncaId"] for a in nvcf.json("account", "list")]
    before = nvcf.json("account", "get", "team-cli")
    updated = nvcf.json("account", "update", "team-cli", "--max-functions", "3")
    assert updated == {**before, "maxFunctionsAllowed": 3}
    flags = {
        "--max-tasks-running": ("maxTasksRunningAllowed", 4),
        "--rate-limit-per-second": ("rateLimitPerSecond", 0.5),
        "--rate-limit-burst": ("rateLimitBurst", 20),
        "--input-token-rate-limit": ("accountInputTokenRateLimit", "1000-M,90000-MO"),
        "--output-token-rate-limit": ("accountOutputTokenRateLimit", "500-H"),
    }
    args = [str(a) for flag, (_, value) in flags.items() for a in (flag, value)]
    limited = nvcf.json("account", "update", "team-cli", *args)
    assert limited == {**updated, **dict(flags.values())}

    suspended = nvcf.json("account", "suspend", "team-cli", "--reason", "unpaid")
    assert suspended["suspended"] is True and suspended["suspendedReason"] == "unpaid"
    refused = tenant("function", "list")
    assert refused.exit_code == 1
    assert "account 'team-cli' is suspended: unpaid" in refused.stderr

    assert nvcf.json("account", "resume", "team-cli")["suspended"] is False
    assert tenant("function", "list").exit_code == 0

    # the operator routes refuse a tenant's key
    denied = tenant("account", "list")
    assert denied.exit_code == 1 and "403" in denied.stderr
    bad = nvcf("account", "update", "team-cli", "--max-telemetries", "51")
    assert bad.exit_code == 1 and "maxTelemetriesAllowed" in bad.stderr
    bad = nvcf("account", "update", "team-cli", "--output-token-rate-limit", "5-Y")
    assert bad.exit_code == 1 and "accountOutputTokenRateLimit" in bad.stderr
