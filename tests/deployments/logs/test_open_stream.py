"""`open_stream`: an answer whose first line has not come yet, left by its caller (a client
that disconnects while the answer is being opened or read), ends cleanly and frees its
follow slot."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

import pytest

from service.backends.logs import LogLine, LogRequest
from service.backends.protocol import BackendAdapter, InstanceSpec
from service.deployments.logs.mask import NO_SECRETS
from service.deployments.logs.service import FollowLimiter, Reading, Source, open_stream
from tests.support.app import SettingsFactory

TARGET = InstanceSpec(
    instance_id="inst-1",
    function_id="fn-1",
    version_id="ver-1",
    instance_type="NCP.GPU.H100_1x",
    gpu="H100",
    gpus_per_node=1,
    worker_service="web",
)


class Silent:
    """A backend whose containers print nothing yet (the adapter's `logs` alone)."""

    async def logs(self, instance: InstanceSpec, request: LogRequest) -> AsyncIterator[LogLine]:
        await asyncio.Event().wait()
        yield LogLine("pod", "c", "never")


def reading() -> Reading:
    source = Source(cast(BackendAdapter, Silent()), TARGET)
    return Reading(LogRequest(follow=True), NO_SECRETS, [source])


async def test_a_caller_leaving_while_the_first_line_is_awaited_frees_the_follow(
    make_settings: SettingsFactory,
) -> None:
    limiter = FollowLimiter(1)
    task = asyncio.create_task(open_stream(reading(), make_settings(), limiter.acquire("acct")))
    await asyncio.sleep(0.05)  # inside the peek, the first line pending
    task.cancel()
    with pytest.raises(asyncio.CancelledError):  # not "generator is already running"
        await asyncio.wait_for(task, 5)
    assert limiter.open("acct") == 0


async def test_an_answer_closed_before_its_first_line_frees_the_follow(
    make_settings: SettingsFactory, monkeypatch: Any
) -> None:
    monkeypatch.setattr("service.deployments.logs.service.PEEK_SECONDS", 0.01)
    limiter = FollowLimiter(1)
    stream = await open_stream(reading(), make_settings(), limiter.acquire("acct"))
    assert isinstance(stream, AsyncGenerator)
    reader = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.05)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(reader, 5)
    await asyncio.wait_for(stream.aclose(), 5)
    assert limiter.open("acct") == 0
