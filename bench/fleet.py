"""Fleet-scale benchmark of the whole server (issue 32), driven through its API.

    .venv/bin/python bench/fleet.py [--count 10000] [--clients 4] [--idle 30] [--tree PATH]

Starts `nvcf-server` (one process, SQLite, the default settings but for quotas and the rate
limit) on a simulated cluster with zero delays, and prints, in the same run:

1. the server's idle CPU (every loop and thread: /proc/<pid>/stat) with `count/10` and with
   `count` settled deployments, and its ratio (target ≤ 1.5), each over `--idle` seconds
   starting `--settle` seconds after the last deployment turned ACTIVE (by default a little
   more than one time series period: the work the last changes caused, such as the next
   sample recounting the versions they wrote, is done by then);
2. the median latency of a deploy POST on the settled server at `count/10` and at `count`
   (target ratio ≤ 1.3);
3. the p50/p99 latency of a deploy POST and of a GET while the other 9/10 converge, against
   the same on the idle server (target p99 ≤ 5× idle);
4. the time for all of them to be ACTIVE against the time to submit them (target ≤ 1.2);
5. with all `count` settled, a change in one instance: a helm function (the `sim-workload`
   chart of tests/charts/corpus, pushed to a local registry) deployed with the simulated
   fault `FailAfterReady`, whose pod turns not Ready `--fail-after` seconds after it became
   Ready; the time from that moment (the pod's Ready condition's lastTransitionTime, which
   the instance's condition keeps as its `notReady` timer) until the bench sees the changed
   condition in the database, against the reconcile interval (target: within one).

`--postgres` runs it on a throw-away PostgreSQL server (tests/support/postgres.py) instead of
SQLite; `--split` (with `--postgres`) runs the API with `NVCF_RECONCILER_ENABLED=false` and the
reconciler in a second server process that takes no request (docs/operations.md §4): the CPU
figures are then both processes'.

`--tree PATH` runs the server of another checkout; `--baseline-tree REV` first runs the same
scenario on the server of git revision REV (exported to a temporary directory) and then prints
each figure of this tree against it (after/before). `bench/reconcile.py` measures the same
change in process, flipping the annotation on a running pod.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
from cryptography.fernet import Fernet

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.api import free_port, simulated_catalog, start
from service.core.settings import Settings
from tests.support.charts import build_chart, push_archive
from tests.support.registry import RegistryServer, start_registry

KEY = "nvapi-bench-" + "k" * 40
FUNCTION = {"inferenceUrl": "/echo", "inferencePort": 8000, "containerImage": "nvcr.io/a/e:1"}
SPEC = {"gpu": "H100", "backend": "bench", "minInstances": 1, "maxInstances": 1}
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(*pids: int) -> float:
    """User + system CPU of the processes, all threads."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / TICK


class Fleet:
    def __init__(self, port: int, db: Path | str) -> None:
        self.base = f"http://127.0.0.1:{port}/v2/nvcf"
        self.db = db
        self.local = threading.local()
        self.probe: tuple[str, str] | None = None
        #: which layer answered each GET (NVCF-Read-Path: fast-path, cache, database)
        self.read_paths: list[str] = []

    def client(self) -> httpx.Client:
        c = getattr(self.local, "c", None)
        if c is None:
            c = httpx.Client(
                base_url=self.base, headers={"Authorization": f"Bearer {KEY}"}, timeout=120
            )
            self.local.c = c
        return c

    def deploy(self, i: int) -> float:
        """Create a function and deploy it; the deploy POST's latency in seconds."""
        c = self.client()
        resp = c.post("/functions", json={"name": f"fn-{i}", **FUNCTION})
        resp.raise_for_status()
        fn = resp.json()["function"]
        if self.probe is None:
            self.probe = (fn["id"], fn["versionId"])
        url = f"/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
        start_at = time.perf_counter()
        c.post(url, json={"deploymentSpecifications": [SPEC]}).raise_for_status()
        return time.perf_counter() - start_at

    def get(self) -> float:
        assert self.probe is not None
        fid, vid = self.probe
        start_at = time.perf_counter()
        resp = self.client().get(f"/functions/{fid}/versions/{vid}")
        resp.raise_for_status()
        took = time.perf_counter() - start_at
        self.read_paths.append(resp.headers.get("NVCF-Read-Path", "database"))
        return took

    def active(self) -> int:
        query = "select count(*) from function_versions where status='ACTIVE'"
        if isinstance(self.db, str):  # a PostgreSQL DSN
            with psycopg.connect(self.db) as pg:
                found = pg.execute(query).fetchone()
                return int(found[0]) if found else 0
        with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=30) as conn:
            return int(conn.execute(query).fetchone()[0])

    def not_ready_since(self, version_id: str) -> float | None:
        """When the version's instance's pod turned not Ready (epoch seconds), once its stored
        condition shows it (the health machine's `notReady:<pod>` timer)."""
        query = (
            "select i.condition from instances i join deployments d on d.id = i.deployment_id "
            "where d.version_id = ?"
        )
        if isinstance(self.db, str):
            with psycopg.connect(self.db) as pg:
                rows = pg.execute(query.replace("?", "%s"), (version_id,)).fetchall()
        else:
            with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=30) as conn:
                rows = conn.execute(query, (version_id,)).fetchall()
        for (condition,) in rows:
            cond = json.loads(condition) if isinstance(condition, str) else condition
            for key, start_at in ((cond or {}).get("timers") or {}).items():
                if key.startswith("notReady:"):
                    return datetime.fromisoformat(start_at).timestamp()
        return None

    def submit(self, first: int, count: int, clients: int) -> list[float]:
        with ThreadPoolExecutor(clients) as pool:
            return list(pool.map(self.deploy, range(first, first + count)))

    def wait_active(self, total: int, limit: float = 3600) -> None:
        deadline = time.monotonic() + limit
        while self.active() < total:
            if time.monotonic() > deadline:
                raise SystemExit(f"only {self.active()} of {total} ACTIVE after {limit}s")
            time.sleep(0.2)


def fault_flip(
    fleet: Fleet, chart_url: str, fail_after: float, limit: float = 600
) -> tuple[float, float]:
    """Deploy a helm function whose pod turns not Ready `fail_after` seconds after it became
    Ready; (seconds from its turning not Ready until its instance's stored condition shows it,
    seconds from the deploy POST until then)."""
    c = fleet.client()
    resp = c.post(
        "/functions",
        json={
            "name": "fault-probe",
            "inferenceUrl": "/v2/models/m/infer",
            "inferencePort": 8000,
            "helmChart": chart_url,
            "helmChartServiceName": "entrypoint",
        },
    )
    resp.raise_for_status()
    fn = resp.json()["function"]
    fault = {"sim.nvcf.io/fault": "FailAfterReady", "sim.nvcf.io/fail-after": f"{fail_after}s"}
    spec = {**SPEC, "instanceType": "NCP.GPU.H100_1x", "configuration": {"podAnnotations": fault}}
    url = f"/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
    posted = time.time()
    c.post(url, json={"deploymentSpecifications": [spec]}).raise_for_status()
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        since = fleet.not_ready_since(fn["versionId"])
        if since is not None:
            seen = time.time()
            return seen - since, seen - posted
        time.sleep(0.01)
    raise SystemExit(f"the fault-probe's condition did not change within {limit}s")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def progress(line: str) -> None:
    """A phase's figures as soon as they are measured (a long run cut short keeps them)."""
    print(f"  ... {line}", file=sys.stderr, flush=True)


def idle_cpu(pids: list[int], seconds: float) -> float:
    """Share of one core the processes used over `seconds` with no request."""
    before, start_at = cpu_seconds(*pids), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(*pids) - before) / (time.monotonic() - start_at)


def settled_latencies(fleet: Fleet, first: int, samples: int) -> tuple[list[float], list[float]]:
    """Deploy POSTs and GETs one after another on a settled server; waits until the new
    deployments are ACTIVE again."""
    deploys = [fleet.deploy(first + i) for i in range(samples)]
    gets = [fleet.get() for _ in range(samples)]
    return deploys, gets


def export_tree(rev: str) -> Path:
    """`rev` of this repository exported into a temporary directory (removed by the caller)."""
    where = Path(tempfile.mkdtemp(prefix="nvcf-bench-fleet-tree-"))
    root = Path(__file__).resolve().parents[1]
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", rev], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=10_000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--idle", type=float, default=30.0, help="seconds of each idle window")
    ap.add_argument(
        "--settle", type=float, default=12.0, help="seconds from all ACTIVE to an idle window"
    )
    ap.add_argument("--samples", type=int, default=30, help="settled deploys/GETs measured")
    ap.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]))
    ap.add_argument("--baseline-tree", metavar="REV", help="first the same on git revision REV")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server")
    ap.add_argument("--postgres", action="store_true", help="a throw-away PostgreSQL server")
    ap.add_argument("--split", action="store_true", help="the reconciler in its own process")
    ap.add_argument(
        "--fail-after", type=float, default=15.0, help="seconds the fault-probe pod stays Ready"
    )
    args = ap.parse_args()
    if args.split and not args.postgres:
        raise SystemExit("--split needs --postgres (SQLite serves one process only)")
    pg = None
    if args.postgres:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.support.postgres import start_postgres

        pg = start_postgres()
    base = export_tree(args.baseline_tree) if args.baseline_tree else None
    charts = Path(tempfile.mkdtemp(prefix="nvcf-bench-fleet-charts-"))
    registry: RegistryServer | None = None
    try:
        registry = start_registry(charts / "registry")
        archive = build_chart("sim-workload", charts / "chart")
        chart = push_archive(registry, archive, "bench", workdir=charts / "push")
        args.chart = (registry.host, chart.file_url)
        before = run(args, pg, str(base), "fleet_before") if base is not None else None
        after = run(args, pg, args.tree, "fleet")
        if before is not None:
            print(f"after/before ({args.tree} against {args.baseline_tree}):")
            for name, value in after.items():
                print(
                    f"  {name}: {value:.3g} against {before[name]:.3g}: {value / before[name]:.2f}x"
                )
    finally:
        if registry is not None:
            registry.stop()
        shutil.rmtree(charts, ignore_errors=True)
        if pg is not None:
            pg.stop()
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)


def run(args: argparse.Namespace, pg: Any, tree: str, dbname: str) -> dict[str, float]:
    """One scenario on the server of `tree`; prints its figures and returns them."""
    if pg is not None:
        with psycopg.connect(pg.admin_dsn, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {dbname}")
    tmp = Path(tempfile.mkdtemp(prefix="nvcf-bench-fleet-"))
    total = args.count + 2 * args.samples
    catalog = simulated_catalog(
        {"scheduleSeconds": 0, "pullSeconds": 0, "readySeconds": 0}, nodes=total // 4 + 1
    )
    (tmp / "clusters.yaml").write_text(json.dumps(catalog))
    port = free_port()
    env = {
        "NVCF_DATA_DIR": str(tmp / "data"),
        "NVCF_BOOTSTRAP_API_KEY": KEY,
        "NVCF_RATE_LIMIT_PER_SECOND": "0",
        "NVCF_QUOTA_FUNCTIONS": str(total * 4),
        "NVCF_QUOTA_INSTANCES": str(total * 4),
        "NVCF_CLUSTERS_FILE": str(tmp / "clusters.yaml"),
        "NVCF_REGISTRY_ALLOWLIST": args.chart[0],
        "NVCF_INSECURE_REGISTRIES": args.chart[0],
        "PYTHONPATH": tree,
        **dict(e.split("=", 1) for e in args.env),
    }
    db: Path | str = tmp / "data" / "nvcf.db"
    if pg is not None:
        env["NVCF_DATABASE_URL"] = pg.url(dbname)
        env["NVCF_SECRETS_KEY"] = Fernet.generate_key().decode()
        db = pg.admin_dsn.replace("dbname=postgres", f"dbname={dbname}")
    cmd = [sys.executable, "-m", "service.cli", "serve", "--port"]
    reconciler = None
    if args.split:
        rport = free_port()
        reconciler = start([*cmd, str(rport)], {**env, "NVCF_DATA_DIR": str(tmp / "r")}, rport)
        env["NVCF_RECONCILER_ENABLED"] = "false"
    server = start([*cmd, str(port)], env, port, tree)
    pids = [server.pid] + ([reconciler.pid] if reconciler is not None else [])
    try:
        fleet = Fleet(port, db)
        small = args.count // 10
        where = "PostgreSQL" if pg is not None else "SQLite"
        split = ", the reconciler in its own process" if reconciler is not None else ""
        print(f"tree {tree}; {args.count:,} deployments, {args.clients} clients, {where}{split}")
        fleet.submit(0, small, args.clients)
        fleet.wait_active(small)
        time.sleep(args.settle)
        idle_small = idle_cpu(pids, args.idle)
        dep_small, get_small = settled_latencies(fleet, small, args.samples)
        progress(
            f"settled at {small:,}: idle CPU {idle_small * 100:.1f}%, deploy median "
            f"{statistics.median(dep_small) * 1000:.0f} ms"
        )
        fleet.wait_active(small + args.samples)

        # the other 9/10 by the clients while a prober, one request at a time, deploys and
        # reads as on the idle server
        stop = threading.Event()
        probe_gets: list[float] = []
        probe_deploys: list[float] = []
        first_probe = args.count + 2 * args.samples

        def prober() -> None:
            n = 0
            while not stop.is_set():
                probe_gets.append(fleet.get())
                probe_deploys.append(fleet.deploy(first_probe + n))
                n += 1
                time.sleep(0.05)

        thread = threading.Thread(target=prober)
        fleet.read_paths.clear()
        thread.start()
        start_at = time.monotonic()
        rest = args.count - small
        busy = fleet.submit(small + args.samples, rest, args.clients)
        submitted = time.monotonic() - start_at
        stop.set()
        thread.join()
        from_db = fleet.read_paths.count("database")
        fleet.wait_active(args.count + args.samples + len(probe_deploys))
        converged = time.monotonic() - start_at
        progress(
            f"{rest:,} submitted in {submitted:.1f}s, all ACTIVE after {converged:.1f}s; prober "
            f"deploy p99 {pct(probe_deploys, 0.99) * 1000:.0f} ms, GET p99 "
            f"{pct(probe_gets, 0.99) * 1000:.0f} ms"
        )
        total += len(probe_deploys)

        time.sleep(args.settle)
        idle_all = idle_cpu(pids, args.idle)
        dep_all, get_all = settled_latencies(fleet, total - args.samples, args.samples)
        fleet.wait_active(total)
        seen_after, deployed_for = fault_flip(fleet, args.chart[1], args.fail_after)
        progress(
            f"a fault in 1 instance of {total:,}: its condition changed {seen_after:.3f}s later"
        )

        def ms(v: float) -> str:
            return f"{v * 1000:.0f} ms"

        print(
            f"1. idle CPU: {idle_small * 100:.1f}% of a core with {small:,} settled deployments, "
            f"{idle_all * 100:.1f}% with {args.count:,}: ratio {idle_all / idle_small:.2f}x "
            "(target <= 1.5)"
        )
        med_s, med_a = statistics.median(dep_small), statistics.median(dep_all)
        print(
            f"2. deploy POST median on the settled server: {ms(med_s)} at {small:,}, "
            f"{ms(med_a)} at {args.count:,}: ratio {med_a / med_s:.2f}x (target <= 1.3); GET "
            f"median {ms(statistics.median(get_small))} and {ms(statistics.median(get_all))}"
        )
        idle_dep_p99, idle_get_p99 = pct(dep_small, 0.99), pct(get_small, 0.99)
        print(
            f"3. while {rest:,} converge ({args.clients} clients submitting): a prober's deploy "
            f"POST p50 {ms(pct(probe_deploys, 0.5))} p99 {ms(pct(probe_deploys, 0.99))} (idle "
            f"p50 {ms(pct(dep_small, 0.5))} p99 {ms(idle_dep_p99)}: p99 ratio "
            f"{pct(probe_deploys, 0.99) / idle_dep_p99:.1f}x); GET p50 "
            f"{ms(pct(probe_gets, 0.5))} p99 {ms(pct(probe_gets, 0.99))} (idle p50 "
            f"{ms(pct(get_small, 0.5))} p99 {ms(idle_get_p99)}: p99 ratio "
            f"{pct(probe_gets, 0.99) / idle_get_p99:.1f}x) (target p99 <= 5x idle; "
            f"{from_db} of {len(probe_gets)} GETs read the database); the clients' deploy POSTs "
            f"p50 {ms(pct(busy, 0.5))} p99 {ms(pct(busy, 0.99))}"
        )
        print(
            f"4. {rest:,} submitted in {submitted:.1f}s ({submitted / rest * 1000:.1f} "
            f"ms/deployment), all ACTIVE after {converged:.1f}s: ratio "
            f"{converged / submitted:.2f} (target <= 1.2)"
        )
        interval = float(
            dict(e.split("=", 1) for e in args.env).get("NVCF_RECONCILE_INTERVAL")
            or Settings.model_fields["reconcile_interval"].default
        )
        print(
            f"5. with {total:,} settled, one instance's pod turning not Ready (the simulated "
            f"fault FailAfterReady, {args.fail_after:g}s after Ready): its condition changed "
            f"{ms(seen_after)} later, {seen_after / interval:.2f} of the reconcile interval "
            f"({interval:g}s) (target <= 1); {deployed_for:.1f}s after its deploy POST"
        )
        return {
            "change seen after (s)": seen_after,
            "idle CPU ratio": idle_all / idle_small,
            "settled deploy median ratio": med_a / med_s,
            "converging deploy p99 (s)": pct(probe_deploys, 0.99),
            "converging deploy p99 / idle": pct(probe_deploys, 0.99) / idle_dep_p99,
            "converging GET p99 (s)": pct(probe_gets, 0.99),
            "converging GET p99 / idle": pct(probe_gets, 0.99) / idle_get_p99,
            "clients' deploy p99 (s)": pct(busy, 0.99),
            "ACTIVE / submitted": converged / submitted,
        }
    finally:
        for proc in (server, reconciler):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
