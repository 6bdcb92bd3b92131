"""`nvcf task create|list|get|cancel|delete|events|results|logs`: cloud tasks at NVCT's routes
(`/v1/nvct/...`, docs/tasks.md); `--wait` follows a task to its end as `deploy --wait` follows
a deployment: its status, percent and checkpoints as they change, exit 3 when it ends other
than COMPLETED, 4 past `--timeout`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Group, RenderableType
from rich.table import Table

from service.client_cli.common import OutputOpt, Run, TimeoutOpt, connect, poll_interval
from service.client_cli.logs import (
    ContainerOpt,
    FollowOpt,
    SinceOpt,
    TailOpt,
    TimestampsOpt,
    print_log,
)
from service.client_cli.output import EXIT_CODES, Code, Output, cell, status_text, table
from service.client_cli.watch import INTERRUPTED

T = "/v1/nvct"
TERMINAL = frozenset(
    {
        "COMPLETED",
        "CANCELED",
        "ERRORED",
        "EXCEEDED_MAX_RUNTIME_DURATION",
        "EXCEEDED_MAX_QUEUED_DURATION",
    }
)
DEFAULT_TIMEOUT = 3600.0
#: pages of a list followed at most (each of the server's page size)
MAX_PAGES = 100

app = typer.Typer(
    help="Cloud tasks (NVCT): GPU jobs that run to completion: create, list, get, cancel, "
    "delete, events, results, logs.",
    epilog=EXIT_CODES,
    no_args_is_help=True,
)

TaskId = Annotated[str, typer.Argument(help="The task's id.", show_default=False)]
WaitOpt = Annotated[
    bool,
    typer.Option(
        "--wait",
        help="Follow the task (status, percent, checkpoints) until it ends; exit 3 unless it "
        "is COMPLETED.",
    ),
]


def _pairs(items: list[str], option: str, key: str, value: str) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"{item!r} is not NAME=VALUE", param_hint=option)
        out.append({key: name, value: text})
    return out


def _artifacts(items: list[str], option: str) -> list[dict[str, str]]:
    """nvcf-cli's `name:version:uri` (the URI may hold ':')."""
    out: list[dict[str, str]] = []
    for item in items:
        parts = item.split(":", 2)
        if len(parts) != 3 or not all(parts):
            raise typer.BadParameter(f"{item!r} is not name:version:uri", param_hint=option)
        out.append({"name": parts[0], "version": parts[1], "uri": parts[2]})
    return out


def _read_file(path: Path) -> dict[str, Any]:
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(f"cannot read {path}: {exc}", param_hint="--file") from None
    if not isinstance(loaded, dict):
        raise typer.BadParameter(f"{path} is not a JSON object", param_hint="--file")
    return loaded


def _pages(run: Run, path: str, key: str, params: dict[str, Any]) -> dict[str, Any]:
    """Every item of a cursor-paged list (NVCT's `limit` and `cursor`), or one page when
    `limit` is given."""
    items: list[Any] = []
    query = dict(params)
    for _ in range(MAX_PAGES):
        body: dict[str, Any] = run.api.call("GET", path, params=query)
        items += body.get(key) or []
        cursor = body.get("cursor")
        if not cursor or "limit" in params:
            return {key: items, **({"cursor": cursor} if cursor else {})}
        query["cursor"] = cursor
    return {key: items, "cursor": query["cursor"]}


# --------------------------------------------------------------------------- views


def tasks_table(tasks: list[dict[str, Any]]) -> Table:
    out = table("task id", "name", "status", "progress", "gpu", "instance type", "created")
    for task in tasks:
        spec = task.get("gpuSpecification") or {}
        percent = task.get("percentComplete")
        out.add_row(
            cell(task.get("id")),
            cell(task.get("name")),
            status_text(task.get("status")),
            f"{percent}%" if percent is not None else "",
            cell(spec.get("gpu")),
            cell(spec.get("instanceType")),
            cell(task.get("createdAt")),
        )
    return out


TASK_FIELDS = (
    ("id", "task id"),
    ("name", "name"),
    ("status", "status"),
    ("percentComplete", "percent complete"),
    ("ncaId", "account"),
    ("containerImage", "container image"),
    ("containerArgs", "container args"),
    ("helmChart", "helm chart"),
    ("resultHandlingStrategy", "results"),
    ("resultsLocation", "results location"),
    ("maxRuntimeDuration", "max runtime"),
    ("maxQueuedDuration", "max queued"),
    ("terminationGracePeriodDuration", "grace period"),
    ("secrets", "secrets"),
    ("tags", "tags"),
    ("description", "description"),
    ("lastHeartbeatAt", "last heartbeat"),
    ("createdAt", "created"),
)


def task_detail(task: dict[str, Any]) -> RenderableType:
    fields = Table.grid(padding=(0, 2))
    fields.add_column(style="bold")
    fields.add_column(overflow="fold")
    spec = task.get("gpuSpecification") or {}
    for key, label in TASK_FIELDS:
        value = task.get(key)
        if value in (None, "", []):
            continue
        fields.add_row(label, status_text(value) if key == "status" else cell(value))
        if key == "status":
            gpu = " ".join(cell(spec.get(k)) for k in ("gpu", "instanceType", "backend"))
            fields.add_row("gpu", gpu.strip())
    health = task.get("healthInfo") or {}
    if health.get("error"):
        fields.add_row("error", cell(health["error"]))
    parts: list[RenderableType] = [fields]
    instances = task.get("instances") or []
    if instances:
        rows = table("instance", "state", "instance type", "backend", "location")
        for i in instances:
            rows.add_row(
                cell(i.get("instanceId")),
                status_text(i.get("instanceState")),
                cell(i.get("instanceType")),
                cell(i.get("backend")),
                cell(i.get("location")),
            )
        parts.append(rows)
    return Group(*parts)


def events_table(events: list[dict[str, Any]]) -> Table:
    out = table("at", "message")
    for event in events:
        out.add_row(cell(event.get("createdAt")), cell(event.get("message")))
    return out


def results_table(results: list[dict[str, Any]]) -> Table:
    out = table("name", "created", "reference", "digest", "metadata")
    for result in results:
        metadata = result.get("metadata") or {}
        out.add_row(
            cell(result.get("name")),
            cell(result.get("createdAt")),
            cell(result.get("reference")),
            cell(result.get("digest")),
            json.dumps(metadata, sort_keys=True) if metadata else "",
        )
    return out


# --------------------------------------------------------------------------- --wait


def progress_line(task: dict[str, Any], checkpoints: list[str]) -> str:
    percent = task.get("percentComplete")
    line = f"task {task.get('id')} {task.get('status')}"
    if percent is not None:
        line += f" {percent}%"
    if checkpoints:
        line += f"; checkpoints: {', '.join(checkpoints)}"
    return line


def wait_task(run: Run, task_id: str, timeout: float) -> dict[str, Any]:
    """Poll the task until it ends, a line on stderr at each change of its status, percent or
    checkpoints; COMPLETED returns it, another end exits 3 with why, `timeout` exits 4."""
    path = f"{T}/tasks/{task_id}"
    deadline = time.monotonic() + timeout
    last = ""
    try:
        while True:
            task: dict[str, Any] = run.api.call("GET", path)["task"]
            results = _pages(run, f"{path}/results", "results", {})["results"]
            checkpoints = [str(r.get("name")) for r in results]
            line = progress_line(task, checkpoints)
            if line != last:
                run.ui.note(line)
                last = line
            if task.get("status") in TERMINAL or time.monotonic() >= deadline:
                break
            time.sleep(min(poll_interval(), max(deadline - time.monotonic(), 0.0)))
    except KeyboardInterrupt:
        run.ui.note("stopped waiting; the task goes on")
        raise typer.Exit(INTERRUPTED) from None
    status = task.get("status")
    if status == "COMPLETED":
        if run.ui.json:
            run.ui.emit({"task": task, "results": results})
        else:
            run.ui.show(task_detail(task))
            if results:
                run.ui.show(results_table(results))
        return task
    if status in TERMINAL:
        events = _pages(run, f"{path}/events", "events", {})["events"]
        error = (task.get("healthInfo") or {}).get("error")
        run.ui.error(f"task {task_id} ended {status}" + (f": {error}" if error else ""))
        if run.ui.json:
            run.ui.emit({"task": task, "results": results, "events": events})
        else:
            run.ui.show(events_table(events))
        raise typer.Exit(int(Code.FAILED))
    run.ui.error(f"timed out after {timeout:g}s waiting for task {task_id} to end ({status})")
    if run.ui.json:
        run.ui.emit({"task": task, "results": results})
    raise typer.Exit(int(Code.TIMEOUT))


# --------------------------------------------------------------------------- commands


@app.command(epilog=EXIT_CODES)
def create(
    name: Annotated[str | None, typer.Option(help="The task's name.")] = None,
    gpu: Annotated[str | None, typer.Option(help="GPU name, e.g. H100.")] = None,
    instance_type: Annotated[
        str | None, typer.Option(help="Instance type, e.g. NCP.GPU.H100_1x.")
    ] = None,
    backend: Annotated[str | None, typer.Option(help="Cluster group.")] = None,
    cluster: Annotated[
        list[str] | None, typer.Option(help="Only this cluster (repeatable).")
    ] = None,
    image: Annotated[
        str | None, typer.Option("--image", help="Container image (a container task).")
    ] = None,
    container_args: Annotated[str | None, typer.Option(help="Container arguments.")] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", help="KEY=VALUE of the container environment (repeatable)."),
    ] = None,
    helm_chart: Annotated[str | None, typer.Option(help="oci:// chart URL (a helm task).")] = None,
    model: Annotated[
        list[str] | None, typer.Option(help="A model, name:version:uri (repeatable).")
    ] = None,
    resource: Annotated[
        list[str] | None, typer.Option(help="A resource, name:version:uri (repeatable).")
    ] = None,
    max_runtime: Annotated[
        str | None, typer.Option(help="maxRuntimeDuration, ISO 8601 (e.g. PT4H).")
    ] = None,
    max_queued: Annotated[
        str | None, typer.Option(help="maxQueuedDuration, ISO 8601 (server default PT72H).")
    ] = None,
    termination_grace: Annotated[
        str | None,
        typer.Option(help="terminationGracePeriodDuration, ISO 8601 (server default PT1H)."),
    ] = None,
    result_strategy: Annotated[
        str | None,
        typer.Option(help="resultHandlingStrategy: NONE, or UPLOAD (the server's default)."),
    ] = None,
    results_location: Annotated[
        str | None, typer.Option(help="With UPLOAD: org/[team/]model the results go to.")
    ] = None,
    secret: Annotated[
        list[str] | None,
        typer.Option(help="NAME=VALUE of a secret (repeatable), e.g. NGC_API_KEY=nvapi-…."),
    ] = None,
    tag: Annotated[list[str] | None, typer.Option(help="A tag (repeatable).")] = None,
    description: Annotated[str | None, typer.Option(help="Free text.")] = None,
    file: Annotated[
        Path | None,
        typer.Option(
            "--file", "-f", help="A JSON request body; the other options override its fields."
        ),
    ] = None,
    wait: WaitOpt = False,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    output: OutputOpt = Output.table,
) -> None:
    """Create a task: it is queued, then launched where its GPUs are free."""
    body = _read_file(file) if file is not None else {}
    gpu_spec: dict[str, Any] = dict(body.get("gpuSpecification") or {})
    spec_flags = {
        "gpu": gpu,
        "instanceType": instance_type,
        "backend": backend,
        "clusters": cluster or None,
    }
    gpu_spec.update({k: v for k, v in spec_flags.items() if v is not None})
    flags: dict[str, Any] = {
        "name": name,
        "gpuSpecification": gpu_spec or None,
        "containerImage": image,
        "containerArgs": container_args,
        "containerEnvironment": _pairs(env, "--env", "key", "value") if env else None,
        "helmChart": helm_chart,
        "models": _artifacts(model, "--model") if model else None,
        "resources": _artifacts(resource, "--resource") if resource else None,
        "maxRuntimeDuration": max_runtime,
        "maxQueuedDuration": max_queued,
        "terminationGracePeriodDuration": termination_grace,
        "resultHandlingStrategy": result_strategy.upper() if result_strategy else None,
        "resultsLocation": results_location,
        "tags": tag or None,
        "description": description,
    }
    body.update({k: v for k, v in flags.items() if v is not None})
    if secret:
        given = _pairs(secret, "--secret", "name", "value")
        names = {s["name"] for s in given}
        kept = [s for s in body.get("secrets") or [] if s.get("name") not in names]
        body["secrets"] = kept + given
    with connect(output) as run:
        created = run.api.call("POST", f"{T}/tasks", json=body)
        task = created["task"]
        if wait:
            run.ui.note(f"created task {task['id']} ({task.get('status')})")
            wait_task(run, str(task["id"]), timeout)
            return
        if run.ui.json:
            run.ui.emit(created)
            return
        run.ui.show(task_detail(task))


@app.command("list", epilog=EXIT_CODES)
def list_(
    status: Annotated[
        str | None, typer.Option(help="Only tasks in this status (QUEUED, RUNNING, …).")
    ] = None,
    limit: Annotated[
        int | None, typer.Option(min=1, help="One page of at most this many (with its cursor).")
    ] = None,
    cursor: Annotated[str | None, typer.Option(help="The page after this cursor.")] = None,
    output: OutputOpt = Output.table,
) -> None:
    """List the account's tasks, oldest first (every page unless --limit)."""
    params = {"status": status, "limit": limit, "cursor": cursor}
    with connect(output) as run:
        body = _pages(run, f"{T}/tasks", "tasks", {k: v for k, v in params.items() if v})
        if run.ui.json:
            run.ui.emit(body)
            return
        run.ui.show(tasks_table(body["tasks"]))
        if body.get("cursor"):
            run.ui.note(f"more: --cursor {body['cursor']}")


@app.command(epilog=EXIT_CODES)
def get(
    task_id: TaskId,
    include_secrets: Annotated[
        bool, typer.Option(help="List the names of the task's secrets.")
    ] = False,
    wait: WaitOpt = False,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    output: OutputOpt = Output.table,
) -> None:
    """Show a task (its progress, health and instances)."""
    with connect(output) as run:
        if wait:
            wait_task(run, task_id, timeout)
            return
        params = {"includeSecrets": "true"} if include_secrets else None
        body = run.api.call("GET", f"{T}/tasks/{task_id}", params=params)
        if run.ui.json:
            run.ui.emit(body)
            return
        run.ui.show(task_detail(body["task"]))


@app.command(epilog=EXIT_CODES)
def cancel(task_id: TaskId, output: OutputOpt = Output.table) -> None:
    """Cancel a task: its container is asked to stop, and killed after the grace period."""
    with connect(output) as run:
        body = run.api.call("POST", f"{T}/tasks/{task_id}/cancel")
        if run.ui.json:
            run.ui.emit(body)
            return
        run.ui.note(f"task {task_id} is {body['task'].get('status')}")


@app.command(epilog=EXIT_CODES)
def delete(task_id: TaskId, output: OutputOpt = Output.table) -> None:
    """Delete a task (a running one is canceled first, within its grace period)."""
    with connect(output) as run:
        run.api.call("DELETE", f"{T}/tasks/{task_id}")
        if run.ui.json:
            run.ui.emit({"deleted": {"taskId": task_id}})
            return
        run.ui.note(f"deleted task {task_id}")


@app.command(epilog=EXIT_CODES)
def events(task_id: TaskId, output: OutputOpt = Output.table) -> None:
    """The task's timeline, oldest first."""
    with connect(output) as run:
        body = _pages(run, f"{T}/tasks/{task_id}/events", "events", {})
        if run.ui.json:
            run.ui.emit(body)
            return
        run.ui.show(events_table(body["events"]))


@app.command(epilog=EXIT_CODES)
def results(task_id: TaskId, output: OutputOpt = Output.table) -> None:
    """The results (checkpoints) the task reported; with UPLOAD, where each was pushed."""
    with connect(output) as run:
        body = _pages(run, f"{T}/tasks/{task_id}/results", "results", {})
        if run.ui.json:
            run.ui.emit(body)
            return
        run.ui.show(results_table(body["results"]))


@app.command(epilog=EXIT_CODES)
def logs(
    task_id: TaskId,
    container: ContainerOpt = None,
    follow: FollowOpt = False,
    tail: TailOpt = None,
    since: SinceOpt = None,
    timestamps: TimestampsOpt = False,
    output: OutputOpt = Output.table,
) -> None:
    """Print what the task's containers print while its objects are there (each line prefixed
    with its container unless one is named); an ended task that left prints nothing."""
    print_log(f"{T}/tasks/{task_id}/logs", output, container, follow, tail, since, timestamps)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="task")
