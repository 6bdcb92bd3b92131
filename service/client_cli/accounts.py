"""`nvcf account list|get|update|suspend|resume`: the operator's accounts, their limits and
their suspension (needs the operator's credential: the scope `account_setup`)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from service.client_cli.api import V
from service.client_cli.common import OutputOpt, Run, connect
from service.client_cli.output import EXIT_CODES, Output, cell, table

app = typer.Typer(
    help="Accounts (operator): limits, suspension.", epilog=EXIT_CODES, no_args_is_help=True
)

AccountId = Annotated[str, typer.Argument(help="The account's id (ncaId).", show_default=False)]


def _limit(flag: str, what: str) -> Any:
    return typer.Option(flag, min=0, help=f"The most {what} the account may have.")


def _show(run: Run, account: dict[str, Any]) -> None:
    if run.ui.json:
        run.ui.emit(account)
        return
    rows = table("FIELD", "VALUE")
    for key, value in account.items():
        rows.add_row(key, cell(value))
    run.ui.show(rows)


@app.command("list", epilog=EXIT_CODES)
def list_accounts(output: OutputOpt = Output.table) -> None:
    """Every account and its main limits."""
    with connect(output) as run:
        accounts = run.api.call("GET", f"{V}/accounts")["cloudAccounts"]
        if run.ui.json:
            run.ui.emit(accounts)
            return
        rows = table("ID", "NAME", "FUNCTIONS", "TASKS", "SUSPENDED")
        for a in accounts:
            rows.add_row(
                cell(a.get("ncaId")),
                cell(a.get("name")),
                cell(a.get("maxFunctionsAllowed")),
                cell(a.get("maxTasksAllowed")),
                cell(a.get("suspendedReason") if a.get("suspended") else ""),
            )
        run.ui.show(rows)


@app.command(epilog=EXIT_CODES)
def get(account_id: AccountId, output: OutputOpt = Output.table) -> None:
    """An account, every limit and its suspension."""
    with connect(output) as run:
        _show(run, run.api.call("GET", f"{V}/accounts/{account_id}")["account"])


@app.command(epilog=EXIT_CODES)
def update(
    account_id: AccountId,
    name: Annotated[str | None, typer.Option(help="Its name.")] = None,
    max_functions: Annotated[int | None, _limit("--max-functions", "functions")] = None,
    max_tasks: Annotated[int | None, _limit("--max-tasks", "tasks")] = None,
    max_telemetries: Annotated[
        int | None, _limit("--max-telemetries", "telemetries (at most 50)")
    ] = None,
    max_registry_credentials: Annotated[
        int | None, _limit("--max-registry-credentials", "registry credentials (at most 50)")
    ] = None,
    max_versions_per_function: Annotated[
        int | None, _limit("--max-versions-per-function", "versions of a function")
    ] = None,
    max_instances: Annotated[int | None, _limit("--max-instances", "instances")] = None,
    max_api_keys: Annotated[int | None, _limit("--max-api-keys", "API keys")] = None,
    max_assets: Annotated[int | None, _limit("--max-assets", "assets")] = None,
    max_asset_bytes: Annotated[int | None, _limit("--max-asset-bytes", "bytes of assets")] = None,
    max_tasks_running: Annotated[
        int | None, _limit("--max-tasks-running", "tasks queued or running at once")
    ] = None,
    rate_limit_per_second: Annotated[
        float | None,
        typer.Option(
            "--rate-limit-per-second", min=0, help="API requests per second on average (0: none)."
        ),
    ] = None,
    rate_limit_burst: Annotated[
        int | None, typer.Option("--rate-limit-burst", min=1, help="API requests at once.")
    ] = None,
    input_tokens: Annotated[
        str | None,
        typer.Option(
            "--input-token-rate-limit",
            help="LLM input tokens over every model, e.g. '100000-M,50000000-MO' (units S, M, "
            "H, D, W, MO); '' for none.",
        ),
    ] = None,
    output_tokens: Annotated[
        str | None,
        typer.Option(
            "--output-token-rate-limit", help="LLM output tokens, as --input-token-rate-limit."
        ),
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Change the limits given; every other stays as it is."""
    body: dict[str, Any] = {
        "name": name,
        "maxFunctionsAllowed": max_functions,
        "maxTasksAllowed": max_tasks,
        "maxTelemetriesAllowed": max_telemetries,
        "maxRegistryCredentialsAllowed": max_registry_credentials,
        "maxVersionsPerFunctionAllowed": max_versions_per_function,
        "maxInstancesAllowed": max_instances,
        "maxApiKeysAllowed": max_api_keys,
        "maxAssetsAllowed": max_assets,
        "maxAssetBytesAllowed": max_asset_bytes,
        "maxTasksRunningAllowed": max_tasks_running,
        "rateLimitPerSecond": rate_limit_per_second,
        "rateLimitBurst": rate_limit_burst,
        "accountInputTokenRateLimit": input_tokens,
        "accountOutputTokenRateLimit": output_tokens,
    }
    with connect(output) as run:
        changes = {k: v for k, v in body.items() if v is not None}
        _show(run, run.api.call("PATCH", f"{V}/accounts/{account_id}", json=changes)["account"])


@app.command(epilog=EXIT_CODES)
def suspend(
    account_id: AccountId,
    reason: Annotated[str, typer.Option(help="Why: every refused request says it.")],
    output: OutputOpt = Output.table,
) -> None:
    """Refuse the account's keys and tokens everywhere and hold its deployments at zero."""
    with connect(output) as run:
        path = f"{V}/accounts/{account_id}/suspension"
        _show(run, run.api.call("PUT", path, json={"reason": reason})["account"])


@app.command(epilog=EXIT_CODES)
def resume(account_id: AccountId, output: OutputOpt = Output.table) -> None:
    """Let a suspended account back: its credentials work, its deployments come back."""
    with connect(output) as run:
        _show(run, run.api.call("DELETE", f"{V}/accounts/{account_id}/suspension")["account"])
