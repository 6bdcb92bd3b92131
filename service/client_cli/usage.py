"""`nvcf usage`: an account's metered usage over a period (GPU-hours, invocations, tokens),
grouped by function, version, model, instance type or cluster; as a table, JSON or CSV."""

from __future__ import annotations

import csv
import re
import sys
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import typer

from service.client_cli.api import V
from service.client_cli.common import OutputOpt, connect, fail
from service.client_cli.output import EXIT_CODES, Code, Output, cell, table

GROUPINGS = ("function", "version", "model", "instanceType", "cluster")
_AGO = re.compile(r"^(\d{1,6})([mhd])$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days"}
_NAMES = ("functionId", "versionId", "taskId", "model", "instanceType", "cluster")


def _instant(value: str | None) -> str | None:
    """An RFC 3339 time as given, or `7d`/`24h`/`30m` ago as one."""
    if value is None:
        return None
    ago = _AGO.match(value)
    if ago is None:
        return value  # the server names a malformed time
    at = datetime.now(UTC) - timedelta(**{_UNITS[ago.group(2)]: int(ago.group(1))})
    return at.isoformat(timespec="seconds").replace("+00:00", "Z")


def usage(
    account: Annotated[
        str | None, typer.Option(help="The account (operator only; default: your own).")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(help="Start: an RFC 3339 time, or 7d, 24h, 30m ago (default: 30 days)."),
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="End: an RFC 3339 time, or an age (default: now).")
    ] = None,
    by: Annotated[
        str, typer.Option(help=f"Grouping: {', '.join(GROUPINGS)}.", show_default=True)
    ] = "function",
    as_csv: Annotated[bool, typer.Option("--csv", help="CSV on stdout.")] = False,
    output: OutputOpt = Output.table,
) -> None:
    """GPU-hours (instances that never became ready apart), invocations and tokens."""
    with connect(output) as run:
        if by not in GROUPINGS:
            raise fail(run.ui, f"--by must be one of {', '.join(GROUPINGS)}", Code.USAGE)
        params: dict[str, Any] = {"by": by}
        for name, value in (
            ("account", account),
            ("since", _instant(since)),
            ("until", _instant(until)),
        ):
            if value is not None:
                params[name] = value
        body = run.api.call("GET", f"{V}/usage", params=params)
        if run.ui.json:
            run.ui.emit(body)
            return
        rows: list[dict[str, Any]] = body["usage"]
        names = [n for n in _NAMES if any(n in r for r in rows)] or ["functionId"]
        if as_csv:
            measures = ["gpuSeconds", "notReadyGpuSeconds", "invocations"]
            columns = [*names, *measures, "inputTokens", "outputTokens"]
            writer = csv.DictWriter(sys.stdout, columns, extrasaction="ignore", lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
            return
        title = f"usage of {body['account']} from {body['since']} to {body['until']}"
        shown = table(
            *[n.upper() for n in names],
            "GPU-HOURS",
            "NOT READY GPU-HOURS",
            "INVOCATIONS",
            "INPUT TOKENS",
            "OUTPUT TOKENS",
            title=title,
        )
        for r in [
            *rows,
            {**{n: "total" if i == 0 else "" for i, n in enumerate(names)}, **body["total"]},
        ]:
            shown.add_row(
                *[cell(r.get(n)) for n in names],
                f"{r['gpuSeconds'] / 3600:.3f}",
                f"{r['notReadyGpuSeconds'] / 3600:.3f}",
                str(r["invocations"]),
                str(r["inputTokens"]),
                str(r["outputTokens"]),
            )
        run.ui.show(shown)


def register(app: typer.Typer) -> None:
    app.command(epilog=EXIT_CODES)(usage)
