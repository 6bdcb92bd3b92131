"""Run the real server process (`python -m service.cli serve`) for tests that need one."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

import httpx
import uvicorn
from starlette.types import ASGIApp

from service.core.deadline import BodyDeadlineMiddleware
from service.core.server import ConnectionLimits, bounded_protocol, uvicorn_keepalive
from tests.support.app import ADMIN_KEY


@contextlib.asynccontextmanager
async def in_loop_server(
    app: ASGIApp, limits: ConnectionLimits, tls: tuple[Path, Path] | None = None
) -> AsyncIterator[uvicorn.Server]:
    """`app` behind the serve command's server stack (its bounded protocol, its connection
    limits, the body deadline), in this event loop, on a free port (a streamed answer, such as
    a log follow, then travels over a real connection); over HTTPS with `tls` (cert, key)."""
    config = uvicorn.Config(
        BodyDeadlineMiddleware(app, timeout=limits.body_timeout),
        host="127.0.0.1",
        port=free_port(),
        http=bounded_protocol(limits),
        timeout_keep_alive=uvicorn_keepalive(limits),
        lifespan="off",
        log_config=None,
        access_log=False,
        ssl_certfile=str(tls[0]) if tls else None,
        ssl_keyfile=str(tls[1]) if tls else None,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    for _ in range(500):
        if server.started:
            break
        await asyncio.sleep(0.01)
    assert server.started
    try:
        yield server
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(
    data_dir: Path,
    database_url: str,
    port: int,
    command: str = "serve",
    *,
    args: Sequence[str] = (),
    ca: Path | None = None,
    bootstrap_key: str | None = ADMIN_KEY,
    env: Mapping[str, str] | None = None,
    **settings: str,
) -> subprocess.Popen[bytes]:
    """Start the server (`command`: serve, or invoke for the invocation plane alone) and wait
    until `/health` answers; its output goes to <command>.log.

    With `ca` (the certificate to trust, which the server may create as it starts) the server
    is reached over HTTPS; `args` are added to the command. `bootstrap_key=None` starts it as
    a first-time user does, without NVCF_BOOTSTRAP_API_KEY. `env` and the keyword `settings`
    are added to its environment (`env` for a prepared mapping, which keyword unpacking would
    also spread over `ca` and `bootstrap_key`)."""
    full_env = {
        **{k: v for k, v in os.environ.items() if k != "NVCF_BOOTSTRAP_API_KEY"},
        "NVCF_DATA_DIR": str(data_dir),
        "NVCF_DATABASE_URL": database_url,
        **({} if bootstrap_key is None else {"NVCF_BOOTSTRAP_API_KEY": bootstrap_key}),
        **(env or {}),
        **settings,
    }
    log = data_dir / ("server.log" if command == "serve" else f"{command}.log")
    data_dir.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", command, "--port", str(port), *args],
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if ca is None:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    return proc
            elif ca.exists():
                verify = ssl.create_default_context(cafile=str(ca))
                url = f"https://127.0.0.1:{port}/health"
                if httpx.get(url, timeout=1, verify=verify).status_code == 200:
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
