"""The choice between containers and local test services (tests/support/services.py):
`NVCF_TEST_SERVICES=auto|containers|local`, a quick engine probe that never hangs, a clear
failure when containers are asked for without an engine, and local services on this machine."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from tests.support.postgres import PostgresServer
from tests.support.redis import RedisServer
from tests.support.registry import RegistryServer
from tests.support.services import (
    ENV,
    ServicesUnavailable,
    engine_address,
    probe_engine,
    select_services,
    selected,
)

ROOT = Path(__file__).resolve().parents[1]
PING_OK = b"HTTP/1.1 200 OK\r\nApi-Version: 1.45\r\nContent-Length: 2\r\n\r\nOK"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once it is closed


@contextmanager
def fake_engine(answer: bytes | None, *, unix_path: Path | None = None) -> Iterator[str]:
    """A socket that reads a request and answers `answer` (None: never answers); yields its
    DOCKER_HOST."""
    family = socket.AF_UNIX if unix_path is not None else socket.AF_INET
    server = socket.socket(family, socket.SOCK_STREAM)
    server.bind(str(unix_path) if unix_path is not None else ("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.1)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(2)
            with suppress(OSError):
                conn.recv(4096)
            if answer is None:
                held.append(conn)  # open, silent
                continue
            conn.sendall(answer)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        if unix_path is not None:
            yield f"unix://{unix_path}"
        else:
            yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()
        server.close()


def test_local_asks_docker_nothing() -> None:
    def probe(_env: object) -> str | None:
        raise AssertionError("local mode must not probe for an engine")

    choice = select_services({ENV: "local"}, probe=probe)
    assert choice.kind == "local"


def test_auto_uses_containers_when_an_engine_answers(tmp_path: Path) -> None:
    with fake_engine(PING_OK) as host:
        assert probe_engine({"DOCKER_HOST": host}) is None
        assert select_services({"DOCKER_HOST": host}).kind == "containers"
        assert select_services({"DOCKER_HOST": host, ENV: "containers"}).kind == "containers"
    with fake_engine(PING_OK, unix_path=tmp_path / "docker.sock") as host:
        assert select_services({ENV: "auto", "DOCKER_HOST": host}).kind == "containers"


def test_auto_falls_back_to_local_when_nothing_listens() -> None:
    host = f"tcp://127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    choice = select_services({ENV: "auto", "DOCKER_HOST": host})
    assert time.monotonic() - started < 1.0
    assert choice.kind == "local" and host in choice.reason


def test_an_engine_socket_that_does_not_answer_costs_the_timeout_at_most() -> None:
    with fake_engine(None) as host:
        started = time.monotonic()
        why = probe_engine({"DOCKER_HOST": host}, timeout=0.3)
        elapsed = time.monotonic() - started
        assert why is not None and "did not answer within 0.3s" in why
        assert elapsed < 1.5
        choice = select_services({"DOCKER_HOST": host})  # the default timeout: 2 s at most
    assert choice.kind == "local"


def test_a_socket_that_is_not_an_engine_is_not_used() -> None:
    with fake_engine(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n") as host:
        why = probe_engine({"DOCKER_HOST": host})
        assert why is not None and "not a Docker engine" in why
        assert select_services({"DOCKER_HOST": host}).kind == "local"


def test_containers_without_an_engine_fails_clearly() -> None:
    host = f"tcp://127.0.0.1:{_closed_port()}"
    with pytest.raises(ServicesUnavailable) as raised:
        select_services({ENV: "containers", "DOCKER_HOST": host})
    message = str(raised.value)
    assert "NVCF_TEST_SERVICES=containers" in message and host in message


def test_containers_without_an_engine_stops_the_run_at_start() -> None:
    env = {
        **os.environ,
        ENV: "containers",
        "DOCKER_HOST": f"tcp://127.0.0.1:{_closed_port()}",
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            str(ROOT / "tests" / "test_test_services.py"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert "NVCF_TEST_SERVICES=containers, but no Docker engine can be used" in done.stderr


def test_other_values_are_refused() -> None:
    with pytest.raises(ServicesUnavailable, match="expected one of auto, containers, local"):
        select_services({ENV: "docker"})


def test_the_engine_is_found_where_docker_finds_it() -> None:
    assert engine_address({}) == "unix:///var/run/docker.sock"
    assert engine_address({"DOCKER_HOST": "tcp://10.0.0.1:2375"}) == "tcp://10.0.0.1:2375"
    why = probe_engine({"DOCKER_HOST": "ssh://user@host"})
    assert why is not None and "ssh://" in why


def test_the_services_of_this_run_are_of_the_selected_kind(
    pg_server: PostgresServer | None,
    redis_server: RedisServer,
    anon_registry: RegistryServer,
) -> None:
    choice = selected()
    if os.environ.get(ENV, "auto") in ("", "auto"):
        engine = probe_engine(os.environ) is None
        assert choice.kind == ("containers" if engine else "local"), choice.reason
    if pg_server is not None:
        assert pg_server.kind == choice.kind
    assert redis_server.kind == choice.kind
    assert anon_registry.kind == choice.kind


def test_local_is_what_runs_on_a_machine_without_docker() -> None:
    if probe_engine(os.environ) is None:
        pytest.skip("a Docker engine answers here")
    if os.environ.get(ENV, "auto") not in ("", "auto", "local"):
        pytest.skip(f"{ENV} is set to {os.environ[ENV]}")
    assert selected().kind == "local"
