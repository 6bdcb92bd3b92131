"""The test services as containers, through `testcontainers` (chosen by services.py when a
Docker engine answers): PostgreSQL, the OCI registry (`registry:2`, the same distribution
server as Debian's `docker-registry`) and Redis. Each start function hands back the server
object of its local counterpart, so fixtures and helpers do not know which kind runs.

Files a container needs (the registry's config, htpasswd, the token server's certificate) are
copied into it before it starts, never mounted, so a remote engine works too. `testcontainers`
is imported here only, when containers are used.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tests.support.postgres import PostgresServer, PostgresUnavailable
from tests.support.redis import RedisServer, RedisUnavailable
from tests.support.registry import (
    RegistryServer,
    RegistryUnavailable,
    TokenServer,
    wait_ready,
)

if TYPE_CHECKING:
    from testcontainers.core.container import DockerContainer

POSTGRES_IMAGE = "postgres:16-alpine"
REGISTRY_IMAGE = "registry:2"
REDIS_IMAGE = "redis:7-alpine"
_PG_PASSWORD = "nvcf-test"  # a throw-away server reachable from this machine only


def _host(container: DockerContainer) -> str:
    """Where the container's published ports are reached ("localhost" may resolve to ::1)."""
    host = container.get_container_host_ip()
    return "127.0.0.1" if host == "localhost" else host


def _stopper(container: DockerContainer) -> Any:
    def stop() -> None:
        try:
            container.stop()
        except Exception:  # already gone (the reaper, or an earlier stop)
            return

    return stop


# --- PostgreSQL --------------------------------------------------------------------------------


def start_postgres_container() -> PostgresServer:
    from testcontainers.community.postgres import PostgresContainer

    container = PostgresContainer(
        POSTGRES_IMAGE,
        username="postgres",
        password=_PG_PASSWORD,
        dbname="postgres",
        driver=None,
    ).with_command(
        "postgres -c fsync=off -c synchronous_commit=off -c full_page_writes=off "
        "-c max_connections=200"
    )
    try:
        container.start()
    except Exception as exc:
        raise PostgresUnavailable(f"the {POSTGRES_IMAGE} container did not start: {exc}") from exc
    return PostgresServer(
        host=_host(container),
        port=int(container.get_exposed_port(5432)),
        password=_PG_PASSWORD,
        kind="containers",
        stopper=_stopper(container),
    )


# --- Redis -------------------------------------------------------------------------------------


def start_redis_container() -> RedisServer:
    from testcontainers.community.redis import RedisContainer

    container = RedisContainer(REDIS_IMAGE)
    try:
        container.start()
    except Exception as exc:
        raise RedisUnavailable(f"the {REDIS_IMAGE} container did not start: {exc}") from exc
    return RedisServer(
        host=_host(container),
        port=int(container.get_exposed_port(6379)),
        kind="containers",
        stopper=_stopper(container),
    )


# --- the OCI registry --------------------------------------------------------------------------

_CONFIG_DIR = "/etc/docker/registry"  # exists in the image


class _RegistryContainer:
    """A RegistryServer's runner: logs, liveness and stop of a `registry:2` container (its logs
    are kept when it stops, for assertions after a mid-test stop)."""

    def __init__(self, container: DockerContainer) -> None:
        self.container = container
        self._last_logs = ""

    def log_text(self) -> str:
        try:
            out, err = self.container.get_logs()
        except Exception:
            return self._last_logs
        self._last_logs = (out + err).decode(errors="replace")
        return self._last_logs

    def running(self) -> bool:
        try:
            self.container.reload()
            return self.container.status == "running"
        except Exception:
            return False

    def stop(self) -> None:
        self.log_text()
        _stopper(self.container)()


def htpasswd_bcrypt(username: str, password: str) -> str:
    """An htpasswd entry made with `bcrypt` (no `htpasswd` binary needed)."""
    import bcrypt

    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=10)).decode()
    return f"{username}:{hashed}"


def start_registry_container(
    tmpdir: Path,
    *,
    htpasswd: tuple[str, str] | None = None,
    token: TokenServer | None = None,
    login: tuple[str, str] | None = None,
) -> RegistryServer:
    """A `registry:2` container configured as registry.start_registry configures the local
    one; the token server's realm stays on this machine (only clients fetch tokens)."""
    from testcontainers.core.container import DockerContainer

    tmpdir.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": False}},
        "storage": {
            "filesystem": {"rootdirectory": "/var/lib/registry"},
            "delete": {"enabled": True},
            "maintenance": {"uploadpurging": {"enabled": False}},
        },
        "http": {"addr": ":5000", "secret": secrets.token_hex(16)},
    }
    container = DockerContainer(REGISTRY_IMAGE).with_exposed_ports(5000)
    if htpasswd is not None:
        path = f"{_CONFIG_DIR}/htpasswd"
        config["auth"] = {"htpasswd": {"realm": "nvcf-test", "path": path}}
        container.with_copy_into_container((htpasswd_bcrypt(*htpasswd) + "\n").encode(), path)
    if token is not None:
        path = f"{_CONFIG_DIR}/token-cert.pem"
        config["auth"] = {"token": {**token.registry_auth(), "rootcertbundle": path}}
        container.with_copy_into_container(token.cert_path.read_bytes(), path)
    container.with_copy_into_container(yaml.safe_dump(config).encode(), f"{_CONFIG_DIR}/config.yml")
    try:
        container.start()
        host = f"{_host(container)}:{container.get_exposed_port(5000)}"
    except Exception as exc:
        raise RegistryUnavailable(f"the {REGISTRY_IMAGE} container did not start: {exc}") from exc
    login = login or htpasswd
    server = RegistryServer(
        host=host,
        root=tmpdir,
        runner=_RegistryContainer(container),
        username=login[0] if login else None,
        password=login[1] if login else None,
        token_server=token,
        kind="containers",
    )
    if not wait_ready(server):
        logs = server.log_text()[-2000:]
        server.stop()
        raise RegistryUnavailable(f"the {REGISTRY_IMAGE} container did not answer: {logs}")
    return server
