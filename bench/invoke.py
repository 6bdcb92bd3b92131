"""Invocation benchmark: what pexec adds over calling the worker directly, in the same run.

Starts a small echo HTTP server (bench/echo_server.py) and `nvcf-server` with a catalog whose
simulated cluster forwards to it (`simulation.upstream`), deploys a container function, then
loads the echo server directly and through `POST /v2/nvcf/pexec/...` with the same keep-alive
clients from another process (bench/loadgen.py), in alternating rounds. Prints requests per
second of both at `--concurrency` and their ratio (target ≥ 0.3), with the server's CPU per
pexec (from /proc: the figure other work on the machine moves least); the latency pexec adds at
p50/p99, measured with one client at a time (at saturation, latency is only concurrency over
throughput; target: p50 ≤ 2 ms added); and the server's RSS before and while 1,000 requests
are pending at once on a slow upstream. The echo server is a bare ASGI app on uvicorn (the
same server stack as nvcf-server), so the ratio shows what the invocation plane adds.

    .venv/bin/python bench/invoke.py [--seconds 3] [--rounds 5] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.api import free_port, simulated_catalog, start
from bench.loadgen import LoadResult, build_request, run_load

KEY = "nvapi-bench-" + "k" * 40
FUNCTION = {
    "name": "bench-echo",
    "inferenceUrl": "/echo",
    "inferencePort": 8000,
    "containerImage": "nvcr.io/acme/echo:1.0",
}
PAYLOAD = json.dumps({"prompt": "hello", "n": 1}).encode()


def cpu_seconds(pid: int) -> float:
    """User + system CPU the process has used so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def server_env(tmp: Path, echo_port: int) -> dict[str, str]:
    """The settings of an `nvcf-server` whose simulated cluster forwards to the echo server
    on `echo_port` (its catalog written in `tmp`)."""
    catalog = simulated_catalog(
        {
            "scheduleSeconds": 0.05,
            "pullSeconds": 0.05,
            "readySeconds": 0.05,
            "upstream": f"http://127.0.0.1:{echo_port}",
        }
    )
    (tmp / "clusters.yaml").write_text(json.dumps(catalog))
    return {
        "NVCF_DATA_DIR": str(tmp / "data"),
        "NVCF_BOOTSTRAP_API_KEY": KEY,
        "NVCF_RATE_LIMIT_PER_SECOND": "0",
        "NVCF_CLUSTERS_FILE": str(tmp / "clusters.yaml"),
    }


def deploy(port: int, concurrency: int) -> tuple[str, str]:
    base = f"http://127.0.0.1:{port}/v2/nvcf"
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as c:
        fn = c.post("/functions", json=FUNCTION).json()["function"]
        spec = {
            "gpu": "H100",
            "backend": "bench",
            "minInstances": 1,
            "maxInstances": 1,
            "maxRequestConcurrency": concurrency,
        }
        url = f"/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
        c.post(url, json={"deploymentSpecifications": [spec]}).raise_for_status()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status = c.get(f"/functions/{fn['id']}/versions/{fn['versionId']}").json()
            if status["function"]["status"] == "ACTIVE":
                return str(fn["id"]), str(fn["versionId"])
            time.sleep(0.1)
    raise SystemExit("the function did not become ACTIVE")


async def _pending(port: int, request: bytes, count: int) -> list[int]:
    """Open `count` connections, send one request on each, return the statuses."""
    conns = []
    for _ in range(count):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        conns.append((reader, writer))

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
        head = await reader.readuntil(b"\r\n\r\n")
        writer.close()
        return int(head[9:12])

    return await asyncio.gather(*(answer(r, w) for r, w in conns))


def run_pending(port: int, request: bytes, count: int) -> list[int]:
    return asyncio.run(_pending(port, request, count))


def in_flight(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("nvcf_invocation_in_flight{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--pending", type=int, default=1000)
    args = ap.parse_args()
    root = Path(__file__).resolve().parents[1]
    tmp = Path(tempfile.mkdtemp(prefix="nvcf-bench-invoke-"))
    echo_port, server_port = free_port(), free_port()
    echo = subprocess.Popen(
        [sys.executable, str(root / "bench" / "echo_server.py"), "--port", str(echo_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    env = {
        **server_env(tmp, echo_port),
        "NVCF_HTTP_MAX_CONNECTIONS": str(args.pending + 500),
        "NVCF_INVOKE_QUEUE_MAX": str(args.pending * 2),
        "PYTHONPATH": str(root),
    }
    server = start(
        [sys.executable, "-m", "service.cli", "serve", "--port", str(server_port)],
        env,
        server_port,
        cwd=str(root),
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.post(f"http://127.0.0.1:{echo_port}/echo", content=b"{}", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        fid, vid = deploy(server_port, max(args.pending, args.concurrency))
        host = "127.0.0.1"
        json_headers = {"Content-Type": "application/json"}
        direct = build_request("POST", "/echo", host, json_headers, PAYLOAD)
        through = build_request(
            "POST",
            f"/v2/nvcf/pexec/functions/{fid}/versions/{vid}",
            host,
            {**json_headers, "Authorization": f"Bearer {KEY}"},
            PAYLOAD,
        )
        check = httpx.post(
            f"http://{host}:{server_port}/v2/nvcf/pexec/functions/{fid}/versions/{vid}",
            content=PAYLOAD,
            headers={**json_headers, "Authorization": f"Bearer {KEY}"},
        )
        assert check.status_code == 200 and check.json()["echo"] == json.loads(PAYLOAD), check.text
        with ProcessPoolExecutor(max_workers=1) as pool:

            def load(port: int, req: bytes, seconds: float) -> LoadResult:
                return pool.submit(
                    run_load, host, port, req, seconds, args.concurrency, True
                ).result()

            #: the server's CPU per pexec of each round through it (ms)
            cpu_ms: list[float] = []

            def rounds(concurrency: int) -> tuple[list[LoadResult], list[LoadResult]]:
                directs: list[LoadResult] = []
                throughs: list[LoadResult] = []
                cpu_ms.clear()
                for i in range(args.rounds):
                    order = [(echo_port, direct, directs), (server_port, through, throughs)]
                    for port, req, out in order if i % 2 == 0 else reversed(order):
                        before = cpu_seconds(server.pid)
                        result = pool.submit(
                            run_load, host, port, req, args.seconds, concurrency, True
                        ).result()
                        if port == server_port and result.requests:
                            spent = cpu_seconds(server.pid) - before
                            cpu_ms.append(spent / result.requests * 1000)
                        out.append(result)
                return directs, throughs

            load(echo_port, direct, 0.5)
            load(server_port, through, 1.0)
            print(f"{args.rounds} alternating rounds of {args.seconds:g} s each, medians, SQLite")
            for concurrency in (args.concurrency, 1):
                directs, throughs = rounds(concurrency)
                errors = sum(r.errors for r in directs + throughs)
                d_rps = statistics.median(r.rps for r in directs)
                t_rps = statistics.median(r.rps for r in throughs)
                ratios = [t.rps / d.rps for d, t in zip(directs, throughs, strict=True)]
                d50 = statistics.median(r.percentile(50) for r in directs) * 1000
                t50 = statistics.median(r.percentile(50) for r in throughs) * 1000
                d99 = statistics.median(r.percentile(99) for r in directs) * 1000
                t99 = statistics.median(r.percentile(99) for r in throughs) * 1000
                print(f"concurrency {concurrency}:")
                for name, rps, p50, p99 in (
                    ("direct to the echo server", d_rps, d50, d99),
                    ("through pexec", t_rps, t50, t99),
                ):
                    print(f"  {name:26} {rps:8.0f} rps  p50 {p50:6.2f} ms  p99 {p99:6.2f} ms")
                print(
                    f"  ratio pexec/direct: {statistics.median(ratios):.2f} (rounds: "
                    f"{', '.join(f'{r:.2f}' for r in ratios)}; target ≥ 0.3)"
                )
                print(
                    f"  server CPU per pexec: {statistics.median(cpu_ms):.3f} ms (rounds: "
                    f"{', '.join(f'{c:.3f}' for c in cpu_ms)}; the figure machine noise moves "
                    "least)"
                )
                print(
                    f"  added latency: p50 {t50 - d50:.2f} ms, p99 {t99 - d99:.2f} ms"
                    + (" (target: p50 ≤ 2 ms)" if concurrency == 1 else "")
                    + (f"  [{errors} non-2xx answers]" if errors else "")
                )

            before = rss_kib(server.pid)
            slow = build_request(
                "POST",
                f"/v2/nvcf/pexec/functions/{fid}/versions/{vid}",
                host,
                {
                    **json_headers,
                    "Authorization": f"Bearer {KEY}",
                    "X-Delay-Ms": "20000",
                    "NVCF-POLL-SECONDS": "120",
                },
                PAYLOAD,
            )
            pending = pool.submit(run_pending, server_port, slow, args.pending)
            deadline = time.monotonic() + 60
            peak = 0.0
            while time.monotonic() < deadline and peak < args.pending:
                peak = max(peak, in_flight(server_port))
                time.sleep(0.2)
            during = rss_kib(server.pid)
            statuses = pending.result(timeout=120)
            ok = sum(1 for s in statuses if s == 200)
            print(
                f"  {args.pending} requests pending at once on a slow upstream ({peak:.0f} in "
                f"flight seen): server RSS {before / 1024:.1f} MiB before, "
                f"{during / 1024:.1f} MiB during (+{(during - before) / args.pending:.1f} KiB "
                f"per request); {ok}/{args.pending} answered 200"
            )
    finally:
        for proc in (server, echo):
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
