"""Functions survive a restart of the real server process on the same database."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.api import CONTAINER_FN
from tests.support.app import ADMIN_KEY
from tests.support.server import free_port, start_server, stop_server


def test_functions_survive_a_restart(tmp_path: Path, database_url: str) -> None:
    port = free_port()
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    base = f"http://127.0.0.1:{port}/v2/nvcf"
    proc = start_server(tmp_path, database_url, port)
    try:
        created = httpx.post(
            f"{base}/functions",
            json={**CONTAINER_FN, "tags": ["keep"], "secrets": [{"name": "s", "value": "v"}]},
            headers=headers,
        )
        assert created.status_code == 200, created.text
    finally:
        stop_server(proc)
    fn = created.json()["function"]
    proc = start_server(tmp_path, database_url, port)
    try:
        got = httpx.get(f"{base}/functions/{fn['id']}/versions/{fn['versionId']}", headers=headers)
        assert got.status_code == 200
        assert got.json()["function"] == {**fn, "activeInstances": []}
    finally:
        stop_server(proc)


def test_an_edit_is_seen_at_once_without_auto_migrate(tmp_path: Path, database_url: str) -> None:
    """The read cache learns of commits also when no migration ran at start (it used to
    register its watches only as a side effect of the migration environment's imports)."""
    port = free_port()
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    base = f"http://127.0.0.1:{port}/v2/nvcf"
    proc = start_server(tmp_path, database_url, port, NVCF_AUTO_MIGRATE="false")
    try:
        fn = httpx.post(f"{base}/functions", json=CONTAINER_FN, headers=headers).json()["function"]
        path = f"{base}/functions/{fn['id']}/versions/{fn['versionId']}"
        for _ in range(2):  # the second read is answered from the cache
            assert httpx.get(path, headers=headers).json()["function"]["description"] == "echo"
        put = httpx.put(path, json={"description": "changed"}, headers=headers)
        assert put.status_code == 200 and put.json()["function"]["description"] == "changed"
        assert httpx.get(path, headers=headers).json()["function"]["description"] == "changed"
    finally:
        stop_server(proc)


def test_the_data_dir_and_database_are_private(tmp_path: Path) -> None:
    """Nothing the server writes is readable by other users: dir 0700, files 0600."""
    data = tmp_path / "data"  # created by the server itself (the log goes to tmp_path)
    port = free_port()
    url = f"sqlite+aiosqlite:///{data / 'nvcf.db'}"
    proc = start_server(tmp_path, url, port, NVCF_DATA_DIR=str(data))
    try:
        created = httpx.post(
            f"http://127.0.0.1:{port}/v2/nvcf/functions",
            json=CONTAINER_FN,
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        )
        assert created.status_code == 200
    finally:
        stop_server(proc)
    assert data.stat().st_mode & 0o777 == 0o700
    written = list(data.rglob("*"))
    assert any(p.name == "nvcf.db" for p in written)
    loose = {
        str(p.relative_to(data)): oct(p.stat().st_mode & 0o777)
        for p in written
        if p.stat().st_mode & 0o077
    }
    assert loose == {}
