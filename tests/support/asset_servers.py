"""Helpers of the tests that run real server processes with assets: the admin key's header,
fast reconciling, a deployed container function, and `curl` as a caller without a key."""

from __future__ import annotations

import subprocess
import time
from typing import Any

import httpx

from tests.support.api import CONTAINER_FN
from tests.support.app import ADMIN_KEY

AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
FAST = {"NVCF_RECONCILE_INTERVAL": "0.05", "NVCF_RATE_LIMIT_PER_SECOND": "0"}
SECRETS_KEY = "cmVwbGljYXMtc2hhcmUtdGhpcy1zZWNyZXRzLWtleSE="  # a Fernet key


def deploy(api: httpx.Client) -> dict[str, Any]:
    fn = api.post("/functions", json=CONTAINER_FN).json()["function"]
    spec = {"gpu": "H100", "backend": "inv", "minInstances": 1, "maxInstances": 1}
    deployment = f"/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
    assert api.post(deployment, json={"deploymentSpecifications": [spec]}).status_code == 200
    for _ in range(1200):
        status = api.get(f"/functions/{fn['id']}/versions/{fn['versionId']}")
        if status.json()["function"]["status"] == "ACTIVE":
            return dict(fn)
        time.sleep(0.05)
    raise AssertionError("the function did not become ACTIVE")


def curl(*args: str) -> None:
    subprocess.run(["curl", "--fail", "--silent", "--show-error", *args], check=True, timeout=120)
