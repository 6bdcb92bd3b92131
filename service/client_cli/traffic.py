"""`nvcf traffic get|set`: a function's traffic split, the weights by which the invocations
naming no version are shared among its versions (docs/rollouts.md, "Traffic")."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from service.client_cli.api import V
from service.client_cli.common import OutputOpt, connect
from service.client_cli.output import EXIT_CODES, Output, Ui, cell, table

app = typer.Typer(
    help="A function's traffic split among its versions.",
    epilog=EXIT_CODES,
    no_args_is_help=True,
)

FunctionId = Annotated[str, typer.Argument(help="The function's id.", show_default=False)]


def _weights(pairs: list[str]) -> list[dict[str, Any]]:
    """`VERSION=WEIGHT` pairs as the API's entries; a malformed one is a usage error."""
    out: list[dict[str, Any]] = []
    for pair in pairs:
        version, sep, weight = pair.partition("=")
        if not sep or not version or not weight.isascii() or not weight.isdigit():
            raise typer.BadParameter(
                f"{pair!r} is not VERSION=WEIGHT (a version id, = and a whole number)",
                param_hint="VERSION=WEIGHT",
            )
        out.append({"versionId": version, "weight": int(weight)})
    return out


def _show(ui: Ui, split: dict[str, Any]) -> None:
    if ui.json:
        ui.emit(split)
        return
    if not split.get("traffic"):
        ui.show("no split: the newest invocable version takes every invocation")
        return
    rows = table("VERSION", "WEIGHT")
    for entry in split["traffic"]:
        rows.add_row(cell(entry.get("versionId")), f"{entry.get('weight')}%")
    ui.show(rows)


@app.command(epilog=EXIT_CODES)
def get(function_id: FunctionId, output: OutputOpt = Output.table) -> None:
    """The function's split."""
    with connect(output) as run:
        _show(run.ui, run.api.call("GET", f"{V}/functions/{function_id}/traffic"))


@app.command("set", epilog=EXIT_CODES)
def set_(
    function_id: FunctionId,
    weights: Annotated[
        list[str] | None,
        typer.Argument(
            help="VERSION=WEIGHT for each version (weights summing to 100); none: remove the "
            "split.",
            show_default=False,
        ),
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Replace the function's split."""
    body = {"traffic": _weights(weights or [])}
    with connect(output) as run:
        _show(run.ui, run.api.call("PUT", f"{V}/functions/{function_id}/traffic", json=body))
