"""A client that goes away mid-body is counted as 499 and logged at info, never as a 500."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx

from tests.support.app import ADMIN_KEY
from tests.support.server import free_port, start_server, stop_server


def test_a_client_gone_mid_body_is_a_499(tmp_path: Path) -> None:
    port = free_port()
    proc = start_server(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'nvcf.db'}", port)
    try:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(
                b"POST /v2/nvcf/functions HTTP/1.1\r\nHost: x\r\n"
                b"Authorization: Bearer " + ADMIN_KEY.encode() + b"\r\n"
                b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"name":'
            )
            time.sleep(0.3)
        metrics = ""
        for _ in range(50):  # the server notices the closed socket asynchronously
            metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
            if 'status="499"' in metrics:
                break
            time.sleep(0.1)
    finally:
        stop_server(proc)
    assert 'route="/v2/nvcf/functions",status="499"} 1.0' in metrics
    assert 'status="500"' not in metrics
    log = (tmp_path / "server.log").read_text()
    assert "unhandled error" not in log and "Traceback" not in log
