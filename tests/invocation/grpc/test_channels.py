"""The gRPC listener's channels to workers: one per address, shared, bounded, and a worker
that refuses the connection is `WorkerUnreachable` (nothing sent) with its channel dropped; the
sweep closes the channels left idle."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from service.backends.worker import WorkerEndpoint, WorkerUnreachable
from service.invocation.grpc import channels as channels_module
from service.invocation.grpc.channels import Channels, worker_address
from tests.support.e2e import eventually
from tests.support.grpc_worker import GrpcWorker
from tests.support.server import free_port


class Endpoint(WorkerEndpoint):
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.health_url = None


def test_worker_addresses() -> None:
    assert worker_address("http://10.0.0.1:8001") == ("10.0.0.1:8001", False)
    assert worker_address("https://w.example:443") == ("w.example:443", True)
    assert worker_address("http://svc.ns") == ("svc.ns:80", False)
    assert worker_address("http://[::1]:9") == ("[::1]:9", False)
    for bad in ("ftp://x:1", "http://", "not a url"):
        with pytest.raises(WorkerUnreachable):
            worker_address(bad)


async def test_one_channel_per_address_bounded_and_a_refusal_drops_it() -> None:
    one, two = await GrpcWorker().start(), await GrpcWorker().start()
    channels = Channels(limit=1, idle_seconds=60, max_message_bytes=1024)
    try:
        first = await channels.acquire(Endpoint(f"http://127.0.0.1:{one.port}"))
        again = await channels.acquire(Endpoint(f"http://127.0.0.1:{one.port}"))
        assert again.channel is first.channel and len(channels) == 1
        first.release()
        # still in use: over the bound rather than closing a channel a call holds
        other = await channels.acquire(Endpoint(f"http://127.0.0.1:{two.port}"))
        assert len(channels) == 2
        again.release()
        other.release()
        # a refused connection (nobody listens there): nothing sent, the channel is not kept
        with pytest.raises(WorkerUnreachable):
            await channels.acquire(Endpoint(f"http://127.0.0.1:{free_port()}"))
        assert len(channels) <= 2
        # the idle ones make room for a new address: at most the bound stays open
        three = await GrpcWorker().start()
        try:
            lease = await channels.acquire(Endpoint(f"http://127.0.0.1:{three.port}"))
            lease.release()
            assert len(channels) == 1
        finally:
            await three.stop()
    finally:
        await channels.aclose()
        await one.stop()
        await two.stop()


async def test_the_sweep_closes_idle_channels_and_keeps_held_ones() -> None:
    idle_worker, busy_worker = await GrpcWorker().start(), await GrpcWorker().start()
    channels = Channels(limit=4, idle_seconds=0.2, max_message_bytes=1024)
    channels.start()
    try:
        idle = await channels.acquire(Endpoint(f"http://127.0.0.1:{idle_worker.port}"))
        idle.release()
        held = await channels.acquire(Endpoint(f"http://127.0.0.1:{busy_worker.port}"))
        assert len(channels) == 2

        async def one_left() -> bool:
            return len(channels) == 1

        await eventually(one_left)
        assert held.channel.get_state() == grpc.ChannelConnectivity.READY
        # the held channel is the one kept: a new call to its worker shares it
        again = await channels.acquire(Endpoint(f"http://127.0.0.1:{busy_worker.port}"))
        assert again.channel is held.channel
        again.release()
        held.release()
    finally:
        await channels.aclose()
        await idle_worker.stop()
        await busy_worker.stop()


async def test_a_methods_callable_is_made_once_per_channel_and_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(channels_module, "METHODS_KEPT", 2)
    worker = await GrpcWorker().start()
    channels = Channels(limit=4, idle_seconds=60, max_message_bytes=1024)
    try:
        lease = await channels.acquire(Endpoint(f"http://127.0.0.1:{worker.port}"))
        unary = lease.method("/test.Echo/Unary")
        assert lease.method("/test.Echo/Unary") is unary
        # another call on the same channel shares it
        other = await channels.acquire(Endpoint(f"http://127.0.0.1:{worker.port}"))
        assert other.method("/test.Echo/Unary") is unary
        # each callable calls its own method
        assert [m async for m in unary(_one(b"hello"))] == [b"hello"]
        counted = lease.method("/test.Echo/ServerStream")
        assert [m async for m in counted(_one(b"3"))] == [b"0", b"1", b"2"]
        # a third method pushes out the one made first, which is made again when called
        lease.method("/test.Echo/ClientStream")
        assert lease.method("/test.Echo/ServerStream") is counted
        assert lease.method("/test.Echo/Unary") is not unary
        lease.release()
        other.release()
    finally:
        await channels.aclose()
        await worker.stop()


async def _one(message: bytes) -> AsyncIterator[bytes]:
    yield message
