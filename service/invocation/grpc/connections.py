"""A caller's connection is a session (NVCF's proxy: "workers cannot be shared between
clients"): the calls of one client connection to one function (and version, as the caller
names them) join the session of its first call, so go to that call's instance, for the
connection's life — unless the version is tagged `grpc-sessions=per-call` (routing.py).

grpcio tells a call its connection only as the peer's address (`context.peer()`, unique per
TCP connection while it is open), and never that a connection closed: a connection's pin is
forgotten once no call could still hold its session (`ttl`: the longest call plus a session's
idle time, counted from the connection's last call) and at most `limit` are kept (the least
recently used go first). A pin outliving its connection does no harm: a new connection from
the same address and port, of the same account, resumes the session if it is still live, or
starts one of its own when it ended.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

from cachetools import TTLCache

#: (the peer's address, the caller's account, function-id, function-version-id as sent)
Key = tuple[str, str, str, str]
#: connections' pins kept at most
MAX_PINS = 100_000


class Pin:
    """A connection's session: being opened (`ready` not set yet), known (`session`), or
    None once settled: the function's calls are not pinned (`grpc-sessions=per-call`)."""

    __slots__ = ("ready", "session")

    def __init__(self) -> None:
        self.session: uuid.UUID | None = None
        #: None once settled
        self.ready: asyncio.Event | None = asyncio.Event()


class Pins:
    """The sessions of the caller's connections (see the module docstring): a pin lives
    `ttl` seconds from its connection's last call, and the least recently used go first
    past `limit`."""

    def __init__(
        self, ttl: float, limit: int = MAX_PINS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._pins: TTLCache[Key, Pin] = TTLCache(maxsize=limit, ttl=ttl, timer=clock)

    def __len__(self) -> int:
        return len(self._pins)

    async def resolve(self, key: Key) -> tuple[uuid.UUID | None, Pin | None]:
        """The connection's session, and None; or None and the pin this call makes: its
        session becomes the connection's (`settle` it). (None, None): not pinned. A call
        arriving while the connection's first is still being opened waits for it."""
        while True:
            pin = self._pins.get(key)
            if pin is None:
                return None, self.claim(key)
            self._pins[key] = pin  # used now: its time to live starts again
            if pin.ready is None:
                return pin.session, None
            await pin.ready.wait()  # then read again: settled, or dropped

    def settle(self, key: Key, pin: Pin, session: uuid.UUID | None, *, keep: bool) -> None:
        """The pinning call was opened in `session` (None: not pinned); `keep` False: it
        failed, the connection's next call makes the pin again. Once only: later calls do
        nothing."""
        ready = pin.ready
        if ready is None:
            return
        pin.session, pin.ready = session, None
        if not keep and self._pins.get(key) is pin:
            del self._pins[key]
        ready.set()

    def pin(self, key: Key, session: uuid.UUID) -> bool:
        """The connection's calls now go to `session` (a call named it); False when they
        already did."""
        pin = self._pins.get(key)
        if pin is not None and pin.ready is None and pin.session == session:
            return False
        self.settle(key, self.claim(key), session, keep=True)
        return True

    def forget(self, key: Key, session: uuid.UUID) -> None:
        """`session` is not live: the connection's calls no longer go to it."""
        pin = self._pins.get(key)
        if pin is not None and pin.ready is None and pin.session == session:
            del self._pins[key]

    def claim(self, key: Key) -> Pin:
        """A new pin of the connection, its session to come (`settle` it)."""
        pin = self._pins[key] = Pin()
        return pin
