"""Throughput of the real server against a bare FastAPI app, in the same run (issue: foundation).

Starts `nvcf-server` (uvicorn, one worker, SQLite by default or NVCF_DATABASE_URL) and a bare
FastAPI app that returns JSON documents of the same size, loads both with concurrent keep-alive
clients from a separate process, and prints requests per second for GET of one version, list of
100 versions and create, each as a ratio to the bare app. Target: GET one ≥ 0.5.

    .venv/bin/python bench/api.py [--seconds 5] [--concurrency 16] [--baseline-tree PATH]

`--baseline-tree PATH` (a checkout of an older commit) also starts that tree's server and loads
it in the same rounds, printing each scenario's requests per second against it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.loadgen import LoadResult, build_request, run_load

KEY = "nvapi-bench-" + "k" * 40
BODY = {
    "name": "bench-fn",
    "inferenceUrl": "/echo",
    "inferencePort": 8000,
    "containerImage": "nvcr.io/acme/echo:1.0",
    "tags": ["bench"],
}


def simulated_catalog(
    simulation: dict[str, object], *, nodes: int = 1, cluster: str = "bench-a"
) -> dict[str, object]:
    """A catalog of one group `bench`: one simulated cluster of `nodes` 8-GPU H100 nodes with
    the given `simulation:` block."""
    return {
        "clusterGroups": [
            {
                "name": "bench",
                "clusters": [
                    {
                        "name": cluster,
                        "adapter": "simulated",
                        "provider": "NCP",
                        "region": "local",
                        "nodes": [{"gpu": "H100", "gpusPerNode": 8, "count": nodes}],
                        "simulation": simulation,
                    }
                ],
            }
        ]
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code in (200, 404):
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise SystemExit("server did not start")


def start(
    cmd: list[str], env: dict[str, str], port: int, cwd: str | None = None
) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        cmd,
        # the servers a bench starts side by side would all claim the gRPC port (10081);
        # a bench of gRPC turns it on in `env`
        env={**os.environ, "NVCF_GRPC_ENABLED": "false", **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=cwd,
    )
    wait_up(port, proc)
    return proc


def seed(port: int) -> tuple[str, str, dict[str, object]]:
    """One function with 100 versions; the documents each scenario answers."""
    base = f"http://127.0.0.1:{port}/v2/nvcf"
    with httpx.Client(headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as c:
        first = c.post(f"{base}/functions", json=BODY).json()["function"]
        fid, vid = first["id"], first["versionId"]
        for _ in range(99):
            c.post(f"{base}/functions/{fid}/versions", json=BODY).raise_for_status()
        docs = {
            "one": c.get(f"{base}/functions/{fid}/versions/{vid}").json(),
            "list": c.get(f"{base}/functions/{fid}/versions").json(),
            "create": c.post(f"{base}/functions", json=BODY).json(),
        }
    assert len(docs["list"]["functions"]) == 100
    return fid, vid, docs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--baseline-tree", help="an older checkout to load in the same rounds")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="nvcf-bench-"))
    real_port, bare_port = free_port(), free_port()
    # a throughput test of one account: its rate limit and quotas would measure those instead
    env = {
        "NVCF_DATA_DIR": str(tmp),
        "NVCF_BOOTSTRAP_API_KEY": KEY,
        "NVCF_RATE_LIMIT_PER_SECOND": "0",
        "NVCF_QUOTA_FUNCTIONS": "1000000",
    }
    real = start(
        [sys.executable, "-m", "service.cli", "serve", "--port", str(real_port)], env, real_port
    )
    old: subprocess.Popen[bytes] | None = None
    try:
        fid, vid, docs = seed(real_port)
        if args.baseline_tree:
            old_port = free_port()
            old_env = {
                **env,
                "NVCF_DATA_DIR": str(tmp / "baseline"),
                "PYTHONPATH": args.baseline_tree,
            }
            old = start(
                [sys.executable, "-m", "service.cli", "serve", "--port", str(old_port)],
                old_env,
                old_port,
                cwd=args.baseline_tree,
            )
            old_fid, old_vid, _ = seed(old_port)
        docs_file = tmp / "docs.json"
        docs_file.write_text(json.dumps(docs))
        bare = start(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "bench.bare_app:app",
                "--port",
                str(bare_port),
                "--log-level",
                "warning",
                "--no-access-log",
            ],
            {
                "BENCH_BARE_DOCS": str(docs_file),
                "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
            },
            bare_port,
        )
        body = json.dumps(BODY).encode()
        hdrs = {"Authorization": f"Bearer {KEY}"}
        jhdrs = {**hdrs, "Content-Type": "application/json"}
        host = "127.0.0.1"
        paths = [
            ("GET one version", "GET", "/functions/{fid}/versions/{vid}", "/one", hdrs, b""),
            ("list of 100 versions", "GET", "/functions/{fid}/versions", "/list", hdrs, b""),
            ("create", "POST", "/functions", "/create", jhdrs, body),
        ]
        scenarios = [
            (
                name,
                build_request(method, "/v2/nvcf" + path.format(fid=fid, vid=vid), host, h, payload),
                build_request(method, bare_path, host, h, payload),
                None
                if old is None
                else build_request(
                    method, "/v2/nvcf" + path.format(fid=old_fid, vid=old_vid), host, h, payload
                ),
            )
            for name, method, path, bare_path, h, payload in paths
        ]
        print(
            f"{'scenario':24} {'server rps':>11} {'bare rps':>10} {'ratio':>7}  (concurrency "
            f"{args.concurrency}, {args.rounds} alternating rounds of {args.seconds:g} s, "
            "medians, SQLite)"
        )
        with ProcessPoolExecutor(max_workers=1) as pool:

            def load(port: int, req: bytes, seconds: float) -> LoadResult:
                return pool.submit(run_load, host, port, req, seconds, args.concurrency).result()

            for name, real_req, bare_req, old_req in scenarios:
                load(bare_port, bare_req, 0.5)
                load(real_port, real_req, 0.5)
                reals, bares, olds, ratios = [], [], [], []
                for i in range(args.rounds):
                    # Alternate the order so a drift in machine speed hits every side alike.
                    b = r = None
                    order = ["bare", "real", "old"] if i % 2 == 0 else ["old", "real", "bare"]
                    for side in order:
                        if side == "bare":
                            b = load(bare_port, bare_req, args.seconds)
                        elif side == "real":
                            r = load(real_port, real_req, args.seconds)
                        elif old_req is not None:
                            o = load(old_port, old_req, args.seconds)
                            olds.append(o.rps)
                    assert b is not None and r is not None
                    if r.errors or b.errors:
                        print(f"  warning: {r.errors} server errors, {b.errors} bare errors")
                    reals.append(r.rps)
                    bares.append(b.rps)
                    ratios.append(r.rps / b.rps)
                rounds = ", ".join(f"{x:.2f}" for x in ratios)
                against = ""
                if olds:
                    against = (
                        f"; baseline tree {statistics.median(olds):.0f} rps, this tree "
                        f"{statistics.median(reals) / statistics.median(olds):.2f}x of it"
                    )
                print(
                    f"{name:24} {statistics.median(reals):11.0f} {statistics.median(bares):10.0f} "
                    f"{statistics.median(ratios):7.2f}  (rounds: {rounds}{against})"
                )
        bare.terminate()
        bare.wait(10)
    finally:
        for proc in (real, old):
            if proc is not None:
                proc.terminate()
                proc.wait(10)


if __name__ == "__main__":
    main()
