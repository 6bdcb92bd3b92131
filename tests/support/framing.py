"""The real server process in front of a raw-socket worker (tests/support/raw_worker.py), with
a function deployed on it and an invoke-only key, for the framing regression suite: requests
are written and answers read byte for byte on raw sockets."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.app import ADMIN_KEY
from tests.support.raw_worker import RawWorker
from tests.support.server import free_port, start_server, stop_server

SUFFIX = "invocation.localhost"
ACCOUNT = "framing-acct"
#: how long a test waits for the server to answer or close; bounds under test are far below
WAIT = 10.0


@dataclass
class Served:
    port: int
    worker: RawWorker
    key: str
    account: str
    fid: str
    vid: str
    proc: subprocess.Popen[bytes]
    manager: str
    #: the server process's output
    log: Path

    def deploy(self, **function: Any) -> tuple[str, str]:
        """Another function of the account (see `deploy_echo`)."""
        return deploy_echo(self.port, self.manager, **function)

    @property
    def pexec(self) -> str:
        return f"/v2/nvcf/pexec/functions/{self.fid}/versions/{self.vid}"

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=WAIT)
        sock.settimeout(WAIT)
        return sock

    def exchange(self, request: bytes) -> tuple[int, dict[str, str], bytes]:
        with contextlib.closing(self.connect()) as sock:
            sock.sendall(request)
            return read_response(sock)

    def request(
        self,
        method: str,
        target: str,
        *,
        headers: dict[str, str] | None = None,
        body: bytes = b"",
        auth: bool = True,
    ) -> bytes:
        """One request's bytes: Host, the key, `headers`, a Content-Length when a body."""
        lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1"]
        if auth:
            lines.append(f"Authorization: Bearer {self.key}")
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        if body or method in ("POST", "PUT"):
            lines.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


#: bytes read from a socket past the response read last (the next one's start)
_unread: weakref.WeakKeyDictionary[socket.socket, bytes] = weakref.WeakKeyDictionary()


def _recv(sock: socket.socket, what: str) -> bytes:
    chunk = sock.recv(65536)
    assert chunk, f"connection closed {what}"
    return chunk


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One response (status, lower-cased headers, body) framed by Content-Length or chunked,
    bytes after it kept for the next call; fails on EOF before its end, or on timeout."""
    data = _unread.pop(sock, b"")
    while b"\r\n\r\n" not in data:
        data += _recv(sock, f"before a response; got {data!r}")
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        length = int(headers["content-length"])
        while len(rest) < length:
            rest += _recv(sock, "inside the body")
        _unread[sock] = rest[length:]
        return status, headers, rest[:length]
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            while b"\r\n" not in rest:
                rest += _recv(sock, "inside a chunk")
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            while len(rest) < size + 2:
                rest += _recv(sock, "inside a chunk")
            body, rest = body + rest[:size], rest[size + 2 :]
            if size == 0:
                _unread[sock] = rest
                return status, headers, body
    _unread[sock] = rest
    return status, headers, b""


def _api(port: int) -> httpx.Client:
    return httpx.Client(
        base_url=f"http://127.0.0.1:{port}",
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        timeout=30,
    )


def deploy_echo(
    port: int,
    key: str,
    *,
    group: str = "inv",
    deploy: bool = True,
    **function: Any,
) -> tuple[str, str]:
    """A container function, deployed until ACTIVE on the catalog's `group` (unless not
    `deploy`), as the key's account: (function id, version id)."""
    with httpx.Client(
        base_url=f"http://127.0.0.1:{port}",
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    ) as api:
        body = {
            "name": "raw",
            "inferenceUrl": "/echo",
            "inferencePort": 8000,
            "containerImage": "nvcr.io/acme/echo:1.0",
            **function,
        }
        resp = api.post("/v2/nvcf/functions", json=body)
        assert resp.status_code == 200, resp.text
        fn = resp.json()["function"]
        fid, vid = fn["id"], fn["versionId"]
        if not deploy:
            return fid, vid
        spec = {"gpu": "H100", "backend": group, "minInstances": 1, "maxInstances": 1}
        resp = api.post(
            f"/v2/nvcf/deployments/functions/{fid}/versions/{vid}",
            json={"deploymentSpecifications": [spec]},
        )
        assert resp.status_code == 200, resp.text
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            got = api.get(f"/v2/nvcf/functions/{fid}/versions/{vid}").json()
            if got["function"]["status"] == "ACTIVE":
                return fid, vid
            time.sleep(0.1)
    raise AssertionError("function did not become ACTIVE")


def _catalog(tmp: Path, upstream: str) -> Path:
    """Group `inv`: one simulated cluster forwarding to `upstream`; group `dead`: one whose
    upstream refuses every connection (a port nobody listens on)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    sim = {"scheduleSeconds": 0.01, "pullSeconds": 0.01, "readySeconds": 0.02}
    groups: list[dict[str, Any]] = [
        {
            "name": name,
            "clusters": [
                {
                    "name": f"{name}-0",
                    "adapter": "simulated",
                    "provider": "NCP",
                    "region": "region-0",
                    "nodes": [{"gpu": "H100", "gpusPerNode": 8, "count": 1}],
                    "simulation": {**sim, "upstream": url},
                }
            ],
        }
        for name, url in (("inv", upstream), ("dead", closed))
    ]
    path = tmp / "clusters.json"
    path.write_text(json.dumps({"clusterGroups": groups}))
    return path


def _key(api: httpx.Client, scopes: list[str]) -> str:
    resp = api.post("/v2/nvcf/api-keys", json={"ncaId": ACCOUNT, "scopes": scopes})
    assert resp.status_code == 200, resp.text
    return str(resp.json()["apiKey"]["key"])


@contextlib.contextmanager
def served(tmp: Path, **env: str) -> Iterator[Served]:
    """The server process, a raw worker as its simulated cluster's upstream, one function
    deployed in ACCOUNT, and an invoke-only key of that account."""
    worker = RawWorker().start()
    catalog = _catalog(tmp, worker.url)
    port = free_port()
    proc = start_server(
        tmp,
        f"sqlite+aiosqlite:///{tmp / 'nvcf.db'}",
        port,
        NVCF_CLUSTERS_FILE=str(catalog),
        NVCF_RECONCILE_INTERVAL="0.05",
        NVCF_RECONCILE_RESYNC_SECONDS="0.1",
        NVCF_RATE_LIMIT_PER_SECOND="0",
        NVCF_INVOKE_HOST_SUFFIX=SUFFIX,
        env=env,
    )
    try:
        with _api(port) as api:
            manager, key = (
                _key(
                    api, ["register_function", "deploy_function", "list_functions", "queue_details"]
                ),
                _key(api, ["invoke_function"]),
            )
        fid, vid = deploy_echo(port, manager)
        yield Served(port, worker, key, ACCOUNT, fid, vid, proc, manager, tmp / "server.log")
    finally:
        stop_server(proc)
        worker.stop()


def echoed(body: bytes) -> dict[str, Any]:
    return dict(json.loads(body))
