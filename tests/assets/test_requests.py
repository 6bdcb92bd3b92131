"""The invocation engine's asset port: input assets resolved for the calling account, refused
for workers they cannot be handed to, a detached answer of unknown length read whole when it is
small and kept as a large result when it is not."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from service.assets.files import RequestFiles
from service.assets.requests import FilesRefused, Kept, RequestAssets, Whole
from service.backends.worker import WorkerEndpoint, WorkerResponse
from service.clusters.adapters import AdapterRegistry
from service.core.errors import ServiceUnavailable
from tests.support.app import AppClient
from tests.support.assets import anonymous, uploaded


class Answer(WorkerResponse):
    """A worker's 200 of unknown length (no content-length), sent in two chunks."""

    def __init__(self, body: bytes) -> None:
        self.status = 200
        self.headers = [("content-type", "text/plain")]
        self.body = body
        self.closed = False

    async def iter_bytes(self) -> AsyncIterator[bytes]:
        half = len(self.body) // 2
        yield self.body[:half]
        yield self.body[half:]

    async def aclose(self) -> None:
        self.closed = True


def port(client: AppClient, *, served: bool = True, result_max: int = 16) -> RequestAssets:
    assets = client.app.state.assets
    settings = assets.settings.model_copy(update={"invoke_result_max_bytes": result_max})
    return RequestAssets(
        settings, assets if served else None, AdapterRegistry({}), client.app.state.sessionmaker
    )


async def test_input_assets_for_workers_off_this_machine_are_refused(client: AppClient) -> None:
    asset_id = uuid.UUID(await uploaded(client))
    requests = port(client)
    inputs = await requests.resolve("nvcf-default", [asset_id], "NVCF-INPUT-ASSET-REFERENCES")
    assert [a.id for a in inputs] == [asset_id]
    with pytest.raises(FilesRefused) as refused:
        await requests.prepare(uuid.uuid4(), inputs, "far-away", "i-1", WorkerEndpoint(), None)
    assert refused.value.status == 503
    assert "cluster far-away" in refused.value.reason
    # nothing to hand over: the request goes on without directories
    assert (
        await requests.prepare(uuid.uuid4(), [], "far-away", "i-1", WorkerEndpoint(), None) is None
    )
    await requests.aclose()


async def test_a_process_serving_no_assets_refuses_references(client: AppClient) -> None:
    with pytest.raises(ServiceUnavailable):
        await port(client, served=False).resolve("nvcf-default", [uuid.uuid4()], "field")


async def test_a_detached_answer_of_unknown_length_is_read_whole_or_kept_when_large(
    client: AppClient,
) -> None:
    requests = port(client, result_max=16)
    assets = client.app.state.assets
    rid = uuid.uuid4()
    files = await RequestFiles.prepare(assets.store, assets.settings.asset_files_root, rid, [])
    small = Answer(b"twelve bytes")
    whole = await requests.large(rid, files, small, None, detached=True, base_url=None)
    assert whole == Whole(b"twelve bytes") and small.closed
    # a waiting caller gets the stream as it comes
    waiting = Answer(b"x" * 64)
    assert await requests.large(rid, files, waiting, None, detached=False, base_url=None) is None
    large = Answer(b"y" * 64)
    kept = await requests.large(
        rid, files, large, None, detached=True, base_url=lambda: str(client.base_url)
    )
    assert isinstance(kept, Kept) and large.closed
    async with anonymous(client) as anon:
        assert (await anon.get(kept.url)).status_code == 200
    await files.remove()
    await requests.aclose()
