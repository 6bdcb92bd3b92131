"""Connections are bounded: header time, body time, keep-alive idle time and how many are open.

Each test talks to the real server process over raw sockets. The server runs with tiny bounds
(fractions of a second) and each test waits several seconds at most for the outcome it asserts
(the connection closed, or the status received): no assertion is about how long anything took.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.core.settings import Settings
from tests.support.app import ADMIN_KEY
from tests.support.server import free_port, start_server, stop_server

#: how long a test waits for the server to act; the bounds under test are far below it, the
#: defaults (10 s header, 60 s body, 5 s keep-alive) above it
WAIT = 3.0
BOUND = "0.3"

GET_HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


def _start(tmp: Path, **env: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = start_server(tmp, f"sqlite+aiosqlite:///{tmp / 'nvcf.db'}", port, env=env)
    return proc, port


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    proc, port = _start(
        tmp_path_factory.mktemp("timeouts"),
        NVCF_HTTP_HEADER_TIMEOUT=BOUND,
        NVCF_HTTP_BODY_TIMEOUT=BOUND,
        NVCF_HTTP_KEEPALIVE_TIMEOUT=BOUND,
    )
    try:
        yield port
    finally:
        stop_server(proc)


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
    sock.settimeout(WAIT)
    return sock


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One response (status, lower-cased headers, body); fails on EOF or timeout first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response; got {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-response"
        body += chunk
    return status, headers, body[:length]


def _closed(sock: socket.socket) -> bytes:
    """Everything the server still sends until it closes the connection (reset counts as
    closed); a socket timeout (the server kept it open) fails the test."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"the server kept the connection open for {WAIT} s; got {data!r}")
    return data


def test_a_normal_request_and_a_kept_alive_second_one_are_answered(port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(GET_HEALTH)
        assert _read_response(sock)[0] == 200
        sock.sendall(GET_HEALTH)
        assert _read_response(sock)[0] == 200


def test_a_connection_that_sends_nothing_is_closed(port: int) -> None:
    with _connect(port) as sock:
        assert _closed(sock) == b""


def test_partial_headers_are_disconnected_after_the_header_timeout(port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        assert _closed(sock) == b""


def test_a_header_dripped_byte_by_byte_does_not_extend_the_header_timeout(port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nX-Slow: ")
        deadline = time.monotonic() + WAIT
        try:
            while time.monotonic() < deadline:
                sock.sendall(b"a")
                time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            return  # closed while we were still sending: the bound held
        pytest.fail("the server kept reading a header dripped for several seconds")


def test_a_stalled_body_gets_a_408_and_the_connection_is_closed(port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(
            b"POST /v2/nvcf/functions HTTP/1.1\r\nHost: x\r\n"
            b"Authorization: Bearer " + ADMIN_KEY.encode() + b"\r\n"
            b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"name":'
        )
        status, headers, body = _read_response(sock)
        assert status == 408
        assert headers["content-type"] == "application/problem+json"
        assert json.loads(body)["status"] == 408
        assert headers["connection"] == "close"
        assert _closed(sock) == b""


def test_a_stalled_body_the_route_never_reads_is_disconnected(port: int) -> None:
    # 405 before the body is read: the rest of the body must still arrive in time.
    with _connect(port) as sock:
        sock.sendall(b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        assert _read_response(sock)[0] == 405
        assert _closed(sock) == b""


def test_an_idle_keep_alive_connection_is_closed_after_the_keep_alive_timeout(port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(GET_HEALTH)
        assert _read_response(sock)[0] == 200
        assert _closed(sock) == b""


def test_a_next_request_started_but_not_finished_is_disconnected(port: int) -> None:
    # The keep-alive timer stops at the next request's first byte; the header timer takes over.
    with _connect(port) as sock:
        sock.sendall(GET_HEALTH)
        assert _read_response(sock)[0] == 200
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        assert _closed(sock) == b""


def test_beyond_the_connection_cap_new_connections_are_refused_existing_ones_work(
    tmp_path: Path,
) -> None:
    proc, port = _start(tmp_path, NVCF_HTTP_MAX_CONNECTIONS="3")
    held: list[socket.socket] = []
    try:
        for _ in range(3):
            sock = _connect(port)
            held.append(sock)
            sock.sendall(GET_HEALTH)
            assert _read_response(sock)[0] == 200
        with _connect(port) as extra:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                extra.sendall(GET_HEALTH)
            reply = _closed(extra)
            assert reply == b"" or reply.startswith(b"HTTP/1.1 503 "), reply
        for sock in held:  # the connections already open still work
            sock.sendall(GET_HEALTH)
            assert _read_response(sock)[0] == 200
        held.pop().close()
        status = 0
        for _ in range(50):  # the server notices the closed socket asynchronously
            with _connect(port) as sock:
                try:
                    sock.sendall(GET_HEALTH)
                    status = _read_response(sock)[0]
                except (AssertionError, ConnectionResetError, BrokenPipeError):
                    status = 0
            if status == 200:
                break
            time.sleep(0.1)
        assert status == 200
    finally:
        for sock in held:
            sock.close()
        stop_server(proc)


def test_the_bounds_have_safe_defaults_and_accept_fractions() -> None:
    s = Settings(_env_file=None)
    assert (s.http_header_timeout, s.http_body_timeout, s.http_keepalive_timeout) == (10, 60, 5)
    assert s.http_max_connections == 1000
    s = Settings(_env_file=None, http_header_timeout="0.25")
    assert s.http_header_timeout == 0.25
    with pytest.raises(ValueError):
        Settings(_env_file=None, http_body_timeout=0)


def test_the_connection_cap_leaves_file_descriptors_for_everything_else() -> None:
    from service.core.server import connection_cap

    assert connection_cap(1000, soft_fd_limit=None) == 1000
    assert connection_cap(1000, soft_fd_limit=65536) == 1000
    assert connection_cap(1000, soft_fd_limit=512) < 512
    assert connection_cap(5, soft_fd_limit=512) == 5
    assert connection_cap(1000, soft_fd_limit=8) >= 1
