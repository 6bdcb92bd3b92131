"""Invocation latency while a function's telemetry endpoint refuses, hangs or is down, against a
function naming no telemetry, in the same run (issue 44: ≤ 1.05×).

Starts `nvcf-server serve` (SQLite, the built-in simulated worker) with a short export
interval, and three endpoints in this process: one answering every request 401, one that
accepts connections and never answers, and a port where nobody listens. Four functions are
deployed: one naming no telemetry and one per endpoint, each naming the endpoint as its logs,
metrics and traces telemetry (OTLP over HTTP). Then, in alternating rounds, `--requests` pexec
calls to the functions in turn, one request each; printed is each function's p50 and p99 and its
p50 as a ratio to the plain function's (median over rounds), and what the operator sees:
`nvcf_telemetry_dropped_total` by reason and each telemetry's `lastError`. `--healthy` adds
a fifth function whose endpoint takes every export (answers 200).

    .venv/bin/python bench/telemetry.py [--rounds 5] [--requests 200] [--healthy]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.api import KEY, free_port, simulated_catalog, start

V = "/v2/nvcf"
FUNCTION = {
    "inferenceUrl": "/echo",
    "inferencePort": 8000,
    "containerImage": "nvcr.io/acme/echo:1.0",
}


def refusing() -> ThreadingHTTPServer:
    class Refuse(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    return ThreadingHTTPServer(("127.0.0.1", 0), Refuse)


def taking() -> ThreadingHTTPServer:
    class Take(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    return ThreadingHTTPServer(("127.0.0.1", 0), Take)


def hanging(release: threading.Event) -> ThreadingHTTPServer:
    class Hang(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            release.wait()  # never answers while the bench runs

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hang)
    server.daemon_threads = True
    return server


def server_env(tmp: Path, allowed: list[str]) -> dict[str, str]:
    catalog = simulated_catalog(
        {"scheduleSeconds": 0.05, "pullSeconds": 0.05, "readySeconds": 0.05}
    )
    (tmp / "clusters.yaml").write_text(json.dumps(catalog))
    return {
        "NVCF_DATA_DIR": str(tmp / "data"),
        "NVCF_BOOTSTRAP_API_KEY": KEY,
        "NVCF_RATE_LIMIT_PER_SECOND": "0",
        "NVCF_CLUSTERS_FILE": str(tmp / "clusters.yaml"),
        "NVCF_TELEMETRY_ALLOWLIST": ",".join(allowed),
        "NVCF_TELEMETRY_EXPORT_INTERVAL": "0.5",
        "NVCF_TELEMETRY_EXPORT_TIMEOUT": "2",
    }


def deploy(
    c: httpx.Client, name: str, endpoint: str | None, types: list[str]
) -> tuple[str, str | None]:
    """A function deployed until ACTIVE (naming a telemetry at `endpoint`), and the
    telemetry's id."""
    body: dict[str, Any] = {**FUNCTION, "name": name}
    tid = None
    if endpoint is not None:
        telemetry = {
            "endpoint": endpoint,
            "protocol": "HTTP",
            "provider": "OTEL_COLLECTOR",
            "types": types,
            "secret": {"name": name, "value": "bench-key"},
        }
        resp = c.post(f"{V}/telemetries", json=telemetry)
        resp.raise_for_status()
        tid = resp.json()["telemetry"]["telemetryId"]
        body["telemetries"] = {f"{t.lower()}TelemetryId": tid for t in types}
    fn = c.post(f"{V}/functions", json=body).json()["function"]
    spec = {"gpu": "H100", "backend": "bench", "minInstances": 1, "maxInstances": 1}
    url = f"{V}/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
    c.post(url, json={"deploymentSpecifications": [spec]}).raise_for_status()
    deadline = time.monotonic() + 60
    while (
        c.get(f"{V}/functions/{fn['id']}/versions/{fn['versionId']}").json()["function"]["status"]
        != "ACTIVE"
    ):
        if time.monotonic() > deadline:
            raise SystemExit(f"{name} did not become ACTIVE")
        time.sleep(0.1)
    return str(fn["id"]), tid


def latencies(c: httpx.Client, fid: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        began = time.perf_counter()
        resp = c.post(f"{V}/pexec/functions/{fid}", json={"x": 1})
        out.append(time.perf_counter() - began)
        resp.raise_for_status()
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument(
        "--types", default="LOGS,METRICS,TRACES", help="what the telemetries receive"
    )
    parser.add_argument("--healthy", action="store_true", help="add an endpoint taking all")
    args = parser.parse_args()
    release = threading.Event()
    servers = {"401": refusing(), "hanging": hanging(release)}
    if args.healthy:
        servers["healthy"] = taking()
    for s in servers.values():
        threading.Thread(target=s.serve_forever, daemon=True).start()
    down = free_port()  # nobody listens there
    endpoints = {
        "401": f"http://127.0.0.1:{servers['401'].server_address[1]}",
        "hanging": f"http://127.0.0.1:{servers['hanging'].server_address[1]}",
        "down": f"http://127.0.0.1:{down}",
    }
    if args.healthy:
        endpoints["healthy"] = f"http://127.0.0.1:{servers['healthy'].server_address[1]}"
    allowed = [e.removeprefix("http://") for e in endpoints.values()]
    port = free_port()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            command = [sys.executable, "-m", "service.cli", "serve", "--port", str(port)]
            server = start(command, server_env(Path(tmp), allowed), port)
            try:
                measure(port, endpoints, args)
            finally:
                server.terminate()
                server.wait(30)
    finally:
        release.set()
        for s in servers.values():
            s.shutdown()


def measure(port: int, endpoints: dict[str, str], args: argparse.Namespace) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base, headers=headers, timeout=60) as c:
        types = args.types.split(",")
        functions = {"none": deploy(c, "no-telemetry", None, types)}
        for name, endpoint in endpoints.items():
            functions[name] = deploy(c, f"endpoint-{name}", endpoint, types)
        for fid, _ in functions.values():
            latencies(c, fid, 20)  # warm each path
        runs: dict[str, list[list[float]]] = {name: [] for name in functions}
        for _ in range(args.rounds):
            # interleaved request by request: the machine's noise falls on every function alike
            taken: dict[str, list[float]] = {name: [] for name in functions}
            for _ in range(args.requests):
                for name, (fid, _) in functions.items():
                    taken[name] += latencies(c, fid, 1)
            for name, values in taken.items():
                runs[name].append(values)
        ms = 1000
        print(f"pexec latency, {args.rounds} rounds x {args.requests} requests per function")
        for name, rounds in runs.items():
            every = [v for r in rounds for v in r]
            ratios = [
                statistics.median(r) / statistics.median(b)
                for r, b in zip(rounds, runs["none"], strict=True)
            ]
            print(
                f"  {name:8} p50 {pct(every, 0.5) * ms:6.2f} ms  p99 {pct(every, 0.99) * ms:6.2f}"
                f" ms  p50 / none {statistics.median(ratios):.3f}x (target <= 1.05x)"
            )
        time.sleep(3)  # the exports' last attempts of this run
        metrics = c.get("/metrics").text
        print("what the operator and the tenant see")
        for line in metrics.splitlines():
            if line.startswith("nvcf_telemetry_dropped_total{"):
                print(f"  {line}")
        for name, (_, tid) in functions.items():
            if tid is not None:
                status = c.get(f"{V}/telemetries/{tid}").json()["telemetry"]["status"]
                print(f"  {name:8} lastError: {status.get('lastError')}")


if __name__ == "__main__":
    main()
