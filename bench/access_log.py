"""Access-line cost: the log handler and formatter of core/logs.py against plain `logging`, in
the same run.

Writes the access line of core/middleware.py (`access_line`, text format, as every request
does) from inside a running event loop (uvloop, as the servers run), `--per-iteration` lines per
loop iteration (requests finishing together), to a pipe drained by another process (stderr under
systemd or a container runtime). Compared, in this process's CPU ns per line (medians of
alternating rounds, the same loop iterations without the line subtracted, their spread in
brackets, and the ratio to the first line):

- `batched`: `LoopBatchedHandler` (the lines of an iteration in one write at its end: the
  service's handler until this measurement, kept here) with `_TextLine` (its date and time
  formatted once a second);
- `stream`: `logging.StreamHandler` (one write and flush per line), same formatter — the
  service as it is;
- `stream, plain time`: `logging.StreamHandler` and the formatter without its time cache.

    .venv/bin/python bench/access_log.py [--rounds 7] [--lines 100000] [--per-iteration 1,4,16]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import logging
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from service.core import logs
from service.core.middleware import access_line


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class LoopBatchedHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler writing the lines of one event-loop iteration in one write, at its
    end: core/logs.py's until this measurement removed it, kept here as the comparison."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._pending: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        loop = _running_loop()
        if loop is None:
            if self._pending:  # lines of a loop that stopped before writing them: first
                self._write_pending_unlocked()
            super().emit(record)
            return
        try:
            line = self.format(record) + self.terminator
        except Exception:
            self.handleError(record)
            return
        if not self._queue(line, loop):
            super().emit(record)

    def _queue(self, line: str, loop: asyncio.AbstractEventLoop | None = None) -> bool:
        """`line` pending for the end of the loop iteration: False when there is no running
        loop (`loop`, when the caller has looked it up) to write it."""
        pending = self._pending
        if not pending:
            loop = loop or _running_loop()
            if loop is None:
                return False
            try:
                loop.call_soon(self._write_pending)
            except RuntimeError:  # the loop is closing: no later iteration
                return False
        pending.append(line)
        return True

    def _write_pending(self) -> None:
        self.acquire()
        try:
            if self._pending:
                self._write_pending_unlocked()
                self.flush()
        except Exception:
            self.handleError(logging.makeLogRecord({"msg": "writing log lines failed"}))
        finally:
            self.release()

    def flush(self) -> None:
        if self._pending and _running_loop() is None:
            self._write_pending_unlocked()
        super().flush()

    def _write_pending_unlocked(self) -> None:
        pending, self._pending = self._pending, []
        self.stream.write("".join(pending))

    def close(self) -> None:
        self.acquire()
        try:
            if self._pending:
                self._write_pending_unlocked()
        finally:
            self.release()
        super().close()


class _PlainTime(logs._TextLine):
    """The service's text line with `logging.Formatter`'s own date and time, each line."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return logging.Formatter.formatTime(self, record, datefmt)


def handlers(stream: io.TextIOBase) -> dict[str, Callable[[], logging.Handler]]:
    def batched() -> logging.Handler:
        h = LoopBatchedHandler(stream)  # type: ignore[arg-type]
        h.setFormatter(logs._TextLine())
        return h

    def plain() -> logging.Handler:
        h = logging.StreamHandler(stream)
        h.setFormatter(logs._TextLine())
        return h

    def plain_time() -> logging.Handler:
        h = logging.StreamHandler(stream)
        h.setFormatter(_PlainTime())
        return h

    return {"batched": batched, "stream": plain, "stream, plain time": plain_time}


async def write_lines(lines: int, per_iteration: int) -> None:
    path = "/v2/nvcf/pexec/functions/4a7f7e3a-0b56-4a34-8d5e-1f3f1c1a9e11"
    rid = "0b7c5a43-7c3b-4b39-9f64-3a0d3c4c6f2e"
    for _ in range(lines // per_iteration):
        for _ in range(per_iteration):
            access_line("POST", path, 200, 0.00042, rid, "acct-bench", json_logs=False)
        await asyncio.sleep(0)  # the end of the loop iteration


def one_round(make: Callable[[], logging.Handler] | None, lines: int, per_iteration: int) -> float:
    """CPU ns per line through the handler `make` makes; None: the same loop iterations with
    the access log off (subtracted from the others)."""
    root = logging.getLogger()
    if make is None:
        root.setLevel(logging.WARNING)
        try:
            return one_round(logging.NullHandler, lines, per_iteration)
        finally:
            root.setLevel(logging.INFO)
    handler = make()
    handler.addFilter(logs.RequestIdFilter())
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    try:
        import uvloop

        runner: Callable[..., object] = uvloop.run
    except ImportError:
        runner = asyncio.run
    start = time.process_time_ns()
    runner(write_lines(lines, per_iteration))
    handler.flush()
    spent = time.process_time_ns() - start
    root.removeHandler(handler)
    return spent / lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--per-iteration", default="1,4,16")
    args = ap.parse_args()
    drain = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    assert drain.stdin is not None
    stream = io.TextIOWrapper(drain.stdin, encoding="utf-8", line_buffering=True)
    logs.configure_logging("text", stream=stream)  # the service's logging switches
    makers = handlers(stream)
    names = list(makers)
    try:
        print(
            f"{args.rounds} alternating rounds of {args.lines} access lines into a pipe; "
            "CPU ns per line, medians [spread]"
        )
        for k in (int(x) for x in args.per_iteration.split(",")):
            results: dict[str, list[float]] = {n: [] for n in names}
            for r in range(args.rounds):
                empty = one_round(None, args.lines, k)  # the loop's own iterations
                for name in names if r % 2 == 0 else names[::-1]:
                    results[name].append(one_round(makers[name], args.lines, k) - empty)
            base = results[names[0]]
            for name in names:
                ns = results[name]
                ratios = [a / b for a, b in zip(ns, base, strict=True)]
                print(
                    f"  {k:2} per iteration  {name:20} {statistics.median(ns):7.0f} ns "
                    f"[{min(ns):.0f}–{max(ns):.0f}]  /batched {statistics.median(ratios):5.2f} "
                    f"[{min(ratios):.2f}–{max(ratios):.2f}]"
                )
    finally:
        stream.close()
        drain.wait()


if __name__ == "__main__":
    main()
