"""The request-body deadline, the ASGI side of the server's connection bounds
(core/server.py): the outermost middleware of the served application."""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core.errors import RequestTimeout
from service.core.server import BODY_RECEIVED


class BodyDeadlineMiddleware:
    """A request's body must have arrived within `timeout` seconds of its head.

    A read of the body that would wait past the deadline raises `RequestTimeout` instead: a
    408 problem+json with `Connection: close` (the rest of the body is never read). Reads after
    the body is complete (a streaming response listening for the disconnect) wait as long as
    they like, and so do all reads once the server protocol says the body has arrived whole
    (`BODY_RECEIVED`: most requests, whose body comes with their head). The server protocol
    (service/core/server.py) closes a connection whose body is late and is read by nobody.
    """

    def __init__(
        self, app: ASGIApp, *, timeout: float, long: tuple[str, float] | None = None
    ) -> None:
        self.app = app
        self.timeout = timeout
        #: (path prefix, seconds): a longer deadline for those paths (uploads of assets)
        self.long = long

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        timeout = self.timeout
        if self.long is not None and str(scope.get("path", "")).startswith(self.long[0]):
            timeout = max(timeout, self.long[1])
        deadline = loop.time() + timeout
        complete = False

        async def wrapped() -> Message:
            nonlocal complete
            if complete or BODY_RECEIVED in scope:  # the body is here: no read can be late
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise RequestTimeout(
                    detail=f"the request body did not arrive within {timeout:g} s",
                    headers={"Connection": "close"},
                ) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                complete = True
            return message

        await self.app(scope, wrapped, send)
