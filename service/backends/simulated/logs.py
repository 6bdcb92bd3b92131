"""The simulated worker's log: what its containers would have printed, at the clock's `now`.

Lifecycle lines are computed from each pod's timeline (simulated/timeline.py), so a fake clock
that jumps sees the lines of everything in between: start-up, readiness, the readiness probe
failing (`NeverReady`, `FailAfterReady`), and for `CrashLoopBackOff` a Python stack trace at the
end of every run, each run a container restart (`previous` reads the run before the current).
Lines of requests served (and what a request asks the worker to print, `X-Sim-Log`) are kept
per namespace, bounded, and belong to the current run of the first container of the worker pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from service.backends.logs import LogLine, LogRequest, bound
from service.backends.protocol import AdapterError
from service.backends.simulated.model import CRASH_BACKOFF_CAP, SimPod, as_list, as_map, secs
from service.backends.simulated.tasks import TaskScript
from service.backends.simulated.timeline import PodTimeline

#: request lines kept per namespace (the oldest are dropped first)
MAX_REQUEST_LINES = 5_000
#: probe failure lines generated per container run (the most recent)
MAX_PROBE_LINES = 200
PROBE_PERIOD = 10.0
#: how often a follow looks again when no request line woke it (lifecycle lines appear as time
#: passes)
FOLLOW_POLL = 0.25

#: (when, then the order within one instant) — every line's place in its container's log
Key = tuple[datetime, int, int]

_TRACE = (
    "Traceback (most recent call last):",
    '  File "/app/server.py", line 88, in <module>',
    "    engine = load_engine(config)",
    '  File "/app/engine.py", line 41, in load_engine',
    '    weights = torch.load(path, map_location="cuda")',
    '  File "/usr/lib/python3/dist-packages/torch/serialization.py", line 1014, in load',
    "    return _load(opened_zipfile, map_location, pickle_module, **pickle_load_args)",
    "RuntimeError: CUDA error: out of memory (tried to allocate 20.00 GiB; 79.15 GiB total "
    "capacity; 78.40 GiB already allocated)",
    "ERROR    worker exited with code 1",
)


def stamp(at: datetime) -> str:
    """RFC 3339 with nanoseconds, as the kubelet prefixes lines."""
    return at.strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


@dataclass
class _Run:
    """One run of one container: its lines with their keys."""

    lines: list[tuple[Key, str]] = field(default_factory=list)

    def add(self, at: datetime, text: str) -> None:
        self.lines.append(((at, 0, len(self.lines)), text))


def _main_name(pod: SimPod) -> str:
    containers = as_list(pod.spec.get("containers"))
    return str(as_map(containers[0]).get("name", "")) if containers else ""


def _names(pod: SimPod, key: str) -> list[str]:
    return [str(as_map(c).get("name", "")) for c in as_list(pod.spec.get(key))]


def _started(run: _Run, at: datetime, image: str, container: str) -> None:
    run.add(at, f"INFO     Starting {container} ({image})")
    run.add(at, "INFO     Loading model weights from /models")
    run.add(at, "INFO     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)")


def _probe_failures(run: _Run, start: datetime, now: datetime, message: str) -> None:
    elapsed = (now - start).total_seconds()
    count = int(elapsed // PROBE_PERIOD) if elapsed >= 0 else 0
    for k in range(max(1, count - MAX_PROBE_LINES + 1), count + 1):
        run.add(start + secs(k * PROBE_PERIOD), message)


def container_runs(pod: SimPod, timeline: PodTimeline, now: datetime) -> dict[str, list[_Run]]:
    """Every container of the pod that has started, with its runs (oldest first) up to now."""
    out: dict[str, list[_Run]] = {}
    if pod.scheduled_at is None or pod.fault in ("ImagePullBackOff", "Unschedulable"):
        return out
    for name in _names(pod, "initContainers"):
        if now >= pod.scheduled_at:
            run = _Run()
            run.add(pod.scheduled_at, f"INFO     init container {name}: preparing /models")
            if now >= timeline.init_done_at(pod):
                run.add(timeline.init_done_at(pod), f"INFO     init container {name}: done")
            out[name] = [run]
    started = timeline.started_at(pod)
    if now < started:
        return out
    containers = as_list(pod.spec.get("containers"))
    image = str(as_map(containers[0]).get("image", "")) if containers else ""
    main = _main_name(pod)
    for name in _names(pod, "containers")[1:]:
        side = _Run()
        side.add(started, f"INFO     sidecar {name} started")
        out[name] = [side]
    out[main] = _main_runs(pod, timeline, now, started, image, main)
    return out


def _main_runs(
    pod: SimPod, timeline: PodTimeline, now: datetime, started: datetime, image: str, main: str
) -> list[_Run]:
    if timeline.crashes(pod):
        runs: list[_Run] = []
        length = timeline.run_seconds()
        base = min(10.0, length)
        # every run's bounds (cheap), lines only for the last two (current and previous)
        bounds: list[tuple[datetime, datetime]] = []
        start, restarts = started, 0
        while start <= now:
            bounds.append((start, start + secs(length)))
            if pod.restart_policy == "Never":
                break
            start = start + secs(length) + secs(min(base * 2**restarts, CRASH_BACKOFF_CAP))
            restarts += 1
        for run_start, run_end in bounds[-2:]:
            run = _Run()
            _started(run, run_start, image, main)
            if now >= run_end:
                for text in _TRACE:
                    run.add(run_end, text)
            runs.append(run)
        return runs
    if pod.script is not None:
        return [_task_run(pod.script, pod.stop_at, now, started, image, main)]
    run = _Run()
    _started(run, started, image, main)
    if pod.in_job:
        done = started + secs(pod.ready_after)
        if now >= done:
            run.add(done, "INFO     job finished")
        return [run]
    if pod.fault == "NeverReady":
        _probe_failures(
            run, started, now, "WARNING  health check: model still loading (GET /health -> 503)"
        )
        return [run]
    ready_at = started + secs(pod.ready_after)
    if now >= ready_at:
        run.add(ready_at, "INFO     Model loaded: ready to serve (GET /health -> 200)")
    if pod.fault == "FailAfterReady":
        failed_at = ready_at + secs(pod.fail_after)
        if now >= failed_at:
            run.add(failed_at, "ERROR    CUDA error: an illegal memory access was encountered")
            run.add(failed_at, "ERROR    worker unhealthy: health checks answer 500 from now on")
            _probe_failures(
                run, failed_at, now, "WARNING  health check: worker unhealthy (GET /health -> 500)"
            )
    return [run]


def _task_run(
    script: TaskScript,
    stop_at: datetime | None,
    now: datetime,
    started: datetime,
    image: str,
    main: str,
) -> _Run:
    """A task container's lines: its script's steps, a stop request, its exit."""
    run = _Run()
    run.add(started, f"INFO     Starting task container {main} ({image})")
    for step in script.done(started, now):
        at = started + secs(step.at)
        if step.raw is not None:
            run.add(at, "INFO     wrote the progress file (raw text)")
            continue
        checkpoint = f", checkpoint {step.name}" if step.name is not None else ""
        files = f" ({len(step.files)} files)" if step.files else ""
        run.add(at, f"INFO     progress {step.percent}%{checkpoint}{files}")
    if stop_at is not None and now >= stop_at:
        run.add(stop_at, "INFO     SIGTERM received" + (": ignored" if script.ignore_stop else ""))
    end = script.ends(started, stop_at)
    if end is not None and now >= end[0]:
        when, code, reason = end
        if reason == "OOMKilled":
            run.add(when, "ERROR    Killed: out of memory")
        else:
            run.add(when, f"INFO     task container exited with code {code}")
    return run


@dataclass(frozen=True)
class Snapshot:
    """What reading a namespace's log needs, taken under the adapter's lock."""

    now: datetime
    pods: Sequence[SimPod]


Snapshotter = Callable[[str], Awaitable[Snapshot | None]]


class SimulatedLogBook:
    """The request lines of one simulated cluster's namespaces, and reading their logs."""

    def __init__(self) -> None:
        self._requests: dict[str, deque[tuple[Key, str]]] = {}
        self._seq = itertools.count()
        self._changed: dict[str, asyncio.Event] = {}

    def print(self, namespace: str, at: datetime, text: str) -> None:
        """The worker of `namespace` printed `text` (a request served, or asked to print)."""
        lines = self._requests.setdefault(namespace, deque(maxlen=MAX_REQUEST_LINES))
        for part in text.splitlines() or [""]:
            lines.append(((at, 1, next(self._seq)), bound(part)))
        event = self._changed.pop(namespace, None)
        if event is not None:
            event.set()

    def forget(self, namespace: str) -> None:
        self._requests.pop(namespace, None)
        event = self._changed.pop(namespace, None)
        if event is not None:
            event.set()

    def lines(
        self,
        namespace: str,
        snap: Snapshot,
        request: LogRequest,
        timeline: PodTimeline,
        after: Mapping[tuple[str, str], Key] | None = None,
    ) -> list[tuple[Key, LogLine]]:
        """Every line the request selects at `snap.now`, in order per container (before the
        tail, since and byte limits); with `after`, only a container's lines past its key (a
        follow's next lines: the request lines are read back only as far as they are new)."""
        out: list[tuple[Key, LogLine]] = []
        known = False
        worker = next((p for p in snap.pods if p.fault in (None, "FailAfterReady")), None)
        for pod in snap.pods:
            runs_of = container_runs(pod, timeline, snap.now)
            names = _names(pod, "initContainers") + _names(pod, "containers")
            for name in names:
                if request.container is not None and name != request.container:
                    continue
                known = True
                runs = runs_of.get(name, [])
                if request.previous:
                    if len(runs) < 2:
                        if request.container is not None and len(snap.pods) == 1:
                            raise AdapterError(
                                f'previous terminated container "{name}" in pod "{pod.name}" '
                                "not found",
                                retryable=False,
                                status=400,
                            )
                        continue
                    selected = list(runs[-2].lines)
                else:
                    last = after.get((pod.name, name)) if after is not None else None
                    selected = list(runs[-1].lines) if runs else []
                    if pod is worker and name == _main_name(pod) and runs:
                        first = runs[-1].lines[0][0] if runs[-1].lines else None
                        selected += [
                            (k, t)
                            for k, t in self._new_requests(namespace, last)
                            if first is None or k >= first
                        ]
                        selected.sort(key=lambda item: item[0])
                    if last is not None:
                        selected = [(k, t) for k, t in selected if k > last]
                for key, text in selected:
                    out.append((key, LogLine(pod.name, name, text, stamp(key[0]))))
        if request.container is not None and not known and snap.pods:
            raise AdapterError(
                f'container "{request.container}" is not valid for the pods of this instance',
                retryable=False,
                status=400,
            )
        return out

    def _new_requests(self, namespace: str, last: Key | None) -> list[tuple[Key, str]]:
        """The namespace's request lines past `last` (all of them without), oldest first;
        they are printed in order, so the newest are read back only until an old one."""
        lines = self._requests.get(namespace, ())
        if last is None:
            return list(lines)
        fresh: list[tuple[Key, str]] = []
        for key, text in reversed(lines):
            if key <= last:
                break
            fresh.append((key, text))
        fresh.reverse()
        return fresh

    async def read(
        self,
        namespace: str,
        request: LogRequest,
        timeline: PodTimeline,
        snapshot: Snapshotter,
    ) -> AsyncIterator[LogLine]:
        snap = await snapshot(namespace)
        if snap is None:
            return
        every = self.lines(namespace, snap, request, timeline)
        # a follow goes on after the last line that existed, whatever the bounds showed of it
        cursor: dict[tuple[str, str], Key] = {}
        for key, line in every:
            where = (line.pod, line.container)
            cursor[where] = max(key, cursor.get(where, key))
        for _, line in _bounded(every, request, snap.now):
            yield _shown(line, request)
        if not request.follow or request.previous:
            return
        while True:
            event = self._changed.setdefault(namespace, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FOLLOW_POLL):
                    await event.wait()
            snap = await snapshot(namespace)
            if snap is None:
                return  # the instance ended: so does the follow
            for key, line in self.lines(namespace, snap, request, timeline, after=cursor):
                where = (line.pod, line.container)
                last = cursor.get(where)
                if last is not None and key <= last:
                    continue
                cursor[where] = key
                yield _shown(line, request)


def _bounded(
    lines: list[tuple[Key, LogLine]], request: LogRequest, now: datetime
) -> Iterator[tuple[Key, LogLine]]:
    """Per container: those of the last `since_seconds`, the last `tail_lines`, within
    `limit_bytes` (the first lines of the selection, as the kubelet cuts)."""
    groups: dict[tuple[str, str], list[tuple[Key, LogLine]]] = {}
    for item in lines:
        groups.setdefault((item[1].pod, item[1].container), []).append(item)
    for group in groups.values():
        if request.since_seconds is not None:
            edge = now - secs(request.since_seconds)
            group = [item for item in group if item[0][0] >= edge]
        if request.tail_lines is not None:
            group = group[-request.tail_lines :] if request.tail_lines else []
        used = 0
        for item in group:
            used += len(item[1].text.encode()) + 1
            if request.limit_bytes is not None and used > request.limit_bytes:
                break
            yield item


def _shown(line: LogLine, request: LogRequest) -> LogLine:
    if request.timestamps:
        return line
    return LogLine(line.pod, line.container, line.text)


__all__ = ["SimulatedLogBook", "Snapshot", "container_runs", "stamp"]
