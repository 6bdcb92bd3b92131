"""The simulated cluster's task runner: a task container plays the script its environment
names (`SIM_TASK_SCRIPT`, JSON), so every status of a task is reachable without a GPU.

    {"steps": [{"after": 1, "percent": 10, "name": "ckpt-1", "files": {"w.bin": "..."},
                "metadata": {"loss": 0.3}}, {"after": 1, "percent": 100}],
     "exitAfter": 1, "exitCode": 0, "oom": false, "heartbeat": true,
     "onStop": "exit", "stopSeconds": 0}

`after` is seconds since the previous step (the first: since the container started); a step
may write `raw` text instead of a progress object (a malformed file). `exitAfter` is seconds
after the last step until the container exits (null: it hangs until killed) with `exitCode`,
or is OOM-killed (`oom`, exit 137). `lastUpdatedAt` is refreshed every minute;
`heartbeat: false` stops refreshing it after the last step (a missed heartbeat). Asked to
stop (its Job suspended), it exits with 143 `stopSeconds` later, or ignores it
(`onStop: "ignore"`) until it is killed.

Without a script a task reports 100 once the cluster's `readySeconds` have passed, and exits.
Everything is a function of the container's start, its stop request and `now`: the progress
file and the results are rendered from the script when read (`TaskFiles`), and a result's files
are written to disk only when the platform fetches it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from service.health.observed import format_time as ts

SCRIPT_ENV = "SIM_TASK_SCRIPT"
#: the script's size in bytes at most
MAX_SCRIPT = 256 * 1024
STOP_EXIT_CODE = 143
#: how often a running script refreshes `lastUpdatedAt` (NVCT asks for at most 3 minutes)
HEARTBEAT_SECONDS = 60.0
OOM_EXIT_CODE = 137


class ScriptError(ValueError):
    """Not a task script."""


@dataclass(frozen=True)
class Step:
    at: float  # seconds since the container started
    percent: int | None
    name: str | None
    metadata: dict[str, Any]
    files: dict[str, str]
    raw: str | None


@dataclass(frozen=True)
class TaskScript:
    steps: tuple[Step, ...]
    exit_after: float | None
    exit_code: int = 0
    oom: bool = False
    heartbeat: bool = True
    ignore_stop: bool = False
    stop_seconds: float = 0.0

    @classmethod
    def default(cls, seconds: float) -> TaskScript:
        return cls((Step(seconds, 100, None, {}, {}, None),), 0.0)

    @classmethod
    def parse(cls, text: str) -> TaskScript:
        if len(text) > MAX_SCRIPT:
            raise ScriptError(f"{SCRIPT_ENV} is longer than {MAX_SCRIPT} bytes")
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ScriptError(f"{SCRIPT_ENV} is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ScriptError(f"{SCRIPT_ENV} must be a JSON object")
        steps: list[Step] = []
        at = 0.0
        for i, raw in enumerate(as_list(data.get("steps"))):
            step = as_map(raw)
            at += _seconds(step.get("after", 1), f"steps[{i}].after")
            percent = step.get("percent")
            if percent is not None and (isinstance(percent, bool) or not isinstance(percent, int)):
                raise ScriptError(f"steps[{i}].percent must be a whole number")
            files = as_map(step.get("files"))
            for path in files:
                if not _safe(str(path)):
                    raise ScriptError(f"steps[{i}].files: {path!r} is not a relative path")
            name = step.get("name")
            raw_text = step.get("raw")
            steps.append(
                Step(
                    at,
                    percent,
                    str(name) if name is not None else None,
                    as_map(step.get("metadata")),
                    {str(k): str(v) for k, v in files.items()},
                    str(raw_text) if raw_text is not None else None,
                )
            )
        exit_after = data.get("exitAfter", 0)
        return cls(
            tuple(steps),
            None if exit_after is None else _seconds(exit_after, "exitAfter"),
            exit_code=int(data.get("exitCode", 0) or 0),
            oom=bool(data.get("oom", False)),
            heartbeat=bool(data.get("heartbeat", True)),
            ignore_stop=data.get("onStop", "exit") == "ignore",
            stop_seconds=_seconds(data.get("stopSeconds", 0), "stopSeconds"),
        )

    def ends(self, started: datetime, stop_at: datetime | None) -> tuple[datetime, int, str] | None:
        """When the container exits, its exit code and reason (None: it runs until killed)."""
        natural: tuple[datetime, int, str] | None = None
        if self.exit_after is not None:
            last = self.steps[-1].at if self.steps else 0.0
            when = started + secs(last + self.exit_after)
            if self.oom:
                natural = (when, OOM_EXIT_CODE, "OOMKilled")
            else:
                natural = (when, self.exit_code, "Completed" if self.exit_code == 0 else "Error")
        if stop_at is not None and not self.ignore_stop:
            stopped = (max(stop_at, started) + secs(self.stop_seconds), STOP_EXIT_CODE, "Error")
            if natural is None or stopped[0] < natural[0]:
                return stopped
        return natural

    def times(self, started: datetime, stop_at: datetime | None) -> list[datetime]:
        """Every moment the container's state changes."""
        out = [started + secs(s.at) for s in self.steps]
        end = self.ends(started, stop_at)
        if end is not None:
            out.append(end[0])
        return out

    def done(self, started: datetime, now: datetime) -> list[Step]:
        return [s for s in self.steps if started + secs(s.at) <= now]


def secs(value: float) -> timedelta:
    return timedelta(seconds=value)


def as_map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1e7:
        raise ScriptError(f"{where} must be a number of seconds from 0 to 10000000")
    return float(value)


def _safe(path: str) -> bool:
    parts = Path(path).parts
    return bool(parts) and not Path(path).is_absolute() and ".." not in parts


def script_of(container_env: list[Any], default_seconds: float) -> TaskScript:
    """The script a task container's environment names, or the default one."""
    for entry in container_env:
        item = as_map(entry)
        if item.get("name") == SCRIPT_ENV:
            return TaskScript.parse(str(item.get("value", "")))
    return TaskScript.default(default_seconds)


def progress_at(
    task_id: str, script: TaskScript, started: datetime, now: datetime, stop_at: datetime | None
) -> bytes | None:
    """The progress file at `now` as the container would have written it (None: not yet)."""
    done = script.done(started, now)
    if not done:
        return None
    last = done[-1]
    if last.raw is not None:
        return last.raw.encode()
    end = script.ends(started, stop_at)
    heartbeat = started + secs(last.at)
    if script.heartbeat:  # refreshed every HEARTBEAT_SECONDS, as a container would
        beats = (now - started).total_seconds() // HEARTBEAT_SECONDS
        heartbeat = max(heartbeat, started + secs(beats * HEARTBEAT_SECONDS))
    if end is not None and end[0] < heartbeat:
        heartbeat = end[0]
    body: dict[str, Any] = {
        "taskId": task_id,
        "percentComplete": last.percent,
        "metadata": last.metadata,
        "lastUpdatedAt": ts(heartbeat),
    }
    if last.name is not None:
        body["name"] = last.name
    return json.dumps(body).encode()


def results_at(script: TaskScript, started: datetime, now: datetime) -> dict[str, dict[str, str]]:
    """Each result directory under `NVCT_RESULTS_DIR` at `now` (oldest first) with its files:
    a step's files go under its `name`; a file once written is not written again."""
    out: dict[str, dict[str, str]] = {}
    for step in script.done(started, now):
        if step.name is not None and step.files:
            files = out.setdefault(step.name, {})
            for rel, content in step.files.items():
                files.setdefault(rel, content)
    return out


def result_problem(
    name: str, files: dict[str, str] | None, max_bytes: int, max_files: int
) -> str | None:
    """Why result `name` (its files, None: no directory) cannot be fetched, if it cannot."""
    if not _safe(name) or "/" in name:
        return f"result name {name!r} is not a directory name"
    if files is None:
        return f"result {name!r} has no directory under NVCT_RESULTS_DIR"
    if len(files) > max_files:
        return f"result {name!r} has more than {max_files} files"
    if sum(len(content.encode()) for content in files.values()) > max_bytes:
        return f"result {name!r} is larger than {max_bytes} bytes"
    return None


def write_result(files: dict[str, str], into: Path) -> None:
    """A result's files, written under `into` (the platform's copy of the directory)."""
    for rel, content in sorted(files.items()):
        target = into / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
