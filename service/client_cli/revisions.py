"""`nvcf configure`, `revisions` and `rollback`: a deployment's configuration as numbered
revisions, rolled out one instance at a time (docs/rollouts.md)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

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
from service.client_cli.deployments import spec_url
from service.client_cli.output import EXIT_CODES, Code, Output
from service.client_cli.watch import deployment_path

DEFAULT_TIMEOUT = 900.0

SpecOpt = Annotated[
    str | None,
    typer.Option("--spec", help="The GPU specification (needed when there are several)."),
]
WaitOpt = Annotated[
    bool,
    typer.Option(
        "--wait",
        help="Wait until the rollout has completed; when it fails print the reason and exit 3.",
    ),
]


def _wait_rollout(
    run: Run, function_id: str, version_id: str, spec_url: str, timeout: float
) -> dict[str, Any]:
    """Poll until the specification's rollout is no longer progressing; the specification."""
    spec_id = spec_url.rsplit("/", 1)[1]
    deadline = time.monotonic() + timeout
    while True:
        dep = run.api.call("GET", deployment_path(function_id, version_id))["deployment"]
        spec = next(
            s for s in dep["deploymentSpecifications"] if s["gpuSpecificationId"] == spec_id
        )
        state = (spec.get("rollout") or {}).get("state")
        if state == "failed":
            raise fail(run.ui, f"rollout failed: {spec['rollout'].get('reason')}", Code.FAILED)
        if state != "progressing":
            run.ui.note(f"revision {spec.get('revision')} is rolled out")
            return dict(spec)
        if time.monotonic() >= deadline:
            raise fail(run.ui, f"timed out after {timeout:g} s: the rollout goes on", Code.TIMEOUT)
        time.sleep(poll_interval())


def _done(
    run: Run,
    body: dict[str, Any],
    function_id: str,
    version_id: str,
    url: str,
    wait: bool,
    timeout: float,
) -> None:
    spec = body.get("gpuSpecification") or {}
    if wait:
        spec = _wait_rollout(run, function_id, version_id, url, timeout)
    if run.ui.json:
        run.ui.emit({"gpuSpecification": spec})
        return
    rollout = spec.get("rollout") or {}
    run.ui.note(
        f"revision {spec.get('revision')}, target revision {spec.get('targetRevision')}"
        + (f" (rollout {rollout['state']})" if rollout.get("state") else "")
    )


def configure(
    function_id: FunctionId,
    version_id: VersionId,
    values: Annotated[
        Path | None,
        typer.Option("--values", help="Helm values file (YAML): the new configuration."),
    ] = None,
    policy: Annotated[
        str | None, typer.Option(help="helmValidationPolicy name: Default or Unrestricted.")
    ] = None,
    spec_id: SpecOpt = None,
    wait: WaitOpt = False,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    output: OutputOpt = Output.table,
) -> None:
    """Change a helm deployment's configuration: a new revision, rolled out one instance at a
    time."""
    with connect(output) as run:
        configuration = read_values(run.ui, values)
        if configuration is None and policy is None:
            raise fail(run.ui, "nothing to change: pass --values and/or --policy", Code.USAGE)
        body: dict[str, Any] = {}
        if configuration is not None:
            body["configuration"] = configuration
        if policy is not None:
            body["helmValidationPolicy"] = {"name": policy}
        url = spec_url(run, function_id, version_id, spec_id)
        changed = run.api.call("PATCH", url, json=body)
        _done(run, changed, function_id, version_id, url, wait, timeout)


def revisions(
    function_id: FunctionId,
    version_id: VersionId,
    spec_id: SpecOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """The revisions of a deployment's GPU specification, oldest first."""
    with connect(output) as run:
        url = spec_url(run, function_id, version_id, spec_id)
        listed = run.api.call("GET", f"{url}/revisions")
        if run.ui.json:
            run.ui.emit(listed)
            return
        table = Table("REVISION", "", "BY", "AT", "CONFIGURATION")
        for r in listed.get("revisions") or []:
            marks = ", ".join(
                m for m, on in (("current", r["current"]), ("target", r["target"])) if on
            )
            table.add_row(
                str(r["revision"]),
                marks,
                str(r.get("createdBy") or ""),
                str(r.get("createdAt") or ""),
                json.dumps(r.get("configuration") or {}, sort_keys=True),
            )
        run.ui.show(table)


def rollback(
    function_id: FunctionId,
    version_id: VersionId,
    revision: Annotated[int, typer.Argument(min=1, help="The revision to roll back to.")],
    spec_id: SpecOpt = None,
    wait: WaitOpt = False,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    output: OutputOpt = Output.table,
) -> None:
    """Roll a deployment's GPU specification back to an earlier revision, one instance at a
    time."""
    with connect(output) as run:
        url = spec_url(run, function_id, version_id, spec_id)
        changed = run.api.call("POST", f"{url}/revisions/{revision}/rollback")
        _done(run, changed, function_id, version_id, url, wait, timeout)


def register(app: typer.Typer) -> None:
    for command in (configure, revisions, rollback):
        app.command(epilog=EXIT_CODES)(command)
