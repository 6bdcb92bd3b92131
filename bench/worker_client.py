"""Worker client benchmark: the invocation plane's HTTP/1.1 client (backends/http1.py) against
httpx and aiohttp, loading the same echo worker from one process, in the same run.

Starts bench/echo_server.py, then in alternating rounds drives it from this process (uvloop,
as the servers run) with `--concurrency` requests in flight through each client:

- `http1`: `Http1Pool`/`Http1Endpoint` as the engine uses them (an endpoint made per request,
  `send`, the body taken with `complete_body()` or read to its end, `aclose`) — the baseline;
- `httpx`: one `httpx.AsyncClient` with a keep-alive pool of `--concurrency` connections;
- `aiohttp`: one `aiohttp.ClientSession` (a `TCPConnector` of `--concurrency` connections),
  when installed (`pip install .[bench]`).

Each request is a `POST /echo` with a small JSON body and the headers an invocation forwards,
its answer read whole. Printed per client: requests/s, this process's CPU µs per request (user
+ system, from `resource.getrusage`: the figure the other work on the machine moves least),
and each one's ratio to http1 (median of the rounds' ratios, the rounds' spread in brackets).

    .venv/bin/python bench/worker_client.py [--seconds 3] [--rounds 5] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.api import free_port
from service.backends.http1 import Http1Endpoint, Http1Pool

BODY = b'{"prompt":"hello","max_tokens":16}'
HEADERS = [
    ("content-type", "application/json"),
    ("nvcf-reqid", "0b7c5a43-7c3b-4b39-9f64-3a0d3c4c6f2e"),
    ("nvcf-function-asset-ids", ""),
    ("nvcf-ncaid", "ncaid-bench"),
]
LIMIT = 1 << 20

#: one request through a client: the answer's status
Call = Callable[[], Awaitable[int]]


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def http1_client(base: str) -> tuple[Call, Callable[[], Awaitable[None]]]:
    pool = Http1Pool()

    async def call() -> int:
        endpoint = Http1Endpoint(base, pool)  # the engine makes one per request
        response = await endpoint.send("POST", "/echo", HEADERS, BODY)
        try:
            body = response.complete_body()
            if body is None:
                body = await response.read(LIMIT)
        finally:
            await response.aclose()
        return response.status

    return call, pool.aclose


async def httpx_client(base: str, concurrency: int) -> tuple[Call, Callable[[], Awaitable[None]]]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    client = httpx.AsyncClient(base_url=base, limits=limits, timeout=30)

    async def call() -> int:
        request = client.build_request("POST", "/echo", headers=HEADERS, content=BODY)
        response = await client.send(request, stream=True)
        try:
            size = 0
            async for chunk in response.aiter_raw():
                size += len(chunk)
                if size > LIMIT:
                    raise RuntimeError("too large")
        finally:
            await response.aclose()
        return response.status_code

    return call, client.aclose


async def aiohttp_client(
    base: str, concurrency: int
) -> tuple[Call, Callable[[], Awaitable[None]]] | None:
    try:
        import aiohttp
    except ImportError:
        return None
    connector = aiohttp.TCPConnector(limit=concurrency)
    session = aiohttp.ClientSession(
        base_url=base,
        connector=connector,
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
    )

    async def call() -> int:
        async with session.post("/echo", headers=HEADERS, data=BODY) as response:
            size = 0
            async for chunk in response.content.iter_any():
                size += len(chunk)
                if size > LIMIT:
                    raise RuntimeError("too large")
            return response.status

    return call, session.close


async def run_round(call: Call, concurrency: int, seconds: float) -> tuple[float, float]:
    """(requests/s, CPU µs per request) of `concurrency` loops calling for `seconds`."""
    count = 0
    stop = time.monotonic() + seconds

    async def loop() -> None:
        nonlocal count
        while time.monotonic() < stop:
            status = await call()
            if status != 200:
                raise RuntimeError(f"the echo worker answered {status}")
            count += 1

    for _ in range(concurrency):  # warm the pool: one connection per loop
        await call()
    start, cpu0 = time.monotonic(), cpu()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    wall, used = time.monotonic() - start, cpu() - cpu0
    return count / wall, used / count * 1e6


def spread(values: list[float]) -> str:
    return f"[{min(values):.2f}–{max(values):.2f}]"


async def main_async(args: argparse.Namespace, base: str) -> None:
    clients: dict[str, tuple[Call, Callable[[], Awaitable[None]]]] = {
        "http1": await http1_client(base),
        "httpx": await httpx_client(base, args.concurrency),
    }
    aio = await aiohttp_client(base, args.concurrency)
    if aio is not None:
        clients["aiohttp"] = aio
    else:
        print("aiohttp: not installed (pip install .[bench]); skipped")
    rps: dict[str, list[float]] = {name: [] for name in clients}
    cpu_us: dict[str, list[float]] = {name: [] for name in clients}
    names = list(clients)
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]  # alternate who goes first
        for name in order:
            rate, per = await run_round(clients[name][0], args.concurrency, args.seconds)
            rps[name].append(rate)
            cpu_us[name].append(per)
    for _, close in clients.values():
        await close()
    print(
        f"{args.rounds} alternating rounds of {args.seconds:g} s, {args.concurrency} requests "
        "in flight, one client process; medians [spread of the rounds]"
    )
    print(
        f"  {'client':8} {'req/s':>8} {'/http1':>6} {'spread':>12} {'CPU µs/req':>11} "
        f"{'/http1':>6} {'spread':>12}"
    )
    for name in names:
        rate_ratios = [a / b for a, b in zip(rps[name], rps["http1"], strict=True)]
        cpu_ratios = [a / b for a, b in zip(cpu_us[name], cpu_us["http1"], strict=True)]
        print(
            f"  {name:8} {statistics.median(rps[name]):8.0f} "
            f"{statistics.median(rate_ratios):6.2f} {spread(rate_ratios):>12} "
            f"{statistics.median(cpu_us[name]):11.1f} {statistics.median(cpu_ratios):6.2f} "
            f"{spread(cpu_ratios):>12}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()
    port = free_port()
    echo = Path(__file__).with_name("echo_server.py")
    server = subprocess.Popen([sys.executable, str(echo), "--port", str(port)])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the echo worker did not start") from None
                time.sleep(0.1)
        try:
            import uvloop

            runner = uvloop.run
        except ImportError:
            runner = asyncio.run
        runner(main_async(args, f"http://127.0.0.1:{port}"))
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
