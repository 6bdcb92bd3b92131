"""The loop service: the one way a background loop runs in this server (the reconciler, the
autoscaler, namespace collection, history purge, time series, asset purge, load reports; the
invocation plane's heartbeat and sweeps, its Redis lease and session renewals, the gRPC
channels' idle sweep; the telemetry log exports, whose `FollowingLoop` also ends the
follower tasks its rounds start).

One asyncio task between `start()` and `stop()` runs `round()` at start and then every
`period` seconds after the previous round ended (`period` may be a function, read after each
round: the reconciler's next health check); `wake()` runs the next round now. A loop with an
`urgent` round also takes urgent reads: `wake(*keys)` runs `urgent(keys)` now for those keys
only (the autoscaler's cold start), and the full round keeps its period. A failing round is
logged and the loop goes on; a constant `period <= 0` means the loop never starts. The rounds
stay callable directly (tests and admin paths run one on demand).

The lifespan starts the process's loops from one list (service/lifespan.py) and stops them in
reverse; a component whose own state a loop keeps (the invocation plane's dispatcher, sessions
and channels) starts and stops that loop with itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, Protocol, TypeVar

K = TypeVar("K", bound=Hashable)


class Startable(Protocol):
    """What the lifespan starts and stops: a loop service, or anything with its lifecycle."""

    def start(self) -> None: ...

    async def stop(self) -> None: ...


class LoopService(Generic[K]):
    """Runs `round()` every `period` seconds between `start()` and `stop()`; a base class for
    a component whose loop it is, or a component of its own."""

    def __init__(
        self,
        name: str,
        round: Callable[[], Awaitable[object]],
        period: float | Callable[[], float],
        *,
        log: logging.Logger,
        failure: str,
        urgent: Callable[[set[K]], Awaitable[object]] | None = None,
        wake: asyncio.Event | None = None,
    ) -> None:
        """`wake`: an event another component sets to ask for a round now (else the loop's
        own, set by `wake()`)."""
        self.name = name
        self._round = round
        self._period = period
        self._log = log
        self._failure = failure
        self._urgent_round = urgent
        self._urgent: set[K] = set()
        self._full = False
        self._event = wake if wake is not None else asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None

    def wake(self, *urgent: K) -> None:
        """Run a round now; with keys (and an urgent round), an urgent read of those only."""
        if urgent and self._urgent_round is not None:
            self._urgent.update(urgent)
        else:
            self._full = True
        self._event.set()

    def start(self) -> None:
        if self._task is None and (callable(self._period) or self._period > 0):
            self._task = asyncio.create_task(self._loop(), name=self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _next_period(self) -> float:
        return self._period() if callable(self._period) else self._period

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            timeout = due - loop.time()
            if timeout > 0 and not self._event.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._event.wait()
            woken = self._event.is_set()
            self._event.clear()
            urgent, self._urgent = self._urgent, set()
            # an event set by another component (no keys) asks for a full round
            full = self._full or loop.time() >= due or (woken and not urgent)
            self._full = False
            try:
                if urgent and self._urgent_round is not None:
                    await self._urgent_round(urgent)
                if full:
                    await self._round()
            except asyncio.CancelledError:
                raise
            except Exception:
                self._log.exception(self._failure)
            if full:
                due = loop.time() + self._next_period()


F = TypeVar("F", bound=Hashable)


class FollowingLoop(LoopService[str], Generic[F]):
    """A loop service whose rounds start a task per followed key (`following`: the log
    exports' followers); `stop()` ends them with the loop."""

    def __init__(
        self,
        name: str,
        round: Callable[[], Awaitable[object]],
        period: float,
        *,
        log: logging.Logger,
        failure: str,
    ) -> None:
        super().__init__(name, round, period, log=log, failure=failure)
        self.following: dict[F, asyncio.Task[None]] = {}

    async def stop(self) -> None:
        await super().stop()
        followers = list(self.following.values())
        for follower in followers:
            follower.cancel()
        await asyncio.gather(*followers, return_exceptions=True)
        self.following.clear()
