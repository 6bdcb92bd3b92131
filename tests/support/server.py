"""Run the real server process (`python -m service.cli serve`) for tests that need one."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support.app import ADMIN_KEY


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(
    data_dir: Path, database_url: str, port: int, command: str = "serve", **env: str
) -> subprocess.Popen[bytes]:
    """Start the server (`command`: serve, or invoke for the invocation plane alone) and wait
    until `/health` answers; its output goes to <command>.log."""
    full_env = {
        **os.environ,
        "NVCF_DATA_DIR": str(data_dir),
        "NVCF_DATABASE_URL": database_url,
        "NVCF_BOOTSTRAP_API_KEY": ADMIN_KEY,
        **env,
    }
    log = data_dir / ("server.log" if command == "serve" else f"{command}.log")
    data_dir.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", command, "--port", str(port)],
            env=full_env,
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


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
