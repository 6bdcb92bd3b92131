"""Reading an instance's logs from a backend (the adapter's `logs`, backends/protocol.py).

`LogRequest` is what a caller asks (as `kubectl logs` asks the kubelet: container, tail,
since, timestamps, follow, previous), `LogLine` one line of one container of one pod. An
adapter answers with an async iterator of lines; a follow ends when the instance's containers
end (or the caller stops iterating). `merge` interleaves the streams of several containers as
their lines arrive, without buffering any of them whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

#: the longest line handed on; a longer one is cut here (a worker printing a huge blob)
MAX_LINE_BYTES = 16 * 1024


@dataclass(frozen=True)
class LogRequest:
    """What to read: every container of every pod of the instance unless `container` names
    one; the last `tail_lines` lines, those of the last `since_seconds`; `previous`: the
    previous (terminated) run of restarted containers; `limit_bytes` per container."""

    container: str | None = None
    tail_lines: int | None = None
    since_seconds: int | None = None
    timestamps: bool = False
    follow: bool = False
    previous: bool = False
    limit_bytes: int | None = None


@dataclass(frozen=True)
class LogLine:
    """One line a container printed (without its newline); `timestamp` is RFC 3339 when the
    request asked for timestamps, else empty."""

    pod: str
    container: str
    text: str
    timestamp: str = ""


def cut(text: str) -> str:
    """`text` bounded to MAX_LINE_BYTES of UTF-8."""
    data = text.encode()
    if len(data) <= MAX_LINE_BYTES:
        return text
    return data[:MAX_LINE_BYTES].decode(errors="ignore") + " …[line truncated]"


async def _close(stream: AsyncIterator[object]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


async def merge(streams: Sequence[AsyncIterator[T]]) -> AsyncIterator[T]:
    """The lines of every stream as they arrive; ends when all have ended. Each stream is
    read by its own task, at most a few lines ahead of the consumer; when the consumer stops
    (or is cancelled), every stream is closed before `merge` returns."""
    if len(streams) == 1:
        try:
            async for line in streams[0]:
                yield line
        finally:
            await _close(streams[0])
        return
    queue: asyncio.Queue[tuple[T] | BaseException | None] = asyncio.Queue(maxsize=64)

    async def pump(stream: AsyncIterator[T]) -> None:
        # nothing is enqueued once cancelled: the consumer has left and the queue may be full
        try:
            async for item in stream:
                await queue.put((item,))
        except Exception as exc:  # handed to the consumer, raised there
            await queue.put(exc)
        else:
            await queue.put(None)
        finally:
            await _close(stream)

    tasks = [asyncio.create_task(pump(s)) for s in streams]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item[0]
    finally:
        for task in tasks:
            task.cancel()
        # a cancellation of the caller itself while waiting here is not swallowed
        await asyncio.gather(*tasks, return_exceptions=True)


__all__ = ["MAX_LINE_BYTES", "LogLine", "LogRequest", "cut", "merge"]
