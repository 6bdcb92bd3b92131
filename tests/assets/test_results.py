"""Large results: the answer body and the worker's output files kept as one zip (NVCF's
layout), downloaded through the signed URL the caller is sent to, with no key."""

from __future__ import annotations

import io
import os
import time
import uuid
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from service.assets.files import RequestFiles
from service.assets.results import ResultTooLarge, store_result
from tests.support.app import AppClient, ClientFactory
from tests.support.assets import anonymous


async def chunks(data: bytes, size: int = 65536) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def test_body_and_outputs_are_one_zip_behind_a_signed_url(
    client: AppClient, tmp_path: Path
) -> None:
    assets = client.app.state.assets
    rid = uuid.uuid4()
    files = await RequestFiles.prepare(assets.store, tmp_path, rid, [])
    frames = os.urandom(2 * 1024 * 1024)
    (files.output_dir / "video").mkdir()
    (files.output_dir / "video" / "out.mp4").write_bytes(frames)
    (files.output_dir / "progress").write_text('{"id": "x", "progress": 100}')
    body = b'{"done": true}'
    url = await store_result(assets, rid, chunks(body), files, str(client.base_url))
    assert url.startswith(f"http://nvcf.test/storage/results/{rid}?")
    async with anonymous(client) as anon:
        resp = await anon.get(url)
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "application/zip"
    archive = zipfile.ZipFile(io.BytesIO(resp.content))
    assert sorted(archive.namelist()) == sorted([f"{rid}.response", "video/out.mp4"])
    assert archive.read(f"{rid}.response") == body
    assert archive.read("video/out.mp4") == frames
    # nothing is left in the spool
    assert list((assets.settings.asset_files_root / "results").iterdir()) == []
    await files.remove()


async def test_a_body_alone(client: AppClient) -> None:
    rid = uuid.uuid4()
    body = os.urandom(100_000)
    url = await store_result(client.app.state.assets, rid, chunks(body), None, "http://h/")
    async with anonymous(client) as anon:
        got = await anon.get(url)
    assert zipfile.ZipFile(io.BytesIO(got.content)).read(f"{rid}.response") == body


async def test_a_result_over_its_bound_is_refused_and_leaves_nothing(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    client = await client_factory(asset_result_max_bytes=1000)
    assets = client.app.state.assets
    rid = uuid.uuid4()
    with pytest.raises(ResultTooLarge, match="NVCF_ASSET_RESULT_MAX_BYTES"):
        await store_result(assets, rid, chunks(b"x" * 1001, 100), None, "http://h/")
    files = await RequestFiles.prepare(assets.store, tmp_path, rid, [])
    (files.output_dir / "big").write_bytes(b"x" * 600)
    with pytest.raises(ResultTooLarge):
        await store_result(assets, rid, chunks(b"x" * 600), files, "http://h/")
    assert await assets.store.size(f"results/{rid}") is None
    assert list((assets.settings.asset_files_root / "results").iterdir()) == []


async def test_old_results_are_purged(client_factory: ClientFactory) -> None:
    # the purge is called here alone (the application's own would race this one)
    client = await client_factory(invoke_result_ttl_seconds=60, asset_purge_period_seconds=0)
    assets = client.app.state.assets
    rid, young = uuid.uuid4(), uuid.uuid4()
    await store_result(assets, rid, chunks(b"body"), None, "http://h/")
    await store_result(assets, young, chunks(b"body"), None, "http://h/")
    written = assets.store.root / "results" / str(rid)
    then = time.time() - 120  # written two minutes ago, past the 60 s the results are kept
    os.utime(written, (then, then))
    assert await assets.purge(client.app.state.sessionmaker) == 1
    assert await assets.store.size(f"results/{young}") is not None
    assert await assets.store.size(f"results/{rid}") is None
