"""The worker-utils sidecar of a task's pod (service/assets/task_files.py) as the platform asks
it: the progress file as written (none yet: 204; past the bound: 413), a result's files as one
tar stream that unpacks to the same bytes, every refused name or bound with its reason, nothing
outside the result's directory ever read, and the `preStop` linger that the platform's release
ends."""

from __future__ import annotations

import asyncio
import io
import os
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from service.assets.task_files import TaskLimits, TaskSidecar, result_entries, tar_stream

LIMITS = TaskLimits(max_progress_bytes=100, max_result_bytes=1000, max_result_files=3, timeout=60)


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    results = tmp_path / "results"
    results.mkdir()
    return tmp_path / "progress.json", results


@pytest.fixture
async def client(files: tuple[Path, Path]) -> AsyncIterator[httpx.AsyncClient]:
    app = TaskSidecar(files[0], files[1], LIMITS)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as http:
        yield http


def members(body: bytes) -> dict[str, bytes | None]:
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:") as tar:
        out: dict[str, bytes | None] = {}
        for m in tar.getmembers():
            fh = tar.extractfile(m) if m.isfile() else None
            out[m.name] = fh.read() if fh is not None else None
        return out


async def test_progress_is_served_as_written(
    client: httpx.AsyncClient, files: tuple[Path, Path]
) -> None:
    assert (await client.get("/nvct/progress")).status_code == 204
    files[0].write_bytes(b'{"percentComplete": 10}')
    answer = await client.get("/nvct/progress")
    assert (answer.status_code, answer.content) == (200, b'{"percentComplete": 10}')


async def test_progress_past_the_bound_is_refused(
    client: httpx.AsyncClient, files: tuple[Path, Path]
) -> None:
    files[0].write_bytes(b"x" * 50)
    small = await client.get("/nvct/progress", params={"maxBytes": 20})
    assert small.status_code == 413
    assert small.json() == {"detail": "the progress file passes 20 bytes"}
    files[0].write_bytes(b"x" * 101)
    assert (await client.get("/nvct/progress", params={"maxBytes": 500})).status_code == 413


async def test_a_linked_progress_file_is_not_followed(
    client: httpx.AsyncClient, files: tuple[Path, Path], tmp_path: Path
) -> None:
    (tmp_path / "elsewhere").write_text("private")
    files[0].symlink_to(tmp_path / "elsewhere")
    assert (await client.get("/nvct/progress")).status_code == 204


async def test_a_result_is_one_tar_stream_of_its_files(
    client: httpx.AsyncClient, files: tuple[Path, Path]
) -> None:
    result = files[1] / "checkpoint-1"
    (result / "weights").mkdir(parents=True)
    (result / "weights" / "model.bin").write_bytes(os.urandom(700))
    (result / "config.json").write_bytes(b"{}")
    (files[1] / "checkpoint-2").mkdir()
    (files[1] / "checkpoint-2" / "other").write_bytes(b"not this one")
    answer = await client.get("/nvct/results/checkpoint-1")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/x-tar"
    assert int(answer.headers["content-length"]) == len(answer.content)
    assert members(answer.content) == {
        "checkpoint-1": None,
        "checkpoint-1/weights": None,
        "checkpoint-1/config.json": b"{}",
        "checkpoint-1/weights/model.bin": (result / "weights" / "model.bin").read_bytes(),
    }


@pytest.mark.parametrize("name", ["%2E%2E", "%2E", ".hidden", "a%2Fb", "a b", "x" * 191])
async def test_a_name_unsafe_as_a_path_or_past_nvcts_rule_is_refused(
    client: httpx.AsyncClient, name: str
) -> None:
    answer = await client.get(f"/nvct/results/{name}")
    assert answer.status_code == 400
    assert "is not a result's name (1-190 letters" in answer.json()["detail"]


@pytest.mark.parametrize("name", ["step(1)!*'", "-first", "v1.0", "x" * 190])
async def test_every_name_nvcts_progress_file_allows_is_listed_and_served(
    client: httpx.AsyncClient, files: tuple[Path, Path], name: str
) -> None:
    (files[1] / name).mkdir()
    (files[1] / name / "w.bin").write_bytes(b"weights")
    assert (await client.get("/nvct/results")).json() == [name]
    answer = await client.get(f"/nvct/results/{quote(name, safe='')}")
    assert answer.status_code == 200, answer.text
    assert members(answer.content) == {name: None, f"{name}/w.bin": b"weights"}


async def test_a_missing_result_is_404(client: httpx.AsyncClient, files: tuple[Path, Path]) -> None:
    (files[1] / "file").write_text("a file, not a result directory")
    for name in ("nope", "file"):
        answer = await client.get(f"/nvct/results/{name}")
        assert answer.status_code == 404, name


async def test_the_bounds_on_bytes_and_files(
    client: httpx.AsyncClient, files: tuple[Path, Path]
) -> None:
    big = files[1] / "big"
    big.mkdir()
    (big / "a").write_bytes(b"x" * 600)
    (big / "b").write_bytes(b"x" * 600)
    many = files[1] / "many"
    many.mkdir()
    for i in range(4):
        (many / str(i)).write_bytes(b"x")
    answer = await client.get("/nvct/results/big")
    assert (answer.status_code, answer.json()) == (
        413,
        {"detail": "result 'big' passes 1000 bytes"},
    )
    answer = await client.get("/nvct/results/many")
    assert answer.status_code == 413
    assert answer.json() == {"detail": "result 'many' holds more than 3 files"}
    # the platform's own bounds lower the sidecar's, never raise them
    assert (await client.get("/nvct/results/many", params={"maxFiles": 2})).status_code == 413
    assert (await client.get("/nvct/results/many", params={"maxFiles": 100})).status_code == 413
    (many / "3").unlink()
    assert (await client.get("/nvct/results/many", params={"maxBytes": 2})).status_code == 413
    assert (await client.get("/nvct/results/many", params={"maxBytes": 3})).status_code == 200
    bad = await client.get("/nvct/results/many", params={"maxBytes": "-1"})
    assert (bad.status_code, bad.json()) == (400, {"detail": "maxBytes must be a positive integer"})


async def test_a_stream_past_its_time_is_cut(files: tuple[Path, Path]) -> None:
    (files[1] / "slow").mkdir()
    (files[1] / "slow" / "a").write_bytes(b"x" * 10)
    limits = TaskLimits(100, 1000, 3, timeout=0)
    transport = httpx.ASGITransport(app=TaskSidecar(files[0], files[1], limits))
    async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as http:
        with pytest.raises(TimeoutError):  # the connection is cut: the platform sees a short body
            await http.get("/nvct/results/slow")


async def test_a_file_that_shrinks_while_sent_cuts_the_stream(files: tuple[Path, Path]) -> None:
    (files[1] / "changing").mkdir()
    data = files[1] / "changing" / "a"
    data.write_bytes(b"x" * 5000)
    entries = result_entries(files[1], "changing", 10_000, 10)
    data.write_bytes(b"x" * 10)
    with pytest.raises(OSError, match="shrank while it was sent"):
        async for _ in tar_stream(entries):
            pass


async def test_links_out_of_the_result_are_refused(
    client: httpx.AsyncClient, files: tuple[Path, Path], tmp_path: Path
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("the sidecar's own file")
    linked = files[1] / "linked"
    linked.mkdir()
    (linked / "model.bin").symlink_to(secret)
    answer = await client.get("/nvct/results/linked")
    assert answer.status_code == 422
    assert answer.json() == {"detail": "result 'linked': linked/model.bin is a symbolic link"}
    (files[1] / "outside").symlink_to(tmp_path, target_is_directory=True)
    assert (await client.get("/nvct/results/outside")).status_code == 404


async def test_files_the_sidecar_may_not_read_are_refused_saying_so(
    client: httpx.AsyncClient, files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    files[0].write_bytes(b"{}")
    (files[1] / "private").mkdir()
    (files[1] / "private" / "model.bin").write_bytes(b"x")

    def denied(*args: object) -> int:
        raise PermissionError(13, "Permission denied")

    # as another user than the task container's, with files it left unreadable (the tests
    # run as root, whom no mode stops)
    monkeypatch.setattr(os, "open", denied)
    monkeypatch.setattr(os, "access", lambda *args: False)
    answer = await client.get("/nvct/progress")
    assert answer.status_code == 403
    assert answer.json()["detail"].startswith("the progress file is not readable by the sidecar")
    answer = await client.get("/nvct/results/private")
    assert (answer.status_code, answer.json()) == (
        422,
        {"detail": "result 'private': private/model.bin is not readable by the sidecar"},
    )


def dated(path: Path, mtime: int) -> None:
    path.mkdir()
    os.utime(path, (mtime, mtime))


async def test_the_result_names_are_listed_oldest_first(
    client: httpx.AsyncClient, files: tuple[Path, Path], tmp_path: Path
) -> None:
    assert (await client.get("/nvct/results")).json() == []
    dated(files[1] / "b-first", 1_000)
    dated(files[1] / "a-second", 2_000)
    dated(files[1] / "c-third", 3_000)
    # not results: a file, a link to a directory, a name no result may have
    (files[1] / "file").write_text("a file")
    dated(tmp_path / "elsewhere", 500)
    (files[1] / "linked").symlink_to(tmp_path / "elsewhere")
    dated(files[1] / ".partial", 100)
    answer = await client.get("/nvct/results")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == ["b-first", "a-second", "c-third"]


async def test_the_result_names_are_bounded(
    client: httpx.AsyncClient, files: tuple[Path, Path]
) -> None:
    for i in range(5):
        dated(files[1] / f"r{i}", 1_000 + i)
    answer = await client.get("/nvct/results", params={"maxNames": 2})
    assert answer.json() == ["r0", "r1"]
    limits = TaskLimits(1, 1, 1, timeout=1, max_result_names=3)
    transport = httpx.ASGITransport(app=TaskSidecar(files[0], files[1], limits))
    async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as http:
        # the sidecar's own bound holds against a larger request
        assert (await http.get("/nvct/results", params={"maxNames": 50})).json() == [
            "r0",
            "r1",
            "r2",
        ]
    for bad in ("0", "-1", "many"):
        refused = await client.get("/nvct/results", params={"maxNames": bad})
        assert refused.status_code == 400
        assert refused.json() == {"detail": "maxNames must be a positive integer"}


async def test_a_missing_results_directory_has_no_names(files: tuple[Path, Path]) -> None:
    transport = httpx.ASGITransport(app=TaskSidecar(files[0], files[1] / "none", LIMITS))
    async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as http:
        answer = await http.get("/nvct/results")
        assert (answer.status_code, answer.json()) == (200, [])


async def test_other_paths_and_methods(client: httpx.AsyncClient) -> None:
    assert (await client.get("/")).status_code == 404
    assert (await client.put("/nvct/progress")).status_code == 405
    assert (await client.post("/nvct/results")).status_code == 405


async def test_the_linger_ends_with_the_release(files: tuple[Path, Path]) -> None:
    app = TaskSidecar(files[0], files[1], LIMITS)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as http:
        linger = asyncio.create_task(http.get("/nvct/linger"))
        await asyncio.sleep(0)
        assert not linger.done()
        assert (await http.post("/nvct/release")).status_code == 204
        assert (await linger).status_code == 204


async def test_the_linger_is_bounded(files: tuple[Path, Path]) -> None:
    limits = TaskLimits(1, 1, 1, timeout=1, linger=0)
    transport = httpx.ASGITransport(app=TaskSidecar(files[0], files[1], limits))
    async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as http:
        assert (await http.get("/nvct/linger")).status_code == 204
