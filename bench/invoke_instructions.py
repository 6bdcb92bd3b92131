"""What pexec adds, counted in instructions instead of seconds: free of the machine's noise.

bench/invoke.py measures requests per second, which other work on a shared machine moves by
a third from run to run. This counts, under valgrind's callgrind, the instructions a process
executes in its socket-read callbacks (collection toggled on uvloop's stream-read callback:
everything from a request's bytes arriving to its answer written) per request: the echo
server loaded directly (the baseline), then `nvcf-server` forwarding pexec requests to a
second, uninstrumented echo server — both with the same keep-alive clients (bench/loadgen.py),
in the same run. Repeatable to a fraction of a per cent, so one change's worth shows at once.
Needs valgrind (`callgrind_control`); about two minutes.

    .venv/bin/python bench/invoke_instructions.py [--seconds 15] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.api import free_port
from bench.invoke import KEY, PAYLOAD, deploy, server_env
from bench.loadgen import build_request, run_load

#: uvloop's stream-read callback: every `data_received` runs under it
READ_CALLBACK = "__pyx_f_6uvloop_4loop___uv_stream_on_read"


def callgrind(
    command: list[str], out: Path, env: dict[str, str], cwd: str
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--toggle-collect={READ_CALLBACK}",
            f"--callgrind-out-file={out}",
            *command,
        ],
        env=env,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_for(url: str, proc: subprocess.Popen[bytes], seconds: float = 600) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{url}: the process exited with {proc.returncode}")
        try:
            httpx.post(url, content=b"{}", timeout=5)
            return
        except httpx.TransportError:
            time.sleep(0.5)
    raise SystemExit(f"{url} did not answer")


def counted(pid: int, out: Path, port: int, request: bytes, args: argparse.Namespace) -> float:
    """Instructions per request in `pid`'s read callbacks, over a load of `request`."""

    def control(*flags: str) -> None:
        subprocess.run(["callgrind_control", *flags, str(pid)], check=True, capture_output=True)

    control("-i", "on")
    run_load("127.0.0.1", port, request, 3.0, args.concurrency, False)  # warm, instrumented
    control("-z")
    result = run_load("127.0.0.1", port, request, args.seconds, args.concurrency, False)
    control("-i", "off")
    control("-d")
    time.sleep(0.5)
    dumps = sorted(out.parent.glob(out.name + "*"), key=lambda p: p.stat().st_mtime)
    total = 0
    for line in dumps[-1].read_text().splitlines():
        if line.startswith("totals:"):
            total = int(line.split()[1])
    if not result.requests or result.errors:
        raise SystemExit(f"{result.requests} answered, {result.errors} not 2xx")
    return total / result.requests


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()
    root = Path(__file__).resolve().parents[1]
    tmp = Path(tempfile.mkdtemp(prefix="nvcf-bench-instructions-"))
    echo = [sys.executable, str(root / "bench" / "echo_server.py"), "--port"]
    counted_port, echo_port, server_port = free_port(), free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        env = {**os.environ, "PYTHONPATH": str(root)}
        baseline = callgrind([*echo, str(counted_port)], tmp / "echo.out", env, str(root))
        procs.append(baseline)
        procs.append(subprocess.Popen([*echo, str(echo_port)], stdout=subprocess.DEVNULL))
        settings = {**env, **server_env(tmp, echo_port)}
        command = [sys.executable, "-m", "service.cli", "serve", "--port", str(server_port)]
        server = callgrind(command, tmp / "server.out", settings, str(root))
        procs.append(server)
        wait_for(f"http://127.0.0.1:{counted_port}/echo", baseline)
        wait_for(f"http://127.0.0.1:{echo_port}/echo", procs[1])
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                httpx.get(f"http://127.0.0.1:{server_port}/health", timeout=5)
                break
            except httpx.TransportError:
                time.sleep(0.5)
        fid, vid = deploy(server_port, max(64, args.concurrency))
        json_headers = {"Content-Type": "application/json"}
        direct = build_request("POST", "/echo", "127.0.0.1", json_headers, PAYLOAD)
        through = build_request(
            "POST",
            f"/v2/nvcf/pexec/functions/{fid}/versions/{vid}",
            "127.0.0.1",
            {**json_headers, "Authorization": f"Bearer {KEY}"},
            PAYLOAD,
        )
        echo_per = counted(baseline.pid, tmp / "echo.out", counted_port, direct, args)
        pexec_per = counted(server.pid, tmp / "server.out", server_port, through, args)
        print(f"instructions per request in the read callbacks, {args.concurrency} clients:")
        print(f"  echo server, loaded directly   {echo_per:12,.0f}")
        print(f"  nvcf-server, per pexec          {pexec_per:12,.0f}")
        print(f"  ratio pexec/echo: {pexec_per / echo_per:.2f} (lower is better)")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait()


if __name__ == "__main__":
    main()
