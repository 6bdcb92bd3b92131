"""A real Redis server for the tests that share rate-limit counters: a container where a Docker
engine answers (containers.py, chosen by services.py), else Debian's redis-server."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import services


class RedisUnavailable(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RedisServer:
    """A running server; `kind` is "local" or "containers"."""

    host: str
    port: int
    stopper: Callable[[], None] = field(repr=False)
    kind: services.Kind = "local"

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def stop(self) -> None:
        self.stopper()


def _terminate(process: subprocess.Popen[bytes]) -> Callable[[], None]:
    def stop() -> None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()

    return stop


def start_redis(workdir: Path) -> RedisServer:
    """A server of the kind the run uses (services.py)."""
    if services.selected().kind == "containers":
        from tests.support.containers import start_redis_container

        return start_redis_container()
    return start_local_redis(workdir)


def start_local_redis(workdir: Path) -> RedisServer:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisUnavailable("redis-server is not installed")
    port = _free_port()
    process = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return RedisServer("127.0.0.1", port, _terminate(process))
        except OSError:
            pass
        if process.poll() is not None:
            raise RedisUnavailable(f"redis-server exited with {process.returncode}")
        time.sleep(0.05)
    process.kill()
    raise RedisUnavailable("redis-server did not answer PING")
