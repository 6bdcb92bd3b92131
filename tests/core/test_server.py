"""The serve commands' start-up: objects alive once the application is built are frozen out
of the cyclic garbage collector's reach (`NVCF_GC_FREEZE`)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from service.core.server import CoalescingTransport, freeze_startup_objects


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


@pytest.mark.usefixtures("unfrozen")
def test_start_up_objects_are_frozen_out_of_the_collector_when_asked() -> None:
    assert freeze_startup_objects(False) is False
    assert gc.get_freeze_count() == 0
    assert freeze_startup_objects(True) is True
    assert gc.get_freeze_count() > 0
    # what is created afterwards is collected as before
    cycle: list[object] = []
    cycle.append(cycle)
    del cycle
    assert gc.collect() >= 1


class _Recorder(asyncio.Transport):
    """The writes a transport receives (what reaches the socket)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0


async def test_writes_of_one_loop_step_leave_in_one_send_and_close_flushes_first() -> None:

    raw = _Recorder()
    transport = CoalescingTransport(raw, asyncio.get_running_loop())
    transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    transport.write(b"ok")
    assert raw.writes == [] and transport.get_write_buffer_size() == 40
    await asyncio.sleep(0)
    assert raw.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]
    transport.write(b"x" * CoalescingTransport.FLUSH_BYTES)  # large: at once
    assert len(raw.writes) == 2
    transport.write(b"bye")
    transport.close()
    assert raw.writes[-1] == b"bye" and raw.closed
    with pytest.raises(ConnectionResetError):  # the peer is gone: the writer hears it
        transport.write(b"late")
