"""The `nvcf` command: login, functions, charts, deployments, tasks (docs/cli.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from service.client_cli import (
    accounts,
    assets,
    canary,
    charts,
    chat,
    config,
    deployments,
    functions,
    invoke,
    logs,
    revisions,
    tasks,
    telemetries,
    traffic,
    usage,
)
from service.client_cli.api import Api, ApiError, Unreachable
from service.client_cli.common import OutputOpt, fail
from service.client_cli.output import EXIT_CODES, Code, Output, Ui

app = typer.Typer(
    name="nvcf",
    help="Manage functions, deployments and tasks of an nvcf-server through its REST API. "
    "Credentials come from `nvcf login`, or NVCF_URL and NVCF_API_KEY.",
    epilog=EXIT_CODES,
    no_args_is_help=True,
    # a traceback must never show locals: they hold the API key
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(functions.app, name="function")
app.add_typer(charts.app, name="chart")
app.add_typer(assets.app, name="asset")
app.add_typer(accounts.app, name="account")
app.add_typer(telemetries.app, name="telemetry")
app.add_typer(traffic.app, name="traffic")
app.add_typer(canary.app, name="canary")
tasks.register(app)
deployments.register(app)
revisions.register(app)
invoke.register(app)
chat.register(app)
logs.register(app)
usage.register(app)


@app.command(epilog=EXIT_CODES)
def login(
    url: Annotated[
        str,
        typer.Option(help="The server, e.g. http://127.0.0.1:8080.", prompt=True),
    ],
    key: Annotated[
        str,
        typer.Option(
            help="An nvapi-… API key (prompted for, hidden, when left out).",
            prompt="API key",
            hide_input=True,
            show_default=False,
        ),
    ],
    ca_cert: Annotated[
        Path | None,
        typer.Option(help="A CA certificate to trust for this server (PEM), e.g. self-signed."),
    ] = None,
    verify: Annotated[
        bool, typer.Option(help="Check the key with the server before saving it.")
    ] = True,
    output: OutputOpt = Output.table,
) -> None:
    """Save the server URL and API key (file mode 0600) after checking them with the server."""
    ui = Ui(output)
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise fail(ui, f"--url must start with http:// or https://, not {url!r}", Code.USAGE)
    ca = str(ca_cert.resolve()) if ca_cert else None
    if ca_cert is not None and not ca_cert.is_file():
        raise fail(ui, f"--ca-cert {ca_cert}: no such file", Code.USAGE)
    profile = config.Profile(url=url, api_key=key.strip(), ca_cert=ca)
    account = None
    if verify:
        try:
            with Api(profile) as api:
                info = api.call("GET", "/v3/keys/get-caller-info")
        except ApiError as exc:
            ui.problem(exc)
            raise typer.Exit(int(Code.API_ERROR)) from None
        except Unreachable as exc:
            raise fail(ui, str(exc), Code.API_ERROR) from None
        account = info.get("orgName") if isinstance(info, dict) else None
    path = config.save(profile)
    if ui.json:
        ui.emit({"url": url, "account": account, "configFile": str(path)})
        return
    who = f" as account {account}" if account else ""
    ui.note(f"logged in to {url}{who}; saved in {path} (mode 0600)")


@app.command(epilog=EXIT_CODES)
def logout(output: OutputOpt = Output.table) -> None:
    """Forget the saved server URL and API key."""
    ui = Ui(output)
    path = config.config_file()
    removed = config.remove(path)
    if ui.json:
        ui.emit({"configFile": str(path), "removed": removed})
        return
    ui.note(f"removed {path}" if removed else f"nothing saved at {path}")


def main() -> None:
    app(prog_name="nvcf")
