"""A periodic background job: one asyncio task that runs a round, logs a failing round and
goes on, then sleeps `period` seconds — or less, when `wake` is set (the event is cleared
before the next round); `period <= 0` means the job never starts.

The loop services (namespace collection, history purge) own one each; `round()` stays callable
directly (tests and admin paths run a round on demand).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable


class PeriodicJob:
    """Runs `round()` every `period` seconds between `start()` and `stop()`."""

    def __init__(
        self,
        name: str,
        round: Callable[[], Awaitable[object]],
        period: float,
        *,
        log: logging.Logger,
        failure: str,
        wake: asyncio.Event | None = None,
    ) -> None:
        self.name = name
        self._round = round
        self.period = period
        self._log = log
        self._failure = failure
        self._wake = wake
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        if self._task is None and self.period > 0:
            self._task = asyncio.create_task(self._loop(), name=self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        while True:
            try:
                await self._round()
            except asyncio.CancelledError:
                raise
            except Exception:
                self._log.exception(self._failure)
            if self._wake is None:
                await asyncio.sleep(self.period)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.period)
            self._wake.clear()
