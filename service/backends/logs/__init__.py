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
#: what a reader keeps of a line, the rest dropped as it arrives: the line is masked, then cut
#: at MAX_LINE_BYTES, and this leaves room past the cut for a whole secret value (at most
#: core.schemas.MAX_SECRET_VALUE = 32768 characters of UTF-8), so that none straddling
#: the cut is partly shown
READ_LINE_BYTES = MAX_LINE_BYTES + 4 * 32768
TRUNCATED = " …[line truncated]"


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


def cut(text: str, limit: int = MAX_LINE_BYTES) -> str:
    """`text` bounded to `limit` bytes of UTF-8 (and a mark where it was cut). A line read
    from a backend is masked before it is cut."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[:limit].decode(errors="ignore") + TRUNCATED


def bound(text: str) -> str:
    """A line as a reader hands it on: at most READ_LINE_BYTES (then masked, then `cut`)."""
    return cut(text, READ_LINE_BYTES)


def _line(data: bytes) -> str:
    if len(data) > READ_LINE_BYTES:
        return data[:READ_LINE_BYTES].decode(errors="ignore") + TRUNCATED
    return data.removesuffix(b"\r").decode(errors="replace")


async def lines_of(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The lines of a byte stream, each bounded as it arrives: the bytes of a line past
    READ_LINE_BYTES are dropped until its newline (a progress bar printed with `\r` is one
    line of any size)."""
    buf = bytearray()
    async for chunk in chunks:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            stop = len(chunk) if end < 0 else end
            room = READ_LINE_BYTES + 1 - len(buf)  # one byte more: the line was longer
            if room > 0:
                buf += chunk[start : min(stop, start + room)]
            if end < 0:
                break
            yield _line(bytes(buf))
            buf.clear()
            start = end + 1
    if buf:
        yield _line(bytes(buf))


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


__all__ = [
    "MAX_LINE_BYTES",
    "READ_LINE_BYTES",
    "LogLine",
    "LogRequest",
    "bound",
    "cut",
    "lines_of",
    "merge",
]
