"""gRPC invocation benchmark: what the gRPC listener adds over calling the worker directly,
in the same run.

Starts a real gRPC echo server (grpcio's asyncio server, any method: every message back as it
came) in its own process, and `nvcf-server serve` with its gRPC listener on, whose simulated
cluster forwards to the echo server (`upstream: grpc://...`) and deploys a `/gRPC` function
(one instance, `maxRequestConcurrency` = `--concurrency`), and a proxy made of grpcio alone
(no engine: each call relayed to the echo server as the listener relays it, with as many NVCF
metadata; the baseline of what any grpcio proxy costs here). Then, in alternating rounds, with
the same grpcio asyncio client from this process, directly, through the platform and through
grpcio alone:

- unary calls at `--concurrency` calls in flight: calls per second, and the platform's as a
  ratio to direct (median of the rounds' ratios; target ≥ 0.3);
- one bidirectional stream of small messages both ways (`--window` messages in flight):
  messages per second and the ratio (target ≥ 0.5);
- unary calls one at a time: the latency the platform adds at p50 and p99 (target: p50 ≤ 1 ms)
  and, beside it, what grpcio alone adds: the part of the added latency that is grpcio's own,
  and the part that is the platform's.

    .venv/bin/python bench/grpc.py [--seconds 3] [--rounds 3] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

# run as a script, this file's directory comes first on the path, and this file would be
# imported as `grpc`: the repository's root takes its place
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import grpc  # noqa: E402
import httpx  # noqa: E402
from grpc import aio  # noqa: E402

from bench.api import free_port, simulated_catalog, start  # noqa: E402

KEY = "nvapi-bench-" + "k" * 40
FUNCTION = {
    "name": "bench-grpc",
    "inferenceUrl": "/gRPC",
    "inferencePort": 8001,
    "containerImage": "nvcr.io/acme/grpc-echo:1.0",
}
PAYLOAD = b"x" * 64
METHOD = "/bench.Echo/Call"


# ---------------------------------------------------------------------- the echo server


async def _echo(
    requests: AsyncIterator[bytes], context: aio.ServicerContext[Any, Any]
) -> AsyncIterator[bytes]:
    async for message in requests:
        yield message


class _Echo(grpc.GenericRpcHandler):
    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any]:
        return grpc.stream_stream_rpc_method_handler(_echo)


async def serve_echo(port: int) -> None:
    server = aio.server()
    server.add_generic_rpc_handlers((_Echo(),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


# ---------------------------------------------------------------------- grpcio alone


class _Relay(grpc.GenericRpcHandler):
    """A proxy made of grpcio alone: each call relayed to `upstream` as the listener relays
    it (the worker's next message read while the last is written; its initial metadata with
    `nvcf-reqid` added; its status and trailing metadata), with metadata of the size of the
    listener's NVCF request headers, and nothing else."""

    def __init__(self, upstream: str) -> None:
        self.channel = aio.insecure_channel(upstream)
        self.nvcf = [(f"nvcf-header-{i}", str(uuid.uuid4())) for i in range(10)]
        # as the listener: a method's handler and its callable on the channel, made once
        self.handler = functools.lru_cache(maxsize=1024)(self._handler)

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any]:
        return self.handler(str(details.method))

    def _handler(self, method: str) -> grpc.RpcMethodHandler[Any, Any]:
        upstream = self.channel.stream_stream(method)
        nvcf = self.nvcf

        async def relay(
            requests: AsyncIterator[bytes], context: aio.ServicerContext[Any, Any]
        ) -> None:
            request_id = str(uuid.uuid4())
            metadata = aio.Metadata(("nvcf-reqid", request_id), *nvcf)
            call = upstream(requests, metadata=metadata, timeout=30)
            initial = [*await call.initial_metadata(), ("nvcf-reqid", request_id)]
            loop = asyncio.get_running_loop()
            reading = loop.create_task(call.read())
            await context.send_initial_metadata(initial)
            message = await reading
            while message is not aio.EOF:
                reading = loop.create_task(call.read())
                await context.write(message)
                message = await reading
            context.set_trailing_metadata(tuple(await call.trailing_metadata() or ()))

        return grpc.stream_stream_rpc_method_handler(relay)


async def serve_relay(port: int, upstream: str) -> None:
    server = aio.server()
    server.add_generic_rpc_handlers((_Relay(upstream),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


# ---------------------------------------------------------------------- the loads


async def unary_load(channel: aio.Channel, md: Any, concurrency: int, seconds: float) -> float:
    """Unary calls per second with `concurrency` in flight."""
    call = channel.unary_unary(METHOD)
    done = 0
    stop = time.perf_counter() + seconds

    async def one() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            await call(PAYLOAD, metadata=md)
            done += 1

    began = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(concurrency)))
    return done / (time.perf_counter() - began)


async def stream_load(channel: aio.Channel, md: Any, window: int, seconds: float) -> float:
    """Messages per second (each way) on one bidirectional stream, `window` in flight."""
    stream = channel.stream_stream(METHOD)(metadata=md)
    credits = asyncio.Semaphore(window)
    sent = received = 0
    stop = time.perf_counter() + seconds

    async def writer() -> None:
        nonlocal sent
        while time.perf_counter() < stop:
            await credits.acquire()
            await stream.write(PAYLOAD)
            sent += 1
        await stream.done_writing()

    async def reader() -> None:
        nonlocal received
        while True:
            message = await stream.read()
            if message is aio.EOF:
                return
            received += 1
            credits.release()

    began = time.perf_counter()
    await asyncio.gather(writer(), reader())
    return received / (time.perf_counter() - began)


async def latencies(channel: aio.Channel, md: Any, count: int) -> list[float]:
    call = channel.unary_unary(METHOD)
    out = []
    for _ in range(count):
        began = time.perf_counter()
        await call(PAYLOAD, metadata=md)
        out.append(time.perf_counter() - began)
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ---------------------------------------------------------------------- the platform


def deploy(port: int, concurrency: int) -> str:
    base = f"http://127.0.0.1:{port}/v2/nvcf"
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as c:
        fn = c.post("/functions", json=FUNCTION).json()["function"]
        spec = {
            "gpu": "H100",
            "backend": "bench",
            "minInstances": 1,
            "maxInstances": 1,
            "maxRequestConcurrency": max(concurrency, 2),
        }
        url = f"/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
        c.post(url, json={"deploymentSpecifications": [spec]}).raise_for_status()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status = c.get(f"/functions/{fn['id']}/versions/{fn['versionId']}").json()
            if status["function"]["status"] == "ACTIVE":
                return str(fn["id"])
            time.sleep(0.1)
    raise SystemExit("the function did not become ACTIVE")


async def measure(
    args: argparse.Namespace, direct: str, platform: str, relay: str, fid: str
) -> None:
    platform_md = (("authorization", f"Bearer {KEY}"), ("function-id", fid))
    async with (
        aio.insecure_channel(direct) as d,
        aio.insecure_channel(platform) as p,
        aio.insecure_channel(relay) as r,
    ):
        ways = {"direct": (d, ()), "platform": (p, platform_md), "grpcio": (r, platform_md)}
        for ch, md in ways.values():  # warm up each
            await unary_load(ch, md, args.concurrency, 0.5)
        unary: dict[str, list[float]] = {name: [] for name in ways}
        streamed: dict[str, list[float]] = {name: [] for name in ways}
        near: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, (ch, md) in ways.items():
                unary[name].append(await unary_load(ch, md, args.concurrency, args.seconds))
            for name, (ch, md) in ways.items():
                streamed[name].append(await stream_load(ch, md, args.window, args.seconds))
        for _ in range(args.rounds):
            for name, (ch, md) in ways.items():
                near[name] += await latencies(ch, md, args.latency_calls)

    def ratio(values: dict[str, list[float]], name: str = "platform") -> float:
        pairs = zip(values[name], values["direct"], strict=True)
        return statistics.median(p / d for p, d in pairs)

    print(f"unary at {args.concurrency} in flight (median of {args.rounds} alternating rounds):")
    for name, values in unary.items():
        print(f"  {name:9} {statistics.median(values):9.0f} calls/s")
    print(
        f"  platform/direct {ratio(unary):.2f}  (target >= 0.30); "
        f"grpcio alone/direct {ratio(unary, 'grpcio'):.2f}"
    )
    print(f"one bidirectional stream, {args.window} small messages in flight:")
    for name, values in streamed.items():
        print(f"  {name:9} {statistics.median(values):9.0f} messages/s each way")
    print(
        f"  platform/direct {ratio(streamed):.2f}  (target >= 0.50); "
        f"grpcio alone/direct {ratio(streamed, 'grpcio'):.2f}"
    )

    def added(name: str, q: float) -> float:
        return (percentile(near[name], q) - percentile(near["direct"], q)) * 1000

    p50, p99 = added("platform", 0.5), added("platform", 0.99)
    print(
        f"one client, {len(near['direct'])} calls each: added p50 {p50:.3f} ms "
        f"(target <= 1 ms), p99 {p99:.3f} ms"
    )
    alone = added("grpcio", 0.5)
    print(
        f"  a proxy of grpcio alone adds p50 {alone:.3f} ms (p99 {added('grpcio', 0.99):.3f} "
        f"ms): the platform's own part is {p50 - alone:.3f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--latency-calls", type=int, default=500)
    parser.add_argument("--echo-server", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--relay", nargs=2, metavar=("PORT", "UPSTREAM"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.echo_server:
        asyncio.run(serve_echo(args.echo_server))
        return
    if args.relay:
        asyncio.run(serve_relay(int(args.relay[0]), args.relay[1]))
        return
    echo_port, http_port, grpc_port, relay_port = (free_port() for _ in range(4))
    echo = subprocess.Popen([sys.executable, __file__, "--echo-server", str(echo_port)])
    relay = subprocess.Popen(
        [sys.executable, __file__, "--relay", str(relay_port), f"127.0.0.1:{echo_port}"]
    )
    server = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            catalog = simulated_catalog(
                {
                    "scheduleSeconds": 0.01,
                    "pullSeconds": 0.01,
                    "readySeconds": 0.01,
                    "upstream": f"grpc://127.0.0.1:{echo_port}",
                }
            )
            (Path(tmp) / "clusters.yaml").write_text(json.dumps(catalog))
            env = {
                "NVCF_DATA_DIR": str(Path(tmp) / "data"),
                "NVCF_BOOTSTRAP_API_KEY": KEY,
                "NVCF_RATE_LIMIT_PER_SECOND": "0",
                "NVCF_CLUSTERS_FILE": str(Path(tmp) / "clusters.yaml"),
                "NVCF_GRPC_ENABLED": "true",
                "NVCF_GRPC_PORT": str(grpc_port),
            }
            command = [sys.executable, "-m", "service.cli", "serve", "--port", str(http_port)]
            server = start(command, env, http_port, cwd=str(Path(__file__).resolve().parents[1]))
            fid = deploy(http_port, args.concurrency)
            asyncio.run(
                measure(
                    args,
                    f"127.0.0.1:{echo_port}",
                    f"127.0.0.1:{grpc_port}",
                    f"127.0.0.1:{relay_port}",
                    fid,
                )
            )
    finally:
        for proc in (server, echo, relay):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
