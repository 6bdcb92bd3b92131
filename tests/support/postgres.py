"""A real PostgreSQL server for the test suite: a container where a Docker engine answers
(containers.py, chosen by services.py), else a local one: initdb into a temp dir, pg_ctl on a
free port, run as the `postgres` user when the tests run as root (initdb refuses root).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import services


class PostgresUnavailable(RuntimeError):
    pass


def _bin_dir() -> Path:
    env = os.environ.get("NVCF_TEST_PG_BIN")
    if env:
        return Path(env)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    raise PostgresUnavailable("PostgreSQL server binaries (initdb, pg_ctl) are not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PostgresServer:
    """A running server whose superuser is `postgres`; `kind` is "local" or "containers"."""

    host: str
    port: int
    stopper: Callable[[], None] = field(repr=False)
    password: str | None = field(default=None, repr=False)
    kind: services.Kind = "local"

    @property
    def admin_dsn(self) -> str:
        dsn = f"host={self.host} port={self.port} user=postgres dbname=postgres"
        return dsn + (f" password={self.password}" if self.password else "")

    def url(self, dbname: str) -> str:
        login = f"postgres:{self.password}" if self.password else "postgres"
        return f"postgresql+psycopg://{login}@{self.host}:{self.port}/{dbname}"

    def stop(self) -> None:
        self.stopper()


@dataclass
class _LocalCluster:
    root: Path
    bin_dir: Path
    run_as: str | None

    def stop(self) -> None:
        _run(
            self.run_as,
            [
                str(self.bin_dir / "pg_ctl"),
                "-D",
                str(self.root / "data"),
                "-m",
                "immediate",
                "stop",
            ],
            check=False,
        )
        shutil.rmtree(self.root, ignore_errors=True)


def _run(user: str | None, cmd: list[str], check: bool = True) -> None:
    if user is not None:
        cmd = ["runuser", "-u", user, "--", *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise PostgresUnavailable(
            f"{' '.join(cmd)} failed: {done.stdout[-800:]} {done.stderr[-800:]}"
        )


def start_postgres() -> PostgresServer:
    """A server of the kind the run uses (services.py)."""
    if services.selected().kind == "containers":
        from tests.support.containers import start_postgres_container

        return start_postgres_container()
    return start_local_postgres()


def start_local_postgres() -> PostgresServer:
    bin_dir = _bin_dir()
    run_as: str | None = None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            raise PostgresUnavailable("running as root but there is no 'postgres' user") from None
        run_as = "postgres"
    root = Path(tempfile.mkdtemp(prefix="nvcf-pg-"))
    if run_as:
        shutil.chown(root, user=run_as)
    port = _free_port()
    cluster = _LocalCluster(root=root, bin_dir=bin_dir, run_as=run_as)
    server = PostgresServer(host="127.0.0.1", port=port, stopper=cluster.stop)
    _run(
        run_as,
        [
            str(bin_dir / "initdb"),
            "-D",
            str(root / "data"),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        ],
    )
    opts = (
        f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={root} "
        "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
    )
    _run(
        run_as,
        [
            str(bin_dir / "pg_ctl"),
            "-D",
            str(root / "data"),
            "-o",
            opts,
            "-l",
            str(root / "log"),
            "-w",
            "-t",
            "60",
            "start",
        ],
    )
    return server
