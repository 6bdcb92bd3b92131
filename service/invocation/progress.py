"""Progress across replicas: while a detached request runs, the replica running it reads the
worker's progress report every `NVCF_INVOKE_PROGRESS_PERIOD_SECONDS` and stores it when it
changed, so that a poll reaching another replica (which reads the request store) shows it too.
Polls reaching the replica running the request read the report directly (lookup.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable

from service.assets.files import Progress, WorkerFiles
from service.invocation.store import RequestStore

log = logging.getLogger("nvcf.invocation")


async def publish(
    request_id: uuid.UUID,
    done: asyncio.Event,
    files: Callable[[], WorkerFiles | None],
    store: RequestStore,
    period: float,
) -> None:
    """Until `done`: the request's progress report (`files()`, once the request has its
    directories), stored whenever it changed."""
    last: Progress | None = None
    while not done.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(period):
                await done.wait()
        current = files()
        if done.is_set() or current is None:
            continue
        progress = await current.progress()
        if progress is None or progress == last:
            continue
        try:
            await store.save_progress(request_id, progress)
            last = progress
        except Exception as exc:  # the next change tries again; polls here still see it
            log.warning("storing the progress of request %s failed: %r", request_id, exc)
