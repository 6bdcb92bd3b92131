"""Invocation benchmark: what pexec adds over calling the worker directly, in the same run.

Starts a small echo HTTP server (bench/echo_server.py) and loads it, in alternating rounds,
with the same keep-alive clients from another process (bench/loadgen.py, `--concurrency`
connections), directly and through each chosen mode (`--modes`, all by default):

- `direct`: the echo server itself (the baseline every other line is a ratio to);
- `nginx`: Debian's nginx as a plain keep-alive reverse proxy to it (one worker process,
  `upstream { keepalive 64; }`, HTTP/1.1, `Connection: ""`): the reference a user would put in
  front instead;
- `local`: pexec through `nvcf-server serve` with in-process dispatch (the default);
- `redis`: pexec through a second `nvcf-server serve` with `NVCF_REDIS_URL` (a real
  `redis-server` started here on a free port): the multi-replica setup;

plus, with `--processes 1,2`, pexec through `nvcf-server invoke --processes N` (Redis
dispatch, sharing the `redis` server's database and Redis), and with `--baseline-tree REV`,
the `local` and `redis` lines for an earlier commit (checked out with `git worktree add` into a
temporary directory and started from there), and with `--variant 'NAME:VAR=VALUE'` a local
dispatch line whose server runs with those settings (a speed-up switched off, measured beside
the default in the same rounds). Every server gets a catalog whose simulated
cluster forwards to the echo server (`simulation.upstream`) and deploys its own function.

Printed for each line: requests per second at `--concurrency` and its ratio to direct (median
of the rounds' ratios; targets pexec/direct ≥ 0.30 local, ≥ 0.15 Redis), the server's CPU per
request (from /proc, all its processes: the figure other work on the machine moves least);
then at one client, the latency each adds at p50/p99 (target: pexec p50 ≤ 0.5 ms added); and
the `local` server's RSS before and while 1,000 requests are pending at once on a slow
upstream. nginx and redis-server are installed with apt-get when missing and this runs as
root; otherwise the line says what to install and is skipped.

    .venv/bin/python bench/invoke.py [--seconds 3] [--rounds 5] [--concurrency 16]
        [--modes direct,nginx,local,redis] [--processes 1,2] [--baseline-tree REV]
        [--variant 'gc freeze off:NVCF_GC_FREEZE=false'] [--granian]

`--granian` adds a local-dispatch line whose application (the serve command's, unchanged) is
served by granian (Rust, on hyper; the `bench` extra installs it) instead of uvicorn, one worker
on uvloop, its head buffer and head time set to the server's settings: the comparison that
decided the HTTP server (docs/invocation.md, "The HTTP server").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import grp
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
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
MODES = ("direct", "nginx", "local", "redis")
HOST = "127.0.0.1"
JSON_HEADERS = {"Content-Type": "application/json"}
#: what to install from Debian when a program is missing
PACKAGES = {
    "nginx": "nginx-light",
    "redis-server": "redis-server",
    "valgrind": "valgrind",
    "callgrind_control": "valgrind",
}


def cpu_seconds(pid: int) -> float:
    """User + system CPU the process has used so far (/proc/<pid>/stat)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (from /proc)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += parents.get(p, [])
    return tree


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
    tmp.mkdir(parents=True, exist_ok=True)
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


def pexec_request(fid: str, vid: str, extra: dict[str, str] | None = None) -> bytes:
    return build_request(
        "POST",
        f"/v2/nvcf/pexec/functions/{fid}/versions/{vid}",
        HOST,
        {**JSON_HEADERS, "Authorization": f"Bearer {KEY}", **(extra or {})},
        PAYLOAD,
    )


def check_pexec(port: int, fid: str, vid: str) -> None:
    check = httpx.post(
        f"http://{HOST}:{port}/v2/nvcf/pexec/functions/{fid}/versions/{vid}",
        content=PAYLOAD,
        headers={**JSON_HEADERS, "Authorization": f"Bearer {KEY}"},
        timeout=30,
    )
    assert check.status_code == 200 and check.json()["echo"] == json.loads(PAYLOAD), check.text


# ---------------------------------------------------------------------- programs from Debian


def program(name: str) -> str | None:
    """The path of `name` (in PATH or /usr/sbin), installed with apt-get when missing and this
    runs as root; None (and the install line printed) when it cannot be had."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if found:
        return found
    package = PACKAGES[name]
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print(f"  ({name} missing: apt-get install -y {package})", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        done = subprocess.run(
            ["apt-get", "install", "-y", package], env=env, capture_output=True, check=False
        )
        found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
        if done.returncode == 0 and found:
            return found
    print(f"  {name} is not installed: `apt-get install -y {package}` (as root); line skipped")
    return None


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=1):
            return
        time.sleep(0.1)
    raise SystemExit(f"{what} did not listen on {port}")


def start_redis(tmp: Path) -> tuple[subprocess.Popen[bytes], str] | None:
    """A throw-away redis-server on a free port, no persistence, its files in `tmp`."""
    binary = program("redis-server")
    if binary is None:
        return None
    port = free_port()
    tmp.mkdir(parents=True, exist_ok=True)
    command = [binary, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no"]
    command += ["--dir", str(tmp), "--logfile", str(tmp / "redis.log")]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(port, proc, "redis-server")
    return proc, f"redis://{HOST}:{port}"


NGINX_CONF = """\
worker_processes 1;
{user}pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    upstream echo {{
        server 127.0.0.1:{upstream};
        keepalive 64;
        # below the echo server's own idle limit (uvicorn's 5 s): nginx does not retry a POST
        # on a kept connection the worker closed
        keepalive_timeout 4s;
    }}
    server {{
        listen 127.0.0.1:{port};
        # the clients' connections are reused for the whole run, as with the other lines
        keepalive_requests 100000000;
        location / {{
            proxy_pass http://echo;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""


def start_nginx(tmp: Path, upstream: int) -> tuple[subprocess.Popen[bytes], int] | None:
    """nginx as a keep-alive reverse proxy to `upstream`, one worker, as the current user, its
    configuration and files in `tmp`."""
    binary = program("nginx")
    if binary is None:
        return None
    port = free_port()
    tmp.mkdir(parents=True, exist_ok=True)
    # as root the master would hand its worker to `nobody`: keep the current user
    user = f"user {getpass.getuser()} {grp.getgrgid(os.getgid()).gr_name};\n"
    conf = NGINX_CONF.format(
        user=user if os.geteuid() == 0 else "", tmp=tmp, upstream=upstream, port=port
    )
    (tmp / "nginx.conf").write_text(conf)
    proc = subprocess.Popen(
        [binary, "-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-g", "daemon off;"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(port, proc, "nginx")
    return proc, port


@contextlib.contextmanager
def baseline_checkout(root: Path, rev: str) -> Iterator[Path]:
    """`rev` checked out (detached) into a temporary worktree, removed afterwards."""
    where = Path(tempfile.mkdtemp(prefix="nvcf-bench-baseline-")) / "tree"
    subprocess.run(
        ["git", "-C", str(root), "worktree", "add", "--detach", str(where), rev],
        check=True,
        capture_output=True,
    )
    try:
        yield where
    finally:
        subprocess.run(
            ["git", "-C", str(root), "worktree", "remove", "--force", str(where)],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(where.parent, ignore_errors=True)


# ---------------------------------------------------------------------- the load


@dataclass
class Target:
    """One line of the table: a port loaded with one request."""

    name: str
    port: int
    request: bytes
    #: the processes whose CPU counts (None: not measured)
    pid: int | None = None
    results: list[LoadResult] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    #: each process's share of the CPU the target used, per round (several processes only)
    shares: list[list[float]] = field(default_factory=list)

    def pids(self) -> list[int]:
        return [] if self.pid is None else process_tree(self.pid)


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
    auth = {"Authorization": f"Bearer {KEY}"}  # the operator's: tenants' series are theirs
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", headers=auth, timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("nvcf_invocation_in_flight{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def measure(
    pool: ProcessPoolExecutor, targets: list[Target], args: argparse.Namespace, clients: int
) -> None:
    """`args.rounds` rounds loading every target in turn, the order reversed every other round
    so that a drift in the machine's speed hits every line alike."""
    for t in targets:
        t.results.clear()
        t.cpu_ms.clear()
        t.shares.clear()
    for i in range(args.rounds):
        for t in targets if i % 2 == 0 else reversed(targets):
            pids = t.pids()
            before = [cpu_seconds(p) for p in pids]
            try:
                result = pool.submit(
                    run_load, HOST, t.port, t.request, args.seconds, clients, True
                ).result()
            except (OSError, asyncio.IncompleteReadError) as exc:
                raise SystemExit(f"{t.name}: the load failed: {exc!r}") from exc
            if pids and result.requests:
                each = [cpu_seconds(p) - b for p, b in zip(pids, before, strict=True)]
                t.cpu_ms.append(sum(each) / result.requests * 1000)
                busy = sorted((x for x in each if x > 0.05 * sum(each)), reverse=True)
                if len(busy) > 1:
                    t.shares.append([x / sum(busy) for x in busy])
            t.results.append(result)


def report(targets: list[Target], clients: int) -> None:
    direct = targets[0]
    d50 = statistics.median(r.percentile(50) for r in direct.results) * 1000
    d99 = statistics.median(r.percentile(99) for r in direct.results) * 1000
    print(f"concurrency {clients}:")
    print(
        f"  {'':34} {'rps':>8} {'/direct':>7} {'p50 ms':>7} {'p99 ms':>7}"
        f" {'+p50':>6} {'+p99':>6} {'CPU/req':>8}  rounds (ratio to direct)"
    )
    for t in targets:
        rps = statistics.median(r.rps for r in t.results)
        ratios = [r.rps / d.rps for d, r in zip(direct.results, t.results, strict=True)]
        p50 = statistics.median(r.percentile(50) for r in t.results) * 1000
        p99 = statistics.median(r.percentile(99) for r in t.results) * 1000
        cpu = f"{statistics.median(t.cpu_ms):6.3f}ms" if t.cpu_ms else f"{'':8}"
        errors = sum(r.errors for r in t.results)
        print(
            f"  {t.name:34} {rps:8.0f} {statistics.median(ratios):7.2f} {p50:7.2f} {p99:7.2f}"
            f" {p50 - d50:+6.2f} {p99 - d99:+6.2f} {cpu}  "
            + ", ".join(f"{r:.2f}" for r in ratios)
            + (f"  [{errors} non-2xx answers]" if errors else "")
        )
    for t in targets:
        if t.shares:
            rounds = "; ".join("/".join(f"{x:.0%}" for x in split) for split in t.shares)
            print(f"  {t.name}: CPU split between its busy processes per round: {rounds}")


def report_variants(targets: list[Target], names: list[str]) -> None:
    """Each `--variant` line against the default `local` line of the same rounds: requests/s
    and CPU per request as ratios (median of the rounds', their spread)."""
    local = next((t for t in targets if t.name == "pexec, local dispatch"), None)
    if local is None:
        return
    for t in targets:
        if t.name not in names:
            continue
        rps = [a.rps / b.rps for a, b in zip(t.results, local.results, strict=True)]
        cpu = [a / b for a, b in zip(t.cpu_ms, local.cpu_ms, strict=False)]
        line = f"  {t.name} / local: req/s {statistics.median(rps):.2f} "
        line += f"[{min(rps):.2f}–{max(rps):.2f}]"
        if cpu:
            line += f", CPU/req {statistics.median(cpu):.2f} [{min(cpu):.2f}–{max(cpu):.2f}]"
        print(line)


def memory_check(
    pool: ProcessPoolExecutor, port: int, pid: int, fid: str, vid: str, count: int
) -> None:
    before = rss_kib(pid)
    slow = pexec_request(fid, vid, {"X-Delay-Ms": "20000", "NVCF-POLL-SECONDS": "120"})
    pending = pool.submit(run_pending, port, slow, count)
    deadline = time.monotonic() + 60
    peak = 0.0
    while time.monotonic() < deadline and peak < count:
        peak = max(peak, in_flight(port))
        time.sleep(0.2)
    during = rss_kib(pid)
    statuses = pending.result(timeout=120)
    ok = sum(1 for s in statuses if s == 200)
    print(
        f"local: {count} requests pending at once on a slow upstream ({peak:.0f} in "
        f"flight seen): server RSS {before / 1024:.1f} MiB before, "
        f"{during / 1024:.1f} MiB during (+{(during - before) / count:.1f} KiB "
        f"per request); {ok}/{count} answered 200"
    )


def parse_list(text: str, allowed: tuple[str, ...]) -> list[str]:
    chosen = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in allowed]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown: {', '.join(unknown)} (from {allowed})")
    return chosen


def main() -> None:
    ap = argparse.ArgumentParser(description="pexec against the worker called directly")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--pending", type=int, default=1000, help="0: no memory check")
    ap.add_argument(
        "--modes",
        type=lambda text: parse_list(text, MODES),
        default=list(MODES),
        help=f"comma-separated, from {','.join(MODES)} (direct is always loaded)",
    )
    ap.add_argument(
        "--processes",
        type=lambda text: [int(n) for n in text.split(",") if n.strip()],
        default=[],
        help="e.g. 1,2: also pexec through `nvcf-server invoke --processes N` (Redis)",
    )
    ap.add_argument("--baseline-tree", metavar="REV", help="also the pexec lines of REV")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:VAR=VALUE[,VAR=VALUE]",
        help="also a local-dispatch pexec line whose server has these settings (e.g. "
        "'gc freeze off:NVCF_GC_FREEZE=false'): a speed-up switched off, in the same run",
    )
    ap.add_argument(
        "--granian",
        action="store_true",
        help="also a local-dispatch line with the same application served by granian",
    )
    args = ap.parse_args()
    root = Path(__file__).resolve().parents[1]
    tmp = Path(tempfile.mkdtemp(prefix="nvcf-bench-invoke-"))
    procs: list[subprocess.Popen[bytes]] = []
    with contextlib.ExitStack() as stack:

        def stop_all() -> None:
            for proc in reversed(procs):
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()

        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        stack.callback(stop_all)  # first: the servers use the files
        echo_port = free_port()
        echo = subprocess.Popen(
            [sys.executable, str(root / "bench" / "echo_server.py"), "--port", str(echo_port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(echo)
        wait_port(echo_port, echo, "the echo server")
        targets = [
            Target(
                "direct to the echo server",
                echo_port,
                build_request("POST", "/echo", HOST, JSON_HEADERS, PAYLOAD),
                echo.pid,
            )
        ]
        concurrency = max(args.pending, args.concurrency)
        limits = {
            "NVCF_HTTP_MAX_CONNECTIONS": str(args.pending + 500),
            "NVCF_INVOKE_QUEUE_MAX": str(args.pending * 2 + 100),
        }
        if "nginx" in args.modes:
            started = start_nginx(tmp / "nginx", echo_port)
            if started:
                procs.append(started[0])
                targets.append(
                    Target("nginx keep-alive proxy", started[1], targets[0].request, started[0].pid)
                )
        redis_url = None
        if "redis" in args.modes or args.processes:
            redis = start_redis(tmp / "redis")
            if redis:
                procs.append(redis[0])
                redis_url = redis[1]

        def serve(
            tree: Path, name: str, dispatch: str, db: int = 0, extra: dict[str, str] | None = None
        ) -> tuple[subprocess.Popen[bytes], int, dict[str, str]]:
            port = free_port()
            env = {**server_env(tmp / name, echo_port), **limits, "PYTHONPATH": str(tree)}
            env.update(extra or {})
            if dispatch == "redis":
                assert redis_url is not None
                env["NVCF_REDIS_URL"] = f"{redis_url}/{db}"
            command = [sys.executable, "-m", "service.cli", "serve", "--port", str(port)]
            proc = start(command, env, port, cwd=str(tree))
            procs.append(proc)
            return proc, port, env

        local: tuple[subprocess.Popen[bytes], int, str, str] | None = None
        trees = [("", root)]
        if args.baseline_tree:
            trees.append(
                (
                    f" @{args.baseline_tree}",
                    stack.enter_context(baseline_checkout(root, args.baseline_tree)),
                )
            )
        for suffix, tree in trees:
            for dispatch in ("local", "redis"):
                if dispatch not in args.modes or (dispatch == "redis" and redis_url is None):
                    continue
                name = f"{dispatch}{'-baseline' if suffix else ''}"
                proc, port, env = serve(tree, name, dispatch, db=1 if suffix else 0)
                fid, vid = deploy(port, concurrency)
                check_pexec(port, fid, vid)
                targets.append(
                    Target(
                        f"pexec, {dispatch} dispatch{suffix}",
                        port,
                        pexec_request(fid, vid),
                        proc.pid,
                    )
                )
                if dispatch == "local" and not suffix:
                    local = (proc, port, fid, vid)
                if dispatch == "redis" and not suffix:
                    # `invoke --processes N` replicas beside this server: its database, its Redis
                    for n in args.processes if redis_url else []:
                        inv_port = free_port()
                        command = [sys.executable, "-m", "service.cli", "invoke"]
                        command += ["--port", str(inv_port), "--processes", str(n)]
                        inv = start(command, env, inv_port, cwd=str(tree))
                        procs.append(inv)
                        check_pexec(inv_port, fid, vid)
                        targets.append(
                            Target(
                                f"pexec, redis, invoke × {n} process{'es' if n > 1 else ''}",
                                inv_port,
                                pexec_request(fid, vid),
                                inv.pid,
                            )
                        )
        variants: list[str] = []
        for i, variant in enumerate(args.variant):
            label, _, assignments = variant.partition(":")
            extra = dict(a.split("=", 1) for a in assignments.split(",") if a.strip())
            proc, port, _ = serve(root, f"variant-{i}", "local", extra=extra)
            fid, vid = deploy(port, concurrency)
            check_pexec(port, fid, vid)
            targets.append(
                Target(f"pexec, local, {label}", port, pexec_request(fid, vid), proc.pid)
            )
            variants.append(targets[-1].name)
        if args.granian:
            port = free_port()
            env = {**server_env(tmp / "granian", echo_port), **limits, "PYTHONPATH": str(root)}
            command = [sys.executable, "-m", "granian", "--interface", "asgi", "--factory"]
            command += ["--host", HOST, "--port", str(port), "--workers", "1"]
            command += ["--loop", "uvloop", "--log-level", "warning", "--no-ws"]
            command += ["--http1-buffer-size", "65536", "--http1-header-read-timeout", "10000"]
            command += ["service.cli:serve_app"]
            proc = start(command, env, port, cwd=str(root))
            procs.append(proc)
            fid, vid = deploy(port, concurrency)
            check_pexec(port, fid, vid)
            targets.append(Target("pexec, local, granian", port, pexec_request(fid, vid), proc.pid))
            variants.append(targets[-1].name)
        with ProcessPoolExecutor(max_workers=1) as pool:
            for t in targets:  # warm every path (connections, caches) before counting
                pool.submit(run_load, HOST, t.port, t.request, 0.5, args.concurrency).result()
            print(
                f"{args.rounds} alternating rounds of {args.seconds:g} s each, medians; "
                f"SQLite; one server process each unless said; {os.cpu_count()} CPUs"
            )
            for clients in (args.concurrency, 1):
                measure(pool, targets, args, clients)
                report(targets, clients)
                report_variants(targets, variants)
            print(
                "targets: pexec/direct ≥ 0.30 local, ≥ 0.15 Redis (at "
                f"{args.concurrency}); pexec +p50 ≤ 0.5 ms at one client"
            )
            if local is not None and args.pending:
                memory_check(pool, local[1], local[0].pid, local[2], local[3], args.pending)


if __name__ == "__main__":
    main()
