"""What pexec adds, counted in instructions instead of seconds: free of the machine's noise.

bench/invoke.py measures requests per second, which other work on a shared machine moves by
a third from run to run. This counts, under valgrind's callgrind, every instruction a server
process executes (all its threads, the event loop's idle turns and background tasks
included) while it is loaded with keep-alive clients (bench/loadgen.py), divided by the
requests answered: the echo server loaded directly (the baseline), then `nvcf-server`
forwarding pexec to a second, uninstrumented echo server, with local dispatch and with Redis
dispatch (`--modes`; a real, uninstrumented `redis-server` on a free port) — in the same run.
Collection is switched on only around the measured load (`callgrind_control`), so start-up
and deployment do not count. Repeatable to about a per cent, so one change's worth shows at
once. Needs valgrind (installed with apt-get when missing and run as root, else it says so);
a few minutes (the servers start under valgrind).

    .venv/bin/python bench/invoke_instructions.py [--seconds 15] [--concurrency 16]
        [--modes local,redis]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.api import free_port
from bench.invoke import (
    JSON_HEADERS,
    PAYLOAD,
    deploy,
    parse_list,
    pexec_request,
    program,
    server_env,
    start_redis,
)
from bench.loadgen import build_request, run_load

MODES = ("local", "redis")


def callgrind(
    command: list[str], out: Path, env: dict[str, str], cwd: str
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",  # switched on around the measured load only
            f"--callgrind-out-file={out}",
            *command,
        ],
        env=env,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_for(url: str, proc: subprocess.Popen[bytes], seconds: float = 900) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{url}: the process exited with {proc.returncode}")
        try:
            httpx.get(url, timeout=5)
            return
        except httpx.TransportError:
            time.sleep(0.5)
    raise SystemExit(f"{url} did not answer")


def counted(pid: int, out: Path, port: int, request: bytes, args: argparse.Namespace) -> float:
    """Instructions per request of process `pid`, over a load of `request`."""

    def control(*flags: str) -> None:
        subprocess.run(["callgrind_control", *flags, str(pid)], check=True, capture_output=True)

    control("-i", "on")
    run_load("127.0.0.1", port, request, 3.0, args.concurrency, False)  # warm, instrumented
    control("-z")
    result = run_load("127.0.0.1", port, request, args.seconds, args.concurrency, False)
    control("-d")
    control("-i", "off")
    time.sleep(0.5)
    dumps = sorted(out.parent.glob(out.name + "*"), key=lambda p: p.stat().st_mtime)
    total = 0
    for line in dumps[-1].read_text().splitlines():
        if line.startswith(("totals:", "summary:")):
            total = int(line.split()[1])
            break
    if not result.requests or result.errors:
        raise SystemExit(f"{result.requests} answered, {result.errors} not 2xx")
    return total / result.requests


def main() -> None:
    ap = argparse.ArgumentParser(description="instructions per pexec against the echo server")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument(
        "--modes",
        type=lambda text: parse_list(text, MODES),
        default=list(MODES),
        help="pexec with local and/or Redis dispatch (comma-separated)",
    )
    args = ap.parse_args()
    if program("valgrind") is None or program("callgrind_control") is None:
        raise SystemExit(2)
    root = Path(__file__).resolve().parents[1]
    tmp = Path(tempfile.mkdtemp(prefix="nvcf-bench-instructions-"))
    echo = [sys.executable, str(root / "bench" / "echo_server.py"), "--port"]
    counted_port, echo_port = free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        env = {**os.environ, "PYTHONPATH": str(root)}
        baseline = callgrind([*echo, str(counted_port)], tmp / "echo.out", env, str(root))
        procs.append(baseline)
        procs.append(subprocess.Popen([*echo, str(echo_port)], stdout=subprocess.DEVNULL))
        redis_url = None
        if "redis" in args.modes:
            redis = start_redis(tmp / "redis")
            if redis is None:
                args.modes.remove("redis")
            else:
                procs.append(redis[0])
                redis_url = redis[1]
        servers = {}
        for mode in args.modes:
            port = free_port()
            # side by side: the gRPC listener off (they would all claim its port)
            settings = {**env, **server_env(tmp / mode, echo_port), "NVCF_GRPC_ENABLED": "false"}
            if mode == "redis":
                settings["NVCF_REDIS_URL"] = f"{redis_url}/0"
            command = [sys.executable, "-m", "service.cli", "serve", "--port", str(port)]
            server = callgrind(command, tmp / f"{mode}.out", settings, str(root))
            procs.append(server)
            servers[mode] = (server, port)
        wait_for(f"http://127.0.0.1:{counted_port}/echo", baseline)
        wait_for(f"http://127.0.0.1:{echo_port}/echo", procs[1])
        direct = build_request("POST", "/echo", "127.0.0.1", JSON_HEADERS, PAYLOAD)
        lines = [
            (
                "echo server, loaded directly",
                counted(baseline.pid, tmp / "echo.out", counted_port, direct, args),
            )
        ]
        for mode, (server, port) in servers.items():
            wait_for(f"http://127.0.0.1:{port}/health", server)
            fid, vid = deploy(port, max(64, args.concurrency))
            per = counted(server.pid, tmp / f"{mode}.out", port, pexec_request(fid, vid), args)
            lines.append((f"nvcf-server, per pexec, {mode} dispatch", per))
        print(f"instructions per request, whole process, {args.concurrency} clients:")
        for name, per in lines:
            print(f"  {name:40} {per:12,.0f}  ({per / lines[0][1]:.2f}× the echo server)")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
