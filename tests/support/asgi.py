"""One request driven by hand at the ASGI level: its scope, its body delivered at once, every
message the application sends kept in order, and a disconnect when the test hangs up."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Message

from tests.support.app import ADMIN_KEY


class Exchange:
    """One request driven by hand: its body, then a disconnect when `hang_up` is called."""

    def __init__(self, body: bytes) -> None:
        self.sent: asyncio.Queue[Message] = asyncio.Queue()
        self._body = body
        self._gone = asyncio.Event()
        self._delivered = False

    async def receive(self) -> Message:
        if not self._delivered:
            self._delivered = True
            return {"type": "http.request", "body": self._body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        await self.sent.put(message)

    def hang_up(self) -> None:
        self._gone.set()

    async def next_chunk(self) -> bytes:
        message = await asyncio.wait_for(self.sent.get(), 30)
        assert message["type"] == "http.response.body", message
        return bytes(message.get("body", b""))


def scope(path: str, body: bytes, **headers: str) -> dict[str, Any]:
    """The scope of a POST to `path` on host nvcf.test with the admin key (`headers` added,
    `_` for `-` in their names)."""
    hdrs = {
        "host": "nvcf.test",
        "authorization": f"Bearer {ADMIN_KEY}",
        "content-type": "application/json",
        "content-length": str(len(body)),
        **{k.replace("_", "-"): v for k, v in headers.items()},
    }
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in hdrs.items()],
        "client": ("127.0.0.1", 50000),
        "server": ("nvcf.test", 80),
    }
