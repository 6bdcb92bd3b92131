"""`nvcf canary start|status|pause|resume|promote|abort`: a function's canary release
(docs/rollouts.md, "Canary releases"), with its step, weights and the analysis figures;
`--wait` follows it until it ends (exit 3 when it was rolled back or aborted)."""

from __future__ import annotations

import json
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.live import Live
from rich.table import Table

from service.client_cli.api import V
from service.client_cli.common import OutputOpt, Run, connect, poll_interval
from service.client_cli.output import EXIT_CODES, Code, Output, cell, table

app = typer.Typer(
    help="A function's canary release: a new version's share of the traffic grown step by "
    "step while its error rate and latency hold up against the stable version's.",
    epilog=EXIT_CODES,
    no_args_is_help=True,
)

FunctionId = Annotated[str, typer.Argument(help="The function's id.", show_default=False)]
WaitOpt = Annotated[
    bool,
    typer.Option(
        "--wait",
        help="Follow the release until it is promoted (exit 0), rolled back or aborted (exit 3).",
    ),
]
TimeoutOpt = Annotated[
    float, typer.Option("--timeout", help="Seconds --wait waits at most (then exit 4).")
]
#: phases after which nothing changes
ENDED = ("PROMOTED", "ROLLED_BACK", "ABORTED")


def _path(function_id: str, action: str = "") -> str:
    return f"{V}/functions/{function_id}/canary" + (f"/{action}" if action else "")


def _figures(one: dict[str, Any] | None) -> str:
    if not one:
        return "-"
    rate = 100 * float(one.get("errorRate") or 0)
    p95 = float(one.get("p95Seconds") or 0)
    return (
        f"{one.get('requests', 0)} requests, {one.get('errors', 0)} errors ({rate:.2f}%), "
        f"p95 {p95:.3f}s"
    )


def _show(run: Run, release: dict[str, Any]) -> None:
    if run.ui.json:
        run.ui.emit(release)
        return
    run.ui.show(_table(release))


def _table(release: dict[str, Any]) -> Table:
    rows = table("FIELD", "VALUE")
    analysis = release.get("analysis") or {}
    for name, value in (
        ("release", release.get("id")),
        ("phase", release.get("phase")),
        ("step", f"{release.get('step')} of {release.get('steps')}"),
        ("canary", f"{release.get('canaryVersionId')} at {release.get('weight')}%"),
        ("stable", f"{release.get('stableVersionId')} at {100 - int(release.get('weight') or 0)}%"),
        ("canary figures", _figures(analysis.get("canary"))),
        ("stable figures", _figures(analysis.get("stable"))),
        ("reason", release.get("reason") or "-"),
    ):
        rows.add_row(name, cell(value))
    return rows


def _follow(run: Run, function_id: str, release: dict[str, Any], timeout: float) -> None:
    """Print each change until the release ends; exit 3 unless promoted, 4 past `timeout`."""
    deadline = time.monotonic() + timeout
    seen = (release.get("phase"), release.get("step"))
    terminal = not run.ui.json and run.ui.out.is_terminal
    # on a terminal the step, weights and figures refresh in place (transient: the final
    # table is printed once below)
    live = Live(console=run.ui.out, refresh_per_second=4, transient=True) if terminal else None
    with live if live is not None else nullcontext():
        while release.get("phase") not in ENDED:
            if live is not None:
                live.update(_table(release))
            if time.monotonic() >= deadline:
                break
            time.sleep(min(poll_interval(), max(deadline - time.monotonic(), 0.0)))
            release = run.api.call("GET", _path(function_id))
            now = (release.get("phase"), release.get("step"))
            if now != seen and not run.ui.json:
                what = f"{release.get('phase')} step {release.get('step')}"
                run.ui.note(f"{what}: {release.get('reason')}")
            seen = now
    if release.get("phase") not in ENDED:
        run.ui.error(f"timed out after {timeout:g}s; the release is {release.get('phase')}")
        raise typer.Exit(int(Code.TIMEOUT))
    _show(run, release)
    if release.get("phase") != "PROMOTED":
        raise typer.Exit(int(Code.FAILED))


@app.command(epilog=EXIT_CODES)
def start(
    function_id: FunctionId,
    version_id: Annotated[
        str, typer.Option("--version", help="The canary: a deployed version.", show_default=False)
    ],
    plan: Annotated[
        Path,
        typer.Option(
            "--plan",
            help='The plan, a JSON file: {"steps": [{"weight": 10, "seconds": 300}, ...], '
            '"analysis": {"maxErrorRateIncrease": 0.01, "maxLatencyRatio": 1.2, '
            '"minRequests": 100}}.',
            show_default=False,
        ),
    ],
    stable: Annotated[
        str | None,
        typer.Option(
            "--stable", help="The version to compare with (default: the one taking most traffic)."
        ),
    ] = None,
    undeploy_on_rollback: Annotated[
        bool, typer.Option("--undeploy-on-rollback", help="Undeploy the canary if rolled back.")
    ] = False,
    wait: WaitOpt = False,
    timeout: TimeoutOpt = 86400.0,
    output: OutputOpt = Output.table,
) -> None:
    """Start a canary release of a version."""
    try:
        steps = json.loads(plan.read_text())
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(f"cannot read the plan: {exc}", param_hint="--plan") from None
    body: dict[str, Any] = {
        "versionId": version_id,
        "plan": steps,
        "undeployOnRollback": undeploy_on_rollback,
    }
    if stable is not None:
        body["stableVersionId"] = stable
    with connect(output) as run:
        release = run.api.call("POST", _path(function_id), json=body)
        if wait:
            _follow(run, function_id, release, timeout)
        else:
            _show(run, release)


@app.command(epilog=EXIT_CODES)
def status(
    function_id: FunctionId,
    wait: WaitOpt = False,
    timeout: TimeoutOpt = 86400.0,
    output: OutputOpt = Output.table,
) -> None:
    """The release under way (else the last one): step, weights and analysis figures."""
    with connect(output) as run:
        release = run.api.call("GET", _path(function_id))
        if wait:
            _follow(run, function_id, release, timeout)
        else:
            _show(run, release)


def _action(name: str, doc: str) -> None:
    def command(
        function_id: FunctionId,
        wait: WaitOpt = False,
        timeout: TimeoutOpt = 86400.0,
        output: OutputOpt = Output.table,
    ) -> None:
        with connect(output) as run:
            release = run.api.call("POST", _path(function_id, name), json={})
            if wait:
                _follow(run, function_id, release, timeout)
            else:
                _show(run, release)

    command.__doc__ = doc
    app.command(name, epilog=EXIT_CODES)(command)


_action("pause", "Pause the release at its step (its weights stay).")
_action("resume", "Resume a paused release (the step's time starts again).")
_action("promote", "Promote the canary now: it takes all the traffic.")
_action("abort", "Abort now: the stable version takes all the traffic.")
