"""Task benchmark (issue 41), driven through NVCT's API on one server process (SQLite).

    .venv/bin/python bench/tasks.py [--count 1000] [--slots 50] [--idle 20] [--clients 4]

Starts `nvcf-server` (the default settings but for quotas and the rate limit) on a catalog of
two simulated clusters: `bench-run` with room for `--slots` one-GPU tasks at once, whose task
containers report 100 and exit `--run-seconds` after they start, and `bench-full` with one GPU
that a task holding it for an hour fills. With `--fill` (the default) the `--count` tasks are
all queued behind `--slots` tasks that hold every slot until they are canceled, which starts
the run: every slot freed then has a task waiting for it. It prints, in the same run:

1. `--count` tasks created on `bench-run` (by `--clients` clients) all COMPLETED, and the
   platform's own time per task: for each task launched once a slot had been freed, from the
   moment the k-th earlier container exited (or the task was created, when later: the clients
   may create tasks more slowly than the slots free) to the moment the (slots+k)-th task was
   LAUNCHED (its event), p50 and p99 (target p50 ≤ 50 ms); and the average the wall time implies
   (wall × slots / count − the task's own run time). The simulated container starts when its
   Job is applied (no scheduling or pull time) and exits `--run-seconds` later; its exit is
   taken as its LAUNCHED event's time (read from the clock just after the apply) +
   `--run-seconds`: later than the real exit by at most the apply's own duration, so the
   figure errs short by no more than that (before, LAUNCHED carried the pass's start and the
   figure erred long by the pass's time up to the apply);
2. the idle server's CPU (every thread: /proc/<pid>/stat) over `--idle` seconds with the one
   task holding `bench-full`, then with `--count` more tasks queued for it against no room,
   and their ratio (target ≤ 1.5×).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.api import free_port, start
from bench.fleet import idle_cpu, pct, progress

KEY = "nvapi-bench-" + "k" * 40
#: a task that runs until it is canceled, and then exits at once
FILLER = {"steps": [{"after": 0, "percent": 1}], "exitAfter": None, "stopSeconds": 0}
TERMINAL = {
    "COMPLETED",
    "CANCELED",
    "ERRORED",
    "EXCEEDED_MAX_RUNTIME_DURATION",
    "EXCEEDED_MAX_QUEUED_DURATION",
}


def catalog(slots: int, run_seconds: float) -> dict[str, Any]:
    def cluster(name: str, gpus: int, ready: float) -> dict[str, Any]:
        return {
            "name": name,
            "adapter": "simulated",
            "provider": "NCP",
            "region": "local",
            "nodes": [
                {"gpu": "H100" if name == "bench-run" else "L40S", "gpusPerNode": 1, "count": gpus}
            ],
            "simulation": {"scheduleSeconds": 0, "pullSeconds": 0, "readySeconds": ready},
        }

    return {
        "clusterGroups": [
            {
                "name": "bench",
                "clusters": [
                    cluster("bench-run", slots, run_seconds),
                    cluster("bench-full", 1, 3600.0),
                ],
            }
        ]
    }


class Tasks:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}/v1/nvct"

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.base, headers={"Authorization": f"Bearer {KEY}"}, timeout=120
        )

    def create(self, name: str, gpu: str, script: dict[str, Any] | None = None) -> str:
        body: dict[str, Any] = {
            "name": name,
            "gpuSpecification": {"gpu": gpu, "instanceType": f"NCP.GPU.{gpu}_1x"},
            "containerImage": "nvcr.io/acme/bench:1",
            "resultHandlingStrategy": "NONE",
        }
        if script is not None:  # the simulated task runner's (backends/simulated/tasks.py)
            body["containerEnvironment"] = [{"key": "SIM_TASK_SCRIPT", "value": json.dumps(script)}]
        with self.client() as c:
            resp = c.post("/tasks", json=body)
            resp.raise_for_status()
            return str(resp.json()["task"]["id"])

    def submit(
        self, prefix: str, count: int, gpu: str, clients: int, script: dict[str, Any] | None = None
    ) -> list[str]:
        with ThreadPoolExecutor(clients) as pool:
            return list(pool.map(lambda i: self.create(f"{prefix}-{i}", gpu, script), range(count)))

    def cancel(self, ids: list[str], clients: int) -> None:
        def one(task_id: str) -> None:
            with self.client() as c:
                c.post(f"/tasks/{task_id}/cancel").raise_for_status()

        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(one, ids))

    def statuses(self) -> dict[str, str]:
        out: dict[str, str] = {}
        cursor: str | None = None
        with self.client() as c:
            while True:
                params: dict[str, str | int] = {"limit": 500}
                if cursor:
                    params["cursor"] = cursor
                body = c.get("/tasks", params=params).json()
                out.update({t["id"]: t["status"] for t in body["tasks"]})
                cursor = body.get("cursor")
                if not cursor:
                    return out

    def events(self, task_id: str) -> list[dict[str, Any]]:
        with self.client() as c:
            return list(c.get(f"/tasks/{task_id}/events", params={"limit": 100}).json()["events"])

    def any_in(self, statuses: tuple[str, ...]) -> bool:
        """Whether any task of the account is in one of `statuses` (a page of one each)."""
        with self.client() as c:
            for status in statuses:
                if c.get("/tasks", params={"limit": 1, "status": status}).json()["tasks"]:
                    return True
        return False

    def wait_ended(self, ids: list[str], limit: float = 3600) -> dict[str, str]:
        """Every task's status once none is queued, launched or running. Polled with pages of
        one task: listing a thousand tasks twice a second took a good part of the server's
        time, which is the bench's and not the platform's."""
        deadline = time.monotonic() + limit
        while self.any_in(("QUEUED", "LAUNCHED", "RUNNING")):
            if time.monotonic() > deadline:
                statuses = self.statuses()
                ended = sum(1 for i in ids if statuses.get(i) in TERMINAL)
                raise SystemExit(f"only {ended} of {len(ids)} tasks ended after {limit}s")
            time.sleep(0.5)
        return self.statuses()


def moment(events: list[dict[str, Any]], word: str) -> float | None:
    """When the first event naming `word` (LAUNCHED, COMPLETED) was written."""
    for event in events:
        if word in event["message"].upper():
            return datetime.fromisoformat(event["createdAt"]).timestamp()
    return None


def slot_latencies(
    tasks: Tasks, ids: list[str], slots: int, clients: int, run_seconds: float
) -> tuple[list[float], int]:
    """For every k, the (slots+k)-th launch minus the later of the k-th container exit (its
    LAUNCHED event + `run_seconds`, see the module docstring) and that task's creation: the
    platform's time from a container's exit, which freed its slot, to the next task launched
    on it, or from the task's creation when the slot was free before it was created (the
    clients create tasks while the first ones run, more slowly than 50 slots free). Also how
    many launches waited for their task's creation rather than for a slot."""
    with ThreadPoolExecutor(clients) as pool:
        timelines = list(pool.map(tasks.events, ids))
    times = sorted(
        (launch, created)
        for launch, created in ((moment(e, "LAUNCHED"), moment(e, "CREATED")) for e in timelines)
        if launch is not None and created is not None
    )
    exited = [launch + run_seconds for launch, _ in times]
    out: list[float] = []
    late = 0
    for k, (launch, created) in enumerate(times[slots:]):
        late += created > exited[k]
        out.append(max(0.0, launch - max(exited[k], created)))
    return out, late


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--slots", type=int, default=50)
    parser.add_argument("--run-seconds", type=float, default=0.5)
    parser.add_argument("--idle", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument(
        "--fill",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="queue the tasks behind tasks holding every slot, canceled at the start "
        "(--no-fill: create them while the first ones run)",
    )
    parser.add_argument("--env", action="append", default=[], help="VAR=VALUE for the server")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="nvcf-bench-tasks-"))
    (tmp / "clusters.yaml").write_text(json.dumps(catalog(args.slots, args.run_seconds)))
    port = free_port()
    env = {
        "NVCF_DATA_DIR": str(tmp / "data"),
        "NVCF_BOOTSTRAP_API_KEY": KEY,
        "NVCF_RATE_LIMIT_PER_SECOND": "0",
        "NVCF_QUOTA_TASKS": str(args.count * 3),
        "NVCF_QUOTA_ACTIVE_TASKS": str(args.count * 3),
        "NVCF_CLUSTERS_FILE": str(tmp / "clusters.yaml"),
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        **dict(e.split("=", 1) for e in args.env),
    }
    cmd = [sys.executable, "-m", "service.cli", "serve", "--port", str(port)]
    server = start(cmd, env, port)
    try:
        tasks = Tasks(port)
        print(f"{args.count:,} tasks, {args.slots} slots, each running {args.run_seconds:g}s")
        fillers: list[str] = []
        if args.fill:
            # the slots are taken by tasks that run until canceled, the tasks are queued behind
            # them, then the fillers are canceled: every slot freed has a task waiting for it
            fillers = tasks.submit("fill", args.slots, "H100", args.clients, FILLER)
            while set(tasks.statuses().values()) != {"RUNNING"}:
                time.sleep(0.2)
            ids = tasks.submit("run", args.count, "H100", args.clients)
            began = time.monotonic()
            tasks.cancel(fillers, args.clients)
        else:
            began = time.monotonic()
            ids = tasks.submit("run", args.count, "H100", args.clients)
        statuses = tasks.wait_ended(ids)
        took = time.monotonic() - began
        completed = sum(1 for i in ids if statuses[i] == "COMPLETED")
        progress(f"{completed:,} of {args.count:,} COMPLETED in {took:.1f}s")
        latencies, late = slot_latencies(tasks, ids, args.slots, args.clients, args.run_seconds)
        p50, p99 = pct(latencies, 0.5) * 1000, pct(latencies, 0.99) * 1000
        ideal = args.count / args.slots * args.run_seconds

        holder = tasks.create("holder", "L40S")
        while tasks.statuses().get(holder) != "RUNNING":
            time.sleep(0.2)
        time.sleep(2)
        idle_one = idle_cpu([server.pid], args.idle)
        progress(f"idle CPU with one task running: {idle_one * 100:.2f}%")
        queued = tasks.submit("queued", args.count, "L40S", args.clients)
        still = tasks.statuses()
        waiting = sum(1 for i in queued if still.get(i) == "QUEUED")
        time.sleep(2)
        idle_queued = idle_cpu([server.pid], args.idle)

        print(f"all COMPLETED: {completed == args.count} ({completed:,} of {args.count:,})")
        turnover = took * args.slots / args.count - args.run_seconds
        print(
            f"  wall time {took:.1f}s (the tasks' own running time alone: {ideal:.1f}s): "
            f"{turnover * 1000:.0f} ms of platform time per task and slot on average"
        )
        print(
            f"  a container exited -> the next task LAUNCHED: p50 {p50:.1f} ms, "
            f"p99 {p99:.1f} ms over {len(latencies):,} launches (target p50 <= 50 ms: "
            f"{'met' if p50 <= 50 else 'NOT met'}); {late:,} of them timed from their task's "
            "creation, after the slot was freed"
        )
        ratio = idle_queued / idle_one if idle_one > 0 else float("inf")
        print(
            f"idle CPU: {idle_one * 100:.2f}% with one task running, {idle_queued * 100:.2f}% "
            f"with {waiting:,} more queued against no room: {ratio:.2f}x (target <= 1.5x: "
            f"{'met' if ratio <= 1.5 else 'NOT met'})"
        )
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
