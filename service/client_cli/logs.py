"""`nvcf logs`: what a deployment's instances print (docs/cli.md, docs/logs.md)."""

from __future__ import annotations

import re
import sys
from typing import Annotated

import typer

from service.client_cli.api import stream_lines
from service.client_cli.common import OutputOpt, connect, fail
from service.client_cli.output import EXIT_CODES, Code, Output

V = "/v2/nvcf"
_SINCE = re.compile(r"^\s*(\d+)\s*(s|m|h|d)?\s*$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


ContainerOpt = Annotated[str | None, typer.Option("--container", "-c", help="Only this container.")]
FollowOpt = Annotated[
    bool, typer.Option("--follow", "-f", help="Keep printing new lines until the end.")
]
TailOpt = Annotated[
    int | None, typer.Option("--tail", min=0, help="The last N lines of each container.")
]
SinceOpt = Annotated[
    str | None, typer.Option("--since", help="Lines of the last 30s, 10m, 2h, 1d.")
]
TimestampsOpt = Annotated[
    bool, typer.Option("--timestamps", help="Prefix each line with its time.")
]


def since_seconds(text: str) -> int:
    """`30s`, `10m`, `2h`, `1d` or bare seconds."""
    match = _SINCE.match(text)
    if match is None or int(match.group(1)) <= 0:
        raise ValueError(f"--since {text!r}: use e.g. 30s, 10m, 2h or 1d")
    return int(match.group(1)) * _UNIT[match.group(2) or "s"]


def logs(
    deployment_id: Annotated[str, typer.Argument(help="The deployment's id.")],
    instance_id: Annotated[
        str | None,
        typer.Argument(
            help="One instance (default: every Running instance, each line prefixed with its id)."
        ),
    ] = None,
    container: ContainerOpt = None,
    follow: FollowOpt = False,
    tail: TailOpt = None,
    since: SinceOpt = None,
    timestamps: TimestampsOpt = False,
    output: OutputOpt = Output.table,
) -> None:
    """Print what a deployment's instances print; a failed instance prints the last lines
    kept when it failed, even after it was torn down."""
    path = f"{V}/deployments/{deployment_id}"
    path += f"/instances/{instance_id}/logs" if instance_id else "/logs"
    print_log(path, output, container, follow, tail, since, timestamps)


def print_log(
    path: str,
    output: Output,
    container: str | None,
    follow: bool,
    tail: int | None,
    since: str | None,
    timestamps: bool,
) -> None:
    """Print a log route's lines as they arrive (an instance's, a deployment's, a task's)."""
    with connect(output) as run:
        params: dict[str, str] = {}
        if since is not None:
            try:
                params["sinceSeconds"] = str(since_seconds(since))
            except ValueError as exc:
                raise fail(run.ui, str(exc), Code.USAGE) from None
        if container is not None:
            params["container"] = container
        if tail is not None:
            params["tailLines"] = str(tail)
        if follow:
            params["follow"] = "true"
        if timestamps:
            params["timestamps"] = "true"
        try:
            for line in stream_lines(run.api, path, params):
                if run.ui.json:
                    run.ui.emit({"line": line}, lines=True)
                else:
                    sys.stdout.write(line + "\n")  # as printed: no markup, no wrapping
                    sys.stdout.flush()
        except KeyboardInterrupt:
            raise typer.Exit(0) from None


def register(app: typer.Typer) -> None:
    app.command(epilog=EXIT_CODES)(logs)
