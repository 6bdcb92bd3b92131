"""The worker-utils sidecar for real, on loopback: a server process (`nvcf-server serve`), the
sidecar process (`nvcf-server worker-utils`) in front of a real worker process, as in a
Kubernetes pod (the simulated cluster's `upstream` is the sidecar, `workerUtils: true`): input
assets fetched through their signed URLs into the shared directory, a large output uploaded to
its signed upload URL and answered 302, progress asked of the sidecar on polls, the
directories removed after each request."""

from __future__ import annotations

import hashlib
import io
import json
import time
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.assets.worker_utils import CONTROL_HEADER, Instructions
from tests.support.asset_servers import AUTH, FAST, curl, deploy
from tests.support.file_worker import FileWorker, pattern
from tests.support.server import free_port, start_server, stop_server
from tests.support.sidecar import Sidecar

MiB = 1024 * 1024
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def worker() -> Iterator[FileWorker]:
    process = FileWorker()
    try:
        yield process
    finally:
        process.stop()


def catalog(tmp_path: Path, upstream: str) -> Path:
    sim = {
        "scheduleSeconds": 0.01,
        "pullSeconds": 0.01,
        "readySeconds": 0.02,
        "upstream": upstream,
        "workerUtils": True,
    }
    cluster = {
        "name": "pod-0",
        "adapter": "simulated",
        "provider": "NCP",
        "region": "region-0",
        "nodes": [{"gpu": "H100", "gpusPerNode": 8, "count": 1}],
        "simulation": sim,
    }
    path = tmp_path / "clusters.yaml"
    path.write_text(json.dumps({"clusterGroups": [{"name": "inv", "clusters": [cluster]}]}))
    return path


def left_behind(mount: Path) -> list[str]:
    """What is in the per-request directories once the sidecar is done (it removes them
    after the last byte of its answer went out, so a moment after the caller has it)."""
    for _ in range(200):
        found = sorted(
            str(p.relative_to(mount))
            for sub in ("assets", "output", "results")
            for p in (mount / sub).glob("*")
        )
        if not found:
            break
        time.sleep(0.05)
    return found


def test_sidecar_in_front_of_a_real_worker(tmp_path: Path, worker: FileWorker) -> None:
    mount = tmp_path / "pod-files"
    mount.mkdir()
    (mount / "output").mkdir()
    (mount / "output" / "crashed-run").mkdir()  # what a crashed sidecar left
    sidecar = Sidecar(worker.url, mount, "--max-result-files", "3")
    port = free_port()
    server = start_server(
        tmp_path / "data",
        f"sqlite+aiosqlite:///{tmp_path}/nvcf.db",
        port,
        NVCF_CLUSTERS_FILE=str(catalog(tmp_path, sidecar.url)),
        env=FAST,
    )
    base = f"http://127.0.0.1:{port}/v2/nvcf"
    try:
        assert not (mount / "output" / "crashed-run").exists()
        with httpx.Client(base_url=base, headers=AUTH, timeout=120) as api:
            fn = deploy(api)
            pexec = f"/pexec/functions/{fn['id']}"
            made = api.post("/assets", json={"contentType": "video/mp4", "description": "in"})
            made = made.json()
            source = tmp_path / "input.bin"
            source.write_bytes(pattern(20 * MiB))
            curl("-T", str(source), made["uploadUrl"])

            # the asset, fetched by the sidecar through its signed URL, read by the worker
            report = api.post(
                pexec, json={}, headers={"NVCF-INPUT-ASSET-REFERENCES": made["assetId"]}
            ).json()
            digest = hashlib.sha256(source.read_bytes()).hexdigest()
            assert report["assets"] == {made["assetId"]: {"size": 20 * MiB, "sha256": digest}}
            rid = report["headers"]["nvcf-reqid"]
            assert report["headers"]["nvcf-asset-dir"] == str(mount / "assets" / rid)
            assert report["headers"]["nvcf-large-output-dir"] == str(mount / "output" / rid)
            assert report["headers"]["nvcf-function-asset-ids"] == made["assetId"]
            # the platform's instructions never reach the worker
            assert CONTROL_HEADER.lower() not in report["headers"]
            assert report["outputDirExists"] is True
            assert left_behind(mount) == []

            # the stored object went after the asset was confirmed: its URL answers 404
            (tmp_path / "data" / "storage" / "assets" / made["assetId"]).unlink()
            gone = api.post(
                pexec, json={}, headers={"NVCF-INPUT-ASSET-REFERENCES": made["assetId"]}
            )
            assert gone.status_code == 503
            assert f"asset {made['assetId']} was deleted before the request" in gone.text
            assert left_behind(mount) == []

            # a 30 MiB output: zipped and uploaded by the sidecar, the caller gets the 302
            resp = api.post(pexec, json={}, headers={"X-Worker-Mode": f"output:{30 * MiB}"})
            assert resp.status_code == 302
            target = tmp_path / "result.zip"
            curl("-o", str(target), resp.headers["location"])
            frames = zipfile.ZipFile(target).read("out/frames.bin")
            assert hashlib.sha256(frames).digest() == hashlib.sha256(pattern(30 * MiB)).digest()
            assert left_behind(mount) == []

            # an answer body over NVCF-MAX-RESPONSE-SIZE-BYTES (5 MiB) is a large result too
            resp = api.post(pexec, json={}, headers={"X-Worker-Mode": f"body:{6 * MiB}"})
            assert resp.status_code == 302
            with httpx.Client() as plain:
                got = plain.get(resp.headers["location"])
            with zipfile.ZipFile(io.BytesIO(got.content)) as zf:
                (name,) = [n for n in zf.namelist() if n.endswith(".response")]
                assert zf.read(name) == pattern(6 * MiB)

            # progress 0 -> 50 -> 100 on polls, asked of the sidecar
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
            partial: list[object] = []
            for step in ("50", "100", "done", None):
                for _ in range(600):
                    poll = api.get(status, headers={"NVCF-POLL-SECONDS": "1"})
                    if poll.status_code != 202:
                        break
                    percent = poll.headers.get("nvcf-percent-complete")
                    if percent is not None and (not seen or seen[-1] != percent):
                        seen.append(percent)
                        partial.append(poll.json())
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
            assert partial == [{"stage": "start"}, {"stage": "half"}, {"stage": "end"}]
            assert left_behind(mount) == []
    finally:
        stop_server(server)
        sidecar.stop()


def test_sidecar_bounds_and_refusals(tmp_path: Path, worker: FileWorker) -> None:
    """Straight to the sidecar, as the platform speaks to it: every refusal is an answer
    marked `refused` with the reason, and nothing is left in the shared directory."""
    mount = tmp_path / "pod-files"
    mount.mkdir()
    sidecar = Sidecar(
        worker.url,
        mount,
        *("--max-result-bytes", "1000", "--max-asset-bytes", "10", "--worker-timeout", "1"),
    )
    try:
        with httpx.Client(base_url=sidecar.url, timeout=60) as client:
            bad = client.post("/", headers={CONTROL_HEADER: "not json"}, content=b"{}")
            assert bad.status_code == 400
            assert bad.headers["nvcf-worker-utils-result"] == "refused"
            assert "base64url JSON" in bad.json()["detail"]

            rid = "8d4c2c36-61a2-4a8b-9a52-2b0a4b6f6d11"
            aid = "5f0c8a0e-0d0e-4b1f-8f6e-4c1b8ee3a001"
            asset_url = f"{worker.url}/asset"  # the worker answers a GET 501: not an asset

            def control(assets: dict[str, str], request_id: str | None = None) -> str:
                # each request its own id, as the platform's: the directories of one are
                # removed a moment after its answer, maybe after the next one began
                return Instructions(
                    uuid.UUID(request_id) if request_id else uuid.uuid4(),
                    {uuid.UUID(k): v for k, v in assets.items()},
                    f"{worker.url}/upload",
                ).encode()

            failed = client.post("/", headers={CONTROL_HEADER: control({aid: asset_url})})
            assert failed.status_code == 503
            assert aid in failed.json()["detail"]

            # a result past --max-result-bytes is refused, naming the bound
            large = client.post(
                "/",
                headers={CONTROL_HEADER: control({}), "X-Worker-Mode": "output:5000"},
                content=b"{}",
            )
            assert large.status_code == 502
            assert large.headers["nvcf-worker-utils-result"] == "refused"
            assert "NVCF_ASSET_RESULT_MAX_BYTES" in large.json()["detail"]

            # a worker that does not answer in --worker-timeout: 504, named
            control_dir = tmp_path / "control"
            control_dir.mkdir()
            slow = client.post(
                "/",
                headers={
                    CONTROL_HEADER: control({}, rid),
                    "X-Worker-Mode": "progress",
                    "X-Control-Dir": str(control_dir),
                    "NVCF-REQID": rid,
                },
                content=b"{}",
            )
            assert slow.status_code == 504
            assert slow.json()["detail"] == "the worker did not answer within 1 s"
            assert left_behind(mount) == []
            for step in ("50", "100", "done"):  # the worker may go on: its directory is gone
                (control_dir / step).touch()

            # a plain request (a health check) passes as it is, unmarked
            plain = client.post("/", content=b"{}")
            assert plain.status_code == 200
            assert "nvcf-worker-utils-result" not in plain.headers
            # progress of a request it does not run: none
            none = client.get("/", headers={"NVCF-WORKER-UTILS-PROGRESS": rid})
            assert none.status_code == 204
        assert left_behind(mount) == []
    finally:
        sidecar.stop()
