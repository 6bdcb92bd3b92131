"""The engine's routing step with a traffic split against without, in the same run.

Drives `RouteTable.resolve` (the admit step's version resolution: a cached target, or a
cached split and its weighted pick, `Split.pick`) with a fresh request id per call, as the
engine does for a request naming no version, over a warm cache: the database is not read.
Printed in CPU ns per request (`time.process_time_ns`, medians of alternating rounds, the
rounds' spread in brackets), the split's extra cost, and that extra as a share of one pexec
request's CPU (`--request-us`, 350 µs by default: bench/invoke.py's `local` figure on this
machine); the issue's bound is 1.05× the request's CPU.

    .venv/bin/python -m bench.canary [--rounds 7] [--n 200000] [--request-us 350]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import statistics
import time
import uuid
from typing import Any

from service.auth.service import Principal
from service.backends.worker import WorkerPort
from service.invocation.routing import Routed, RouteTable, Split, Target

FUNCTION = uuid.UUID(int=100)
STABLE = Target(
    function_id=FUNCTION,
    version_id=uuid.UUID(int=200),
    owner_account="acct",
    caller_account="acct",
    name="fn",
    status="ACTIVE",
    inference_path="/echo",
    port=WorkerPort("entrypoint", 8000),
    rate=None,
    instances=(),
    worker_service=None,
)
CANARY = dataclasses.replace(STABLE, version_id=uuid.UUID(int=201))
PRINCIPAL = Principal("acct", frozenset({"invoke_function"}), "api-key", "bench")


class Fixed(RouteTable):
    """A route table whose one read answers `routed` (the cache keeps it: no database)."""

    def __init__(self, routed: Routed) -> None:
        super().__init__(contextlib.nullcontext, None, ttl=3600)  # type: ignore[arg-type]
        self.routed = routed

    async def _load(self, *_: Any) -> Routed:
        return self.routed


async def per_request(table: RouteTable, n: int) -> float:
    ids = [uuid.uuid4() for _ in range(n)]
    await table.resolve(PRINCIPAL, FUNCTION, None, "warm")
    start = time.process_time_ns()
    for request_id in ids:
        await table.resolve(PRINCIPAL, FUNCTION, None, str(request_id))
    return (time.process_time_ns() - start) / n


async def main(rounds: int, n: int, request_us: float) -> None:
    tables = {
        "without": Fixed(STABLE),
        "split": Fixed(Split.of([CANARY, STABLE], [10, 90])),
    }
    runs: dict[str, list[float]] = {name: [] for name in tables}
    for _ in range(rounds):
        for name, table in tables.items():
            runs[name].append(await per_request(table, n))
    medians = {name: statistics.median(r) for name, r in runs.items()}
    for name, r in runs.items():
        print(f"{name:8} {medians[name]:8.0f} ns/request  [{min(r):.0f}–{max(r):.0f}]")
    extra = medians["split"] - medians["without"]
    share = extra / (request_us * 1000)
    print(
        f"the split adds {extra:.0f} ns per request: {1 + share:.4f}× a {request_us:g} µs request"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--request-us", type=float, default=350.0)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.n, args.request_us))
