"""Channels from the gRPC listener to workers: one `grpc.aio` channel (one HTTP/2 connection)
per worker address, shared by every call to it, at most `NVCF_GRPC_WORKER_CHANNELS` of them,
closed once idle for `NVCF_GRPC_CHANNEL_IDLE_SECONDS` (an instance that went away leaves an
idle channel behind: it is closed like any other). A channel makes each method's callable once
(`Lease.method`).

A worker's address is its endpoint's `h2_url` (the adapter's, backends/worker.py; its
`base_url` but for the simulated worker): `http://host:port` is reached over h2c,
`https://host:port` over TLS.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import grpc
from grpc import aio

from service.backends.worker import CONNECT_TIMEOUT, WorkerEndpoint, WorkerUnreachable
from service.core.loops import LoopService

log = logging.getLogger("nvcf.invocation.grpc")


#: the methods whose handler the listener keeps, and whose callable each channel keeps (the
#: callers name them: bounded)
METHODS_KEPT = 1024


@dataclass(eq=False)
class _Channel:
    channel: aio.Channel
    calls: int = 0
    used: float = field(default_factory=time.monotonic)
    #: a method's callable on this channel, made once
    methods: OrderedDict[str, aio.StreamStreamMultiCallable[bytes, bytes]] = field(
        default_factory=OrderedDict
    )


@functools.lru_cache(maxsize=4096)
def worker_address(url: str) -> tuple[str, bool]:
    """(host:port, TLS) of a worker's HTTP/2 address (`WorkerUnreachable` for one that is
    not http(s), which no gRPC channel can reach)."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WorkerUnreachable(f"the worker's address {url} cannot carry gRPC")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    tls = parts.scheme == "https"
    return f"{host}:{port or (443 if tls else 80)}", tls


class Lease:
    """A channel held by one call; `release` once the call ended."""

    def __init__(self, entry: _Channel) -> None:
        self._entry: _Channel | None = entry
        self.channel = entry.channel
        self._methods = entry.methods

    def method(self, name: str) -> aio.StreamStreamMultiCallable[bytes, bytes]:
        """The channel's callable of a method (any kind: a stream of bytes both ways)."""
        methods = self._methods
        callable_ = methods.get(name)
        if callable_ is None:
            callable_ = methods[name] = self.channel.stream_stream(name)
            if len(methods) > METHODS_KEPT:
                methods.popitem(last=False)
        return callable_

    def release(self) -> None:
        entry, self._entry = self._entry, None
        if entry is not None:
            entry.calls -= 1
            entry.used = time.monotonic()


class Channels:
    """The listener's channels to workers (see the module docstring)."""

    def __init__(self, *, limit: int, idle_seconds: float, max_message_bytes: int) -> None:
        self.limit = limit
        self.idle_seconds = idle_seconds
        self._options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ]
        self._open: OrderedDict[tuple[str, bool], _Channel] = OrderedDict()
        #: closes the channels idle for `idle_seconds`, checked four times per period
        self._sweeper = LoopService[str](
            "nvcf-grpc-channels-sweep",
            self._sweep,
            idle_seconds / 4,
            log=log,
            failure="closing idle gRPC channels failed",
        )
        self._closing: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._open)

    def start(self) -> None:
        self._sweeper.start()

    async def acquire(self, endpoint: WorkerEndpoint) -> Lease:
        """A connected channel to the endpoint's worker, held until `Lease.release`
        (`WorkerUnreachable` when the connection cannot be made: nothing was sent)."""
        key = worker_address(await endpoint.h2_url())
        entry = self._open.get(key)
        if entry is None:
            entry = self._new(key)
        self._open.move_to_end(key)
        entry.calls += 1
        lease = Lease(entry)
        try:
            await self._ready(entry.channel, key[0])
        except BaseException:
            lease.release()
            # a channel in failure waits out its reconnection back-off: the next call
            # (a worker started again at this address) gets a fresh one at once
            if self._open.get(key) is entry and entry.calls == 0:
                self._close(key)
            raise
        return lease

    def _new(self, key: tuple[str, bool]) -> _Channel:
        if len(self._open) >= self.limit:
            idle = next((k for k, c in self._open.items() if c.calls == 0), None)
            if idle is not None:
                self._close(idle)
        address, tls = key
        if tls:
            channel = aio.secure_channel(address, grpc.ssl_channel_credentials(), self._options)
        else:
            channel = aio.insecure_channel(address, self._options)
        entry = _Channel(channel)
        self._open[key] = entry
        return entry

    async def _ready(self, channel: aio.Channel, address: str) -> None:
        """Wait until the channel is connected; a failed attempt is `WorkerUnreachable`."""
        state = channel.get_state(try_to_connect=True)
        if state == grpc.ChannelConnectivity.READY:
            return
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                while state != grpc.ChannelConnectivity.READY:
                    if state in (
                        grpc.ChannelConnectivity.TRANSIENT_FAILURE,
                        grpc.ChannelConnectivity.SHUTDOWN,
                    ):
                        raise WorkerUnreachable(f"no gRPC connection to {address}")
                    await channel.wait_for_state_change(state)
                    state = channel.get_state(try_to_connect=True)
        except TimeoutError:
            raise WorkerUnreachable(
                f"no gRPC connection to {address} within {CONNECT_TIMEOUT:g} s"
            ) from None

    def _close(self, key: tuple[str, bool]) -> None:
        entry = self._open.pop(key)
        task = asyncio.get_running_loop().create_task(entry.channel.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _sweep(self) -> None:
        """Close the channels idle for `idle_seconds`."""
        now = time.monotonic()
        for key in [
            k for k, c in self._open.items() if c.calls == 0 and now - c.used >= self.idle_seconds
        ]:
            self._close(key)

    async def aclose(self) -> None:
        await self._sweeper.stop()
        channels = [c.channel for c in self._open.values()]
        self._open.clear()
        for channel in channels:
            await channel.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
