"""Per-request asset and output directories: assets fetched under their ids before the worker
runs, NVCF's headers, outputs scanned without following links, progress files read as NVCF's
worker utilities write them, everything removed after."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from service.assets.files import (
    OutputDirs,
    RequestFiles,
    TooManyOutputs,
    read_progress,
    scan_outputs,
    sweep,
)
from service.core.errors import ValidationFailed
from tests.support.app import AppClient
from tests.support.assets import anonymous

A = "/v2/nvcf/assets"


async def test_assets_are_fetched_under_their_ids_and_removed_after(
    client: AppClient, tmp_path: Path
) -> None:
    payloads = {}
    ids = []
    for n in (1, 2):
        made = (await client.post(A, json={"contentType": "a/b", "description": ""})).json()
        data = os.urandom(10_000 * n)
        async with anonymous(client) as anon:
            assert (await anon.put(made["uploadUrl"], content=data)).status_code == 200
        payloads[made["assetId"]] = data
        ids.append(uuid.UUID(made["assetId"]))
    assets = client.app.state.assets
    async with client.app.state.sessionmaker() as session, session.begin():
        resolved = await assets.resolve(session, "nvcf-default", ids)
    request_id = uuid.uuid4()
    files = await RequestFiles.prepare(assets.store, tmp_path / "files", request_id, resolved)
    assert files.asset_dir == tmp_path / "files" / "assets" / str(request_id)
    assert files.output_dir == tmp_path / "files" / "output" / str(request_id)
    assert sorted(p.name for p in files.asset_dir.iterdir()) == sorted(payloads)
    for name, data in payloads.items():
        got = (files.asset_dir / name).read_bytes()
        assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    assert files.output_dir.is_dir() and not any(files.output_dir.iterdir())
    assert dict(files.worker_headers()) == {
        "NVCF-ASSET-DIR": str(files.asset_dir),
        "NVCF-LARGE-OUTPUT-DIR": str(files.output_dir),
        "NVCF-FUNCTION-ASSET-IDS": ",".join(str(i) for i in ids),
    }
    # the worker changing its copy never changes the stored asset
    (files.asset_dir / str(ids[0])).write_bytes(b"changed")
    assert await assets.store.size(f"assets/{ids[0]}") == 10_000
    await files.remove()
    assert not files.asset_dir.exists() and not files.output_dir.exists()


async def test_no_assets_no_id_header(client: AppClient, tmp_path: Path) -> None:
    files = await RequestFiles.prepare(client.app.state.assets.store, tmp_path, uuid.uuid4(), [])
    assert [name for name, _ in files.worker_headers()] == [
        "NVCF-ASSET-DIR",
        "NVCF-LARGE-OUTPUT-DIR",
    ]
    await files.remove()


async def test_a_failed_fetch_leaves_nothing_behind(client: AppClient, tmp_path: Path) -> None:
    made = (await client.post(A, json={"contentType": "a/b", "description": ""})).json()
    async with anonymous(client) as anon:
        await anon.put(made["uploadUrl"], content=b"x")
    assets = client.app.state.assets
    async with client.app.state.sessionmaker() as session, session.begin():
        resolved = await assets.resolve(session, "nvcf-default", [uuid.UUID(made["assetId"])])
    await assets.store.delete(resolved[0].key)  # gone between admission and fetch
    with pytest.raises(ValidationFailed) as caught:
        await RequestFiles.prepare(assets.store, tmp_path, uuid.uuid4(), resolved)
    assert made["assetId"] in caught.value.errors[0].message
    assert list((tmp_path / "assets").iterdir()) == []
    assert list((tmp_path / "output").iterdir()) == []


def test_outputs_are_regular_files_but_progress_and_links(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.bin").write_bytes(b"bb")
    (tmp_path / "sub" / "a.txt").write_bytes(b"a")
    (tmp_path / "progress").write_text("{}")
    secret = tmp_path.parent / "secret"
    secret.write_text("not yours")
    (tmp_path / "link").symlink_to(secret)
    (tmp_path / "dirlink").symlink_to(tmp_path.parent, target_is_directory=True)
    outputs = scan_outputs(tmp_path, 10, 100)
    assert [(o.name, o.size) for o in outputs] == [("b.bin", 2), ("sub/a.txt", 1)]


def test_outputs_are_bounded(tmp_path: Path) -> None:
    for n in range(3):
        (tmp_path / f"f{n}").write_bytes(b"x" * 10)
    with pytest.raises(TooManyOutputs, match="NVCF_ASSET_RESULT_MAX_FILES"):
        scan_outputs(tmp_path, 2, 1000)
    with pytest.raises(TooManyOutputs, match="NVCF_ASSET_RESULT_MAX_BYTES"):
        scan_outputs(tmp_path, 10, 25)


def test_progress_as_nvcf_worker_utilities_write_it(tmp_path: Path) -> None:
    rid = uuid.uuid4()
    assert read_progress(tmp_path, rid) is None
    report = {"id": str(rid), "progress": 50, "partialResponse": {"frames": [1, 2]}}
    (tmp_path / "progress").write_text(json.dumps(report))
    progress = read_progress(tmp_path, rid)
    assert progress is not None
    assert progress.percent == 50
    assert json.loads(progress.partial) == {"frames": [1, 2]}
    (tmp_path / "progress").write_text(json.dumps({"id": str(rid), "progress": 100}))
    done = read_progress(tmp_path, rid)
    assert done is not None and done.percent == 100 and done.partial == b"null"


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        json.dumps({"id": "another-request", "progress": 10}),
        json.dumps({"progress": 10}),
        "ID",  # the id is filled in below
        json.dumps([1, 2]),
        "x" * 70_000,
    ],
)
def test_a_bad_progress_file_is_ignored(tmp_path: Path, content: str) -> None:
    rid = uuid.uuid4()
    if content == "ID":
        content = json.dumps({"id": str(rid), "progress": 101})
    (tmp_path / "progress").write_text(content)
    assert read_progress(tmp_path, rid) is None


def test_a_progress_link_is_not_followed(tmp_path: Path) -> None:
    rid = uuid.uuid4()
    target = tmp_path / "elsewhere"
    target.write_text(json.dumps({"id": str(rid), "progress": 10}))
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "progress").symlink_to(target)
    assert read_progress(folder, rid) is None


async def test_output_directories_are_reused_per_instance_only_when_empty(
    tmp_path: Path,
) -> None:
    dirs = OutputDirs(tmp_path)
    first = await dirs.take("instance-a")
    assert first.is_dir() and not any(first.iterdir())
    await dirs.give_back("instance-a", first)
    assert await dirs.take("instance-a") == first  # empty: reused
    assert await dirs.take("instance-b") != first  # never another instance's
    (first / "out.bin").write_bytes(b"x")
    await dirs.give_back("instance-a", first)
    assert not first.exists()  # written to: removed, not reused
    again = await dirs.take("instance-a")
    assert again != first and again.is_dir()
    await dirs.aclose()
    assert not dirs.root.exists()


def test_the_sweep_removes_what_crashed_processes_left(tmp_path: Path) -> None:
    root = tmp_path / "request-files"
    live = OutputDirs(root / "output")
    folder = asyncio.run(live.take("instance-1"))
    # another process that holds its folder's lock, then crashes (killed)
    other = root / "output" / "other-process"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from service.assets.files import _claim; "
            f"_claim(Path({str(other)!r})); print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        (other / "inst" / "1").mkdir(parents=True)
        old, fresh = root / "assets" / str(uuid.uuid4()), root / "assets" / str(uuid.uuid4())
        for path in (old, fresh):
            path.mkdir(parents=True)
        (root / "results").mkdir()
        spool = root / "results" / f"{uuid.uuid4()}.zip"
        spool.write_bytes(b"zip")
        long_ago = time.time() - 4000
        for path in (old, spool):
            os.utime(path, (long_ago, long_ago))

        assert sweep(root, 3600) == 2  # the old asset directory and spool file
        assert not old.exists() and not spool.exists() and fresh.is_dir()
        assert other.is_dir() and folder.is_dir()  # both processes hold their locks

        holder.kill()
        holder.wait()
        assert sweep(root, 3600) == 1
        assert not other.exists()
        assert folder.is_dir()  # this process is alive
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
        if holder.stdin is not None:
            holder.stdin.close()
        asyncio.run(live.aclose())
    assert not live.root.exists()


async def test_requests_arriving_together_claim_the_folder_once(tmp_path: Path) -> None:
    dirs = OutputDirs(tmp_path / "output")
    try:
        folders = await asyncio.gather(*(dirs.take(f"instance-{n % 2}") for n in range(8)))
        assert len(set(folders)) == 8 and all(f.is_dir() for f in folders)
    finally:
        await dirs.aclose()
