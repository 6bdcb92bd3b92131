"""`nvcf-server worker-utils` as its own process, in front of a worker process (a function's
pod) or over a task's files (a task's pod), for tests."""

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
        worker_port = worker_url.rsplit(":", 1)[1]
        self.mount = mount
        self._start("--worker-port", worker_port, "--mount", str(mount), *extra)

    @classmethod
    def for_task(cls, progress_file: Path, results_dir: Path, *extra: str) -> Sidecar:
        """The sidecar of a task's pod, serving these paths."""
        sidecar = cls.__new__(cls)
        sidecar.mount = results_dir
        sidecar._start(
            "--task-progress-file",
            str(progress_file),
            "--task-results-dir",
            str(results_dir),
            *extra,
        )
        return sidecar

    def _start(self, *args: str) -> None:
        self.port = free_port()
        command = [sys.executable, "-m", "service.cli", "worker-utils", "--host", "127.0.0.1"]
        self.process = subprocess.Popen(
            [*command, "--port", str(self.port), *args],
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
