"""A real PostgreSQL server for the test suite: initdb into a temp dir, pg_ctl on a free port.

Runs as the `postgres` user when the tests run as root (initdb refuses root).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


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
    root: Path
    port: int
    bin_dir: Path
    run_as: str | None

    @property
    def admin_dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def url(self, dbname: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{dbname}"

    def stop(self) -> None:
        _run(
            self,
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


def _run(server_or_user: PostgresServer | str | None, cmd: list[str], check: bool = True) -> None:
    user = server_or_user.run_as if isinstance(server_or_user, PostgresServer) else server_or_user
    if user is not None:
        cmd = ["runuser", "-u", user, "--", *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise PostgresUnavailable(
            f"{' '.join(cmd)} failed: {done.stdout[-800:]} {done.stderr[-800:]}"
        )


def start_postgres() -> PostgresServer:
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
    server = PostgresServer(root=root, port=port, bin_dir=bin_dir, run_as=run_as)
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
