"""A small keep-alive HTTP/1.1 load generator on asyncio streams (cheap enough not to be the
bottleneck on a 2-core machine), run in its own process by the benchmarks."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass


@dataclass
class LoadResult:
    requests: int
    errors: int
    seconds: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def build_request(
    method: str, path: str, host: str, headers: dict[str, str], body: bytes = b""
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: keep-alive"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    if length:
        await reader.readexactly(length)
    return status


async def _worker(host: str, port: int, request: bytes, deadline: float, counts: list[int]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < deadline:
            writer.write(request)
            status = await _read_response(reader)
            if 200 <= status < 300:
                counts[0] += 1
            else:
                counts[1] += 1
    finally:
        writer.close()


async def _run(
    host: str, port: int, request: bytes, seconds: float, concurrency: int
) -> LoadResult:
    counts = [0, 0]
    start = time.perf_counter()
    deadline = start + seconds
    await asyncio.gather(
        *[_worker(host, port, request, deadline, counts) for _ in range(concurrency)]
    )
    return LoadResult(counts[0], counts[1], time.perf_counter() - start)


def run_load(host: str, port: int, request: bytes, seconds: float, concurrency: int) -> LoadResult:
    return asyncio.run(_run(host, port, request, seconds, concurrency))
