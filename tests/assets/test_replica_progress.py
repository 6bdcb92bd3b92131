"""Progress across replicas: two server processes on PostgreSQL and Redis; a request runs on
the first (its worker writes its `progress` file there), and polls through the second show
NVCF-PERCENT-COMPLETE and the partial response, as the first published them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.asset_servers import AUTH, FAST, SECRETS_KEY, deploy
from tests.support.file_worker import FileWorker
from tests.support.invocation import write_catalog
from tests.support.server import free_port, start_server, stop_server


@pytest.fixture(scope="module")
def worker() -> Iterator[FileWorker]:
    process = FileWorker()
    try:
        yield process
    finally:
        process.stop()


@pytest.mark.postgres
def test_a_poll_on_another_replica_shows_the_progress(
    tmp_path: Path, worker: FileWorker, pg_server: Any, pg_template: Any, redis_server: Any
) -> None:
    import psycopg

    if pg_server is None:
        pytest.skip("PostgreSQL is not available on this machine")
    name = f"progress_{int(time.time() * 1000) % 10**9}"
    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {pg_template}")
    common = {
        "NVCF_CLUSTERS_FILE": str(write_catalog(tmp_path, upstream=worker.url)),
        "NVCF_SECRETS_KEY": SECRETS_KEY,
        "NVCF_REDIS_URL": redis_server.url,
        "NVCF_INVOKE_PROGRESS_PERIOD_SECONDS": "0.1",
        **FAST,
    }
    first_port, second_port = free_port(), free_port()
    first = start_server(tmp_path / "one", pg_server.url(name), first_port, **common)
    second = None
    try:
        second = start_server(tmp_path / "two", pg_server.url(name), second_port, **common)
        one = httpx.Client(
            base_url=f"http://127.0.0.1:{first_port}/v2/nvcf", headers=AUTH, timeout=60
        )
        two = httpx.Client(
            base_url=f"http://127.0.0.1:{second_port}/v2/nvcf", headers=AUTH, timeout=60
        )
        with one, two:
            fn = deploy(one)
            control = tmp_path / "control"
            control.mkdir()
            started = one.post(
                f"/pexec/functions/{fn['id']}",
                json={},
                headers={
                    "X-Worker-Mode": "progress",
                    "X-Control-Dir": str(control),
                    "NVCF-POLL-SECONDS": "1",
                },
            )
            assert started.status_code == 202
            status = f"/pexec/status/{started.headers['nvcf-reqid']}"
            seen: list[tuple[str, Any]] = []
            for step in ("50", "100", "done", None):
                for _ in range(600):
                    poll = two.get(status, headers={"NVCF-POLL-SECONDS": "1"})
                    if poll.status_code != 202:
                        break
                    percent = poll.headers.get("nvcf-percent-complete")
                    if percent is not None and (not seen or seen[-1][0] != percent):
                        seen.append((percent, poll.json()))
                    want = {"50": "0", "100": "50", "done": "100"}.get(step or "")
                    if want is not None and seen and seen[-1][0] == want:
                        (control / str(step)).touch()
                        break
                if step is None:
                    assert poll.status_code == 200 and poll.json() == {"finished": True}
            assert seen == [
                ("0", {"stage": "start"}),
                ("50", {"stage": "half"}),
                ("100", {"stage": "end"}),
            ]
    finally:
        if second is not None:
            stop_server(second)
        stop_server(first)
        with psycopg.connect(pg_server.admin_dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
