"""`nvcf deploy`, `scale`, `undeploy`, `status` and `events`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from service.client_cli.api import ApiError, V
from service.client_cli.common import (
    FunctionId,
    OutputOpt,
    Run,
    TimeoutOpt,
    VersionId,
    connect,
    fail,
    poll_interval,
    read_values,
)
from service.client_cli.output import EXIT_CODES, Code, Output, cell, parse_time
from service.client_cli.views import deployment_detail, events_table, short
from service.client_cli.watch import (
    deployment_path,
    settled_active,
    wait_active,
    wait_removed,
)

DEFAULT_TIMEOUT = 900.0

WaitOpt = Annotated[
    bool,
    typer.Option(
        "--wait",
        help="Show every instance live until the version is ACTIVE; on ERROR print the reason "
        "and the event timeline and exit 3.",
    ),
]


def spec_url(run: Run, function_id: str, version_id: str, spec_id: str | None) -> str:
    """The path of the deployment's GPU specification (`--spec`, or its only one)."""
    dep = run.api.call("GET", deployment_path(function_id, version_id))["deployment"]
    specs = [str(s["gpuSpecificationId"]) for s in dep.get("deploymentSpecifications") or []]
    if spec_id is None:
        if len(specs) != 1:
            raise fail(
                run.ui,
                f"the deployment has {len(specs)} GPU specifications; pick one with --spec "
                f"({', '.join(specs)})",
                Code.USAGE,
            )
        spec_id = specs[0]
    return f"{V}/deployments/{dep['deploymentId']}/gpu-specifications/{spec_id}"


def deploy(
    function_id: FunctionId,
    version_id: VersionId,
    gpu: Annotated[str, typer.Option(help="GPU name, e.g. H100 or L40S.", show_default=False)],
    instance_type: Annotated[
        str | None, typer.Option(help="Instance type, e.g. NCP.GPU.H100_1x.")
    ] = None,
    min_instances: Annotated[int, typer.Option("--min", min=0, help="minInstances.")] = 1,
    max_instances: Annotated[
        int | None, typer.Option("--max", min=1, help="maxInstances (default: --min, at least 1).")
    ] = None,
    backend: Annotated[str | None, typer.Option(help="Cluster group.")] = None,
    cluster: Annotated[
        list[str] | None, typer.Option(help="Only this cluster (repeatable).")
    ] = None,
    region: Annotated[list[str] | None, typer.Option(help="Only this region (repeatable).")] = None,
    max_request_concurrency: Annotated[
        int | None, typer.Option(min=1, help="maxRequestConcurrency of each instance.")
    ] = None,
    values: Annotated[
        Path | None,
        typer.Option("--values", help="Helm values file (YAML): the configuration overrides."),
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(help="helmValidationPolicy name: Default or Unrestricted (helm functions)."),
    ] = None,
    wait: WaitOpt = False,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    output: OutputOpt = Output.table,
) -> None:
    """Deploy a function version on one GPU specification."""
    spec: dict[str, Any] = {
        "gpu": gpu,
        "minInstances": min_instances,
        "maxInstances": max_instances if max_instances is not None else max(min_instances, 1),
    }
    optional = {
        "instanceType": instance_type,
        "backend": backend,
        "clusters": cluster or None,
        "regions": region or None,
        "maxRequestConcurrency": max_request_concurrency,
        "helmValidationPolicy": {"name": policy} if policy else None,
    }
    spec.update({k: v for k, v in optional.items() if v is not None})
    with connect(output) as run:
        configuration = read_values(run.ui, values)
        if configuration is not None:
            spec["configuration"] = configuration
        body = {"deploymentSpecifications": [spec]}
        created = run.api.call("POST", deployment_path(function_id, version_id), json=body)
        if wait:
            wait_active(run, function_id, version_id, timeout)
            return
        if run.ui.json:
            run.ui.emit(created)
            return
        run.ui.show(deployment_detail(created["deployment"]))


def scale(
    function_id: FunctionId,
    version_id: VersionId,
    min_instances: Annotated[int | None, typer.Option("--min", min=0, help="minInstances.")] = None,
    max_instances: Annotated[int | None, typer.Option("--max", min=1, help="maxInstances.")] = None,
    spec_id: Annotated[
        str | None,
        typer.Option("--spec", help="The GPU specification (needed when there are several)."),
    ] = None,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="Show every instance live until all are Running and at least --min of them; "
            "on ERROR exit 3.",
        ),
    ] = False,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    output: OutputOpt = Output.table,
) -> None:
    """Change minInstances/maxInstances of a deployment."""
    with connect(output) as run:
        if min_instances is None and max_instances is None:
            raise fail(run.ui, "nothing to change: pass --min and/or --max", Code.USAGE)
        url = spec_url(run, function_id, version_id, spec_id)
        body = {
            k: v
            for k, v in (("minInstances", min_instances), ("maxInstances", max_instances))
            if v is not None
        }
        changed = run.api.call("PATCH", url, json=body)
        if wait:
            wait_active(run, function_id, version_id, timeout, done=settled_active)
            return
        if run.ui.json:
            run.ui.emit(changed)
            return
        spec = changed.get("gpuSpecification") or changed
        run.ui.note(
            f"GPU specification {url.rsplit('/', 1)[-1]}: minInstances {spec.get('minInstances')}, "
            f"maxInstances {spec.get('maxInstances')}"
        )


def undeploy(
    function_id: FunctionId,
    version_id: VersionId,
    graceful: Annotated[
        bool, typer.Option(help="Let instances finish their requests before they go.")
    ] = False,
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait until every instance is torn down.")
    ] = False,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    output: OutputOpt = Output.table,
) -> None:
    """Undeploy a function version: its instances are torn down."""
    with connect(output) as run:
        body = run.api.call(
            "DELETE",
            deployment_path(function_id, version_id),
            params={"graceful": "true"} if graceful else None,
        )
        if wait:
            wait_removed(run, function_id, version_id, timeout)
        if run.ui.json:
            run.ui.emit(body)
            return
        done = "torn down" if wait else "being torn down"
        status = body.get("function", {}).get("status")
        run.ui.note(f"undeployed {function_id}/{version_id} (status {status}); instances {done}")


def status(
    function_id: FunctionId, version_id: VersionId, output: OutputOpt = Output.table
) -> None:
    """A function version's status, its deployment and every instance."""
    with connect(output) as run:
        fn = run.api.call("GET", f"{V}/functions/{function_id}/versions/{version_id}")
        try:
            dep = run.api.call("GET", deployment_path(function_id, version_id))["deployment"]
        except ApiError as exc:
            if exc.status != 404:
                raise
            dep = None
        if run.ui.json:
            run.ui.emit({"function": fn["function"], "deployment": dep})
            return
        if dep is None:
            run.ui.show(
                Text(
                    f"{fn['function'].get('name')} {function_id}/{version_id}: "
                    f"{fn['function'].get('status')} (not deployed)"
                )
            )
            return
        run.ui.show(deployment_detail(dep))


def _event_key(event: dict[str, Any]) -> tuple[str, ...]:
    fields = ("at", "kind", "instanceId", "phase", "reason", "message")
    return tuple(cell(event.get(f)) for f in fields)


def _event_line(event: dict[str, Any]) -> Text:
    at = parse_time(event.get("at"))
    return Text(
        "  ".join(
            part
            for part in (
                at.strftime("%H:%M:%S.%f")[:-3] if at else cell(event.get("at")),
                cell(event.get("kind")),
                short(event.get("instanceId")),
                cell(event.get("phase")),
                cell(event.get("reason")),
                cell(event.get("message")),
            )
            if part
        )
    )


def events(
    deployment_id: Annotated[str, typer.Argument(help="The deployment's id (see status).")],
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="Keep printing new events until the deployment is removed."
        ),
    ] = False,
    timeout: Annotated[
        float | None,
        typer.Option(min=0.0, help="With --follow: stop after this many seconds (exit 4)."),
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """The event timeline of a deployment (with -o json and --follow: one event per line)."""
    with connect(output) as run:
        path = f"{V}/deployments/{deployment_id}/events"
        body = run.api.call("GET", path)
        if not follow:
            if run.ui.json:
                run.ui.emit(body)
                return
            run.ui.show(events_table(body.get("events") or []))
            return
        _follow(run, path, body, timeout)


def _follow(run: Run, path: str, first: dict[str, Any], timeout: float | None) -> None:
    seen: set[tuple[str, ...]] = set()
    deadline = None if timeout is None else time.monotonic() + timeout
    body = first
    try:
        while True:
            removed = False
            for event in body.get("events") or []:
                key = _event_key(event)
                if key in seen:
                    continue
                seen.add(key)
                if run.ui.json:
                    run.ui.emit(event, lines=True)
                else:
                    run.ui.show(_event_line(event))
                removed = removed or (
                    event.get("kind") == "teardown" and event.get("reason") == "Removed"
                )
            if removed:  # its last event: the timeline stays readable (history), nothing follows
                run.ui.note("the deployment was removed")
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise fail(run.ui, f"stopped following after {timeout:g}s", Code.TIMEOUT)
            time.sleep(poll_interval())
            try:
                body = run.api.call("GET", path)
            except ApiError as exc:
                if exc.status != 404:
                    raise
                run.ui.note("the deployment was removed")
                return
    except KeyboardInterrupt:
        return


def register(app: typer.Typer) -> None:
    for command in (deploy, scale, undeploy, status, events):
        app.command(epilog=EXIT_CODES)(command)
