"""gRPC sessions across replicas: two real server processes (`serve` and `invoke`) on one
database and one Redis, each with its own gRPC listener, a real gRPC server as the worker of
a two-instance function. A session opened on one replica is resumed on the other, on its
instance; an unknown one, or one that ended, is NOT_FOUND there."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc import aio
from redis.asyncio import Redis

from service.core.settings import Settings
from service.invocation.sessions import PREFIX
from tests.support.api import CONTAINER_FN
from tests.support.app import ADMIN_KEY
from tests.support.e2e import V, eventually
from tests.support.grpc_worker import GrpcWorker, text
from tests.support.invocation import spec, write_catalog
from tests.support.redis import RedisServer
from tests.support.server import free_port, start_server, stop_server


@pytest.fixture
async def worker() -> AsyncIterator[GrpcWorker]:
    w = await GrpcWorker().start()
    try:
        yield w
    finally:
        await w.stop()


def md(fn: dict[str, Any], **more: str) -> tuple[tuple[str, str], ...]:
    return (
        ("authorization", f"Bearer {ADMIN_KEY}"),
        ("function-id", fn["id"]),
        *((k.replace("_", "-"), v) for k, v in more.items()),
    )


def unary(channel: aio.Channel) -> aio.UnaryUnaryMultiCallable[bytes, bytes]:
    return channel.unary_unary("/test.Echo/Unary")


def bidi(channel: aio.Channel) -> aio.StreamStreamMultiCallable[bytes, bytes]:
    return channel.stream_stream("/test.Echo/Bidi")


async def resumed(channel: aio.Channel, fn: dict[str, Any], request_id: str) -> grpc.StatusCode:
    call = unary(channel)(b"r", metadata=md(fn, nvcf_reqid=request_id))
    try:
        await call
    except aio.AioRpcError as exc:
        return exc.code()
    assert dict(await call.initial_metadata())["nvcf-reqid"] == request_id
    return grpc.StatusCode.OK


async def test_a_session_is_resumed_on_its_instance_from_another_replica(
    tmp_path: Path, database_url: str, redis_server: RedisServer, worker: GrpcWorker
) -> None:
    """The `serve` replica ends a session with its last call (idle time 0); the `invoke`
    replica keeps an ended one for the default idle time (a client reconnecting)."""
    assert Settings().grpc_session_idle_seconds > 0
    common = {
        "NVCF_CLUSTERS_FILE": str(write_catalog(tmp_path, upstream=worker.url)),
        "NVCF_RECONCILE_INTERVAL": "0.05",
        "NVCF_REDIS_URL": redis_server.url,
        "NVCF_RATE_LIMIT_PER_SECOND": "0",
        "NVCF_GRPC_ENABLED": "true",
    }
    api_port, invoke_port = free_port(), free_port()
    grpc_one, grpc_two = free_port(), free_port()
    one = await asyncio.to_thread(
        start_server,
        tmp_path / "d",
        database_url,
        api_port,
        NVCF_GRPC_PORT=str(grpc_one),
        NVCF_GRPC_SESSION_IDLE_SECONDS="0",
        env=common,
    )
    two = None
    try:
        two = await asyncio.to_thread(
            start_server,
            tmp_path / "d",
            database_url,
            invoke_port,
            "invoke",
            NVCF_GRPC_PORT=str(grpc_two),
            env=common,
        )
        fn = await _deployed(api_port)
        async with (
            aio.insecure_channel(f"127.0.0.1:{grpc_one}") as on_one,
            aio.insecure_channel(f"127.0.0.1:{grpc_two}") as on_two,
        ):
            await _resume_across(fn, on_one, on_two, worker, redis_server.url)
    finally:
        if two is not None:
            await asyncio.to_thread(stop_server, two)
        await asyncio.to_thread(stop_server, one)


async def _deployed(port: int) -> dict[str, Any]:
    """A gRPC function with two Running instances taking four calls each."""
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=30
    ) as api:
        body = {**CONTAINER_FN, "name": "grpc-echo", "inferenceUrl": "/gRPC", "inferencePort": 8001}
        resp = await api.post(f"{V}/functions", json=body)
        assert resp.status_code == 200, resp.text
        fn: dict[str, Any] = resp.json()["function"]
        two = spec(minInstances=2, maxInstances=2, maxRequestConcurrency=4)
        url = f"{V}/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
        resp = await api.post(url, json={"deploymentSpecifications": [two]})
        assert resp.status_code == 200, resp.text

        async def running() -> bool:
            instances = (await api.get(url)).json()["deployment"]["instances"]
            return [i["phase"] for i in instances].count("Running") == 2

        await eventually(running)
    return fn


async def _resume_across(
    fn: dict[str, Any],
    on_one: aio.Channel,
    on_two: aio.Channel,
    worker: GrpcWorker,
    redis_url: str,
) -> None:
    # a stream open on the first replica ...
    session = bidi(on_one)(metadata=md(fn))
    await session.write(b"open")
    assert await session.read() == b"open"
    request_id = text(dict(await session.initial_metadata())["nvcf-reqid"])
    instance = worker.calls[-1].metadata["nvcf-instance-id"]
    # ... holds a slot the second sees: a new call there goes to the other instance ...
    assert await unary(on_two)(b"new", metadata=md(fn)) == b"new"
    assert worker.calls[-1].metadata["nvcf-instance-id"] != instance
    # ... and a resumed one to the session's
    for _ in range(3):
        assert await resumed(on_two, fn, request_id) == grpc.StatusCode.OK
        assert worker.calls[-1].metadata["nvcf-instance-id"] == instance
        assert worker.calls[-1].metadata["nvcf-reqid"] == request_id
    assert await resumed(on_two, fn, str(uuid.uuid4())) == grpc.StatusCode.NOT_FOUND
    # the first replica ends a session with its last call (idle time 0)
    await session.done_writing()
    assert await session.read() == aio.EOF

    # (a resumption while its end is on the way would start the session again: wait for
    # the end to reach Redis before trying)
    async with Redis.from_url(redis_url) as redis:

        async def ended() -> bool:
            return not await redis.exists(f"{PREFIX}{request_id}")

        await eventually(ended)
    assert await resumed(on_two, fn, request_id) == grpc.StatusCode.NOT_FOUND
    # a call that ended on the second replica stays resumable (its idle time) on the first:
    # three streams resuming it at once all go to its instance (the first replica ends the
    # session when they end)
    first = unary(on_two)(b"first", metadata=md(fn))
    assert await first == b"first"
    request_id = text(dict(await first.initial_metadata())["nvcf-reqid"])
    instance = worker.calls[-1].metadata["nvcf-instance-id"]
    streams = []
    for n in range(3):
        stream = bidi(on_one)(metadata=md(fn, nvcf_reqid=request_id))
        await stream.write(b"%d" % n)
        assert await stream.read() == b"%d" % n
        assert worker.calls[-1].metadata["nvcf-instance-id"] == instance
        assert dict(await stream.initial_metadata())["nvcf-reqid"] == request_id
        streams.append(stream)
    for stream in streams:
        await stream.done_writing()
        assert await stream.read() == aio.EOF
