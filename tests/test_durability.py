"""Functions survive a restart of the real server process on the same database."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.conftest import ADMIN_KEY
from tests.support.api import CONTAINER_FN


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(data_dir: Path, database_url: str, port: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "NVCF_DATA_DIR": str(data_dir),
        "NVCF_DATABASE_URL": database_url,
        "NVCF_BOOTSTRAP_API_KEY": ADMIN_KEY,
    }
    log = data_dir / "server.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {log.read_text()}")
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("server did not start")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_functions_survive_a_restart(tmp_path: Path, database_url: str) -> None:
    port = _free_port()
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    base = f"http://127.0.0.1:{port}/v2/nvcf"
    proc = _start(tmp_path, database_url, port)
    try:
        created = httpx.post(
            f"{base}/functions",
            json={**CONTAINER_FN, "tags": ["keep"], "secrets": [{"name": "s", "value": "v"}]},
            headers=headers,
        )
        assert created.status_code == 200, created.text
    finally:
        _stop(proc)
    fn = created.json()["function"]
    proc = _start(tmp_path, database_url, port)
    try:
        got = httpx.get(f"{base}/functions/{fn['id']}/versions/{fn['versionId']}", headers=headers)
        assert got.status_code == 200
        assert got.json()["function"] == {**fn, "activeInstances": []}
    finally:
        _stop(proc)
