"""Metrics recording cost: a hand tally (cells of plain numbers, made into samples at scrape:
the service's core/tally.py until this measurement) against prometheus_client's own
`Counter`/`Histogram` with their label children cached, in the same run.

Printed, in CPU ns (this process's `time.process_time_ns`, medians of alternating rounds, the
rounds' spread in brackets) and as a ratio to the tally:

- one counter increment and one histogram observation;
- one request's recording: the HTTP families (`Metrics.record` of core/middleware.py: counter
  by method, route, status + latency histogram) and the invocation families
  (`InvocationMetrics.answered` of invocation/metrics.py: counter by function, version, outcome
  + duration histogram) — with the hand tally's cells (kept here, the baseline), with
  prometheus_client's children, and (`service`) through the classes of the tree under test;

and that request's recording as a share of one pexec request's CPU (`--request-us`, 350 µs by
default: what bench/invoke.py prints as the `local` server's CPU per request on this machine).

    .venv/bin/python bench/metrics_cost.py [--rounds 7] [--n 200000] [--request-us 350]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from bisect import bisect_left
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Histogram

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
FID, VID = "4a7f7e3a-0b56-4a34-8d5e-1f3f1c1a9e11", "0f6c3b8e-9d0b-4d3a-bb0e-6f0a2a3e7c55"
ROUTE = "/v2/nvcf/pexec/functions/{functionId}"


class CounterCell:
    """The hand tally's counter cell (core/tally.py before this measurement removed it)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0


class HistogramCell:
    """The hand tally's histogram cell: a count per bucket and their sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = (*bounds, float("inf"))
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


def tally_ops() -> dict[str, Callable[[], None]]:
    counter, histogram = CounterCell(), HistogramCell(BUCKETS)

    def inc() -> None:
        counter.value += 1

    def observe() -> None:
        histogram.observe(0.0004)

    return {"counter": inc, "histogram": observe}


def tally_request() -> Callable[[], None]:
    """One request's recording with the hand tally, cells cached by label values as it did."""
    http_cells: dict[tuple[str, str, int], tuple[CounterCell, HistogramCell]] = {}
    inv_cells: dict[tuple[str, bool], tuple[CounterCell, HistogramCell]] = {}

    def request() -> None:
        key = ("POST", ROUTE, 200)
        cells = http_cells.get(key)
        if cells is None:
            cells = http_cells[key] = (CounterCell(), HistogramCell(BUCKETS))
        cells[0].value += 1
        cells[1].observe(0.0004)
        ikey = (VID, True)
        icells = inv_cells.get(ikey)
        if icells is None:
            icells = inv_cells[ikey] = (CounterCell(), HistogramCell(BUCKETS))
        icells[0].value += 1
        icells[1].observe(0.0004)

    return request


def prometheus_ops() -> dict[str, Callable[[], None]]:
    registry = CollectorRegistry()
    counter = Counter("c_total", "C.", ["a", "b", "c"], registry=registry).labels("x", "y", "z")
    histogram = Histogram("h", "H.", ["a", "b"], registry=registry, buckets=BUCKETS)
    child = histogram.labels("x", "y")

    def inc() -> None:
        counter.inc()

    def observe() -> None:
        child.observe(0.0004)

    return {"counter": inc, "histogram": observe}


def service_request() -> Callable[[], None]:
    """One pexec request's recording by the service as it is in this tree."""
    from service.backends.worker import WorkerPort
    from service.core.middleware import Metrics
    from service.invocation.metrics import InvocationMetrics
    from service.invocation.routing import Target

    http = Metrics()
    invocation = InvocationMetrics(http.registry)
    target = Target(
        function_id=uuid.UUID(FID),
        version_id=uuid.UUID(VID),
        owner_account="acct",
        caller_account="acct",
        name="fn",
        status="ACTIVE",
        inference_path="/",
        port=WorkerPort("entrypoint", 8000),
        rate=None,
        instances=(),
        worker_service=None,
    )

    def request() -> None:
        http.record("POST", ROUTE, 200, 0.0004)
        invocation.answered(target, True, 0.0004)

    return request


def prometheus_request() -> Callable[[], None]:
    """The same recording with prometheus_client's classes, children cached by label values
    as the service caches its cells."""
    registry = CollectorRegistry()
    requests = Counter("r_total", "R.", ["method", "route", "status"], registry=registry)
    latency = Histogram("r_seconds", "L.", ["method", "route"], registry=registry, buckets=BUCKETS)
    inv = Counter("i_total", "I.", ["function_id", "version_id", "outcome"], registry=registry)
    inv_latency = Histogram(
        "i_seconds", "D.", ["function_id", "version_id"], registry=registry, buckets=BUCKETS
    )
    http_cells: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
    inv_cells: dict[tuple[str, bool], tuple[Counter, Histogram]] = {}

    def request() -> None:
        key = ("POST", ROUTE, 200)
        cells = http_cells.get(key)
        if cells is None:
            cells = http_cells[key] = (
                requests.labels("POST", ROUTE, "200"),
                latency.labels("POST", ROUTE),
            )
        cells[0].inc()
        cells[1].observe(0.0004)
        ikey = (VID, True)
        icells = inv_cells.get(ikey)
        if icells is None:
            icells = inv_cells[ikey] = (
                inv.labels(FID, VID, "fulfilled"),
                inv_latency.labels(FID, VID),
            )
        icells[0].inc()
        icells[1].observe(0.0004)

    return request


def per_call_ns(op: Callable[[], None], n: int) -> float:
    start = time.process_time_ns()
    for _ in range(n):
        op()
    spent = time.process_time_ns() - start
    start = time.process_time_ns()
    for _ in range(n):
        pass
    empty = time.process_time_ns() - start
    return (spent - empty) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--request-us", type=float, default=350.0)
    args = ap.parse_args()
    tally, prom = tally_ops(), prometheus_ops()
    cases: dict[str, dict[str, Callable[[], None]]] = {
        "request": {
            "tally": tally_request(),
            "prometheus": prometheus_request(),
            "service": service_request(),
        }
    }
    for what in ("counter", "histogram"):
        cases[what] = {"tally": tally[what], "prometheus": prom[what]}
    results: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for what, ops in cases.items():
            names = list(ops) if r % 2 == 0 else list(ops)[::-1]
            for name in names:
                results.setdefault((what, name), []).append(per_call_ns(ops[name], args.n))
    print(
        f"{args.rounds} alternating rounds of {args.n} calls; CPU ns per call, medians "
        "[spread of the rounds]"
    )
    for what, ops in cases.items():
        base = "tally"
        for name in ops:
            ns = results[(what, name)]
            ratios = [a / b for a, b in zip(ns, results[(what, base)], strict=True)]
            share = statistics.median(ns) / (args.request_us * 1000) * 100
            print(
                f"  {what:9} {name:10} {statistics.median(ns):8.0f} ns "
                f"[{min(ns):.0f}–{max(ns):.0f}]  /{base} {statistics.median(ratios):5.2f} "
                f"[{min(ratios):.2f}–{max(ratios):.2f}]"
                + (
                    f"  {share:.2f}% of a {args.request_us:g} µs request"
                    if what == "request"
                    else ""
                )
            )


if __name__ == "__main__":
    main()
