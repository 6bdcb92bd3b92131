"""`nvcf-server worker-utils` as its own process, in front of a worker process, for tests."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support.server import free_port

ROOT = Path(__file__).resolve().parents[2]


class Sidecar:
    """`nvcf-server worker-utils` as its own process."""

    def __init__(self, worker_url: str, mount: Path, *extra: str) -> None:
        self.port = free_port()
        self.mount = mount
        worker_port = worker_url.rsplit(":", 1)[1]
        command = [sys.executable, "-m", "service.cli", "worker-utils", "--host", "127.0.0.1"]
        command += ["--port", str(self.port), "--worker-port", worker_port, "--mount", str(mount)]
        self.process = subprocess.Popen(
            [*command, *extra],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                assert self.process.poll() is None, "the sidecar exited"
                time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
