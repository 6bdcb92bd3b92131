"""`nvcf asset upload|list|get|delete` and `nvcf invoke --asset ... --output-file` against a
real server whose simulated cluster forwards to a real worker process (reading its assets,
writing large outputs, reporting progress)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.api import CONTAINER_FN
from tests.support.app import ADMIN_KEY
from tests.support.client_cli import CLIENT_VARS, Nvcf, served
from tests.support.file_worker import FileWorker, pattern
from tests.support.invocation import write_catalog


@pytest.fixture(scope="module")
def worker() -> Iterator[FileWorker]:
    process = FileWorker()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, worker: FileWorker) -> Iterator[str]:
    catalog = write_catalog(tmp_path_factory.mktemp("catalog"), upstream=worker.url)
    with served(tmp_path_factory.mktemp("server"), NVCF_CLUSTERS_FILE=str(catalog)) as url:
        yield url


@pytest.fixture(scope="module")
def function(server: str) -> dict[str, Any]:
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=f"{server}/v2/nvcf", headers=auth, timeout=60) as api:
        fn = api.post("/functions", json=CONTAINER_FN).json()["function"]
        spec = {"gpu": "H100", "backend": "inv", "minInstances": 1, "maxInstances": 1}
        path = f"/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
        assert api.post(path, json={"deploymentSpecifications": [spec]}).status_code == 200
        for _ in range(1200):
            got = api.get(f"/functions/{fn['id']}/versions/{fn['versionId']}").json()
            if got["function"]["status"] == "ACTIVE":
                return dict(fn)
            time.sleep(0.05)
    raise AssertionError("not ACTIVE")


@pytest.fixture
def nvcf(server: str, tmp_path: Path) -> Nvcf:
    return Nvcf(server, tmp_path / "config")


def test_upload_list_get_download_delete(nvcf: Nvcf, tmp_path: Path) -> None:
    source = tmp_path / "photo.png"
    source.write_bytes(pattern(300_000))
    done = nvcf("asset", "upload", str(source))
    assert done.exit_code == 0, done.stderr
    asset_id = done.stdout.strip()
    listed = nvcf.json("asset", "list")
    assert asset_id in [a["assetId"] for a in listed]
    got = nvcf.json("asset", "get", asset_id, "--download", str(tmp_path / "back.png"))
    assert got["contentType"] == "image/png" and got["description"] == "photo.png"
    assert (tmp_path / "back.png").read_bytes() == source.read_bytes()
    assert nvcf("asset", "delete", asset_id).exit_code == 0
    missing = nvcf("asset", "get", asset_id)
    assert missing.exit_code == 1 and "404" in missing.stderr


def test_invoke_with_an_asset(nvcf: Nvcf, function: dict[str, Any], tmp_path: Path) -> None:
    source = tmp_path / "input.bin"
    data = pattern(2 * 1024 * 1024)
    source.write_bytes(data)
    answered = nvcf.json("invoke", function["id"], "--asset", str(source))
    assert answered["status"] == 200
    (report,) = answered["body"]["assets"].values()
    assert report == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_invoke_saves_a_large_result(nvcf: Nvcf, function: dict[str, Any], tmp_path: Path) -> None:
    target = tmp_path / "result.zip"
    size = 3 * 1024 * 1024
    done = nvcf.json(
        "invoke",
        function["id"],
        "-H",
        f"X-Worker-Mode: output:{size}",
        "--output-file",
        str(target),
    )
    assert done["status"] == 302 and done["saved"] == str(target)
    assert zipfile.ZipFile(target).read("out/frames.bin") == pattern(size)
    # without --output-file: the URL is printed
    shown = nvcf("invoke", function["id"], "-H", f"X-Worker-Mode: output:{size}")
    assert shown.exit_code == 0 and "/storage/results/" in shown.stdout


def test_invoke_shows_progress_while_polling(
    nvcf: Nvcf, function: dict[str, Any], tmp_path: Path
) -> None:
    """The command as its own process: each step of the worker is released only once the
    command has shown the one before (its stderr read line by line)."""
    control = tmp_path / "control"
    control.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in CLIENT_VARS}
    env.update({k: v for k, v in nvcf.base_env().items() if v is not None})
    args = ["invoke", function["id"], "--poll-seconds", "1", "-H", "X-Worker-Mode: progress"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.client_cli", *args, "-H", f"X-Control-Dir: {control}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.stderr is not None
    shown: list[str] = []
    steps = {"0%": "50", "50%": "100", "100%": "done"}
    for line in proc.stderr:
        for percent, step in steps.items():
            if line.rstrip().endswith(f", {percent}") and percent not in shown:
                shown.append(percent)
                (control / step).touch()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert shown == ["0%", "50%", "100%"]
    assert '"finished": true' in out
