"""Autoscaler benchmark: a step load on the simulated cluster (zero delays, built-in worker).

Starts `nvcf-server` with short autoscaler settings (the reconciler's as by default),
deploys a function (maxRequestConcurrency
1, minInstances 1, maxInstances `--max`) and steps from 0 to `--clients` concurrent callers
(each request holds the worker `--work-ms`), holds the load, then steps back to 0. Prints:

- the time from the step up until the instance count settles (the last decision), the count
  it settles at and every decision on the way; the decisions during the rest of the constant
  load (flapping shows here; target: none);
- the time from the step down until the count is back at minInstances, and its decisions;
- the cold-start overhead: a second function with minInstances 0 at zero instances, the
  latency of its first request against a warm request, above the simulated startup time
  (target: ≤ 0.5 s).

    .venv/bin/python bench/autoscale.py [--clients 8] [--max 20] [--hold 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.api import free_port, simulated_catalog, start

KEY = "nvapi-bench-" + "k" * 40
FUNCTION = {"inferenceUrl": "/echo", "inferencePort": 8000, "containerImage": "nvcr.io/a/e:1"}
SETTINGS = {
    "NVCF_AUTOSCALE_INTERVAL": "0.25",
    "NVCF_AUTOSCALE_WINDOW_SECONDS": "1",
    "NVCF_AUTOSCALE_UP_STICKINESS_SECONDS": "0.5",
    "NVCF_AUTOSCALE_DOWN_STICKINESS_SECONDS": "1",
    "NVCF_AUTOSCALE_IDLE_SECONDS": "600",
    "NVCF_AUTOSCALE_LOAD_REPORT_SECONDS": "0.1",
}


class Api:
    def __init__(self, port: int) -> None:
        self.c = httpx.Client(
            base_url=f"http://127.0.0.1:{port}/v2/nvcf",
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=60,
        )

    def deploy(self, name: str, low: int, high: int) -> dict[str, Any]:
        fn = self.c.post("/functions", json={"name": name, **FUNCTION}).json()["function"]
        spec = {"gpu": "H100", "backend": "bench", "minInstances": low, "maxInstances": high}
        url = f"/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
        self.c.post(url, json={"deploymentSpecifications": [spec]}).raise_for_status()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            dep = self.c.get(url).json()["deployment"]
            if dep["functionStatus"] == "ACTIVE" and running(dep) == low:
                return {"id": fn["id"], "versionId": fn["versionId"], "url": url, **dep}
            time.sleep(0.05)
        raise SystemExit(f"{name} did not become ACTIVE")

    def deployment(self, fn: dict[str, Any]) -> dict[str, Any]:
        return dict(self.c.get(fn["url"]).json()["deployment"])

    def decisions(self, fn: dict[str, Any]) -> list[tuple[float, str]]:
        resp = self.c.get(f"/deployments/{fn['deploymentId']}/events", params={"limit": 1000})
        return [
            (_epoch(e["at"]), e["message"].split(";")[0])
            for e in resp.json()["events"]
            if e["kind"] == "scaling" and e["message"].startswith("autoscaler:")
        ]


def _epoch(at: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()


def running(dep: dict[str, Any]) -> int:
    return sum(1 for i in dep["instances"] if i["phase"] == "Running")


async def callers(port: int, fn: dict[str, Any], clients: int, work_ms: int, stop: asyncio.Event):
    url = f"http://127.0.0.1:{port}/v2/nvcf/pexec/functions/{fn['id']}/versions/{fn['versionId']}"
    headers = {"Authorization": f"Bearer {KEY}", "X-Sim-Delay-Ms": str(work_ms)}
    counts = {"ok": 0, "failed": 0}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=120, limits=limits) as c:

        async def one() -> None:
            while not stop.is_set():
                resp = await c.post(url, json={}, headers=headers)
                counts["ok" if resp.status_code == 200 else "failed"] += 1

        await asyncio.gather(*(one() for _ in range(clients)))
    return counts


def wait_for(check: Any, seconds: float = 120) -> float:
    start_at = time.monotonic()
    while time.monotonic() - start_at < seconds:
        if check():
            return time.monotonic() - start_at
        time.sleep(0.05)
    raise SystemExit("condition not reached")


async def step(api: Api, port: int, fn: dict[str, Any], args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    began = time.time()
    load = asyncio.create_task(callers(port, fn, args.clients, args.work_ms, stop))
    await asyncio.sleep(args.hold)
    stop.set()
    counts = await load
    ended = time.time()
    up = [(t, m) for t, m in api.decisions(fn) if began <= t <= ended]
    settled_at = up[-1][0] - began if up else 0.0
    count = running(api.deployment(fn))
    print(f"step 0 → {args.clients} clients ({args.work_ms} ms each, concurrency 1 per instance)")
    print(f"  settled at {count} instances {settled_at:.2f} s after the step ({len(up)} decisions)")
    for t, m in up:
        print(f"    +{t - began:6.2f} s  {m}")
    late = [m for t, m in up if t - began > settled_at]
    print(
        f"  decisions in the remaining {ended - began - settled_at:.1f} s of constant load: "
        f"{len(late)} (target 0)"
    )
    print(f"  requests: {counts['ok']} answered, {counts['failed']} failed")
    down_began = time.time()

    def at_minimum() -> bool:
        dep = api.deployment(fn)
        return running(dep) == 1 and len(dep["instances"]) == 1

    took = await asyncio.to_thread(wait_for, at_minimum)
    down = [(t, m) for t, m in api.decisions(fn) if t >= down_began - 0.5]
    print(
        f"step {args.clients} → 0 clients: back at minInstances (1) after {took:.2f} s "
        f"({len(down)} decisions)"
    )
    for t, m in down:
        print(f"    +{t - down_began:6.2f} s  {m}")


def cold_start(api: Api, port: int, startup: float) -> None:
    fn = api.deploy("bench-cold", 0, 1)
    url = f"http://127.0.0.1:{port}/v2/nvcf/pexec/functions/{fn['id']}/versions/{fn['versionId']}"
    headers = {"Authorization": f"Bearer {KEY}", "NVCF-POLL-SECONDS": "60"}
    with httpx.Client(timeout=120) as c:
        sent = time.time()
        t0 = time.perf_counter()
        resp = c.post(url, json={}, headers=headers)
        cold = time.perf_counter() - t0
        answered = time.time()
        assert resp.status_code == 200, resp.text
        warm = []
        for _ in range(20):
            t0 = time.perf_counter()
            c.post(url, json={}, headers=headers).raise_for_status()
            warm.append(time.perf_counter() - t0)
    p50 = statistics.median(warm)
    timeline = api.c.get(f"/deployments/{fn['deploymentId']}/events", params={"limit": 100})
    events = [e for e in timeline.json()["events"] if e["kind"] in ("scaling", "instance")]
    print("cold start timeline (from the request):")
    for e in events[:6]:
        print(f"    +{(_epoch(e['at']) - sent) * 1000:5.0f} ms  {e['message'][:90]}")
    print(f"    +{(answered - sent) * 1000:5.0f} ms  answered")
    overhead = cold - p50 - startup
    print(
        f"cold start (minInstances 0, zero instances): first request {cold * 1000:.0f} ms, "
        f"warm p50 {p50 * 1000:.1f} ms, simulated startup {startup * 1000:.0f} ms"
    )
    print(f"  overhead above the simulated startup: {overhead * 1000:.0f} ms (target ≤ 500 ms)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max", type=int, default=20)
    ap.add_argument("--work-ms", type=int, default=200)
    ap.add_argument("--hold", type=float, default=12.0)
    ap.add_argument("--cold-only", action="store_true", help="measure the cold start alone")
    ap.add_argument(
        "--startup", type=float, default=0.0, help="simulated startup (readySeconds), seconds"
    )
    args = ap.parse_args()
    root = Path(__file__).resolve().parents[1]
    tmp = Path(tempfile.mkdtemp(prefix="nvcf-bench-autoscale-"))
    delays = {"scheduleSeconds": 0, "pullSeconds": 0, "readySeconds": args.startup}
    catalog = simulated_catalog(delays, nodes=8)
    (tmp / "clusters.yaml").write_text(json.dumps(catalog))
    port = free_port()
    env = {
        "NVCF_DATA_DIR": str(tmp / "data"),
        "NVCF_BOOTSTRAP_API_KEY": KEY,
        "NVCF_RATE_LIMIT_PER_SECOND": "0",
        "NVCF_CLUSTERS_FILE": str(tmp / "clusters.yaml"),
        "PYTHONPATH": str(root),
        **SETTINGS,
    }
    server = start(
        [sys.executable, "-m", "service.cli", "serve", "--port", str(port)], env, port, str(root)
    )
    try:
        api = Api(port)
        if not args.cold_only:
            fn = api.deploy("bench-step", 1, args.max)
            asyncio.run(step(api, port, fn, args))
        cold_start(api, port, startup=sum(delays.values()))
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
