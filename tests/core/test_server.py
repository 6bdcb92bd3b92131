"""The serve commands' start-up: objects alive once the application is built are frozen out
of the cyclic garbage collector's reach (`NVCF_GC_FREEZE`); the server's bounded protocol."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from service.core.server import ConnectionLimits, freeze_startup_objects
from tests.support.server import in_loop_server


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


async def test_a_large_body_is_never_counted_as_a_request_head() -> None:
    """The read that ends a body (here up to several hundred KiB at once) is body, not the
    next request's head: a large upload is not refused 431 (the head bound is 64 KiB)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        size, more = 0, True
        while more:
            message = await receive()
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(size).encode()})

    limits = ConnectionLimits(
        header_timeout=10, body_timeout=10, keepalive_timeout=5, max_connections=10
    )
    async with in_loop_server(app, limits) as server:
        base = f"http://127.0.0.1:{server.config.port}"
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            for size in (1024 * 1024, 8 * 1024 * 1024):
                resp = await client.put("/upload", content=b"x" * size)
                assert resp.status_code == 200 and resp.text == str(size)
