"""Large inputs and outputs end to end through pexec and exec: a real worker process (a
simulated cluster's upstream) reads its input assets from NVCF-ASSET-DIR, writes outputs and
progress into NVCF-LARGE-OUTPUT-DIR; callers get a 302 to a signed URL (exec:
responseReference) and progress on their polls.

The tests on `shared` share one app per database whose cluster forwards to the module's
worker, each with a function it deployed itself; the others build an app of their own."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy import update

from service.assets.models import Asset
from tests.support.api import assert_problem, new_key
from tests.support.app import AppClient, ClientFactory
from tests.support.assets import anonymous, uploaded
from tests.support.e2e import V, eventually
from tests.support.file_worker import FileWorker, pattern
from tests.support.invocation import FAST, deployed, invocation_app, pexec_url, write_catalog
from tests.support.sidecar import Sidecar

MiB = 1024 * 1024

pytestmark = pytest.mark.asyncio(loop_scope="module")
# the tests that build their own app run in their own loop
own_app = pytest.mark.asyncio(loop_scope="function")


@pytest.fixture(scope="module")
def worker() -> Iterator[FileWorker]:
    process = FileWorker()
    try:
        yield process
    finally:
        process.stop()


async def app(
    client_factory: ClientFactory, tmp_path: Path, worker: FileWorker, **overrides: Any
) -> tuple[AppClient, dict[str, Any]]:
    client = await invocation_app(client_factory, tmp_path, upstream=worker.url, **overrides)
    return client, await deployed(client)


@pytest.fixture(scope="module")
def module_settings(tmp_path_factory: pytest.TempPathFactory, worker: FileWorker) -> dict[str, Any]:
    catalog = write_catalog(tmp_path_factory.mktemp("catalog"), upstream=worker.url, gpus=64)
    return {"clusters_file": catalog, **FAST}


@pytest_asyncio.fixture(loop_scope="module")
async def shared(module_client: AppClient) -> tuple[AppClient, dict[str, Any]]:
    """The module's app and a function the test deployed on it."""
    return module_client, await deployed(module_client)


def exec_url(fn: dict[str, Any]) -> str:
    return f"{V}/exec/functions/{fn['id']}/versions/{fn['versionId']}"


async def test_input_assets_reach_the_worker_by_id_and_go_after(
    shared: tuple[AppClient, dict[str, Any]],
) -> None:
    client, fn = shared
    data = pattern(20 * MiB)
    first = await uploaded(client, data)
    second = await uploaded(client, b"small")
    resp = await client.post(
        pexec_url(fn),
        json={},
        headers={
            "NVCF-INPUT-ASSET-REFERENCES": f"{first}, {second}",
            # a caller cannot point the worker elsewhere
            "NVCF-ASSET-DIR": "/etc",
        },
    )
    assert resp.status_code == 200, resp.text
    report = resp.json()
    assert report["assets"] == {
        first: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()},
        second: {"size": 5, "sha256": hashlib.sha256(b"small").hexdigest()},
    }
    headers = report["headers"]
    assert headers["nvcf-function-asset-ids"] == f"{first},{second}"
    assert headers["nvcf-asset-dir"] != "/etc"
    assert report["outputDirExists"] is True

    def gone_and_empty() -> bool:
        output = headers["nvcf-large-output-dir"]
        return not os.path.exists(headers["nvcf-asset-dir"]) and not os.listdir(output)

    async def cleared() -> bool:  # once the request is over: assets gone, outputs empty
        return await asyncio.to_thread(gone_and_empty)

    await eventually(cleared)
    assert int(headers["nvcf-max-response-size-bytes"]) > 0


async def test_without_assets_the_worker_still_gets_its_directories(
    shared: tuple[AppClient, dict[str, Any]],
) -> None:
    client, fn = shared
    report = (await client.post(pexec_url(fn), json={})).json()
    assert report["assets"] == {}
    assert "nvcf-function-asset-ids" not in report["headers"]
    assert report["outputDirExists"] is True


async def test_exec_takes_its_asset_field(shared: tuple[AppClient, dict[str, Any]]) -> None:
    client, fn = shared
    asset = await uploaded(client, b"exec-input")
    resp = await client.post(
        exec_url(fn),
        json={"requestHeader": {"inputAssetReferences": [asset]}, "requestBody": {}},
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["response"]["assets"][asset]["size"] == len(b"exec-input")


async def test_every_bad_reference_is_named(shared: tuple[AppClient, dict[str, Any]]) -> None:
    client, fn = shared
    good = await uploaded(client)
    unfinished = await uploaded(client, None)
    expired = await uploaded(client)
    async with client.app.state.sessionmaker() as session, session.begin():
        await session.execute(
            update(Asset).where(Asset.id == uuid.UUID(expired)).values(expires_at=Asset.created_at)
        )
    foreign = await uploaded(
        client, key=await new_key(client, ["invoke_function"], account="other-account")
    )
    unknown = str(uuid.uuid4())
    refs = ",".join([good, unfinished, expired, foreign, unknown, "not-an-id"])
    body = assert_problem(
        await client.post(pexec_url(fn), json={}, headers={"NVCF-INPUT-ASSET-REFERENCES": refs}),
        400,
    )
    assert body["errors"][0]["message"].startswith("'not-an-id'")
    body = assert_problem(
        await client.post(
            pexec_url(fn),
            json={},
            headers={"NVCF-INPUT-ASSET-REFERENCES": refs.replace(",not-an-id", "")},
        ),
        400,
    )
    messages = {e["message"] for e in body["errors"]}
    assert len(messages) == 4
    for asset_id in (unfinished, expired, foreign, unknown):
        assert any(asset_id in m for m in messages), asset_id
    assert not any(good in m for m in messages)
    wrapped = assert_problem(
        await client.post(
            exec_url(fn),
            json={"requestHeader": {"inputAssetReferences": [unknown]}, "requestBody": {}},
        ),
        400,
    )
    assert wrapped["errors"][0]["field"] == "requestHeader.inputAssetReferences"


async def test_outputs_become_a_302_to_the_same_bytes(
    shared: tuple[AppClient, dict[str, Any]],
) -> None:
    client, fn = shared
    resp = await client.post(
        pexec_url(fn), json={}, headers={"X-Worker-Mode": f"output:{30 * MiB}"}
    )
    assert resp.status_code == 302, resp.text
    assert resp.headers["nvcf-status"] == "fulfilled"
    async with anonymous(client) as anon:
        got = await anon.get(resp.headers["location"])
    assert got.status_code == 200
    archive = zipfile.ZipFile(io.BytesIO(got.content))
    rid = resp.headers["nvcf-reqid"]
    assert sorted(archive.namelist()) == sorted([f"{rid}.response", "out/frames.bin"])
    frames = archive.read("out/frames.bin")
    assert hashlib.sha256(frames).digest() == hashlib.sha256(pattern(30 * MiB)).digest()
    assert json.loads(archive.read(f"{rid}.response")) == {"wrote": 30 * MiB}


@own_app
async def test_a_body_over_the_response_size_is_a_large_result(
    client_factory: ClientFactory, tmp_path: Path, worker: FileWorker
) -> None:
    client, fn = await app(client_factory, tmp_path, worker, invoke_result_max_bytes=1000)
    resp = await client.post(pexec_url(fn), json={}, headers={"X-Worker-Mode": "body:5000"})
    assert resp.status_code == 302
    async with anonymous(client) as anon:
        got = await anon.get(resp.headers["location"])
    rid = resp.headers["nvcf-reqid"]
    assert zipfile.ZipFile(io.BytesIO(got.content)).read(f"{rid}.response") == pattern(5000)
    # under the size: the answer itself
    small = await client.post(pexec_url(fn), json={}, headers={"X-Worker-Mode": "body:1000"})
    assert small.status_code == 200 and small.content == pattern(1000)
    # exec: responseReference
    wrapped = await client.post(
        exec_url(fn), json={"requestBody": {}}, headers={"X-Worker-Mode": "body:5000"}
    )
    assert wrapped.status_code == 200, wrapped.text
    content = wrapped.json()
    assert content["status"] == "fulfilled"
    async with anonymous(client) as anon:
        ref = await anon.get(content["responseReference"])
    assert zipfile.ZipFile(io.BytesIO(ref.content)).read(f"{content['reqId']}.response") == (
        pattern(5000)
    )


async def test_progress_shows_on_polls(
    shared: tuple[AppClient, dict[str, Any]], tmp_path: Path
) -> None:
    client, fn = shared
    control = tmp_path / "control"
    control.mkdir()
    resp = await client.post(
        pexec_url(fn),
        json={},
        headers={
            "X-Worker-Mode": "progress",
            "X-Control-Dir": str(control),
            "NVCF-POLL-SECONDS": "1",
        },
    )
    assert resp.status_code == 202, resp.text
    rid = resp.headers["nvcf-reqid"]
    status = f"{V}/pexec/status/{rid}"
    seen: list[str] = []

    async def percent(value: str) -> Any:
        poll = await client.get(status, headers={"NVCF-POLL-SECONDS": "1"})
        assert poll.status_code == 202, poll.text
        got = poll.headers.get("nvcf-percent-complete")
        if got is not None and (not seen or seen[-1] != got):
            seen.append(got)
        return poll if got == value else None

    first = await eventually(lambda: percent("0"))
    assert first.json() == {"stage": "start"}
    (control / "50").touch()
    half = await eventually(lambda: percent("50"))
    assert half.json() == {"stage": "half"}
    wrapped = await client.get(f"{V}/exec/status/{rid}", headers={"NVCF-POLL-SECONDS": "1"})
    assert wrapped.status_code == 202
    assert wrapped.json()["percentComplete"] == 50
    assert wrapped.json()["response"] == {"stage": "half"}
    (control / "100").touch()
    await eventually(lambda: percent("100"))
    (control / "done").touch()

    async def finished() -> Any:
        poll = await client.get(status, headers={"NVCF-POLL-SECONDS": "1"})
        return poll if poll.status_code == 200 else None

    done = await eventually(finished)
    assert done.json() == {"finished": True}
    assert seen == ["0", "50", "100"]


async def test_a_worker_cannot_hand_out_files_outside_its_directory(
    shared: tuple[AppClient, dict[str, Any]], tmp_path: Path
) -> None:
    client, fn = shared
    secret = tmp_path / "secret.txt"
    secret.write_text("server secret")
    resp = await client.post(
        pexec_url(fn),
        json={},
        headers={"X-Worker-Mode": "escape", "X-Secret-Path": str(secret)},
    )
    # the link is not an output: a plain answer, nothing stored
    assert resp.status_code == 200
    assert resp.json() == {}


@own_app
async def test_a_worker_elsewhere_gets_no_directories_and_no_assets(
    client_factory: ClientFactory, tmp_path: Path, worker: FileWorker
) -> None:
    """A cluster whose workers do not run on the server's machine and get no worker-utils
    sidecar (Kubernetes with NVCF_WORKER_UTILS_IMAGE empty): a request with assets ends 503
    naming the cluster; one without gets no directory headers."""
    client, fn = await app(client_factory, tmp_path, worker)
    adapter = client.app.state.adapters.get("inv-0")
    adapter.files_on_this_machine = False  # as a Kubernetes cluster's adapter says
    asset = await uploaded(client)
    refused = await client.post(
        pexec_url(fn), json={}, headers={"NVCF-INPUT-ASSET-REFERENCES": asset}
    )
    assert "inv-0" in str(assert_problem(refused, 503)["detail"])
    plain = (await client.post(pexec_url(fn), json={})).json()
    assert "nvcf-asset-dir" not in plain["headers"]
    assert "nvcf-large-output-dir" not in plain["headers"]


@own_app
async def test_a_large_result_over_its_bound_ends_errored(
    client_factory: ClientFactory, tmp_path: Path, worker: FileWorker
) -> None:
    client, fn = await app(client_factory, tmp_path, worker, asset_result_max_bytes=1000)
    outputs = await client.post(pexec_url(fn), json={}, headers={"X-Worker-Mode": "output:5000"})
    assert "NVCF_ASSET_RESULT_MAX_BYTES" in str(assert_problem(outputs, 502)["detail"])
    assert outputs.headers["nvcf-status"] == "errored"
    body = await client.post(
        pexec_url(fn), json={}, headers={"X-Worker-Mode": f"body:{6 * 1024 * 1024}"}
    )
    assert "NVCF_ASSET_RESULT_MAX_BYTES" in str(assert_problem(body, 502)["detail"])
    # nothing is left behind in the spool
    spool = client.app.state.settings.asset_files_root / "results"
    assert list(spool.iterdir()) == []


@own_app
async def test_the_built_in_simulated_worker_uses_its_directories(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    """The embedded default with no worker of the test's: the simulated worker reports its
    assets, writes a large output and reports progress."""
    client = await invocation_app(client_factory, tmp_path)
    fn = await deployed(client)
    data = pattern(3 * MiB)
    asset = await uploaded(client, data)
    echo = (
        await client.post(pexec_url(fn), json={}, headers={"NVCF-INPUT-ASSET-REFERENCES": asset})
    ).json()
    assert echo["assets"] == {
        asset: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    }
    large = await client.post(pexec_url(fn), json={}, headers={"X-Sim-Output-Bytes": "100000"})
    assert large.status_code == 302
    async with anonymous(client) as anon:
        got = await anon.get(large.headers["location"])
    assert len(zipfile.ZipFile(io.BytesIO(got.content)).read("output.bin")) == 100000
    slow = await client.post(
        pexec_url(fn),
        json={},
        headers={"X-Sim-Progress": "0,50,100", "X-Sim-Delay-Ms": "6000", "NVCF-POLL-SECONDS": "1"},
    )
    assert slow.status_code == 202
    status = f"{V}/pexec/status/{slow.headers['nvcf-reqid']}"
    seen: set[str] = set()

    async def finished() -> bool:
        poll = await client.get(status, headers={"NVCF-POLL-SECONDS": "1"})
        if poll.status_code == 202 and "nvcf-percent-complete" in poll.headers:
            seen.add(poll.headers["nvcf-percent-complete"])
        return poll.status_code == 200

    await eventually(finished)
    assert seen and seen <= {"0", "50", "100"}


@own_app
async def test_a_pod_without_the_sidecar_refuses_assets_and_serves_the_rest(
    client_factory: ClientFactory, tmp_path: Path, worker: FileWorker
) -> None:
    """The adapter adds sidecars, but this pod has none (a helm chart's pod it could not
    identify): the worker answers without the sidecar's verdict. A request with assets ends
    503 saying so; one without is answered as it is; the instructions never reach a caller."""
    client, fn = await app(client_factory, tmp_path, worker)
    adapter = client.app.state.adapters.get("inv-0")
    adapter.files_on_this_machine = False
    adapter.files_in_sidecar = True  # as a Kubernetes adapter with a sidecar image says
    asset = await uploaded(client)
    refused = await client.post(
        pexec_url(fn), json={}, headers={"NVCF-INPUT-ASSET-REFERENCES": asset}
    )
    assert "no worker-utils sidecar" in str(assert_problem(refused, 503)["detail"])
    plain = await client.post(
        pexec_url(fn), json={}, headers={"NVCF-WORKER-UTILS-RESULT": "stored"}
    )
    assert plain.status_code == 200
    assert "nvcf-worker-utils" in plain.json()["headers"]  # sent to the pod, unread there
    assert "nvcf-worker-utils-result" not in plain.json()["headers"]  # the caller's: dropped


@own_app
async def test_the_sidecars_refusals_end_the_request(
    client_factory: ClientFactory, tmp_path: Path, worker: FileWorker
) -> None:
    """Through a real sidecar process: a result past its bound and an asset it cannot fetch
    end the request with the sidecar's reason; a caller's forged instructions are dropped."""
    mount = tmp_path / "pod"
    mount.mkdir()
    sidecar = Sidecar(worker.url, mount, "--max-result-bytes", "100000")
    try:
        client, fn = await app(client_factory, tmp_path, worker)
        adapter = client.app.state.adapters.get("inv-0")
        adapter.files_on_this_machine = False
        adapter.files_in_sidecar = True
        adapter.upstream = sidecar.url
        large = await client.post(
            pexec_url(fn), json={}, headers={"X-Worker-Mode": "output:200000"}
        )
        assert "NVCF_ASSET_RESULT_MAX_BYTES" in str(assert_problem(large, 502)["detail"])
        assert large.headers["nvcf-status"] == "errored"

        # an asset the sidecar cannot fetch (its signed URL points at this in-process
        # server, which no socket reaches): 503 naming it, as a store failure is
        asset = await uploaded(client)
        unfetched = await client.post(
            pexec_url(fn), json={}, headers={"NVCF-INPUT-ASSET-REFERENCES": asset}
        )
        assert asset in str(assert_problem(unfetched, 503)["detail"])
        assert unfetched.headers["nvcf-status"] == "errored"

        forged = await client.post(
            pexec_url(fn),
            json={},
            headers={"NVCF-WORKER-UTILS": "forged", "NVCF-WORKER-UTILS-PROGRESS": asset},
        )
        assert forged.status_code == 200
        report = forged.json()
        assert "nvcf-worker-utils" not in report["headers"]  # the platform's own, stripped
        assert report["headers"]["nvcf-large-output-dir"].startswith(str(mount))
    finally:
        sidecar.stop()
