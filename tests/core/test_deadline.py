"""The request-body deadline (core/deadline.py)."""

from __future__ import annotations

import asyncio

import pytest
from starlette.types import Receive, Scope, Send

from service.core.deadline import BodyDeadlineMiddleware
from service.core.errors import RequestTimeout


async def test_the_body_deadline_of_uploads_is_their_own() -> None:
    """A body slower than the ordinary deadline but within the upload one arrives whole."""
    got: list[int] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        size, more = 0, True
        while more:
            message = await receive()
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
        got.append(size)

    release = asyncio.Event()
    messages = [{"type": "http.request", "body": b"a", "more_body": True}]

    async def receive() -> dict[str, object]:
        if messages:
            return messages.pop()
        await release.wait()  # the rest comes after the ordinary deadline
        return {"type": "http.request", "body": b"b", "more_body": False}

    async def send(message: dict[str, object]) -> None:
        return None

    wrapped = BodyDeadlineMiddleware(app, timeout=0.05, long=("/storage/", 3600))
    task = asyncio.create_task(
        wrapped({"type": "http", "path": "/storage/assets/x"}, receive, send)  # type: ignore[arg-type]
    )
    await asyncio.sleep(0.2)
    release.set()
    await task
    assert got == [2]
    short = BodyDeadlineMiddleware(app, timeout=0.05, long=("/storage/", 3600))
    messages.append({"type": "http.request", "body": b"a", "more_body": True})
    release.clear()
    with pytest.raises(RequestTimeout):
        await short({"type": "http", "path": "/v2/nvcf/functions"}, receive, send)  # type: ignore[arg-type]
