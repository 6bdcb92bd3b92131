"""`nvcf chart validate`: the dry run `POST /v2/nvcf/helm/validate`, findings as a table."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from service.client_cli.api import V
from service.client_cli.common import OutputOpt, connect, read_values
from service.client_cli.output import EXIT_CODES, Code, Output
from service.client_cli.views import findings_table

app = typer.Typer(
    help="Helm charts: check one as a deployment would, storing nothing.",
    epilog=EXIT_CODES,
    no_args_is_help=True,
)


@app.command(epilog=EXIT_CODES)
def validate(
    helm_chart: Annotated[
        str, typer.Argument(help="oci://… chart URL, as a helm function names it.")
    ],
    values: Annotated[
        Path | None, typer.Option("--values", help="Helm values file (YAML) to render with.")
    ] = None,
    service_name: Annotated[
        str, typer.Option(help="The chart's Service receiving inference requests.")
    ] = "entrypoint",
    port: Annotated[int, typer.Option(help="The inference port of that Service.")] = 8000,
    gpu: Annotated[str | None, typer.Option(help="Target GPU, e.g. H100.")] = None,
    instance_type: Annotated[
        str | None, typer.Option(help="Target instance type, e.g. NCP.GPU.H100_1x.")
    ] = None,
    backend: Annotated[str | None, typer.Option(help="Target cluster group.")] = None,
    cluster: Annotated[list[str] | None, typer.Option(help="Target cluster (repeatable).")] = None,
    policy: Annotated[
        str | None, typer.Option(help="helmValidationPolicy name: Default or Unrestricted.")
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Fetch, render and check a chart without storing anything; exit 3 when it is not valid."""
    body: dict[str, Any] = {
        "helmChart": helm_chart,
        "helmChartServiceName": service_name,
        "inferencePort": port,
    }
    optional = {
        "gpu": gpu,
        "instanceType": instance_type,
        "backend": backend,
        "clusters": cluster or None,
        "helmValidationPolicy": {"name": policy} if policy else None,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    with connect(output) as run:
        configuration = read_values(run.ui, values)
        if configuration is not None:
            body["configuration"] = configuration
        result = run.api.call("POST", f"{V}/helm/validate", json=body)
        valid = bool(result.get("valid"))
        if run.ui.json:
            run.ui.emit(result)
        else:
            findings = [
                *(result.get("errors") or []),
                *(result.get("warnings") or []),
                *(result.get("info") or []),
            ]
            if findings:
                run.ui.show(findings_table(findings))
            for check in result.get("checksNotApplied") or []:
                run.ui.show(Text(f"not checked: {check.get('check')}: {check.get('reason')}"))
            objects = len(result.get("objects") or [])
            targets = ", ".join(result.get("targetClusters") or [])
            summary = f"{helm_chart} ({result.get('chartDigest')}): "
            summary += f"valid, {objects} objects" if valid else "NOT valid"
            run.ui.show(Text(summary + (f"; target clusters: {targets}" if targets else "")))
        if not valid:
            raise typer.Exit(int(Code.FAILED))
