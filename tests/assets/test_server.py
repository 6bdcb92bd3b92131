"""The whole story over HTTP against real server processes (`nvcf-server serve`) and a real
worker process: an asset uploaded with `curl -T` and no key, invoked with its reference, the
worker's output fetched with `curl -L` through the 302, progress seen on polls; then the same
with an S3-compatible store and two replicas on PostgreSQL (upload through one, invoke and
download through the other)."""

from __future__ import annotations

import hashlib
import io
import json
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.app import ADMIN_KEY
from tests.support.asset_servers import AUTH, FAST, SECRETS_KEY, curl, deploy
from tests.support.assets import nvcf_upload_headers
from tests.support.file_worker import FileWorker, pattern
from tests.support.invocation import write_catalog
from tests.support.s3 import S3Server
from tests.support.server import free_port, start_server, stop_server

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def worker() -> Iterator[FileWorker]:
    process = FileWorker()
    try:
        yield process
    finally:
        process.stop()


def test_local_store_end_to_end(tmp_path: Path, worker: FileWorker) -> None:
    catalog = str(write_catalog(tmp_path, upstream=worker.url))
    port = free_port()
    server = start_server(
        tmp_path / "data",
        f"sqlite+aiosqlite:///{tmp_path}/nvcf.db",
        port,
        NVCF_CLUSTERS_FILE=catalog,
        env=FAST,
    )
    base = f"http://127.0.0.1:{port}/v2/nvcf"
    try:
        with httpx.Client(base_url=base, headers=AUTH, timeout=120) as api:
            fn = deploy(api)
            pexec = f"/pexec/functions/{fn['id']}"
            made = api.post("/assets", json={"contentType": "video/mp4", "description": "in"})
            made = made.json()
            source = tmp_path / "input.bin"
            source.write_bytes(pattern(20 * MiB))
            curl("-T", str(source), made["uploadUrl"])  # no key, no headers

            report = api.post(
                pexec, json={}, headers={"NVCF-INPUT-ASSET-REFERENCES": made["assetId"]}
            ).json()
            digest = hashlib.sha256(source.read_bytes()).hexdigest()
            assert report["assets"] == {made["assetId"]: {"size": 20 * MiB, "sha256": digest}}

            # a 30 MiB output: curl follows the 302 to the signed URL
            target = tmp_path / "result.zip"
            curl(
                "-L",
                "-o",
                str(target),
                "-H",
                f"Authorization: Bearer {ADMIN_KEY}",
                "-H",
                f"X-Worker-Mode: output:{30 * MiB}",
                "-H",
                "Content-Type: application/json",
                "--data",
                "{}",
                f"{base}{pexec}",
            )
            frames = zipfile.ZipFile(target).read("out/frames.bin")
            assert hashlib.sha256(frames).digest() == hashlib.sha256(pattern(30 * MiB)).digest()

            # progress 0 -> 50 -> 100 on polls
            control = tmp_path / "control"
            control.mkdir()
            first = api.post(
                pexec,
                json={},
                headers={
                    "X-Worker-Mode": "progress",
                    "X-Control-Dir": str(control),
                    "NVCF-POLL-SECONDS": "1",
                },
            )
            assert first.status_code == 202
            status = f"/pexec/status/{first.headers['nvcf-reqid']}"
            seen: list[str] = []
            for step in ("50", "100", "done", None):
                for _ in range(600):
                    poll = api.get(status, headers={"NVCF-POLL-SECONDS": "1"})
                    if poll.status_code != 202:
                        break
                    percent = poll.headers.get("nvcf-percent-complete")
                    if percent is not None and (not seen or seen[-1] != percent):
                        seen.append(percent)
                    if (
                        step is not None
                        and seen
                        and seen[-1] == {"50": "0", "100": "50", "done": "100"}[step]
                    ):
                        (control / step).touch()
                        break
                if step is None:
                    assert poll.status_code == 200 and poll.json() == {"finished": True}
            assert seen == ["0", "50", "100"]
    finally:
        stop_server(server)


@pytest.mark.postgres
def test_s3_store_with_two_replicas(
    tmp_path: Path, worker: FileWorker, s3_server: S3Server, pg_server: Any, pg_template: Any
) -> None:
    import psycopg

    if pg_server is None:
        pytest.skip("PostgreSQL is not available on this machine")
    name = f"replicas_{int(time.time() * 1000) % 10**9}"
    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {pg_template}")
    url = pg_server.url(name)
    catalog = str(write_catalog(tmp_path, upstream=worker.url))
    s3 = {
        f"NVCF_{k.upper()}": str(v) for k, v in s3_server.settings(s3_server.new_bucket()).items()
    }
    common = {"NVCF_CLUSTERS_FILE": catalog, "NVCF_SECRETS_KEY": SECRETS_KEY, **FAST, **s3}
    first_port, second_port = free_port(), free_port()
    first = start_server(tmp_path / "one", url, first_port, env=common)
    second = None
    try:
        second = start_server(tmp_path / "two", url, second_port, env=common)
        one = httpx.Client(
            base_url=f"http://127.0.0.1:{first_port}/v2/nvcf", headers=AUTH, timeout=60
        )
        two = httpx.Client(
            base_url=f"http://127.0.0.1:{second_port}/v2/nvcf", headers=AUTH, timeout=60
        )
        with one, two:
            fn = deploy(one)
            made = one.post("/assets", json={"contentType": "image/png", "description": "x"}).json()
            data = pattern(3 * MiB)
            with httpx.Client() as plain:
                put = plain.put(made["uploadUrl"], content=data, headers=nvcf_upload_headers(made))
                assert put.status_code == 200, put.text
            report = two.post(
                f"/pexec/functions/{fn['id']}",
                json={},
                headers={"NVCF-INPUT-ASSET-REFERENCES": made["assetId"]},
            ).json()
            assert report["assets"][made["assetId"]]["sha256"] == hashlib.sha256(data).hexdigest()
            resp = two.post(
                f"/pexec/functions/{fn['id']}", json={}, headers={"X-Worker-Mode": "output:1000"}
            )
            assert resp.status_code == 302
            assert resp.headers["location"].startswith(s3_server.endpoint)
            with httpx.Client() as plain:
                got = plain.get(resp.headers["location"])
            frames = zipfile.ZipFile(io.BytesIO(got.content)).read("out/frames.bin")
            assert frames == pattern(1000)
            # the other replica lists and serves the same asset
            assert [a["assetId"] for a in two.get("/assets").json()["assets"]] == [made["assetId"]]
            assert (
                json.loads(two.get(f"/assets/{made['assetId']}").text)["asset"]["contentType"]
                == "image/png"
            )
    finally:
        if second is not None:
            stop_server(second)
        stop_server(first)
        with psycopg.connect(pg_server.admin_dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
