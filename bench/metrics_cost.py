"""Metrics recording cost: the hand tally (cells of plain numbers, made into samples at scrape)
against prometheus_client's own `Counter`/`Histogram` with their label children cached, in the
same run.

Printed, in CPU ns (this process's `time.process_time_ns`, medians of alternating rounds, the
rounds' spread in brackets) and as a ratio to the tally:

- one counter increment and one histogram observation;
- one request's recording as the service makes it: the HTTP families (`Metrics.record` of
  core/middleware.py: counter by method, route, status + latency histogram) and the invocation
  families (`InvocationMetrics.answered` of invocation/metrics.py: counter by function, version,
  outcome + duration histogram), through the classes in the tree under test;

and that request's recording as a share of one pexec request's CPU (`--request-us`, 350 µs by
default: what bench/invoke.py prints as the `local` server's CPU per request on this machine).

    .venv/bin/python bench/metrics_cost.py [--rounds 7] [--n 200000] [--request-us 350]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
FID, VID = "4a7f7e3a-0b56-4a34-8d5e-1f3f1c1a9e11", "0f6c3b8e-9d0b-4d3a-bb0e-6f0a2a3e7c55"
ROUTE = "/v2/nvcf/pexec/functions/{functionId}"


def tally_ops() -> dict[str, Callable[[], None]]:
    try:
        from service.core.tally import CounterTable, HistogramTable
    except ImportError:
        return {}
    registry = CollectorRegistry()
    counter = CounterTable("c_total", "C.", ["a", "b", "c"], registry).cell("x", "y", "z")
    histogram = HistogramTable("h", "H.", ["a", "b"], registry, buckets=BUCKETS).cell("x", "y")

    def inc() -> None:
        counter.value += 1

    def observe() -> None:
        histogram.observe(0.0004)

    return {"counter": inc, "histogram": observe}


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
    from service.core.middleware import Metrics
    from service.invocation.metrics import InvocationMetrics

    http = Metrics()
    invocation = InvocationMetrics(http.registry)
    target: Any = SimpleNamespace(fid=FID, vid=VID)  # all `answered` reads of a Target

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
        "request": {"service": service_request(), "prometheus": prometheus_request()}
    }
    for what in ("counter", "histogram"):
        cases[what] = {"prometheus": prom[what]}
        if what in tally:
            cases[what]["tally"] = tally[what]
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
        base = "tally" if "tally" in ops else "service"
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
