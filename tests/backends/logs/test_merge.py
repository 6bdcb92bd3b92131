"""`merge`: several streams interleaved; a reader that leaves (or is cancelled) while the
streams are far ahead of it ends the merge at once, with every stream closed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator

import pytest

from service.backends.logs import merge


class Counted:
    def __init__(self) -> None:
        self.closed = 0

    async def numbers(self, n: int) -> AsyncIterator[int]:
        try:
            for i in range(n):
                yield i
        finally:
            self.closed += 1


async def test_every_line_of_every_stream_is_read() -> None:
    seen = Counted()
    got = [i async for i in merge([seen.numbers(100), seen.numbers(50)])]
    assert sorted(got) == sorted([*range(100), *range(50)])
    assert seen.closed == 2


async def test_leaving_a_merge_whose_queue_is_full_ends_it_and_closes_the_streams() -> None:
    seen = Counted()
    m = merge([seen.numbers(10_000), seen.numbers(10_000)])
    assert isinstance(m, AsyncGenerator)  # what lets its reader close it
    read = 0
    async for _ in m:
        read += 1
        if read == 10:
            break
    await asyncio.sleep(0)  # the pumps fill the queue
    await asyncio.wait_for(m.aclose(), 5)  # used to wait forever
    assert seen.closed == 2


async def test_a_reader_cancelled_while_the_queue_is_full_is_cancelled() -> None:
    seen = Counted()

    async def reader() -> None:
        merged = merge([seen.numbers(10_000), seen.numbers(10_000)])
        assert isinstance(merged, AsyncGenerator)
        async with contextlib.aclosing(merged) as m:
            async for _ in m:
                await asyncio.sleep(3600)

    task = asyncio.create_task(reader())
    for _ in range(5):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert seen.closed == 2


async def test_an_error_of_one_stream_is_raised_to_the_reader() -> None:
    seen = Counted()

    async def failing() -> AsyncIterator[int]:
        yield 1
        raise RuntimeError("backend gone")

    with pytest.raises(RuntimeError, match="backend gone"):
        async for _ in merge([failing(), seen.numbers(10_000)]):
            await asyncio.sleep(0)
    assert seen.closed == 1
