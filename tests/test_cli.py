"""The `nvcf-server` console script: migrate, create-key, settings errors, migrations both ways,
the invocation plane on its own (one process or several on one port)."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import grpc
import httpx
import pytest
from sqlalchemy import bindparam, create_engine, inspect, text

from service.cli import parse_expiry
from service.core import migrate
from tests.support.api import CONTAINER_FN
from tests.support.app import ADMIN_KEY, ClientFactory
from tests.support.invocation import write_catalog
from tests.support.redis import RedisServer
from tests.support.server import free_port, start_server, stop_server
from tests.support.upstream import UpstreamServer
from tests.support.wire import get, head_lines, running_server


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
        check=False,
    )


async def test_create_key_prints_a_working_key(
    tmp_path: Path, database_url: str, client_factory: ClientFactory
) -> None:
    env = {"NVCF_DATA_DIR": str(tmp_path / "d"), "NVCF_DATABASE_URL": database_url}
    done = run_cli(
        "create-key",
        "--account",
        "acme",
        "--scopes",
        "list_functions,register_function",
        "--expires-in",
        "30d",
        env=env,
    )
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip()
    assert key.startswith("nvapi-") and len(key.splitlines()) == 1
    client = await client_factory()
    resp = await client.get("/v2/nvcf/functions", headers={"Authorization": f"Bearer {key}"})
    assert resp.status_code == 200
    resp = await client.delete(
        f"/v2/nvcf/functions/{'0' * 8}-0000-0000-0000-{'0' * 12}/versions/"
        f"{'0' * 8}-0000-0000-0000-{'0' * 12}",
        headers={"Authorization": f"Bearer {key}"},
    )
    assert resp.status_code == 403


def test_create_key_rejects_unknown_scopes_and_bad_expiry(tmp_path: Path) -> None:
    env = {"NVCF_DATA_DIR": str(tmp_path)}
    done = run_cli("create-key", "--account", "a", "--scopes", "list_functions,teleport", env=env)
    assert done.returncode == 2 and "unknown scope 'teleport'" in done.stderr
    done = run_cli(
        "create-key",
        "--account",
        "a",
        "--scopes",
        "list_functions",
        "--expires-in",
        "soon",
        env=env,
    )
    assert done.returncode == 2 and "not a duration" in done.stderr


def test_a_bad_setting_stops_start_up_with_one_line(tmp_path: Path) -> None:
    done = run_cli(
        "migrate", env={"NVCF_DATA_DIR": str(tmp_path), "NVCF_RECONCILE_INTERVAL": "often"}
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "NVCF_RECONCILE_INTERVAL" in lines[0]
    done = run_cli(
        "migrate", env={"NVCF_DATA_DIR": str(tmp_path), "NVCF_DATABASE_URL": "mysql://x"}
    )
    assert done.returncode == 2 and "NVCF_DATABASE_URL" in done.stderr


@pytest.mark.parametrize("which", ["grpc", "http"])
def test_a_port_in_use_stops_start_up_with_one_line_naming_it(tmp_path: Path, which: str) -> None:
    with socket.socket() as held:  # another server on this machine
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        grpc_port, http_port = (taken, free_port()) if which == "grpc" else (free_port(), taken)
        done = run_cli(
            "serve",
            "--port",
            str(http_port),
            env={
                "NVCF_DATA_DIR": str(tmp_path),
                "NVCF_GRPC_ENABLED": "true",
                "NVCF_GRPC_PORT": str(grpc_port),
            },
        )
    assert done.returncode == 2
    assert done.stdout == ""  # nothing said to be served
    [line] = done.stderr.strip().splitlines()
    assert f"127.0.0.1:{taken} is in use" in line
    assert (f"NVCF_GRPC_PORT={taken}" if which == "grpc" else "--port") in line


def test_generated_admin_key_is_printed_once_and_saved(tmp_path: Path) -> None:
    import asyncio

    from asgi_lifespan import LifespanManager

    from service.app import create_app
    from service.core.settings import Settings

    settings = Settings(data_dir=tmp_path, _env_file=None)

    async def boot() -> str:
        app = create_app(settings)
        async with LifespanManager(app, startup_timeout=120, shutdown_timeout=120) as manager:
            key = (tmp_path / "admin-api-key").read_text().strip()
            transport = httpx.ASGITransport(app=manager.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                r = await c.get("/v2/nvcf/functions", headers={"Authorization": f"Bearer {key}"})
                assert r.status_code == 200
        return key

    first = asyncio.run(boot())
    assert oct((tmp_path / "admin-api-key").stat().st_mode & 0o777) == "0o600"
    second = asyncio.run(boot())
    assert first == second  # no second key once one exists


def _sync(url: str) -> str:
    return migrate.sync_url(url)


@pytest.mark.parametrize("direction", ["down-and-up"])
def test_migrations_downgrade_and_upgrade_cleanly(database_url: str, direction: str) -> None:
    engine = create_engine(_sync(database_url))
    with engine.connect() as conn:
        assert "function_versions" in inspect(conn).get_table_names()
    migrate.downgrade(database_url, "base")
    with engine.connect() as conn:
        assert set(inspect(conn).get_table_names()) <= {"alembic_version"}
    migrate.upgrade(database_url)
    with engine.connect() as conn:
        assert "function_versions" in inspect(conn).get_table_names()
    engine.dispose()


def test_check_catalog_names_each_bad_line() -> None:
    data = Path(__file__).parent / "clusters" / "data"
    good = run_cli("check-catalog", str(data / "valid_catalog.yaml"))
    assert good.returncode == 0 and "catalog is valid" in good.stdout
    bad = run_cli("check-catalog", str(data / "bad_catalog.yaml"))
    assert bad.returncode == 1
    lines = bad.stderr.strip().splitlines()
    assert len(lines) >= 2
    assert all("bad_catalog.yaml:" in line for line in lines[1:]), lines


def test_worker_utils_says_which_pod_it_serves_or_refuses() -> None:
    neither = run_cli("worker-utils")
    assert neither.returncode == 2
    assert "give --worker-port (a function's pod) or --task-results-dir" in neither.stderr
    half = run_cli("worker-utils", "--task-results-dir", "/var/nvct/results")
    assert half.returncode == 2
    assert "--task-results-dir needs --task-progress-file" in half.stderr


def test_serve_refuses_a_bad_catalog_naming_the_line(tmp_path: Path) -> None:
    data = Path(__file__).parent / "clusters" / "data" / "bad_catalog.yaml"
    done = run_cli(
        "serve",
        "--port",
        "1",
        env={"NVCF_DATA_DIR": str(tmp_path), "NVCF_CLUSTERS_FILE": str(data)},
    )
    assert done.returncode == 2
    assert "bad_catalog.yaml:7:" in done.stderr


async def test_create_key_grants_the_operator_scope(
    tmp_path: Path, database_url: str, client_factory: ClientFactory
) -> None:
    """Only the operator's command line makes a key that may administer other accounts."""
    env = {"NVCF_DATA_DIR": str(tmp_path / "d"), "NVCF_DATABASE_URL": database_url}
    done = run_cli("create-key", "--account", "ops", "--scopes", "admin,admin:accounts", env=env)
    assert done.returncode == 0, done.stderr
    operator = {"Authorization": f"Bearer {done.stdout.strip()}"}
    client = await client_factory()
    resp = await client.post(
        "/v2/nvcf/api-keys", json={"ncaId": "tenant", "scopes": ["admin"]}, headers=operator
    )
    assert resp.status_code == 200, resp.text
    tenant_admin = {"Authorization": f"Bearer {resp.json()['apiKey']['key']}"}
    resp = await client.post(
        "/v2/nvcf/api-keys", json={"ncaId": "ops", "scopes": ["admin"]}, headers=tenant_admin
    )
    assert resp.status_code == 403


def test_a_real_server_prints_the_admin_key_at_the_first_start_only(tmp_path: Path) -> None:
    """The first start prints the generated key; the next says where it is kept, not the key."""
    data = tmp_path / "data"
    url = f"sqlite+aiosqlite:///{data / 'nvcf.db'}"
    log = data / "server.log"
    stop_server(start_server(data, url, free_port(), bootstrap_key=None))
    first = log.read_text()
    key = (data / "admin-api-key").read_text().strip()
    assert f"generated admin API key for account 'nvcf-default': {key}" in first
    stop_server(start_server(data, url, free_port(), bootstrap_key=None))
    second = log.read_text()[len(first) :]
    assert "serving on" in second
    assert key not in second and "nvapi-" not in second
    assert f"admin API key: kept in {data / 'admin-api-key'}" in second


def test_make_run_installs_the_server_alone_and_migrates_once() -> None:
    """`make run`'s commands (printed, not run): no dev extras, one migration, then serve."""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        ["make", "-n", "-B", "run", "VENV=/nonexistent/venv"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = done.stdout.splitlines()
    installs = [line for line in lines if " install " in line and "upgrade pip" not in line]
    assert installs == ["/nonexistent/venv/bin/pip install -q -e ."]
    assert sum("nvcf-server migrate" in line for line in lines) == 1
    serve = [line for line in lines if "nvcf-server serve" in line]
    assert serve == [
        "NVCF_AUTO_MIGRATE=false /nonexistent/venv/bin/nvcf-server serve "
        "--host 127.0.0.1 --port 8080"
    ]
    assert lines.index(serve[0]) > next(i for i, x in enumerate(lines) if "migrate" in x)


def _pexec_request(function_id: str, n: int) -> bytes:
    body = json.dumps({"n": n}).encode()
    close = "Connection: close\r\n" if n == 2 else ""
    return (
        f"POST /v2/nvcf/pexec/functions/{function_id} HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {ADMIN_KEY}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{close}\r\n"
    ).encode() + body


def _read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_invoke_runs_the_invocation_plane_as_its_own_process(
    tmp_path: Path, database_url: str
) -> None:
    upstream = UpstreamServer().start()
    catalog = str(write_catalog(tmp_path, upstream=upstream.url))
    common = {"NVCF_CLUSTERS_FILE": catalog, "NVCF_RECONCILE_INTERVAL": "0.05"}
    api_port, invoke_port = free_port(), free_port()
    api = start_server(
        tmp_path / "d", database_url, api_port, NVCF_INVOKE_ENABLED="false", env=common
    )
    invoke = None
    try:
        invoke = start_server(tmp_path / "d", database_url, invoke_port, "invoke", env=common)
        auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{api_port}/v2/nvcf", headers=auth) as c:
            fn = c.post("/functions", json=CONTAINER_FN).json()["function"]
            spec = {"gpu": "H100", "backend": "inv", "minInstances": 1, "maxInstances": 1}
            deploy = f"/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
            assert c.post(deploy, json={"deploymentSpecifications": [spec]}).status_code == 200
            for _ in range(600):
                status = c.get(f"/functions/{fn['id']}/versions/{fn['versionId']}")
                if status.json()["function"]["status"] == "ACTIVE":
                    break
                time.sleep(0.05)
            # The API server no longer serves invocations ...
            assert c.post(f"/pexec/functions/{fn['id']}", json={}).status_code == 404
        # ... the invocation process does, and nothing else.
        base = f"http://127.0.0.1:{invoke_port}/v2/nvcf"
        with httpx.Client(base_url=base, headers=auth, timeout=30) as c:
            resp = c.post(f"/pexec/functions/{fn['id']}", json={"via": "invoke"})
            assert resp.status_code == 200, resp.text
            assert resp.json()["echo"] == {"via": "invoke"} and resp.json()["upstream"] is True
            assert resp.headers["nvcf-status"] == "fulfilled"
            # more on the kept-alive connection: the front protocol's (uvloop, the real
            # process), and pipelined ones, answered in order
            for n in range(3):
                resp = c.post(f"/pexec/functions/{fn['id']}", json={"n": n})
                assert resp.status_code == 200 and resp.json()["echo"] == {"n": n}
            with socket.create_connection(("127.0.0.1", invoke_port), timeout=30) as sock:
                sock.sendall(b"".join(_pexec_request(fn["id"], n) for n in range(3)))
                answers = _read_until_closed(sock).split(b"HTTP/1.1 ")[1:]
            assert [a[:3] for a in answers] == [b"200"] * 3
            echoes = [json.loads(a.split(b"\r\n\r\n", 1)[1])["echo"]["n"] for a in answers]
            assert echoes == [0, 1, 2]
            assert c.get("/functions").status_code == 404
            assert (
                "nvcf_invocation_requests_total"
                in httpx.get(f"http://127.0.0.1:{invoke_port}/metrics", headers=auth).text
            )
    finally:
        if invoke is not None:
            stop_server(invoke)
        stop_server(api)
        upstream.stop()


def test_every_answer_of_the_server_says_nosniff_once(tmp_path: Path) -> None:
    """On the wire: the API, its refusals, the pages, the invocation front door and the
    server's own refusal of a malformed request."""
    fid = "00000000-0000-4000-8000-000000000000"
    requests = [
        get("/health"),
        get("/v2/nvcf/functions"),  # 401
        get("/v2/nvcf/nothing"),  # 404
        get("/docs"),
        get("/redoc"),
        get("/console/"),
        get("/metrics"),
        f"POST /v2/nvcf/pexec/functions/{fid} HTTP/1.1\r\nHost: x\r\n".encode()
        + b"Content-Length: 2\r\n\r\n{}",
        b"GET /health HTTP/1.1\r\nHost: x\r\nNo colon here\r\n\r\n",  # 400 from the server
    ]
    with running_server(tmp_path) as port:
        heads = [head_lines(port, request) for request in requests]
    for request, lines in zip(requests, heads, strict=True):
        said = [line for line in lines if line.lower().startswith("x-content-type-options:")]
        assert [s.split(":", 1)[1].strip() for s in said] == ["nosniff"], (request, lines)


@pytest.mark.parametrize("text", ["٣d", "²d", "+3d", "3_0d", "9" * 4301 + "d", "0d"])
def test_a_key_expiry_is_ascii_digits_and_a_unit(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="not a duration"):
        parse_expiry(text)
    assert parse_expiry("30d") == timedelta(days=30)
    assert parse_expiry("12H") == timedelta(hours=12)


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _detached_pexec(port: int, function_id: str, count: int) -> list[str]:
    """`count` pexec requests, each on a connection of its own opened while the others wait,
    answered 202 (the worker holds them past NVCF-POLL-SECONDS): their request ids."""
    body = b"{}"
    request = (
        f"POST /v2/nvcf/pexec/functions/{function_id} HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {ADMIN_KEY}\r\nContent-Type: application/json\r\n"
        f"NVCF-POLL-SECONDS: 1\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    socks = []
    try:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=60)
            socks.append(sock)
            sock.sendall(request)
        ids = []
        for sock in socks:
            head = _read_until_closed(sock).split(b"\r\n\r\n", 1)[0].decode()
            assert head.startswith("HTTP/1.1 202"), head
            ids += [
                line.split(":", 1)[1].strip()
                for line in head.split("\r\n")
                if line.lower().startswith("nvcf-reqid:")
            ]
        return ids
    finally:
        for sock in socks:
            sock.close()


def test_invoke_serves_one_port_from_two_replicas_sharing_redis(
    tmp_path: Path, database_url: str, redis_server: RedisServer
) -> None:
    """`invoke --processes 2`: both processes answer on the one port, each as its own replica
    (its own id in the heartbeat table and on the requests it runs); SIGTERM stops them all."""
    upstream = UpstreamServer().start()
    catalog = str(write_catalog(tmp_path, upstream=upstream.url))
    common = {
        "NVCF_CLUSTERS_FILE": catalog,
        "NVCF_RECONCILE_INTERVAL": "0.05",
        "NVCF_REDIS_URL": redis_server.url,
    }
    api_port, invoke_port = free_port(), free_port()
    api = start_server(
        tmp_path / "d", database_url, api_port, NVCF_INVOKE_ENABLED="false", env=common
    )
    invoke = None
    engine = create_engine(_sync(database_url))
    try:
        grpc_port = free_port()
        invoke = start_server(
            tmp_path / "d",
            database_url,
            invoke_port,
            "invoke",
            args=["--processes", "2"],
            NVCF_GRPC_ENABLED="true",
            NVCF_GRPC_PORT=str(grpc_port),
            env=common,
        )
        children = [pid for pid in _children(invoke.pid) if _alive(pid)]
        auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{api_port}/v2/nvcf", headers=auth) as c:
            fn = c.post("/functions", json=CONTAINER_FN).json()["function"]
            spec = {"gpu": "H100", "backend": "inv", "minInstances": 1, "maxInstances": 1}
            deploy = f"/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
            assert c.post(deploy, json={"deploymentSpecifications": [spec]}).status_code == 200
            for _ in range(600):
                status = c.get(f"/functions/{fn['id']}/versions/{fn['versionId']}")
                if status.json()["function"]["status"] == "ACTIVE":
                    break
                time.sleep(0.05)
        base = f"http://127.0.0.1:{invoke_port}/v2/nvcf"
        with httpx.Client(base_url=base, headers=auth, timeout=30) as c:
            resp = c.post(f"/pexec/functions/{fn['id']}", json={"via": "invoke"})
            assert resp.status_code == 200 and resp.json()["echo"] == {"via": "invoke"}
        # the processes share the gRPC port too (each bound it; one answers): an HTTP function
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            call: grpc.UnaryUnaryMultiCallable[bytes, bytes]
            call = channel.unary_unary("/any.Service/Method")
            metadata = (("authorization", f"Bearer {ADMIN_KEY}"), ("function-id", fn["id"]))
            with pytest.raises(grpc.RpcError) as refused:
                call(b"x", metadata=metadata, timeout=30)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        # Which process accepts a connection is the kernel's choice: new connections until
        # both have run requests (each batch opened while both processes are idle).
        upstream.hold()
        owners: set[str] = set()
        with engine.connect() as conn:
            for _ in range(10):
                ids = _detached_pexec(invoke_port, fn["id"], 8)
                rows = conn.execute(
                    text("SELECT owner FROM invocation_requests WHERE id IN :ids").bindparams(
                        bindparam("ids", expanding=True)
                    ),
                    {"ids": ids},
                )
                owners |= {row[0] for row in rows}
                conn.commit()
                if len(owners) == 2:
                    break
            replicas = {
                row[0] for row in conn.execute(text("SELECT owner FROM invocation_replicas"))
            }
        assert len(owners) == 2, owners
        assert owners <= replicas
        upstream.release()
        with httpx.Client(base_url=base, headers=auth, timeout=30) as c:
            assert c.get(f"/pexec/status/{ids[0]}").status_code in (200, 202)
    finally:
        upstream.release()
        if invoke is not None:
            stop_server(invoke)
            assert invoke.returncode == 0
        stop_server(api)
        upstream.stop()
        engine.dispose()
    # every process it started is gone with it
    assert len(children) >= 2
    assert not [pid for pid in children if _alive(pid)]


def test_invoke_refuses_several_processes_without_redis(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NVCF_REDIS_URL"}
    env["NVCF_DATA_DIR"] = str(tmp_path)

    def invoke(*args: str, **more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "service.cli", "invoke", "--port", "1", *args],
            capture_output=True,
            text=True,
            env={**env, **more},
            timeout=120,
            check=False,
        )

    for done in (invoke("--processes", "2"), invoke(NVCF_INVOKE_PROCESSES="3")):
        assert done.returncode == 2
        assert "invocation processes need NVCF_REDIS_URL" in done.stderr
        assert "in-process dispatch cannot be shared" in done.stderr
    for bad in ("0", "65", "٣", "+2"):
        done = invoke("--processes", bad)
        assert done.returncode == 2
        assert f"'{bad}' is not a number of processes from 1 to 64" in done.stderr
    done = invoke(NVCF_INVOKE_PROCESSES="0")
    assert done.returncode == 2 and "NVCF_INVOKE_PROCESSES" in done.stderr


def test_invoke_stops_every_process_when_one_cannot_start(tmp_path: Path) -> None:
    """A process of several whose start fails (here: its database is unreachable) stops the
    server instead of being replaced, again and again, by one that fails alike."""
    env = {
        **os.environ,
        "NVCF_DATA_DIR": str(tmp_path),
        "NVCF_AUTO_MIGRATE": "false",
        "NVCF_DATABASE_URL": f"postgresql+psycopg://u:p@127.0.0.1:{free_port()}/nothing",
        "NVCF_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
    }
    command = [sys.executable, "-m", "service.cli", "invoke", "--processes", "2"]
    done = subprocess.run(
        [*command, "--port", str(free_port())],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert "failed to start, stopping the parent process" in done.stdout + done.stderr


async def test_create_key_grants_the_task_scopes(
    tmp_path: Path, database_url: str, client_factory: ClientFactory
) -> None:
    env = {"NVCF_DATA_DIR": str(tmp_path / "d"), "NVCF_DATABASE_URL": database_url}
    scopes = "launch_task,list_tasks,task_details,cancel_task,delete_task,list_events,list_results"
    done = run_cli("create-key", "--account", "acme", "--scopes", scopes, env=env)
    assert done.returncode == 0, done.stderr
    client = await client_factory(reconciler_enabled=False)
    resp = await client.get(
        "/v1/nvct/tasks", headers={"Authorization": f"Bearer {done.stdout.strip()}"}
    )
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"tasks": []}
