"""LLM gateway benchmark: what the gateway adds to an OpenAI client's streams, in the same run.

Starts a streaming OpenAI-compatible upstream (this file with `--upstream`: uvicorn in its own
process answering `POST /v1/chat/completions` with `--tokens` chunks at `--tps` tokens per
second per stream, then `[DONE]`) and `nvcf-server serve` whose simulated cluster forwards to
it, with an LLM function deployed on it (maxRequestConcurrency 64). The real `openai` client
then streams, in alternating rounds, directly from the upstream and through the gateway
(`/v2/nvcf/llm/v1`):

- at one stream: `--requests` streams one after the other; printed is the time to first token
  each way and what the gateway adds at p50 and p99 (target: p50 ≤ 2 ms added);
- at 32 concurrent streams: the tokens per second received in all, through over direct
  (target ≥ 0.9).

    .venv/bin/python bench/llm.py [--rounds 3] [--requests 40] [--tokens 64] [--tps 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.api import free_port, simulated_catalog, start, wait_up

KEY = "nvapi-bench-" + "k" * 40
MODEL = "bench-model"


# ---------------------------------------------------------------------- the upstream


def upstream_app(tokens: int, tps: float) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    async def chat(request: Request) -> Response:
        body = await request.json()

        async def events() -> Any:
            base = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": MODEL}
            interval = 1 / tps
            start_at = time.monotonic()
            for i in range(tokens):
                # a fixed rate from the stream's start (sleeping drifts under load)
                delay = start_at + i * interval - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                choice = {"index": 0, "delta": {"content": f" t{i}"}, "finish_reason": None}
                yield f"data: {json.dumps({**base, 'choices': [choice]})}\n\n"
            yield "data: [DONE]\n\n"

        if body.get("stream"):
            return StreamingResponse(events(), media_type="text/event-stream")
        return JSONResponse({"error": {"message": "stream only"}}, status_code=400)

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/health", health),
            Route("/v2/health/ready", health),
        ]
    )


def serve_upstream(port: int, tokens: int, tps: float) -> None:
    import uvicorn

    uvicorn.run(
        upstream_app(tokens, tps),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
    )


# ---------------------------------------------------------------------- setup


def server_env(tmp: Path, upstream_port: int) -> dict[str, str]:
    catalog = simulated_catalog(
        {
            "scheduleSeconds": 0.05,
            "pullSeconds": 0.05,
            "readySeconds": 0.05,
            "upstream": f"http://127.0.0.1:{upstream_port}",
        }
    )
    (tmp / "clusters.yaml").write_text(json.dumps(catalog))
    return {
        "NVCF_DATA_DIR": str(tmp / "data"),
        "NVCF_BOOTSTRAP_API_KEY": KEY,
        "NVCF_RATE_LIMIT_PER_SECOND": "0",
        "NVCF_CLUSTERS_FILE": str(tmp / "clusters.yaml"),
    }


def deploy(port: int) -> str:
    base = f"http://127.0.0.1:{port}/v2/nvcf"
    function = {
        "name": "bench-llm",
        "inferenceUrl": "/",
        "inferencePort": 8000,
        "containerImage": "nvcr.io/acme/openai:1.0",
        "functionType": "LLM",
        "models": [{"name": MODEL, "llmConfig": {"uris": ["/v1/chat/completions"]}}],
    }
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as c:
        fn = c.post("/functions", json=function).json()["function"]
        spec = {
            "gpu": "H100",
            "backend": "bench",
            "minInstances": 1,
            "maxInstances": 1,
            "maxRequestConcurrency": 64,
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


# ---------------------------------------------------------------------- measuring


async def one_stream(client: Any, model: str) -> tuple[float, int, float]:
    """(time to first token, tokens, seconds) of one streamed chat completion."""
    started = time.perf_counter()
    first: float | None = None
    count = 0
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "go"}], stream=True
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if first is None:
                first = time.perf_counter() - started
            count += 1
    return first or 0.0, count, time.perf_counter() - started


async def sequential(client: Any, model: str, requests: int) -> list[float]:
    return [(await one_stream(client, model))[0] for _ in range(requests)]


async def concurrent(client: Any, model: str, streams: int) -> float:
    """Tokens per second received over `streams` concurrent streams."""
    started = time.perf_counter()
    results = await asyncio.gather(*(one_stream(client, model) for _ in range(streams)))
    return sum(r[1] for r in results) / (time.perf_counter() - started)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(args: argparse.Namespace, upstream_port: int, port: int, fid: str) -> None:
    import openai

    direct = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{upstream_port}/v1", api_key="direct", max_retries=0
    )
    through = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/v2/nvcf/llm/v1", api_key=KEY, max_retries=0
    )
    gateway_model = f"{fid}/{MODEL}"
    await one_stream(direct, MODEL)  # warm both paths
    await one_stream(through, gateway_model)
    ttft: dict[str, list[float]] = {"direct": [], "gateway": []}
    tps: dict[str, list[float]] = {"direct": [], "gateway": []}
    for _ in range(args.rounds):
        ttft["direct"] += await sequential(direct, MODEL, args.requests)
        ttft["gateway"] += await sequential(through, gateway_model, args.requests)
        tps["direct"].append(await concurrent(direct, MODEL, 32))
        tps["gateway"].append(await concurrent(through, gateway_model, 32))
    await direct.close()
    await through.close()
    ms = 1000
    print(f"time to first token at 1 stream ({len(ttft['direct'])} streams each way)")
    for name, values in ttft.items():
        print(
            f"  {name:8} p50 {pct(values, 0.5) * ms:7.2f} ms   p99 {pct(values, 0.99) * ms:7.2f} ms"
        )
    added50 = (pct(ttft["gateway"], 0.5) - pct(ttft["direct"], 0.5)) * ms
    added99 = (pct(ttft["gateway"], 0.99) - pct(ttft["direct"], 0.99)) * ms
    print(f"  added    p50 {added50:7.2f} ms   p99 {added99:7.2f} ms   (target p50 <= 2 ms)")
    print(f"tokens per second at 32 streams ({args.tokens} tokens, {args.tps:g}/s each)")
    ratios = [g / d for g, d in zip(tps["gateway"], tps["direct"], strict=True)]
    print(f"  direct   {statistics.median(tps['direct']):9.0f}")
    print(f"  gateway  {statistics.median(tps['gateway']):9.0f}")
    print(f"  through/direct {statistics.median(ratios):.3f} (median of rounds; target >= 0.9)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--tps", type=float, default=200.0)
    parser.add_argument("--upstream", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.upstream:
        serve_upstream(args.upstream, args.tokens, args.tps)
        return
    upstream_port, port = free_port(), free_port()
    upstream = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--upstream",
            str(upstream_port),
            "--tokens",
            str(args.tokens),
            "--tps",
            str(args.tps),
        ]
    )
    server: subprocess.Popen[bytes] | None = None
    try:
        wait_up(upstream_port, upstream)
        with tempfile.TemporaryDirectory() as tmp:
            env = server_env(Path(tmp), upstream_port)
            command = [sys.executable, "-m", "service.cli", "serve", "--port", str(port)]
            server = start(command, env, port)
            fid = deploy(port)
            asyncio.run(measure(args, upstream_port, port, fid))
            server.terminate()
            server.wait(30)
    finally:
        if server is not None and server.poll() is None:
            server.kill()
        upstream.terminate()
        upstream.wait(30)


if __name__ == "__main__":
    main()
