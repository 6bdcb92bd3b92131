"""The plain server process (SQLite, no cluster) reached over raw sockets: for the defects that
are about the bytes on the wire or in the server's log rather than about a route's logic."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

from tests.support.framing import read_response
from tests.support.server import free_port, start_server, stop_server


@contextlib.contextmanager
def running_server(data_dir: Path, *, log_format: str = "text", **env: str) -> Iterator[int]:
    """The server process on SQLite in `data_dir` (its log: `data_dir / "server.log"`),
    stopped on exit: its port."""
    port = free_port()
    database_url = f"sqlite+aiosqlite:///{data_dir / 'nvcf.db'}"
    proc = start_server(data_dir, database_url, port, NVCF_LOG_FORMAT=log_format, env=env)
    try:
        yield port
    finally:
        stop_server(proc)


def raw_exchange(port: int, *requests: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """`requests` written on one connection, one after the other: each answer (status,
    lower-cased headers, body), read before the next request is written."""
    answers = []
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.settimeout(10)
        for request in requests:
            sock.sendall(request)
            answers.append(read_response(sock))
    return answers


def get(target: str, *headers: str) -> bytes:
    """A GET request's bytes, `target` as written (nothing encoded or decoded)."""
    lines = [f"GET {target} HTTP/1.1", "Host: 127.0.0.1", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def head_lines(port: int, request: bytes) -> list[str]:
    """The header lines of the answer to `request` (on a connection of its own), every one as
    sent: a header sent twice is there twice."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.settimeout(10)
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed before a response; got {data!r}"
            data += chunk
    return data.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")[1:]
