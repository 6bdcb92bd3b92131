"""Running the `nvcf` client command line in tests: in process with Typer's CliRunner (stdout
and stderr kept apart), against a real server process started per test module."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from typer.testing import CliRunner, Result

from service.client_cli.app import app
from tests.support.app import ADMIN_KEY
from tests.support.server import free_port, start_server, stop_server

#: the server's reconciler and health timeouts, shrunk (the built-in simulated catalog)
FAST_SERVER = {
    "NVCF_RECONCILE_INTERVAL": "0.05",
    "NVCF_RECONCILE_RESYNC_SECONDS": "0.1",
    "NVCF_HEALTH_IMAGE_PULL_TIMEOUT": "0.5",
    "NVCF_RENDER_WORKERS": "1",
}
#: variables of the client that the test's own environment must not leak into a run
#: unset for every run: the command sees no login, colour or terminal width of the test runner
CLIENT_VARS = ("NVCF_URL", "NVCF_API_KEY", "NVCF_CA_CERT", "NO_COLOR", "FORCE_COLOR", "COLUMNS")


@contextmanager
def served(data: Path, **env: str) -> Iterator[str]:
    """A real server (SQLite in `data`) for the duration; yields its base URL."""
    port = free_port()
    settings: dict[str, Any] = {**FAST_SERVER, **env}
    proc = start_server(data, f"sqlite+aiosqlite:///{data / 'nvcf.db'}", port, **settings)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_server(proc)


@dataclass
class Nvcf:
    """`nvcf ...` against one server, logged in through the environment by default; the
    config directory is the test's own."""

    url: str
    config_home: Path
    env: dict[str, str | None] = field(default_factory=dict)

    def base_env(self, *, logged_in: bool = True) -> dict[str, str | None]:
        out: dict[str, str | None] = dict.fromkeys(CLIENT_VARS)
        out["XDG_CONFIG_HOME"] = str(self.config_home)
        out["NVCF_POLL_INTERVAL"] = "0.1"
        if logged_in:
            out["NVCF_URL"] = self.url
            out["NVCF_API_KEY"] = ADMIN_KEY
        return out

    def __call__(
        self,
        *args: str,
        logged_in: bool = True,
        env: Mapping[str, str | None] | None = None,
        input: str | None = None,
    ) -> Result:
        full = {**self.base_env(logged_in=logged_in), **self.env, **(env or {})}
        return CliRunner().invoke(app, list(args), env=full, input=input, catch_exceptions=False)

    def json(self, *args: str) -> Any:
        """The JSON document a successful `-o json` run printed (its only output on stdout)."""
        done = self(*args, "-o", "json")
        assert done.exit_code == 0, (done.stdout, done.stderr)
        return json.loads(done.stdout)
