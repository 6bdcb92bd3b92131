"""A small keep-alive HTTP/1.1 load generator on asyncio streams (cheap enough not to be the
bottleneck on a 2-core machine), run in its own process by the benchmarks."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field


@dataclass
class LoadResult:
    requests: int
    errors: int
    seconds: float
    #: per-request latency in seconds (only when asked for)
    latencies: list[float] = field(default_factory=list)

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def percentile(self, p: float) -> float:
        ordered = sorted(self.latencies)
        if not ordered:
            return 0.0
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


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


async def _worker(
    host: str,
    port: int,
    request: bytes,
    deadline: float,
    counts: list[int],
    latencies: list[float] | None,
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < deadline:
            sent = time.perf_counter()
            writer.write(request)
            status = await _read_response(reader)
            if latencies is not None:
                latencies.append(time.perf_counter() - sent)
            if 200 <= status < 300:
                counts[0] += 1
            else:
                counts[1] += 1
    finally:
        writer.close()


async def _run(
    host: str, port: int, request: bytes, seconds: float, concurrency: int, latency: bool
) -> LoadResult:
    counts = [0, 0]
    latencies: list[float] | None = [] if latency else None
    start = time.perf_counter()
    deadline = start + seconds
    await asyncio.gather(
        *[_worker(host, port, request, deadline, counts, latencies) for _ in range(concurrency)]
    )
    return LoadResult(counts[0], counts[1], time.perf_counter() - start, latencies or [])


def run_load(
    host: str,
    port: int,
    request: bytes,
    seconds: float,
    concurrency: int,
    latency: bool = False,
) -> LoadResult:
    return asyncio.run(_run(host, port, request, seconds, concurrency, latency))
