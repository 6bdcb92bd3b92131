"""A small echo HTTP server: the upstream worker of the invocation benchmark (bench/invoke.py).

A bare ASGI callable on uvicorn (httptools, uvloop when installed) — the same server stack as
`nvcf-server` and the kind of process a Python inference worker is — so that loading it directly
and through pexec in the same run shows what the invocation plane adds. Every request is
answered 200 with `{"echo": <body>, "path": ...}`; `X-Delay-Ms: N` answers after N ms (a slow
worker).

    python bench/echo_server.py --port 9000
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

JSON = [(b"content-type", b"application/json")]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    for name, value in scope["headers"]:
        if name == b"x-delay-ms":
            await asyncio.sleep(int(value) / 1000)
    out = b'{"echo":' + (body or b"null") + b',"path":' + json.dumps(scope["path"]).encode() + b"}"
    headers = [*JSON, (b"content-length", str(len(out)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": out})


if __name__ == "__main__":
    import uvicorn

    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    port = ap.parse_args().port
    uvicorn.run(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, backlog=4096
    )
