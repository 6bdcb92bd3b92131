"""`nvcf function create|list|get|update|delete`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from service.client_cli.api import V
from service.client_cli.common import FunctionId, OutputOpt, VersionId, connect, fail
from service.client_cli.output import EXIT_CODES, Code, Output
from service.client_cli.telemetries import telemetries_of
from service.client_cli.views import function_detail, functions_table

app = typer.Typer(
    help="Functions and their versions: create, list, get, update, delete.",
    epilog=EXIT_CODES,
    no_args_is_help=True,
)


LLM_MODEL_FIELDS = ("name", "uris", "routingMethod", "tokenRateLimit", "tokenizer")
LLM_UPDATE_FIELDS = ("name", "routingMethod", "tokenRateLimit")


def _fields(text: str, allowed: tuple[str, ...], option: str) -> dict[str, str]:
    """nvcf-cli's `key=value,key=value` (an item without '=' after tokenRateLimit continues
    it: `tokenRateLimit=1000-S,5000-M`)."""
    fields: dict[str, str] = {}
    last = ""
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep and last == "tokenRateLimit":
            fields[last] += "," + item
            continue
        if not sep or not key.strip():
            raise typer.BadParameter(f"{item!r} is not key=value", param_hint=option)
        key = key.strip()
        if key not in allowed:
            raise typer.BadParameter(
                f"unknown field {key!r}; use {', '.join(allowed)}", param_hint=option
            )
        fields[key], last = value.strip(), key
    if not fields.get("name"):
        raise typer.BadParameter(f"{text!r} has no name=", param_hint=option)
    return fields


def llm_model_of(text: str) -> dict[str, Any]:
    """`--llm-model name=m,uris=/v1/chat/completions|/v1/embeddings,routingMethod=…,
    tokenRateLimit=…` as a model of an LLM function (the server checks the values)."""
    fields = _fields(text, LLM_MODEL_FIELDS, "--llm-model")
    uris = [u.strip() for u in fields.pop("uris", "").split("|") if u.strip()]
    config: dict[str, Any] = {"uris": uris, **{k: v for k, v in fields.items() if k != "name"}}
    return {"name": fields["name"], "llmConfig": config}


def llm_model_update_of(text: str) -> dict[str, Any]:
    """`--llm-model-update name=m,routingMethod=…,tokenRateLimit=…` as a `modelUpdates` item."""
    fields = _fields(text, LLM_UPDATE_FIELDS, "--llm-model-update")
    name = fields.pop("name")
    if not fields:
        raise typer.BadParameter(
            f"{text!r}: give routingMethod= or tokenRateLimit=", param_hint="--llm-model-update"
        )
    return {"modelName": name, "llmConfig": fields}


def _key_values(items: list[str], option: str) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{item!r} is not KEY=VALUE", param_hint=option)
        out.append({"key": key, "value": value})
    return out


@app.command(epilog=EXIT_CODES)
def create(
    name: Annotated[str | None, typer.Option(help="The function's name.")] = None,
    image: Annotated[
        str | None, typer.Option("--image", help="Container image (a container function).")
    ] = None,
    helm_chart: Annotated[
        str | None, typer.Option(help="oci:// chart URL (a helm function).")
    ] = None,
    helm_chart_service: Annotated[
        str | None, typer.Option(help="The chart's Service receiving inference requests.")
    ] = None,
    inference_url: Annotated[
        str | None, typer.Option(help="Path of the inference endpoint, e.g. /echo.")
    ] = None,
    inference_port: Annotated[int | None, typer.Option(help="Port of the endpoint.")] = None,
    health_uri: Annotated[str | None, typer.Option(help="Path of the health check.")] = None,
    description: Annotated[str | None, typer.Option(help="Free text.")] = None,
    tag: Annotated[list[str] | None, typer.Option(help="A tag (repeat for several).")] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", help="KEY=VALUE of the container environment (repeatable)."),
    ] = None,
    container_args: Annotated[str | None, typer.Option(help="Container arguments.")] = None,
    function_type: Annotated[
        str | None, typer.Option("--function-type", "--type", help="DEFAULT, STREAMING or LLM.")
    ] = None,
    llm_model: Annotated[
        list[str] | None,
        typer.Option(
            help="An LLM function's model (repeatable): name=M,uris=/v1/chat/completions|"
            "/v1/responses|/v1/embeddings[,routingMethod=R][,tokenRateLimit=1000-S,5000-M]."
        ),
    ] = None,
    api_body_format: Annotated[str | None, typer.Option(help="CUSTOM or PREDICT_V2.")] = None,
    function_id: Annotated[
        str | None,
        typer.Option(help="Create a new version of this function instead of a new function."),
    ] = None,
    telemetry: Annotated[
        list[str] | None,
        typer.Option(
            help="A telemetry endpoint's id (repeatable): the version's signals of each type it "
            "receives go there."
        ),
    ] = None,
    file: Annotated[
        Path | None,
        typer.Option(
            "--file", "-f", help="A JSON request body; the other options override its fields."
        ),
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Create a function (its first version), or with --function-id a new version."""
    body: dict[str, Any] = {}
    if file is not None:
        try:
            loaded = json.loads(file.read_text())
        except (OSError, ValueError) as exc:
            raise typer.BadParameter(f"cannot read {file}: {exc}", param_hint="--file") from None
        if not isinstance(loaded, dict):
            raise typer.BadParameter(f"{file} is not a JSON object", param_hint="--file")
        body.update(loaded)
    flags: dict[str, Any] = {
        "name": name,
        "containerImage": image,
        "helmChart": helm_chart,
        "helmChartServiceName": helm_chart_service,
        "inferenceUrl": inference_url,
        "inferencePort": inference_port,
        "healthUri": health_uri,
        "description": description,
        "tags": tag or None,
        "containerEnvironment": _key_values(env, "--env") if env else None,
        "containerArgs": container_args,
        "functionType": function_type,
        "apiBodyFormat": api_body_format,
        "models": [llm_model_of(m) for m in llm_model] if llm_model else None,
    }
    body.update({k: v for k, v in flags.items() if v is not None})
    path = f"{V}/functions/{function_id}/versions" if function_id else f"{V}/functions"
    with connect(output) as run:
        if telemetry:
            body["telemetries"] = telemetries_of(run.api, telemetry)
        created = run.api.call("POST", path, json=body, idempotent_create=True)
        if run.ui.json:
            run.ui.emit(created)
            return
        run.ui.show(function_detail(created["function"]))


@app.command("list", epilog=EXIT_CODES)
def list_(
    name: Annotated[str | None, typer.Option(help="Only functions of this name.")] = None,
    status: Annotated[
        str | None, typer.Option(help="Only versions in this status (ACTIVE, ERROR, …).")
    ] = None,
    tag: Annotated[str | None, typer.Option(help="Only versions with this tag.")] = None,
    visibility: Annotated[
        str | None, typer.Option(help="private, authorized, public (comma-separated).")
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """List the function versions the caller may see."""
    params = {"name": name, "status": status, "tag": tag, "visibility": visibility}
    with connect(output) as run:
        body = run.api.call(
            "GET", f"{V}/functions", params={k: v for k, v in params.items() if v is not None}
        )
        if run.ui.json:
            run.ui.emit(body)
            return
        run.ui.show(functions_table(body.get("functions") or []))


@app.command(epilog=EXIT_CODES)
def get(
    function_id: FunctionId,
    version_id: Annotated[
        str | None,
        typer.Argument(help="One version; without it, every version of the function."),
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Show one function version, or list every version of a function."""
    with connect(output) as run:
        if version_id is None:
            body = run.api.call("GET", f"{V}/functions/{function_id}/versions")
            if run.ui.json:
                run.ui.emit(body)
                return
            run.ui.show(functions_table(body.get("functions") or []))
            return
        body = run.api.call("GET", f"{V}/functions/{function_id}/versions/{version_id}")
        if run.ui.json:
            run.ui.emit(body)
            return
        run.ui.show(function_detail(body["function"]))


@app.command(epilog=EXIT_CODES)
def update(
    function_id: FunctionId,
    version_id: VersionId,
    description: Annotated[str | None, typer.Option(help="The new description.")] = None,
    tag: Annotated[
        list[str] | None, typer.Option(help="The new tags, replacing the old (repeatable).")
    ] = None,
    clear_tags: Annotated[bool, typer.Option(help="Remove every tag.")] = False,
    llm_model_update: Annotated[
        list[str] | None,
        typer.Option(
            help="An LLM model's settings, on every version (repeatable): "
            "name=M[,routingMethod=R][,tokenRateLimit=1000-S]."
        ),
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Change a version's description or tags, or an LLM function's model settings."""
    body: dict[str, Any] = {}
    if description is not None:
        body["description"] = description
    if tag or clear_tags:
        body["tags"] = tag or []
    if llm_model_update:
        body["modelUpdates"] = [llm_model_update_of(u) for u in llm_model_update]
    with connect(output) as run:
        if not body:
            raise fail(
                run.ui,
                "nothing to change: pass --description, --tag or --llm-model-update",
                Code.USAGE,
            )
        changed = run.api.call(
            "PUT", f"{V}/functions/{function_id}/versions/{version_id}", json=body
        )
        if run.ui.json:
            run.ui.emit(changed)
            return
        run.ui.show(function_detail(changed["function"]))


@app.command(epilog=EXIT_CODES)
def delete(
    function_id: FunctionId, version_id: VersionId, output: OutputOpt = Output.table
) -> None:
    """Delete a function version (its deployment, if any, is torn down)."""
    with connect(output) as run:
        run.api.call("DELETE", f"{V}/functions/{function_id}/versions/{version_id}")
        if run.ui.json:
            run.ui.emit({"deleted": {"functionId": function_id, "versionId": version_id}})
            return
        run.ui.note(f"deleted function version {function_id}/{version_id}")
