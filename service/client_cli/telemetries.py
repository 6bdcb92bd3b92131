"""`nvcf telemetry create|list|get|delete|set-key`: the account's telemetry endpoints, where
the functions that name them send their signals (docs/telemetry-export.md)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from service.client_cli.api import Api, V
from service.client_cli.common import OutputOpt, connect
from service.client_cli.output import EXIT_CODES, Output, cell, table

app = typer.Typer(
    help="Telemetry endpoints: your own receivers of your functions' metrics and traces.",
    epilog=EXIT_CODES,
    no_args_is_help=True,
)

TelemetryId = Annotated[str, typer.Argument(help="The telemetry's id.", show_default=False)]
KEY_HELP = (
    "The endpoint's key (prompted for, hidden, when left out); GRAFANA_CLOUD: instanceId:token."
)
#: the field of a function's `telemetries` that each type is named in
FIELDS = {"LOGS": "logsTelemetryId", "METRICS": "metricsTelemetryId", "TRACES": "tracesTelemetryId"}


def telemetries_of(api: Api, ids: list[str]) -> dict[str, str]:
    """A function's `telemetries` from telemetry ids: each named for every type it receives;
    a type two of them receive is a usage error."""
    out: dict[str, str] = {}
    for telemetry_id in ids:
        telemetry = api.call("GET", f"{V}/telemetries/{telemetry_id}")["telemetry"]
        for kind in telemetry.get("types") or []:
            field = FIELDS.get(str(kind))
            if field is None:
                continue
            if field in out and out[field] != telemetry["telemetryId"]:
                raise typer.BadParameter(
                    f"{out[field]} and {telemetry_id} both receive {kind}; give one of them",
                    param_hint="--telemetry",
                )
            out[field] = telemetry["telemetryId"]
    return out


def _status(t: dict[str, Any]) -> str:
    status = t.get("status") or {}
    if status.get("lastError") and (status.get("lastErrorAt") or "") >= (
        status.get("lastSuccessAt") or ""
    ):
        return f"error: {status['lastError']}"
    return "ok" if status.get("lastSuccessAt") else "-"


@app.command(epilog=EXIT_CODES)
def create(
    name: Annotated[str, typer.Option(help="Its name, unique in the account.")],
    endpoint: Annotated[
        str, typer.Option(help="The receiver's URL; for DATADOG a site such as datadoghq.com.")
    ],
    provider: Annotated[
        str,
        typer.Option(
            help="OTEL_COLLECTOR, GRAFANA_CLOUD, PROMETHEUS, VICTORIAMETRICS, KRATOS_THANOS or "
            "DATADOG."
        ),
    ],
    type_: Annotated[
        list[str],
        typer.Option("--type", help="LOGS, METRICS or TRACES (repeatable)."),
    ],
    key: Annotated[str, typer.Option(help=KEY_HELP, prompt="Key", hide_input=True)],
    protocol: Annotated[str, typer.Option(help="HTTP or GRPC.")] = "HTTP",
    output: OutputOpt = Output.table,
) -> None:
    """Add a telemetry endpoint and print its id (its key is never shown again)."""
    body = {
        "endpoint": endpoint,
        "protocol": protocol,
        "provider": provider,
        "types": type_,
        "secret": {"name": name, "value": key},
    }
    with connect(output) as run:
        made = run.api.call("POST", f"{V}/telemetries", json=body, idempotent_create=True)
        telemetry = made["telemetry"]
        if run.ui.json:
            run.ui.emit(telemetry)
        else:
            run.ui.show(telemetry["telemetryId"])


@app.command("list", epilog=EXIT_CODES)
def list_telemetries(output: OutputOpt = Output.table) -> None:
    """The account's telemetry endpoints and how their last exports went."""
    with connect(output) as run:
        telemetries = run.api.call("GET", f"{V}/telemetries")["telemetries"]
        if run.ui.json:
            run.ui.emit(telemetries)
            return
        rows = table("ID", "NAME", "PROVIDER", "PROTOCOL", "TYPES", "ENDPOINT", "STATUS")
        for t in telemetries:
            rows.add_row(
                cell(t.get("telemetryId")),
                cell(t.get("name")),
                cell(t.get("provider")),
                cell(t.get("protocol")),
                cell(",".join(t.get("types") or [])),
                cell(t.get("endpoint")),
                cell(_status(t)),
            )
        run.ui.show(rows)


@app.command(epilog=EXIT_CODES)
def get(telemetry_id: TelemetryId, output: OutputOpt = Output.table) -> None:
    """One telemetry endpoint, with its last success and last error."""
    with connect(output) as run:
        telemetry = run.api.call("GET", f"{V}/telemetries/{telemetry_id}")["telemetry"]
        if run.ui.json:
            run.ui.emit(telemetry)
            return
        rows = table("FIELD", "VALUE")
        for field in ("telemetryId", "name", "provider", "protocol", "endpoint", "createdAt"):
            rows.add_row(field, cell(telemetry.get(field)))
        rows.add_row("types", cell(",".join(telemetry.get("types") or [])))
        status = telemetry.get("status") or {}
        for field in ("lastSuccessAt", "lastErrorAt", "lastError"):
            rows.add_row(field, cell(status.get(field)))
        run.ui.show(rows)


@app.command("set-key", epilog=EXIT_CODES)
def set_key(
    telemetry_id: TelemetryId,
    name: Annotated[str, typer.Option(help="The telemetry's name.")],
    key: Annotated[str, typer.Option(help=KEY_HELP, prompt="Key", hide_input=True)],
    output: OutputOpt = Output.table,
) -> None:
    """Replace a telemetry endpoint's key."""
    with connect(output) as run:
        run.api.call(
            "PUT",
            f"{V}/secrets/telemetries/{telemetry_id}",
            json={"secret": {"name": name, "value": key}},
        )
        if run.ui.json:
            run.ui.emit({"telemetryId": telemetry_id, "keyReplaced": True})
        else:
            run.ui.note(f"telemetry {telemetry_id}: key replaced")


@app.command(epilog=EXIT_CODES)
def delete(telemetry_id: TelemetryId, output: OutputOpt = Output.table) -> None:
    """Delete a telemetry endpoint no function version names."""
    with connect(output) as run:
        run.api.call("DELETE", f"{V}/telemetries/{telemetry_id}")
        if run.ui.json:
            run.ui.emit({"telemetryId": telemetry_id, "deleted": True})
        else:
            run.ui.note(f"telemetry {telemetry_id} deleted")
